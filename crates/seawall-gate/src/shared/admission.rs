//! Admission: the fast path, the bounded queue, the wait in the key's line and for a permit
//! (in the gate-wide FIFO, or in the call's priority lane), and the rejection that ends a
//! wait, or the caller's deadline that ends it first.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use seawall_core::{CallContext, Deadline, FailureClass, LlmError};
use tokio::time::{Instant, sleep_until, timeout_at};

use super::GatePermit;
use super::{LocalShared, Shared};
use crate::future::note_rejected;
use crate::error::{RejectReason, Rejection};
use crate::key::{Cost, KeyState};
use crate::lanes::{Lane, LaneWaiter, Priority};
use crate::rate::Ready;

impl Shared {
    /// The limit in force.
    pub(crate) fn current_limit(&self) -> usize {
        self.limit.load(Ordering::Acquire)
    }

    /// The lane of `req`: read (extension, then header) only when the gate has lanes.
    pub(crate) fn lane_of<R: seawall_core::LlmRequest + ?Sized>(&self, req: &mut R) -> Lane {
        match &self.lanes {
            None => Lane::NONE,
            Some(lanes) => lanes.lane(Priority::of(req)),
        }
    }

    /// Gives back a permit taken for `lane`.
    pub(super) fn release(&self, lane: Lane) {
        self.in_flight.sub(1);
        match &self.lanes {
            None => self.permits.release(),
            Some(lanes) => lanes.release(lane.index, &self.permits, self.current_limit()),
        }
    }

    /// Takes a permit at once for `lane` if one is free and nobody is queued before us.
    fn try_permit(&self, lane: Lane) -> bool {
        match &self.lanes {
            None => self.permits.try_acquire(),
            Some(lanes) => lanes.try_acquire(lane.index, &self.permits, self.current_limit()),
        }
    }

    /// Waits for a permit: in the gate-wide FIFO, or in `lane`'s queue. Cancel-safe.
    async fn permit(&self, lane: Lane) -> bool {
        let Some(lanes) = &self.lanes else {
            return self.permits.acquire().await;
        };
        /// Leaves the lane's queue (or gives back a permit granted meanwhile) when dropped
        /// before the grant was received.
        struct Waiting<'a>(&'a Shared, usize, Option<LaneWaiter>);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                if let (Some(w), Some(lanes)) = (self.2.take(), &self.0.lanes) {
                    lanes.cancel(self.1, w, &self.0.permits, self.0.current_limit());
                }
            }
        }
        let waiter = lanes.enqueue(lane.index, &self.permits, self.current_limit());
        let mut waiting = Waiting(self, lane.index, Some(waiter));
        let granted = waiting.2.as_mut().expect("set above").granted().await;
        if granted {
            waiting.2 = None;
        }
        granted
    }

    /// Counts a call failed by its caller's deadline and builds its error.
    pub(crate) fn expired(&self, deadline: &Deadline) -> LlmError {
        self.expired.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            target: "seawall::gate",
            "seawall gate: the caller's deadline passed before admission"
        );
        deadline.exceeded()
    }

    /// Admits at once if the key's line is free, the key allows the cost and a permit is free
    /// with nobody queued for it. Never waits. The permit takes the key's state; a call not
    /// admitted gets it back (its count written once per call, not twice more for a clone).
    pub(crate) fn try_admit(
        handle: &Arc<LocalShared>,
        key: Arc<KeyState>,
        cost: Cost,
        lane: Lane,
        now: Instant,
    ) -> Result<GatePermit, Arc<KeyState>> {
        if handle.try_enter(&key, cost, lane, now) {
            Ok(Shared::admit(handle, key, cost, lane))
        } else {
            Err(key)
        }
    }

    /// [`try_admit`](Self::try_admit)'s checks: on `true` a permit is taken, counted in flight,
    /// and the cost committed to the key.
    fn try_enter(&self, key: &KeyState, cost: Cost, lane: Lane, now: Instant) -> bool {
        let _line = if key.needs_line(&self.clock, now) {
            match key.lines[lane.index].try_acquire() {
                Ok(line) => Some(line),
                Err(_) => return false,
            }
        } else {
            None
        };
        if !self.try_permit(lane) {
            return false;
        }
        self.in_flight.add(1);
        if key.try_commit(&self.clock, cost, lane, now) {
            true
        } else {
            self.release(lane);
            false
        }
    }

    /// Takes a place in the queue (of `lane`: each lane has `max_queue` places), or says how
    /// deep the full queue is.
    pub(crate) fn enter_queue(self: &Arc<Self>, lane: Lane) -> Result<QueueTicket, usize> {
        let max = self.max_queue.load(Ordering::Acquire);
        match self.queued[lane.index].fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
            (q < max).then_some(q + 1)
        }) {
            Ok(_) => Ok(QueueTicket(self.clone(), lane.index)),
            Err(depth) => Err(depth),
        }
    }

    /// Builds a `GateRejected` error.
    pub(crate) fn reject(
        &self,
        reason: RejectReason,
        key: &KeyState,
        waited: Duration,
        retry_after: Option<Duration>,
    ) -> LlmError {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        if reason == RejectReason::Spilled {
            self.spilled.fetch_add(1, Ordering::Relaxed);
        }
        let depth = self.queued();
        let message = match reason {
            RejectReason::QueueFull => format!(
                "gate busy: the wait queue is full ({depth} waiting, max {}); retry later",
                self.max_queue.load(Ordering::Relaxed)
            ),
            RejectReason::WaitTimeout => format!(
                "gate busy: no permit within the max wait of {:?} ({depth} waiting); retry later",
                self.max_wait()
            ),
            RejectReason::KeyPaused => format!(
                "the upstream's rate limit paused this key for {:?}, longer than the max wait \
                 of {:?} ({depth} waiting); retry later",
                retry_after.unwrap_or_default(),
                self.max_wait()
            ),
            RejectReason::RateLimited => format!(
                "the key's rate limit admits this call only in {:?}, after the max wait of \
                 {:?} ({depth} waiting); retry later",
                retry_after.unwrap_or_default(),
                self.max_wait()
            ),
            RejectReason::ZeroRate => {
                format!("the key's rate limit is zero ({depth} waiting)")
            }
            RejectReason::Spilled => {
                let held = retry_after.map_or_else(String::new, |d| format!(" {d:?},"));
                format!(
                    "a fallback stands by, and the key's rate or pause would hold this call{held} \
                     longer than the standby wait of {:?}: sent on",
                    self.standby_wait()
                )
            }
        };
        tracing::debug!(
            target: "seawall::gate",
            reason = reason.as_str(),
            queue_depth = depth,
            key = key.name().map(|k| &**k),
            queue_wait_ms = waited.as_secs_f64() * 1e3,
            "seawall gate: rejected"
        );
        let mut err = LlmError::new(FailureClass::GateRejected, message)
            .with_source(Rejection::new(reason, depth, key.name().cloned(), waited));
        if let Some(d) = retry_after {
            err = err.with_retry_after(d);
        }
        err
    }

    /// Waits in the queue for admission: first in the key's line for its pause and rate (only
    /// when the key has either), then for a permit; all within the maximum wait, cut to the
    /// caller's deadline. A wait the deadline ends fails with `DeadlineExceeded`. With a
    /// `standby`, the key's part is cut to the standby wait too, and a call that cannot be
    /// admitted by then is spilled: the fallback above takes it, within the caller's deadline.
    ///
    /// Cancel-safe at every await: dropping it gives back the queue place, the line and the
    /// permit (a permit is taken and committed with no await in between).
    #[allow(clippy::too_many_arguments, reason = "one call site, all of it the call's facts")]
    pub(crate) async fn wait(
        self: Arc<Self>,
        key: Arc<KeyState>,
        cost: Cost,
        lane: Lane,
        start: Instant,
        deadline: Option<Deadline>,
        ticket: QueueTicket,
        cx: Option<Arc<CallContext>>,
        standby: bool,
    ) -> Result<GatePermit, LlmError> {
        let max_wait = seawall_core::instant_after(start, self.max_wait());
        // The caller's deadline bounds the wait when it comes first.
        let caller = deadline.filter(|d| d.instant() < max_wait);
        let until = caller.map_or(max_wait, |d| d.instant());
        let standby_wait = self.standby_wait();
        let spill_at = (standby && standby_wait < self.max_wait())
            .then(|| seawall_core::instant_after(start, standby_wait).min(until));
        let outcome = self.queue(&key, cost, lane, until, spill_at).await;
        // Out of the queue before reporting its depth.
        drop(ticket);
        let waited = Instant::now().saturating_duration_since(start);
        match (outcome, caller) {
            // A zero rate is no matter of time, and a spilled call goes on to the fallback,
            // which has the caller's deadline: rejected as such, deadline or not.
            (Err((reason @ (RejectReason::ZeroRate | RejectReason::Spilled), hint)), _)
            | (Err((reason, hint)), None) => {
                note_rejected(cx.as_deref(), waited);
                Err(self.reject(reason, &key, waited, hint))
            }
            (Ok(()), _) => {
                // The queued path (rare, slow) makes a handle of its own.
                let handle = Arc::new(LocalShared::new(self.clone()));
                let mut permit = Shared::admit(&handle, key, cost, lane);
                permit.wait = waited;
                Ok(permit)
            }
            (Err(_), Some(d)) => {
                if let Some(cx) = &cx {
                    cx.update(|f| *f.queue_wait.get_or_insert(Duration::ZERO) += waited);
                }
                Err(self.expired(&d))
            }
        }
    }

    /// The waiting of [`wait`](Self::wait): `Ok` once a permit is held and the key's cost
    /// committed, an error once admission by `until` is out of reach. With `spill_at`, the
    /// key's line, rate and pause must let the call go by then.
    async fn queue(
        &self,
        key: &KeyState,
        cost: Cost,
        lane: Lane,
        until: Instant,
        spill_at: Option<Instant>,
    ) -> Result<(), (RejectReason, Option<Duration>)> {
        let key_until = spill_at.unwrap_or(until);
        let spilled = |d| (RejectReason::Spilled, d);
        loop {
            let now = Instant::now();
            let line = if key.needs_line(&self.clock, now) {
                // A call that would wait past its standby wait, behind those already in the
                // line, goes to the standby at once rather than at the end of that wait.
                if spill_at.is_some() {
                    if let Ready::After(d) = key.ready_behind(&self.clock, cost, lane, now) {
                        if seawall_core::instant_after(now, d) > key_until {
                            return Err(spilled(Some(d)));
                        }
                    }
                }
                // A pause longer than the wait allows fails at once, not at the deadline.
                if let Some(left) = key.pause_left(&self.clock, now) {
                    if seawall_core::instant_after(now, left) > until {
                        return Err((RejectReason::KeyPaused, Some(left)));
                    }
                }
                let in_line = key.join_line(cost, lane);
                let Ok(Ok(line)) = timeout_at(key_until, key.lines[lane.index].acquire()).await
                else {
                    return Err(match spill_at {
                        Some(_) => spilled(None),
                        None => (RejectReason::WaitTimeout, None),
                    });
                };
                loop {
                    let now = Instant::now();
                    match key.ready(&self.clock, cost, lane, now) {
                        Ready::Now => break,
                        Ready::Never => return Err((RejectReason::ZeroRate, None)),
                        Ready::After(d) if seawall_core::instant_after(now, d) > key_until => {
                            let paused = key.pause_left(&self.clock, now).is_some_and(|p| p >= d);
                            let reason = if spill_at.is_some() {
                                RejectReason::Spilled
                            } else if paused {
                                RejectReason::KeyPaused
                            } else {
                                RejectReason::RateLimited
                            };
                            return Err((reason, Some(d)));
                        }
                        Ready::After(d) => sleep_until(seawall_core::instant_after(now, d)).await,
                    }
                }
                Some((line, in_line))
            } else {
                None
            };
            if !matches!(timeout_at(until, self.permit(lane)).await, Ok(true)) {
                return Err((RejectReason::WaitTimeout, None));
            }
            self.in_flight.add(1);
            let committed = key.try_commit(&self.clock, cost, lane, Instant::now());
            // The next in the key's line may go now.
            drop(line);
            if committed {
                return Ok(());
            }
            // Paused (or newly rate limited) while we waited for the permit: back in line.
            self.release(lane);
        }
    }
}

/// A place in the wait queue; leaving it (admitted, rejected or dropped) frees the place.
#[derive(Debug)]
pub(crate) struct QueueTicket(Arc<Shared>, usize);

impl Drop for QueueTicket {
    fn drop(&mut self) {
        self.0.queued[self.1].fetch_sub(1, Ordering::AcqRel);
    }
}
