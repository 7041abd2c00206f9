//! What the upstream says about its rate limits: pauses per key.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::Shared;
use crate::key::KeyState;

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

    pub(crate) fn key_state(&self, key: Option<&str>, now: Instant) -> Arc<KeyState> {
        self.keys.get(key, &self.clock, now)
    }
}
