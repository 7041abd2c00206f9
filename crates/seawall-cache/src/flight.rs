//! Single flight: identical requests in flight at once share one upstream call.
//!
//! The first caller of a key that misses the store becomes the flight's *leader* and makes the
//! call; the callers of the same key that come while it runs *wait* for it. How a flight ends
//! decides what the waiters do:
//!
//! - **done**: the leader's answer was complete and stored; every waiter is served it, as a
//!   hit. The flight stays in the table, already done, until the store has the answer, so a
//!   caller arriving meanwhile is served at once too (a store that stores at once, the
//!   in-memory one, has it first, and the flight then ends and lands in one step). An answer
//!   the in-memory store took unchecked is checked by a waiter before it is served; one that
//!   fails makes the waiters call on their own, as a failed flight does;
//! - **abandoned**: the leader went away (its future or its body dropped) before the answer
//!   was complete. The waiters join again: the first becomes the new leader, the rest wait
//!   for it. Nothing hangs and nobody pays for the dropped call twice;
//! - **failed**: the leader's call failed or its answer was not cacheable. A failure is never
//!   shared: each waiter makes its own call, without a flight (it may succeed where the leader
//!   failed: another attempt, another fallback). Serialising them behind new leaders instead
//!   would make the last of N waiters wait N calls long when the failure repeats; the layers
//!   inside the cache (breaker, gate, budget) are what protect the upstream from that burst.
//!
//! Each waiter waits in its own future on a `watch` channel: dropping it leaves nothing
//! behind. The table holds a flight only while it runs (and, done, until its answer is
//! stored); the leader ends it whatever happens. A [`Lead`] is ended through the table, which
//! its holder passes in: the call's pending state, the only holder, keeps the layer's shared
//! state (and so the table) anyway and ends its lead in `Drop` if nothing else did, so the
//! lead needs no shared pointer of its own (an atomic write to copy, another to drop).
//!
//! Where the table is kept ([`FlightTable`]):
//!
//! - **in the in-memory store**, under the store's own lock. A lookup that misses joins the
//!   key's flight in the same step, and a leader stores its answer and ends its flight in one
//!   step too, so no answer can land between a caller's miss and its join, and a miss takes
//!   the lock twice in all (look and join; store and land) instead of four times;
//! - **beside a remote store** ([`Flights`]), whose lookups and writes are its own: the table
//!   counts the flights that landed, so a new leader can tell whether an answer may have been
//!   stored since it looked the store up (and only then looks again).
//!
//! What a flight costs when nobody waits (the common miss) is kept small: an entry in the
//! table, no allocation; the channel is made by the first waiter.

use std::collections::HashMap;
use std::collections::hash_map::Entry as Slot;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::answer::Answer;
use crate::key::{CacheKey, KeyHash};

/// How a flight stands.
#[derive(Debug, Clone)]
pub(crate) enum FlightState {
    Running,
    Done(Arc<Answer>),
    /// The leader was served a stored answer to a prompt close in meaning, with its score.
    Similar(Arc<Answer>, f32),
    Failed,
    Abandoned,
}

/// A flight in the table.
#[derive(Debug)]
struct Flight {
    /// Tells this flight from a later one of the same key.
    id: u64,
    /// `Running`, or `Done` while it lands.
    state: FlightState,
    /// The waiters' channel, made when the first one comes.
    tx: Option<watch::Sender<FlightState>>,
}

/// The flights of one table, by key: kept under a lock of their own ([`Flights`], beside a
/// remote store) or under the in-memory store's (see [`FlightTable`]).
#[derive(Debug, Default)]
pub(crate) struct Table {
    flights: HashMap<CacheKey, Flight, KeyHash>,
    next_id: u64,
}

impl Table {
    /// Leads the flight of `key`, or waits for the one in progress.
    pub(crate) fn join(&mut self, key: CacheKey) -> Join {
        match self.flights.entry(key) {
            Slot::Occupied(slot) => {
                let flight = slot.into_mut();
                let tx = flight
                    .tx
                    .get_or_insert_with(|| watch::Sender::new(flight.state.clone()));
                Join::Wait(tx.subscribe())
            }
            Slot::Vacant(slot) => {
                self.next_id += 1;
                slot.insert(Flight {
                    id: self.next_id,
                    state: FlightState::Running,
                    tx: None,
                });
                Join::Lead(Lead {
                    key,
                    id: self.next_id,
                })
            }
        }
    }

    /// Ends `lead`'s flight: out of the table, with the channel of its waiters, if any, to tell
    /// them how it ended (outside the lock, which no waker must ever find held).
    pub(crate) fn end(&mut self, mut lead: Lead) -> Option<watch::Sender<FlightState>> {
        let id = std::mem::take(&mut lead.id);
        match self.flights.entry(lead.key) {
            Slot::Occupied(slot) if slot.get().id == id => slot.remove().tx,
            _ => None,
        }
    }

    /// The number of flights in the table.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.flights.len()
    }
}

/// Where a flight table is kept, locked for `f`.
pub(crate) trait FlightTable {
    fn with_table<R>(&self, f: impl FnOnce(&mut Table) -> R) -> R;
}

impl<T: FlightTable> FlightTable for Arc<T> {
    fn with_table<R>(&self, f: impl FnOnce(&mut Table) -> R) -> R {
        (**self).with_table(f)
    }
}

/// The flights in progress beside a remote store, by key, under a lock of their own, and how
/// many have landed (see [`landed_since`](Self::landed_since)).
#[derive(Debug, Default)]
pub(crate) struct Flights {
    table: Mutex<Table>,
    /// How many flights have landed: stored their answer and left the table.
    landed: AtomicU64,
}

impl FlightTable for Flights {
    fn with_table<R>(&self, f: impl FnOnce(&mut Table) -> R) -> R {
        f(&mut self.lock())
    }
}

/// What a caller of a key that missed does.
#[derive(Debug)]
pub(crate) enum Join {
    /// Make the call; the guard ends the flight.
    Lead(Lead),
    /// Wait for the leader.
    Wait(watch::Receiver<FlightState>),
}

impl Flights {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many flights have landed so far; read before a store lookup, it tells a leader
    /// later whether an answer may have been stored since ([`landed_since`](Self::landed_since)).
    pub(crate) fn landed(&self) -> u64 {
        self.landed.load(Ordering::SeqCst)
    }

    /// Whether a flight has landed since `seen` (a [`landed`](Self::landed) read before a
    /// new leader looked the store up): then an answer may have been stored after that
    /// lookup, and the store is worth another look. (A flight that landed after the leader's
    /// began counts too: a needless look, never a missed one.)
    pub(crate) fn landed_since(&self, seen: u64) -> bool {
        self.landed() != seen
    }

    /// Counts a flight that landed, under the table's lock (`_table` is its guard).
    ///
    /// Every count is made under the lock, so a load and a store count exactly, without a
    /// read-modify-write (an atomic instruction, a few nanoseconds even uncontended). The
    /// reader that must see the count, a leader right after it joined, took the same lock
    /// after it; an earlier read may see an older count, which costs only a second look.
    fn count_landing(&self, _table: &MutexGuard<'_, Table>) {
        let landed = self.landed.load(Ordering::Relaxed);
        self.landed.store(landed + 1, Ordering::Release);
    }

    /// Leads the flight of `key`, or waits for the one in progress.
    pub(crate) fn join(&self, key: CacheKey) -> Join {
        self.lock().join(key)
    }

    /// The number of flights in the table.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// The leader's part: ends the flight (in the table its holder passes) as done, failed,
/// similar or abandoned. Every way of ending it takes it by value; its holder must end
/// it, in its own `Drop` if nothing else did (see the module docs).
#[derive(Debug)]
#[must_use = "a flight that is not ended keeps its waiters waiting"]
pub(crate) struct Lead {
    key: CacheKey,
    id: u64,
}

impl Lead {
    /// The answer is complete: serves the waiters. The flight stays in the table (done) until
    /// the returned guard is dropped, once the store has the answer.
    ///
    /// For a remote store, whose write may take a while; the in-memory store stores and lands
    /// in one step (`MemoryStore::store_landing`).
    pub(crate) fn done(mut self, flights: &Arc<Flights>, answer: Arc<Answer>) -> Landing {
        let id = std::mem::take(&mut self.id);
        let mut table = flights.lock();
        let tx = match table.flights.get_mut(&self.key).filter(|f| f.id == id) {
            Some(flight) => {
                flight.state = FlightState::Done(answer.clone());
                // The waiters so far hear it on their channel (outside the lock, which no
                // waker must ever find held); later ones get a new one, already done.
                flight.tx.take()
            }
            None => None,
        };
        drop(table);
        if let Some(tx) = tx {
            tx.send_replace(FlightState::Done(answer));
        }
        Landing {
            flights: flights.clone(),
            key: self.key,
            id,
        }
    }

    /// Ends the flight as `state`: out of the table first (a waiter woken by the news must not
    /// find it again), then the waiters told.
    pub(crate) fn end(self, table: &impl FlightTable, state: FlightState) {
        if let Some(tx) = table.with_table(|t| t.end(self)) {
            tx.send_replace(state);
        }
    }
}

/// A lead is ended by value, which zeroes its id (flight ids start at 1). One dropped with its
/// flight still running would keep the flight's waiters waiting: tests fail on it.
impl Drop for Lead {
    fn drop(&mut self) {
        debug_assert_eq!(self.id, 0, "a lead was dropped without ending its flight");
    }
}

/// Keeps a done flight in the table until the answer is in the store.
#[derive(Debug)]
pub(crate) struct Landing {
    flights: Arc<Flights>,
    key: CacheKey,
    id: u64,
}

impl Drop for Landing {
    fn drop(&mut self) {
        let flights = &self.flights;
        let mut table = flights.lock();
        if let Slot::Occupied(slot) = table.flights.entry(self.key) {
            if slot.get().id == self.id {
                slot.remove();
            }
        }
        // After the store has the answer: a leader that joins after this sees the count moved
        // (see `Flights::landed_since`).
        flights.count_landing(&table);
    }
}

/// Waits for a flight to end.
pub(crate) async fn wait(mut rx: watch::Receiver<FlightState>) -> FlightState {
    match rx.wait_for(|s| !matches!(s, FlightState::Running)).await {
        Ok(state) => state.clone(),
        // The leader's guard always says how it ended; a closed channel without news would
        // be a leader that never ran its `Drop`: treat it as gone.
        Err(_) => FlightState::Abandoned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::Wire;
    use seawall_core::Usage;

    fn answer() -> Arc<Answer> {
        Arc::new(Answer::new(
            Wire::OpenAiChat,
            "id",
            "m",
            0,
            "hi",
            "stop",
            Usage::default(),
        ))
    }

    /// Many threads join, lead, finish, fail and drop flights of a few keys at random; every
    /// waiter learns how its flight ended, and the table ends empty.
    #[test]
    fn the_flight_table_never_loses_a_waiter_or_leaks_a_flight() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let flights = Arc::new(Flights::default());
        let answer = answer();
        rt.block_on(async {
            let mut tasks = Vec::new();
            for t in 0..8u64 {
                let flights = flights.clone();
                let answer = answer.clone();
                tasks.push(tokio::spawn(async move {
                    let mut ended = 0u32;
                    for i in 0..2_000u64 {
                        let key = CacheKey::from_bytes([(i % 3) as u8; 32]);
                        match flights.join(key) {
                            Join::Lead(lead) => match (i * 7 + t) % 3 {
                                0 => drop(lead.done(&flights, answer.clone())),
                                1 => lead.end(&flights, FlightState::Failed),
                                _ => lead.end(&flights, FlightState::Abandoned),
                            },
                            Join::Wait(rx) => {
                                // Every flight ends; a waiter never waits forever.
                                let state = tokio::time::timeout(
                                    std::time::Duration::from_secs(30),
                                    wait(rx),
                                )
                                .await
                                .expect("a waiter heard how its flight ended");
                                assert!(!matches!(state, FlightState::Running));
                                ended += 1;
                            }
                        }
                        if i % 16 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                    ended
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        });
        assert_eq!(flights.len(), 0);
    }

    #[test]
    fn a_leader_knows_whether_a_flight_landed_since_its_lookup() {
        let flights = Arc::new(Flights::default());
        let (a, b) = (CacheKey::from_bytes([1; 32]), CacheKey::from_bytes([2; 32]));
        // Nothing landed between the lookup and the join: no second look needed.
        let seen = flights.landed();
        let Join::Lead(lead) = flights.join(a) else {
            panic!("the first caller leads");
        };
        assert!(!flights.landed_since(seen));
        // A failed or abandoned flight stores nothing: still no need.
        lead.end(&flights, FlightState::Failed);
        let Join::Lead(lead) = flights.join(a) else {
            panic!("a failed flight left the table");
        };
        lead.end(&flights, FlightState::Abandoned);
        let Join::Lead(lead) = flights.join(a) else {
            panic!("an abandoned flight left the table");
        };
        assert!(!flights.landed_since(seen));
        lead.end(&flights, FlightState::Abandoned);
        // A flight that landed after the lookup (its answer stored) makes the leader look again.
        let Join::Lead(other) = flights.join(b) else {
            panic!("the first caller leads");
        };
        drop(other.done(&flights, answer()));
        let Join::Lead(lead) = flights.join(a) else {
            panic!("the first caller leads");
        };
        assert!(flights.landed_since(seen));
        assert!(!flights.landed_since(flights.landed()));
        lead.end(&flights, FlightState::Abandoned);
    }

    #[test]
    fn a_waiter_that_comes_first_gets_a_channel_and_hears_the_end() {
        let flights = Arc::new(Flights::default());
        let key = CacheKey::from_bytes([3; 32]);
        let Join::Lead(lead) = flights.join(key) else {
            panic!("the first caller leads");
        };
        let Join::Wait(early) = flights.join(key) else {
            panic!("the second caller waits");
        };
        assert!(matches!(*early.borrow(), FlightState::Running));
        lead.end(&flights, FlightState::Failed);
        assert!(matches!(*early.borrow(), FlightState::Failed));
        assert_eq!(flights.len(), 0);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "without ending its flight")]
    fn a_lead_dropped_without_ending_its_flight_fails_a_test_build() {
        let flights = Flights::default();
        let Join::Lead(lead) = flights.join(CacheKey::from_bytes([4; 32])) else {
            panic!("the first caller leads");
        };
        drop(lead);
    }

    #[test]
    fn a_done_flight_stays_until_it_lands() {
        let flights = Arc::new(Flights::default());
        let key = CacheKey::from_bytes([1; 32]);
        let Join::Lead(lead) = flights.join(key) else {
            panic!("the first caller leads");
        };
        let landing = lead.done(&flights, answer());
        let Join::Wait(rx) = flights.join(key) else {
            panic!("a caller during landing waits");
        };
        assert!(matches!(*rx.borrow(), FlightState::Done(_)));
        drop(landing);
        let Join::Lead(lead) = flights.join(key) else {
            panic!("a landed flight left the table");
        };
        lead.end(&flights, FlightState::Abandoned);
    }
}
