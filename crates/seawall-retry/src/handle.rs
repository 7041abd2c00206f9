//! Runtime control of a retry layer: switch retries off or change the attempt cap during an
//! incident without rebuilding the stack, and read the counters.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::budget::RetryBudget;
use crate::policy::Shared;
use seawall_core::ConfigError;

/// The runtime switch and counters of one [`BackoffRetryLayer`](crate::BackoffRetryLayer).
///
/// Cheap to clone; every clone, and every service the layer made, sees a change at once,
/// without rebuilding the stack. Turning retries off is the first lever to pull in an
/// incident: calls still go out once, and a failure that would have been retried comes back
/// marked [`GiveUp::Disabled`](seawall_core::GiveUp::Disabled).
///
/// ```
/// use seawall_retry::BackoffRetryLayer;
///
/// let layer = BackoffRetryLayer::new();
/// let handle = layer.handle();
/// handle.set_enabled(false);
/// assert!(!layer.handle().is_enabled());
/// handle.set_max_attempts(2)?;
/// assert_eq!(handle.max_attempts(), 2);
/// assert!(handle.set_max_attempts(0).is_err());
/// # Ok::<(), seawall_retry::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct RetryHandle {
    shared: Arc<Shared>,
}

impl RetryHandle {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        RetryHandle { shared }
    }

    /// Turns retries on or off for every service of the layer.
    pub fn set_enabled(&self, enabled: bool) {
        self.shared.enabled.store(enabled, Ordering::Relaxed);
    }

    /// Whether retries are on.
    pub fn is_enabled(&self) -> bool {
        self.shared.enabled.load(Ordering::Relaxed)
    }

    /// Changes the most upstream calls per logical call, the first call included. Calls in
    /// progress see the new cap at their next failure. `0` is refused.
    pub fn set_max_attempts(&self, attempts: u32) -> Result<(), ConfigError> {
        if attempts == 0 {
            return Err(ConfigError::new(
                "max_attempts",
                "must be at least 1 (it counts the first call)",
            ));
        }
        self.shared.max_attempts.store(attempts, Ordering::Relaxed);
        Ok(())
    }

    /// The current attempt cap (the first call included).
    pub fn max_attempts(&self) -> u32 {
        self.shared.max_attempts.load(Ordering::Relaxed)
    }

    /// Retries this layer has made.
    pub fn retries(&self) -> u64 {
        self.shared.retries.load(Ordering::Relaxed)
    }

    /// Retries this layer wanted to make but the retry budget refused.
    pub fn budget_exhausted(&self) -> u64 {
        self.shared.budget_refusals.load(Ordering::Relaxed)
    }

    /// The shared retry budget, if there is one.
    pub fn retry_budget(&self) -> Option<&Arc<RetryBudget>> {
        self.shared.budget.as_ref()
    }
}
