//! Where the counters live: the [`BudgetStore`] trait and the in-process [`MemoryStore`].
//!
//! The layer decides *what* to reserve and settle; a store keeps the numbers. Keeping them
//! behind a trait lets several processes share one budget (`seawall-redis` has a store on
//! Redis) without touching the layer. The trait is shaped so that a remote store can wait on
//! I/O while the in-process one stays a plain function call: `reserve` answers
//! [`Admission::Ready`] or [`Admission::Pending`] with a future, `settle` answers
//! [`Settled::Ready`] or [`Settled::Pending`], and only the pending forms allocate.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use seawall_core::bound_key;

use crate::budget::{Budget, Window};
use crate::keys::{DEFAULT_MAX_KEYS, KeyTable, OVERFLOW_KEY};
use crate::money::Usd;
use crate::time::Timestamp;

/// One attempt's claim on every budget it falls under.
///
/// `lines` pairs each budget with the key the attempt is counted under (`None` for a global
/// budget). The same charge (same budgets, keys, amount and id, a later `now`: see
/// [`Charge::at`]) is passed to [`BudgetStore::settle`].
#[derive(Debug, Clone, Copy)]
pub struct Charge<'a> {
    budgets: &'a [Budget],
    keys: &'a [Option<Arc<str>>],
    amount: Usd,
    now: Timestamp,
    id: u64,
    /// The layer's number for `budgets` (0: none), which a lease compares instead of the
    /// budgets themselves (see [`Lease::serves`]).
    list: u64,
}

pub(crate) use crate::local::next_id;

impl<'a> Charge<'a> {
    /// A charge of `amount` on `budgets`, where `keys[i]` is the key for `budgets[i]`. An
    /// empty `keys` means no budget is keyed. It gets an id no other charge of this process
    /// has (see [`Charge::id`]).
    pub fn new(
        budgets: &'a [Budget],
        keys: &'a [Option<Arc<str>>],
        amount: Usd,
        now: Timestamp,
    ) -> Self {
        Charge::with_known_id(budgets, keys, amount, now, next_id())
    }

    /// The same charge, its budgets known by the number `list` their layer gave them: no
    /// other list of this process has it.
    pub(crate) fn of_list(mut self, list: u64) -> Self {
        self.list = list;
        self
    }

    /// A charge that keeps the id of an earlier one (the guard's reservation).
    pub(crate) fn with_known_id(
        budgets: &'a [Budget],
        keys: &'a [Option<Arc<str>>],
        amount: Usd,
        now: Timestamp,
        id: u64,
    ) -> Self {
        Charge {
            budgets,
            keys,
            amount,
            now,
            id,
            list: 0,
        }
    }

    /// The same charge with the id `id`: a settlement carries the id of its reservation.
    pub fn with_id(mut self, id: u64) -> Self {
        self.id = id;
        self
    }

    /// The same charge (same id) at another time: what a settlement passes.
    pub fn at(mut self, now: Timestamp) -> Self {
        self.now = now;
        self
    }

    /// Each budget with its key.
    pub fn lines(&self) -> impl Iterator<Item = (&'a Budget, Option<&'a Arc<str>>)> + 'a {
        let keys = self.keys;
        self.budgets
            .iter()
            .enumerate()
            .map(move |(i, b)| (b, keys.get(i).and_then(Option::as_ref)))
    }

    /// The amount reserved (the estimate).
    pub fn amount(&self) -> Usd {
        self.amount
    }

    /// When (UTC, on the layer's clock).
    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// The attempt's id, unique within this process (a remote store adds the replica's name
    /// to make it unique in the fleet). A store that can see a request twice (a reservation
    /// retried after a timeout, a settlement repeated) uses it to apply each once.
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// A counter's state: settled spend in the current window, and outstanding reservations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spend {
    /// Settled spend in the current window.
    pub spent: Usd,
    /// Reservations of attempts still in flight.
    pub reserved: Usd,
    /// The budget's limit.
    pub limit: Usd,
}

impl Spend {
    /// `spent + reserved`: what an admission is checked against.
    pub fn committed(&self) -> Usd {
        self.spent.saturating_add(self.reserved)
    }

    /// What is left to reserve.
    pub fn remaining(&self) -> Usd {
        self.limit.saturating_sub(self.committed())
    }
}

/// A reservation refused because it would cross a budget's limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// The budget that refused.
    pub budget: Arc<str>,
    /// The key it was counted under, for a keyed budget.
    pub key: Option<Arc<str>>,
    /// The counter before this attempt.
    pub spend: Spend,
    /// What the attempt asked to reserve.
    pub requested: Usd,
}

/// A store that could not decide: its shared state did not answer in time.
///
/// The layer refuses the attempt with an [`LlmError`](seawall_core::LlmError) of class
/// `SharedStateUnavailable` (fail closed): nothing is spent that the fleet could not count.
/// A store that prefers to fail open decides on local state instead and never returns this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUnavailable {
    /// Why, for the error message (never a credential or a URL).
    pub reason: String,
}

impl fmt::Display for StoreUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the budget store is unavailable ({})", self.reason)
    }
}

impl std::error::Error for StoreUnavailable {}

/// Why a store refused a reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A budget would be crossed (the layer answers `BudgetExceeded`).
    Exceeded(Exceeded),
    /// The store could not decide (the layer answers `SharedStateUnavailable`).
    Unavailable(StoreUnavailable),
}

impl From<Exceeded> for Refusal {
    fn from(e: Exceeded) -> Self {
        Refusal::Exceeded(e)
    }
}

impl From<StoreUnavailable> for Refusal {
    fn from(e: StoreUnavailable) -> Self {
        Refusal::Unavailable(e)
    }
}

/// A counter whose settled spend reached its budget's soft threshold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoftLimitCrossed {
    /// The budget.
    pub budget: Arc<str>,
    /// The key, for a keyed budget.
    pub key: Option<Arc<str>>,
    /// Settled spend in the window, now.
    pub spent: Usd,
    /// The threshold that was reached.
    pub threshold: Usd,
    /// The hard limit.
    pub limit: Usd,
}

/// A reservation still being decided by a remote store.
pub type AdmissionFuture = Pin<Box<dyn Future<Output = Result<(), Refusal>> + Send + 'static>>;

/// The soft thresholds a settlement crossed, once a remote store has applied it.
pub type SettleFuture = Pin<Box<dyn Future<Output = Vec<SoftLimitCrossed>> + Send + 'static>>;

/// A counter read from a store's source of truth.
pub type SpendFuture =
    Pin<Box<dyn Future<Output = Result<Spend, StoreUnavailable>> + Send + 'static>>;

/// A store's answer to a reservation.
pub enum Admission {
    /// Decided at once (the in-memory store always is).
    Ready(Result<(), Refusal>),
    /// Decided later. The layer calls the inner service only once it resolves `Ok`. If the
    /// caller drops the call before that, the future is dropped: the store must not keep a
    /// reservation it made for it (for example, it queues a release of the charge's id).
    Pending(AdmissionFuture),
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Admission::Ready(r) => f.debug_tuple("Ready").field(r).finish(),
            Admission::Pending(_) => f.write_str("Pending(..)"),
        }
    }
}

/// A store's answer to a settlement.
pub enum Settled {
    /// Applied at once, with the soft thresholds it crossed.
    Ready(Vec<SoftLimitCrossed>),
    /// Queued: the store applies it whether or not the future is polled (dropping the future
    /// only loses the report), and the future yields the thresholds it crossed once applied.
    Pending(SettleFuture),
}

impl Settled {
    /// Waits for the settlement to be applied and returns the thresholds it crossed.
    pub async fn crossed(self) -> Vec<SoftLimitCrossed> {
        match self {
            Settled::Ready(c) => c,
            Settled::Pending(f) => f.await,
        }
    }
}

impl fmt::Debug for Settled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Settled::Ready(c) => f.debug_tuple("Ready").field(c).finish(),
            Settled::Pending(_) => f.write_str("Pending(..)"),
        }
    }
}

/// The counters behind a budget layer.
///
/// Contract, for every line of a charge (budget, key):
/// - `reserve` admits only if, for **every** line, settled spend in the window plus
///   outstanding reservations plus the charge's amount stays within the budget's limit, and
///   then adds the amount to every line's reservations, atomically: all lines or none, and no
///   concurrent admission may see a partial state that lets it through. A store that can see
///   the same reservation twice applies it once per [`Charge::id`].
/// - `settle` removes the charge's amount from the reservations and adds `cost` (which may be
///   more or less than the amount, or zero for a release) to the settled spend of the window
///   that holds `charge.now()`. It must not block: a remote store queues it and answers
///   [`Settled::Pending`]. It reports the soft thresholds this settlement crossed, each at
///   most once per window and key.
/// - Windows are the budget's [`Window`]; reservations are not windowed (a reservation made
///   before a calendar boundary still counts after it until settled). A remote store may
///   also expire a reservation that was never settled (a lease), so a replica that dies
///   holding one does not hold it forever.
/// - `spend` answers at once from what the store knows: for the in-process store the exact
///   counter; for a remote store what it last saw (it cannot wait on I/O here). `read` is
///   the exact figure, which may take a round trip.
pub trait BudgetStore: Send + Sync + 'static {
    /// Reserves `charge.amount()` on every line, or refuses with the first line that would
    /// cross its limit (or because the store cannot decide).
    fn reserve(&self, charge: &Charge<'_>) -> Admission;

    /// Replaces the charge's reservation by its final `cost`.
    fn settle(&self, charge: &Charge<'_>, cost: Usd) -> Settled;

    /// The counter of `budget` for `key` at `now` (zero spend if it was never used), as the
    /// store knows it without waiting.
    fn spend(&self, budget: &Budget, key: Option<&str>, now: Timestamp) -> Spend;

    /// The counter of `budget` for `key` at `now`, read from the store's source of truth.
    /// The default answers [`BudgetStore::spend`] at once.
    fn read(&self, budget: &Budget, key: Option<&str>, now: Timestamp) -> SpendFuture {
        Box::pin(std::future::ready(Ok(self.spend(budget, key, now))))
    }
}

impl<T: BudgetStore + ?Sized> BudgetStore for Arc<T> {
    fn reserve(&self, charge: &Charge<'_>) -> Admission {
        (**self).reserve(charge)
    }

    fn settle(&self, charge: &Charge<'_>, cost: Usd) -> Settled {
        (**self).settle(charge, cost)
    }

    fn spend(&self, budget: &Budget, key: Option<&str>, now: Timestamp) -> Spend {
        (**self).spend(budget, key, now)
    }

    fn read(&self, budget: &Budget, key: Option<&str>, now: Timestamp) -> SpendFuture {
        (**self).read(budget, key, now)
    }
}

const RING: usize = Window::ROLLING_BUCKETS as usize + 1;

/// The in-process store: every counter behind one short mutex, which a thread's calls skip
/// while it holds a lease (below).
///
/// An admission touches several counters (a total, a monthly and a per-tenant budget, say)
/// and must take from all or none, with calendar resets and rolling sub-windows on the way.
/// Lock-free counters cannot do that without races or rollbacks visible to other callers, so
/// the whole check-and-reserve runs under one lock held for one hash lookup per keyed budget
/// and no allocation (except the first time a key is seen). Keyed counters that hold nothing
/// (no reservation and no spend in their window) are pruned when the map grows, so memory
/// follows the number of active keys; counters of [`Window::Total`] budgets keep their spend
/// forever. Each budget keeps at most [`with_max_keys`](Self::with_max_keys) keyed counters;
/// beyond, new keys share an overflow counter (see [`OVERFLOW_KEY`](crate::OVERFLOW_KEY)).
///
/// Budgets are found by name with a short linear scan, so a store is meant for the handful
/// of budgets of a few layers. Share one store between layers by passing the same
/// `Arc<MemoryStore>` to each builder.
///
/// # Leases: no lock every thread takes on every call
///
/// That lock, taken twice per attempt (to reserve and to settle) by every thread, would make
/// the store the one cache line all calls take turns owning. So a thread's stripe of the
/// store (one of a few, each on its own cache line) holds *leases*: headroom reserved
/// centrally, under the lock, on every counter of one list of budgets and keys. While its
/// lease lasts, a thread reserves from the headroom and settles into it without the central
/// lock: the headroom is already counted as reserved, so a reservation taken from it cannot
/// cross a limit, and a settled cost stays counted (as reserved) until the lease is given
/// back. Nothing is approximate:
///
/// - a reservation the central counters would refuse is decided again after every lease has
///   been given back, so an attempt is refused exactly when spend plus reservations plus its
///   amount would cross a limit, as without leases;
/// - leases are granted only while every soft threshold of their counters is out of reach of
///   what is committed, and given back before anything takes a counter to it, so a settlement
///   that crosses a soft threshold is always applied centrally and reported with the exact
///   spend;
/// - a lease lasts until the first window boundary (calendar period or rolling sub-window) of
///   its counters, and is given back before any counter moves past it;
/// - [`spend`](BudgetStore::spend) gives every lease back first, so it reads exact counters.
#[derive(Debug)]
pub struct MemoryStore {
    budgets: Mutex<Central>,
    max_keys: usize,
    stripes: Box<[Stripe]>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::with_max_keys(DEFAULT_MAX_KEYS)
    }
}

/// The counters, and what is known of the leases out.
#[derive(Debug, Default)]
struct Central {
    counters: Vec<Counters>,
    /// Whether any stripe may hold a lease.
    leased: bool,
    /// The earliest end of a lease out (Unix nanoseconds): a central operation at or after it
    /// takes every lease back before it moves a window.
    leases_end: u64,
}

/// Stripes of a store; a thread uses the one its number picks.
const STRIPES: usize = 8;
/// Leases a stripe holds at most (the oldest is given back for a new one).
const LEASES: usize = 4;
/// A lease's headroom is at most this many times the reservation that asked for it...
const LEASE_CALLS: u64 = 64;
/// ...and at most this fraction (1/n) of what its tightest counter has left.
const LEASE_SHARE: u64 = 4 * STRIPES as u64;

/// One thread's (or a few threads') leases, on a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(Mutex<Vec<Lease>>);

/// Headroom reserved centrally on every counter of one list of budgets and keys.
#[derive(Debug)]
struct Lease {
    budgets: Box<[Budget]>,
    /// The number of the layer's list these budgets are (0: none).
    list: u64,
    keys: Box<[Option<Arc<str>>]>,
    /// Counted as reserved on every counter, not reserved by any attempt.
    free: u64,
    /// Settled here, counted as reserved on every counter until the lease is given back.
    pending: u64,
    /// When the lease was granted and when it ends (Unix nanoseconds).
    granted: Timestamp,
    end: u64,
}

impl Lease {
    /// Whether this lease is on the counters `charge` is. Budgets numbered by one layer are
    /// that layer's, compared by their number (the usual case, every call); others are
    /// compared one by one.
    fn serves(&self, charge: &Charge<'_>) -> bool {
        let same = (self.list != 0 && self.list == charge.list)
            || (self.budgets.len() == charge.budgets.len()
                && self
                    .budgets
                    .iter()
                    .zip(charge.budgets)
                    .all(|(a, b)| a.same_as(b)));
        same && *self.keys == *charge.keys
    }
}

thread_local! {
    /// This thread's stripe, handed out in turn.
    static STRIPE: usize = {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % STRIPES
    };
}

fn this_stripe() -> usize {
    STRIPE.try_with(|s| *s).unwrap_or(0)
}

#[derive(Debug)]
struct Counters {
    name: Arc<str>,
    global: Counter,
    by_key: KeyTable<Counter>,
}

#[derive(Debug, Default)]
struct Counter {
    reserved: u64,
    /// Settled spend in the current window (the ring's sum for rolling windows).
    settled: u64,
    /// When the calendar period `settled` belongs to ends (Unix nanoseconds).
    period_end: u64,
    ring: Option<Box<Ring>>,
    soft_fired: bool,
}

#[derive(Debug)]
struct Ring {
    buckets: [u64; RING],
    /// The absolute index of the newest sub-window.
    head: u64,
}

impl Counter {
    /// Brings the window up to `now`: a new calendar period starts empty, expired rolling
    /// sub-windows are dropped.
    fn roll(&mut self, budget: &Budget, now: Timestamp) {
        let window = budget.window();
        match window {
            Window::Total => {}
            Window::Calendar(_) => {
                if now.as_unix_nanos() >= self.period_end {
                    self.period_end = window
                        .period_end(now)
                        .map_or(u64::MAX, Timestamp::as_unix_nanos);
                    self.settled = 0;
                    self.soft_fired = false;
                }
            }
            Window::Rolling(_) => {
                let b = window.bucket_index(now);
                let ring = self.ring.get_or_insert_with(|| {
                    Box::new(Ring {
                        buckets: [0; RING],
                        head: b,
                    })
                });
                if b > ring.head {
                    let steps = (b - ring.head).min(RING as u64);
                    for i in 1..=steps {
                        let slot = ((ring.head + i) % RING as u64) as usize;
                        self.settled = self.settled.saturating_sub(ring.buckets[slot]);
                        ring.buckets[slot] = 0;
                    }
                    ring.head = b;
                }
                if budget
                    .soft_limit()
                    .is_some_and(|s| self.settled < s.as_nanos())
                {
                    self.soft_fired = false;
                }
            }
        }
    }

    fn add_spend(&mut self, cost: u64) {
        self.settled = self.settled.saturating_add(cost);
        if let Some(ring) = &mut self.ring {
            let slot = (ring.head % RING as u64) as usize;
            ring.buckets[slot] = ring.buckets[slot].saturating_add(cost);
        }
    }

    fn spend(&self, budget: &Budget) -> Spend {
        Spend {
            spent: Usd::from_nanos(self.settled),
            reserved: Usd::from_nanos(self.reserved),
            limit: budget.limit(),
        }
    }

    /// When the window the counter is in ends (Unix nanoseconds; `u64::MAX`: never): the
    /// first time it will roll.
    fn window_end(&self, budget: &Budget) -> u64 {
        let window = budget.window();
        match window {
            Window::Total => u64::MAX,
            Window::Calendar(_) => self.period_end,
            Window::Rolling(_) => self.ring.as_ref().map_or(0, |r| {
                r.head
                    .saturating_add(1)
                    .saturating_mul(window.bucket_nanos())
            }),
        }
    }

    fn is_idle(&self) -> bool {
        self.reserved == 0 && self.settled == 0
    }
}

impl Counters {
    fn new(name: Arc<str>, max_keys: usize) -> Self {
        Counters {
            name,
            global: Counter::default(),
            by_key: KeyTable::new(max_keys),
        }
    }

    /// Runs `f` on the counter of `key` (the global one for `None`), brought up to `now`.
    fn with<R>(
        &mut self,
        budget: &Budget,
        key: Option<&Arc<str>>,
        now: Timestamp,
        f: impl FnOnce(&mut Counter) -> R,
    ) -> R {
        let Some(key) = key else {
            self.global.roll(budget, now);
            return f(&mut self.global);
        };
        let c = self.by_key.entry_shared(
            key,
            now.as_unix_nanos(),
            |overflow| overflow.reserved > 0,
            |c| {
                c.roll(budget, now);
                c.is_idle()
            },
        );
        c.roll(budget, now);
        f(c)
    }
}

impl MemoryStore {
    /// An empty store that keeps up to [`DEFAULT_MAX_KEYS`](crate::DEFAULT_MAX_KEYS) keyed
    /// counters per budget.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store that keeps up to `max_keys` keyed counters per budget (at least one).
    /// Keys beyond share one overflow counter per budget, checked against the budget's
    /// per-key limit.
    pub fn with_max_keys(max_keys: usize) -> Self {
        MemoryStore {
            budgets: Mutex::default(),
            max_keys: max_keys.max(1),
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Central> {
        // The counters are plain integers; a panic elsewhere cannot leave them torn.
        self.budgets.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stripe(&self, i: usize) -> MutexGuard<'_, Vec<Lease>> {
        self.stripes[i % STRIPES]
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The number of keyed counters held (for tests and memory checks).
    pub fn keyed_counters(&self) -> usize {
        self.lock().counters.iter().map(|c| c.by_key.len()).sum()
    }

    /// Gives every lease back: their headroom is no longer reserved, their settled costs are
    /// spend. Lock order: the central lock, then a stripe's.
    fn drain(&self, central: &mut Central) {
        if !central.leased {
            return;
        }
        for i in 0..STRIPES {
            let leases = std::mem::take(&mut *self.stripe(i));
            for lease in &leases {
                self.give_back_lease(central, lease);
            }
        }
        central.leased = false;
        central.leases_end = u64::MAX;
    }

    fn give_back_lease(&self, central: &mut Central, lease: &Lease) {
        let lines = Charge::with_known_id(&lease.budgets, &lease.keys, Usd::ZERO, lease.granted, 0);
        self.give_back(central, &lines, lease.free, lease.pending);
    }

    /// Takes `free + pending` off the reservations of every counter of `lines` and adds
    /// `pending` to their spend, at the grant's time `lines.now()`: no window has moved past
    /// the lease (it would have been given back first), so this rolls nothing and the cost
    /// lands in the window it was settled in.
    fn give_back(&self, central: &mut Central, lines: &Charge<'_>, free: u64, pending: u64) {
        let held = free.saturating_add(pending);
        if held == 0 {
            return;
        }
        for (i, (budget, key)) in lines.lines().enumerate() {
            counters(&mut central.counters, i, budget, self.max_keys).with(
                budget,
                key,
                lines.now(),
                |c| {
                    c.reserved = c.reserved.saturating_sub(held);
                    c.add_spend(pending);
                },
            );
        }
    }

    /// Reserves `charge` from this thread's lease, if it has one that serves it.
    fn reserve_leased(&self, stripe: usize, charge: &Charge<'_>) -> bool {
        let amount = charge.amount().as_nanos();
        let now = charge.now().as_unix_nanos();
        let mut leases = self.stripe(stripe);
        match leases.iter_mut().find(|l| l.serves(charge)) {
            Some(l) if now < l.end && l.free >= amount => {
                l.free -= amount;
                true
            }
            _ => false,
        }
    }

    /// Settles `charge` into this thread's lease, if it has one that serves it and the cost
    /// fits in its headroom plus the charge's reservation.
    fn settle_leased(&self, stripe: usize, charge: &Charge<'_>, cost: u64) -> bool {
        let now = charge.now().as_unix_nanos();
        let mut leases = self.stripe(stripe);
        let Some(l) = leases.iter_mut().find(|l| l.serves(charge)) else {
            return false;
        };
        let room = l.free.saturating_add(charge.amount().as_nanos());
        if now >= l.end || room < cost {
            return false;
        }
        l.free = room - cost;
        l.pending = l.pending.saturating_add(cost);
        true
    }

    /// After a central admission of `charge`: grants this thread's stripe a lease on the
    /// charge's counters, when every counter has room to spare below its limit and soft
    /// threshold and none is an overflow counter.
    fn grant(&self, central: &mut Central, stripe: usize, charge: &Charge<'_>) {
        let amount = charge.amount().as_nanos();
        let now = charge.now();
        let mut size = amount.saturating_mul(LEASE_CALLS);
        let mut end = u64::MAX;
        for (i, (budget, key)) in charge.lines().enumerate() {
            let counters = counters(&mut central.counters, i, budget, self.max_keys);
            let counter = match key {
                None => Some(&mut counters.global),
                Some(k) => counters.by_key.get_mut(k),
            };
            let Some(c) = counter else {
                return; // counted on the overflow counter: no lease
            };
            let committed = c.settled.saturating_add(c.reserved);
            let ceiling = match budget.soft_limit() {
                Some(soft) => budget
                    .limit()
                    .as_nanos()
                    .min(soft.as_nanos().saturating_sub(1)),
                None => budget.limit().as_nanos(),
            };
            size = size.min(ceiling.saturating_sub(committed) / LEASE_SHARE);
            end = end.min(c.window_end(budget));
        }
        if size == 0 || now.as_unix_nanos() >= end {
            return;
        }
        for (i, (budget, key)) in charge.lines().enumerate() {
            counters(&mut central.counters, i, budget, self.max_keys).with(budget, key, now, |c| {
                c.reserved = c.reserved.saturating_add(size);
            });
        }
        let mut leases = self.stripe(stripe);
        if let Some(l) = leases.iter_mut().find(|l| l.serves(charge)) {
            // A lease past its end, or one that ran dry: renewed in place, what it held given
            // back.
            let (free, pending, granted) = (l.free, l.pending, l.granted);
            (l.free, l.pending, l.granted, l.end) = (size, 0, now, end);
            drop(leases);
            let charge = charge.at(granted);
            self.give_back(central, &charge, free, pending);
        } else {
            let evicted = (leases.len() >= LEASES).then(|| leases.remove(0));
            leases.push(Lease {
                budgets: charge.budgets.into(),
                list: charge.list,
                keys: charge.keys.into(),
                free: size,
                pending: 0,
                granted: now,
                end,
            });
            drop(leases);
            if let Some(old) = evicted {
                self.give_back_lease(central, &old);
            }
        }
        central.leases_end = if central.leased {
            central.leases_end.min(end)
        } else {
            end
        };
        central.leased = true;
    }
}

/// The counters of `budget`, the `line`-th budget of a charge. A store that serves one layer
/// keeps them in that layer's order, so the list is looked at that index first.
fn counters<'m>(
    list: &'m mut Vec<Counters>,
    line: usize,
    budget: &Budget,
    max_keys: usize,
) -> &'m mut Counters {
    let name = budget.name_arc();
    let at_line = list.get(line).is_some_and(|c| Arc::ptr_eq(&c.name, name));
    let found = if at_line {
        Some(line)
    } else {
        list.iter()
            .position(|c| Arc::ptr_eq(&c.name, name) || c.name == *name)
    };
    let i = match found {
        Some(i) => i,
        None => {
            list.push(Counters::new(name.clone(), max_keys));
            list.len() - 1
        }
    };
    &mut list[i]
}

impl BudgetStore for MemoryStore {
    fn reserve(&self, charge: &Charge<'_>) -> Admission {
        self.reserve_on(this_stripe(), charge)
    }

    fn settle(&self, charge: &Charge<'_>, cost: Usd) -> Settled {
        self.settle_on(this_stripe(), charge, cost)
    }

    fn spend(&self, budget: &Budget, key: Option<&str>, now: Timestamp) -> Spend {
        let mut central = self.lock();
        self.drain(&mut central);
        let list = &mut central.counters;
        let Some(counters) = list.iter_mut().find(|c| c.name == *budget.name_arc()) else {
            return Spend {
                limit: budget.limit(),
                ..Spend::default()
            };
        };
        let counter = match key {
            None => Some(&mut counters.global),
            Some(k) => counters.by_key.get_mut(k),
        };
        match counter {
            Some(c) => {
                c.roll(budget, now);
                c.spend(budget)
            }
            None => Spend {
                limit: budget.limit(),
                ..Spend::default()
            },
        }
    }
}

impl MemoryStore {
    /// [`BudgetStore::reserve`] from stripe `stripe` (a thread's; tests pick them).
    fn reserve_on(&self, stripe: usize, charge: &Charge<'_>) -> Admission {
        if charge.budgets.is_empty() {
            return Admission::Ready(Ok(()));
        }
        if self.reserve_leased(stripe, charge) {
            return Admission::Ready(Ok(()));
        }
        let mut central = self.lock();
        if central.leased && charge.now().as_unix_nanos() >= central.leases_end {
            self.drain(&mut central);
        }
        let mut result = self.reserve_central(&mut central.counters, charge);
        if result.is_err() && central.leased {
            // Refused with headroom out on leases: decide again on the exact counters.
            self.drain(&mut central);
            result = self.reserve_central(&mut central.counters, charge);
        }
        if result.is_ok() {
            if central.leased && self.near_soft(&mut central.counters, charge, 0) {
                // What is committed reached a soft threshold: from now on every settlement on
                // it is applied centrally, to report the crossing with the exact spend.
                self.drain(&mut central);
            }
            self.grant(&mut central, stripe, charge);
        }
        Admission::Ready(result.map_err(Refusal::Exceeded))
    }

    /// [`BudgetStore::settle`] from stripe `stripe`.
    fn settle_on(&self, stripe: usize, charge: &Charge<'_>, cost: Usd) -> Settled {
        if charge.budgets.is_empty() {
            return Settled::Ready(Vec::new());
        }
        if self.settle_leased(stripe, charge, cost.as_nanos()) {
            return Settled::Ready(Vec::new());
        }
        let mut central = self.lock();
        let now = charge.now().as_unix_nanos();
        let over = cost.as_nanos().saturating_sub(charge.amount().as_nanos());
        if central.leased
            && (now >= central.leases_end || self.near_soft(&mut central.counters, charge, over))
        {
            self.drain(&mut central);
        }
        Settled::Ready(self.settle_central(&mut central.counters, charge, cost))
    }

    /// Whether, with `more` committed, some counter of `charge` would reach its soft
    /// threshold.
    fn near_soft(&self, list: &mut Vec<Counters>, charge: &Charge<'_>, more: u64) -> bool {
        charge.lines().enumerate().any(|(i, (budget, key))| {
            let Some(soft) = budget.soft_limit() else {
                return false;
            };
            let counters = counters(list, i, budget, self.max_keys);
            let counter = match key {
                None => Some(&counters.global),
                Some(k) => counters.by_key.get_mut(k).map(|c| &*c),
            };
            counter.is_some_and(|c| {
                c.settled.saturating_add(c.reserved).saturating_add(more) >= soft.as_nanos()
            })
        })
    }

    /// The admission on the counters themselves, as the contract states it.
    fn reserve_central(
        &self,
        list: &mut Vec<Counters>,
        charge: &Charge<'_>,
    ) -> Result<(), Exceeded> {
        let amount = charge.amount().as_nanos();
        let now = charge.now();
        for (i, (budget, key)) in charge.lines().enumerate() {
            let refused = counters(list, i, budget, self.max_keys).with(budget, key, now, |c| {
                let after = c.settled.saturating_add(c.reserved).saturating_add(amount);
                if after > budget.limit().as_nanos() {
                    return Some(c.spend(budget));
                }
                c.reserved = c.reserved.saturating_add(amount);
                None
            });
            if let Some(spend) = refused {
                // Named as counted: bounded, or as the overflow counter.
                let key = key.map(|k| {
                    let table = &mut counters(list, i, budget, self.max_keys).by_key;
                    match (table.get_mut(k).is_some(), bound_key(k)) {
                        (false, _) => Arc::from(OVERFLOW_KEY),
                        (true, Cow::Borrowed(_)) => k.clone(),
                        (true, Cow::Owned(bounded)) => Arc::from(bounded),
                    }
                });
                for (j, (budget, key)) in charge.lines().take(i).enumerate() {
                    counters(list, j, budget, self.max_keys).with(budget, key, now, |c| {
                        c.reserved = c.reserved.saturating_sub(amount);
                    });
                }
                return Err(Exceeded {
                    budget: budget.name_arc().clone(),
                    key,
                    spend,
                    requested: charge.amount(),
                });
            }
        }
        Ok(())
    }

    /// The settlement on the counters themselves; the soft thresholds it crossed.
    fn settle_central(
        &self,
        list: &mut Vec<Counters>,
        charge: &Charge<'_>,
        cost: Usd,
    ) -> Vec<SoftLimitCrossed> {
        let mut crossed = Vec::new();
        let now = charge.now();
        for (i, (budget, key)) in charge.lines().enumerate() {
            let fired = counters(list, i, budget, self.max_keys).with(budget, key, now, |c| {
                c.reserved = c.reserved.saturating_sub(charge.amount().as_nanos());
                c.add_spend(cost.as_nanos());
                let threshold = budget.soft_limit()?;
                if c.soft_fired || c.settled < threshold.as_nanos() {
                    return None;
                }
                c.soft_fired = true;
                Some((Usd::from_nanos(c.settled), threshold))
            });
            if let Some((spent, threshold)) = fired {
                crossed.push(SoftLimitCrossed {
                    budget: budget.name_arc().clone(),
                    key: key.cloned(),
                    spent,
                    threshold,
                    limit: budget.limit(),
                });
            }
        }
        crossed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Scope;
    use std::time::Duration;

    const SEC: u64 = 1_000_000_000;

    fn ok(a: Admission) -> Result<(), Exceeded> {
        match a {
            Admission::Ready(Ok(())) => Ok(()),
            Admission::Ready(Err(Refusal::Exceeded(e))) => Err(e),
            other => panic!("the memory store decides at once, on budgets only: {other:?}"),
        }
    }

    fn crossed(s: Settled) -> Vec<SoftLimitCrossed> {
        match s {
            Settled::Ready(c) => c,
            Settled::Pending(_) => panic!("the memory store settles at once"),
        }
    }

    #[test]
    fn all_or_nothing_across_budgets() {
        let budgets = [
            Budget::total("total", Usd::from_nanos(100)),
            Budget::total("tenant", Usd::from_nanos(30)).per_key("tenant"),
        ];
        let store = MemoryStore::new();
        let a: [Option<Arc<str>>; 2] = [None, Some("a".into())];
        let b: [Option<Arc<str>>; 2] = [None, Some("b".into())];
        let t = Timestamp::from_unix_secs(1);
        assert!(ok(store.reserve(&Charge::new(&budgets, &a, Usd::from_nanos(20), t))).is_ok());
        let refused =
            ok(store.reserve(&Charge::new(&budgets, &a, Usd::from_nanos(20), t))).unwrap_err();
        assert_eq!(&*refused.budget, "tenant");
        assert_eq!(refused.spend.reserved, Usd::from_nanos(20));
        // The refused charge left nothing behind on the total.
        assert_eq!(
            store.spend(&budgets[0], None, t).reserved,
            Usd::from_nanos(20)
        );
        // Another tenant is unaffected, until the total runs out.
        for _ in 0..4 {
            let r = store.reserve(&Charge::new(&budgets, &b, Usd::from_nanos(7), t));
            assert!(ok(r).is_ok());
        }
        assert_eq!(
            store.spend(&budgets[0], None, t).committed(),
            Usd::from_nanos(48)
        );
        store.settle(
            &Charge::new(&budgets, &a, Usd::from_nanos(20), t),
            Usd::from_nanos(5),
        );
        let s = store.spend(&budgets[1], Some("a"), t);
        assert_eq!((s.spent, s.reserved), (Usd::from_nanos(5), Usd::ZERO));
        assert_eq!(store.keyed_counters(), 2);
    }

    #[test]
    fn calendar_resets_settled_but_keeps_reservations() {
        let hourly = [Budget::hourly("h", Usd::from_nanos(10))];
        let store = MemoryStore::new();
        let t0 = Timestamp::from_unix_secs(3600 * 5 + 10);
        let held = Charge::new(&hourly, &[], Usd::from_nanos(4), t0);
        assert!(ok(store.reserve(&held)).is_ok());
        store.settle(
            &Charge::new(&hourly, &[], Usd::ZERO, t0),
            Usd::from_nanos(6),
        );
        let t1 = Timestamp::from_unix_secs(3600 * 6);
        let s = store.spend(&hourly[0], None, t1);
        assert_eq!((s.spent, s.reserved), (Usd::ZERO, Usd::from_nanos(4)));
        store.settle(
            &Charge::new(&hourly, &[], Usd::from_nanos(4), t1),
            Usd::from_nanos(4),
        );
        assert_eq!(store.spend(&hourly[0], None, t1).spent, Usd::from_nanos(4));
    }

    #[test]
    fn rolling_soft_limit_rearms_once_spend_falls_below_it() {
        let b = [
            Budget::rolling("r", Usd::from_nanos(100), Duration::from_secs(60))
                .soft_limit_percent(50),
        ];
        let store = MemoryStore::new();
        let settle = |secs: u64, cost: u64| {
            let c = Charge::new(&b, &[], Usd::ZERO, Timestamp::from_unix_secs(secs));
            crossed(store.settle(&c, Usd::from_nanos(cost))).len()
        };
        assert_eq!(settle(1_000, 60), 1);
        assert_eq!(settle(1_001, 10), 0, "already fired in this window");
        // A minute and a sub-window later both have left the window.
        assert_eq!(settle(1_062, 10), 0);
        assert_eq!(settle(1_063, 45), 1, "fires again after falling below");
    }

    #[test]
    fn idle_keys_are_pruned() {
        use crate::keys::MIN_PRUNE_AT;
        let b = [Budget::rolling("r", Usd::from_dollars(1), Duration::from_secs(60)).per_key("k")];
        let store = MemoryStore::new();
        for i in 0..MIN_PRUNE_AT + 10 {
            let t = Timestamp::from_unix_secs(i as u64);
            let keys = [Some(Arc::<str>::from(i.to_string()))];
            let c = Charge::new(&b, &keys, Usd::from_nanos(1), t);
            assert!(ok(store.reserve(&c)).is_ok());
            store.settle(&c, Usd::from_nanos(1));
        }
        // Only keys that spent in the last minute (and a bit) survive the prune.
        assert!(store.keyed_counters() < 200, "{}", store.keyed_counters());
    }

    /// A naive model of a rolling window: every settled (time, cost) kept; the window at `now`
    /// sums those at most `d` old. The ring must count at least that (never under-count) and
    /// nothing older than `d` plus one sub-window.
    fn naive(events: &[(u64, u64)], now: u64, span: u64) -> u64 {
        events
            .iter()
            .filter(|(t, _)| now.saturating_sub(*t) <= span)
            .map(|(_, c)| c)
            .sum()
    }

    /// A naive model of the store's counters: (spent, reserved, soft fired) per counter.
    #[derive(Default, Clone, Copy)]
    struct Naive {
        spent: u64,
        reserved: u64,
        fired: bool,
    }

    #[test]
    fn a_lease_is_given_back_before_a_calendar_window_rolls() {
        let hourly = [Budget::hourly("h", Usd::from_nanos(1_000_000))];
        let store = MemoryStore::new();
        let t0 = Timestamp::from_unix_secs(3600 * 5 + 10);
        let c = Charge::new(&hourly, &[], Usd::from_nanos(100), t0);
        assert!(ok(store.reserve_on(0, &c)).is_ok());
        assert!(store.lock().leased, "a lease was granted");
        // Settled into the lease, in the hour it happened.
        assert!(crossed(store.settle_on(0, &c, Usd::from_nanos(60))).is_empty());
        let t1 = Timestamp::from_unix_secs(3600 * 6 + 1);
        // The lease ends with the hour: this reservation goes to the counters, which give
        // the lease back (its 60 to the old hour) before the new hour starts from zero.
        let c1 = Charge::new(&hourly, &[], Usd::from_nanos(100), t1);
        assert!(ok(store.reserve_on(0, &c1)).is_ok());
        let s = store.spend(&hourly[0], None, t1);
        assert_eq!((s.spent, s.reserved), (Usd::ZERO, Usd::from_nanos(100)));
    }

    #[test]
    fn soft_crossings_are_reported_with_the_exact_spend_while_leases_are_out() {
        let b = [Budget::total("t", Usd::from_nanos(1_000_000)).soft_limit_percent(50)];
        let t = Timestamp::from_unix_secs(1);
        let charge = |n| Charge::new(&b, &[], Usd::from_nanos(n), t);
        let spent =
            |c: Vec<SoftLimitCrossed>| c.iter().map(|c| c.spent.as_nanos()).collect::<Vec<_>>();

        // A reservation elsewhere takes what is committed to the threshold: the lease of
        // stripe 0 is given back, so the settlements there (which its headroom would have
        // taken) are applied centrally and the one that crosses is reported.
        let store = MemoryStore::new();
        let small = charge(1_000);
        assert!(ok(store.reserve_on(0, &small)).is_ok());
        let big = charge(490_000);
        assert!(ok(store.reserve_on(1, &big)).is_ok());
        assert!(crossed(store.settle_on(0, &big, Usd::from_nanos(490_000))).is_empty());
        let fired = spent(crossed(store.settle_on(0, &small, Usd::from_nanos(10_000))));
        assert_eq!(fired, [500_000]);

        // A settlement over its estimate elsewhere crosses: what stripe 0 settled into its
        // lease counts first.
        let store = MemoryStore::new();
        let first = charge(1_000);
        assert!(ok(store.reserve_on(0, &first)).is_ok());
        assert!(crossed(store.settle_on(0, &first, Usd::from_nanos(400))).is_empty());
        let other = charge(1_000);
        assert!(ok(store.reserve_on(0, &other)).is_ok());
        let fired = spent(crossed(store.settle_on(
            2,
            &other,
            Usd::from_nanos(499_700),
        )));
        assert_eq!(fired, [500_100]);
    }

    #[test]
    fn spend_reads_exact_counters_while_leases_are_out() {
        let b = [Budget::total("t", Usd::from_nanos(1_000_000))];
        let store = MemoryStore::new();
        let t = Timestamp::from_unix_secs(1);
        for stripe in 0..3 {
            let c = Charge::new(&b, &[], Usd::from_nanos(100), t);
            assert!(ok(store.reserve_on(stripe, &c)).is_ok());
            assert!(ok(store.reserve_on(stripe, &c)).is_ok());
            store.settle_on(stripe + 1, &c, Usd::from_nanos(30));
        }
        let s = store.spend(&b[0], None, t);
        assert_eq!(
            (s.spent, s.reserved),
            (Usd::from_nanos(90), Usd::from_nanos(300))
        );
    }

    #[test]
    fn concurrent_attempts_never_cross_the_limit_and_settle_exactly() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let b = [
            Budget::total("t", Usd::from_nanos(200_000)).soft_limit_percent(90),
            Budget::total("k", Usd::from_nanos(150_000)).per_key("tenant"),
        ];
        let keys: [Option<Arc<str>>; 2] = [None, Some("acme".into())];
        let store = MemoryStore::new();
        let t = Timestamp::from_unix_secs(1);
        let (spent, crossings) = (AtomicU64::new(0), AtomicU64::new(0));
        std::thread::scope(|s| {
            for n in 0..4u64 {
                let (store, b, keys, spent, crossings) = (&store, &b, &keys, &spent, &crossings);
                s.spawn(move || {
                    for i in 0..20_000u64 {
                        let amount = 1 + (i * 7 + n) % 13;
                        let c = Charge::new(b, keys, Usd::from_nanos(amount), t);
                        if ok(store.reserve(&c)).is_ok() {
                            let cost = (i + n) % (amount + 1);
                            spent.fetch_add(cost, Ordering::Relaxed);
                            let fired = crossed(store.settle(&c, Usd::from_nanos(cost)));
                            crossings.fetch_add(fired.len() as u64, Ordering::Relaxed);
                        }
                    }
                });
            }
            // Reading the counters while the attempts run: committed stays within the limit.
            s.spawn(|| {
                for _ in 0..200 {
                    for budget in &b {
                        let key = budget.scope().ne(&Scope::Global).then_some("acme");
                        let now = store.spend(budget, key, t);
                        assert!(now.committed() <= now.limit, "{now:?}");
                    }
                    std::thread::yield_now();
                }
            });
        });
        let total = store.spend(&b[0], None, t);
        let keyed = store.spend(&b[1], Some("acme"), t);
        let spent = spent.load(Ordering::Relaxed);
        assert_eq!((total.spent.as_nanos(), total.reserved), (spent, Usd::ZERO));
        assert_eq!((keyed.spent.as_nanos(), keyed.reserved), (spent, Usd::ZERO));
        assert!(spent <= 150_000);
        // Spend under the soft threshold (180,000 on the total) fires nothing.
        assert_eq!(crossings.load(Ordering::Relaxed), 0);
    }

    proptest::proptest! {
        #[test]
        fn rolling_window_matches_naive_model(
            steps in proptest::collection::vec((0u64..200 * SEC, 0u64..1_000), 1..200),
        ) {
            let span = 3_600 * SEC;
            let budget = [Budget::rolling("r", Usd::MAX, Duration::from_nanos(span))];
            let width = span / 60;
            let store = MemoryStore::new();
            let mut now = 1_000_000 * SEC;
            let mut events = Vec::new();
            for (dt, cost) in steps {
                now += dt;
                let t = Timestamp::from_unix_nanos(now);
                store.settle(&Charge::new(&budget, &[], Usd::ZERO, t), Usd::from_nanos(cost));
                events.push((now, cost));
                let got = store.spend(&budget[0], None, t).spent.as_nanos();
                let at_least = naive(&events, now, span);
                let at_most = naive(&events, now, span + width);
                proptest::prop_assert!(got >= at_least && got <= at_most,
                    "got {} expected {}..={}", got, at_least, at_most);
            }
        }

        #[test]
        fn leased_admission_and_soft_limits_match_a_naive_model(
            ops in proptest::collection::vec(
                (0usize..3, 0u64..120, 0u64..160, 0u8..4, proptest::bool::ANY, proptest::bool::ANY),
                1..400,
            ),
        ) {
            // A total with a soft threshold and a per-key budget, two keys, three stripes
            // (threads), settlements from any stripe, costs under, at and over the estimate.
            let budgets = [
                Budget::total("t", Usd::from_nanos(6_000)).soft_limit_percent(70),
                Budget::total("k", Usd::from_nanos(2_500)).per_key("tenant"),
            ];
            let lists: [[Option<Arc<str>>; 2]; 2] =
                [[None, Some("a".into())], [None, Some("b".into())]];
            let store = MemoryStore::new();
            let t = Timestamp::from_unix_secs(7);
            // Model counters: the total, key a, key b.
            let mut m = [Naive::default(); 3];
            let mut held: Vec<(u64, usize)> = Vec::new();
            for (stripe, amount, cost, what, which, read) in ops {
                let key = usize::from(which);
                if what == 0 && !held.is_empty() {
                    let (a, k) = held.remove(cost as usize % held.len());
                    let c = Charge::new(&budgets, &lists[k], Usd::from_nanos(a), t);
                    let got = crossed(store.settle_on(stripe, &c, Usd::from_nanos(cost)));
                    let mut want = Vec::new();
                    for (i, n) in [0, 1 + k].into_iter().enumerate() {
                        m[n].reserved -= a;
                        m[n].spent += cost;
                        if i == 0 && !m[n].fired && m[n].spent >= 4_200 {
                            m[n].fired = true;
                            want.push(m[n].spent);
                        }
                    }
                    let got: Vec<u64> = got.iter().map(|c| c.spent.as_nanos()).collect();
                    proptest::prop_assert_eq!(got, want);
                } else {
                    let c = Charge::new(&budgets, &lists[key], Usd::from_nanos(amount), t);
                    let admitted = ok(store.reserve_on(stripe, &c)).is_ok();
                    let fits = m[0].spent + m[0].reserved + amount <= 6_000
                        && m[1 + key].spent + m[1 + key].reserved + amount <= 2_500;
                    proptest::prop_assert_eq!(admitted, fits);
                    if admitted {
                        m[0].reserved += amount;
                        m[1 + key].reserved += amount;
                        held.push((amount, key));
                    }
                }
                if read {
                    for (n, (b, k)) in [(0, None), (1, Some("a")), (1, Some("b"))].into_iter().enumerate() {
                        let s = store.spend(&budgets[b], k, t);
                        proptest::prop_assert_eq!(
                            (s.spent.as_nanos(), s.reserved.as_nanos()),
                            (m[n].spent, m[n].reserved)
                        );
                    }
                }
            }
        }

        #[test]
        fn admission_matches_a_naive_model(
            ops in proptest::collection::vec((0u64..50, 0u64..60, proptest::bool::ANY), 1..300),
        ) {
            // The daily limit is the tighter one; both see the same charges.
            let budgets = [Budget::total("t", Usd::from_nanos(200)), Budget::daily("d", Usd::from_nanos(150))];
            let store = MemoryStore::new();
            let t = Timestamp::from_unix_secs(86_400 * 3);
            let (mut spent, mut reserved) = (0u64, 0u64);
            let mut held: Vec<u64> = Vec::new();
            for (amount, cost, settle) in ops {
                if settle && !held.is_empty() {
                    let a = held.remove(0);
                    let cost = cost.min(a);
                    store.settle(&Charge::new(&budgets, &[], Usd::from_nanos(a), t), Usd::from_nanos(cost));
                    reserved -= a;
                    spent += cost;
                } else {
                    let admitted = ok(store.reserve(&Charge::new(&budgets, &[], Usd::from_nanos(amount), t))).is_ok();
                    proptest::prop_assert_eq!(admitted, spent + reserved + amount <= 150);
                    if admitted {
                        held.push(amount);
                        reserved += amount;
                    }
                }
                for b in &budgets {
                    let s = store.spend(b, None, t);
                    proptest::prop_assert_eq!((s.spent.as_nanos(), s.reserved.as_nanos()), (spent, reserved));
                    proptest::prop_assert!(s.committed() <= s.limit);
                }
            }
        }
    }
}
