//! [`SemanticIndex`]: the prompts' vectors, searched exactly (brute force, cosine) among the
//! entries of one context.
//!
//! Why brute force and not an approximate index (HNSW and the like): a process holds at most
//! what its store holds (10,000 answers by default), split by context (model, parameters,
//! path, tenant), and an exact scan of those is a plain loop over contiguous `f32`s that the
//! compiler vectorises. Measured with criterion (`cargo bench -p seawall-cache --bench
//! semantic`), one search on one thread, on a 2-core machine shared with other builds (so
//! these are upper bounds):
//!
//! | entries of one context | dimension 1536 | dimension 256 |
//! |---|---|---|
//! | 1,000 | 0.25 ms | 0.09 ms |
//! | 10,000 | 7.2 ms | 1.0 ms |
//!
//! against an embedding call of tens of milliseconds before it, and an LLM call of seconds
//! that a hit saves. 10,000 entries of dimension 1536 in one context is the worst case
//! (61 MB of vectors, the scan bound by memory bandwidth); asking the embedding model for 256
//! dimensions ([`OpenAiEmbedder::dimensions`](crate::OpenAiEmbedder::dimensions)) cuts the
//! memory to 1 KiB per entry and the time by three to seven. An approximate index would add a
//! dependency, memory, and a recall below 100% (a miss where an answer exists) to save a
//! fraction of a call's cost; it pays for millions of vectors, which belong in a vector
//! database, not in one process's memory. A search longer than a task should run between two
//! awaits (above 256 Ki multiply-adds) runs on tokio's blocking pool.
//!
//! The vectors are normalised when they come in, so cosine similarity is a dot product. Each
//! context keeps its vectors in one contiguous array (one row per entry). The index is bounded
//! like the [`MemoryStore`](crate::MemoryStore): by a number of entries, the oldest stored
//! going first, each entry alive for its time to live on tokio's clock (the answer's), expired
//! ones skipped by searches and dropped, oldest first, as new ones come in. Searches share a
//! read lock; inserts and removals take the write lock.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::key::{CacheKey, KeyHash};

/// The vectors of the prompts whose answers are stored, by context, searched exactly by
/// cosine similarity. Cloning shares the index.
///
/// A search scans the entries of one context: measured on one thread, 0.25 ms among 1,000
/// entries of dimension 1536 and 7.2 ms among 10,000 (0.09 ms and 1.0 ms at dimension 256),
/// less than the embedding call before it; the bound (entries, the oldest going first) and
/// the entries' time to live are the [`MemoryStore`](crate::MemoryStore)'s.
///
/// ```
/// use std::time::Duration;
/// use seawall_cache::{CacheKey, SemanticIndex};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let index = SemanticIndex::new(1_000);
/// let (context, answer) = (CacheKey::from_bytes([1; 32]), CacheKey::from_bytes([2; 32]));
/// index.insert(&context, &answer, &[1.0, 0.0, 1.0], Duration::from_secs(60));
/// let (found, score) = index.search(&context, &[1.0, 0.1, 1.0], 0.95).unwrap();
/// assert_eq!(found, answer);
/// assert!(score >= 0.95);
/// // Another context, or a threshold above the best score: nothing.
/// assert!(index.search(&CacheKey::from_bytes([9; 32]), &[1.0, 0.0, 1.0], 0.95).is_none());
/// assert!(index.search(&context, &[1.0, 1.0, 0.0], 0.95).is_none());
/// # });
/// ```
#[derive(Clone)]
pub struct SemanticIndex {
    inner: Arc<Inner>,
}

struct Inner {
    max_entries: usize,
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    groups: HashMap<CacheKey, Group, KeyHash>,
    /// (context, key, generation) in the order stored; an older generation of a key stored
    /// again is skipped.
    order: VecDeque<(CacheKey, CacheKey, u64)>,
    len: usize,
    generation: u64,
}

/// The entries of one context: row `i` of `vectors` is the vector of `keys[i]`.
struct Group {
    dimension: usize,
    keys: Vec<CacheKey>,
    expires: Vec<Instant>,
    generations: Vec<u64>,
    vectors: Vec<f32>,
}

impl Group {
    fn position(&self, key: &CacheKey) -> Option<usize> {
        self.keys.iter().position(|k| k == key)
    }

    fn swap_remove(&mut self, i: usize) {
        let d = self.dimension;
        let last = self.keys.len() - 1;
        if i != last {
            self.vectors.copy_within(last * d..(last + 1) * d, i * d);
        }
        self.vectors.truncate(last * d);
        self.keys.swap_remove(i);
        self.expires.swap_remove(i);
        self.generations.swap_remove(i);
    }
}

impl std::fmt::Debug for SemanticIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SemanticIndex")
            .field("entries", &self.len())
            .field("max_entries", &self.inner.max_entries)
            .finish()
    }
}

impl SemanticIndex {
    /// An index of at most `max_entries` vectors.
    pub fn new(max_entries: usize) -> Self {
        SemanticIndex {
            inner: Arc::new(Inner {
                max_entries,
                state: RwLock::new(State::default()),
            }),
        }
    }

    /// The entries held (expired ones not yet dropped included).
    pub fn len(&self) -> usize {
        self.inner.read().len
    }

    /// Whether the index holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Indexes `vector` as the prompt of the answer stored under `key`, among the entries of
    /// `context`, for `ttl`; replaces `key`'s earlier vector. Returns whether it was indexed:
    /// not when the vector is empty, not finite or zero, when its dimension differs from the
    /// context's other entries, or when the bound or the time to live is zero.
    pub fn insert(
        &self,
        context: &CacheKey,
        key: &CacheKey,
        vector: &[f32],
        ttl: Duration,
    ) -> bool {
        let inner = &*self.inner;
        let Some(vector) = normalised(vector) else {
            return false;
        };
        if inner.max_entries == 0 || ttl.is_zero() {
            return false;
        }
        let now = Instant::now();
        let expires = seawall_core::instant_after(now, ttl);
        let mut s = inner.write();
        s.generation += 1;
        let generation = s.generation;
        let group = s.groups.entry(*context).or_insert_with(|| Group {
            dimension: vector.len(),
            keys: Vec::new(),
            expires: Vec::new(),
            generations: Vec::new(),
            vectors: Vec::new(),
        });
        if group.dimension != vector.len() {
            return false;
        }
        let d = group.dimension;
        match group.position(key) {
            Some(i) => {
                group.vectors[i * d..(i + 1) * d].copy_from_slice(&vector);
                group.expires[i] = expires;
                group.generations[i] = generation;
            }
            None => {
                group.keys.push(*key);
                group.expires.push(expires);
                group.generations.push(generation);
                group.vectors.extend_from_slice(&vector);
                s.len += 1;
            }
        }
        s.order.push_back((*context, *key, generation));
        // Drop from the oldest: the expired, then whatever the bound needs.
        while let Some(&(c, k, g)) = s.order.front() {
            let over = s.len > inner.max_entries;
            let State {
                groups, order, len, ..
            } = &mut *s;
            let Some(group) = groups.get_mut(&c) else {
                order.pop_front();
                continue;
            };
            match group.position(&k).filter(|&i| group.generations[i] == g) {
                None => {
                    order.pop_front();
                }
                Some(i) if over || group.expires[i] <= now => {
                    group.swap_remove(i);
                    if group.keys.is_empty() {
                        groups.remove(&c);
                    }
                    *len -= 1;
                    order.pop_front();
                }
                Some(_) => break,
            }
        }
        // Keys indexed again leave stale places behind: compact when they dominate.
        if s.order.len() > 2 * s.len + 64 {
            let State { groups, order, .. } = &mut *s;
            order.retain(|(c, k, g)| {
                groups.get(c).is_some_and(|group| {
                    group
                        .position(k)
                        .is_some_and(|i| group.generations[i] == *g)
                })
            });
        }
        true
    }

    /// The entry of `context` most similar to `query` (cosine similarity), if its score is
    /// at least `threshold`: its key and its score (at most 1). Expired entries are skipped.
    pub fn search(
        &self,
        context: &CacheKey,
        query: &[f32],
        threshold: f32,
    ) -> Option<(CacheKey, f32)> {
        let query = normalised(query)?;
        let now = Instant::now();
        let s = self.inner.read();
        let group = s.groups.get(context)?;
        if group.dimension != query.len() {
            return None;
        }
        let mut best: Option<(usize, f32)> = None;
        for (i, row) in group.vectors.chunks_exact(group.dimension).enumerate() {
            if group.expires[i] <= now {
                continue;
            }
            let score = dot(row, &query);
            if best.is_none_or(|(_, b)| score > b) {
                best = Some((i, score));
            }
        }
        // Rounding can put a unit vector's product with itself a hair above 1.
        let (i, score) = best.map(|(i, score)| (i, score.min(1.0)))?;
        (score >= threshold).then(|| (group.keys[i], score))
    }

    /// The multiply-adds a search of `context` costs: its entries times their dimension.
    pub(crate) fn work(&self, context: &CacheKey) -> usize {
        let s = self.inner.read();
        s.groups.get(context).map_or(0, |g| g.vectors.len())
    }

    /// Removes `key`'s entry from `context` (its answer is gone from the store).
    pub fn remove(&self, context: &CacheKey, key: &CacheKey) {
        let mut s = self.inner.write();
        let State { groups, len, .. } = &mut *s;
        let Some(group) = groups.get_mut(context) else {
            return;
        };
        if let Some(i) = group.position(key) {
            group.swap_remove(i);
            *len -= 1;
            if group.keys.is_empty() {
                groups.remove(context);
            }
        }
    }
}

impl Inner {
    // Plain data: a panic elsewhere cannot leave it inconsistent.
    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// `v` scaled to length 1, or `None` when it is empty, not finite or zero.
pub(crate) fn normalised(v: &[f32]) -> Option<Vec<f32>> {
    if v.is_empty() || !v.iter().all(|x| x.is_finite()) {
        return None;
    }
    // In f64: the squares of large components must not overflow.
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm == 0.0 || !norm.is_finite() {
        return None;
    }
    Some(v.iter().map(|&x| (f64::from(x) / norm) as f32).collect())
}

/// The dot product, in eight independent sums so the compiler can vectorise it (one running
/// sum would force the additions into sequence).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u8) -> CacheKey {
        CacheKey::from_bytes([i; 32])
    }

    const CONTEXT: CacheKey = CacheKey::from_bytes([0xc0; 32]);
    const TTL: Duration = Duration::from_secs(10);

    /// A unit vector along axis `i` of 4.
    fn axis(i: usize) -> Vec<f32> {
        let mut v = vec![0.0; 4];
        v[i] = 1.0;
        v
    }

    #[test]
    fn the_dot_product_matches_the_plain_sum_at_every_length() {
        for n in [1, 7, 8, 9, 31, 1536] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((dot(&a, &b) - plain).abs() < 1e-3, "n = {n}");
        }
    }

    #[test]
    fn unusable_vectors_are_refused() {
        assert!(normalised(&[]).is_none());
        assert!(normalised(&[0.0, 0.0]).is_none());
        assert!(normalised(&[f32::NAN, 1.0]).is_none());
        assert!(normalised(&[f32::INFINITY, 1.0]).is_none());
        // Large but finite components do not overflow the norm.
        let big = normalised(&[3e38, 3e38]).unwrap();
        assert!((big[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6);
        let index = SemanticIndex::new(10);
        assert!(!index.insert(&CONTEXT, &key(1), &[0.0; 4], TTL));
        assert!(index.search(&CONTEXT, &[f32::NAN; 4], 0.0).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_best_entry_above_the_threshold_is_found_in_its_own_context_only() {
        let index = SemanticIndex::new(10);
        for i in 0..4 {
            assert!(index.insert(&CONTEXT, &key(i as u8), &axis(i), TTL));
        }
        let (found, score) = index.search(&CONTEXT, &[0.1, 0.2, 0.9, 0.1], 0.9).unwrap();
        assert_eq!(found, key(2));
        assert!((0.9..=1.0).contains(&score));
        assert!(index.search(&CONTEXT, &[0.5, 0.5, 0.5, 0.5], 0.9).is_none());
        assert!(index.search(&key(0xee), &axis(2), 0.0).is_none());
        // Another dimension never matches (an embedder that changed), nor is it mixed in.
        assert!(index.search(&CONTEXT, &[1.0, 0.0], 0.0).is_none());
        assert!(!index.insert(&CONTEXT, &key(9), &[1.0, 0.0], TTL));
    }

    #[tokio::test(start_paused = true)]
    async fn an_entry_lives_for_its_ttl_and_no_longer() {
        let index = SemanticIndex::new(10);
        index.insert(&CONTEXT, &key(1), &axis(0), TTL);
        tokio::time::advance(TTL - Duration::from_millis(1)).await;
        assert!(index.search(&CONTEXT, &axis(0), 0.95).is_some());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(index.search(&CONTEXT, &axis(0), 0.95).is_none());
        // Dropped, oldest first, when a new entry comes in.
        index.insert(&CONTEXT, &key(2), &axis(1), TTL);
        assert_eq!(index.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_bound_drops_the_oldest_across_contexts() {
        let index = SemanticIndex::new(3);
        for i in 0..5u8 {
            let context = key(100 + i % 2);
            index.insert(&context, &key(i), &axis(usize::from(i % 4)), TTL);
        }
        assert_eq!(index.len(), 3);
        // 0 and 1 went first; 2, 3 and 4 remain (4 has 0's vector, in 0's context).
        assert!(index.search(&key(101), &axis(1), 0.99).is_none());
        assert_eq!(index.search(&key(100), &axis(0), 0.99).unwrap().0, key(4));
        assert_eq!(index.search(&key(100), &axis(2), 0.99).unwrap().0, key(2));
        assert_eq!(index.search(&key(101), &axis(3), 0.99).unwrap().0, key(3));
    }

    #[tokio::test(start_paused = true)]
    async fn indexing_a_key_again_replaces_its_vector_and_renews_it() {
        let index = SemanticIndex::new(2);
        for _ in 0..500 {
            index.insert(&CONTEXT, &key(1), &axis(0), TTL);
        }
        index.insert(&CONTEXT, &key(1), &axis(1), TTL);
        index.insert(&CONTEXT, &key(2), &axis(2), TTL);
        assert_eq!(index.len(), 2);
        assert!(index.search(&CONTEXT, &axis(0), 0.5).is_none());
        assert_eq!(index.search(&CONTEXT, &axis(1), 0.99).unwrap().0, key(1));
        assert!(index.inner.read().order.len() < 200);
        index.remove(&CONTEXT, &key(1));
        assert_eq!(index.len(), 1);
        assert!(index.search(&CONTEXT, &axis(1), 0.5).is_none());
    }
}
