//! The bounded store behind the last-resort cache: entries by key, evicted by age, count and
//! total size, behind the type-erased interface the layer holds.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use seawall_core::ServedBy;
use tokio::time::Instant;

use super::{BoxFuture, LastResort, Replay, RequestKey, ResponseCache};

/// The type-erased cache the layer holds.
pub(crate) trait CacheOps<Req, Resp>: Send + Sync {
    fn key(&self, req: &Req) -> Option<u64>;
    fn capture(&self, key: u64, served: ServedBy, resp: Resp) -> BoxFuture<Resp>;
    fn replay(&self, key: u64) -> Option<(Resp, LastResort)>;
    fn usage(&self) -> (usize, usize);
}

pub(crate) struct Cache<Snap>(Arc<Store<Snap>>);

impl<Snap> Cache<Snap> {
    pub(crate) fn new(config: ResponseCache) -> Self {
        Cache(Arc::new(Store {
            config,
            hasher: RandomState::new(),
            state: Mutex::new(CacheState::default()),
        }))
    }
}

struct Store<Snap> {
    config: ResponseCache,
    hasher: RandomState,
    state: Mutex<CacheState<Snap>>,
}

impl<Snap> Store<Snap> {
    fn lock(&self) -> MutexGuard<'_, CacheState<Snap>> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<Req, Resp> CacheOps<Req, Resp> for Cache<Resp::Snapshot>
where
    Req: RequestKey,
    Resp: Replay + Send + 'static,
{
    fn key(&self, req: &Req) -> Option<u64> {
        let mut h = self.0.hasher.build_hasher();
        req.cache_key(&mut h).then(|| h.finish())
    }

    fn capture(&self, key: u64, served: ServedBy, resp: Resp) -> BoxFuture<Resp> {
        let store = self.0.clone();
        Box::pin(async move {
            let cap = store.config.entry_cap();
            let (resp, snapshot) = resp.capture(cap).await;
            if let Some(snapshot) = snapshot {
                let size = Resp::snapshot_len(&snapshot);
                store.lock().insert(
                    &store.config,
                    key,
                    Arc::new(snapshot),
                    size,
                    served,
                    Instant::now(),
                );
            }
            resp
        })
    }

    fn replay(&self, key: u64) -> Option<(Resp, LastResort)> {
        let (snapshot, served_by, age) = self.0.lock().get(&self.0.config, key, Instant::now())?;
        Some((
            Resp::replay(&snapshot),
            LastResort::Cached { age, served_by },
        ))
    }

    fn usage(&self) -> (usize, usize) {
        let s = self.0.lock();
        (s.entries.len(), s.bytes)
    }
}

struct Entry<Snap> {
    seq: u64,
    stored: Instant,
    size: usize,
    served: ServedBy,
    snapshot: Arc<Snap>,
}

/// Entries by key, and their keys by insertion order: every entry has the same TTL, so the
/// oldest entry is also the first to expire.
pub(crate) struct CacheState<Snap> {
    entries: HashMap<u64, Entry<Snap>>,
    order: BTreeMap<u64, u64>,
    next_seq: u64,
    bytes: usize,
}

impl<Snap> Default for CacheState<Snap> {
    fn default() -> Self {
        CacheState {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            bytes: 0,
        }
    }
}

impl<Snap> CacheState<Snap> {
    fn remove(&mut self, key: u64) {
        if let Some(e) = self.entries.remove(&key) {
            self.order.remove(&e.seq);
            self.bytes -= e.size;
        }
    }

    fn pop_oldest(&mut self) -> bool {
        match self.order.pop_first() {
            Some((_, key)) => {
                if let Some(e) = self.entries.remove(&key) {
                    self.bytes -= e.size;
                }
                true
            }
            None => false,
        }
    }

    fn insert(
        &mut self,
        cfg: &ResponseCache,
        key: u64,
        snapshot: Arc<Snap>,
        size: usize,
        served: ServedBy,
        now: Instant,
    ) {
        self.remove(key);
        if size > cfg.entry_cap() || cfg.max_entries == 0 {
            return;
        }
        while let Some((_, k)) = self.order.first_key_value() {
            let expired = self
                .entries
                .get(k)
                .is_none_or(|e| now.saturating_duration_since(e.stored) >= cfg.ttl);
            if !expired {
                break;
            }
            self.pop_oldest();
        }
        while self.entries.len() >= cfg.max_entries || self.bytes + size > cfg.max_bytes {
            if !self.pop_oldest() {
                break;
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, key);
        self.bytes += size;
        self.entries.insert(
            key,
            Entry {
                seq,
                stored: now,
                size,
                served,
                snapshot,
            },
        );
    }

    fn get(
        &mut self,
        cfg: &ResponseCache,
        key: u64,
        now: Instant,
    ) -> Option<(Arc<Snap>, ServedBy, Duration)> {
        let e = self.entries.get(&key)?;
        let age = now.saturating_duration_since(e.stored);
        if age >= cfg.ttl {
            self.remove(key);
            return None;
        }
        Some((e.snapshot.clone(), e.served.clone(), age))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn served() -> ServedBy {
        ServedBy {
            target: "primary".into(),
            model: None,
            degraded: false,
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert { key: u64, size: usize },
        Get { key: u64 },
        Advance { ms: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..12, 0usize..400).prop_map(|(key, size)| Op::Insert { key, size }),
            (0u64..12).prop_map(|key| Op::Get { key }),
            (0u64..3000).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    proptest! {
        #[test]
        fn bounds_hold_and_nothing_expired_is_served(
            ops in proptest::collection::vec(op(), 1..200),
            max_entries in 0usize..6,
            max_bytes in 0usize..1200,
        ) {
            let cfg = ResponseCache::new(Duration::from_secs(5))
                .with_max_entries(max_entries)
                .with_max_bytes(max_bytes)
                .with_max_entry_bytes(300);
            let mut state = CacheState::<()>::default();
            let start = Instant::now();
            let mut now = start;
            let mut stored_at: HashMap<u64, Instant> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert { key, size } => {
                        state.insert(&cfg, key, Arc::new(()), size, served(), now);
                        if size <= cfg.entry_cap() && max_entries > 0 {
                            prop_assert!(state.entries.contains_key(&key));
                            stored_at.insert(key, now);
                        } else {
                            prop_assert!(!state.entries.contains_key(&key));
                        }
                    }
                    Op::Get { key } => {
                        if let Some((_, _, age)) = state.get(&cfg, key, now) {
                            prop_assert!(age < cfg.ttl());
                            prop_assert_eq!(now - stored_at[&key], age);
                        }
                    }
                    Op::Advance { ms } => now += Duration::from_millis(ms),
                }
                prop_assert!(state.entries.len() <= max_entries);
                prop_assert!(state.bytes <= max_bytes);
                prop_assert_eq!(state.order.len(), state.entries.len());
                prop_assert_eq!(state.bytes, state.entries.values().map(|e| e.size).sum::<usize>());
            }
        }
    }
}
