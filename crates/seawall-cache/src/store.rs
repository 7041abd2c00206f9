//! Where answers are kept: the [`CacheStore`] trait, and [`MemoryStore`], the default.
//!
//! The trait is object-safe and its futures are boxed and `'static`, so the layer holds an
//! `Arc<dyn CacheStore>` and a remote store (Redis, shared by a fleet) plugs in beside the
//! in-memory one. A store decides nothing about what is cacheable: the layer hands it only
//! complete answers, with their time to live.
//!
//! A store that fails (a remote one that does not answer) is never the caller's problem: the
//! layer treats a failed `get` as a miss and a failed `put` as not stored, and logs both.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::HashTable;
use tokio::time::Instant;

use crate::answer::Answer;
use crate::flight::{FlightState, FlightTable, Join, Lead, Table};
use crate::key::CacheKey;

/// The future of a store operation.
pub type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'static>>;

/// A store operation that failed. Its message never holds credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(Arc<str>);

impl StoreError {
    /// An error saying `message`.
    pub fn new(message: impl AsRef<str>) -> Self {
        StoreError(Arc::from(seawall_core::redact(message.as_ref()).as_ref()))
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cache store: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

/// Keeps answers by key, each for its time to live.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use seawall_cache::{Answer, CacheKey, CacheStore, MemoryStore, Wire};
/// use seawall_core::Usage;
///
/// # tokio_test_block_on(async {
/// let store = MemoryStore::new();
/// let key = CacheKey::from_bytes([7; 32]);
/// let answer = Arc::new(Answer::new(Wire::OpenAiChat, "id", "m", 0, "hi", "stop", Usage::default()));
/// store.put(&key, answer.clone(), Duration::from_secs(60)).await?;
/// assert_eq!(store.get(&key).await?.as_deref(), Some(&*answer));
/// # Ok::<(), seawall_cache::StoreError>(())
/// # }).unwrap();
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(f)
/// # }
/// ```
pub trait CacheStore: Send + Sync + 'static {
    /// The answer stored under `key`, if there is one still alive.
    fn get(&self, key: &CacheKey) -> StoreFuture<Option<Arc<Answer>>>;

    /// Stores `answer` under `key` for `ttl`, replacing what was there.
    fn put(&self, key: &CacheKey, answer: Arc<Answer>, ttl: Duration) -> StoreFuture<()>;

    /// Looks `key` up at once, without a future, when this store can (an in-memory one):
    /// `None` when it cannot, and the layer awaits [`get`](Self::get) instead (the default).
    ///
    /// A hit answered here is served without a boxed future or any wait.
    fn get_now(&self, key: &CacheKey) -> Option<Result<Option<Arc<Answer>>, StoreError>> {
        let _ = key;
        None
    }

    /// Stores at once, without a future, when this store can: `None` once done (stored, or
    /// refused as [`put`](Self::put) would), or `answer` given back when it cannot, and the
    /// layer drives [`put`](Self::put) instead (the default).
    fn put_now(&self, key: &CacheKey, answer: Arc<Answer>, ttl: Duration) -> Option<Arc<Answer>> {
        let _ = (key, ttl);
        Some(answer)
    }
}

impl<T: CacheStore + ?Sized> CacheStore for Arc<T> {
    fn get(&self, key: &CacheKey) -> StoreFuture<Option<Arc<Answer>>> {
        (**self).get(key)
    }

    fn put(&self, key: &CacheKey, answer: Arc<Answer>, ttl: Duration) -> StoreFuture<()> {
        (**self).put(key, answer, ttl)
    }

    fn get_now(&self, key: &CacheKey) -> Option<Result<Option<Arc<Answer>>, StoreError>> {
        (**self).get_now(key)
    }

    fn put_now(&self, key: &CacheKey, answer: Arc<Answer>, ttl: Duration) -> Option<Arc<Answer>> {
        (**self).put_now(key, answer, ttl)
    }
}

/// The in-memory store: bounded by a number of entries and a total size, each entry alive for
/// its time to live on tokio's clock (so tests on paused time see entries expire).
///
/// A JSON answer the layer stores here after a miss is checked at its first use, not at the
/// miss (see the [crate docs](crate)): a lookup never gives out an answer that fails the check,
/// and drops it.
///
/// When a bound is reached the oldest entries go first. An answer larger than the byte bound
/// is not stored. Expired entries are dropped when looked up and, oldest first, when new ones
/// come in. With different times to live in one store (a store shared by layers with
/// different TTLs), an expired entry stored after one still alive waits for that one to go
/// first: until then it counts in [`usage`](Self::usage) and against the bounds, though it is
/// never served. Defaults:
/// 10,000 entries, 64 MiB.
///
/// Cloning shares the store.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    max_entries: usize,
    max_bytes: usize,
    state: Mutex<State>,
}

/// The entries, in the order they were stored, and an index of their keys.
///
/// Why not a map of keys to entries with a queue of keys beside it (the obvious layout, and
/// this store's first): with a full store, every miss evicts the oldest entry, and finding
/// that entry's key in a map of 10,000 costs a load from memory no call touched for 10,000
/// misses (two, with the map's control bytes), and storing the new one another. Here the
/// entries sit in a queue, one cache line each, and the index holds only their numbers:
/// 8 bytes a slot, 144 KB for the default 10,000 entries (control bytes included) against
/// the map's 1.2 MB, so its slots are mostly found in the CPU's shared cache rather than in
/// memory. The oldest entry is read from the queue's front and removed from the index by
/// its number, without reading any other entry; the new one is written beside the last
/// stored.
#[derive(Default)]
struct State {
    /// Each live entry's number, filed under its key's [`table_hash`](CacheKey::table_hash).
    index: HashTable<u64>,
    /// The entries in the order stored: entry number `n` is `entries[n - first]`. An entry
    /// replaced, or dropped when looked up expired, stays as a gap (its answer gone) until it
    /// is the oldest, or the queue is compacted.
    entries: VecDeque<Stored>,
    /// The number of the oldest entry in the queue.
    first: u64,
    /// The entries with an answer (not gaps).
    live: usize,
    bytes: usize,
    /// The flights of a layer (or of layers) over this store, under the same lock: a lookup
    /// that misses joins its key's flight, and a leader stores its answer and ends its
    /// flight, each in one step (see [`MemoryStore::look`]).
    flights: Table,
}

/// An entry, aligned to a cache line: reading one never touches two lines.
#[repr(align(64))]
struct Stored {
    key: CacheKey,
    /// `None` for a gap.
    answer: Option<Arc<Answer>>,
    expires: Instant,
    bytes: usize,
}

impl State {
    /// Where the live entry under `key` sits in the queue.
    fn find(&self, key: &CacheKey) -> Option<usize> {
        let (entries, first) = (&self.entries, self.first);
        let n = self.index.find(key.table_hash(), |&n| {
            entries.get(slot(n, first)).is_some_and(|e| e.key == *key)
        })?;
        Some(slot(*n, first))
    }

    /// Takes the entry at `at` out of the index and leaves a gap in its place; its answer is
    /// given back to be dropped once the lock is let go.
    fn remove(&mut self, at: usize) -> Option<Arc<Answer>> {
        let n = self.first + at as u64;
        let e = self.entries.get_mut(at)?;
        let answer = e.answer.take()?;
        let hash = e.key.table_hash();
        self.bytes -= e.bytes;
        self.live -= 1;
        if let Ok(found) = self.index.find_entry(hash, |&m| m == n) {
            found.remove();
        }
        Some(answer)
    }

    /// Files the entry at `at` in the index under its number.
    fn index_at(&mut self, at: usize) {
        let Some(e) = self.entries.get(at) else {
            return;
        };
        let (entries, first) = (&self.entries, self.first);
        // Growing, the index asks each number's hash again: its entry's key's.
        let rehash = |&m: &u64| {
            entries
                .get(slot(m, first))
                .map_or(0, |e| e.key.table_hash())
        };
        self.index
            .insert_unique(e.key.table_hash(), first + at as u64, rehash);
    }

    /// Drops the gaps and renumbers the entries from `first`, the index with them.
    fn compact(&mut self) {
        self.entries.retain(|e| e.answer.is_some());
        self.index.clear();
        for at in 0..self.entries.len() {
            self.index_at(at);
        }
    }
}

/// Where entry number `n` sits in a queue whose oldest is number `first`.
fn slot(n: u64, first: u64) -> usize {
    usize::try_from(n.wrapping_sub(first)).unwrap_or(usize::MAX)
}

/// The answers an insert pushed out, dropped once the lock is let go. One is the usual case
/// (a full store drops its oldest for each new answer): no allocation for it.
#[derive(Default)]
struct Evicted {
    one: Option<Arc<Answer>>,
    more: Vec<Arc<Answer>>,
}

impl Evicted {
    fn push(&mut self, answer: Arc<Answer>) {
        match self.one {
            None => self.one = Some(answer),
            Some(_) => self.more.push(answer),
        }
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (entries, bytes) = self.usage();
        f.debug_struct("MemoryStore")
            .field("entries", &entries)
            .field("bytes", &bytes)
            .field("max_entries", &self.inner.max_entries)
            .field("max_bytes", &self.inner.max_bytes)
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// The default entry bound.
    pub const DEFAULT_MAX_ENTRIES: usize = 10_000;
    /// The default byte bound.
    pub const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024;

    /// A store with the default bounds.
    pub fn new() -> Self {
        MemoryStore::with_bounds(Self::DEFAULT_MAX_ENTRIES, Self::DEFAULT_MAX_BYTES)
    }

    /// A store of at most `max_entries` answers and `max_bytes` bytes of them.
    pub fn with_bounds(max_entries: usize, max_bytes: usize) -> Self {
        MemoryStore {
            inner: Arc::new(Inner {
                max_entries,
                max_bytes,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The entries held and their bytes (expired ones not yet dropped included).
    pub fn usage(&self) -> (usize, usize) {
        let s = self.inner.lock();
        (s.live, s.bytes)
    }

    /// The answer under `key`, looked up at once (what [`CacheStore::get`] resolves to).
    pub fn lookup(&self, key: &CacheKey) -> Option<Arc<Answer>> {
        match self.look(key, false) {
            Looked::Hit(answer) => Some(answer),
            _ => None,
        }
    }

    /// Looks `key` up and, when nothing is stored under it and `join`, joins its flight in the
    /// same step: under one lock, so no answer can be stored between the miss and the join (a
    /// flight lands under that lock too, in [`store_landing`](Self::store_landing)), and a new
    /// leader needs no second look.
    pub(crate) fn look(&self, key: &CacheKey, join: bool) -> Looked {
        let miss = |s: &mut State| match join {
            true => match s.flights.join(*key) {
                Join::Lead(lead) => Looked::Lead(lead),
                Join::Wait(rx) => Looked::Wait(rx),
            },
            false => Looked::Miss,
        };
        let answer = {
            let mut s = self.inner.lock();
            let Some(at) = s.find(key) else {
                return miss(&mut s);
            };
            let entry = &s.entries[at];
            // The clock is read only for an entry found.
            match &entry.answer {
                Some(answer) if entry.expires > Instant::now() => answer.clone(),
                _ => {
                    let gone = s.remove(at);
                    let looked = miss(&mut s);
                    drop(s);
                    drop(gone);
                    return looked;
                }
            }
        };
        // An answer a miss stored unchecked is checked at its first use, outside the lock
        // (then it is marked, and this is a load): one that fails is never given out, and
        // leaves the store.
        if answer.checked().is_some() {
            return Looked::Hit(answer);
        }
        let mut s = self.inner.lock();
        let mut gone = None;
        if let Some(at) = s.find(key) {
            if s.entries[at]
                .answer
                .as_ref()
                .is_some_and(|a| Arc::ptr_eq(a, &answer))
            {
                gone = s.remove(at);
            }
        }
        let looked = miss(&mut s);
        drop(s);
        drop(gone);
        looked
    }

    /// Stores at once (what [`CacheStore::put`] does). Returns whether the answer was stored.
    pub fn insert(&self, key: &CacheKey, answer: Arc<Answer>, ttl: Duration) -> bool {
        self.store_landing(key, answer, ttl, Instant::now(), None)
    }

    /// As [`insert`](Self::insert), the time to live counted from `now`: when the answer
    /// arrived, which the layer knows without reading the clock again. A `now` in the past
    /// only makes the entry, and those it finds expired, go sooner. With `lead`, the flight it
    /// leads ends as the answer is stored, under the same lock (see [`look`](Self::look)), and
    /// its waiters are served the answer, stored or not (a waiter checks an answer stored
    /// unchecked before it is served it); the answer is copied for them only when there are
    /// waiters (a copy of a shared pointer is an atomic write, and its drop another).
    pub(crate) fn store_landing(
        &self,
        key: &CacheKey,
        answer: Arc<Answer>,
        ttl: Duration,
        now: Instant,
        lead: Option<Lead>,
    ) -> bool {
        let bytes = answer.size();
        let inner = &*self.inner;
        // Not stored: the flight still ends, its waiters served.
        let refused = |lead: Option<Lead>, answer| {
            if let Some(lead) = lead {
                lead.end(self, FlightState::Done(answer));
            }
            false
        };
        if bytes > inner.max_bytes || inner.max_entries == 0 || ttl.is_zero() {
            return refused(lead, answer);
        }
        let expires = seawall_core::instant_after(now, ttl);
        let mut s = inner.lock();
        let mut stored = s.find(key);
        if stored.is_some() && !answer.is_checked() {
            // An answer stored unchecked replaces an entry only if it passes the check, as
            // it would have had to before it was stored: a refresh (`no-cache`) that brings
            // back a tool call keeps the stored answer. Checked outside the lock; rare.
            drop(s);
            if answer.checked().is_none() {
                return refused(lead, answer);
            }
            s = inner.lock();
            stored = s.find(key);
        }
        let tx = lead.and_then(|l| s.flights.end(l));
        let for_waiters = tx.as_ref().map(|_| answer.clone());
        // What leaves the store is dropped after the lock is let go: dropping an answer
        // touches its memory (cold by then) and frees it.
        let mut gone = Evicted::default();
        if let Some(old) = stored.and_then(|at| s.remove(at)) {
            gone.push(old);
        }
        s.entries.push_back(Stored {
            key: *key,
            answer: Some(answer),
            expires,
            bytes,
        });
        s.live += 1;
        s.bytes += bytes;
        let last = s.entries.len() - 1;
        s.index_at(last);
        // Drop from the oldest: gaps, the expired, then whatever the bounds need. The oldest
        // entry is read, not looked up: it is the queue's front.
        while let Some(oldest) = s.entries.front() {
            let alive = oldest.answer.is_some() && oldest.expires > now;
            let over = s.live > inner.max_entries || s.bytes > inner.max_bytes;
            if alive && !over {
                break;
            }
            if let Some(answer) = s.remove(0) {
                gone.push(answer);
            }
            s.entries.pop_front();
            s.first += 1;
        }
        // Keys replaced many times leave gaps behind: compact when they dominate.
        if s.entries.len() > 2 * s.live + 64 {
            s.compact();
        }
        drop(s);
        drop(gone);
        if let (Some(tx), Some(answer)) = (tx, for_waiters) {
            tx.send_replace(FlightState::Done(answer));
        }
        true
    }
}

impl FlightTable for MemoryStore {
    fn with_table<R>(&self, f: impl FnOnce(&mut Table) -> R) -> R {
        f(&mut self.inner.lock().flights)
    }
}

/// What [`MemoryStore::look`] found.
pub(crate) enum Looked {
    Hit(Arc<Answer>),
    /// Nothing stored; the caller leads the key's flight.
    Lead(Lead),
    /// Nothing stored; an identical call is in flight.
    Wait(tokio::sync::watch::Receiver<FlightState>),
    /// Nothing stored (and no flight joined).
    Miss,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl CacheStore for MemoryStore {
    fn get(&self, key: &CacheKey) -> StoreFuture<Option<Arc<Answer>>> {
        let found = self.lookup(key);
        Box::pin(std::future::ready(Ok(found)))
    }

    fn put(&self, key: &CacheKey, answer: Arc<Answer>, ttl: Duration) -> StoreFuture<()> {
        self.insert(key, answer, ttl);
        Box::pin(std::future::ready(Ok(())))
    }

    fn get_now(&self, key: &CacheKey) -> Option<Result<Option<Arc<Answer>>, StoreError>> {
        Some(Ok(self.lookup(key)))
    }

    fn put_now(&self, key: &CacheKey, answer: Arc<Answer>, ttl: Duration) -> Option<Arc<Answer>> {
        self.insert(key, answer, ttl);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::Wire;
    use proptest::strategy::Strategy;
    use seawall_core::Usage;

    fn answer(text: &str) -> Arc<Answer> {
        Arc::new(Answer::new(
            Wire::OpenAiChat,
            "id",
            "m",
            0,
            text,
            "stop",
            Usage::default(),
        ))
    }

    fn key(i: u8) -> CacheKey {
        CacheKey::from_bytes([i; 32])
    }

    #[tokio::test(start_paused = true)]
    async fn an_entry_lives_for_its_ttl_and_no_longer() {
        let store = MemoryStore::new();
        store.insert(&key(1), answer("a"), Duration::from_secs(10));
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(store.lookup(&key(1)).is_some());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(store.lookup(&key(1)).is_none());
        assert_eq!(store.usage(), (0, 0));
    }

    /// A look that misses leads or waits for the key's flight; the leader's `store_landing`
    /// stores the answer and ends the flight in one step, serving the waiter; the next look is
    /// a hit.
    #[tokio::test(start_paused = true)]
    async fn a_missed_look_joins_the_flight_and_the_leaders_store_lands_it() {
        let store = MemoryStore::new();
        let ttl = Duration::from_secs(10);
        let Looked::Lead(lead) = store.look(&key(1), true) else {
            panic!("the first miss leads");
        };
        let Looked::Wait(mut rx) = store.look(&key(1), true) else {
            panic!("the second waits");
        };
        assert!(matches!(store.look(&key(1), false), Looked::Miss));
        assert!(store.store_landing(&key(1), answer("a"), ttl, Instant::now(), Some(lead)));
        rx.changed().await.unwrap();
        assert!(matches!(&*rx.borrow(), FlightState::Done(a) if a.text() == "a"));
        assert!(matches!(store.look(&key(1), true), Looked::Hit(_)));
        assert_eq!(store.with_table(|t| t.len()), 0);
        // An answer the store refuses (a zero TTL) still ends the flight, its waiters served.
        let Looked::Lead(lead) = store.look(&key(2), true) else {
            panic!("the first miss leads");
        };
        let Looked::Wait(mut rx) = store.look(&key(2), true) else {
            panic!("the second waits");
        };
        assert!(!store.store_landing(
            &key(2),
            answer("b"),
            Duration::ZERO,
            Instant::now(),
            Some(lead)
        ));
        rx.changed().await.unwrap();
        assert!(matches!(&*rx.borrow(), FlightState::Done(a) if a.text() == "b"));
        assert_eq!(store.with_table(|t| t.len()), 0);
    }

    /// Threads look up, lead, store, fail and drop flights of a few keys at once: every waiter
    /// hears how its flight ended, a key never has two leaders at once, and the flight table
    /// ends empty.
    #[test]
    fn the_stores_flight_table_never_loses_a_waiter_or_leaks_a_flight() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let store = MemoryStore::with_bounds(2, usize::MAX);
        let leading: Arc<[std::sync::atomic::AtomicBool; 3]> = Arc::new(Default::default());
        rt.block_on(async {
            let mut tasks = Vec::new();
            for t in 0..8u64 {
                let store = store.clone();
                let leading = leading.clone();
                tasks.push(tokio::spawn(async move {
                    for i in 0..2_000u64 {
                        let k = (i % 3) as usize;
                        match store.look(&key(k as u8), true) {
                            Looked::Lead(lead) => {
                                let was =
                                    leading[k].swap(true, std::sync::atomic::Ordering::SeqCst);
                                assert!(!was, "two leaders of one key at once");
                                if i % 4 == 0 {
                                    tokio::task::yield_now().await;
                                }
                                leading[k].store(false, std::sync::atomic::Ordering::SeqCst);
                                match (i * 7 + t) % 3 {
                                    0 => {
                                        let ttl = Duration::from_millis(1);
                                        store.store_landing(
                                            &key(k as u8),
                                            answer("x"),
                                            ttl,
                                            Instant::now(),
                                            Some(lead),
                                        );
                                    }
                                    1 => lead.end(&store, FlightState::Failed),
                                    _ => lead.end(&store, FlightState::Abandoned),
                                }
                            }
                            Looked::Wait(rx) => {
                                let wait = crate::flight::wait(rx);
                                let state = tokio::time::timeout(Duration::from_secs(30), wait)
                                    .await
                                    .expect("a waiter heard how its flight ended");
                                assert!(!matches!(state, FlightState::Running));
                            }
                            Looked::Hit(_) | Looked::Miss => {}
                        }
                        if i % 16 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        });
        assert_eq!(store.with_table(|t| t.len()), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_entry_bound_drops_the_oldest() {
        let store = MemoryStore::with_bounds(2, usize::MAX);
        for i in 0..3 {
            store.insert(&key(i), answer("a"), Duration::from_secs(10));
        }
        assert!(store.lookup(&key(0)).is_none());
        assert!(store.lookup(&key(1)).is_some() && store.lookup(&key(2)).is_some());
        assert_eq!(store.usage().0, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_byte_bound_drops_the_oldest_and_refuses_what_cannot_fit() {
        let one = answer(&"x".repeat(1000)).size();
        let store = MemoryStore::with_bounds(100, one * 2 + 10);
        for i in 0..3 {
            store.insert(&key(i), answer(&"x".repeat(1000)), Duration::from_secs(10));
        }
        assert!(store.lookup(&key(0)).is_none());
        assert_eq!(store.usage(), (2, one * 2));
        assert!(!store.insert(&key(9), answer(&"x".repeat(5000)), Duration::from_secs(10)));
        assert!(store.lookup(&key(9)).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn an_unchecked_answer_replaces_a_stored_one_only_if_it_passes_its_check() {
        let store = MemoryStore::new();
        let unchecked = |body: &'static str| {
            Arc::new(Answer::unchecked(
                Wire::OpenAiChat,
                bytes::Bytes::from_static(body.as_bytes()),
            ))
        };
        store.insert(&key(1), answer("a"), Duration::from_secs(10));
        assert!(!store.insert(&key(1), unchecked("{}"), Duration::from_secs(10)));
        assert_eq!(store.lookup(&key(1)).unwrap().text(), "a");
        let good = r#"{"choices":[{"message":{"content":"b"},"finish_reason":"stop"}]}"#;
        assert!(store.insert(&key(1), unchecked(good), Duration::from_secs(10)));
        assert_eq!(store.lookup(&key(1)).unwrap().text(), "b");
        // Where nothing is stored, it is stored unchecked, and checked at its first use.
        assert!(store.insert(&key(2), unchecked("{}"), Duration::from_secs(10)));
        assert!(store.lookup(&key(2)).is_none());
        assert_eq!(store.usage().0, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_oldest_entry_leaves_when_a_new_one_comes_in() {
        let store = MemoryStore::new();
        store.insert(&key(1), answer("a"), Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(2)).await;
        store.insert(&key(2), answer("b"), Duration::from_secs(10));
        assert_eq!(store.usage(), (1, answer("b").size()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_replaced_key_is_evicted_by_its_newest_place_not_its_first() {
        let store = MemoryStore::with_bounds(2, usize::MAX);
        store.insert(&key(1), answer("a"), Duration::from_secs(10));
        store.insert(&key(2), answer("b"), Duration::from_secs(10));
        store.insert(&key(1), answer("c"), Duration::from_secs(10));
        // Key 1's first entry is the oldest, but a gap: key 2 is the oldest alive.
        store.insert(&key(3), answer("d"), Duration::from_secs(10));
        assert!(store.lookup(&key(2)).is_none());
        assert_eq!(store.lookup(&key(1)).unwrap().text(), "c");
        assert!(store.lookup(&key(3)).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn replacing_a_key_counts_its_bytes_once_and_keeps_it_alive() {
        let store = MemoryStore::with_bounds(2, usize::MAX);
        for _ in 0..500 {
            store.insert(&key(1), answer("a"), Duration::from_secs(10));
        }
        store.insert(&key(2), answer("b"), Duration::from_secs(10));
        assert_eq!(store.usage(), (2, answer("a").size() * 2));
        assert!(store.lookup(&key(1)).is_some());
        assert!(store.inner.lock().entries.len() < 200);
    }

    #[tokio::test(start_paused = true)]
    async fn a_replaced_keys_old_entry_does_not_hold_back_an_expired_one_behind_it() {
        // Key 1 for long, key 2 for a second, key 1 again: the oldest in the queue is now
        // key 1's old entry, a gap. Once key 2 has expired, the next insert drops it.
        let store = MemoryStore::with_bounds(10, usize::MAX);
        store.insert(&key(1), answer("a"), Duration::from_secs(100));
        store.insert(&key(2), answer("b"), Duration::from_secs(1));
        store.insert(&key(1), answer("c"), Duration::from_secs(100));
        tokio::time::advance(Duration::from_secs(2)).await;
        store.insert(&key(3), answer("d"), Duration::from_secs(100));
        let bytes = answer("c").size() + answer("d").size();
        assert_eq!(store.usage(), (2, bytes));
        assert_eq!(store.lookup(&key(1)).unwrap().text(), "c");
        assert!(store.lookup(&key(2)).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn gaps_compacted_behind_a_long_lived_oldest_still_find_and_evict_in_order() {
        let store = MemoryStore::with_bounds(2, usize::MAX);
        store.insert(&key(1), answer("a"), Duration::from_secs(100));
        // Each replacement leaves a gap behind the live oldest: the queue compacts.
        for i in 0..300 {
            store.insert(&key(2), answer(&format!("b{i}")), Duration::from_secs(100));
        }
        assert!(store.inner.lock().entries.len() < 100);
        assert_eq!(store.lookup(&key(1)).unwrap().text(), "a");
        assert_eq!(store.lookup(&key(2)).unwrap().text(), "b299");
        store.insert(&key(3), answer("c"), Duration::from_secs(100));
        assert!(store.lookup(&key(1)).is_none());
        assert_eq!(store.lookup(&key(2)).unwrap().text(), "b299");
        assert_eq!(store.lookup(&key(3)).unwrap().text(), "c");
        let bytes = answer("b299").size() + answer("c").size();
        assert_eq!(store.usage(), (2, bytes));
    }

    /// One step of the model test.
    #[derive(Debug, Clone)]
    enum Op {
        Insert { key: usize, long: bool, ttl: u64 },
        Lookup { key: usize },
        Advance { secs: u64 },
    }

    /// One of six keys asked often, or of 300 asked now and then.
    fn any_key() -> impl Strategy<Value = usize> {
        proptest::prop_oneof![0usize..6, 0usize..300]
    }

    /// Keys in pairs sharing their first 8 bytes (the bytes the map hashes).
    fn pooled(i: usize) -> CacheKey {
        let mut k = [0; 32];
        k[..2].copy_from_slice(&((i / 2) as u16).to_le_bytes());
        k[30..].copy_from_slice(&(i as u16).to_le_bytes());
        CacheKey::from_bytes(k)
    }

    /// The same rules on a plain list, scanned whole each time.
    #[derive(Default)]
    struct Model {
        /// In the order stored: key, text, expiry, bytes, still in.
        entries: Vec<(usize, String, Instant, usize, bool)>,
    }

    impl Model {
        fn usage(&self) -> (usize, usize) {
            let live = self.entries.iter().filter(|e| e.4);
            (live.clone().count(), live.map(|e| e.3).sum())
        }
    }

    proptest::proptest! {
        /// Whatever the inserts, lookups and passing time, the store answers and counts as a
        /// plain list would: bounds drop the oldest, expired entries leave when looked up or
        /// when they are the oldest alive (gaps left by replaced keys do not hold them back),
        /// a key stored again replaces its entry. Times to live differ, as in a store shared
        /// by layers with different TTLs.
        #[test]
        fn the_store_keeps_what_a_plain_list_would(
            ops in proptest::collection::vec(
                proptest::prop_oneof![
                    (any_key(), proptest::bool::ANY, 1u64..6)
                        .prop_map(|(key, long, ttl)| Op::Insert { key, long, ttl }),
                    any_key().prop_map(|key| Op::Lookup { key }),
                    (0u64..4).prop_map(|secs| Op::Advance { secs }),
                ],
                0..200,
            ),
        ) {
            seawall_test_support::paused_runtime().block_on(async {
                let long = answer(&"x".repeat(300)).size();
                let (max_entries, max_bytes) = (3, 2 * long + 200);
                let store = MemoryStore::with_bounds(max_entries, max_bytes);
                let mut model = Model::default();
                for (step, op) in ops.into_iter().enumerate() {
                    match op {
                        Op::Insert { key, long, ttl } => {
                            let text = format!("{step}{}", if long { "x".repeat(300) } else { String::new() });
                            let a = answer(&text);
                            let bytes = a.size();
                            let now = Instant::now();
                            store.insert(&pooled(key), a, Duration::from_secs(ttl));
                            for e in model.entries.iter_mut() {
                                if e.0 == key {
                                    e.4 = false;
                                }
                            }
                            let expires = seawall_core::instant_after(now, Duration::from_secs(ttl));
                            model.entries.push((key, text, expires, bytes, true));
                            loop {
                                while model.entries.first().is_some_and(|e| !e.4) {
                                    model.entries.remove(0);
                                }
                                let (n, b) = model.usage();
                                match model.entries.first_mut() {
                                    Some(e) if n > max_entries || b > max_bytes || e.2 <= now => e.4 = false,
                                    _ => break,
                                }
                            }
                        }
                        Op::Lookup { key } => {
                            let now = Instant::now();
                            let want = match model.entries.iter_mut().find(|e| e.4 && e.0 == key) {
                                Some(e) if e.2 > now => Some(e.1.clone()),
                                Some(e) => {
                                    e.4 = false;
                                    None
                                }
                                None => None,
                            };
                            let got = store.lookup(&pooled(key)).map(|a| a.text().to_owned());
                            proptest::prop_assert_eq!(got, want);
                        }
                        Op::Advance { secs } => tokio::time::advance(Duration::from_secs(secs)).await,
                    }
                    proptest::prop_assert_eq!(store.usage(), model.usage());
                }
                Ok(())
            })?;
        }
    }
}
