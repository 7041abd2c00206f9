//! The state every service made by one layer shares, and how it is built.
//!
//! What the gate does with that state lives in one submodule per job: runtime control, the
//! adaptive mode, the upstream's rate-limit signals, admission, and the permit a call holds.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use seawall_core::PartEstimate;

use crate::adaptive::Adaptive;
use crate::autosize::{AutoSize, Sizer};
use crate::key::{Clock, Keys};
use crate::lanes::{LANES, LaneShare, Lanes};
use crate::permits::Permits;
use crate::rate::Rates;
use crate::striped::Striped;

mod adapt;
mod admission;
mod autosize;
mod control;
mod permit;
mod signals;

pub use permit::GatePermit;
pub use signals::pause_hint;

/// The gate's state as one thread's services and permits hold it.
///
/// Every admitted call's permit keeps the gate's state until the call's response ends.
/// Cloned from the layer's one `Arc` for each call, that would write its count, a cache line
/// every thread calling through the gate writes, twice per call; the services of one thread
/// share a handle of their own instead, made once per thread. (The permits themselves, the
/// semaphore, are shared by nature: a limit for the whole process.)
pub(crate) type LocalShared = seawall_core::ThreadBound<Shared>;

/// The settings a gate starts with.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) limit: usize,
    pub(crate) max_queue: usize,
    pub(crate) max_wait: Duration,
    pub(crate) standby_wait: Duration,
    pub(crate) max_pause: Duration,
    pub(crate) rates: Rates,
    pub(crate) key_rates: Vec<(Arc<str>, Rates)>,
    pub(crate) adaptive: Option<Adaptive>,
    pub(crate) autosize: Option<AutoSize>,
    pub(crate) max_keys: usize,
    pub(crate) parts: PartEstimate,
    /// Each lane's share, when lanes were configured.
    pub(crate) lanes: Option<[LaneShare; LANES]>,
    pub(crate) lane_linger: Duration,
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
    standby_wait: AtomicU64,
    max_pause: AtomicU64,
    /// Waiting calls per lane (lane 0 alone without lanes).
    queued: [AtomicUsize; LANES],
    /// Calls holding a permit; striped, as every call adds and removes one.
    in_flight: Striped,
    /// Striped, as every call adds one.
    admitted: Striped,
    rejected: AtomicU64,
    spilled: AtomicU64,
    expired: AtomicU64,
    /// The priority lanes, when configured.
    pub(crate) lanes: Option<Lanes>,
    pub(crate) keys: Keys,
    pub(crate) clock: Clock,
    /// Tokens counted per image, audio part and file.
    pub(crate) parts: PartEstimate,
    /// The auto-sizing mode, when on.
    sizer: Option<Sizer>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("limit", &self.limit.load(Ordering::Relaxed))
            .field("in_flight", &self.in_flight.get())
            .field("queued", &self.queued())
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
    /// Calls rejected since the gate was built (the spilled ones included).
    pub rejected: u64,
    /// Calls refused at once because a fallback target stood by for them and their key's rate
    /// or pause would have held them longer than the standby wait ([`RejectReason::Spilled`](crate::RejectReason::Spilled)).
    pub spilled: u64,
    /// The queue bound.
    pub max_queue: usize,
    /// The maximum wait.
    pub max_wait: Duration,
    /// The longest wait for a key's rate or pause of a call a fallback target stands by for.
    pub standby_wait: Duration,
    /// Calls failed with `DeadlineExceeded` because the caller's deadline passed (or would
    /// have) before admission.
    pub deadline_exceeded: u64,
}

impl Shared {
    pub(crate) fn new(s: Settings) -> Self {
        let limit = s.limit.min(Permits::MAX);
        let limit = s.autosize.map_or(limit, |a| a.bound(limit));
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
            standby_wait: AtomicU64::new(nanos(s.standby_wait)),
            max_pause: AtomicU64::new(nanos(s.max_pause)),
            queued: Default::default(),
            in_flight: Striped::default(),
            admitted: Striped::default(),
            rejected: AtomicU64::new(0),
            spilled: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            lanes: s.lanes.map(|shares| Lanes::new(shares, s.lane_linger)),
            keys: Keys::new(s.rates, s.key_rates, s.max_keys),
            clock: Clock::new(),
            parts: s.parts,
            sizer: s.autosize.map(Sizer::new),
        }
    }

    /// Waiting calls, every lane.
    pub(crate) fn queued(&self) -> usize {
        self.queued.iter().map(|q| q.load(Ordering::Acquire)).sum()
    }

    fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }
}
