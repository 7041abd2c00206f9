//! [`RedisBudgetStore`]: one budget for a whole fleet, kept in Redis.
//!
//! With the in-process [`MemoryStore`], each replica enforces its own copy of every budget,
//! so N replicas may spend N times the limit. This store keeps the counters in the fleet's
//! Redis and makes every decision there, so the limit holds for the fleet as it holds for one
//! process: at every admission, settled spend plus outstanding reservations stays within every
//! budget, counted over all replicas. It is a [`BudgetStore`], so a stack switches to it by
//! passing it to `CostBudgetBuilder::store` and nothing else changes; the store conformance
//! tests run against it and against `MemoryStore` alike (the same windows, keys, soft limits).
//!
//! # Key layout
//!
//! Under the [`SharedRedis`] prefix (`seawall` by default), for a budget named `name` (`len`
//! is its length in bytes, so names and keys may hold any character):
//!
//! - `seawall:budget:{len}:{name}:g` for a global budget, `…:k:{key}` per key (keys longer
//!   than core's bound are cut and hashed, as in process): a hash with the settled spend
//!   (`settled`), the outstanding reservations (`reserved`), the end of the calendar period
//!   the spend belongs to (`pend`), the newest rolling sub-window (`head`) and the spend of
//!   each of the 61 sub-windows (`s0`…`s60`), and whether the soft threshold fired (`soft`).
//! - `seawall:budget-lease:…` (same suffix): a sorted set of the leases that make up
//!   `reserved`, member `{amount}:{replica}:{id}`, score the lease's end in milliseconds.
//! - `seawall:budget-id:{replica}:{id}`: an attempt's id record (`r` reserved, `d` settled),
//!   kept for two leases of real time.
//!
//! Counters of calendar and rolling windows expire (real time) once idle for longer than
//! their window plus a lease; counters of total budgets are kept. A budget's name identifies
//! its counters: rename a budget whose window you change.
//!
//! # The scripts, and what a call costs
//!
//! Each decision is one Lua script, which Redis runs alone (`scripts/budget_*.lua`, loaded
//! once and run by hash with EVALSHA):
//!
//! - **reserve** (one round trip, on the caller's path): brings every line's window up to
//!   now, checks `settled + reserved + amount ≤ limit` on every line, then reserves on every
//!   line, or on none. No other admission runs in between, which is what makes the budget
//!   hold for the fleet.
//! - **settle** (one round trip, off the caller's path): removes the reservation and adds the
//!   real cost, returning the soft thresholds it crossed. A release is a settlement of zero.
//! - **read** (one round trip, only when asked): one counter, brought up to now.
//!
//! So an attempt costs two round trips, one of which it waits for.
//!
//! # Leases
//!
//! Every reservation is a lease ([`RedisBudgetStoreBuilder::lease`], [`DEFAULT_LEASE`] by
//! default) whether or not it is ever settled: a replica that dies holding reservations
//! cannot hold them forever. Any script that touches a counter first gives back the leases
//! that ended. A settlement that arrives after its lease still charges its cost (the money
//! was spent); it just has no reservation left to remove.
//!
//! The scripts take their time from the charge (the layer's clock), not from the server, so
//! tests move time through the clock. Leases and windows are therefore on the replicas'
//! clocks: a replica whose clock runs ahead by Δ ends the others' leases Δ early (and sees
//! a calendar period start Δ early); one that runs behind keeps them Δ longer. Keep clocks
//! synchronised (NTP keeps them within milliseconds, far below a lease or a window).
//!
//! # Idempotency
//!
//! Every attempt's [`Charge::id`] is made unique in the fleet by the replica's name
//! ([`SharedRedis::replica`]; give each replica its own). A reservation repeated with the same
//! id is a no-op, and so is a repeated settlement, so nothing is charged twice when a script
//! ran but its answer came too late. When a reservation times out, the store queues a release
//! of its id on the same multiplexed connection (so Redis runs it after the reservation, if
//! the reservation reached it at all), and a release that arrives first marks the id, so a
//! reservation arriving late does nothing. The same release is queued when the caller drops
//! the call while the reservation is in flight.
//!
//! # Settling without blocking
//!
//! [`BudgetStore::settle`] spawns the settlement on the tokio runtime (the current one, or
//! the one the store was built on) and answers [`Settled::Pending`] at once; the layer
//! reports the soft thresholds it crossed when Redis answers, from that task. A settlement
//! that fails is retried (it is idempotent) with a growing pause (up to a second), until its
//! lease has passed, after which its reservation has expired anyway and the cost is logged as
//! lost. The release of a reservation that was never decided (it timed out, or its caller
//! went away) is retried for twenty timeouts only: after that its lease frees it, and a long
//! outage does not pile up one retrying task per refused call.
//!
//! # When Redis is slow or gone
//!
//! Each script call has the [`SharedRedis`] timeout; what follows is the store's
//! [`OnUnavailable`] policy ([`RedisBudgetStoreBuilder::on_unavailable`], fail closed by
//! default, since a budget guards money):
//!
//! - [`OnUnavailable::FailClosed`]: the attempt is refused, and the layer answers an
//!   `LlmError` of class `SharedStateUnavailable`.
//! - [`OnUnavailable::FailOpen`]: the attempt is decided by an in-process [`MemoryStore`]
//!   whose limits are each budget's limit divided by the number of replicas, so the fleet
//!   stays near its limit while it cannot coordinate. An attempt reserved there is settled
//!   there (never in Redis, so it is counted once); that local spend is not copied to Redis
//!   when it comes back.
//!
//! Either way no call waits longer than the timeout, [`SharedRedis::run`] logs the
//! degradation and the recovery and counts the failures, and the connection is remade on
//! its own.
//!
//! # Reading the counters
//!
//! [`BudgetStore::spend`] cannot wait for Redis: it answers the counter as this replica last
//! saw it (after its last reservation or read). [`BudgetStore::read`] (the layer's
//! `read_spend`) asks Redis.
//!
//! # Limits of exactness
//!
//! Amounts are exact 64-bit integers in Redis, but the scripts compare them as Lua numbers,
//! exact up to 2^53 nano-dollars (about $9 million) per counter; a single attempt's amount
//! or cost is capped there too.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::Script;
use seawall_budget::{
    Admission, Budget, BudgetStore, Charge, Exceeded, MemoryStore, Refusal, Settled,
    SoftLimitCrossed, Spend, SpendFuture, StoreUnavailable, Timestamp, Usd, Window,
};
use seawall_core::{ConfigError, bound_key};

use crate::client::{SharedRedis, Unavailable};
use crate::policy::OnUnavailable;

/// How long a reservation lives if it is never settled: 11 minutes.
///
/// A little over the longest attempt: the OpenAI and Anthropic clients give up on a request
/// after 10 minutes by default, so an attempt still running after 11 is very rare, while a
/// replica that died gives its reservations back within minutes. An attempt that outlives its
/// lease is still charged in full when it settles; only its reservation stopped counting.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(11 * 60);

/// The largest amount the scripts count exactly (2^53 nano-dollars).
const MAX_EXACT: u64 = 1 << 53;

/// How many counters [`BudgetStore::spend`] remembers before it forgets them all.
const SEEN_MAX: usize = 4096;

const STORE: &str = "budget";

/// How many timeouts a release is retried for before the lease is left to free it.
const RELEASE_TRIES: u32 = 20;

fn scripts() -> (Script, Script, Script) {
    const COMMON: &str = include_str!("../scripts/budget_common.lua");
    let with_common = |body: &str| Script::new(&format!("{COMMON}\n{body}"));
    (
        with_common(include_str!("../scripts/budget_reserve.lua")),
        with_common(include_str!("../scripts/budget_settle.lua")),
        with_common(include_str!("../scripts/budget_read.lua")),
    )
}

/// A [`BudgetStore`] shared by every replica of a fleet, on Redis (see the [module
/// documentation](crate::budget) for the layout, the scripts, leases and failure policy).
///
/// ```no_run
/// use seawall_budget::{Budget, CostBudgetLayer, PriceTable, Usd};
/// use seawall_redis::{OnUnavailable, RedisBudgetStore, SharedRedis};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let redis = SharedRedis::new("redis://127.0.0.1:6379/").unwrap();
/// let store = RedisBudgetStore::builder(redis)
///     .on_unavailable(OnUnavailable::fail_open(4))
///     .build()
///     .unwrap();
/// let layer = CostBudgetLayer::builder(PriceTable::new())
///     .budget(Budget::daily("fleet-daily", Usd::from_dollars(100)))
///     .store(store)
///     .build()
///     .unwrap();
/// # let _ = layer;
/// # }
/// ```
#[derive(Clone)]
pub struct RedisBudgetStore {
    inner: Arc<Inner>,
}

struct Inner {
    redis: SharedRedis,
    on_unavailable: OnUnavailable,
    lease: Duration,
    reserve: Script,
    settle: Script,
    read: Script,
    /// Decides while Redis cannot, on each limit's share (fail open only).
    local: MemoryStore,
    /// The ids reserved in `local`, to be settled there.
    local_ids: Mutex<HashSet<u64>>,
    /// The counters as last seen, for `spend`.
    seen: Mutex<HashMap<CounterName, Spend>>,
    /// Where settlements run when the caller is not on a runtime.
    runtime: Option<tokio::runtime::Handle>,
}

impl fmt::Debug for RedisBudgetStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBudgetStore")
            .field("redis", &self.inner.redis)
            .field("on_unavailable", &self.inner.on_unavailable)
            .field("lease", &self.inner.lease)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisBudgetStore`].
#[derive(Debug, Clone)]
pub struct RedisBudgetStoreBuilder {
    redis: SharedRedis,
    on_unavailable: OnUnavailable,
    lease: Duration,
}

impl RedisBudgetStore {
    /// A store on `redis` with the defaults: fail closed, leases of [`DEFAULT_LEASE`].
    pub fn new(redis: SharedRedis) -> RedisBudgetStore {
        RedisBudgetStore::from_builder(RedisBudgetStore::builder(redis))
    }

    /// A builder for a store on `redis`.
    pub fn builder(redis: SharedRedis) -> RedisBudgetStoreBuilder {
        RedisBudgetStoreBuilder {
            redis,
            on_unavailable: OnUnavailable::FailClosed,
            lease: DEFAULT_LEASE,
        }
    }

    fn from_builder(b: RedisBudgetStoreBuilder) -> RedisBudgetStore {
        let (reserve, settle, read) = scripts();
        RedisBudgetStore {
            inner: Arc::new(Inner {
                redis: b.redis,
                on_unavailable: b.on_unavailable,
                lease: b.lease,
                reserve,
                settle,
                read,
                local: MemoryStore::new(),
                local_ids: Mutex::default(),
                seen: Mutex::default(),
                runtime: tokio::runtime::Handle::try_current().ok(),
            }),
        }
    }

    /// The connection this store uses.
    pub fn redis(&self) -> &SharedRedis {
        &self.inner.redis
    }

    /// How long an unsettled reservation lives.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// The in-process store that decides while Redis cannot (fail open only), on each
    /// budget's share of its limit.
    pub fn local(&self) -> &MemoryStore {
        &self.inner.local
    }

    /// Reserves like [`BudgetStore::reserve`], and answers the counter of every line as the
    /// reservation left it, read inside the same script (so no other admission came in
    /// between). Empty when the id was already reserved (a no-op). While Redis is
    /// unavailable and the store fails open, the counters of the local store, on its shares.
    pub fn reserve_counted(
        &self,
        charge: &Charge<'_>,
    ) -> impl Future<Output = Result<Vec<Spend>, Refusal>> + Send + 'static {
        let call = Call::new(&self.inner, charge);
        // Dropped before it is decided, the reservation may still run in Redis: give it back.
        let mut pending = ReleaseOnDrop {
            store: self.clone(),
            call: Some(call),
        };
        async move {
            let Some(call) = pending.call.as_ref() else {
                return Ok(Vec::new());
            };
            let decided = pending.store.reserve_call(call).await;
            pending.disarm();
            decided
        }
    }

    async fn reserve_call(&self, call: &Call) -> Result<Vec<Spend>, Refusal> {
        let inner = &self.inner;
        if inner.redis.skip_while_degraded() {
            // Nothing was sent, so there is nothing to give back.
            return self.unavailable(call, &crate::Unavailable::Degraded);
        }
        let answer = inner
            .redis
            .run(STORE, |mut conn| async move {
                let mut inv = call.invocation(&inner.reserve);
                inv.arg(call.now_ms())
                    .arg(call.now_ms().saturating_add(millis(inner.lease)))
                    .arg(millis(inner.lease) * 2)
                    .arg(call.amount)
                    .arg(&call.member);
                for line in &call.lines {
                    let w = WindowArgs::new(&line.budget, call.now, inner.lease);
                    inv.arg(line.budget.limit().as_nanos())
                        .arg(w.kind)
                        .arg(w.arg)
                        .arg(w.soft)
                        .arg(w.ttl);
                }
                inv.invoke_async::<Vec<String>>(&mut conn).await
            })
            .await;
        match answer {
            Ok(reply) => self.admitted(call, &reply),
            Err(why) => {
                // It may have run after all: give it back, after it on the same connection.
                self.queue_settle(call.clone(), 0, self.undecided_retries());
                self.unavailable(call, &why)
            }
        }
    }

    /// Reads the reserve script's reply.
    fn admitted(&self, call: &Call, reply: &[String]) -> Result<Vec<Spend>, Refusal> {
        let nums = |i: usize| reply.get(i).and_then(|s| s.parse::<u64>().ok());
        match reply.first().map(String::as_str) {
            Some("ok") => {
                let spends: Vec<Spend> = call
                    .lines
                    .iter()
                    .enumerate()
                    .map(|(i, line)| Spend {
                        spent: Usd::from_nanos(nums(1 + 2 * i).unwrap_or(0)),
                        reserved: Usd::from_nanos(nums(2 + 2 * i).unwrap_or(0)),
                        limit: line.budget.limit(),
                    })
                    .collect();
                self.saw(call.lines.iter().zip(&spends));
                Ok(spends)
            }
            Some("seen") => Ok(Vec::new()),
            Some("no") => {
                let line = nums(1)
                    .and_then(|i| call.lines.get(usize::try_from(i).ok()?.checked_sub(1)?))
                    .ok_or_else(|| malformed("reserve"))?;
                let spend = Spend {
                    spent: Usd::from_nanos(nums(2).unwrap_or(0)),
                    reserved: Usd::from_nanos(nums(3).unwrap_or(0)),
                    limit: line.budget.limit(),
                };
                self.saw([(line, &spend)]);
                Err(Refusal::Exceeded(Exceeded {
                    budget: line.budget.name_arc().clone(),
                    key: line.key.as_ref().map(|k| Arc::from(bound_key(k))),
                    spend,
                    requested: Usd::from_nanos(call.amount),
                }))
            }
            _ => Err(malformed("reserve")),
        }
    }

    /// Redis did not answer: refuse, or decide on the local shares.
    fn unavailable(&self, call: &Call, why: &Unavailable) -> Result<Vec<Spend>, Refusal> {
        let OnUnavailable::FailOpen { replicas } = self.inner.on_unavailable else {
            return Err(Refusal::Unavailable(StoreUnavailable {
                reason: why.to_string(),
            }));
        };
        let (shares, keys) = call.shares(replicas.get());
        let charge =
            Charge::new(&shares, &keys, Usd::from_nanos(call.amount), call.now).with_id(call.id);
        let Admission::Ready(decided) = self.inner.local.reserve(&charge) else {
            return Err(malformed("local reserve"));
        };
        decided?;
        lock(&self.inner.local_ids).insert(call.id);
        tracing::debug!(target: "seawall::redis", store = STORE, id = call.id,
            "reserved on this replica's share while redis is unavailable");
        Ok(charge
            .lines()
            .map(|(b, k)| self.inner.local.spend(b, k.map(|k| &**k), call.now))
            .collect())
    }

    /// Runs the settle script on the runtime, retried until it answers or `give_up` has
    /// passed, and answers the soft thresholds it crossed.
    fn queue_settle(
        &self,
        call: Call,
        cost: u64,
        give_up: Duration,
    ) -> tokio::sync::oneshot::Receiver<Vec<SoftLimitCrossed>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let store = self.clone();
        let task = async move {
            let crossed = store.settle_call(&call, cost, give_up).await;
            let _ = tx.send(crossed);
        };
        match tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.inner.runtime.clone())
        {
            Some(rt) => {
                rt.spawn(task);
            }
            None => tracing::warn!(target: "seawall::redis", store = STORE,
                "no tokio runtime to settle on; the reservation will end with its lease"),
        }
        rx
    }

    async fn settle_call(
        &self,
        call: &Call,
        cost: u64,
        give_up: Duration,
    ) -> Vec<SoftLimitCrossed> {
        let inner = &self.inner;
        let started = tokio::time::Instant::now();
        let mut pause = inner.redis.timeout();
        loop {
            let answer = inner
                .redis
                .run(STORE, |mut conn| async move {
                    let mut inv = call.invocation(&inner.settle);
                    inv.arg(call.now_ms())
                        .arg(millis(inner.lease) * 2)
                        .arg(call.amount)
                        .arg(&call.member)
                        .arg(cost);
                    for line in &call.lines {
                        let w = WindowArgs::new(&line.budget, call.now, inner.lease);
                        inv.arg(w.kind).arg(w.arg).arg(w.soft).arg(w.ttl);
                    }
                    inv.invoke_async::<Vec<String>>(&mut conn).await
                })
                .await;
            match answer {
                Ok(reply) => return crossings(call, &reply),
                Err(why) if started.elapsed() >= give_up => {
                    tracing::warn!(target: "seawall::redis", store = STORE, id = call.id,
                        cost_nanos = cost, error = %why,
                        "gave up settling; the reservation ends with its lease, and this cost is not counted");
                    return Vec::new();
                }
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// How long the release of an undecided reservation is retried: it only undoes a
    /// reservation that its lease frees anyway, so a long outage must not pile up a retrying
    /// task per refused call.
    fn undecided_retries(&self) -> Duration {
        let inner = &self.inner;
        inner
            .redis
            .timeout()
            .saturating_mul(RELEASE_TRIES)
            .min(inner.lease)
    }

    fn saw<'a>(&self, lines: impl IntoIterator<Item = (&'a Line, &'a Spend)>) {
        let mut seen = lock(&self.inner.seen);
        if seen.len() >= SEEN_MAX {
            seen.clear();
        }
        for (line, spend) in lines {
            let key = line.key.as_ref().map(|k| Arc::from(bound_key(k)));
            seen.insert((line.budget.name_arc().clone(), key), *spend);
        }
    }
}

impl RedisBudgetStoreBuilder {
    /// What the store does while Redis does not answer in time (default: fail closed).
    pub fn on_unavailable(mut self, policy: OnUnavailable) -> Self {
        self.on_unavailable = policy;
        self
    }

    /// How long an unsettled reservation lives (default [`DEFAULT_LEASE`]): a little over
    /// the longest attempt, so only the reservations of replicas that died expire.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The store. Fails on a lease under one second or over a day.
    pub fn build(self) -> Result<RedisBudgetStore, ConfigError> {
        if self.lease < Duration::from_secs(1) || self.lease > Duration::from_secs(86_400) {
            return Err(ConfigError::new(
                "lease",
                format!(
                    "must be one second to one day, a little over the longest attempt, not {:?}",
                    self.lease
                ),
            ));
        }
        Ok(RedisBudgetStore::from_builder(self))
    }
}

impl BudgetStore for RedisBudgetStore {
    fn reserve(&self, charge: &Charge<'_>) -> Admission {
        let decided = self.reserve_counted(charge);
        Admission::Pending(Box::pin(async move { decided.await.map(drop) }))
    }

    fn settle(&self, charge: &Charge<'_>, cost: Usd) -> Settled {
        if lock(&self.inner.local_ids).remove(&charge.id()) {
            // Reserved on the local share: settled there, and only there.
            let call = Call::new(&self.inner, charge);
            let OnUnavailable::FailOpen { replicas } = self.inner.on_unavailable else {
                return Settled::Ready(Vec::new());
            };
            let (shares, keys) = call.shares(replicas.get());
            let local = Charge::new(&shares, &keys, charge.amount(), charge.now()).with_id(call.id);
            return self.inner.local.settle(&local, cost);
        }
        // Admitted: retried until the lease has passed (the reservation is gone by then).
        let report = self.queue_settle(
            Call::new(&self.inner, charge),
            clamp(cost),
            self.inner.lease,
        );
        Settled::Pending(Box::pin(async move { report.await.unwrap_or_default() }))
    }

    fn spend(&self, budget: &Budget, key: Option<&str>, _now: Timestamp) -> Spend {
        let seen = lock(&self.inner.seen);
        let key = key.map(|k| Arc::from(bound_key(k)));
        seen.get(&(budget.name_arc().clone(), key)).map_or_else(
            || Spend {
                limit: budget.limit(),
                ..Spend::default()
            },
            |s| Spend {
                limit: budget.limit(),
                ..*s
            },
        )
    }

    fn read(&self, budget: &Budget, key: Option<&str>, now: Timestamp) -> SpendFuture {
        let store = self.clone();
        let line = Line {
            budget: budget.clone(),
            key: key.map(Arc::from),
        };
        Box::pin(async move {
            let inner = &store.inner;
            let (c, l) = counter_keys(&inner.redis, &line);
            let w = WindowArgs::new(&line.budget, now, inner.lease);
            let reply = inner
                .redis
                .run(STORE, |mut conn| async move {
                    inner
                        .read
                        .key(&c)
                        .key(&l)
                        .arg(now.as_unix_millis())
                        .arg(w.kind)
                        .arg(w.arg)
                        .arg(w.soft)
                        .arg(w.ttl)
                        .invoke_async::<Vec<String>>(&mut conn)
                        .await
                })
                .await
                .map_err(|why| StoreUnavailable {
                    reason: why.to_string(),
                })?;
            let num = |i: usize| reply.get(i).and_then(|s| s.parse().ok()).unwrap_or(0);
            let spend = Spend {
                spent: Usd::from_nanos(num(0)),
                reserved: Usd::from_nanos(num(1)),
                limit: line.budget.limit(),
            };
            store.saw([(&line, &spend)]);
            Ok(spend)
        })
    }
}

/// A counter's name: its budget's name and its (bounded) key.
type CounterName = (Arc<str>, Option<Arc<str>>);

/// One budget line of a charge, owned so the script can run after the call returned.
#[derive(Debug, Clone)]
struct Line {
    budget: Budget,
    key: Option<Arc<str>>,
}

/// Everything a script needs about one charge.
#[derive(Debug, Clone)]
struct Call {
    id: u64,
    id_key: String,
    member: String,
    keys: Vec<(String, String)>,
    lines: Vec<Line>,
    amount: u64,
    now: Timestamp,
}

impl Call {
    fn new(inner: &Inner, charge: &Charge<'_>) -> Call {
        let replica = inner.redis.replica();
        let amount = clamp(charge.amount());
        let lines: Vec<Line> = charge
            .lines()
            .map(|(b, k)| Line {
                budget: b.clone(),
                key: k.cloned(),
            })
            .collect();
        Call {
            id: charge.id(),
            id_key: inner
                .redis
                .key("budget-id", &format!("{replica}:{}", charge.id())),
            member: format!("{amount}:{replica}:{}", charge.id()),
            keys: lines
                .iter()
                .map(|l| counter_keys(&inner.redis, l))
                .collect(),
            lines,
            amount,
            now: charge.now(),
        }
    }

    /// `script` with this charge's keys: its id record, then each line's counter and leases.
    fn invocation<'s>(&self, script: &'s Script) -> redis::ScriptInvocation<'s> {
        let mut inv = script.prepare_invoke();
        inv.key(&self.id_key);
        for (c, l) in &self.keys {
            inv.key(c).key(l);
        }
        inv
    }

    fn now_ms(&self) -> u64 {
        self.now.as_unix_millis()
    }

    /// The lines' budgets on `1 / replicas` of their limits, and their keys.
    fn shares(&self, replicas: u32) -> (Vec<Budget>, Vec<Option<Arc<str>>>) {
        self.lines
            .iter()
            .map(|l| (l.budget.share(replicas), l.key.clone()))
            .unzip()
    }
}

/// The counter hash and the lease set of one line.
fn counter_keys(redis: &SharedRedis, line: &Line) -> (String, String) {
    let name = line.budget.name();
    let suffix = match &line.key {
        None => format!("{}:{name}:g", name.len()),
        Some(k) => format!("{}:{name}:k:{}", name.len(), bound_key(k)),
    };
    (
        redis.key("budget", &suffix),
        redis.key("budget-lease", &suffix),
    )
}

/// A line's window, as the scripts take it.
struct WindowArgs {
    kind: &'static str,
    arg: u64,
    soft: String,
    ttl: u64,
}

impl WindowArgs {
    fn new(budget: &Budget, now: Timestamp, lease: Duration) -> WindowArgs {
        let window = budget.window();
        let (kind, arg, span) = match window {
            Window::Total => ("t", 0, None),
            Window::Calendar(_) => {
                let end = window.period_end(now).unwrap_or(now);
                (
                    "c",
                    end.as_unix_millis(),
                    Some(end.saturating_duration_since(now)),
                )
            }
            Window::Rolling(d) => (
                "r",
                window.bucket_index(now),
                Some(d + Duration::from_nanos(window.bucket_nanos())),
            ),
        };
        WindowArgs {
            kind,
            arg,
            soft: budget
                .soft_limit()
                .map_or_else(String::new, |s| s.as_nanos().to_string()),
            ttl: span.map_or(0, |s| millis(s + lease).max(1)),
        }
    }
}

/// The soft thresholds in the settle script's reply.
fn crossings(call: &Call, reply: &[String]) -> Vec<SoftLimitCrossed> {
    reply
        .chunks_exact(2)
        .filter_map(|pair| {
            let line = call
                .lines
                .get(pair[0].parse::<usize>().ok()?.checked_sub(1)?)?;
            Some(SoftLimitCrossed {
                budget: line.budget.name_arc().clone(),
                key: line.key.clone(),
                spent: Usd::from_nanos(pair[1].parse().ok()?),
                threshold: line.budget.soft_limit()?,
                limit: line.budget.limit(),
            })
        })
        .collect()
}

/// Drops a reservation whose answer nobody waits for any more.
struct ReleaseOnDrop {
    store: RedisBudgetStore,
    call: Option<Call>,
}

impl ReleaseOnDrop {
    /// The reservation is decided: nothing to give back on drop.
    fn disarm(&mut self) {
        self.call = None;
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        // `call` is taken once the reservation is decided: from then on the layer settles it
        // (admitted) or there is nothing to give back (refused). Still here, the caller went
        // away while the script may have run; a release of its id undoes it, or marks the id
        // so that a reservation still on its way does nothing.
        if let Some(call) = self.call.take() {
            let retries = self.store.undecided_retries();
            drop(self.store.queue_settle(call, 0, retries));
        }
    }
}

fn clamp(amount: Usd) -> u64 {
    amount.as_nanos().min(MAX_EXACT)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn malformed(script: &str) -> Refusal {
    Refusal::Unavailable(StoreUnavailable {
        reason: format!("unexpected answer from the budget {script} script"),
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain sets and maps: a panic elsewhere cannot leave them torn.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
