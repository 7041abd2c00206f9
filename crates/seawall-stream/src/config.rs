//! The timeouts of one attempt, as plain data.

use std::time::Duration;

use tokio::time::Instant;

/// The timeouts [`StreamTimeoutLayer`](crate::StreamTimeoutLayer) enforces on each attempt.
///
/// Every duration is measured with `tokio::time`, so tests and simulations run on paused time.
/// `None` switches a timeout off.
///
/// | timeout | measured | fires as |
/// |---|---|---|
/// | `attempt` | from the call to the response head | `Err(Timeout)` from the future |
/// | `first_token` | from the call to the first real content (streamed requests only) | `Err(Timeout)` from the future |
/// | `idle` | between body frames after the commit point (and, for a body that is not a stream, from the head on) | a `StreamInterrupted` body error after the commit point |
/// | `total` | from the call to the end of the body | `Err(Timeout)` before the commit point, a `StreamInterrupted` body error after it |
///
/// A caller's [`Deadline`](seawall_core::Deadline) on the request cuts `attempt`,
/// `first_token` and `total` (and `idle` before the commit point) to what is left of it, and
/// fires as `Err(DeadlineExceeded)`.
///
/// Defaults: `attempt` 300 s (a request that is not streamed gets its head only once the whole
/// answer is written), `first_token` 60 s, `idle` 30 s, no `total` (a healthy long stream is
/// never cut), and at most 64 KiB of content-free frames buffered before the commit point.
///
/// ```
/// use std::time::Duration;
/// use seawall_stream::StreamTimeouts;
///
/// let t = StreamTimeouts::new()
///     .with_first_token(Duration::from_secs(20))
///     .with_idle(Duration::from_secs(10))
///     .with_total(None);
/// assert_eq!(t.first_token(), Some(Duration::from_secs(20)));
/// assert_eq!(t.total(), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamTimeouts {
    attempt: Option<Duration>,
    first_token: Option<Duration>,
    idle: Option<Duration>,
    total: Option<Duration>,
    max_buffer: usize,
}

impl Default for StreamTimeouts {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamTimeouts {
    /// The timeouts a committed body still runs under, for describing the one it met.
    pub(crate) fn body(idle: Option<Duration>, total: Option<Duration>) -> Self {
        StreamTimeouts {
            idle,
            total,
            ..StreamTimeouts::new()
        }
    }

    /// The defaults described on the type.
    pub const fn new() -> Self {
        StreamTimeouts {
            attempt: Some(Duration::from_secs(300)),
            first_token: Some(Duration::from_secs(60)),
            idle: Some(Duration::from_secs(30)),
            total: None,
            max_buffer: 64 * 1024,
        }
    }

    /// No timeouts at all: only the commit point and the completeness check.
    pub const fn none() -> Self {
        StreamTimeouts {
            attempt: None,
            first_token: None,
            idle: None,
            total: None,
            max_buffer: 64 * 1024,
        }
    }

    /// Sets the attempt timeout: the longest wait for the response head.
    pub fn with_attempt(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.attempt = timeout.into();
        self
    }

    /// Sets the time-to-first-token timeout: the longest wait, from the call, for the first real
    /// content of a streamed response (keep-alive comments, blank lines, pings and role-only
    /// deltas do not count). It also bounds the wait for the head of a streamed request.
    pub fn with_first_token(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.first_token = timeout.into();
        self
    }

    /// Sets the idle timeout: the longest gap between two body frames once content flows.
    pub fn with_idle(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.idle = timeout.into();
        self
    }

    /// Sets the total deadline of an attempt, from the call to the end of its body.
    pub fn with_total(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.total = timeout.into();
        self
    }

    /// Sets how many bytes of content-free frames are held before the commit point. Past it the
    /// response is handed over as it is (an upstream this layer cannot read is never stalled).
    pub fn with_max_buffer(mut self, bytes: usize) -> Self {
        self.max_buffer = bytes;
        self
    }

    /// The attempt timeout.
    pub fn attempt(&self) -> Option<Duration> {
        self.attempt
    }

    /// The time-to-first-token timeout.
    pub fn first_token(&self) -> Option<Duration> {
        self.first_token
    }

    /// The idle timeout.
    pub fn idle(&self) -> Option<Duration> {
        self.idle
    }

    /// The total deadline.
    pub fn total(&self) -> Option<Duration> {
        self.total
    }

    /// The pre-commit buffer bound, in bytes.
    pub fn max_buffer(&self) -> usize {
        self.max_buffer
    }
}

/// Which timeout fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    Attempt,
    FirstToken,
    Idle,
    Total,
    /// The caller's [`Deadline`](seawall_core::Deadline), not one of this layer's timeouts.
    Deadline,
}

impl Reason {
    pub(crate) fn describe(self, config: &StreamTimeouts) -> String {
        let (what, d) = match self {
            Reason::Attempt => (
                "no response head within the attempt timeout",
                config.attempt,
            ),
            Reason::FirstToken => ("no first token within", config.first_token),
            Reason::Idle => ("no body frame within the idle timeout", config.idle),
            Reason::Total => ("total stream deadline passed", config.total),
            Reason::Deadline => ("the caller's deadline passed before the first token", None),
        };
        match d {
            Some(d) if matches!(self, Reason::FirstToken) => format!("{what} {d:?}"),
            Some(d) => format!("{what} ({d:?})"),
            None => what.to_owned(),
        }
    }
}

/// `start + d`, or `None` when `d` is off or so large it never comes.
pub(crate) fn deadline(start: Instant, d: Option<Duration>, reason: Reason) -> Deadline {
    d.and_then(|d| start.checked_add(d)).map(|at| (at, reason))
}

/// A deadline and the timeout it belongs to.
pub(crate) type Deadline = Option<(Instant, Reason)>;

/// The earliest of some deadlines.
pub(crate) fn earliest<const N: usize>(all: [Deadline; N]) -> Deadline {
    all.into_iter().flatten().min_by_key(|(at, _)| *at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_durations_never_fire_and_never_panic() {
        let now = Instant::now();
        assert_eq!(deadline(now, Some(Duration::MAX), Reason::Total), None);
        let d = earliest([
            deadline(now, Some(Duration::from_secs(5)), Reason::Total),
            deadline(now, Some(Duration::from_secs(2)), Reason::Attempt),
            None,
        ]);
        assert_eq!(d, Some((now + Duration::from_secs(2), Reason::Attempt)));
    }

    #[test]
    fn reasons_name_their_timeout() {
        let c = StreamTimeouts::new().with_first_token(Duration::from_secs(7));
        assert_eq!(Reason::FirstToken.describe(&c), "no first token within 7s");
        assert!(Reason::Idle.describe(&c).contains("30s"));
    }
}
