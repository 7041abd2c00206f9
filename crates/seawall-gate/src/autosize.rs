//! Auto-sizing: the gate's permits sized from the upstream's rate limits times the observed
//! latency (Little's law).
//!
//! # Why
//!
//! A fixed limit is a guess, and both ways of guessing wrong hurt. Too few permits against an
//! upstream with room make every call queue in the gate (40 streaming clients behind 16
//! permits waited in line for most of a call each), too many let a burst run into the
//! upstream's rate limit. What the right number is follows from two things the gate sees on
//! every call: how many requests per second the upstream allows (its rate-limit headers, which
//! the gate already reads to pause on `remaining = 0`) and how long each call holds its permit.
//! By Little's law, calls in flight = arrival rate × time in flight, so `rate × latency`
//! permits are what it takes to use the whole limit, and no more can be used without
//! exceeding it on average. [`AutoSize`] keeps the limit at `headroom` times that, between a
//! minimum and a maximum, and follows the limits and the latency as they move.

use std::sync::Mutex;
use std::time::Duration;

use seawall_core::{ConfigError, RateLimitSnapshot, RateLimitWindow, Usage};
use tokio::time::Instant;

/// Settings of the auto-sizing mode, which sets the gate's concurrency limit to
/// `headroom × rate × latency` permits, between [`min_limit`](Self::min_limit) and
/// [`max_limit`](Self::max_limit).
///
/// - **rate**: the requests per second the upstream allows, from the rate-limit headers of its
///   responses (OpenAI's `x-ratelimit-{limit,remaining,reset}-requests`, Anthropic's
///   `anthropic-ratelimit-requests-*`, as `seawall-classify` reads them). The spent part of a
///   window (`limit - remaining`) comes back over its `reset`, so the refill rate is
///   `(limit - remaining) / reset`; a window with nothing spent yet counts as `limit` per
///   [`window`](Self::with_window) (a minute, as both providers define their limits). When the
///   upstream also reports a token window and calls report their usage, the token rate divided
///   by the tokens per call bounds the rate too.
/// - **latency**: how long a call holds its permit (admission to the end of its body, so a
///   stream counts whole), as a moving average of completed calls (each new call weighs
///   [`LATENCY_WEIGHT`]). Failed calls do not count: a burst of instant errors says nothing
///   about how long the upstream takes to answer.
/// - **headroom** (default **0.7**): the share of the upstream's limit the gate may fill. With
///   the limit at `headroom × rate × latency`, the permits alone keep the sustained rate at
///   `headroom × rate`, so the upstream's bucket refills between bursts and a burst of every
///   permit at once stays within it.
/// - **re-evaluation**: after every [`every`](Self::with_every) completed calls (default 32),
///   or after [`interval`](Self::with_interval) (default 1 s) when calls complete more slowly.
///   Growing admits waiters at once; shrinking takes effect as calls in flight finish.
///
/// Until the upstream has reported a request limit and one call has completed, the gate keeps
/// the limit it was built with (the builder's [`limit`](crate::ConcurrencyGateBuilder::limit),
/// brought into `[min, max]`). An upstream that sends no rate-limit headers leaves it there.
/// With the [adaptive](crate::Adaptive) mode on too, the size computed here is its ceiling:
/// 429s still cut the limit below it. A limit set with
/// [`GateHandle::set_limit`](crate::GateHandle::set_limit) holds until the next evaluation.
///
/// Against a fast upstream Little's law asks for few permits (1,000 requests a second of
/// 5 ms each fill 5), and a few milliseconds of scheduling delay then queue callers for
/// permits the upstream has room for: set the minimum to what a stall should not go below.
///
/// ```
/// use std::time::Duration;
/// use seawall_gate::{AutoSize, ConcurrencyGateLayer};
///
/// let gate = ConcurrencyGateLayer::builder()
///     .limit(16) // until the upstream's limits and latency are known
///     .autosize(AutoSize::new().with_min_limit(4).with_max_limit(512))
///     .build()?;
/// assert_eq!(gate.handle().stats().limit, 16);
/// // Out-of-range settings are refused when the gate is built, never clamped.
/// let bad = AutoSize::new().with_headroom(1.5);
/// assert!(ConcurrencyGateLayer::builder().autosize(bad).build().is_err());
/// # Ok::<(), seawall_gate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutoSize {
    min_limit: usize,
    max_limit: usize,
    headroom: f64,
    every: u32,
    interval: Duration,
    window: Duration,
}

/// The weight of each completed call in the moving averages of latency and tokens per call:
/// the last 10 calls or so carry most of it, so the size follows a change within a couple of
/// re-evaluations without jumping at one slow call.
pub const LATENCY_WEIGHT: f64 = 0.1;

impl Default for AutoSize {
    fn default() -> Self {
        AutoSize {
            min_limit: 1,
            max_limit: 256,
            headroom: 0.7,
            every: 32,
            interval: Duration::from_secs(1),
            window: Duration::from_secs(60),
        }
    }
}

impl AutoSize {
    /// The defaults: headroom 0.7, limits in `[1, 256]`, re-evaluated every 32 calls or 1 s,
    /// a one-minute window.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the lowest limit (at least 1; the builder refuses 0).
    pub fn with_min_limit(mut self, n: usize) -> Self {
        self.min_limit = n;
        self
    }

    /// Sets the highest limit (at least the minimum; the builder refuses less).
    pub fn with_max_limit(mut self, n: usize) -> Self {
        self.max_limit = n;
        self
    }

    /// Sets the share of the upstream's limit the gate may fill, in `(0, 1]`.
    pub fn with_headroom(mut self, h: f64) -> Self {
        self.headroom = h;
        self
    }

    /// Re-evaluates the size after this many completed calls (at least 1).
    pub fn with_every(mut self, calls: u32) -> Self {
        self.every = calls;
        self
    }

    /// Re-evaluates the size after this long, when fewer than [`every`](Self::with_every)
    /// calls completed meanwhile.
    pub fn with_interval(mut self, d: Duration) -> Self {
        self.interval = d;
        self
    }

    /// The window a reported limit counts for while none of it is spent (default one
    /// minute: OpenAI's and Anthropic's request limits are per minute).
    pub fn with_window(mut self, d: Duration) -> Self {
        self.window = d;
        self
    }

    /// The lowest limit.
    pub fn min_limit(&self) -> usize {
        self.min_limit
    }

    /// The highest limit.
    pub fn max_limit(&self) -> usize {
        self.max_limit
    }

    /// The share of the upstream's limit the gate may fill.
    pub fn headroom(&self) -> f64 {
        self.headroom
    }

    /// Refuses a minimum of 0, a maximum below it, a headroom outside `(0, 1]`, a cadence of
    /// 0 calls and a zero window.
    pub(crate) fn check(&self, max: usize) -> Result<(), ConfigError> {
        let bad = |why: String| Err(ConfigError::new("autosize", why));
        if self.min_limit == 0 {
            return bad("the minimum limit must be at least 1".to_owned());
        }
        if self.max_limit < self.min_limit {
            return bad(format!(
                "the maximum limit ({}) is below the minimum ({})",
                self.max_limit, self.min_limit
            ));
        }
        if self.max_limit > max {
            return bad(format!("the maximum limit must be at most {max}"));
        }
        if !(self.headroom > 0.0 && self.headroom <= 1.0) {
            return bad(format!(
                "the headroom must be in (0, 1], got {}",
                self.headroom
            ));
        }
        if self.every == 0 {
            return bad("re-evaluating every 0 calls means never".to_owned());
        }
        if self.window.is_zero() {
            return bad("the window must be longer than zero".to_owned());
        }
        Ok(())
    }

    /// `n` brought into `[min, max]`.
    pub(crate) fn bound(&self, n: usize) -> usize {
        n.clamp(self.min_limit, self.max_limit)
    }

    /// The size for `rate` calls per second lasting `latency` seconds each.
    pub(crate) fn size(&self, rate: f64, latency: f64) -> usize {
        let n = self.headroom * rate * latency;
        // Rounded down: the headroom is a ceiling on the share used, never exceeded; the
        // millionth forgiven keeps a rate read from rounded headers (999.9999/s for 1,000/s)
        // from losing a permit. (`as` saturates: NaN goes to 0 and infinity to `usize::MAX`,
        // both then bounded.)
        self.bound((n + 1e-6).floor() as usize)
    }

    /// The refill rate of one window in units per second, if it reports a limit.
    fn rate(&self, w: &RateLimitWindow) -> Option<f64> {
        let limit = w.limit.filter(|&l| l > 0)? as f64;
        let spent = w.remaining.map_or(0.0, |r| (limit - r as f64).max(0.0));
        match w.reset_after.filter(|d| !d.is_zero()) {
            Some(reset) if spent > 0.0 => Some(spent / reset.as_secs_f64()),
            _ => Some(limit / self.window.as_secs_f64()),
        }
    }
}

/// What the sizer has learnt so far.
#[derive(Debug)]
struct Seen {
    /// Requests per second the upstream allows.
    requests: Option<f64>,
    /// Tokens per second the upstream allows.
    tokens: Option<f64>,
    /// Moving average of the seconds a completed call held its permit.
    latency: Option<f64>,
    /// Moving average of the tokens a completed call reported.
    tokens_per_call: Option<f64>,
    /// Calls completed since the last evaluation.
    calls: u32,
    /// When the size was last evaluated.
    last: Instant,
}

/// The auto-sizing state of one gate.
#[derive(Debug)]
pub(crate) struct Sizer {
    config: AutoSize,
    seen: Mutex<Seen>,
}

fn average(slot: &mut Option<f64>, sample: f64) {
    *slot = Some(match *slot {
        Some(avg) => avg + LATENCY_WEIGHT * (sample - avg),
        None => sample,
    });
}

impl Sizer {
    pub(crate) fn new(config: AutoSize) -> Self {
        Sizer {
            config,
            seen: Mutex::new(Seen {
                requests: None,
                tokens: None,
                latency: None,
                tokens_per_call: None,
                calls: 0,
                last: Instant::now(),
            }),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes the limits an upstream response reported.
    pub(crate) fn limits(&self, snapshot: &RateLimitSnapshot) {
        let requests = self.config.rate(&snapshot.requests);
        // Anthropic reports input and output windows beside the combined one (and its
        // combined one may be missing): the tightest known bounds the calls.
        let tokens = [
            &snapshot.tokens,
            &snapshot.input_tokens,
            &snapshot.output_tokens,
        ]
        .into_iter()
        .filter_map(|w| self.config.rate(w))
        .reduce(f64::min);
        if requests.is_none() && tokens.is_none() {
            return;
        }
        let mut seen = self.seen();
        if requests.is_some() {
            seen.requests = requests;
        }
        if tokens.is_some() {
            seen.tokens = tokens;
        }
    }

    /// Notes a call that completed after holding its permit for `held`, and returns the new
    /// size when it is time to re-evaluate and enough is known.
    pub(crate) fn completed(
        &self,
        held: Duration,
        usage: Option<Usage>,
        now: Instant,
    ) -> Option<usize> {
        let mut seen = self.seen();
        average(&mut seen.latency, held.as_secs_f64());
        if let Some(u) = usage {
            average(&mut seen.tokens_per_call, u.total() as f64);
        }
        seen.calls = seen.calls.saturating_add(1);
        if seen.calls < self.config.every
            && now.saturating_duration_since(seen.last) < self.config.interval
        {
            return None;
        }
        seen.calls = 0;
        seen.last = now;
        let by_tokens = match (seen.tokens, seen.tokens_per_call) {
            (Some(t), Some(c)) if c >= 1.0 => Some(t / c),
            _ => None,
        };
        let rate = match (seen.requests, by_tokens) {
            (Some(r), Some(t)) => r.min(t),
            (r, t) => r.or(t)?,
        };
        Some(self.config.size(rate, seen.latency?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(limit: u64, remaining: u64, reset_ms: u64) -> RateLimitWindow {
        RateLimitWindow {
            limit: Some(limit),
            remaining: Some(remaining),
            reset_after: Some(Duration::from_millis(reset_ms)),
        }
    }

    #[test]
    fn size_is_headroom_times_rate_times_latency_rounded_down_and_bounded() {
        let a = AutoSize::new();
        // 1,000 requests/s of 200 ms each: 200 in flight use it all, 70% of that is 140.
        assert_eq!(a.size(1000.0, 0.2), 140);
        assert_eq!(a.size(100.0, 0.2), 14);
        assert_eq!(a.size(0.5, 0.1), 1, "never below the minimum");
        assert_eq!(a.size(1e9, 10.0), 256, "never above the maximum");
        assert_eq!(a.size(f64::NAN, 1.0), 1);
        let b = a.with_min_limit(4).with_max_limit(8);
        assert_eq!(b.size(10.0, 0.1), 4);
        assert_eq!(b.size(1000.0, 1.0), 8);
    }

    #[test]
    fn the_rate_is_the_spent_part_over_its_reset_or_the_limit_per_window() {
        let a = AutoSize::new();
        // 6,000 per minute, 100 spent, back in 1 s: 100/s.
        assert_eq!(a.rate(&window(6000, 5900, 1000)), Some(100.0));
        // Nothing spent: the limit per minute.
        assert_eq!(a.rate(&window(6000, 6000, 0)), Some(100.0));
        assert_eq!(a.rate(&RateLimitWindow::default()), None);
        assert_eq!(a.rate(&window(0, 0, 10)), None, "a zero limit says nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_resized_before_a_limit_and_a_latency_are_known() {
        let s = Sizer::new(AutoSize::new().with_every(1));
        let now = Instant::now();
        assert_eq!(s.completed(Duration::from_millis(200), None, now), None);
        s.limits(&RateLimitSnapshot {
            requests: window(60_000, 60_000, 0),
            ..Default::default()
        });
        assert_eq!(
            s.completed(Duration::from_millis(200), None, now),
            Some(140)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_per_call_bound_the_rate() {
        let s = Sizer::new(AutoSize::new().with_every(1));
        s.limits(&RateLimitSnapshot {
            requests: window(60_000, 60_000, 0),
            // 60,000 tokens a minute: 1,000 a second, 10 calls of 100 tokens.
            tokens: window(60_000, 60_000, 0),
            ..Default::default()
        });
        let usage = Usage {
            input_tokens: 60,
            output_tokens: 40,
            cached_input_tokens: 0,
            cache_write_input_tokens: 0,
            cache_write_1h_input_tokens: 0,
        };
        let n = s.completed(Duration::from_secs(1), Some(usage), Instant::now());
        assert_eq!(n, Some(7));
    }

    #[tokio::test(start_paused = true)]
    async fn evaluates_every_n_calls_or_after_the_interval() {
        let s = Sizer::new(
            AutoSize::new()
                .with_every(3)
                .with_interval(Duration::from_secs(1)),
        );
        s.limits(&RateLimitSnapshot {
            requests: window(6000, 6000, 0),
            ..Default::default()
        });
        let t = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(s.completed(ms(100), None, t), None);
        assert_eq!(s.completed(ms(100), None, t), None);
        assert_eq!(s.completed(ms(100), None, t), Some(7));
        assert_eq!(s.completed(ms(100), None, t + ms(500)), None);
        assert_eq!(s.completed(ms(100), None, t + ms(1000)), Some(7));
    }

    #[test]
    fn out_of_range_settings_are_refused_not_clamped() {
        for bad in [
            AutoSize::new().with_min_limit(0),
            AutoSize::new().with_min_limit(10).with_max_limit(9),
            AutoSize::new().with_headroom(0.0),
            AutoSize::new().with_headroom(1.01),
            AutoSize::new().with_headroom(f64::NAN),
            AutoSize::new().with_every(0),
            AutoSize::new().with_window(Duration::ZERO),
            AutoSize::new().with_max_limit(usize::MAX),
        ] {
            let err = bad.check(1 << 40).unwrap_err();
            assert_eq!(err.field(), "autosize", "{err}");
        }
        assert!(AutoSize::new().with_headroom(1.0).check(1 << 40).is_ok());
    }
}
