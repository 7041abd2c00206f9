//! What the fleet's limits tell a caller they turn away.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use seawall_core::{FailureClass, LlmError};
use seawall_gate::RejectReason;

/// The details of a `GateRejected` error from the fleet's limits, kept as its source: find
/// it with [`FleetRejection::of`].
///
/// The reasons are the gate's: [`KeyPaused`](RejectReason::KeyPaused) (the upstream's pause,
/// seen by any replica, lasts past the maximum wait), [`RateLimited`](RejectReason::RateLimited)
/// (the fleet's buckets admit the call only after it), [`WaitTimeout`](RejectReason::WaitTimeout)
/// (no fleet permit came free within it) and [`ZeroRate`](RejectReason::ZeroRate).
#[derive(Debug, Clone)]
pub struct FleetRejection {
    reason: RejectReason,
    key: Option<Arc<str>>,
    waited: Duration,
}

impl FleetRejection {
    /// The rejection inside a `GateRejected` error, if the fleet's limits made it.
    ///
    /// ```
    /// # use seawall_core::{FailureClass, LlmError};
    /// # use seawall_redis::fleet::FleetRejection;
    /// let other = LlmError::new(FailureClass::GateRejected, "some gate");
    /// assert!(FleetRejection::of(&other).is_none());
    /// ```
    pub fn of(err: &LlmError) -> Option<&FleetRejection> {
        err.source_ref()?.downcast_ref()
    }

    /// Why.
    pub fn reason(&self) -> RejectReason {
        self.reason
    }

    /// The key the call was under, if it had one.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// How long the call waited before it was turned away.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// The error: class `GateRejected`, with the time to wait as its retry hint when known.
    pub(crate) fn error(
        reason: RejectReason,
        key: Option<Arc<str>>,
        waited: Duration,
        max_wait: Duration,
        hint: Option<Duration>,
    ) -> LlmError {
        let message = match reason {
            RejectReason::KeyPaused => format!(
                "the upstream's rate limit paused this key fleet-wide for {:?}, longer than the \
                 max wait of {max_wait:?}; retry later",
                hint.unwrap_or_default()
            ),
            RejectReason::RateLimited => format!(
                "the key's fleet-wide rate limit admits this call only in {:?}, after the max \
                 wait of {max_wait:?}; retry later",
                hint.unwrap_or_default()
            ),
            RejectReason::ZeroRate => "the key's fleet-wide limit is zero".to_owned(),
            _ => format!(
                "no fleet-wide permit for this key within the max wait of {max_wait:?}; retry later"
            ),
        };
        tracing::debug!(
            target: "seawall::redis",
            reason = reason.as_str(),
            key = key.as_deref(),
            waited_ms = waited.as_secs_f64() * 1e3,
            "fleet limit: rejected"
        );
        let mut err =
            LlmError::new(FailureClass::GateRejected, message).with_source(FleetRejection {
                reason,
                key,
                waited,
            });
        if let Some(d) = hint {
            err = err.with_retry_after(d);
        }
        err
    }
}

impl fmt::Display for FleetRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fleet limit rejected ({}) after {:?}",
            self.reason.as_str(),
            self.waited
        )
    }
}

impl StdError for FleetRejection {}
