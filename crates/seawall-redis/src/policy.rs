//! What a layer does while its shared state cannot be reached.

use std::num::NonZeroU32;

use seawall_core::{FailureClass, LlmError};

/// A layer's policy for the moments Redis does not answer within its timeout.
///
/// There is no right answer for every layer, so each layer says which it wants:
/// a budget that guards real money usually fails closed; a rate limit whose only job is to
/// keep the fleet under the provider's limits usually fails open, since the provider still
/// enforces its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnavailable {
    /// Refuse the call with a [`FailureClass::SharedStateUnavailable`] error: nothing is spent
    /// that the fleet could not count.
    FailClosed,
    /// Go on with the in-process state, enforcing `1 / replicas` of each limit, so the fleet
    /// as a whole stays near its limit while it cannot coordinate.
    FailOpen {
        /// How many replicas share the limit (the expected fleet size).
        replicas: NonZeroU32,
    },
}

impl OnUnavailable {
    /// Fail open with a share of `1 / replicas` of each limit (at least one replica).
    pub fn fail_open(replicas: u32) -> Self {
        OnUnavailable::FailOpen {
            replicas: NonZeroU32::new(replicas).unwrap_or(NonZeroU32::MIN),
        }
    }

    /// The error a fail-closed layer answers with; `what` names the state ("budget").
    pub fn refusal(what: &str) -> LlmError {
        LlmError::new(
            FailureClass::SharedStateUnavailable,
            format!("the shared {what} state could not be reached in time; call refused"),
        )
    }
}
