//! Circuit-breaker state shared by a fleet of replicas: [`RedisBreakerState`], a
//! [`SharedBreakerState`] for `seawall-breaker`.
//!
//! # Why
//!
//! Without it each replica learns an upstream outage on its own, each with its own failed
//! calls, and each probes the sick upstream on its own: N replicas send N probes per half-open
//! period. With it a key opened by the fleet opens on every replica within a bounded delay,
//! and one replica at a time probes.
//!
//! # Nothing on the call path
//!
//! A call through a closed breaker costs no round trip: the breaker never asks Redis. Each
//! replica runs one background task (spawned when the layer is built, ended within one
//! interval after the layer, its services and handles are all dropped) that every
//! [`interval`](RedisBreakerStateBuilder::interval) (250 ms by default), or at once after a
//! local event worth telling, makes **one** round trip: one script
//! (`scripts/breaker_sync.lua`) that pushes this replica's evidence and events and returns the
//! keys the fleet holds open. The task then changes the local breakers' ordinary state, which
//! is what calls read.
//!
//! # Keys (under the [`SharedRedis`] prefix, `seawall` by default)
//!
//! - `seawall:breaker:open`: a sorted set of the keys the fleet holds open, scored by the end
//!   of their open period (ms since the Unix epoch, on the replicas' clock).
//! - `seawall:breaker:win:<key>`: the key's shared window, a hash of bucket fields
//!   `<bucket>:c`, `<bucket>:f`, `<bucket>:s` (calls, failures, slow calls), ten buckets per
//!   [`window`](RedisBreakerStateBuilder::window); expires when idle.
//! - `seawall:breaker:lease:<key>`: the probe lease, `<expires ms>:<replica>`.
//!
//! The script derives the last two from the first's prefix, so the keys are meant for one
//! Redis (not a cluster). Two breaker layers of one application with different keys or rules
//! each need their own prefix ([`SharedRedisBuilder::prefix`](crate::SharedRedisBuilder::prefix)).
//!
//! # What is published, when
//!
//! - Every sync: the counted outcomes of each key since the last sync (calls, failures, slow
//!   calls), added to the current bucket of the key's shared window.
//! - At once: an upstream's "open until" (a breaker opened by
//!   [`open_on_retry_hint`](seawall_breaker::CircuitBreakerBuilder::open_on_retry_hint) or
//!   [`open_until`](seawall_breaker::CircuitBreakerBuilder::open_until)), and a breaker
//!   opened by one call of a class that opens it at once (an exhausted quota, by default:
//!   [`open_at_once`](seawall_breaker::CircuitBreakerBuilder::open_at_once)), for its open
//!   period. Neither needs evidence: the upstream said so, of the key every replica calls. It
//!   extends the fleet's open period, never shortens it.
//! - At once: the outcome of the fleet's half-open period (closed, or re-opened for the
//!   breaker's next open period), from the replica holding the probe lease only.
//! - A local trip is not published as such; the replica syncs at once so that its evidence
//!   reaches the shared window without waiting for the interval.
//!
//! # One bad replica does not poison the fleet
//!
//! A key opens fleet-wide only when the **fleet's** window crosses the breaker's own
//! thresholds ([`failure_rate`](seawall_breaker::CircuitBreakerBuilder::failure_rate),
//! [`slow_calls`](seawall_breaker::CircuitBreakerBuilder::slow_calls)) with at least its
//! [`minimum_calls`](seawall_breaker::CircuitBreakerBuilder::minimum_calls). A replica whose
//! own network fails trips its own breaker (local state works as without sharing), but its
//! failures are diluted by the successes of the healthy replicas in the shared window, so the
//! others stay closed. The consecutive-failure rule is local only, for the same reason. The
//! price: a fleet-wide trip needs the fleet's minimum number of calls, and the one replica
//! that saw an outage alone learns nothing from the others until they agree.
//!
//! # The delay bound
//!
//! A change of the fleet's state (a trip by the shared window, a hint, a close) reaches every
//! replica within `interval + timeout`: its next sync starts within one interval and answers
//! within the [`SharedRedis`] timeout. A replica's own event reaches Redis within
//! `2 × timeout` (it syncs at once, perhaps after a sync in flight). So from a trip or a hint
//! on one replica to the key open on another: at most `interval + 3 × timeout`
//! ([`RedisBreakerState::propagation_bound`]; 400 ms with the defaults), plus scheduling
//! delays on a loaded machine.
//!
//! # The probe lease
//!
//! A key the fleet holds open stays open on every replica past its open period: a call then
//! marks it wanted, and the replica's next sync asks for the key's probe lease, which the
//! script grants to one replica (`SET` of `<expires>:<replica>` when no live lease exists).
//! Only that replica turns half-open and admits its
//! [`probes`](seawall_breaker::CircuitBreakerBuilder::probes); the others stay open until the
//! fleet closes the key or the lease expires. The lease lasts the breaker's
//! [`max_probe_wait`](seawall_breaker::CircuitBreakerBuilder::max_probe_wait), so a replica
//! that dies mid-probe blocks the fleet no longer than a hung probe blocks one breaker. An
//! outcome that arrives after the lease expired is dropped, as the breaker drops a late probe.
//! A key whose open period ended ten minutes ago without any replica wanting to probe it is
//! forgotten (the fleet closes it).
//!
//! # While Redis is gone
//!
//! The breaker runs on local state: a failed sync (logged and counted by [`SharedRedis::run`])
//! releases every key the fleet held open, which then goes half-open on its own when its
//! local open period ends, and each replica trips on its own evidence. The evidence and events
//! of a failed sync are dropped: by the time Redis is back they are old. Syncing resumes by
//! itself when Redis answers again. There is no [`OnUnavailable`](crate::OnUnavailable)
//! choice to make: failing closed would turn a Redis outage into an outage of every upstream.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use seawall_breaker::{
    FleetLink, FleetRules, KeyReport, Reason, SharedBreakerState, State, StateChange,
};
use seawall_core::ConfigError;
use tokio::sync::Notify;
use tokio::time::MissedTickBehavior;

use crate::client::SharedRedis;
use crate::clock::{Clock, SystemClock};

/// How often a replica syncs by default.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_millis(250);
/// The shared window when neither the state nor the breaker (with a time window) sets one.
pub(crate) const DEFAULT_WINDOW: Duration = Duration::from_secs(10);
/// How long after its open period a key nobody probed is forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(600);
/// Buckets per shared window.
const BUCKETS: u32 = 10;
/// The store's name in logs and metrics.
const STORE: &str = "breaker";

/// Breaker state shared through Redis; give it to
/// [`CircuitBreakerBuilder::shared_state`](seawall_breaker::CircuitBreakerBuilder::shared_state).
/// See the [module docs](crate::breaker) for what is shared, when, and the delay bound.
///
/// One value shares one layer's breakers (a second `build` with it is refused); its clones
/// read the same counters.
#[derive(Clone)]
pub struct RedisBreakerState {
    inner: Arc<Inner>,
}

/// Builds a [`RedisBreakerState`].
pub struct RedisBreakerStateBuilder {
    redis: SharedRedis,
    interval: Duration,
    window: Option<Duration>,
    clock: Arc<dyn Clock>,
}

struct Inner {
    redis: SharedRedis,
    interval: Duration,
    window: Option<Duration>,
    clock: Arc<dyn Clock>,
    script: redis::Script,
    /// Events to publish at the next sync, queued by `on_state_change` on callers' tasks.
    events: Mutex<Vec<Event>>,
    wake: Notify,
    syncs: AtomicU64,
    attached: AtomicBool,
    running: AtomicBool,
}

#[derive(Debug)]
enum Event {
    Hint(Arc<str>, Duration),
    Closed(Arc<str>),
    Reopen(Arc<str>, Duration),
}

impl RedisBreakerState {
    /// Shares breaker state through `redis` with the defaults.
    pub fn new(redis: SharedRedis) -> Self {
        RedisBreakerState::from_builder(RedisBreakerState::builder(redis))
    }

    /// A builder, starting from the defaults.
    pub fn builder(redis: SharedRedis) -> RedisBreakerStateBuilder {
        RedisBreakerStateBuilder {
            redis,
            interval: DEFAULT_INTERVAL,
            window: None,
            clock: Arc::new(SystemClock),
        }
    }

    fn from_builder(b: RedisBreakerStateBuilder) -> Self {
        RedisBreakerState {
            inner: Arc::new(Inner {
                redis: b.redis,
                interval: b.interval,
                window: b.window,
                clock: b.clock,
                script: redis::Script::new(include_str!("../scripts/breaker_sync.lua")),
                events: Mutex::new(Vec::new()),
                wake: Notify::new(),
                syncs: AtomicU64::new(0),
                attached: AtomicBool::new(false),
                running: AtomicBool::new(false),
            }),
        }
    }

    /// How many syncs (round trips that answered) this replica has made.
    pub fn syncs(&self) -> u64 {
        self.inner.syncs.load(Ordering::Relaxed)
    }

    /// Whether the sync task runs (from the layer's build until shortly after its last
    /// layer, service or handle is dropped).
    pub fn is_running(&self) -> bool {
        self.inner.running.load(Ordering::Relaxed)
    }

    /// The longest a trip or a hint on one replica takes to open the key on another:
    /// `interval + 3 × timeout` (see the [module docs](crate::breaker)).
    pub fn propagation_bound(&self) -> Duration {
        self.inner.interval + 3 * self.inner.redis.timeout()
    }
}

impl RedisBreakerStateBuilder {
    /// How often the replica syncs (10 ms to 1 min). Default 250 ms. Each sync is one round
    /// trip, whatever the traffic.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The span of the shared window the fleet's rates are computed over (1 s to 1 h), kept in
    /// ten buckets. Default: the breaker's time window if it has one, else 10 s.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// The clock open periods, windows and leases are dated by (the wall clock by default;
    /// a [`ManualClock`](crate::ManualClock) in tests). Every replica's clock must agree to
    /// well under the interval (NTP does).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Checks the settings.
    pub fn build(self) -> Result<RedisBreakerState, ConfigError> {
        if !(Duration::from_millis(10)..=Duration::from_secs(60)).contains(&self.interval) {
            return Err(ConfigError::new(
                "interval",
                format!("must be 10ms to 1min, got {:?}", self.interval),
            ));
        }
        if let Some(w) = self.window {
            if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&w) {
                return Err(ConfigError::new(
                    "window",
                    format!("must be 1s to 1h, got {w:?}"),
                ));
            }
        }
        Ok(RedisBreakerState::from_builder(self))
    }
}

impl SharedBreakerState for RedisBreakerState {
    fn attach(&self, link: FleetLink) -> Result<(), ConfigError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            ConfigError::new(
                "shared_state",
                "the layer must be built inside a tokio runtime (the sync task runs on it)",
            )
        })?;
        if self.inner.attached.swap(true, Ordering::Relaxed) {
            return Err(ConfigError::new(
                "shared_state",
                "this RedisBreakerState already shares another layer's breakers",
            ));
        }
        self.inner.running.store(true, Ordering::Relaxed);
        runtime.spawn(sync_loop(self.inner.clone(), link));
        Ok(())
    }

    fn on_state_change(&self, change: &StateChange) {
        let key = change.key.clone();
        let event = match (change.from, change.to, change.reason) {
            // The fleet's own doing: nothing to tell it.
            (_, _, Reason::Shared) => return,
            // The upstream said when to come back, or that the key's quota is gone: a fact
            // about the key, for every replica at once.
            (_, State::Open, Reason::RetryHint | Reason::OpenAtOnce(_)) => {
                Some(Event::Hint(key, change.open_for.unwrap_or_default()))
            }
            (State::HalfOpen, State::Closed, _) => Some(Event::Closed(key)),
            (State::HalfOpen, State::Open, _) => {
                Some(Event::Reopen(key, change.open_for.unwrap_or_default()))
            }
            // A local trip: its evidence goes up now, and the fleet decides.
            (State::Closed, State::Open, _) => None,
            _ => return,
        };
        if let Some(event) = event {
            self.inner
                .events
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(event);
        }
        self.inner.wake.notify_one();
    }

    fn interval(&self) -> Duration {
        self.inner.interval
    }
}

/// The replica's sync task: one round trip per tick or wake, until the layer is gone.
async fn sync_loop(inner: Arc<Inner>, link: FleetLink) {
    let rules = link.rules();
    let mut tick = tokio::time::interval(inner.interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = inner.wake.notified() => {}
        }
        let Some(reports) = link.collect() else {
            break;
        };
        let events =
            std::mem::take(&mut *inner.events.lock().unwrap_or_else(PoisonError::into_inner));
        match inner.sync(&rules, &reports, &events).await {
            Some(open) => {
                apply(&link, &reports, &open);
                inner.syncs.fetch_add(1, Ordering::Relaxed);
            }
            None => link.release_all(),
        }
    }
    inner.running.store(false, Ordering::Relaxed);
    tracing::debug!(target: "seawall::redis", store = STORE, "breaker sync stopped: the layer is gone");
}

/// One key the fleet holds open, as the script answers it.
struct FleetOpen {
    key: String,
    left_ms: i64,
    lease: Lease,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Lease {
    None,
    Mine,
    Other,
}

/// Applies the fleet's answer to the local breakers.
fn apply(link: &FleetLink, reports: &[KeyReport], open: &[FleetOpen]) {
    for o in open {
        match (o.left_ms, o.lease) {
            (left, _) if left > 0 => {
                link.open(&o.key, Duration::from_millis(left.unsigned_abs()));
            }
            (_, Lease::Mine) => link.grant_probe(&o.key),
            // Over, and another replica probes (or nobody yet): stay open.
            _ => link.open(&o.key, Duration::ZERO),
        }
    }
    for r in reports.iter().filter(|r| r.held) {
        if !open.iter().any(|o| *o.key == *r.key) {
            link.close(&r.key);
        }
    }
}

impl Inner {
    /// One round trip: `None` when Redis did not answer (already logged and counted).
    async fn sync(
        &self,
        rules: &FleetRules,
        reports: &[KeyReport],
        events: &[Event],
    ) -> Option<Vec<FleetOpen>> {
        let now = self.clock.now_ms();
        let window = self.window.or(rules.time_window).unwrap_or(DEFAULT_WINDOW);
        let bucket = (window / BUCKETS).max(Duration::from_millis(1));
        let rate = |r: Option<f64>| r.map(|r| r.to_string()).unwrap_or_default();
        let mut inv = self.script.key(self.redis.key(STORE, "open"));
        inv.arg(self.redis.key(STORE, ""))
            .arg(self.redis.replica())
            .arg(now)
            .arg(ms(window))
            .arg(ms(bucket))
            .arg(rules.minimum_calls)
            .arg(rate(rules.failure_rate))
            .arg(rate(rules.slow_call_rate))
            .arg(ms(rules.open_for).max(1))
            .arg(ms(rules.max_probe_wait).max(1))
            .arg(ms(FORGET_AFTER))
            .arg(events.len());
        for e in events {
            let (kind, key, d) = match e {
                Event::Hint(k, d) => ("hint", k, *d),
                Event::Closed(k) => ("closed", k, Duration::ZERO),
                Event::Reopen(k, d) => ("reopen", k, *d),
            };
            inv.arg(kind).arg(&**key).arg(ms(d));
        }
        inv.arg(reports.len());
        for r in reports {
            inv.arg(&*r.key)
                .arg(r.calls)
                .arg(r.failures)
                .arg(r.slow_calls)
                .arg(if r.wants_probe { "1" } else { "0" });
        }
        let inv = &inv;
        let flat: Vec<String> = self
            .redis
            .run(STORE, |mut conn| async move {
                inv.invoke_async(&mut conn).await
            })
            .await
            .ok()?;
        Some(
            flat.chunks_exact(3)
                .map(|c| FleetOpen {
                    key: c[0].clone(),
                    left_ms: c[1].parse().unwrap_or(0),
                    lease: match c[2].as_str() {
                        "1" => Lease::Mine,
                        "2" => Lease::Other,
                        _ => Lease::None,
                    },
                })
                .collect(),
        )
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

impl fmt::Debug for RedisBreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBreakerState")
            .field("redis", &self.inner.redis)
            .field("interval", &self.inner.interval)
            .field("window", &self.inner.window)
            .field("syncs", &self.syncs())
            .field("running", &self.is_running())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for RedisBreakerStateBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBreakerStateBuilder")
            .field("redis", &self.redis)
            .field("interval", &self.interval)
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}
