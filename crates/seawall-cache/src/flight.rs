//! Single flight: identical requests in flight at once share one upstream call.
//!
//! The first caller of a key that misses the store becomes the flight's *leader* and makes the
//! call; the callers of the same key that come while it runs *wait* for it. How a flight ends
//! decides what the waiters do:
//!
//! - **done**: the leader's answer was complete and stored; every waiter is served it, as a
//!   hit. The flight stays in the table, already done, until the store has the answer, so a
//!   caller arriving meanwhile is served at once too;
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
//! stored); the leader's guard removes it whatever happens, in `Drop` if it must.

use std::collections::HashMap;
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

type Flight = Arc<watch::Sender<FlightState>>;

/// The flights in progress, by key.
#[derive(Debug, Default)]
pub(crate) struct Flights {
    table: Mutex<HashMap<CacheKey, Flight, KeyHash>>,
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
    fn lock(&self) -> MutexGuard<'_, HashMap<CacheKey, Flight, KeyHash>> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leads the flight of `key`, or waits for the one in progress.
    pub(crate) fn join(self: &Arc<Self>, key: CacheKey) -> Join {
        let mut table = self.lock();
        if let Some(flight) = table.get(&key) {
            return Join::Wait(flight.subscribe());
        }
        let flight: Flight = Arc::new(watch::Sender::new(FlightState::Running));
        table.insert(key, flight.clone());
        Join::Lead(Lead {
            flights: self.clone(),
            key,
            flight: Some(flight),
        })
    }

    /// The number of flights in the table.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Removes `flight` from the table if it is still the one under `key`.
    fn remove(&self, key: &CacheKey, flight: &Flight) {
        let mut table = self.lock();
        if table.get(key).is_some_and(|f| Arc::ptr_eq(f, flight)) {
            table.remove(key);
        }
    }
}

/// The leader's guard: ends the flight as done, failed, or (when dropped) abandoned.
#[derive(Debug)]
pub(crate) struct Lead {
    flights: Arc<Flights>,
    key: CacheKey,
    flight: Option<Flight>,
}

impl Lead {
    /// The answer is complete: serves the waiters. The flight stays in the table (done) until
    /// the returned guard is dropped, once the store has the answer.
    pub(crate) fn done(mut self, answer: Arc<Answer>) -> Landing {
        let flight = self.flight.take();
        if let Some(f) = &flight {
            f.send_replace(FlightState::Done(answer));
        }
        Landing {
            flights: self.flights.clone(),
            key: self.key,
            flight,
        }
    }

    /// The semantic cache answered: the waiters are served the same answer, with its score.
    pub(crate) fn similar(mut self, answer: Arc<Answer>, score: f32) {
        self.end(FlightState::Similar(answer, score));
    }

    /// The call failed or its answer is not cacheable: the waiters make their own calls.
    pub(crate) fn failed(mut self) {
        self.end(FlightState::Failed);
    }

    fn end(&mut self, state: FlightState) {
        if let Some(flight) = self.flight.take() {
            // Out of the table first: a waiter woken by the news must not find it again.
            self.flights.remove(&self.key, &flight);
            flight.send_replace(state);
        }
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        self.end(FlightState::Abandoned);
    }
}

/// Keeps a done flight in the table until the answer is in the store.
#[derive(Debug)]
pub(crate) struct Landing {
    flights: Arc<Flights>,
    key: CacheKey,
    flight: Option<Flight>,
}

impl Drop for Landing {
    fn drop(&mut self) {
        if let Some(flight) = self.flight.take() {
            self.flights.remove(&self.key, &flight);
        }
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
                                0 => drop(lead.done(answer.clone())),
                                1 => lead.failed(),
                                _ => drop(lead),
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
    fn a_done_flight_stays_until_it_lands() {
        let flights = Arc::new(Flights::default());
        let key = CacheKey::from_bytes([1; 32]);
        let Join::Lead(lead) = flights.join(key) else {
            panic!("the first caller leads");
        };
        let landing = lead.done(answer());
        let Join::Wait(rx) = flights.join(key) else {
            panic!("a caller during landing waits");
        };
        assert!(matches!(*rx.borrow(), FlightState::Done(_)));
        drop(landing);
        assert!(matches!(flights.join(key), Join::Lead(_)));
    }
}
