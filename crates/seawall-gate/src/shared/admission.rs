//! Admission: the fast path, the bounded queue, the wait in the key's line and for a permit,
//! and the rejection that ends a wait.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use seawall_core::{CallContext, FailureClass, LlmError};
use tokio::time::{Instant, sleep_until, timeout_at};

use super::GatePermit;
use super::Shared;
use crate::future::note_rejected;
use crate::error::{RejectReason, Rejection};
use crate::key::{Cost, KeyState};
use crate::rate::Ready;

impl Shared {
    pub(super) fn release(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.permits.release();
    }

    /// Admits at once if the key's line is free, the key allows the cost and a permit is free
    /// with nobody queued for it. Never waits.
    pub(crate) fn try_admit(
        self: &Arc<Self>,
        key: &Arc<KeyState>,
        cost: Cost,
        now: Instant,
    ) -> Option<GatePermit> {
        let _line = if key.needs_line(&self.clock, now) {
            Some(key.line.try_acquire().ok()?)
        } else {
            None
        };
        if !self.permits.try_acquire() {
            return None;
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        if key.try_commit(&self.clock, cost, now) {
            Some(self.admit(key.clone(), cost))
        } else {
            self.release();
            None
        }
    }

    /// Takes a place in the queue, or says how deep the full queue is.
    pub(crate) fn enter_queue(self: &Arc<Self>) -> Result<QueueTicket, usize> {
        let max = self.max_queue.load(Ordering::Acquire);
        match self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < max).then_some(q + 1)
            }) {
            Ok(_) => Ok(QueueTicket(self.clone())),
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
        let depth = self.queued.load(Ordering::Acquire);
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
    /// when the key has either), then for a permit; all within the maximum wait.
    ///
    /// Cancel-safe at every await: dropping it gives back the queue place, the line and the
    /// permit (a permit is taken and committed with no await in between).
    pub(crate) async fn wait(
        self: Arc<Self>,
        key: Arc<KeyState>,
        cost: Cost,
        start: Instant,
        ticket: QueueTicket,
        cx: Option<Arc<CallContext>>,
    ) -> Result<GatePermit, LlmError> {
        let outcome = self.queue(&key, cost, start).await;
        // Out of the queue before reporting its depth.
        drop(ticket);
        let waited = Instant::now().saturating_duration_since(start);
        match outcome {
            Ok(()) => {
                let mut permit = self.admit(key, cost);
                permit.wait = waited;
                Ok(permit)
            }
            Err((reason, hint)) => {
                note_rejected(cx.as_deref(), waited);
                Err(self.reject(reason, &key, waited, hint))
            }
        }
    }

    /// The waiting of [`wait`](Self::wait): `Ok` once a permit is held and the key's cost
    /// committed.
    async fn queue(
        &self,
        key: &KeyState,
        cost: Cost,
        start: Instant,
    ) -> Result<(), (RejectReason, Option<Duration>)> {
        let deadline = seawall_core::instant_after(start, self.max_wait());
        loop {
            let now = Instant::now();
            let line = if key.needs_line(&self.clock, now) {
                // A pause longer than the wait allows fails at once, not at the deadline.
                if let Some(left) = key.pause_left(&self.clock, now) {
                    if seawall_core::instant_after(now, left) > deadline {
                        return Err((RejectReason::KeyPaused, Some(left)));
                    }
                }
                let Ok(Ok(line)) = timeout_at(deadline, key.line.acquire()).await else {
                    return Err((RejectReason::WaitTimeout, None));
                };
                loop {
                    let now = Instant::now();
                    match key.ready(&self.clock, cost, now) {
                        Ready::Now => break,
                        Ready::Never => return Err((RejectReason::ZeroRate, None)),
                        Ready::After(d) if seawall_core::instant_after(now, d) > deadline => {
                            let paused = key.pause_left(&self.clock, now).is_some_and(|p| p >= d);
                            let reason = if paused {
                                RejectReason::KeyPaused
                            } else {
                                RejectReason::RateLimited
                            };
                            return Err((reason, Some(d)));
                        }
                        Ready::After(d) => sleep_until(seawall_core::instant_after(now, d)).await,
                    }
                }
                Some(line)
            } else {
                None
            };
            if !matches!(timeout_at(deadline, self.permits.acquire()).await, Ok(true)) {
                return Err((RejectReason::WaitTimeout, None));
            }
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            let committed = key.try_commit(&self.clock, cost, Instant::now());
            // The next in the key's line may go now.
            drop(line);
            if committed {
                return Ok(());
            }
            // Paused (or newly rate limited) while we waited for the permit: back in line.
            self.release();
        }
    }
}

/// A place in the wait queue; leaving it (admitted, rejected or dropped) frees the place.
#[derive(Debug)]
pub(crate) struct QueueTicket(Arc<Shared>);

impl Drop for QueueTicket {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}
