//! The in-process share a replica enforces while Redis cannot be reached (fail open), and the
//! pauses it has learned, which it checks before asking Redis at all.
//!
//! While degraded, each replica admits at most `1 / replicas` of every limit on its own: the
//! rates are divided (rounded down; a positive rate never below one unit a minute, a burst
//! never below one) and so are the permits (rounded down, never below one, so every replica
//! keeps serving). The buckets are the gate's own [`Bucket`]s, so the share counts exactly as
//! the gate does; they run on the fleet's [`Clock`](super::Clock), its milliseconds mapped
//! onto instants, so tests move both the shared and the local state with one clock.
//!
//! The table is bounded like the gate's: at most `max_keys` keys have a share of their own;
//! beyond that, new keys share one overflow entry (paced together rather than refused).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use seawall_gate::{Bucket, Cost, Limit, Ready};
use tokio::time::Instant;

use super::keys::Target;

#[derive(Debug, Default)]
struct Share {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    in_flight: u32,
    /// Paused until (clock ms); 0: not paused.
    paused_until: u64,
}

/// Per-key shares and learned pauses.
#[derive(Debug)]
pub(crate) struct Local {
    shares: Mutex<HashMap<Option<Arc<str>>, Share>>,
    max_keys: usize,
    /// The instant the clock's `base_ms` maps to.
    base: Instant,
    base_ms: u64,
}

/// What the in-process share answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalAnswer {
    Admitted,
    /// The share's rates admit the call after this long.
    Wait(Duration),
    /// Every permit of the share is held: one comes back when a call ends.
    Busy,
    Never,
}

fn share(limit: Limit, replicas: NonZeroU32) -> Limit {
    let n = u64::from(replicas.get());
    let per_minute = match limit.units_per_minute() {
        0 => 0,
        pm => (pm / n).max(1),
    };
    Limit::per_minute(per_minute).with_burst((limit.burst() / n).max(1))
}

impl Local {
    pub(crate) fn new(max_keys: usize, now_ms: u64) -> Self {
        Local {
            shares: Mutex::new(HashMap::new()),
            max_keys,
            base: Instant::now(),
            base_ms: now_ms,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Option<Arc<str>>, Share>> {
        self.shares.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn instant(&self, now_ms: u64) -> Instant {
        self.base + Duration::from_millis(now_ms.saturating_sub(self.base_ms))
    }

    /// The share of `name`, or the overflow share when the table is full.
    fn with<T>(&self, name: &Option<Arc<str>>, now_ms: u64, f: impl FnOnce(&mut Share) -> T) -> T {
        let mut map = self.lock();
        if !map.contains_key(name) && map.len() >= self.max_keys {
            // Forget what carries nothing: no call, no pause, full buckets.
            let at = self.instant(now_ms);
            map.retain(|_, s| {
                s.in_flight > 0
                    || s.paused_until > now_ms
                    || !s.requests.as_mut().is_none_or(|b| b.is_full(at))
                    || !s.tokens.as_mut().is_none_or(|b| b.is_full(at))
            });
        }
        let key = if map.contains_key(name) || map.len() < self.max_keys {
            name.clone()
        } else {
            None
        };
        f(map.entry(key).or_default())
    }

    /// How long the pause this replica knows of for the key has left, if any.
    pub(crate) fn pause_left(&self, target: &Target, now_ms: u64) -> Option<Duration> {
        let map = self.lock();
        let until = map.get(&target.name).map_or(0, |s| s.paused_until);
        (until > now_ms).then(|| Duration::from_millis(until - now_ms))
    }

    /// Remembers a pause until `until_ms` (a later pause wins).
    pub(crate) fn pause(&self, target: &Target, now_ms: u64, until_ms: u64) {
        self.with(&target.name, now_ms, |s| {
            s.paused_until = s.paused_until.max(until_ms)
        });
    }

    /// Admits a call under the key's share of the limits, taking from it, or says how long
    /// until it could. (The caller has checked the key's pause.)
    pub(crate) fn try_admit(
        &self,
        target: &Target,
        cost: Cost,
        now_ms: u64,
        replicas: NonZeroU32,
    ) -> LocalAnswer {
        let now = self.instant(now_ms);
        self.with(&target.name, now_ms, |s| {
            let rates = target.rates;
            let fit = |slot: &mut Option<Bucket>, limit: Option<Limit>| match limit {
                None => *slot = None,
                Some(l) => {
                    slot.get_or_insert_with(|| Bucket::new(share(l, replicas), now));
                }
            };
            fit(&mut s.requests, rates.requests());
            fit(&mut s.tokens, rates.tokens());
            let mut ready = Ready::Now;
            if let Some(b) = s.requests.as_mut() {
                ready = ready.max(b.ready(1, now));
            }
            if let Some(b) = s.tokens.as_mut() {
                ready = ready.max(b.ready(cost.tokens(), now));
            }
            match ready {
                Ready::Never => return LocalAnswer::Never,
                Ready::After(d) => return LocalAnswer::Wait(d),
                Ready::Now => {}
            }
            if let Some(p) = target.permits {
                let mine = (p / replicas.get()).max(1);
                if p == 0 {
                    return LocalAnswer::Never;
                }
                if s.in_flight >= mine {
                    return LocalAnswer::Busy;
                }
            }
            if let Some(b) = s.requests.as_mut() {
                b.take(1);
            }
            if let Some(b) = s.tokens.as_mut() {
                b.take(cost.tokens());
            }
            s.in_flight += 1;
            LocalAnswer::Admitted
        })
    }

    /// Ends a call admitted by the share: its permit goes back, its tokens settle.
    pub(crate) fn release(&self, target: &Target, cost: Cost, used: u64, now_ms: u64) {
        let now = self.instant(now_ms);
        self.with(&target.name, now_ms, |s| {
            s.in_flight = s.in_flight.saturating_sub(1);
            if let Some(b) = s.tokens.as_mut() {
                let reserved = cost.tokens();
                if used > reserved {
                    b.take(used - reserved);
                } else {
                    b.give_back(reserved - used, now);
                }
            }
        });
    }
}
