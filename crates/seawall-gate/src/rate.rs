//! Request- and token-rate limits: a token bucket with continuous refill.
//!
//! Each limit is a bucket of `burst` units that refills at `per_minute / 60` units a second
//! (no fixed windows, so no double burst at a window edge). A request is admitted when the
//! bucket holds at least its cost, then the cost is taken. A cost larger than the whole
//! bucket is admitted when the bucket is full and leaves it in debt, so one huge request is
//! never refused forever and the long-run rate still holds. When the response reports its
//! real usage the difference is settled: unused tokens go back (up to the bucket's size), an
//! overrun is charged and delays the next admissions.
//!
//! The guarantee: over any interval of `W` seconds a key is admitted at most
//! `burst + per_minute * W / 60` units (plus one request's overrun). Anthropic documents its own
//! limits as such a bucket; OpenAI enforces per-minute limits over shorter periods too, which is
//! why the default burst is ten seconds' worth rather than a whole minute.

use std::time::Duration;

use tokio::time::Instant;

/// One rate: so many units (requests or tokens) per minute, with a burst allowance.
///
/// ```
/// use seawall_gate::Limit;
/// let rpm = Limit::per_minute(600);
/// assert_eq!(rpm.burst(), 100); // ten seconds' worth by default
/// assert_eq!(rpm.with_burst(20).burst(), 20);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    per_minute: u64,
    burst: Option<u64>,
}

impl Limit {
    /// `n` units a minute, refilled continuously; the burst defaults to ten seconds' worth
    /// (`n / 6`, at least 1). A limit of zero admits nothing: calls are rejected at once.
    pub const fn per_minute(n: u64) -> Self {
        Limit {
            per_minute: n,
            burst: None,
        }
    }

    /// Sets how many units may go at once after an idle period (at least 1).
    pub const fn with_burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// The rate, in units a minute.
    pub const fn units_per_minute(&self) -> u64 {
        self.per_minute
    }

    /// The burst as set, if it was (the builder refuses 0).
    pub(crate) const fn configured_burst(&self) -> Option<u64> {
        self.burst
    }

    /// The burst: the bucket's size.
    pub const fn burst(&self) -> u64 {
        let b = match self.burst {
            Some(b) => b,
            None => self.per_minute / 6,
        };
        if b == 0 { 1 } else { b }
    }
}

/// The rate limits of one key: requests a minute (RPM) and tokens a minute (TPM).
///
/// A request costs one request and its estimated tokens: the prompt's text estimate, each
/// image, audio part and file at the gate's
/// [`part_estimate`](crate::ConcurrencyGateBuilder::part_estimate), and its maximum output times the
/// answers it asks for (`n`, `best_of`). A request without a maximum output is charged
/// `u32::MAX` output tokens: it waits for a full bucket and holds the key until it ends,
/// never passing for free. The charge is settled against the reported usage when the call
/// ends; a call that ends without usage (failed, dropped, or not reported) gives its output
/// part back and keeps its input estimate charged.
///
/// ```
/// use seawall_gate::{Limit, Rates};
/// let rates = Rates::new()
///     .requests_per_minute(500)
///     .with_tokens(Limit::per_minute(200_000).with_burst(50_000));
/// assert_eq!(rates.requests().unwrap().units_per_minute(), 500);
/// assert!(!rates.is_unlimited());
/// assert!(Rates::new().is_unlimited());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Rates {
    requests: Option<Limit>,
    tokens: Option<Limit>,
}

impl Rates {
    /// No limits.
    pub const fn new() -> Self {
        Rates {
            requests: None,
            tokens: None,
        }
    }

    /// Sets the request limit.
    pub const fn with_requests(mut self, limit: Limit) -> Self {
        self.requests = Some(limit);
        self
    }

    /// Sets the token limit.
    pub const fn with_tokens(mut self, limit: Limit) -> Self {
        self.tokens = Some(limit);
        self
    }

    /// Shorthand for `with_requests(Limit::per_minute(n))`.
    pub const fn requests_per_minute(self, n: u64) -> Self {
        self.with_requests(Limit::per_minute(n))
    }

    /// Shorthand for `with_tokens(Limit::per_minute(n))`.
    pub const fn tokens_per_minute(self, n: u64) -> Self {
        self.with_tokens(Limit::per_minute(n))
    }

    /// The request limit.
    pub const fn requests(&self) -> Option<Limit> {
        self.requests
    }

    /// The token limit.
    pub const fn tokens(&self) -> Option<Limit> {
        self.tokens
    }

    /// Whether no limit is set.
    pub const fn is_unlimited(&self) -> bool {
        self.requests.is_none() && self.tokens.is_none()
    }
}

/// When a [`Bucket`] can admit a cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// At once.
    Now,
    /// After this long (if nothing else is taken meanwhile).
    After(Duration),
    /// Never: the limit is zero.
    Never,
}

impl Ready {
    /// The later of two answers (`Never` wins).
    pub fn max(self, other: Ready) -> Ready {
        match (self, other) {
            (Ready::Never, _) | (_, Ready::Never) => Ready::Never,
            (Ready::Now, r) | (r, Ready::Now) => r,
            (Ready::After(a), Ready::After(b)) => Ready::After(a.max(b)),
        }
    }
}

/// A token bucket with continuous refill for one [`Limit`]; its level may go negative (debt).
///
/// The gate keeps one per key and limit; it is public so that another limiter (the in-process
/// share a fleet-wide limiter of `seawall-redis` falls back on) counts exactly as the gate
/// does. Time is whatever `Instant`s the caller passes, so a caller with its own clock maps
/// its readings onto instants.
///
/// ```
/// use std::time::Duration;
/// use seawall_gate::{Bucket, Limit, Ready};
/// use tokio::time::Instant;
/// let start = Instant::now();
/// let mut b = Bucket::new(Limit::per_minute(60).with_burst(2), start);
/// assert_eq!(b.ready(2, start), Ready::Now);
/// b.take(2);
/// assert_eq!(b.ready(1, start), Ready::After(Duration::from_secs(1)));
/// assert_eq!(b.ready(1, start + Duration::from_secs(1)), Ready::Now);
/// ```
#[derive(Debug, Clone)]
pub struct Bucket {
    limit: Limit,
    /// Units per second.
    rate: f64,
    cap: f64,
    level: f64,
    at: Instant,
}

/// Slack for float rounding when comparing levels.
const EPS: f64 = 1e-6;

impl Bucket {
    /// A full bucket.
    pub fn new(limit: Limit, now: Instant) -> Self {
        let cap = limit.burst() as f64;
        Bucket {
            limit,
            rate: limit.per_minute as f64 / 60.0,
            cap,
            level: cap,
            at: now,
        }
    }

    /// Changes the limit, keeping the current level (clamped to the new size).
    pub(crate) fn set_limit(&mut self, limit: Limit, now: Instant) {
        if limit == self.limit {
            return;
        }
        self.refill(now);
        *self = Bucket {
            level: self.level.min(limit.burst() as f64),
            ..Bucket::new(limit, now)
        };
    }

    fn refill(&mut self, now: Instant) {
        if now > self.at {
            let dt = now.duration_since(self.at).as_secs_f64();
            self.level = (self.level + self.rate * dt).min(self.cap);
            self.at = now;
        }
    }

    /// When `cost` can be admitted (a cost above the bucket's size needs a full bucket).
    pub fn ready(&mut self, cost: u64, now: Instant) -> Ready {
        self.ready_keeping(cost, 0.0, now)
    }

    /// When `cost` can be admitted leaving `keep` (a fraction of the bucket's size) in it for
    /// others: a priority lane's reserve. A cost above what may be taken needs a full bucket.
    pub(crate) fn ready_keeping(&mut self, cost: u64, keep: f64, now: Instant) -> Ready {
        self.ready_behind(0, cost, keep, now)
    }

    /// When `cost` fits after `ahead` units that calls before it will take first: the bucket
    /// must then have refilled those too.
    pub(crate) fn ready_behind(&mut self, ahead: u64, cost: u64, keep: f64, now: Instant) -> Ready {
        if self.limit.per_minute == 0 {
            return Ready::Never;
        }
        self.refill(now);
        let need = ((cost as f64).min(self.cap) + keep * self.cap).min(self.cap) + ahead as f64;
        if self.level + EPS >= need {
            Ready::Now
        } else {
            // To the nearest nanosecond: a wake-up a hair short still passes the `EPS` check.
            let secs = (need - self.level) / self.rate;
            Ready::After(Duration::from_nanos((secs * 1e9).round().min(1e18) as u64))
        }
    }

    /// Takes `cost` (call after `ready` said `Now`).
    pub fn take(&mut self, cost: u64) {
        self.level -= cost as f64;
    }

    /// Gives back `units` (never above the bucket's size).
    pub fn give_back(&mut self, units: u64, now: Instant) {
        self.refill(now);
        self.level = (self.level + units as f64).min(self.cap);
    }

    /// Whether the bucket is full, so forgetting it loses nothing.
    pub fn is_full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.level + EPS >= self.cap
    }

    #[cfg(test)]
    pub(crate) fn level(&self) -> f64 {
        self.level
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn defaults_and_zero() {
        assert_eq!(Limit::per_minute(6).burst(), 1);
        assert_eq!(Limit::per_minute(0).burst(), 1);
        assert_eq!(Limit::per_minute(60).with_burst(0).burst(), 1);
        let now = Instant::now();
        let mut b = Bucket::new(Limit::per_minute(0), now);
        assert_eq!(b.ready(1, now), Ready::Never);
        assert_eq!(b.ready(0, now), Ready::Never);
    }

    #[test]
    fn oversized_cost_waits_for_a_full_bucket_and_leaves_debt() {
        let now = Instant::now();
        let mut b = Bucket::new(Limit::per_minute(600).with_burst(10), now);
        assert_eq!(b.ready(50, now), Ready::Now);
        b.take(50);
        assert!((b.level() + 40.0).abs() < 1e-9);
        // 50 units at 10/s to get back to a full bucket.
        assert_eq!(b.ready(1, now), Ready::After(Duration::from_millis(4100)));
        assert_eq!(b.ready(10, now), Ready::After(Duration::from_secs(5)));
        assert_eq!(b.ready(50, now), Ready::After(Duration::from_secs(5)));
    }

    #[test]
    fn a_lane_leaves_its_reserve_in_the_bucket() {
        let now = Instant::now();
        let mut b = Bucket::new(Limit::per_minute(600).with_burst(10), now);
        // Half of the burst must stay: 5 units of cost 1 go, the sixth waits 0.1 s.
        for _ in 0..5 {
            assert_eq!(b.ready_keeping(1, 0.5, now), Ready::Now);
            b.take(1);
        }
        assert_eq!(
            b.ready_keeping(1, 0.5, now),
            Ready::After(Duration::from_millis(100))
        );
        // Without a reserve the rest is there.
        assert_eq!(b.ready(5, now), Ready::Now);
        // A cost above what the lane may take waits for a full bucket, never refused.
        let mut full = Bucket::new(Limit::per_minute(600).with_burst(10), now);
        assert_eq!(full.ready_keeping(8, 0.5, now), Ready::Now);
        full.take(1);
        assert_eq!(
            full.ready_keeping(8, 0.5, now),
            Ready::After(Duration::from_millis(100))
        );
    }

    #[test]
    fn give_back_is_capped() {
        let now = Instant::now();
        let mut b = Bucket::new(Limit::per_minute(60).with_burst(5), now);
        b.take(3);
        b.give_back(100, now);
        assert!(b.is_full(now));
    }

    proptest! {
        /// Admitting greedily at the moments the bucket allows, the units admitted in any
        /// window of W seconds never exceed burst + rate * W.
        #[test]
        fn window_bound_holds(
            per_minute in 1u64..5_000,
            burst in 1u64..500,
            costs in proptest::collection::vec(1u64..400, 1..200),
            gaps_ms in proptest::collection::vec(0u64..3_000, 1..200),
        ) {
            let start = Instant::now();
            let limit = Limit::per_minute(per_minute).with_burst(burst);
            let mut b = Bucket::new(limit, start);
            let mut t = start;
            let mut admitted: Vec<(Instant, u64)> = Vec::new();
            for (i, cost) in costs.iter().enumerate() {
                let cost = (*cost).min(burst);
                t += Duration::from_millis(gaps_ms[i % gaps_ms.len()]);
                loop {
                    match b.ready(cost, t) {
                        Ready::Now => break,
                        Ready::After(d) => t += d,
                        Ready::Never => unreachable!(),
                    }
                }
                b.take(cost);
                admitted.push((t, cost));
            }
            let rate = per_minute as f64 / 60.0;
            for (i, (from, _)) in admitted.iter().enumerate() {
                let mut sum = 0u64;
                for (at, cost) in &admitted[i..] {
                    sum += cost;
                    let w = at.duration_since(*from).as_secs_f64();
                    prop_assert!(
                        sum as f64 <= burst as f64 + rate * w + 1e-3,
                        "{} units in {}s with burst {} rate {}/s", sum, w, burst, rate
                    );
                }
            }
        }
    }
}
