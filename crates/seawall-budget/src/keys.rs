//! How keyed budgets find a request's key (a [`KeyFn`] per scope), and the bounded table of
//! their counters.
//!
//! Keys come from clients (the model name of a request body, a tenant header), so the number
//! of keyed counters is bounded by the operator, not by them: keys are cut to
//! [`MAX_KEY_LEN`](seawall_core::MAX_KEY_LEN) bytes by [`bound_key`], and a budget keeps at
//! most [`MemoryStore::with_max_keys`](crate::MemoryStore::with_max_keys) keyed counters
//! ([`DEFAULT_MAX_KEYS`] by default). At the cap, counters that hold nothing (no reservation,
//! no spend in their window) are dropped; a counter that holds either is never dropped, since
//! forgetting spend would let its key spend again. When the table is full of such counters,
//! new keys are counted together under one overflow counter ([`OVERFLOW_KEY`]) against the
//! budget's per-key limit: no key can overspend through it (its spend is at most the shared
//! spend), and the keys already counted keep their exact counters. Refusing new keys outright
//! would be the other safe choice, but would stop every new tenant until the window rolls
//! over; sharing lets them spend one key's worth between them.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use seawall_core::{KeyFn, bound_key};

/// No key function: every request is without a key. Every per-key budget would count all
/// requests under one key, so the builder refuses per-key budgets without
/// [`CostBudgetBuilder::keys`](crate::CostBudgetBuilder::keys).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoKeys;

impl<Req> KeyFn<Req> for NoKeys {
    fn key<'a>(&'a self, _req: &'a Req) -> Option<Cow<'a, str>> {
        None
    }
}

/// A [`KeyFn`] per scope of [`Budget::per_key`](crate::Budget::per_key), for a layer whose
/// per-key budgets read different keys: each reads its key with the function of its scope
/// ([`KeyFn::scoped_key`]); a scope without one counts every request under
/// [`UNKEYED`](crate::UNKEYED). A single [`KeyFn`] gives all of them the same key.
///
/// ```
/// use bytes::Bytes;
/// use seawall_budget::{Budget, CostBudgetLayer, PriceTable, ScopeKeys, Usd};
///
/// type Req = http::Request<Bytes>;
/// let header = |name: &'static str| {
///     move |req: &Req| req.headers().get(name)?.to_str().ok().map(str::to_owned)
/// };
/// let layer = CostBudgetLayer::builder(PriceTable::new())
///     .budget(Budget::daily("tenant-daily", Usd::from_dollars(5)).per_key("tenant"))
///     .budget(Budget::daily("user-daily", Usd::from_dollars(1)).per_key("user"))
///     .keys(
///         ScopeKeys::new()
///             .scope("tenant", header("x-tenant"))
///             .scope("user", header("x-user")),
///     )
///     .build()
///     .unwrap();
/// # let _ = layer;
/// ```
pub struct ScopeKeys<Req> {
    scopes: Vec<(Box<str>, Box<dyn KeyFn<Req> + Send + Sync>)>,
}

impl<Req> ScopeKeys<Req> {
    /// No scope has a key function yet.
    pub fn new() -> Self {
        ScopeKeys { scopes: Vec::new() }
    }

    /// Reads the keys of the budgets of scope `scope` with `key` (replacing an earlier one).
    pub fn scope(mut self, scope: &str, key: impl KeyFn<Req> + Send + Sync + 'static) -> Self {
        self.scopes.retain(|(s, _)| **s != *scope);
        self.scopes.push((scope.into(), Box::new(key)));
        self
    }
}

impl<Req> Default for ScopeKeys<Req> {
    fn default() -> Self {
        Self::new()
    }
}

impl<Req> fmt::Debug for ScopeKeys<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.scopes.iter().map(|(s, _)| s))
            .finish()
    }
}

impl<Req> KeyFn<Req> for ScopeKeys<Req> {
    /// No key outside a scope.
    fn key<'a>(&'a self, _req: &'a Req) -> Option<Cow<'a, str>> {
        None
    }

    fn scoped_key<'a>(&'a self, scope: &str, req: &'a Req) -> Option<Cow<'a, str>> {
        let (_, key) = self.scopes.iter().find(|(s, _)| **s == *scope)?;
        key.key(req)
    }
}

/// A stable, non-reversible identifier for a secret (an API key, say), for use as a budget
/// key: `"fp-"` and 16 hex digits of its 64-bit FNV-1a hash. The same secret always gives the
/// same identifier, across processes and versions, and the secret never reaches errors,
/// logs or spend records.
///
/// ```
/// let id = seawall_budget::fingerprint("sk-proj-abc123");
/// assert_eq!(id.len(), 19);
/// assert!(!id.contains("abc123"));
/// assert_eq!(id, seawall_budget::fingerprint("sk-proj-abc123"));
/// ```
pub fn fingerprint(secret: &str) -> Arc<str> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in secret.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("fp-{h:016x}").into()
}

/// The most keyed counters one budget of a [`MemoryStore`](crate::MemoryStore) keeps by
/// default.
pub const DEFAULT_MAX_KEYS: usize = 10_000;

/// The key under which a full table counts new keys together, as named in
/// [`Exceeded`](crate::Exceeded) and [`SoftLimitCrossed`](crate::SoftLimitCrossed).
pub const OVERFLOW_KEY: &str = "(overflow)";

/// Keys a table remembers by address (a few per thread of the process, typically).
const RECENT: usize = 8;

/// Below this many counters the table is not swept for idle ones.
pub(crate) const MIN_PRUNE_AT: usize = 4096;

/// After a sweep of a full table frees nothing, new keys go to the overflow counter without
/// another sweep for this long.
const FULL_BACKOFF: Duration = Duration::from_secs(1);

/// The keyed counters of one budget, bounded.
///
/// The counters live in a vector and the map holds their index, so that finding a key's
/// counter is one hash of the key: a lookup that returns the counter on a hit and goes on to
/// insert on a miss would otherwise need a second lookup (the borrow of the hit would outlive
/// the miss path). The lookup runs twice per keyed budget per attempt (reserve and settle),
/// under the store's lock.
#[derive(Debug)]
pub(crate) struct KeyTable<V> {
    index: HashMap<Arc<str>, usize>,
    /// The counters, at the indices the map gives.
    slots: Vec<V>,
    /// The last keys found through `entry_shared`, by address, with their counter's index.
    recent: [Option<(Arc<str>, usize)>; RECENT],
    recent_next: usize,
    overflow: V,
    max_keys: usize,
    /// Sweep when the map reaches this size, so memory follows the number of active keys.
    prune_at: usize,
    /// Until when (Unix nanoseconds) the table is known to hold nothing to drop.
    full_until: u64,
}

impl<V: Default> KeyTable<V> {
    pub(crate) fn new(max_keys: usize) -> Self {
        KeyTable {
            index: HashMap::new(),
            slots: Vec::new(),
            recent: Default::default(),
            recent_next: 0,
            overflow: V::default(),
            max_keys,
            prune_at: MIN_PRUNE_AT,
            full_until: 0,
        }
    }

    /// The counter of `key` at `now` (Unix nanoseconds): its own, created if there is room,
    /// else the overflow counter.
    ///
    /// `busy` says whether the overflow counter holds reservations: while it does, no new key
    /// gets a counter of its own, so that an attempt reserved on the overflow counter settles
    /// there too. `idle` says whether a counter may be dropped (it may bring it up to date
    /// first).
    #[cfg(test)]
    pub(crate) fn entry(
        &mut self,
        key: &str,
        now: u64,
        busy: impl Fn(&V) -> bool,
        idle: impl FnMut(&mut V) -> bool,
    ) -> &mut V {
        match self.slot(key, now, busy, idle) {
            Some(i) => &mut self.slots[i],
            None => &mut self.overflow,
        }
    }

    /// The counter of `key` at `now` (Unix nanoseconds), as `entry` finds it, for a key the
    /// caller holds as an `Arc`. Callers pass the same allocation for the same key again and
    /// again (the layer keeps one per thread), so the table remembers the last few such keys
    /// by address and finds their counters without hashing the key.
    pub(crate) fn entry_shared(
        &mut self,
        key: &Arc<str>,
        now: u64,
        busy: impl Fn(&V) -> bool,
        idle: impl FnMut(&mut V) -> bool,
    ) -> &mut V {
        // The remembered `Arc` keeps its allocation alive, so an equal address is this key.
        let known = self
            .recent
            .iter()
            .flatten()
            .find(|(k, _)| Arc::ptr_eq(k, key))
            .map(|(_, i)| *i);
        if let Some(i) = known {
            return &mut self.slots[i];
        }
        match self.slot(key, now, busy, idle) {
            Some(i) => {
                self.recent[self.recent_next] = Some((key.clone(), i));
                self.recent_next = (self.recent_next + 1) % RECENT;
                &mut self.slots[i]
            }
            None => &mut self.overflow,
        }
    }

    /// The index of `key`'s own counter, created if there is room; `None`: the overflow one.
    fn slot(
        &mut self,
        key: &str,
        now: u64,
        busy: impl Fn(&V) -> bool,
        idle: impl FnMut(&mut V) -> bool,
    ) -> Option<usize> {
        let key = bound_key(key);
        if let Some(&i) = self.index.get(&*key) {
            return Some(i);
        }
        if busy(&self.overflow) {
            return None;
        }
        if self.index.len() >= self.prune_at.min(self.max_keys) && now >= self.full_until {
            self.prune(idle);
            self.prune_at = (self.index.len() * 2).max(MIN_PRUNE_AT);
            if self.index.len() >= self.max_keys {
                self.full_until = now.saturating_add(FULL_BACKOFF.as_nanos() as u64);
            }
        }
        if self.index.len() >= self.max_keys {
            return None;
        }
        let i = self.slots.len();
        self.slots.push(V::default());
        self.index.insert(Arc::from(key), i);
        Some(i)
    }

    /// Drops the counters `idle` says may go, and packs the others.
    fn prune(&mut self, mut idle: impl FnMut(&mut V) -> bool) {
        let mut slots: Vec<Option<V>> = std::mem::take(&mut self.slots)
            .into_iter()
            .map(Some)
            .collect();
        let mut kept = Vec::with_capacity(slots.len());
        self.index.retain(|_, i| {
            let Some(mut v) = slots[*i].take() else {
                return false;
            };
            if idle(&mut v) {
                return false;
            }
            *i = kept.len();
            kept.push(v);
            true
        });
        self.slots = kept;
        // Indices moved: forget the remembered ones.
        self.recent = Default::default();
    }

    /// The counter of `key` if it has one of its own.
    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let i = *self.index.get(&*bound_key(key))?;
        self.slots.get_mut(i)
    }

    /// How many keys have a counter of their own.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter that is busy (holds a reservation) or pinned (holds spend).
    #[derive(Debug, Default, Clone, Copy, PartialEq)]
    struct C {
        reserved: u64,
        spent: u64,
    }

    fn entry<'t>(t: &'t mut KeyTable<C>, key: &str, now: u64) -> &'t mut C {
        t.entry(
            key,
            now,
            |o| o.reserved > 0,
            |c| c.reserved == 0 && c.spent == 0,
        )
    }

    #[test]
    fn counters_with_spend_are_never_dropped_and_new_keys_overflow() {
        let mut t = KeyTable::new(2);
        entry(&mut t, "a", 0).spent = 5;
        entry(&mut t, "b", 0).reserved = 7;
        // Full of counters that hold something: "c" and "d" share the overflow counter.
        entry(&mut t, "c", 0).spent += 1;
        entry(&mut t, "d", 0).spent += 1;
        assert_eq!(t.len(), 2);
        assert_eq!(t.overflow.spent, 2);
        assert_eq!(t.get_mut("a").unwrap().spent, 5);
        assert_eq!(t.get_mut("b").unwrap().reserved, 7);
        assert!(t.get_mut("c").is_none());
        // Once "b" settles to nothing it can make room (after the backoff).
        entry(&mut t, "b", 0).reserved = 0;
        entry(&mut t, "e", 0).spent += 1;
        assert_eq!(t.overflow.spent, 3, "within the backoff: no sweep");
        let later = FULL_BACKOFF.as_nanos() as u64;
        entry(&mut t, "e", later).spent += 1;
        assert_eq!(t.get_mut("e").unwrap().spent, 1);
        assert!(t.get_mut("b").is_none());
        assert_eq!(t.get_mut("a").unwrap().spent, 5);
    }

    #[test]
    fn no_key_leaves_the_overflow_while_it_holds_reservations() {
        let mut t = KeyTable::new(1);
        entry(&mut t, "a", 0).spent = 1;
        // "b" reserves on the overflow counter.
        entry(&mut t, "b", 0).reserved += 3;
        // "a" frees its place, but "b" must settle where it reserved.
        t.get_mut("a").unwrap().spent = 0;
        let later = FULL_BACKOFF.as_nanos() as u64;
        let c = entry(&mut t, "b", later);
        assert_eq!(c.reserved, 3);
        c.reserved -= 3;
        // Now the overflow holds no reservation: "b" gets a counter of its own.
        entry(&mut t, "b", later).spent = 4;
        assert_eq!(t.get_mut("b").unwrap().spent, 4);
    }

    #[test]
    fn a_key_found_by_address_is_the_key_found_by_name() {
        let mut t = KeyTable::new(2);
        let a: Arc<str> = "a".into();
        let idle = |c: &mut C| c.reserved == 0 && c.spent == 0;
        t.entry_shared(&a, 0, |o| o.reserved > 0, idle).spent = 1;
        t.entry_shared(&a, 0, |o| o.reserved > 0, idle).spent += 1;
        assert_eq!(t.get_mut("a").unwrap().spent, 2);
        // Another allocation of the same key finds the same counter.
        let again: Arc<str> = "a".into();
        assert_eq!(t.entry_shared(&again, 0, |o| o.reserved > 0, idle).spent, 2);
        // A sweep moves counters: what was remembered by address follows them.
        entry(&mut t, "b", 0).spent = 0;
        t.get_mut("a").unwrap().spent = 0;
        // Sweep at the next new key (no backoff was set, so now is late enough).
        t.prune_at = 0;
        entry(&mut t, "c", 0).spent = 9;
        assert_eq!(t.len(), 1);
        // Without forgetting the address, "a" would find the counter now at its old index.
        assert_eq!(t.entry_shared(&a, 0, |o| o.reserved > 0, idle).spent, 0);
        assert_eq!(t.get_mut("c").unwrap().spent, 9);
    }

    #[test]
    fn long_keys_share_nothing_but_are_stored_bounded() {
        let mut t = KeyTable::new(8);
        let a = format!("{}a", "k".repeat(10_000));
        let b = format!("{}b", "k".repeat(10_000));
        entry(&mut t, &a, 0).spent = 1;
        entry(&mut t, &b, 0).spent = 2;
        assert_eq!(t.get_mut(&a).unwrap().spent, 1);
        assert_eq!(t.get_mut(&b).unwrap().spent, 2);
        assert!(t.index.keys().all(|k| k.len() <= seawall_core::MAX_KEY_LEN));
    }
}
