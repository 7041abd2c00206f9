//! Priority lanes: interactive calls ahead of a batch job that shares the same gate.
//!
//! # Why
//!
//! A batch job with no gate of its own fires thousands of requests into the gate an
//! interactive service also uses. In one FIFO queue, every interactive call waits behind the
//! whole batch backlog (or is rejected at the maximum wait). Lanes give each call a
//! [`Priority`] and each lane a [`LaneShare`]; the gate then keeps room for the interactive
//! lane without leaving capacity idle when the batch job is alone.
//!
//! The rules (shares, borrowing, the order of the queue and its starvation bound, rates, the
//! queue bound) are on [`LaneShare`], where users read them.
//!
//! Why these rules: a permit held by a call in flight cannot be taken back (an LLM call
//! cannot be paused), so priority can only act on who gets the *next* permit, and on how
//! many a lower lane may hold while a higher one is about. Shares with borrowing keep the
//! batch job at full speed when alone; the linger keeps it from refilling the gaps between
//! interactive calls; the fairness count keeps it moving under constant interactive load.
//!
//! A request's lane comes from a [`Priority`] in its extensions, else from the
//! [`PRIORITY_HEADER`] (`x-seawall-priority: interactive | batch`); anything else is the
//! default lane ([`Priority::Interactive`]), never an error. A gate built without
//! [`lane`](crate::ConcurrencyGateBuilder::lane) reads neither and keeps its single FIFO.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use seawall_core::{ConfigError, LlmRequest};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::permits::Permits;

/// The header a request names its lane in: `interactive` or `batch` (case-insensitive).
/// Any other value means the default lane.
pub const PRIORITY_HEADER: &str = "x-seawall-priority";

/// How many times in a row a lower lane's eligible head is passed over before it gets the
/// next permit.
pub const LANE_FAIRNESS: u32 = 8;

/// How long a lane counts as busy after its last call ended, by default.
pub const DEFAULT_LANE_LINGER: Duration = Duration::from_secs(1);

/// The number of lanes.
pub(crate) const LANES: usize = 2;

/// A call's lane in the gate. Insert it into the request's extensions, or send the
/// [`PRIORITY_HEADER`]; the extension wins.
///
/// ```
/// use seawall_gate::Priority;
/// assert_eq!(Priority::parse(" Batch "), Some(Priority::Batch));
/// assert_eq!(Priority::parse("urgent"), None);
/// assert_eq!(Priority::default(), Priority::Interactive);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// A person or a latency-bound service waits for it: served first. The default.
    #[default]
    Interactive,
    /// Bulk work that can wait: served after interactive calls, within its share.
    Batch,
}

impl Priority {
    /// Every lane, highest first.
    pub const ALL: [Priority; LANES] = [Priority::Interactive, Priority::Batch];

    /// The name the header uses.
    pub const fn as_str(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Batch => "batch",
        }
    }

    /// Reads a header value (trimmed, any case); `None` for anything else.
    pub fn parse(value: &str) -> Option<Priority> {
        let value = value.trim();
        Priority::ALL
            .into_iter()
            .find(|p| value.eq_ignore_ascii_case(p.as_str()))
    }

    /// The lane of `req`: its extension, else its header, else the default.
    pub(crate) fn of<R: LlmRequest + ?Sized>(req: &mut R) -> Priority {
        if let Some(p) = req.extensions().and_then(|e| e.get::<Priority>()) {
            return *p;
        }
        req.headers_mut()
            .and_then(|h| h.get(PRIORITY_HEADER))
            .and_then(|v| v.to_str().ok())
            .and_then(Priority::parse)
            .unwrap_or_default()
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

/// What a lane may use while another lane is busy: a fraction of the permits and a fraction of
/// each key's RPM/TPM burst, each in `(0, 1]`.
///
/// # The rules of the lanes
///
/// - **Shares.** A lane's permit share is `ceil(share.permits × limit)` permits (at least one).
///   While any *other* lane is busy, a lane at its share takes no more permits. A lane is
///   busy while it holds a permit, has a call waiting, or gave its last permit back less than
///   the *linger* ago (default [`DEFAULT_LANE_LINGER`], 1 s): interactive traffic comes in
///   bursts with gaps, and without the linger the batch lane would refill every gap and the
///   next interactive call would wait for a batch call to end.
/// - **Borrowing.** While every other lane is idle, a lane may use every permit. Permits are
///   never taken back from a call in flight; a lane that borrowed gives capacity back as its
///   calls end, and it is the first to wait: it takes no new permit beyond its share while
///   another lane is busy. (Whether a lane is idle is looked at when a call arrives, a permit
///   comes back or the limit changes, so borrowing resumes at the first of those after the
///   linger ends.)
/// - **Order.** A freed permit goes to the head of the highest lane that may take it (within
///   its share, or borrowing). Starvation bound: once a lower lane's head may take a permit,
///   it is passed over at most [`LANE_FAIRNESS`] (8) times in a row; the next permit is its.
///   A lane is FIFO within itself, so its `n`-th waiter is served within `n × 9` grants of its
///   lane becoming eligible, and a lane over its share becomes eligible as soon as one of its
///   own calls ends.
/// - **Rates.** Each lane may take a key's RPM/TPM buckets down to `(1 − share.rate)` of their
///   size and no further: the rest of the burst stays for the other lanes. The bucket still
///   refills at the key's full rate, so a lane alone gets the whole rate over time (borrowing),
///   but a higher lane arriving finds the reserve there. A cost larger than what the lane may
///   take still goes once the bucket is full (never refused forever).
/// - **Queue bound.** Each lane has its own `max_queue` places, so a batch backlog never fills
///   the interactive lane's queue.
///
/// ```
/// use seawall_gate::{ConcurrencyGateLayer, LaneShare, Priority};
/// let gate = ConcurrencyGateLayer::builder()
///     .limit(8)
///     .lane(Priority::Batch, LaneShare { permits: 0.5, rate: 0.5 })
///     .build()?;
/// # let _ = gate;
/// // Shares outside (0, 1] are refused.
/// let bad = LaneShare { permits: 0.0, rate: 1.0 };
/// assert!(ConcurrencyGateLayer::builder().lane(Priority::Batch, bad).build().is_err());
/// # Ok::<(), seawall_gate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LaneShare {
    /// The fraction of the concurrency limit the lane may hold while another lane is busy.
    pub permits: f64,
    /// The fraction of a key's request and token bursts the lane may take.
    pub rate: f64,
}

impl LaneShare {
    /// Everything: the lane is never held back (the default of every lane).
    pub const FULL: LaneShare = LaneShare {
        permits: 1.0,
        rate: 1.0,
    };

    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let ok = |f: f64| f > 0.0 && f <= 1.0;
        if ok(self.permits) && ok(self.rate) {
            Ok(())
        } else {
            Err(ConfigError::new(
                "lane",
                format!(
                    "a lane's shares must be in (0, 1], got permits {} and rate {}",
                    self.permits, self.rate
                ),
            ))
        }
    }
}

impl Default for LaneShare {
    fn default() -> Self {
        LaneShare::FULL
    }
}

/// A point-in-time view of one lane, from
/// [`GateHandle::lane_stats`](crate::GateHandle::lane_stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaneStats {
    /// The lane's calls holding a permit.
    pub in_flight: usize,
    /// The lane's calls waiting (for the key's rate or pause, or for a permit).
    pub queued: usize,
}

/// A call's lane as the gate uses it: the index, and the fraction of a key's buckets it must
/// leave in them. `Lane::NONE` for gates without lanes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Lane {
    pub(crate) index: usize,
    pub(crate) keep: f64,
}

impl Lane {
    pub(crate) const NONE: Lane = Lane {
        index: 0,
        keep: 0.0,
    };
}

/// The lanes of a gate: their shares, and who holds and waits in each.
///
/// Every permit of a gate with lanes is taken and given back under this one mutex (the pool's
/// semaphore then never has waiters of its own, so its free count is the truth), which keeps
/// the per-lane counts exact: `held` sums to the permits in use by lane calls.
#[derive(Debug)]
pub(crate) struct Lanes {
    shares: [LaneShare; LANES],
    linger: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    held: [usize; LANES],
    /// Live waiters per lane (cancelled ones are subtracted at once, and skipped in `queues`).
    waiting: [usize; LANES],
    queues: [VecDeque<oneshot::Sender<()>>; LANES],
    /// When each lane last gave a permit back.
    released: [Option<Instant>; LANES],
    /// Consecutive grants to higher lanes while this lane's head could have taken a permit.
    passed_over: [u32; LANES],
}

/// A place in a lane's queue: resolves when a permit is granted to it.
#[derive(Debug)]
pub(crate) struct LaneWaiter(oneshot::Receiver<()>);

impl Lanes {
    pub(crate) fn new(shares: [LaneShare; LANES], linger: Duration) -> Self {
        Lanes {
            shares,
            linger,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lane of a priority.
    pub(crate) fn lane(&self, p: Priority) -> Lane {
        Lane {
            index: p.index(),
            keep: 1.0 - self.shares[p.index()].rate,
        }
    }

    /// A lane's permit share under `limit`.
    fn share(&self, lane: usize, limit: usize) -> usize {
        ((self.shares[lane].permits * limit as f64).ceil() as usize).max(1)
    }

    fn idle(&self, s: &State, lane: usize, now: Instant) -> bool {
        s.held[lane] == 0
            && s.waiting[lane] == 0
            && s.released[lane].is_none_or(|t| now.saturating_duration_since(t) >= self.linger)
    }

    /// Whether `lane` may take one more permit: within its share, or every other lane idle.
    fn may_take(&self, s: &State, lane: usize, limit: usize, now: Instant) -> bool {
        s.held[lane] < self.share(lane, limit)
            || (0..LANES).all(|o| o == lane || self.idle(s, o, now))
    }

    /// Hands free permits to waiting heads, highest eligible lane first, except that a lower
    /// lane passed over [`LANE_FAIRNESS`] times goes next.
    fn dispatch_locked(&self, s: &mut State, permits: &Permits, limit: usize, now: Instant) {
        loop {
            let mut eligible = [false; LANES];
            for (lane, e) in eligible.iter_mut().enumerate() {
                // Cancelled waiters left their sender behind; they are skipped here.
                while s.queues[lane].front().is_some_and(|tx| tx.is_closed()) {
                    s.queues[lane].pop_front();
                }
                *e = !s.queues[lane].is_empty() && self.may_take(s, lane, limit, now);
            }
            let Some(first) = eligible.iter().position(|&e| e) else {
                return;
            };
            let pick = (first + 1..LANES)
                .rev()
                .find(|&l| eligible[l] && s.passed_over[l] >= LANE_FAIRNESS)
                .unwrap_or(first);
            if !permits.try_acquire() {
                return;
            }
            let tx = s.queues[pick].pop_front().expect("an eligible lane has a head");
            if tx.send(()).is_err() {
                // Not reachable while cancellation takes the lock (see `cancel`); kept safe.
                permits.release();
                continue;
            }
            s.waiting[pick] -= 1;
            s.held[pick] += 1;
            s.passed_over[pick] = 0;
            for (lane, passed) in s.passed_over.iter_mut().enumerate().skip(pick + 1) {
                if eligible[lane] {
                    *passed += 1;
                }
            }
        }
    }

    /// Takes a permit at once if nobody of this lane or a higher one waits, the lane may take
    /// one, and one is free (after any waiting lower-lane head that may take one got it).
    pub(crate) fn try_acquire(&self, lane: usize, permits: &Permits, limit: usize) -> bool {
        let now = Instant::now();
        let mut s = self.lock();
        if s.waiting[..=lane].iter().any(|&w| w > 0) {
            return false;
        }
        self.dispatch_locked(&mut s, permits, limit, now);
        if !self.may_take(&s, lane, limit, now) || !permits.try_acquire() {
            return false;
        }
        s.held[lane] += 1;
        true
    }

    /// Joins the back of `lane`'s queue; the permit may be granted before this returns.
    pub(crate) fn enqueue(&self, lane: usize, permits: &Permits, limit: usize) -> LaneWaiter {
        let (tx, rx) = oneshot::channel();
        let mut s = self.lock();
        s.queues[lane].push_back(tx);
        s.waiting[lane] += 1;
        self.dispatch_locked(&mut s, permits, limit, Instant::now());
        LaneWaiter(rx)
    }

    /// Gives back a permit `lane` held, and hands out what is free.
    pub(crate) fn release(&self, lane: usize, permits: &Permits, limit: usize) {
        let now = Instant::now();
        let mut s = self.lock();
        s.held[lane] -= 1;
        s.released[lane] = Some(now);
        permits.release();
        self.dispatch_locked(&mut s, permits, limit, now);
    }

    /// Hands out what is free (after the limit grew).
    pub(crate) fn dispatch(&self, permits: &Permits, limit: usize) {
        let mut s = self.lock();
        self.dispatch_locked(&mut s, permits, limit, Instant::now());
    }

    /// A waiter gave up: leaves the queue, or gives back the permit granted meanwhile.
    pub(crate) fn cancel(
        &self,
        lane: usize,
        mut waiter: LaneWaiter,
        permits: &Permits,
        limit: usize,
    ) {
        let mut s = self.lock();
        // Under the lock no grant can race the close: either it was sent before, and is
        // received here, or the closed sender is skipped by the next dispatch.
        waiter.0.close();
        if waiter.0.try_recv().is_ok() {
            s.held[lane] -= 1;
            permits.release();
        } else {
            s.waiting[lane] -= 1;
        }
        // Either way another lane may now take what is free: this one may have gone idle.
        self.dispatch_locked(&mut s, permits, limit, Instant::now());
    }

    /// Permits held by `lane`'s calls.
    pub(crate) fn held(&self, lane: usize) -> usize {
        self.lock().held[lane]
    }
}

impl LaneWaiter {
    /// Waits for the grant. `false` only if the gate is gone.
    pub(crate) async fn granted(&mut self) -> bool {
        (&mut self.0).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn http(header: Option<&'static str>) -> http::Request<bytes::Bytes> {
        let mut b = http::Request::post("https://api.openai.com/v1/chat/completions");
        if let Some(v) = header {
            b = b.header(PRIORITY_HEADER, v);
        }
        b.body(bytes::Bytes::new()).unwrap()
    }

    #[test]
    fn the_header_names_the_lane_and_anything_else_is_the_default() {
        assert_eq!(Priority::of(&mut http(Some("batch"))), Priority::Batch);
        assert_eq!(Priority::of(&mut http(Some(" BATCH "))), Priority::Batch);
        assert_eq!(
            Priority::of(&mut http(Some("interactive"))),
            Priority::Interactive
        );
        for unknown in [Some("urgent"), Some(""), Some("batch, interactive"), None] {
            assert_eq!(
                Priority::of(&mut http(unknown)),
                Priority::Interactive,
                "{unknown:?}"
            );
        }
        let mut bytes = http(None);
        bytes.headers_mut().insert(
            PRIORITY_HEADER,
            http::HeaderValue::from_bytes(b"b\xffatch").unwrap(),
        );
        assert_eq!(Priority::of(&mut bytes), Priority::Interactive);
        // The extension wins over the header.
        let mut both = http(Some("batch"));
        both.extensions_mut().insert(Priority::Interactive);
        assert_eq!(Priority::of(&mut both), Priority::Interactive);
    }

    #[test]
    fn shares_outside_zero_to_one_are_refused() {
        for (p, r) in [(0.0, 1.0), (1.0, 0.0), (1.5, 1.0), (f64::NAN, 1.0), (0.5, -1.0)] {
            let err = LaneShare {
                permits: p,
                rate: r,
            }
            .check()
            .unwrap_err();
            assert_eq!(err.field(), "lane");
        }
        assert!(LaneShare::FULL.check().is_ok());
        assert!(LaneShare { permits: 0.01, rate: 1.0 }.check().is_ok());
    }

    #[derive(Debug, Clone)]
    enum Op {
        TryAcquire(usize),
        Enqueue(usize),
        Cancel(usize),
        Release(usize),
        Resize(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..LANES).prop_map(Op::TryAcquire),
            (0..LANES).prop_map(Op::Enqueue),
            (0usize..64).prop_map(Op::Cancel),
            (0usize..64).prop_map(Op::Release),
            (0usize..6).prop_map(Op::Resize),
        ]
    }

    proptest! {
        /// Whatever the order of arrivals, grants, cancellations (before or after a grant),
        /// releases and resizes: the permits in use never exceed the limit (plus what a shrink
        /// still owes), the lanes' counts match the calls that hold and wait, and once every
        /// call is gone every permit is back.
        #[test]
        fn permits_in_use_never_exceed_the_limit_and_all_come_back(
            batch in 0.1f64..=1.0,
            start in 0usize..6,
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let lanes = Lanes::new([LaneShare::FULL, LaneShare { permits: batch, rate: 1.0 }], Duration::ZERO);
            let permits = Permits::new(start);
            let mut limit = start;
            let mut held: Vec<usize> = Vec::new();
            let mut waiters: Vec<(usize, LaneWaiter)> = Vec::new();
            for op in ops {
                match op {
                    Op::TryAcquire(l) => {
                        if lanes.try_acquire(l, &permits, limit) {
                            held.push(l);
                        }
                    }
                    Op::Enqueue(l) => waiters.push((l, lanes.enqueue(l, &permits, limit))),
                    Op::Cancel(i) if !waiters.is_empty() => {
                        let (l, w) = waiters.remove(i % waiters.len());
                        lanes.cancel(l, w, &permits, limit);
                    }
                    Op::Release(i) if !held.is_empty() => {
                        let l = held.remove(i % held.len());
                        lanes.release(l, &permits, limit);
                    }
                    Op::Resize(n) => {
                        permits.resize(limit, n);
                        limit = n;
                        lanes.dispatch(&permits, limit);
                    }
                    Op::Cancel(_) | Op::Release(_) => {}
                }
                // Collect the grants (a granted waiter now holds its permit).
                waiters.retain_mut(|(l, w)| match w.0.try_recv() {
                    Ok(()) => { held.push(*l); false }
                    Err(_) => true,
                });
                let s = lanes.lock();
                for lane in 0..LANES {
                    prop_assert_eq!(s.held[lane], held.iter().filter(|&&l| l == lane).count());
                    prop_assert_eq!(s.waiting[lane], waiters.iter().filter(|(l, _)| *l == lane).count());
                }
                drop(s);
                prop_assert!(held.len() <= limit + permits.owed(), "{} held, limit {}", held.len(), limit);
                prop_assert_eq!(permits.available() + held.len() - permits.owed(), limit);
                // Nobody waits while a permit is free and their lane may take it.
                if permits.available() > 0 {
                    let (h, w) = { let s = lanes.lock(); (s.held, s.waiting) };
                    for lane in 0..LANES {
                        prop_assert!(w[lane] == 0 || h[lane] >= lanes.share(lane, limit) && (0..LANES).any(|o| o != lane && (h[o] > 0 || w[o] > 0)),
                            "lane {} waits with {} free", lane, permits.available());
                    }
                }
            }
            for (l, w) in waiters.drain(..) {
                lanes.cancel(l, w, &permits, limit);
            }
            for l in held.drain(..) {
                lanes.release(l, &permits, limit);
            }
            let s = lanes.lock();
            prop_assert_eq!(s.held, [0; LANES]);
            prop_assert_eq!(s.waiting, [0; LANES]);
            drop(s);
            prop_assert_eq!(permits.owed(), 0);
            prop_assert_eq!(permits.available(), limit);
        }
    }
}
