//! [`CircuitBreakerLayer`] and its [`CircuitBreakerBuilder`]: the breaker's configuration.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use seawall_core::{ConfigError, Dispositions, FailureClass, LlmError, Random, StateKey};
use tower_layer::Layer;

use crate::config::Config;
use crate::registry::{BreakerHandle, Shared};
use crate::service::CircuitBreaker;
use crate::shared::{FleetLink, SharedBreakerState};
use crate::state::{StateChange, Verdict};
use crate::window::{MAX_COUNT_WINDOW, MAX_TIME_WINDOW, MIN_TIME_WINDOW, WindowKind};

/// The most half-open probes a breaker admits at once.
pub const MAX_PROBES: u32 = 256;

/// Wraps a service in a keyed circuit breaker. Every service the layer makes shares the same
/// breakers; see the [crate docs](crate) for the defaults.
pub struct CircuitBreakerLayer<K = StateKey> {
    shared: Arc<Shared>,
    key: K,
}

impl CircuitBreakerLayer {
    /// A layer with the default settings, keyed by [`LlmRequest::state_key`](seawall_core::LlmRequest::state_key).
    pub fn new() -> Self {
        CircuitBreakerLayer {
            shared: Arc::new(Shared::new(Config::default())),
            key: StateKey,
        }
    }

    /// A builder starting from the default settings.
    pub fn builder() -> CircuitBreakerBuilder {
        CircuitBreakerBuilder {
            cfg: Config::default(),
            key: StateKey,
        }
    }
}

impl Default for CircuitBreakerLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> CircuitBreakerLayer<K> {
    /// A handle to read the state of each key and set modes at run time.
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle::new(self.shared.clone())
    }
}

impl<K: Clone> Clone for CircuitBreakerLayer<K> {
    fn clone(&self) -> Self {
        CircuitBreakerLayer {
            shared: self.shared.clone(),
            key: self.key.clone(),
        }
    }
}

impl<S, K: Clone> Layer<S> for CircuitBreakerLayer<K> {
    type Service = CircuitBreaker<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreaker::from_parts(inner, self.shared.clone(), self.key.clone())
    }
}

impl<K> fmt::Debug for CircuitBreakerLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerLayer")
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

/// Settings of a [`CircuitBreakerLayer`]. Every setting starts at the default documented on
/// its method; [`build`](CircuitBreakerBuilder::build) checks them.
pub struct CircuitBreakerBuilder<K = StateKey> {
    cfg: Config,
    key: K,
}

impl<K> CircuitBreakerBuilder<K> {
    /// Trip when failures make up at least `rate` (in `(0, 1]`) of the counted calls in the
    /// window, once the window holds [`minimum_calls`](Self::minimum_calls). Default 0.5.
    pub fn failure_rate(mut self, rate: f64) -> Self {
        self.cfg.failure_rate = Some(rate);
        self
    }

    /// Never trip on the failure rate (consecutive failures and slow calls still can).
    pub fn no_failure_rate(mut self) -> Self {
        self.cfg.failure_rate = None;
        self
    }

    /// The fewest counted calls in the window before a rate can trip the breaker. Default 20.
    pub fn minimum_calls(mut self, calls: u32) -> Self {
        self.cfg.minimum_calls = calls;
        self
    }

    /// Rates over the last `calls` counted calls (1 to 100,000). The default: 100.
    pub fn count_window(mut self, calls: u32) -> Self {
        self.cfg.window = WindowKind::Count(calls);
        self
    }

    /// Rates over the calls of the last `duration` (100 ms to 1 h), kept in about one bucket
    /// per second (10 to 300 buckets), so the window's edge moves a bucket at a time. A bucket
    /// counts at most 16,383 calls; more saturate.
    pub fn time_window(mut self, duration: Duration) -> Self {
        self.cfg.window = WindowKind::Time(duration);
        self
    }

    /// Trip after `n` failures in a row (ignored outcomes do not break the streak; a response
    /// head does, the success at a body's end does not); 0 turns it off. Default 5.
    pub fn consecutive_failures(mut self, n: u32) -> Self {
        self.cfg.consecutive_failures = u64::from(n);
        self
    }

    /// A call whose response head (for a stream behind seawall's stream layer: the first
    /// token) takes longer than `threshold` is slow; trip when slow calls make up at least
    /// `rate` of the window. A slow probe counts as a failed probe. Off by default.
    pub fn slow_calls(mut self, threshold: Duration, rate: f64) -> Self {
        self.cfg.slow_threshold = Some(threshold);
        self.cfg.slow_rate = rate;
        self
    }

    /// Stay open for `duration` every time. (Jitter still applies; set it to 0 for an exact
    /// duration.)
    pub fn open_for(mut self, duration: Duration) -> Self {
        self.cfg.open_base = duration;
        self.cfg.open_max = duration;
        self.cfg.open_factor = 1.0;
        self
    }

    /// Stay open `base`, then `base * factor^n` after the n-th consecutive re-open (a failed
    /// half-open period), at most `max`. Closing resets the growth. Default 10 s, x2, 120 s.
    pub fn open_backoff(mut self, base: Duration, factor: f64, max: Duration) -> Self {
        self.cfg.open_base = base;
        self.cfg.open_factor = factor;
        self.cfg.open_max = max;
        self
    }

    /// Shortens each open period by a random fraction up to `jitter` (in `[0, 1)`), so the
    /// breakers of many replicas do not probe in step. Default 0.1.
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.cfg.jitter = jitter;
        self
    }

    /// The source of jitter. Default: seeded from entropy.
    pub fn random(mut self, random: impl Random) -> Self {
        self.cfg.random = Arc::new(random);
        self
    }

    /// How many probes may be in flight at once when half-open (1 to 256). Default 1.
    pub fn probes(mut self, n: u32) -> Self {
        self.cfg.probes = n;
        self
    }

    /// Successful probes needed to close. Default 1.
    pub fn probe_successes(mut self, n: u32) -> Self {
        self.cfg.probe_successes = u64::from(n);
        self
    }

    /// Failed probes that re-open the breaker. Default 1; raise it (with more probes) so a
    /// single flaky probe does not re-open it.
    pub fn probe_failures(mut self, n: u32) -> Self {
        self.cfg.probe_failures = u64::from(n);
        self
    }

    /// How long a probe may hold its slot. A probe holds its slot until its body ends; one
    /// that is still running after this long (a hung call, an abandoned stream that was never
    /// dropped) loses its slot to the next caller, and its outcome is ignored. Default 60 s.
    pub fn max_probe_wait(mut self, wait: Duration) -> Self {
        self.cfg.max_probe_wait = wait;
        self
    }

    /// Which classes count as failures: those whose disposition has `counts_for_breaker`.
    /// Default: seawall's table (5xx, 529, timeouts, connection failures, broken streams).
    pub fn dispositions(mut self, table: Dispositions) -> Self {
        self.cfg.dispositions = table;
        self
    }

    /// Overrides how one class counts, e.g. `Verdict::Success` for `InvalidRequest` ("the
    /// upstream answered"), or `Verdict::Failure` for `RateLimited`.
    pub fn verdict(mut self, class: FailureClass, verdict: Verdict) -> Self {
        self.cfg.overrides.retain(|(c, _)| *c != class);
        self.cfg.overrides.push((class, verdict));
        self
    }

    /// How a cancelled call counts (its future or body dropped before the end). Default
    /// [`Verdict::Ignore`].
    pub fn on_cancel(mut self, verdict: Verdict) -> Self {
        self.cfg.on_cancel = verdict;
        self
    }

    /// When an upstream error carries a retry hint (its `retry-after`, or the reset of an
    /// exhausted rate-limit window, see [`LlmError::retry_hint`]), open the key's breaker
    /// until then, at most `max` from now, whatever the error's class. Off by default.
    pub fn open_on_retry_hint(self, max: Duration) -> Self {
        self.open_until(move |err: &LlmError| {
            if err.class().is_local() {
                return None;
            }
            err.retry_hint()
                .filter(|d| !d.is_zero())
                .map(|d| d.min(max))
        })
    }

    /// The classes of which one call opens the key's breaker at once: from closed, it opens
    /// for the first open period (10 s by default); a half-open probe ending in one counts as
    /// a failed probe (so the next period is longer, doubling up to the maximum). The class
    /// still counts for the failure-rate window as its verdict says (by default not at all).
    /// Default: [`QuotaExhausted`](FailureClass::QuotaExhausted) alone. An exhausted quota
    /// (a spending limit, an unpaid bill) does not come back in seconds; until it does, every
    /// call sent to the key costs a round trip for another refusal. With the breaker open, a
    /// fallback layer outside it sends calls to its next target at once (`CircuitOpen` falls
    /// back at once), and one probe per open period finds out when the key is topped up.
    /// A refusal while an exhausted quota keeps the breaker open says so in its message and
    /// carries an error of class `QuotaExhausted` as its source
    /// ([`LlmError::source_ref`]). An empty list turns this off.
    pub fn open_at_once(mut self, classes: impl IntoIterator<Item = FailureClass>) -> Self {
        self.cfg.open_at_once = classes.into_iter().collect();
        self
    }

    /// The general form of [`open_on_retry_hint`](Self::open_on_retry_hint): `f` returns how
    /// long to keep the key's breaker open after an error, if at all.
    pub fn open_until(
        mut self,
        f: impl Fn(&LlmError) -> Option<Duration> + Send + Sync + 'static,
    ) -> Self {
        self.cfg.open_hint = Some(Arc::new(f));
        self
    }

    /// The most keys with a breaker of their own (keys are first cut to
    /// [`MAX_KEY_LEN`](seawall_core::MAX_KEY_LEN) bytes). At the cap, a new key evicts the idle
    /// closed keys, else the least recently used eighth of the closed keys with no failure or
    /// slow call in their window; open, half-open and manual keys are never evicted. If nothing can be
    /// evicted, the new key shares the [`OVERFLOW_KEY`](crate::OVERFLOW_KEY) breaker.
    /// Default 1024.
    pub fn max_keys(mut self, n: usize) -> Self {
        self.cfg.max_keys = n;
        self
    }

    /// A key unused this long may be evicted when the cap is reached. Default 10 min.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.cfg.idle_timeout = timeout;
        self
    }

    /// Calls `f` on every state change (after the `tracing` event). It runs on the caller's
    /// task: keep it short.
    pub fn on_state_change(mut self, f: impl Fn(&StateChange) + Send + Sync + 'static) -> Self {
        self.cfg.on_change = Some(Arc::new(f));
        self
    }

    /// Shares the breakers' state with the other replicas of a fleet through `state` (e.g.
    /// `seawall_redis::RedisBreakerState`). The calls themselves stay local: a call through a
    /// closed breaker never waits on the shared state; what the fleet decides reaches the
    /// breakers through the state's background task. Off by default. See
    /// [`SharedBreakerState`] for the contract.
    pub fn shared_state(mut self, state: impl SharedBreakerState) -> Self {
        self.cfg.shared = Some(Arc::new(state));
        self
    }

    /// Keys requests with `key` instead of [`LlmRequest::state_key`](seawall_core::LlmRequest::state_key).
    pub fn key_fn<K2>(self, key: K2) -> CircuitBreakerBuilder<K2> {
        CircuitBreakerBuilder { cfg: self.cfg, key }
    }

    /// Checks the settings and builds the layer.
    pub fn build(self) -> Result<CircuitBreakerLayer<K>, ConfigError> {
        let c = &self.cfg;
        let rate_ok = |r: f64| r > 0.0 && r <= 1.0;
        if let Some(r) = c.failure_rate {
            if !rate_ok(r) {
                return Err(ConfigError::new(
                    "failure_rate",
                    format!("must be in (0, 1], got {r}"),
                ));
            }
        }
        if let Some(t) = c.slow_threshold {
            if t.is_zero() {
                return Err(ConfigError::new(
                    "slow_calls",
                    "the slow-call threshold must be above zero",
                ));
            }
            if !rate_ok(c.slow_rate) {
                return Err(ConfigError::new(
                    "slow_calls",
                    format!("the slow-call rate must be in (0, 1], got {}", c.slow_rate),
                ));
            }
        }
        match c.window {
            WindowKind::Count(n) if n == 0 || n > MAX_COUNT_WINDOW => {
                return Err(ConfigError::new(
                    "count_window",
                    format!("must be 1 to {MAX_COUNT_WINDOW} calls, got {n}"),
                ));
            }
            WindowKind::Count(n) if c.minimum_calls > n => {
                return Err(ConfigError::new(
                    "minimum_calls",
                    format!(
                        "{} exceeds the count window ({n}): the rates could never trip",
                        c.minimum_calls
                    ),
                ));
            }
            WindowKind::Time(d) if !(MIN_TIME_WINDOW..=MAX_TIME_WINDOW).contains(&d) => {
                return Err(ConfigError::new(
                    "time_window",
                    format!("must be 100ms to 1h, got {d:?}"),
                ));
            }
            _ => {}
        }
        if c.minimum_calls == 0 {
            return Err(ConfigError::new("minimum_calls", "must be at least 1"));
        }
        if c.open_base.is_zero() || c.open_max < c.open_base {
            return Err(ConfigError::new(
                "open_backoff",
                "the open duration must be above zero, and its maximum at least its base",
            ));
        }
        if !(c.open_factor.is_finite() && c.open_factor >= 1.0) {
            return Err(ConfigError::new(
                "open_backoff",
                format!(
                    "the factor must be finite and at least 1, got {}",
                    c.open_factor
                ),
            ));
        }
        if !(0.0..1.0).contains(&c.jitter) {
            return Err(ConfigError::new(
                "jitter",
                format!("must be in [0, 1), got {}", c.jitter),
            ));
        }
        if c.probes == 0 || c.probes > MAX_PROBES {
            return Err(ConfigError::new(
                "probes",
                format!("must be 1 to {MAX_PROBES}, got {}", c.probes),
            ));
        }
        if c.probe_successes == 0 || c.probe_failures == 0 {
            let field = if c.probe_successes == 0 {
                "probe_successes"
            } else {
                "probe_failures"
            };
            return Err(ConfigError::new(field, "must be at least 1"));
        }
        if c.max_probe_wait.is_zero() {
            return Err(ConfigError::new("max_probe_wait", "must be above zero"));
        }
        if c.max_keys == 0 {
            return Err(ConfigError::new("max_keys", "must be at least 1"));
        }
        let mut cfg = self.cfg;
        cfg.start = tokio::time::Instant::now();
        let shared = Arc::new(Shared::new(cfg));
        if let Some(state) = &shared.cfg.shared {
            state.attach(FleetLink::new(&shared))?;
        }
        Ok(CircuitBreakerLayer {
            shared,
            key: self.key,
        })
    }
}

impl<K> fmt::Debug for CircuitBreakerBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerBuilder")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_clear_errors() {
        let cases: Vec<(CircuitBreakerBuilder, &str)> = vec![
            (
                CircuitBreakerLayer::builder().failure_rate(1.5),
                "failure_rate",
            ),
            (
                CircuitBreakerLayer::builder().failure_rate(f64::NAN),
                "failure_rate",
            ),
            (
                CircuitBreakerLayer::builder().count_window(0),
                "count_window",
            ),
            (
                CircuitBreakerLayer::builder()
                    .count_window(10)
                    .minimum_calls(11),
                "minimum_calls",
            ),
            (
                CircuitBreakerLayer::builder().time_window(Duration::from_secs(7200)),
                "time_window",
            ),
            (CircuitBreakerLayer::builder().probes(0), "probes"),
            (CircuitBreakerLayer::builder().probes(1000), "probes"),
            (CircuitBreakerLayer::builder().jitter(1.0), "jitter"),
            (
                CircuitBreakerLayer::builder().open_backoff(
                    Duration::from_secs(10),
                    0.5,
                    Duration::from_secs(20),
                ),
                "factor",
            ),
            (
                CircuitBreakerLayer::builder().open_for(Duration::ZERO),
                "open duration",
            ),
            (
                CircuitBreakerLayer::builder().slow_calls(Duration::from_secs(1), 0.0),
                "slow-call rate",
            ),
            (CircuitBreakerLayer::builder().max_keys(0), "max_keys"),
            (
                CircuitBreakerLayer::builder().max_probe_wait(Duration::ZERO),
                "max_probe_wait",
            ),
        ];
        for (builder, needle) in cases {
            let err = builder.build().unwrap_err();
            assert!(err.to_string().contains(needle), "{err} lacks {needle}");
        }
        assert!(CircuitBreakerLayer::builder().build().is_ok());
    }
}
