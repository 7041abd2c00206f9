//! The settings every key's breaker shares, with the documented defaults.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use seawall_core::{Dispositions, FailureClass, LlmError, Random, SeededRandom};

use crate::shared::SharedBreakerState;
use crate::state::{StateChange, Verdict};
use crate::window::WindowKind;

pub(crate) type ChangeFn = dyn Fn(&StateChange) + Send + Sync;
pub(crate) type HintFn = dyn Fn(&LlmError) -> Option<Duration> + Send + Sync;

/// Everything a breaker reads. Built once by the [`CircuitBreakerBuilder`](crate::CircuitBreakerBuilder) and shared by
/// every key through an `Arc`.
pub(crate) struct Config {
    pub(crate) window: WindowKind,
    pub(crate) failure_rate: Option<f64>,
    pub(crate) slow_threshold: Option<Duration>,
    pub(crate) slow_rate: f64,
    pub(crate) minimum_calls: u32,
    /// 0: off.
    pub(crate) consecutive_failures: u64,
    pub(crate) open_base: Duration,
    pub(crate) open_factor: f64,
    pub(crate) open_max: Duration,
    pub(crate) jitter: f64,
    pub(crate) probes: u32,
    pub(crate) probe_successes: u64,
    pub(crate) probe_failures: u64,
    pub(crate) max_probe_wait: Duration,
    pub(crate) random: Arc<dyn Random>,
    pub(crate) on_change: Option<Arc<ChangeFn>>,
    pub(crate) dispositions: Dispositions,
    pub(crate) overrides: Vec<(FailureClass, Verdict)>,
    pub(crate) on_cancel: Verdict,
    pub(crate) open_hint: Option<Arc<HintFn>>,
    /// Classes of which one call opens the breaker.
    pub(crate) open_at_once: Vec<FailureClass>,
    pub(crate) max_keys: usize,
    pub(crate) idle_timeout: Duration,
    pub(crate) start: tokio::time::Instant,
    pub(crate) shared: Option<Arc<dyn SharedBreakerState>>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            window: WindowKind::Count(100),
            failure_rate: Some(0.5),
            slow_threshold: None,
            slow_rate: 1.0,
            minimum_calls: 20,
            consecutive_failures: 5,
            open_base: Duration::from_secs(10),
            open_factor: 2.0,
            open_max: Duration::from_secs(120),
            jitter: 0.1,
            probes: 1,
            probe_successes: 1,
            probe_failures: 1,
            max_probe_wait: Duration::from_secs(60),
            random: Arc::new(SeededRandom::from_entropy()),
            on_change: None,
            dispositions: Dispositions::new(),
            overrides: Vec::new(),
            on_cancel: Verdict::Ignore,
            open_hint: None,
            open_at_once: vec![FailureClass::QuotaExhausted],
            max_keys: 1024,
            idle_timeout: Duration::from_secs(600),
            start: tokio::time::Instant::now(),
            shared: None,
        }
    }
}

impl Config {
    /// Nanoseconds since the layer was built, on tokio's clock (paused in tests).
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.at(tokio::time::Instant::now())
    }

    /// `instant` on the breaker's clock: nanoseconds since the layer was built.
    pub(crate) fn at(&self, instant: tokio::time::Instant) -> u64 {
        instant
            .saturating_duration_since(self.start)
            .as_nanos()
            .min(u128::from(u64::MAX)) as u64
    }

    /// How a class counts.
    pub(crate) fn verdict(&self, class: FailureClass) -> Verdict {
        if let Some((_, v)) = self.overrides.iter().find(|(c, _)| *c == class) {
            return *v;
        }
        if self.dispositions.get(class).counts_for_breaker {
            Verdict::Failure
        } else {
            Verdict::Ignore
        }
    }

    /// The open period after `reopens` consecutive re-opens, capped and jittered.
    pub(crate) fn open_duration(&self, reopens: u32) -> Duration {
        let grown = self.open_base.as_secs_f64() * self.open_factor.powi(reopens.min(64) as i32);
        let capped = grown.min(self.open_max.as_secs_f64());
        let jittered = capped * (1.0 - self.jitter * self.random.next_f64());
        Duration::try_from_secs_f64(jittered.max(0.0)).unwrap_or(self.open_max)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("window", &self.window)
            .field("failure_rate", &self.failure_rate)
            .field("slow_threshold", &self.slow_threshold)
            .field("slow_rate", &self.slow_rate)
            .field("minimum_calls", &self.minimum_calls)
            .field("consecutive_failures", &self.consecutive_failures)
            .field("open_base", &self.open_base)
            .field("open_factor", &self.open_factor)
            .field("open_max", &self.open_max)
            .field("jitter", &self.jitter)
            .field("probes", &self.probes)
            .field("probe_successes", &self.probe_successes)
            .field("probe_failures", &self.probe_failures)
            .field("max_probe_wait", &self.max_probe_wait)
            .field("overrides", &self.overrides)
            .field("on_cancel", &self.on_cancel)
            .field("open_hint", &self.open_hint.is_some())
            .field("open_at_once", &self.open_at_once)
            .field("on_change", &self.on_change.is_some())
            .field("max_keys", &self.max_keys)
            .field("idle_timeout", &self.idle_timeout)
            .field("shared", &self.shared.is_some())
            .finish_non_exhaustive()
    }
}
