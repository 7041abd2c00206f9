//! The keys of one layer: a map from key to breaker, bounded, with a read API and run-time
//! modes through [`BreakerHandle`].
//!
//! Lookups take the map's read lock, which is uncontended in the common case (writers come
//! only with a new key or a mode change) and held for one hash lookup and an `Arc` clone.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use crate::breaker::Breaker;
use crate::config::Config;
use crate::state::{KeySnapshot, Mode, State};

struct Keys {
    map: HashMap<Arc<str>, Arc<Breaker>>,
    default_mode: Mode,
}

/// The state every service made by one layer shares.
pub(crate) struct Shared {
    pub(crate) cfg: Arc<Config>,
    keys: RwLock<Keys>,
}

impl Shared {
    pub(crate) fn new(cfg: Config) -> Self {
        Shared {
            cfg: Arc::new(cfg),
            keys: RwLock::new(Keys {
                map: HashMap::new(),
                default_mode: Mode::Normal,
            }),
        }
    }

    /// The breaker of `key`, created if needed, and noted as used. `None` when the key cap is
    /// reached and no key can be evicted: the call then goes through untracked.
    #[inline]
    pub(crate) fn breaker(&self, key: &str) -> Option<Arc<Breaker>> {
        {
            let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(b) = keys.map.get(key) {
                b.touch();
                return Some(b.clone());
            }
        }
        // A new key's creation time is its last use.
        self.insert(key, false)
    }

    fn insert(&self, key: &str, force: bool) -> Option<Arc<Breaker>> {
        let mut keys = self.keys.write().unwrap_or_else(PoisonError::into_inner);
        let now = self.cfg.now();
        if let Some(b) = keys.map.get(key) {
            return Some(b.clone());
        }
        if keys.map.len() >= self.cfg.max_keys {
            self.evict(&mut keys.map, now);
            if keys.map.len() >= self.cfg.max_keys && !force {
                tracing::debug!(
                    target: "seawall::breaker",
                    max_keys = self.cfg.max_keys,
                    "breaker key cap reached and no key is idle; call not tracked"
                );
                return None;
            }
        }
        let key: Arc<str> = Arc::from(key);
        let b = Arc::new(Breaker::new(
            key.clone(),
            self.cfg.clone(),
            keys.default_mode.state(),
            now,
        ));
        keys.map.insert(key, b.clone());
        Some(b)
    }

    /// Removes idle keys; if none is idle, the least recently used closed one. Keys in a
    /// manual mode, and open or half-open keys that are still in use, are kept.
    ///
    /// A use is dated by the sweep that first sees it (calls set a flag, they do not read the
    /// clock), so a key is evicted only after at least `idle_timeout` without a call, and
    /// possibly some time later.
    fn evict(&self, map: &mut HashMap<Arc<str>, Arc<Breaker>>, now: u64) {
        let idle = nanos(self.cfg.idle_timeout);
        let before = map.len();
        map.retain(|_, b| {
            let keep =
                b.state().is_manual() || now.saturating_sub(b.last_used_at_sweep(now)) < idle;
            if !keep {
                b.mark_evicted();
            }
            keep
        });
        if map.len() < before {
            tracing::debug!(
                target: "seawall::breaker",
                evicted = before - map.len(),
                "evicted idle breaker keys"
            );
            return;
        }
        let lru = map
            .iter()
            .filter(|(_, b)| b.state() == State::Closed)
            .min_by_key(|(_, b)| b.last_used())
            .map(|(k, _)| k.clone());
        if let Some(k) = lru {
            if let Some(b) = map.remove(&k) {
                b.mark_evicted();
            }
            tracing::debug!(target: "seawall::breaker", key = %k, "evicted least recently used breaker key");
        }
    }

    fn get(&self, key: &str) -> Option<Arc<Breaker>> {
        let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
        keys.map.get(key).cloned()
    }

    fn all(&self) -> Vec<Arc<Breaker>> {
        let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
        keys.map.values().cloned().collect()
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Shared")
            .field("cfg", &self.cfg)
            .field("keys", &keys.map.len())
            .field("default_mode", &keys.default_mode)
            .finish()
    }
}

/// Reads and steers the breakers of one layer at run time.
///
/// Obtained from [`CircuitBreakerLayer::handle`](crate::CircuitBreakerLayer::handle); cheap to
/// clone; every clone sees the same keys.
///
/// ```
/// use seawall_breaker::{CircuitBreakerLayer, Mode, State};
///
/// let layer = CircuitBreakerLayer::new();
/// let handle = layer.handle();
/// // Take a model out of rotation before any traffic reaches it.
/// handle.set_mode("api.openai.com/gpt-4o", Mode::ForcedOpen);
/// assert_eq!(handle.state("api.openai.com/gpt-4o"), Some(State::ForcedOpen));
/// handle.set_mode("api.openai.com/gpt-4o", Mode::Normal);
/// assert_eq!(handle.state("api.openai.com/gpt-4o"), Some(State::Closed));
/// ```
#[derive(Clone)]
pub struct BreakerHandle {
    shared: Arc<Shared>,
}

impl BreakerHandle {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        BreakerHandle { shared }
    }

    /// The state of `key`'s breaker, if the key is known.
    pub fn state(&self, key: &str) -> Option<State> {
        self.shared.get(key).map(|b| b.state())
    }

    /// A view of `key`'s breaker, if the key is known.
    pub fn snapshot(&self, key: &str) -> Option<KeySnapshot> {
        let now = self.shared.cfg.now();
        self.shared.get(key).map(|b| b.snapshot(now))
    }

    /// A view of every key, sorted by key.
    pub fn snapshots(&self) -> Vec<KeySnapshot> {
        let now = self.shared.cfg.now();
        let mut all: Vec<_> = self
            .shared
            .all()
            .into_iter()
            .map(|b| b.snapshot(now))
            .collect();
        all.sort_by(|a, b| a.key.cmp(&b.key));
        all
    }

    /// Sets the mode of `key`, creating its breaker if needed (a manual key may exceed the
    /// key cap; it is never evicted while its mode is manual). [`Mode::Normal`] restarts the
    /// automatic state machine from a fresh `Closed` state.
    pub fn set_mode(&self, key: &str, mode: Mode) {
        if let Some(b) = self.shared.insert(key, true) {
            b.set_mode(mode);
        }
    }

    /// Sets the mode of every key, and of keys created from now on.
    pub fn set_mode_all(&self, mode: Mode) {
        let mut keys = self
            .shared
            .keys
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        keys.default_mode = mode;
        let all: Vec<_> = keys.map.values().cloned().collect();
        // Callbacks run for each change: not under the map lock.
        drop(keys);
        for b in all {
            b.set_mode(mode);
        }
    }

    /// Forgets `key` (its counts and state). Returns whether it was known.
    pub fn remove(&self, key: &str) -> bool {
        let mut keys = self
            .shared
            .keys
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        match keys.map.remove(key) {
            Some(b) => {
                b.mark_evicted();
                true
            }
            None => false,
        }
    }

    /// How many keys have a breaker.
    pub fn len(&self) -> usize {
        let keys = self
            .shared
            .keys
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        keys.map.len()
    }

    /// Whether no key has a breaker yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for BreakerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerHandle")
            .field("keys", &self.len())
            .finish()
    }
}
