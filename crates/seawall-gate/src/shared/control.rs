//! Runtime control: the limit, the queue, the waits and the stats a `GateHandle` reads and
//! changes while calls flow.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Control, GateStats, Shared, nanos};
use crate::adaptive::Adaptive;
use crate::lanes::{LaneStats, Priority};
use crate::permits::Permits;

impl Shared {
    pub(super) fn apply(&self, c: &mut Control, new: usize) {
        self.permits.resize(c.current, new);
        c.current = new;
        self.limit.store(new, Ordering::Release);
        if let Some(lanes) = &self.lanes {
            lanes.dispatch(&self.permits, new);
        }
    }

    pub(crate) fn set_limit(&self, n: usize) {
        let n = n.min(Permits::MAX);
        let mut c = self.control();
        c.ceiling = n;
        self.apply(&mut c, n);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.successes.store(0, Ordering::Relaxed);
    }

    pub(crate) fn set_adaptive(&self, adaptive: Option<Adaptive>) {
        let mut c = self.control();
        c.adaptive = adaptive;
        self.adaptive_on
            .store(adaptive.is_some(), Ordering::Release);
        if adaptive.is_none() {
            let ceiling = c.ceiling;
            self.apply(&mut c, ceiling);
        }
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.successes.store(0, Ordering::Relaxed);
    }

    pub(crate) fn adaptive(&self) -> Option<Adaptive> {
        self.control().adaptive
    }

    pub(crate) fn set_max_queue(&self, n: usize) {
        self.max_queue.store(n, Ordering::Release);
    }

    pub(crate) fn set_max_wait(&self, d: Duration) {
        self.max_wait.store(nanos(d), Ordering::Release);
    }

    pub(crate) fn set_standby_wait(&self, d: Duration) {
        self.standby_wait.store(nanos(d), Ordering::Release);
    }

    pub(super) fn standby_wait(&self) -> Duration {
        Duration::from_nanos(self.standby_wait.load(Ordering::Acquire))
    }

    pub(crate) fn set_max_pause(&self, d: Duration) {
        self.max_pause.store(nanos(d), Ordering::Release);
    }

    pub(super) fn max_wait(&self) -> Duration {
        Duration::from_nanos(self.max_wait.load(Ordering::Acquire))
    }

    pub(crate) fn lane_stats(&self, p: Priority) -> LaneStats {
        let lane = p.index();
        let queued = self.queued[lane].load(Ordering::Acquire);
        match &self.lanes {
            Some(lanes) => LaneStats {
                in_flight: lanes.held(lane),
                queued,
            },
            // Without lanes every call is in the default lane.
            None => LaneStats {
                in_flight: if p == Priority::default() {
                    self.in_flight.get() as usize
                } else {
                    0
                },
                queued,
            },
        }
    }

    pub(crate) fn stats(&self) -> GateStats {
        let c = self.control();
        // The debt first: with the limit fixed by the lock, it only falls (a release pays it
        // after its call left `in_flight`), so the snapshot never shows more calls in flight
        // than `limit + owed`; read the other way, a release between the two reads would.
        let owed = self.permits.owed();
        GateStats {
            limit: c.current,
            max_limit: c.ceiling,
            in_flight: self.in_flight.get() as usize,
            queued: self.queued(),
            available: self.permits.available(),
            owed,
            admitted: self.admitted.get(),
            rejected: self.rejected.load(Ordering::Relaxed),
            spilled: self.spilled.load(Ordering::Relaxed),
            max_queue: self.max_queue.load(Ordering::Relaxed),
            max_wait: self.max_wait(),
            standby_wait: self.standby_wait(),
            deadline_exceeded: self.expired.load(Ordering::Relaxed),
        }
    }
}
