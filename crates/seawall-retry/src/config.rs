//! The retry settings as plain data, with the documented defaults, and the one check that
//! turns them into the state every service of a layer shares.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::time::Duration;

use http::HeaderName;
use seawall_core::{ConfigError, Dispositions, FailureClass, Random, SeededRandom};

use crate::backoff::{Backoff, Jitter};
use crate::budget::RetryBudget;
use crate::policy::{CLASSES, Policy, Shared, default_max_retries};

/// What a [`BackoffRetryBuilder`](crate::BackoffRetryBuilder) collects.
pub(crate) struct Settings {
    pub(crate) max_attempts: u32,
    pub(crate) max_retries: [u32; CLASSES],
    pub(crate) dispositions: Dispositions,
    pub(crate) base: Duration,
    pub(crate) multiplier: f64,
    pub(crate) max_delay: Duration,
    pub(crate) jitter: Jitter,
    pub(crate) max_hint: Duration,
    pub(crate) hint_jitter: f64,
    pub(crate) overload_min: Duration,
    pub(crate) standby_wait: Duration,
    pub(crate) time_budget: Option<Duration>,
    pub(crate) budget: Option<Arc<RetryBudget>>,
    pub(crate) idempotency_header: Option<HeaderName>,
    pub(crate) attempt_header: Option<HeaderName>,
    pub(crate) random: Option<Arc<dyn Random>>,
}

impl Default for Settings {
    /// The defaults the [crate docs](crate#defaults) list.
    fn default() -> Self {
        let backoff = Backoff::default();
        Settings {
            max_attempts: 4,
            max_retries: default_max_retries(),
            dispositions: Dispositions::default(),
            base: backoff.base(),
            multiplier: backoff.multiplier(),
            max_delay: backoff.max_delay(),
            jitter: backoff.jitter(),
            max_hint: Duration::from_secs(60),
            hint_jitter: 0.1,
            overload_min: Duration::from_secs(5),
            // Off: see `BackoffRetryBuilder::standby_wait` for why.
            standby_wait: Duration::MAX,
            time_budget: Some(Duration::from_secs(120)),
            budget: Some(Arc::new(RetryBudget::default())),
            idempotency_header: None,
            attempt_header: None,
            random: None,
        }
    }
}

impl Settings {
    /// Checks the values and builds the shared state.
    pub(crate) fn into_shared(self) -> Result<Shared, ConfigError> {
        if self.max_attempts == 0 {
            return Err(ConfigError::new(
                "max_attempts",
                "must be at least 1 (it counts the first call)",
            ));
        }
        if let Some(i) = self.max_retries.iter().position(|n| *n > 255) {
            return Err(ConfigError::new(
                "max_retries",
                format!(
                    "at most 255 retries per class, got {} for {}",
                    self.max_retries[i],
                    FailureClass::ALL[i]
                ),
            ));
        }
        let backoff = Backoff::new(self.base, self.multiplier, self.max_delay, self.jitter)?;
        if !self.hint_jitter.is_finite() || !(0.0..=1.0).contains(&self.hint_jitter) {
            return Err(ConfigError::new(
                "hint_jitter",
                format!("must be a fraction in [0, 1], got {}", self.hint_jitter),
            ));
        }
        if self.time_budget.is_some_and(|b| b.is_zero()) {
            return Err(ConfigError::new(
                "time_budget",
                "must not be zero (use no_time_budget to remove it)",
            ));
        }
        let writes_headers = self.idempotency_header.is_some() || self.attempt_header.is_some();
        let policy = Policy {
            dispositions: self.dispositions,
            max_retries: self.max_retries,
            backoff,
            max_hint: self.max_hint,
            hint_jitter: self.hint_jitter,
            overload_min: self.overload_min,
            standby_wait: self.standby_wait,
            time_budget: self.time_budget,
            idempotency_header: self.idempotency_header,
            attempt_header: self.attempt_header,
            writes_headers,
        };
        Ok(Shared {
            policy,
            enabled: AtomicBool::new(true),
            max_attempts: AtomicU32::new(self.max_attempts),
            budget: self.budget,
            random: self
                .random
                .unwrap_or_else(|| Arc::new(SeededRandom::from_entropy())),
            keys: SeededRandom::from_entropy(),
            retries: AtomicU64::new(0),
            budget_refusals: AtomicU64::new(0),
        })
    }
}
