//! Per-key state: rate buckets, the upstream's pause, and the key's waiting line.
//!
//! A request's key comes from the gate's [`KeyFn`](seawall_core::KeyFn)
//! ([`StateKey`](seawall_core::StateKey) by default); requests without one share the unkeyed
//! state. Keys come from clients (the model name of a request body), so the table is bounded
//! by the operator, not by them: keys are cut to [`MAX_KEY_LEN`](seawall_core::MAX_KEY_LEN) bytes by
//! [`bound_key`], and at most [`ConcurrencyGateBuilder::max_keys`](crate::ConcurrencyGateBuilder::max_keys) keys
//! have a state of their own. At the cap a new key forgets every state that carries nothing
//! (no call holds it, no pause, full rate buckets: a fresh state would start the same). A
//! paused key, or one whose rate buckets are in debt, is never forgotten, so a flood of new
//! keys cannot lift the upstream's pause or reset a rate limit. When nothing can be forgotten,
//! new keys share the unkeyed state rather than being refused: they are still paced and
//! paused together, and the table scan is skipped for a second after a sweep that freed
//! nothing, so a flood costs one lookup per call.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use seawall_core::{LlmRequest, PartEstimate, RequestSizes, Usage, bound_key};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::lanes::{LANES, Lane};
use crate::rate::{Bucket, Rates, Ready};

/// What one call costs in the rate buckets: its estimated tokens, as the gate prices them.
///
/// Public so that a limiter elsewhere (the fleet-wide limits of `seawall-redis`) charges a
/// request exactly what the gate charges it, and settles it the same way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    /// Estimated input plus maximum output tokens.
    pub(crate) tokens: u64,
    /// The input part of `tokens`.
    pub(crate) input: u64,
}

/// The output tokens charged to a request that sets no maximum: the most one can set.
const UNBOUNDED_OUTPUT: u64 = u32::MAX as u64;

impl Cost {
    /// The cost of `req`: its prompt's text estimate, each image, audio part and file at
    /// `parts`, plus its maximum output times the answers it asks for. A request without a
    /// maximum output is charged `u32::MAX` output tokens (see [`Rates`]).
    ///
    /// ```
    /// use seawall_core::PartEstimate;
    /// use seawall_gate::Cost;
    /// let req = http::Request::post("https://api.openai.com/v1/chat/completions")
    ///     .body(bytes::Bytes::from_static(br#"{"model":"m","max_tokens":64,"n":2,"messages":[]}"#))
    ///     .unwrap();
    /// let mut req = req;
    /// seawall_core::LlmRequest::prepare(&mut req);
    /// let cost = Cost::of(&req, &PartEstimate::DEFAULT);
    /// assert_eq!(cost.tokens() - cost.input(), 128);
    /// ```
    pub fn of<R: LlmRequest + ?Sized>(req: &R, parts: &PartEstimate) -> Cost {
        // The sizes in one look, not one per method.
        Cost::of_sizes(&req.sizes(), parts)
    }

    /// [`of`](Self::of), from the request's sizes already read.
    pub(crate) fn of_sizes(sizes: &RequestSizes, parts: &PartEstimate) -> Cost {
        let input = sizes.input_tokens(parts);
        // Output without a maximum may be anything: charged as the most a request can ask
        // for, it waits for a full bucket and holds the key until its usage is known.
        let output = sizes.max_billed_output_tokens().unwrap_or(UNBOUNDED_OUTPUT);
        Cost {
            tokens: input.saturating_add(output),
            input,
        }
    }

    /// The tokens charged at admission: estimated input plus maximum output.
    pub const fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The input part of [`tokens`](Self::tokens).
    pub const fn input(&self) -> u64 {
        self.input
    }

    /// The tokens the call finally counts for: the reported usage, or, without one (a call
    /// failed, dropped, or not reported), the input estimate alone. Keeping a `max_tokens` of
    /// billions charged would lock the key for good after one disconnect.
    pub fn used(&self, usage: Option<Usage>) -> u64 {
        usage.map_or(self.input, |u| u.total())
    }
}

#[derive(Debug, Default)]
struct Buckets {
    version: u64,
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

fn refit(slot: &mut Option<Bucket>, limit: Option<crate::rate::Limit>, now: Instant) {
    match (slot.as_mut(), limit) {
        (_, None) => *slot = None,
        (Some(b), Some(l)) => b.set_limit(l, now),
        (None, Some(l)) => *slot = Some(Bucket::new(l, now)),
    }
}

/// The state of one key.
pub(crate) struct KeyState {
    name: Option<Arc<str>>,
    /// Nanoseconds after the gate's epoch until which the upstream asked us to wait; 0: none.
    paused_until: AtomicU64,
    /// Whether the key has a rate limit (so admissions go through its line).
    limited: AtomicBool,
    /// The config version the buckets were fitted to; `u64::MAX` before the first fit.
    version: AtomicU64,
    /// A FIFO line of one per lane: the head waits for the key's rate and pause, the rest
    /// wait behind (a gate without lanes uses the first alone).
    pub(crate) lines: [Semaphore; LANES],
    /// The calls in each lane's line and the tokens they will take: what a newcomer waits
    /// behind, for a call with a standby to know its wait before it joins.
    in_line: [(AtomicU64, AtomicU64); LANES],
    buckets: Mutex<Buckets>,
}

/// A call counted in its key's line until it is dropped ([`KeyState::join_line`]).
pub(crate) struct InLine<'a> {
    key: &'a KeyState,
    lane: usize,
    tokens: u64,
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        let (calls, tokens) = &self.key.in_line[self.lane];
        calls.fetch_sub(1, Ordering::AcqRel);
        tokens.fetch_sub(self.tokens, Ordering::AcqRel);
    }
}

impl fmt::Debug for KeyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyState")
            .field("name", &self.name)
            .field("limited", &self.limited.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl KeyState {
    fn new(name: Option<Arc<str>>) -> Self {
        KeyState {
            name,
            paused_until: AtomicU64::new(0),
            limited: AtomicBool::new(false),
            version: AtomicU64::new(u64::MAX),
            lines: std::array::from_fn(|_| Semaphore::new(1)),
            in_line: Default::default(),
            buckets: Mutex::new(Buckets::default()),
        }
    }

    pub(crate) fn name(&self) -> Option<&Arc<str>> {
        self.name.as_ref()
    }

    fn lock(&self) -> MutexGuard<'_, Buckets> {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether admissions must queue in the key's line: it is rate limited or paused.
    pub(crate) fn needs_line(&self, clock: &Clock, now: Instant) -> bool {
        self.limited.load(Ordering::Acquire) || self.pause_left(clock, now).is_some()
    }

    /// The time left on the upstream's pause, if any.
    pub(crate) fn pause_left(&self, clock: &Clock, now: Instant) -> Option<Duration> {
        let until = self.paused_until.load(Ordering::Acquire);
        // Never paused: no clock arithmetic (the common case, on every admission).
        if until == 0 {
            return None;
        }
        let now = clock.nanos(now);
        (until > now).then(|| Duration::from_nanos(until - now))
    }

    /// Pauses admissions until `now + d` (a later pause wins).
    pub(crate) fn pause(&self, clock: &Clock, now: Instant, d: Duration) {
        let until = clock
            .nanos(now)
            .saturating_add(d.as_nanos().min(u64::MAX as u128) as u64);
        self.paused_until.fetch_max(until, Ordering::AcqRel);
    }

    /// When the key can admit `cost` for `lane`: after the pause, and once every bucket holds
    /// it above the part the lane must leave to the others.
    pub(crate) fn ready(&self, clock: &Clock, cost: Cost, lane: Lane, now: Instant) -> Ready {
        self.ready_after(clock, cost, lane, now, [0, 0])
    }

    /// [`ready`](Self::ready) once the buckets have also refilled `ahead`: requests and tokens
    /// that calls before this one will take first.
    fn ready_after(&self, clock: &Clock, cost: Cost, lane: Lane, now: Instant, ahead: [u64; 2]) -> Ready {
        let pause = match self.pause_left(clock, now) {
            Some(d) => Ready::After(d),
            None => Ready::Now,
        };
        if !self.limited.load(Ordering::Acquire) {
            return pause;
        }
        let mut b = self.lock();
        let mut ready = pause;
        if let Some(r) = b.requests.as_mut() {
            ready = ready.max(r.ready_behind(ahead[0], 1, lane.keep, now));
        }
        if let Some(t) = b.tokens.as_mut() {
            ready = ready.max(t.ready_behind(ahead[1], cost.tokens, lane.keep, now));
        }
        ready
    }

    /// Counts a call of `cost` in `lane`'s line until the guard is dropped.
    pub(crate) fn join_line(&self, cost: Cost, lane: Lane) -> InLine<'_> {
        let (calls, tokens) = &self.in_line[lane.index];
        calls.fetch_add(1, Ordering::AcqRel);
        tokens.fetch_add(cost.tokens, Ordering::AcqRel);
        InLine {
            key: self,
            lane: lane.index,
            tokens: cost.tokens,
        }
    }

    /// When the key could admit `cost` for `lane` after the calls already in its line: as
    /// [`ready`](Self::ready), with the buckets refilling what those calls take first. An
    /// estimate: a call ahead may leave, or the upstream may pause the key meanwhile.
    pub(crate) fn ready_behind(&self, clock: &Clock, cost: Cost, lane: Lane, now: Instant) -> Ready {
        let (calls, tokens) = &self.in_line[lane.index];
        let ahead = [calls.load(Ordering::Acquire), tokens.load(Ordering::Acquire)];
        self.ready_after(clock, cost, lane, now, ahead)
    }

    /// Admits `cost` for `lane` now if the key allows it, taking it from the buckets.
    pub(crate) fn try_commit(&self, clock: &Clock, cost: Cost, lane: Lane, now: Instant) -> bool {
        if self.pause_left(clock, now).is_some() {
            return false;
        }
        if !self.limited.load(Ordering::Acquire) {
            return true;
        }
        let mut b = self.lock();
        let ok = b
            .requests
            .as_mut()
            .is_none_or(|r| r.ready_keeping(1, lane.keep, now) == Ready::Now)
            && b.tokens
                .as_mut()
                .is_none_or(|t| t.ready_keeping(cost.tokens, lane.keep, now) == Ready::Now);
        if ok {
            if let Some(r) = b.requests.as_mut() {
                r.take(1);
            }
            if let Some(t) = b.tokens.as_mut() {
                t.take(cost.tokens);
            }
        }
        ok
    }

    /// Settles a token reservation against what the call really used.
    pub(crate) fn settle_tokens(&self, reserved: u64, used: u64) {
        if reserved == used || !self.limited.load(Ordering::Acquire) {
            return;
        }
        // The clock is read only for a key with rates to settle.
        let now = Instant::now();
        let mut b = self.lock();
        if let Some(t) = b.tokens.as_mut() {
            if used > reserved {
                t.take(used - reserved);
            } else {
                t.give_back(reserved - used, now);
            }
        }
    }

    /// Whether forgetting this state loses nothing (no pause, full buckets).
    fn is_idle(&self, clock: &Clock, now: Instant) -> bool {
        if self.pause_left(clock, now).is_some() {
            return false;
        }
        let mut b = self.lock();
        b.requests.as_mut().is_none_or(|r| r.is_full(now))
            && b.tokens.as_mut().is_none_or(|t| t.is_full(now))
    }
}

/// Converts instants to nanoseconds after the gate's creation, for atomics.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    epoch: Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Clock {
            epoch: Instant::now(),
        }
    }

    /// Nanoseconds since the epoch, plus one (so 0 can mean "no pause").
    pub(crate) fn nanos(&self, at: Instant) -> u64 {
        let n = at.saturating_duration_since(self.epoch).as_nanos();
        (n.min(u64::MAX as u128 - 1) as u64) + 1
    }
}

#[derive(Debug, Default)]
struct RateConfig {
    default: Rates,
    per_key: HashMap<Arc<str>, Rates>,
}

/// After a sweep of a full table frees nothing, new keys go to the unkeyed state without
/// another sweep for this long.
const FULL_BACKOFF: Duration = Duration::from_secs(1);

/// Every key's state, and the rate configuration they follow.
#[derive(Debug)]
pub(crate) struct Keys {
    map: RwLock<HashMap<Arc<str>, Arc<KeyState>>>,
    /// Requests without a key, and keys beyond `max_keys`.
    unkeyed: Arc<KeyState>,
    config: RwLock<RateConfig>,
    version: AtomicU64,
    max_keys: usize,
    /// Until when (gate clock nanoseconds) the table is known to hold nothing to forget.
    full_until: AtomicU64,
}

impl Keys {
    pub(crate) fn new(default: Rates, per_key: Vec<(Arc<str>, Rates)>, max_keys: usize) -> Self {
        Keys {
            map: RwLock::default(),
            unkeyed: Arc::new(KeyState::new(None)),
            config: RwLock::new(RateConfig {
                default,
                per_key: per_key
                    .into_iter()
                    .map(|(k, r)| (Arc::from(&*bound_key(&k)), r))
                    .collect(),
            }),
            version: AtomicU64::new(0),
            max_keys,
            full_until: AtomicU64::new(0),
        }
    }

    /// The state of `key`, created on first use and fitted to the current rates.
    pub(crate) fn get(&self, key: Option<&str>, clock: &Clock, now: Instant) -> Arc<KeyState> {
        let state = match key {
            None => self.unkeyed.clone(),
            Some(k) => {
                let k = bound_key(k);
                let found = {
                    let map = self.map.read().unwrap_or_else(|p| p.into_inner());
                    match map.get(&*k) {
                        Some(s) => Some(s.clone()),
                        None if map.len() >= self.max_keys
                            && clock.nanos(now) < self.full_until.load(Ordering::Relaxed) =>
                        {
                            Some(self.unkeyed.clone())
                        }
                        None => None,
                    }
                };
                match found {
                    Some(s) => s,
                    None => self.insert(&k, clock, now),
                }
            }
        };
        self.fit(&state, now);
        state
    }

    /// [`get`](Self::get) for a service that remembers the last key it called under: when
    /// `key` is that one, its state is taken again without the map's lock or hash (a read
    /// lock is a write to a cache line every thread calling through the gate shares). A
    /// remembered state is held, so the table never forgets it while a service remembers it;
    /// the unkeyed state that keys beyond the table share is never remembered for a key.
    pub(crate) fn get_remembered(
        &self,
        key: Option<&str>,
        last: &mut Option<Arc<KeyState>>,
        clock: &Clock,
        now: Instant,
    ) -> Arc<KeyState> {
        let Some(k) = key else {
            return self.get(None, clock, now);
        };
        if let Some(state) = last
            .as_ref()
            .filter(|s| s.name.as_deref() == Some(&*bound_key(k)))
        {
            self.fit(state, now);
            return state.clone();
        }
        let state = self.get(key, clock, now);
        *last = state.name.is_some().then(|| state.clone());
        state
    }

    fn insert(&self, key: &str, clock: &Clock, now: Instant) -> Arc<KeyState> {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = map.get(key) {
            return s.clone();
        }
        if map.len() >= self.max_keys {
            // Forget states nobody holds and that carry nothing (a fresh one starts the same).
            map.retain(|_, s| Arc::strong_count(s) > 1 || !s.is_idle(clock, now));
            if map.len() >= self.max_keys {
                let until = clock
                    .nanos(now)
                    .saturating_add(FULL_BACKOFF.as_nanos() as u64);
                self.full_until.store(until, Ordering::Relaxed);
                tracing::debug!(
                    target: "seawall::gate",
                    max_keys = self.max_keys,
                    "seawall gate: key table full; this key shares the unkeyed state"
                );
                return self.unkeyed.clone();
            }
        }
        let key: Arc<str> = Arc::from(key);
        let state = Arc::new(KeyState::new(Some(key.clone())));
        map.insert(key, state.clone());
        state
    }

    /// Refits a state's buckets when the rate configuration changed since it last looked.
    fn fit(&self, state: &KeyState, now: Instant) {
        // The fast path reads two versions without the lock. The state's version is stored
        // with Release after its buckets and `limited` were refitted, so a matching Acquire
        // read also sees them. A read that misses a change made meanwhile serves this one
        // call with the rates it raced with; the locked path below checks again under the
        // bucket mutex, so two refits of one state never interleave.
        let current = self.version.load(Ordering::Acquire);
        if state.version.load(Ordering::Acquire) == current {
            return;
        }
        let config = self.config.read().unwrap_or_else(|p| p.into_inner());
        let version = self.version.load(Ordering::Acquire);
        let rates = state
            .name
            .as_ref()
            .and_then(|n| config.per_key.get(n))
            .copied()
            .unwrap_or(config.default);
        let mut b = state.lock();
        if b.version == version && state.version.load(Ordering::Acquire) == version {
            return;
        }
        refit(&mut b.requests, rates.requests(), now);
        refit(&mut b.tokens, rates.tokens(), now);
        b.version = version;
        state
            .limited
            .store(!rates.is_unlimited(), Ordering::Release);
        state.version.store(version, Ordering::Release);
    }

    pub(crate) fn set_default(&self, rates: Rates) {
        let mut c = self.config.write().unwrap_or_else(|p| p.into_inner());
        c.default = rates;
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn set_for_key(&self, key: &str, rates: Option<Rates>) {
        let key = bound_key(key);
        let key = &*key;
        let mut c = self.config.write().unwrap_or_else(|p| p.into_inner());
        match rates {
            Some(r) => {
                c.per_key.insert(Arc::from(key), r);
            }
            None => {
                c.per_key.remove(key);
            }
        }
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn default_rates(&self) -> Rates {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .default
    }

    pub(crate) fn rates_for(&self, key: &str) -> Rates {
        let c = self.config.read().unwrap_or_else(|p| p.into_inner());
        c.per_key
            .get(&*bound_key(key))
            .copied()
            .unwrap_or(c.default)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|p| p.into_inner()).len()
    }
}
