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

/// The in-process store: every counter behind one short mutex.
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
#[derive(Debug)]
pub struct MemoryStore {
    budgets: Mutex<Vec<Counters>>,
    max_keys: usize,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::with_max_keys(DEFAULT_MAX_KEYS)
    }
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
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Counters>> {
        // The counters are plain integers; a panic elsewhere cannot leave them torn.
        self.budgets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The number of keyed counters held (for tests and memory checks).
    pub fn keyed_counters(&self) -> usize {
        self.lock().iter().map(|c| c.by_key.len()).sum()
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
        let amount = charge.amount().as_nanos();
        let now = charge.now();
        let mut list = self.lock();
        for (i, (budget, key)) in charge.lines().enumerate() {
            let refused =
                counters(&mut list, i, budget, self.max_keys).with(budget, key, now, |c| {
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
                    let table = &mut counters(&mut list, i, budget, self.max_keys).by_key;
                    match (table.get_mut(k).is_some(), bound_key(k)) {
                        (false, _) => Arc::from(OVERFLOW_KEY),
                        (true, Cow::Borrowed(_)) => k.clone(),
                        (true, Cow::Owned(bounded)) => Arc::from(bounded),
                    }
                });
                for (j, (budget, key)) in charge.lines().take(i).enumerate() {
                    counters(&mut list, j, budget, self.max_keys).with(budget, key, now, |c| {
                        c.reserved = c.reserved.saturating_sub(amount);
                    });
                }
                return Admission::Ready(Err(Refusal::Exceeded(Exceeded {
                    budget: budget.name_arc().clone(),
                    key,
                    spend,
                    requested: charge.amount(),
                })));
            }
        }
        Admission::Ready(Ok(()))
    }

    fn settle(&self, charge: &Charge<'_>, cost: Usd) -> Settled {
        let mut crossed = Vec::new();
        let now = charge.now();
        let mut list = self.lock();
        for (i, (budget, key)) in charge.lines().enumerate() {
            let fired = counters(&mut list, i, budget, self.max_keys).with(budget, key, now, |c| {
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
        Settled::Ready(crossed)
    }

    fn spend(&self, budget: &Budget, key: Option<&str>, now: Timestamp) -> Spend {
        let mut list = self.lock();
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

#[cfg(test)]
mod tests {
    use super::*;
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
