//! The state every service made by one layer shares, and the admission logic.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use seawall_core::{
    Completion, FailureClass, LlmError, LlmResponse, OnComplete, Outcome, PartEstimate,
    RateLimitSnapshot,
};
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::adaptive::Adaptive;
use crate::error::{RejectReason, Rejection};
use crate::key::{Clock, Cost, KeyState, Keys};
use crate::permits::Permits;
use crate::rate::{Rates, Ready};

/// The settings a gate starts with.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) limit: usize,
    pub(crate) max_queue: usize,
    pub(crate) max_wait: Duration,
    pub(crate) max_pause: Duration,
    pub(crate) rates: Rates,
    pub(crate) key_rates: Vec<(Arc<str>, Rates)>,
    pub(crate) adaptive: Option<Adaptive>,
    pub(crate) max_keys: usize,
    pub(crate) parts: PartEstimate,
}

#[derive(Debug)]
struct Control {
    /// The configured limit; the adaptive mode moves below it.
    ceiling: usize,
    /// The limit in force.
    current: usize,
    adaptive: Option<Adaptive>,
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

pub(crate) struct Shared {
    permits: Permits,
    control: Mutex<Control>,
    /// `control.current`, readable without the lock.
    limit: AtomicUsize,
    adaptive_on: AtomicBool,
    /// Bumped by every decrease (and explicit resize): signals from older calls are stale.
    epoch: AtomicU64,
    successes: AtomicUsize,
    max_queue: AtomicUsize,
    max_wait: AtomicU64,
    max_pause: AtomicU64,
    queued: AtomicUsize,
    in_flight: AtomicUsize,
    admitted: AtomicU64,
    rejected: AtomicU64,
    pub(crate) keys: Keys,
    pub(crate) clock: Clock,
    /// Tokens counted per image, audio part and file.
    pub(crate) parts: PartEstimate,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("limit", &self.limit.load(Ordering::Relaxed))
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .field("queued", &self.queued.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A point-in-time view of a gate, from [`GateHandle::stats`](crate::GateHandle::stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GateStats {
    /// The concurrency limit in force (below `max_limit` while the adaptive mode has cut it).
    pub limit: usize,
    /// The configured concurrency limit.
    pub max_limit: usize,
    /// Calls holding a permit (admitted, body not yet finished).
    pub in_flight: usize,
    /// Calls waiting in the queue.
    pub queued: usize,
    /// Permits free right now.
    pub available: usize,
    /// Permits still to be withdrawn after a shrink, as calls in flight finish.
    pub owed: usize,
    /// Calls admitted since the gate was built.
    pub admitted: u64,
    /// Calls rejected since the gate was built.
    pub rejected: u64,
    /// The queue bound.
    pub max_queue: usize,
    /// The maximum wait.
    pub max_wait: Duration,
}

impl Shared {
    pub(crate) fn new(s: Settings) -> Self {
        let limit = s.limit.min(Permits::MAX);
        Shared {
            permits: Permits::new(limit),
            control: Mutex::new(Control {
                ceiling: limit,
                current: limit,
                adaptive: s.adaptive,
            }),
            limit: AtomicUsize::new(limit),
            adaptive_on: AtomicBool::new(s.adaptive.is_some()),
            epoch: AtomicU64::new(0),
            successes: AtomicUsize::new(0),
            max_queue: AtomicUsize::new(s.max_queue),
            max_wait: AtomicU64::new(nanos(s.max_wait)),
            max_pause: AtomicU64::new(nanos(s.max_pause)),
            queued: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            admitted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            keys: Keys::new(s.rates, s.key_rates, s.max_keys),
            clock: Clock::new(),
            parts: s.parts,
        }
    }

    fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ----- runtime control -------------------------------------------------------------------

    fn apply(&self, c: &mut Control, new: usize) {
        self.permits.resize(c.current, new);
        c.current = new;
        self.limit.store(new, Ordering::Release);
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

    pub(crate) fn set_max_pause(&self, d: Duration) {
        self.max_pause.store(nanos(d), Ordering::Release);
    }

    fn max_wait(&self) -> Duration {
        Duration::from_nanos(self.max_wait.load(Ordering::Acquire))
    }

    pub(crate) fn stats(&self) -> GateStats {
        let c = self.control();
        GateStats {
            limit: c.current,
            max_limit: c.ceiling,
            in_flight: self.in_flight.load(Ordering::Acquire),
            queued: self.queued.load(Ordering::Acquire),
            available: self.permits.available(),
            owed: self.permits.owed(),
            admitted: self.admitted.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            max_queue: self.max_queue.load(Ordering::Relaxed),
            max_wait: self.max_wait(),
        }
    }

    // ----- adaptive mode ---------------------------------------------------------------------

    /// The upstream pushed back (429 or overload) on a call admitted at `epoch`.
    fn congestion(&self, epoch: u64) {
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

    fn success(&self) {
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

    // ----- upstream signals ------------------------------------------------------------------

    fn pause(&self, key: &KeyState, d: Duration) {
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

    // ----- admission -------------------------------------------------------------------------

    fn admit(self: &Arc<Self>, key: Arc<KeyState>, cost: Cost) -> GatePermit {
        self.admitted.fetch_add(1, Ordering::Relaxed);
        GatePermit {
            held: Some(Held {
                shared: self.clone(),
                key,
                cost,
                epoch: self.epoch.load(Ordering::Acquire),
            }),
        }
    }

    fn release(&self) {
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
    ) -> Result<GatePermit, LlmError> {
        let outcome = self.queue(&key, cost, start).await;
        // Out of the queue before reporting its depth.
        drop(ticket);
        match outcome {
            Ok(()) => Ok(self.admit(key, cost)),
            Err((reason, hint)) => {
                let waited = Instant::now().saturating_duration_since(start);
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

struct Held {
    shared: Arc<Shared>,
    key: Arc<KeyState>,
    cost: Cost,
    epoch: u64,
}

impl Held {
    fn failed(&self, err: &LlmError) {
        let hint = match err.class() {
            FailureClass::RateLimited => err.retry_hint(),
            _ => err
                .rate_limit()
                .and_then(RateLimitSnapshot::exhausted_until),
        };
        if let Some(d) = hint {
            self.shared.pause(&self.key, d);
        }
        if matches!(
            err.class(),
            FailureClass::RateLimited | FailureClass::Overloaded
        ) {
            self.shared.congestion(self.epoch);
        }
    }
}

/// A gate permit, held by a response until its body ends or is dropped.
///
/// It is the [`OnComplete`] hook the gate attaches to every response: when it fires (or is
/// dropped) it gives the permit back, settles the token reservation against the reported usage,
/// and feeds the adaptive mode. It appears in the gate's response type
/// (`<S::Response as LlmResponse>::Hooked<GatePermit>`).
pub struct GatePermit {
    held: Option<Held>,
}

impl fmt::Debug for GatePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatePermit")
            .field("held", &self.held.is_some())
            .field("key", &self.held.as_ref().and_then(|h| h.key.name()))
            .finish()
    }
}

impl GatePermit {
    fn finish(&mut self, f: impl FnOnce(&Held)) {
        if let Some(h) = self.held.take() {
            f(&h);
            h.shared.release();
        }
    }

    /// Reads a response head: a `remaining = 0` snapshot pauses the key until its reset.
    pub(crate) fn saw_head<T: LlmResponse>(&self, resp: &T) {
        if let Some(h) = &self.held {
            if let Some(d) = resp
                .rate_limit()
                .and_then(RateLimitSnapshot::exhausted_until)
            {
                h.shared.pause(&h.key, d);
            }
        }
    }

    /// The inner service failed: the output tokens were never produced.
    pub(crate) fn failed(mut self, err: &LlmError) {
        self.finish(|h| {
            h.settle(None);
            h.failed(err);
        });
    }
}

impl Held {
    /// Settles the token reservation against the reported usage. Without usage (a call
    /// dropped before its head, a body dropped or ended without a usage report) the output
    /// part goes back and the input estimate stays charged, as for a failure: keeping a
    /// `max_tokens` of billions charged would lock the key for good after one disconnect.
    fn settle(&self, usage: Option<seawall_core::Usage>) {
        let used = usage.map_or(self.cost.input, |u| u.total());
        self.key
            .settle_tokens(self.cost.tokens, used, Instant::now());
    }
}

impl OnComplete for GatePermit {
    fn on_complete(mut self, c: Completion<'_>) {
        self.finish(|h| {
            h.settle(c.usage);
            match c.outcome {
                Outcome::Complete => h.shared.success(),
                Outcome::Failed(Some(e)) => h.failed(e),
                Outcome::Failed(None) | Outcome::Dropped => {}
            }
        });
    }
}

impl Drop for GatePermit {
    // `finish` takes what the permit holds, so after the body-end hook this does nothing. A
    // permit dropped unfired (the future or the body dropped) still goes back to the pool, and
    // its tokens settle as if only the prompt was used.
    fn drop(&mut self) {
        self.finish(|h| h.settle(None));
    }
}
