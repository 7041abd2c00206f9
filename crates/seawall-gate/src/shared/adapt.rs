//! The adaptive mode: the limit steps down on congestion and back up after a run of
//! successes.

use std::sync::atomic::Ordering;

use super::Shared;

impl Shared {
    /// The upstream pushed back (429 or overload) on a call admitted at `epoch`.
    pub(super) fn congestion(&self, epoch: u64) {
        if !self.adaptive_on.load(Ordering::Acquire) {
            return;
        }
        let mut c = self.control();
        let Some(a) = c.adaptive else { return };
        if self.epoch.load(Ordering::Acquire) != epoch {
            return;
        }
        let new = a.decreased(c.current);
        if new != c.current {
            tracing::debug!(
                target: "seawall::gate",
                from = c.current,
                to = new,
                "seawall gate: adaptive decrease"
            );
            self.apply(&mut c, new);
            self.epoch.fetch_add(1, Ordering::AcqRel);
        }
        self.successes.store(0, Ordering::Relaxed);
    }

    pub(super) fn success(&self) {
        if !self.adaptive_on.load(Ordering::Acquire) {
            return;
        }
        let n = self.successes.fetch_add(1, Ordering::AcqRel) + 1;
        if n < self.limit.load(Ordering::Acquire) {
            return;
        }
        let mut c = self.control();
        if c.adaptive.is_none() || self.successes.load(Ordering::Acquire) < c.current {
            return;
        }
        self.successes.store(0, Ordering::Relaxed);
        if c.current < c.ceiling {
            let new = c.current + 1;
            tracing::trace!(target: "seawall::gate", to = new, "seawall gate: adaptive increase");
            self.apply(&mut c, new);
        }
    }
}
