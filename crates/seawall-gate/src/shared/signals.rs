//! What the upstream says about its rate limits: pauses per key.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use seawall_core::{FailureClass, LlmError, RateLimitSnapshot};
use tokio::time::Instant;

use super::Shared;
use crate::key::KeyState;

/// How long a failed call says the upstream wants no more requests: a 429's `Retry-After` (or
/// reset), or, for any other failure, the reset of a rate-limit window it reports used up.
/// `None` when it says nothing.
///
/// The gate pauses a key for this long; it is public so that a fleet-wide limiter reads the
/// same signal the same way.
///
/// ```
/// use std::time::Duration;
/// use seawall_core::{FailureClass, LlmError};
/// let err = LlmError::new(FailureClass::RateLimited, "429").with_retry_after(Duration::from_secs(3));
/// assert_eq!(seawall_gate::pause_hint(&err), Some(Duration::from_secs(3)));
/// assert_eq!(seawall_gate::pause_hint(&LlmError::new(FailureClass::ServerError, "500")), None);
/// ```
pub fn pause_hint(err: &LlmError) -> Option<Duration> {
    match err.class() {
        FailureClass::RateLimited => err.retry_hint(),
        _ => err
            .rate_limit()
            .and_then(RateLimitSnapshot::exhausted_until),
    }
}

impl Shared {
    pub(super) fn pause(&self, key: &KeyState, d: Duration) {
        let cap = Duration::from_nanos(self.max_pause.load(Ordering::Acquire));
        let d = d.min(cap);
        if d.is_zero() {
            return;
        }
        tracing::debug!(
            target: "seawall::gate",
            key = key.name().map(|k| &**k),
            pause_ms = d.as_millis() as u64,
            "seawall gate: upstream rate limit, pausing admissions for this key"
        );
        key.pause(&self.clock, Instant::now(), d);
    }

    pub(crate) fn pause_key(&self, key: Option<&str>, d: Duration) {
        let now = Instant::now();
        let state = self.keys.get(key, &self.clock, now);
        state.pause(&self.clock, now, d);
    }

    /// The state of `key`; `last` is the calling service's memory of its last key's state.
    pub(crate) fn key_state(
        &self,
        key: Option<&str>,
        last: &mut Option<Arc<KeyState>>,
        now: Instant,
    ) -> Arc<KeyState> {
        self.keys.get_remembered(key, last, &self.clock, now)
    }
}
