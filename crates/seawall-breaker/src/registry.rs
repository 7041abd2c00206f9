//! The keys of one layer: a map from key to breaker, bounded, with a read API and run-time
//! modes through [`BreakerHandle`].
//!
//! Lookups take the map's read lock, which is uncontended in the common case (writers come
//! only with a new key or a mode change) and held for one hash lookup and an `Arc` clone.
//!
//! Keys come from clients (the model name of a request body), so the map is bounded by the
//! operator, not by them: keys are cut to [`MAX_KEY_LEN`](seawall_core::MAX_KEY_LEN) bytes by
//! [`bound_key`], and at most [`CircuitBreakerBuilder::max_keys`](crate::CircuitBreakerBuilder::max_keys) keys have a
//! breaker of their own. At the cap a new key evicts the closed keys idle for
//! [`CircuitBreakerBuilder::idle_timeout`](crate::CircuitBreakerBuilder::idle_timeout) first; if there are none, the least
//! recently used eighth of the closed keys with nothing against them (no failure or slow call
//! in the window, no failure streak), so a stream of new keys scans the table only once per
//! `max_keys / 8` keys. A key that is open, half-open or in a manual mode is never evicted,
//! and a closed key on its way to tripping only once idle: a flood of new keys must not reset
//! a breaker that protects the upstream.
//!
//! When nothing can be evicted, new keys share one overflow breaker ([`OVERFLOW_KEY`]) rather
//! than going unprotected or being refused: a sick upstream behind the overflow keys still
//! trips it, at the price of a healthy overflow key being rejected with the sick ones until the
//! table has room again. Refusing them instead would turn a full table into an outage of every
//! new model, which is worse than sharing one breaker.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use seawall_core::bound_key;

use crate::breaker::Breaker;
use crate::config::Config;
use crate::state::{KeySnapshot, Mode, State};

/// The key of the breaker that keys beyond the cap share, as seen through a
/// [`BreakerHandle`] and in [`StateChange`](crate::StateChange) events.
pub const OVERFLOW_KEY: &str = "(overflow)";

/// After a sweep at the cap evicts nothing, new keys go to the overflow breaker without
/// another sweep for this long: a flood of new keys then costs one map lookup each, not a
/// scan of the whole table.
const FULL_BACKOFF: Duration = Duration::from_secs(1);

struct Keys {
    map: HashMap<Arc<str>, Arc<Breaker>>,
    default_mode: Mode,
    /// Until when (on the breaker clock) the table is known to be full of unevictable keys.
    full_until: u64,
}

/// The state every service made by one layer shares.
pub(crate) struct Shared {
    pub(crate) cfg: Arc<Config>,
    keys: RwLock<Keys>,
    overflow: OnceLock<Arc<Breaker>>,
}

impl Shared {
    pub(crate) fn new(cfg: Config) -> Self {
        Shared {
            cfg: Arc::new(cfg),
            keys: RwLock::new(Keys {
                map: HashMap::new(),
                default_mode: Mode::Normal,
                full_until: 0,
            }),
            overflow: OnceLock::new(),
        }
    }

    /// The breaker of `key` (cut to its bounded form), created if needed, and noted as used;
    /// the overflow breaker when the table is full and no key can be evicted.
    #[inline]
    pub(crate) fn breaker(&self, key: &str) -> Arc<Breaker> {
        let key = bound_key(key);
        {
            let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(b) = keys.map.get(&*key) {
                b.touch();
                return b.clone();
            }
            if keys.map.len() >= self.cfg.max_keys && self.cfg.now() < keys.full_until {
                return self.overflow(keys.default_mode);
            }
        }
        // A new key's creation time is its last use.
        self.insert(&key, false)
            .unwrap_or_else(|mode| self.overflow(mode))
    }

    /// The shared breaker of keys beyond the cap, created on first use.
    fn overflow(&self, mode: Mode) -> Arc<Breaker> {
        let b = self.overflow.get_or_init(|| {
            Arc::new(Breaker::new(
                Arc::from(OVERFLOW_KEY),
                self.cfg.clone(),
                mode.state(),
                self.cfg.now(),
            ))
        });
        b.touch();
        b.clone()
    }

    /// The breaker of `key` (already bounded), created if there is room or `force`; else the
    /// default mode, for the overflow breaker.
    fn insert(&self, key: &str, force: bool) -> Result<Arc<Breaker>, Mode> {
        let mut keys = self.keys.write().unwrap_or_else(PoisonError::into_inner);
        let now = self.cfg.now();
        if let Some(b) = keys.map.get(key) {
            return Ok(b.clone());
        }
        if keys.map.len() >= self.cfg.max_keys {
            self.evict(&mut keys.map, now);
            if keys.map.len() >= self.cfg.max_keys && !force {
                keys.full_until = now.saturating_add(nanos(FULL_BACKOFF));
                tracing::debug!(
                    target: "seawall::breaker",
                    max_keys = self.cfg.max_keys,
                    "breaker key cap reached and no key can be evicted; new keys share the overflow breaker"
                );
                return Err(keys.default_mode);
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
        Ok(b)
    }

    /// Removes idle closed keys; if none is idle, the least recently used eighth of the closed
    /// keys with nothing against them. Keys in any other state are kept, used or not.
    ///
    /// A use is dated by the sweep that first sees it (calls set a flag, they do not read the
    /// clock), so a key is evicted as idle only after at least `idle_timeout` without a call,
    /// and possibly some time later.
    fn evict(&self, map: &mut HashMap<Arc<str>, Arc<Breaker>>, now: u64) {
        let idle = nanos(self.cfg.idle_timeout);
        let before = map.len();
        map.retain(|_, b| {
            let keep =
                b.state() != State::Closed || now.saturating_sub(b.last_used_at_sweep(now)) < idle;
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
        // Nothing idle: the least recently used eighth of the closed keys with nothing against
        // them, so that a stream of new keys sweeps the table once per `max_keys / 8` keys.
        let mut clean: Vec<(u64, Arc<str>)> = map
            .iter()
            .filter(|(_, b)| {
                let s = b.snapshot(now);
                s.state == State::Closed
                    && s.failures == 0
                    && s.slow_calls == 0
                    && s.consecutive_failures == 0
            })
            .map(|(k, b)| (b.last_used(), k.clone()))
            .collect();
        let n = (self.cfg.max_keys / 8).clamp(1, clean.len().max(1));
        if clean.len() > n {
            clean.select_nth_unstable(n);
            clean.truncate(n);
        }
        for (_, k) in &clean {
            if let Some(b) = map.remove(k) {
                b.mark_evicted();
            }
        }
        if !clean.is_empty() {
            tracing::debug!(
                target: "seawall::breaker",
                evicted = clean.len(),
                "evicted least recently used breaker keys"
            );
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<Arc<Breaker>> {
        let key = bound_key(key);
        let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
        keys.map
            .get(&*key)
            .or_else(|| (key == OVERFLOW_KEY).then(|| self.overflow.get()).flatten())
            .cloned()
    }

    /// Every breaker, the overflow one included once it exists.
    pub(crate) fn all(&self) -> Vec<Arc<Breaker>> {
        let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
        keys.map
            .values()
            .chain(self.overflow.get())
            .cloned()
            .collect()
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
    /// automatic state machine from a fresh `Closed` state. [`OVERFLOW_KEY`] names the
    /// overflow breaker, once keys beyond the cap have used it.
    pub fn set_mode(&self, key: &str, mode: Mode) {
        let b = match self.shared.get(key) {
            Some(b) => b,
            None if key == OVERFLOW_KEY => {
                let keys = self.shared.keys.read();
                let mode = keys.unwrap_or_else(PoisonError::into_inner).default_mode;
                self.shared.overflow(mode)
            }
            None => match self.shared.insert(&bound_key(key), true) {
                Ok(b) => b,
                Err(_) => return,
            },
        };
        b.set_mode(mode);
    }

    /// Sets the mode of every key, and of keys created from now on.
    pub fn set_mode_all(&self, mode: Mode) {
        let mut keys = self
            .shared
            .keys
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        keys.default_mode = mode;
        let all: Vec<_> = keys
            .map
            .values()
            .chain(self.shared.overflow.get())
            .cloned()
            .collect();
        // Callbacks run for each change: not under the map lock.
        drop(keys);
        for b in all {
            b.set_mode(mode);
        }
    }

    /// Forgets `key` (its counts and state). Returns whether it was known.
    pub fn remove(&self, key: &str) -> bool {
        let key = bound_key(key);
        let mut keys = self
            .shared
            .keys
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        match keys.map.remove(&*key) {
            Some(b) => {
                b.mark_evicted();
                true
            }
            None => false,
        }
    }

    /// How many keys have a breaker of their own (the overflow breaker is not counted).
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
