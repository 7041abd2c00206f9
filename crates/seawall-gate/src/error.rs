//! What the gate tells its callers: rejections and queue time.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use seawall_core::LlmError;

/// How long a call waited in the gate before it was admitted (or rejected).
///
/// The gate inserts it into the request's extensions before calling the inner service, and into
/// the response's extensions, so latency splits into queue time and upstream time. The same
/// figure goes to the `seawall_core::CallContext` (`queue_wait`, summed over attempts) and to a
/// `tracing` event (field `queue_wait_ms`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueWait(pub Duration);

/// Why the gate turned a call away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectReason {
    /// The wait queue was at its maximum length.
    QueueFull,
    /// No admission within the maximum wait.
    WaitTimeout,
    /// The upstream asked to pause this key (a `remaining = 0` window or a 429's hint) for
    /// longer than the maximum wait.
    KeyPaused,
    /// The key's request or token rate would admit the call only after the maximum wait.
    RateLimited,
    /// The key's rate limit is zero.
    ZeroRate,
    /// A fallback target stood by for the call ([`Standby`](seawall_core::Standby)), and the
    /// key's rate or the upstream's pause would have held it longer than the
    /// [standby wait](crate::ConcurrencyGateBuilder::standby_wait): it was turned away at once
    /// for the fallback to send elsewhere.
    Spilled,
}

impl RejectReason {
    /// A stable snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            RejectReason::QueueFull => "queue_full",
            RejectReason::WaitTimeout => "wait_timeout",
            RejectReason::KeyPaused => "key_paused",
            RejectReason::RateLimited => "rate_limited",
            RejectReason::ZeroRate => "zero_rate",
            RejectReason::Spilled => "spilled",
        }
    }
}

/// The details of a `GateRejected` error, kept as its source: find it with
/// [`Rejection::of`].
#[derive(Debug, Clone)]
pub struct Rejection {
    reason: RejectReason,
    queue_depth: usize,
    key: Option<Arc<str>>,
    waited: Duration,
}

impl Rejection {
    pub(crate) fn new(
        reason: RejectReason,
        queue_depth: usize,
        key: Option<Arc<str>>,
        waited: Duration,
    ) -> Self {
        Rejection {
            reason,
            queue_depth,
            key,
            waited,
        }
    }

    /// The rejection inside a `GateRejected` error, if it came from this gate.
    ///
    /// ```
    /// # use seawall_core::{FailureClass, LlmError};
    /// # use seawall_gate::Rejection;
    /// let other = LlmError::new(FailureClass::GateRejected, "some other gate");
    /// assert!(Rejection::of(&other).is_none());
    /// ```
    pub fn of(err: &LlmError) -> Option<&Rejection> {
        err.source_ref()?.downcast_ref()
    }

    /// Why.
    pub fn reason(&self) -> RejectReason {
        self.reason
    }

    /// How many calls were waiting in the gate at the time.
    pub fn queue_depth(&self) -> usize {
        self.queue_depth
    }

    /// The key the call was under, if it had one.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// How long the call waited before it was turned away.
    pub fn waited(&self) -> Duration {
        self.waited
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gate rejected ({}) with {} waiting after {:?}",
            self.reason.as_str(),
            self.queue_depth,
            self.waited
        )
    }
}

impl StdError for Rejection {}
