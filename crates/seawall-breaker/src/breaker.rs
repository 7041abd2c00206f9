//! One key's breaker: the state machine.
//!
//! The state lives in one atomic word, `epoch << 3 | state`. Every call loads it once; in the
//! closed state that load, the window's atomics and the consecutive-failure counter are all the
//! bookkeeping there is. Transitions (rare) take a small mutex, re-check the word, write the
//! fields of the new state and publish the new word with `Release`, bumping the epoch. A
//! permit remembers the epoch it was admitted in; an outcome that arrives after the epoch moved
//! on (a call admitted before the breaker opened and finished after it closed again) is
//! dropped rather than counted in the wrong period.
//!
//! Half-open admission is a fixed array of probe slots, each claimed by CAS from 0 to a stamp
//! (admission time in ms and a ticket). At most `probes` calls can hold a slot, however many
//! callers race. A slot held longer than the maximum probe wait may be reclaimed by the next
//! caller; the late probe's outcome then finds its stamp gone and is ignored.

use std::sync::Arc;
use std::time::Duration;

use seawall_core::FailureClass;
use tokio::sync::Notify;

use crate::config::Config;
use crate::state::{KeySnapshot, Mode, Reason, State, StateChange, Verdict};
use crate::sync::{AtomicU8, AtomicU64, Mutex, Ordering};
use crate::window::{Window, WindowKind};

const STATE_BITS: u32 = 3;
/// `fleet` flag: the fleet's shared state holds this key open; it goes half-open only when the
/// fleet grants this replica the probe lease (or the sharing stops).
const HELD: u8 = 1;
/// `fleet` flag: a call found the key held open past its open period (this replica wants to
/// probe).
const WANTED: u8 = 2;
const TICKET_BITS: u32 = 24;
const NANOS_PER_MS: u64 = 1_000_000;

fn state_of(word: u64) -> State {
    State::from_code(word)
}

fn epoch_of(word: u64) -> u64 {
    word >> STATE_BITS
}

fn word(epoch: u64, state: State) -> u64 {
    (epoch << STATE_BITS) | state.code()
}

fn stamp_ms(stamp: u64) -> u64 {
    (stamp >> TICKET_BITS).saturating_sub(1)
}

/// What a call was admitted as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Counted in the window (closed or metrics-only); `seen`: the breaker's count of
    /// failures when the call was admitted (see `Breaker::failures`); `head`: its answered
    /// head is counted in `Breaker::open_heads`.
    Counted { epoch: u64, seen: u64, head: bool },
    /// A half-open probe holding slot `slot` with `stamp`.
    Probe { epoch: u64, slot: u32, stamp: u64 },
    /// Not counted at all (disabled).
    Untracked,
}

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Open until `retry_after` from now; `quota`: an exhausted quota opened it.
    Open { retry_after: Duration, quota: bool },
    /// Half-open with every probe slot taken; one may free up after `retry_after`.
    ProbesBusy { retry_after: Duration },
    /// Forced open by hand.
    ForcedOpen,
}

/// A key's counted outcomes not yet handed to the fleet. Calls and failures share one word
/// (32 bits each, so one `fetch_add` per call and no overflow short of four billion calls
/// between two syncs); slow calls, which only a slow-call setting makes, have their own.
/// Relaxed throughout: a count handed over a little late only lands in the next sync.
#[derive(Debug)]
struct Evidence {
    calls_failures: AtomicU64,
    slow: AtomicU64,
}

impl Evidence {
    fn new() -> Self {
        Evidence {
            calls_failures: AtomicU64::new(0),
            slow: AtomicU64::new(0),
        }
    }

    #[inline]
    fn add(&self, failure: bool, slow: bool) {
        self.calls_failures
            .fetch_add(1 | u64::from(failure) << 32, Ordering::Relaxed);
        if slow {
            self.slow.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn take(&self) -> (u32, u32, u32) {
        let cf = self.calls_failures.swap(0, Ordering::Relaxed);
        let slow = self.slow.swap(0, Ordering::Relaxed);
        (
            cf as u32,
            (cf >> 32) as u32,
            slow.min(u64::from(u32::MAX)) as u32,
        )
    }
}

#[derive(Debug)]
struct Transitions {
    reopens: u32,
}

/// One key's breaker.
#[derive(Debug)]
pub(crate) struct Breaker {
    key: Arc<str>,
    cfg: Arc<Config>,
    word: AtomicU64,
    open_until: AtomicU64,
    consecutive: AtomicU64,
    /// Every failure recorded in the closed state, counted. A failure extends the run of
    /// consecutive failures only if none was recorded while its call was in flight: "in a
    /// row" means one after the other. Calls that fail together, as a burst does (a
    /// stream's failure comes at its head, its success only when its body ends, seconds
    /// later), are one step of the run, not one each, or a burst of healthy streams with a
    /// few early errors among them would open the breaker (a response head ends the run
    /// too: see [`answered`](Self::answered)). Written only on failures.
    failures: AtomicU64,
    /// Calls of this epoch whose response head arrived and whose outcome is not recorded yet,
    /// counted only while the window warms up (see [`evaluate`](Self::evaluate)).
    open_heads: AtomicU64,
    /// Set once the window, since it was last cleared, holds a full window of outcomes (a
    /// count window) or has spanned its duration (a time window).
    warm: AtomicU8,
    /// When the window was last cleared, on the breaker's clock.
    cleared_at: AtomicU64,
    /// Set when the window is over a threshold but below the minimum number of calls, so that
    /// the success that brings it to the minimum evaluates it too.
    armed: AtomicU8,
    window: Window,
    probes: Box<[AtomicU64]>,
    tickets: AtomicU64,
    probe_successes: AtomicU64,
    probe_failures: AtomicU64,
    /// Set by every call; cleared by the registry's eviction sweep, which then dates the use
    /// at the sweep. So the hot path never reads the clock for bookkeeping.
    used: AtomicU8,
    /// When the key was last known to be in use (creation, or a sweep that found `used`).
    last_used: AtomicU64,
    /// Set when the registry dropped this breaker; a service's cached copy is then stale.
    evicted: AtomicU8,
    lock: Mutex<Transitions>,
    /// Only with a [`SharedBreakerState`](crate::SharedBreakerState): the counted outcomes not
    /// yet handed to it. The default breaker pays nothing but a check of this `Option`.
    evidence: Option<Evidence>,
    /// `HELD` and `WANTED`: what the fleet's shared state says of this key.
    fleet: AtomicU8,
    /// Set when an exhausted quota opened the breaker (for the refusals' message).
    quota_open: AtomicU8,
    /// Woken whenever the breaker opens or its open period grows: the retries waiting to send
    /// a call back through it (see [`Breaker::refused_at`]).
    opened: Notify,
}

impl Breaker {
    pub(crate) fn new(key: Arc<str>, cfg: Arc<Config>, initial: State, now: u64) -> Self {
        Breaker {
            key,
            word: AtomicU64::new(word(0, initial)),
            open_until: AtomicU64::new(0),
            consecutive: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            open_heads: AtomicU64::new(0),
            warm: AtomicU8::new(0),
            cleared_at: AtomicU64::new(now),
            armed: AtomicU8::new(0),
            window: Window::new(cfg.window),
            probes: (0..cfg.probes.max(1)).map(|_| AtomicU64::new(0)).collect(),
            tickets: AtomicU64::new(1),
            probe_successes: AtomicU64::new(0),
            probe_failures: AtomicU64::new(0),
            used: AtomicU8::new(0),
            last_used: AtomicU64::new(now),
            evicted: AtomicU8::new(0),
            lock: Mutex::new(Transitions { reopens: 0 }),
            evidence: cfg.shared.is_some().then(Evidence::new),
            fleet: AtomicU8::new(0),
            quota_open: AtomicU8::new(0),
            opened: Notify::new(),
            cfg,
        }
    }

    pub(crate) fn key(&self) -> &Arc<str> {
        &self.key
    }

    pub(crate) fn config(&self) -> &Config {
        &self.cfg
    }

    pub(crate) fn state(&self) -> State {
        state_of(self.word.load(Ordering::Acquire))
    }

    /// Notes a use: a load, and a store once per eviction sweep.
    ///
    /// Relaxed, here and in the sweep: the flag is a hint that guards no other data, and a use
    /// the sweep sees late is dated at the next sweep, which only keeps the key longer.
    #[inline]
    pub(crate) fn touch(&self) {
        if self.used.load(Ordering::Relaxed) == 0 {
            self.used.store(1, Ordering::Relaxed);
        }
    }

    /// When the key was last known to be in use, as of a sweep at `now`: a use since the
    /// previous sweep is dated `now` (never earlier than the real use).
    pub(crate) fn last_used_at_sweep(&self, now: u64) -> u64 {
        if self.used.swap(0, Ordering::Relaxed) != 0 {
            self.last_used.store(now, Ordering::Relaxed);
        }
        self.last_used.load(Ordering::Relaxed)
    }

    pub(crate) fn last_used(&self) -> u64 {
        self.last_used.load(Ordering::Relaxed)
    }

    pub(crate) fn mark_evicted(&self) {
        self.evicted.store(1, Ordering::Relaxed);
    }

    /// Whether the registry still holds this breaker.
    ///
    /// Relaxed: the flag guards no other data. A service that reads it late serves one more
    /// call from the evicted breaker, which was idle (or clean) and closed when it was evicted,
    /// and asks the registry on the next call.
    #[inline]
    pub(crate) fn is_current(&self) -> bool {
        self.evicted.load(Ordering::Relaxed) == 0
    }

    /// Admits or refuses a call. The clock is read only outside the closed state.
    #[inline]
    pub(crate) fn acquire(&self, now: impl Fn() -> u64) -> Result<Admission, Refusal> {
        let mut clock = None;
        let mut now = || *clock.get_or_insert_with(&now);
        loop {
            // Acquire pairs with the Release store that published this word in `transition`:
            // whoever sees the new word also sees what that transition wrote before it (the
            // open deadline, the cleared probe slots and counters).
            let w = self.word.load(Ordering::Acquire);
            match state_of(w) {
                State::Closed | State::MetricsOnly => {
                    return Ok(Admission::Counted {
                        epoch: epoch_of(w),
                        seen: self.failures.load(Ordering::Relaxed),
                        head: false,
                    });
                }
                State::Disabled => return Ok(Admission::Untracked),
                State::ForcedOpen => return Err(Refusal::ForcedOpen),
                State::Open => {
                    let now = now();
                    let until = self.open_until.load(Ordering::Acquire);
                    if now < until {
                        return Err(self.open_refusal(until, now));
                    }
                    if self.fleet.load(Ordering::Relaxed) & HELD != 0 {
                        // The fleet holds the key open: only the replica holding the probe
                        // lease probes. Ask for it, and look again after the next sync.
                        self.fleet.fetch_or(WANTED, Ordering::Relaxed);
                        return Err(Refusal::Open {
                            retry_after: self
                                .cfg
                                .shared
                                .as_ref()
                                .map_or(Duration::ZERO, |s| s.interval()),
                            quota: self.quota_open.load(Ordering::Relaxed) != 0,
                        });
                    }
                    self.transition(w, State::HalfOpen, Reason::OpenElapsed, now);
                }
                State::HalfOpen => {
                    // `None`: the half-open period ended meanwhile; look again.
                    if let Some(result) = self.try_probe(w, now()) {
                        return result;
                    }
                }
            }
        }
    }

    fn open_refusal(&self, until: u64, now: u64) -> Refusal {
        Refusal::Open {
            retry_after: Duration::from_nanos(until.saturating_sub(now)),
            quota: self.quota_open.load(Ordering::Relaxed) != 0,
        }
    }

    /// The refusal a call made at `at` would get, if the breaker as it is `now` already says
    /// so: forced open, or open until `at` or later. `None` while it would admit the call,
    /// or might (an open period that ends by `at` leads to a half-open probe).
    pub(crate) fn refused_at(&self, at: u64, now: u64) -> Option<Refusal> {
        match state_of(self.word.load(Ordering::Acquire)) {
            State::ForcedOpen => Some(Refusal::ForcedOpen),
            State::Open => {
                let until = self.open_until.load(Ordering::Acquire);
                (until > at).then(|| self.open_refusal(until, now))
            }
            _ => None,
        }
    }

    /// Completes with the refusal a call made at `at` would get, as soon as the breaker
    /// says so (see [`refused_at`](Self::refused_at)): at once, or when it opens.
    pub(crate) async fn until_refused(&self, at: tokio::time::Instant) -> Refusal {
        let at = self.cfg.at(at);
        loop {
            // Registered before the look, so an opening between the two is not missed.
            let mut opened = std::pin::pin!(self.opened.notified());
            opened.as_mut().enable();
            if let Some(refusal) = self.refused_at(at, self.cfg.now()) {
                return refusal;
            }
            opened.await;
        }
    }

    /// Claims a probe slot. `None`: the half-open period ended meanwhile; look again.
    fn try_probe(&self, w: u64, now: u64) -> Option<Result<Admission, Refusal>> {
        let now_ms = now / NANOS_PER_MS;
        let wait_ms = self
            .cfg
            .max_probe_wait
            .as_millis()
            .min(u128::from(u64::MAX)) as u64;
        // Relaxed: the ticket only has to differ from the racing callers' tickets, and a
        // read-modify-write hands out distinct values under any ordering.
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed) & ((1 << TICKET_BITS) - 1);
        let stamp = ((now_ms + 1) << TICKET_BITS) | ticket;
        let mut next_free_ms = u64::MAX;
        for (i, slot) in self.probes.iter().enumerate() {
            let cur = slot.load(Ordering::Acquire);
            let expired = cur != 0 && now_ms >= stamp_ms(cur).saturating_add(wait_ms);
            if cur == 0 || expired {
                // The CAS is the claim: of the callers that raced for this slot exactly one
                // wins. The state word is then read again, because the period may have ended
                // between the look above and the claim; a claim in a dead period is undone.
                if slot
                    .compare_exchange(cur, stamp, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    if self.word.load(Ordering::Acquire) != w {
                        // The period ended between the look and the claim: give it back.
                        let _ =
                            slot.compare_exchange(stamp, 0, Ordering::AcqRel, Ordering::Relaxed);
                        return None;
                    }
                    if expired {
                        tracing::debug!(
                            target: "seawall::breaker",
                            key = %self.key,
                            "reclaimed a probe slot held past the maximum probe wait"
                        );
                    }
                    return Some(Ok(Admission::Probe {
                        epoch: epoch_of(w),
                        slot: i as u32,
                        stamp,
                    }));
                }
                continue;
            }
            next_free_ms = next_free_ms.min(stamp_ms(cur).saturating_add(wait_ms));
        }
        let retry_after = if next_free_ms == u64::MAX {
            Duration::ZERO
        } else {
            Duration::from_millis(next_free_ms.saturating_sub(now_ms))
        };
        Some(Err(Refusal::ProbesBusy { retry_after }))
    }

    /// A counted call's response head arrived: the upstream answers, so a run of consecutive
    /// failures ends here (and only here: the success at the body's end, seconds later, is
    /// old news by then). Without this, the failures of a burst's first seconds, with
    /// hundreds of answers flowing between them, would be a run. A stream that
    /// breaks after its head is still a failure in the failure-rate window. While the window
    /// warms up, the head is counted as open (see [`evaluate`](Self::evaluate)); the
    /// admission then says so. Writes only when a run is going or the window is warming.
    #[inline]
    pub(crate) fn answered(&self, admission: &mut Admission) {
        if let Admission::Counted { epoch, head, .. } = admission {
            if epoch_of(self.word.load(Ordering::Acquire)) != *epoch {
                return;
            }
            if self.consecutive.load(Ordering::Relaxed) != 0 {
                self.consecutive.store(0, Ordering::Relaxed);
            }
            if self.warm.load(Ordering::Relaxed) == 0 {
                self.open_heads.fetch_add(1, Ordering::Relaxed);
                *head = true;
            }
        }
    }

    /// Records how an admitted call ended. `slow`: its response head took longer than the
    /// slow-call threshold. `now` is read only when needed.
    #[inline]
    pub(crate) fn record(
        &self,
        admission: Admission,
        verdict: Verdict,
        slow: bool,
        now: impl Fn() -> u64,
    ) {
        match admission {
            Admission::Untracked => {}
            Admission::Counted { epoch, seen, head } => {
                self.record_counted(epoch, seen, head, verdict, slow, now)
            }
            Admission::Probe { epoch, slot, stamp } => {
                self.record_probe(epoch, slot, stamp, verdict, slow, now)
            }
        }
    }

    #[inline]
    #[allow(
        clippy::too_many_arguments,
        reason = "the admission's fields and the outcome"
    )]
    fn record_counted(
        &self,
        epoch: u64,
        seen: u64,
        head: bool,
        verdict: Verdict,
        slow: bool,
        now: impl Fn() -> u64,
    ) {
        let w = self.word.load(Ordering::Acquire);
        let state = state_of(w);
        if epoch_of(w) != epoch {
            return;
        }
        if head {
            self.open_heads.fetch_sub(1, Ordering::Relaxed);
        }
        if verdict == Verdict::Ignore {
            return;
        }
        if !matches!(state, State::Closed | State::MetricsOnly) {
            return;
        }
        let failure = verdict == Verdict::Failure;
        if let Some(evidence) = &self.evidence {
            evidence.add(failure, slow);
        }
        let mut trip = None;
        // The streak is Relaxed: it publishes no other data, and the trip it suggests goes
        // through `transition`, which re-checks the state word under the lock.
        // Another failure recorded while this call was in flight: the two failed together,
        // one step of the run (see `failures`).
        if failure && self.failures.fetch_add(1, Ordering::Relaxed) == seen {
            let streak = self.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
            if self.cfg.consecutive_failures > 0 && streak >= self.cfg.consecutive_failures {
                trip = Some(Reason::ConsecutiveFailures);
            }
        }
        let mut clock = None;
        let mut now = || *clock.get_or_insert_with(&now);
        let t = if self.window.is_time_based() {
            now()
        } else {
            0
        };
        let changed = self.window.record(failure, slow, t);
        if self.warm.load(Ordering::Relaxed) == 0 {
            self.warm_up(&mut now);
        }
        if trip.is_none()
            && (failure || slow || (changed && self.armed.load(Ordering::Relaxed) != 0))
        {
            trip = self.evaluate(now());
        }
        if let (Some(reason), State::Closed) = (trip, state) {
            self.transition(w, State::Open, reason, now());
        }
    }

    /// An admitted call ended in a class that opens the breaker at once: a counted call is
    /// recorded as `verdict` says, then opens the breaker if it is still closed in the call's
    /// epoch; a probe counts as a failed probe (which re-opens it, for this cause).
    pub(crate) fn open_at_once(
        &self,
        admission: Admission,
        class: FailureClass,
        verdict: Verdict,
        slow: bool,
        now: impl Fn() -> u64,
    ) {
        match admission {
            Admission::Untracked => {}
            Admission::Counted { epoch, seen, head } => {
                self.record_counted(epoch, seen, head, verdict, slow, &now);
                let w = self.word.load(Ordering::Acquire);
                if epoch_of(w) == epoch && state_of(w) == State::Closed {
                    self.transition(w, State::Open, Reason::OpenAtOnce(class), now());
                }
            }
            Admission::Probe { .. } => {
                self.record(admission, Verdict::Failure, slow, now);
                if class == FailureClass::QuotaExhausted && self.state() == State::Open {
                    self.quota_open.store(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Marks the window warm once it holds a full window of outcomes since it was cleared (a
    /// count window) or has spanned its duration (a time window).
    fn warm_up(&self, now: &mut impl FnMut() -> u64) {
        let warm = match self.cfg.window {
            WindowKind::Count(n) => self.window.totals(0).calls >= n,
            WindowKind::Time(d) => {
                now().saturating_sub(self.cleared_at.load(Ordering::Relaxed)) >= nanos(d)
            }
        };
        if warm {
            self.warm.store(1, Ordering::Relaxed);
        }
    }

    /// Checks the window against the rate thresholds.
    ///
    /// Until the window has warmed up, the calls whose head arrived and whose outcome is not
    /// known yet count in the failure rate's denominator. A stream's success is recorded only
    /// when it ends, seconds after its head, so in the first seconds after a start or a
    /// close, at a few hundred streams a second, the window holds nothing but the few
    /// failures at the head and a 3% error rate reads as 100%. Once the window is full, only
    /// outcomes count: a provider whose every stream breaks after its head still opens it.
    fn evaluate(&self, now: u64) -> Option<Reason> {
        let t = self.window.totals(now);
        let calls = f64::from(t.calls);
        let open = if self.warm.load(Ordering::Relaxed) == 0 {
            self.open_heads.load(Ordering::Relaxed) as f64
        } else {
            0.0
        };
        let over_failures = self
            .cfg
            .failure_rate
            .is_some_and(|r| t.calls > 0 && f64::from(t.failures) >= r * (calls + open));
        let over_slow = self.cfg.slow_threshold.is_some()
            && t.calls > 0
            && f64::from(t.slow) >= self.cfg.slow_rate * calls;
        let below_minimum = t.calls < self.cfg.minimum_calls;
        let armed = u8::from(below_minimum && (over_failures || over_slow));
        if self.armed.load(Ordering::Relaxed) != armed {
            self.armed.store(armed, Ordering::Relaxed);
        }
        if below_minimum {
            None
        } else if over_failures {
            Some(Reason::FailureRate)
        } else if over_slow {
            Some(Reason::SlowCallRate)
        } else {
            None
        }
    }

    fn record_probe(
        &self,
        epoch: u64,
        slot: u32,
        stamp: u64,
        verdict: Verdict,
        slow: bool,
        now: impl Fn() -> u64,
    ) {
        let Some(cell) = self.probes.get(slot as usize) else {
            return;
        };
        if cell
            .compare_exchange(stamp, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            // Reclaimed after the maximum probe wait: this outcome is too late to count.
            return;
        }
        let w = self.word.load(Ordering::Acquire);
        if epoch_of(w) != epoch || state_of(w) != State::HalfOpen {
            return;
        }
        let slow_counts = slow && self.cfg.slow_threshold.is_some();
        match verdict {
            Verdict::Ignore => {}
            Verdict::Failure => self.probe_failed(w, now()),
            Verdict::Success if slow_counts => self.probe_failed(w, now()),
            Verdict::Success => {
                let ok = self.probe_successes.fetch_add(1, Ordering::AcqRel) + 1;
                if ok >= self.cfg.probe_successes {
                    self.transition(w, State::Closed, Reason::ProbesSucceeded, now());
                }
            }
        }
    }

    fn probe_failed(&self, w: u64, now: u64) {
        let failed = self.probe_failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failed >= self.cfg.probe_failures {
            self.transition(w, State::Open, Reason::ProbeFailed, now);
        }
    }

    /// Moves from the state word `from` to `to`, unless another caller moved first. Emits the
    /// change after releasing the lock.
    pub(crate) fn transition(&self, from: u64, to: State, reason: Reason, now: u64) -> bool {
        let change = {
            let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            if self.word.load(Ordering::Acquire) != from {
                return false;
            }
            let from_state = state_of(from);
            let mut open_for = None;
            match to {
                State::Open => {
                    if from_state == State::HalfOpen {
                        g.reopens = g.reopens.saturating_add(1);
                    } else {
                        g.reopens = 0;
                    }
                    let d = self.cfg.open_duration(g.reopens);
                    // A probe failed by an exhausted quota sets it again (`open_at_once`).
                    self.quota_open.store(
                        u8::from(reason == Reason::OpenAtOnce(FailureClass::QuotaExhausted)),
                        Ordering::Relaxed,
                    );
                    self.open_until
                        .store(now.saturating_add(nanos(d)), Ordering::Relaxed);
                    open_for = Some(d);
                }
                State::HalfOpen => {
                    if now < self.open_until.load(Ordering::Relaxed) {
                        return false;
                    }
                    self.clear_probes();
                }
                State::Closed => {
                    g.reopens = 0;
                    self.clear_counts();
                }
                _ => {}
            }
            // Release, last: everything above (deadline, cleared slots and counts) is visible
            // to any caller whose Acquire load sees the new word. The fields themselves can
            // then be Relaxed. The lock only serialises the writers.
            self.word
                .store(word(epoch_of(from) + 1, to), Ordering::Release);
            StateChange {
                key: self.key.clone(),
                from: from_state,
                to,
                reason,
                open_for,
            }
        };
        self.emit(&change);
        true
    }

    fn clear_probes(&self) {
        for p in self.probes.iter() {
            p.store(0, Ordering::Relaxed);
        }
        self.probe_successes.store(0, Ordering::Relaxed);
        self.probe_failures.store(0, Ordering::Relaxed);
    }

    fn clear_counts(&self) {
        self.window.reset();
        self.open_heads.store(0, Ordering::Relaxed);
        self.warm.store(0, Ordering::Relaxed);
        self.cleared_at.store(self.cfg.now(), Ordering::Relaxed);
        self.consecutive.store(0, Ordering::Relaxed);
        self.armed.store(0, Ordering::Relaxed);
    }

    /// Opens the breaker until `now + wait` (or keeps it open at least that long), because an
    /// error said when the upstream will take calls again. Manual modes are left alone.
    pub(crate) fn open_for_hint(&self, wait: Duration, now: u64) {
        let until = now.saturating_add(nanos(wait));
        let change = {
            let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            let w = self.word.load(Ordering::Acquire);
            match state_of(w) {
                State::Open => {
                    if until > self.open_until.load(Ordering::Relaxed) {
                        self.open_until.store(until, Ordering::Relaxed);
                        self.opened.notify_waiters();
                    }
                    return;
                }
                State::Closed | State::HalfOpen => {}
                _ => return,
            }
            self.quota_open.store(0, Ordering::Relaxed);
            self.open_until.store(until, Ordering::Relaxed);
            self.word
                .store(word(epoch_of(w) + 1, State::Open), Ordering::Release);
            StateChange {
                key: self.key.clone(),
                from: state_of(w),
                to: State::Open,
                reason: Reason::RetryHint,
                open_for: Some(wait),
            }
        };
        self.emit(&change);
    }

    /// Sets a manual mode; `Normal` restarts the state machine from a fresh `Closed`.
    pub(crate) fn set_mode(&self, mode: Mode) {
        let change = {
            let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            let w = self.word.load(Ordering::Acquire);
            let to = mode.state();
            if state_of(w) == to && mode != Mode::Normal {
                return;
            }
            g.reopens = 0;
            self.clear_counts();
            self.clear_probes();
            self.fleet.store(0, Ordering::Relaxed);
            self.word
                .store(word(epoch_of(w) + 1, to), Ordering::Release);
            StateChange {
                key: self.key.clone(),
                from: state_of(w),
                to,
                reason: Reason::Manual,
                open_for: None,
            }
        };
        self.emit(&change);
    }

    fn emit(&self, change: &StateChange) {
        let open_for_ms = change.open_for.map(|d| d.as_millis() as u64);
        if change.to == State::Open || change.to == State::ForcedOpen {
            self.opened.notify_waiters();
            tracing::warn!(
                target: "seawall::breaker",
                key = %change.key,
                from = change.from.as_str(),
                to = change.to.as_str(),
                reason = change.reason.as_str(),
                open_for_ms,
                "circuit breaker opened"
            );
        } else {
            tracing::info!(
                target: "seawall::breaker",
                key = %change.key,
                from = change.from.as_str(),
                to = change.to.as_str(),
                reason = change.reason.as_str(),
                "circuit breaker state changed"
            );
        }
        if let Some(f) = &self.cfg.on_change {
            f(change);
        }
        if let Some(shared) = &self.cfg.shared {
            shared.on_state_change(change);
        }
    }

    /// Takes the outcome counts not yet handed to the fleet: (calls, failures, slow calls).
    pub(crate) fn take_evidence(&self) -> (u32, u32, u32) {
        self.evidence.as_ref().map_or((0, 0, 0), Evidence::take)
    }

    /// Whether the fleet holds this key open, and whether a call wanted to probe since the
    /// last look (which clears that wish).
    pub(crate) fn take_fleet_flags(&self) -> (bool, bool) {
        let f = self.fleet.fetch_and(!WANTED, Ordering::Relaxed);
        (f & HELD != 0, f & WANTED != 0)
    }

    /// The fleet says the key is open for `remaining` more (zero: its open period is over but
    /// another replica probes): open it if closed or half-open, with the fleet's deadline, and
    /// hold it open past then until the fleet grants a probe or closes it. Manual modes are
    /// left alone.
    pub(crate) fn fleet_open(&self, remaining: Duration, now: u64) {
        let until = now.saturating_add(nanos(remaining));
        let change = {
            let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            let w = self.word.load(Ordering::Acquire);
            let from = state_of(w);
            match from {
                State::Open => {
                    // The fleet's deadline replaces the local one (both ways): while the fleet
                    // holds the key, its open period is the fleet's.
                    self.open_until.store(until, Ordering::Relaxed);
                    self.fleet.fetch_or(HELD, Ordering::Relaxed);
                    self.opened.notify_waiters();
                    return;
                }
                State::Closed | State::HalfOpen => {}
                _ => return,
            }
            self.quota_open.store(0, Ordering::Relaxed);
            self.open_until.store(until, Ordering::Relaxed);
            self.fleet.store(HELD, Ordering::Relaxed);
            // Release: a caller that sees the new word sees the deadline and the hold.
            self.word
                .store(word(epoch_of(w) + 1, State::Open), Ordering::Release);
            StateChange {
                key: self.key.clone(),
                from,
                to: State::Open,
                reason: Reason::Shared,
                open_for: Some(remaining),
            }
        };
        self.emit(&change);
    }

    /// The fleet granted this replica the probe lease: a key it holds open turns half-open.
    pub(crate) fn fleet_probe(&self, now: u64) {
        let w = self.word.load(Ordering::Acquire);
        if state_of(w) != State::Open || self.fleet.load(Ordering::Relaxed) & HELD == 0 {
            return;
        }
        {
            let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            if self.open_until.load(Ordering::Relaxed) > now {
                self.open_until.store(now, Ordering::Relaxed);
            }
        }
        self.fleet.store(0, Ordering::Relaxed);
        self.transition(w, State::HalfOpen, Reason::Shared, now);
    }

    /// The fleet closed the key: a key it held open closes (with fresh counts).
    pub(crate) fn fleet_close(&self, now: u64) {
        let w = self.word.load(Ordering::Acquire);
        if state_of(w) != State::Open || self.fleet.load(Ordering::Relaxed) & HELD == 0 {
            return;
        }
        self.fleet.store(0, Ordering::Relaxed);
        self.transition(w, State::Closed, Reason::Shared, now);
    }

    /// The fleet cannot be asked: the key runs on its local state again (an open key goes
    /// half-open by itself when its open period ends).
    pub(crate) fn fleet_release(&self) {
        if self.fleet.load(Ordering::Relaxed) != 0 {
            self.fleet.store(0, Ordering::Relaxed);
        }
    }

    /// A read-only view at `now`.
    pub(crate) fn snapshot(&self, now: u64) -> KeySnapshot {
        let w = self.word.load(Ordering::Acquire);
        let state = state_of(w);
        let totals = self.window.totals(now);
        let retry_after = (state == State::Open).then(|| {
            Duration::from_nanos(self.open_until.load(Ordering::Relaxed).saturating_sub(now))
        });
        let probes_in_flight = if state == State::HalfOpen {
            self.probes
                .iter()
                .filter(|p| p.load(Ordering::Relaxed) != 0)
                .count() as u32
        } else {
            0
        };
        KeySnapshot {
            key: self.key.clone(),
            state,
            calls: totals.calls,
            failures: totals.failures,
            slow_calls: totals.slow,
            consecutive_failures: self
                .consecutive
                .load(Ordering::Relaxed)
                .min(u64::from(u32::MAX)) as u32,
            retry_after,
            probes_in_flight,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::window::WindowKind;
    use std::sync::Mutex as StdMutex;

    const MS: u64 = NANOS_PER_MS;
    const SEC: u64 = 1000 * MS;

    fn cfg(f: impl FnOnce(&mut Config)) -> Arc<Config> {
        let mut c = Config {
            jitter: 0.0,
            ..Config::default()
        };
        f(&mut c);
        Arc::new(c)
    }

    fn breaker(c: Arc<Config>) -> Breaker {
        Breaker::new("k".into(), c, State::Closed, 0)
    }

    fn call(b: &Breaker, now: u64, verdict: Verdict) -> Result<(), Refusal> {
        let a = b.acquire(|| now)?;
        b.record(a, verdict, false, || now);
        Ok(())
    }

    #[test]
    fn failure_rate_needs_the_minimum_calls() {
        let b = breaker(cfg(|c| {
            c.consecutive_failures = 0;
            c.minimum_calls = 10;
            c.window = WindowKind::Count(10);
        }));
        for _ in 0..4 {
            call(&b, 0, Verdict::Success).unwrap();
        }
        for _ in 0..5 {
            call(&b, 0, Verdict::Failure).unwrap();
        }
        assert_eq!(b.state(), State::Closed, "9 calls < minimum 10");
        // The success that reaches the minimum trips it: 5/10 >= 50%.
        call(&b, 0, Verdict::Success).unwrap();
        assert_eq!(b.state(), State::Open);
    }

    #[test]
    fn calls_that_fail_together_are_one_step_of_a_run() {
        let b = breaker(cfg(|_| {}));
        // A burst: ten calls admitted at once, five of which fail before any ends well (a
        // stream's error comes at its head, its success only at its end).
        let burst: Vec<_> = (0..10).map(|_| b.acquire(|| 0).unwrap()).collect();
        for a in &burst[..5] {
            b.record(*a, Verdict::Failure, false, || 0);
        }
        assert_eq!(b.state(), State::Closed);
        assert_eq!(b.snapshot(0).consecutive_failures, 1);
        // Failures one after the other, each call admitted after the last failure: a run.
        for _ in 0..3 {
            call(&b, 0, Verdict::Failure).unwrap();
        }
        assert_eq!(b.state(), State::Closed);
        call(&b, 0, Verdict::Failure).unwrap();
        assert_eq!(b.state(), State::Open);
    }

    #[test]
    fn ignored_outcomes_neither_count_nor_break_a_streak() {
        let b = breaker(cfg(|_| {}));
        for _ in 0..4 {
            call(&b, 0, Verdict::Failure).unwrap();
            call(&b, 0, Verdict::Ignore).unwrap();
        }
        assert_eq!(b.snapshot(0).calls, 4);
        assert_eq!(b.state(), State::Closed);
        call(&b, 0, Verdict::Failure).unwrap();
        assert_eq!(b.state(), State::Open);
    }

    #[test]
    fn slow_call_rate_trips() {
        let b = breaker(cfg(|c| {
            c.consecutive_failures = 0;
            c.minimum_calls = 4;
            c.slow_threshold = Some(Duration::from_secs(5));
            c.slow_rate = 0.75;
        }));
        for slow in [true, false, true, true] {
            let a = b.acquire(|| 0).unwrap();
            b.record(a, Verdict::Success, slow, || 0);
        }
        assert_eq!(b.state(), State::Open);
    }

    #[test]
    fn stale_outcomes_are_dropped() {
        let b = breaker(cfg(|c| c.consecutive_failures = 1));
        let early = b.acquire(|| 0).unwrap();
        call(&b, 0, Verdict::Failure).unwrap();
        assert_eq!(b.state(), State::Open);
        b.set_mode(Mode::Normal);
        b.record(early, Verdict::Failure, false, || 0);
        assert_eq!(b.state(), State::Closed);
        assert_eq!(b.snapshot(0).calls, 0);
    }

    #[test]
    fn probes_close_after_the_success_threshold() {
        let b = breaker(cfg(|c| {
            c.consecutive_failures = 1;
            c.probes = 2;
            c.probe_successes = 2;
        }));
        call(&b, 0, Verdict::Failure).unwrap();
        let open_for = Duration::from_secs(10);
        assert_eq!(
            b.acquire(|| SEC),
            Err(Refusal::Open {
                retry_after: open_for - Duration::from_secs(1),
                quota: false,
            })
        );
        let p1 = b.acquire(|| 10 * SEC).unwrap();
        assert_eq!(b.state(), State::HalfOpen);
        let p2 = b.acquire(|| 10 * SEC).unwrap();
        assert!(matches!(
            b.acquire(|| 10 * SEC),
            Err(Refusal::ProbesBusy { .. })
        ));
        b.record(p1, Verdict::Success, false, || 11 * SEC);
        assert_eq!(b.state(), State::HalfOpen);
        b.record(p2, Verdict::Success, false, || 11 * SEC);
        assert_eq!(b.state(), State::Closed);
    }

    #[test]
    fn open_durations_grow_and_cap() {
        let changes = Arc::new(StdMutex::new(Vec::new()));
        let seen = changes.clone();
        let b = breaker(cfg(move |c| {
            c.consecutive_failures = 1;
            c.open_base = Duration::from_secs(1);
            c.open_factor = 3.0;
            c.open_max = Duration::from_secs(20);
            c.on_change = Some(Arc::new(move |ch: &StateChange| {
                if let Some(d) = ch.open_for {
                    seen.lock().unwrap().push(d.as_secs());
                }
            }));
        }));
        let mut now = 0;
        call(&b, now, Verdict::Failure).unwrap();
        for _ in 0..4 {
            now += 100 * SEC;
            call(&b, now, Verdict::Failure).unwrap();
        }
        assert_eq!(*changes.lock().unwrap(), [1, 3, 9, 20, 20]);
        // Closing resets the growth.
        now += 100 * SEC;
        call(&b, now, Verdict::Success).unwrap();
        assert_eq!(b.state(), State::Closed);
        call(&b, now, Verdict::Failure).unwrap();
        assert_eq!(changes.lock().unwrap().last(), Some(&1));
    }

    #[test]
    fn jitter_shortens_within_bounds() {
        let c = cfg(|c| {
            c.jitter = 0.5;
            c.open_base = Duration::from_secs(10);
        });
        for _ in 0..100 {
            let d = c.open_duration(0);
            assert!(d <= Duration::from_secs(10) && d >= Duration::from_secs(5));
        }
    }

    #[test]
    fn hung_probe_slot_is_reclaimed_after_max_wait() {
        let b = breaker(cfg(|c| {
            c.consecutive_failures = 1;
            c.max_probe_wait = Duration::from_secs(30);
        }));
        call(&b, 0, Verdict::Failure).unwrap();
        let hung = b.acquire(|| 10 * SEC).unwrap();
        assert_eq!(
            b.acquire(|| 20 * SEC),
            Err(Refusal::ProbesBusy {
                retry_after: Duration::from_secs(20)
            })
        );
        let fresh = b.acquire(|| 40 * SEC).unwrap();
        // The hung probe's late success must not count, nor free the new probe's slot.
        b.record(hung, Verdict::Success, false, || 41 * SEC);
        assert_eq!(b.state(), State::HalfOpen);
        assert_eq!(b.snapshot(41 * SEC).probes_in_flight, 1);
        b.record(fresh, Verdict::Success, false, || 41 * SEC);
        assert_eq!(b.state(), State::Closed);
    }

    #[test]
    fn a_quota_error_admitted_before_the_last_close_does_not_open_it() {
        let b = breaker(cfg(|c| c.consecutive_failures = 1));
        let old = b.acquire(|| 0).unwrap();
        // Meanwhile the breaker opens, probes and closes again.
        call(&b, 0, Verdict::Failure).unwrap();
        call(&b, 10 * SEC, Verdict::Success).unwrap();
        assert_eq!(b.state(), State::Closed);
        let q = FailureClass::QuotaExhausted;
        b.open_at_once(old, q, Verdict::Ignore, false, || 11 * SEC);
        assert_eq!(b.state(), State::Closed, "stale: before the close");
        let fresh = b.acquire(|| 11 * SEC).unwrap();
        b.open_at_once(fresh, q, Verdict::Ignore, false, || 11 * SEC);
        assert_eq!(b.state(), State::Open);
        // Manual modes are left alone.
        b.set_mode(Mode::MetricsOnly);
        let counted = b.acquire(|| 12 * SEC).unwrap();
        b.open_at_once(counted, q, Verdict::Ignore, false, || 12 * SEC);
        assert_eq!(b.state(), State::MetricsOnly);
    }

    #[test]
    fn hint_opens_and_only_extends() {
        let b = breaker(cfg(|_| {}));
        b.open_for_hint(Duration::from_secs(30), 0);
        assert_eq!(b.state(), State::Open);
        b.open_for_hint(Duration::from_secs(5), SEC);
        assert_eq!(
            b.snapshot(SEC).retry_after,
            Some(Duration::from_secs(29)),
            "a shorter hint does not shorten"
        );
        b.set_mode(Mode::ForcedOpen);
        b.open_for_hint(Duration::from_secs(5), SEC);
        assert_eq!(b.state(), State::ForcedOpen);
    }

    /// Threads hammer a half-open breaker (that never leaves half-open) with probes that
    /// succeed, fail, or are dropped: never more than `probes` in flight.
    #[test]
    fn stress_half_open_never_exceeds_n() {
        use std::sync::atomic::AtomicUsize;
        let b = Arc::new(breaker(cfg(|c| {
            c.probes = 3;
            c.probe_successes = u64::MAX;
            c.probe_failures = u64::MAX;
        })));
        b.open_for_hint(Duration::from_nanos(1), 0);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let admitted = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (b, in_flight, admitted) = (b.clone(), in_flight.clone(), admitted.clone());
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        if let Ok(a) = b.acquire(|| SEC) {
                            let n = in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                            assert!(n <= 3, "{n} probes in flight");
                            admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            std::hint::spin_loop();
                            in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                            let v = [Verdict::Success, Verdict::Failure, Verdict::Ignore]
                                [((i + t) % 3) as usize];
                            b.record(a, v, false, || SEC);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(b.state(), State::HalfOpen);
        assert_eq!(b.snapshot(SEC).probes_in_flight, 0, "every slot came back");
        assert!(admitted.load(std::sync::atomic::Ordering::Relaxed) > 1000);
    }

    #[test]
    fn manual_modes() {
        let b = breaker(cfg(|c| c.consecutive_failures = 1));
        b.set_mode(Mode::MetricsOnly);
        for _ in 0..10 {
            call(&b, 0, Verdict::Failure).unwrap();
        }
        assert_eq!(b.state(), State::MetricsOnly);
        assert_eq!(b.snapshot(0).failures, 10);
        b.set_mode(Mode::Disabled);
        assert_eq!(b.acquire(|| 0), Ok(Admission::Untracked));
        b.set_mode(Mode::ForcedOpen);
        assert_eq!(b.acquire(|| 0), Err(Refusal::ForcedOpen));
        b.set_mode(Mode::Normal);
        assert_eq!(b.state(), State::Closed);
        assert_eq!(b.snapshot(0).calls, 0);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::window::WindowKind;
    use loom::sync::Arc;
    use loom::thread;

    fn cfg(probes: u32, window: u32) -> std::sync::Arc<Config> {
        std::sync::Arc::new(Config {
            jitter: 0.0,
            probes,
            probe_successes: 1,
            consecutive_failures: 0,
            failure_rate: None,
            window: WindowKind::Count(window),
            ..Config::default()
        })
    }

    /// Three callers race for two probe slots of a breaker whose open period has ended (so
    /// they also race to move it to half-open): exactly two get one.
    #[test]
    fn loom_half_open_admits_exactly_n() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        model.check(|| {
            let b = Arc::new(Breaker::new("k".into(), cfg(2, 4), State::Closed, 0));
            b.open_for_hint(Duration::from_nanos(1), 0);
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let b = b.clone();
                    thread::spawn(move || b.acquire(|| 10).is_ok())
                })
                .collect();
            let mine = b.acquire(|| 10).is_ok();
            let admitted = handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .chain([mine])
                .filter(|ok| *ok)
                .count();
            assert_eq!(admitted, 2);
            assert_eq!(b.state(), State::HalfOpen);
        });
    }

    /// Two probes finish while a third caller races for a slot: the breaker closes once, the
    /// third caller is either a probe of the half-open period or a counted call of the closed
    /// one, and no slot leaks.
    #[test]
    fn loom_probe_completion_races_admission() {
        loom::model(|| {
            let b = Arc::new(Breaker::new("k".into(), cfg(1, 4), State::Closed, 0));
            b.open_for_hint(Duration::from_nanos(1), 0);
            let p = b.acquire(|| 10).unwrap();
            assert!(matches!(p, Admission::Probe { .. }));
            let b2 = b.clone();
            let finisher = thread::spawn(move || b2.record(p, Verdict::Success, false, || 10));
            let got = b.acquire(|| 10);
            finisher.join().unwrap();
            assert_eq!(b.state(), State::Closed);
            match got {
                Ok(Admission::Counted { .. }) | Err(Refusal::ProbesBusy { .. }) => {}
                Ok(Admission::Probe { .. }) => {
                    // Admitted in the half-open period just before it closed: harmless, and
                    // its slot is cleared by the next half-open period.
                }
                other => panic!("unexpected {other:?}"),
            }
        });
    }

    /// A success that finds the window full of successes records nothing; racing with a
    /// failure, it counts as recorded before that failure, and the totals stay exact.
    #[test]
    fn loom_success_on_a_clean_full_window_races_a_failure() {
        loom::model(|| {
            let b = Arc::new(Breaker::new("k".into(), cfg(1, 2), State::Closed, 0));
            for _ in 0..2 {
                let a = b.acquire(|| 0).unwrap();
                b.record(a, Verdict::Success, false, || 0);
            }
            let handles: Vec<_> = [Verdict::Failure, Verdict::Success]
                .into_iter()
                .map(|v| {
                    let b = b.clone();
                    thread::spawn(move || {
                        let a = b.acquire(|| 0).unwrap();
                        b.record(a, v, false, || 0);
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            let s = b.snapshot(0);
            assert_eq!((s.calls, s.failures), (2, 1));
        });
    }

    /// Concurrent counted outcomes keep the window totals exact.
    #[test]
    fn loom_closed_counters() {
        loom::model(|| {
            let b = Arc::new(Breaker::new("k".into(), cfg(1, 2), State::Closed, 0));
            let handles: Vec<_> = [Verdict::Failure, Verdict::Success]
                .into_iter()
                .map(|v| {
                    let b = b.clone();
                    thread::spawn(move || {
                        let a = b.acquire(|| 0).unwrap();
                        b.record(a, v, false, || 0);
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            let s = b.snapshot(0);
            assert_eq!((s.calls, s.failures), (2, 1));
            // A third call overwrites the oldest slot; totals stay exact. Its head ends any
            // run of failures (a success at the body's end does not).
            let mut a = b.acquire(|| 0).unwrap();
            b.answered(&mut a);
            b.record(a, Verdict::Success, false, || 0);
            let s = b.snapshot(0);
            assert_eq!(s.calls, 2);
            assert!(s.failures <= 1);
            assert_eq!(s.consecutive_failures, 0);
        });
    }
}
