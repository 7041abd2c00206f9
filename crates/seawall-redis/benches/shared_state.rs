//! What shared state on Redis costs a call, beside the same layers with in-process state, so
//! that the figures BENCHMARKS.md gives for a fleet come from one reproducible run:
//!
//! - **round trips per attempt**, counted by Redis itself (`INFO commandstats` before and
//!   after, once every asynchronous settlement has landed);
//! - **latency per call** (p50/p99) of sequential calls, against a loopback Redis;
//! - **calls/s** one replica sustains: 64 tasks calling at once on a 2-worker runtime.
//!
//! ```text
//! cargo bench -p seawall-redis --bench shared_state
//! QUICK=1 cargo bench -p seawall-redis --bench shared_state   # smoke run: figures mean nothing
//! ```
//!
//! It starts its own `redis-server` (on a free loopback port, no persistence) and prints a
//! Markdown table ready to paste. The inner service answers at once, so every microsecond in
//! the table is the layers' and Redis's. Every variant gets its own key prefix, so no variant
//! reads another's counters.

use std::collections::BTreeMap;
use std::future::{Future, ready};
use std::hint::black_box;
use std::pin::Pin;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use seawall_breaker::CircuitBreakerLayer;
use seawall_budget::{Budget, CostBudgetLayer, FixedKey, Price, PriceTable, Usd};
use seawall_core::LlmError;
use seawall_gate::{ConcurrencyGateLayer, Rates};
use seawall_redis::redis::{self, AsyncCommands};
use seawall_redis::{FleetLimitLayer, RedisBreakerState, RedisBudgetStore, SharedRedis};
use seawall_test_support::{Bare, Done, RedisServer, eventually};
use tower::{Layer, Service, ServiceExt, service_fn};

/// Tasks calling at once in the throughput run, and the runtime's workers.
const TASKS: usize = 64;
const WORKERS: usize = 2;

/// The request: a model, a prompt estimate and a maximum output, nothing else to clone.
const ASK: Bare = Bare {
    model: "gpt-4o-mini",
    input: 100,
    max: Some(256),
};

/// How long each measurement runs.
struct Plan {
    warm_up: usize,
    sequential: usize,
    throughput: Duration,
}

impl Plan {
    fn from_env() -> Plan {
        if std::env::var_os("QUICK").is_some() {
            Plan {
                warm_up: 200,
                sequential: 1_000,
                throughput: Duration::from_millis(300),
            }
        } else {
            Plan {
                warm_up: 2_000,
                sequential: 20_000,
                throughput: Duration::from_secs(3),
            }
        }
    }
}

/// The inner service: always ready, answers a finished response at once.
fn noop() -> impl Service<Bare, Response = Done, Error = LlmError, Future: Send> + Clone + Send {
    service_fn(|_: Bare| ready(Ok::<_, LlmError>(Done)))
}

/// For scale: a call that is one bare round trip (`PING`) through [`SharedRedis::run`], the
/// path every script of the layers takes (the shared connection, the timeout).
#[derive(Clone)]
struct Ping(SharedRedis);

impl Service<Bare> for Ping {
    type Response = Done;
    type Error = LlmError;
    type Future = Pin<Box<dyn Future<Output = Result<Done, LlmError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Bare) -> Self::Future {
        let redis = self.0.clone();
        Box::pin(async move {
            let pong = redis.run("bench", |mut c| async move {
                redis::cmd("PING").query_async::<String>(&mut c).await
            });
            pong.await.expect("PING");
            Ok(Done)
        })
    }
}

/// Limits far above what the bench sends: the rate path runs, never throttles.
fn rates() -> Rates {
    Rates::new()
        .requests_per_minute(1_000_000_000)
        .tokens_per_minute(1_000_000_000)
}

/// The budget of the crate's own bench: a monthly total, a daily one per model and an hourly
/// one per tenant, far above what the bench spends.
fn budget(store: Option<RedisBudgetStore>) -> CostBudgetLayer<FixedKey> {
    let limit = Usd::from_dollars(1_000_000);
    let price = Price::per_million(Usd::from_dollars(1), Usd::from_dollars(4));
    let mut b = CostBudgetLayer::builder(PriceTable::new().with(ASK.model, price))
        .budget(Budget::monthly("monthly", limit))
        .budget(Budget::daily("per-model", limit).per_model())
        .budget(Budget::hourly("per-tenant", limit).per_key("tenant"))
        .keys(FixedKey::new("acme"));
    if let Some(store) = store {
        b = b.store(store);
    }
    b.build().expect("a valid budget")
}

/// The gate: as many permits as there are calling tasks (no call queues), with the rates in
/// process, or without (in front of the fleet limits, whose rates are the ones that count).
fn gate(with_rates: bool) -> ConcurrencyGateLayer {
    let b = ConcurrencyGateLayer::builder().limit(TASKS);
    let b = if with_rates { b.rates(rates()) } else { b };
    b.build().expect("a valid gate")
}

/// The breaker: in process, or sharing its view with the fleet through `redis`. A call
/// through a closed breaker costs no round trip (the state syncs in the background, four
/// times a second), so the Redis stack's round trips per attempt stay those of the budget and
/// the fleet limits (4.00).
fn breaker(redis: Option<SharedRedis>) -> CircuitBreakerLayer {
    let b = CircuitBreakerLayer::builder();
    let b = match redis {
        Some(redis) => b.shared_state(RedisBreakerState::new(redis)),
        None => b,
    };
    b.build().expect("a valid breaker")
}

/// A handle on the bench's server under a prefix of its own. The timeout is far above the
/// 50 ms default so that a busy machine slows the figures down rather than failing calls.
fn shared(url: &str, prefix: &str) -> SharedRedis {
    SharedRedis::builder(url)
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a valid Redis URL")
}

/// One row of the table.
struct Row {
    layers: &'static str,
    state: &'static str,
    p50_us: f64,
    p99_us: f64,
    calls_per_s: f64,
    round_trips: f64,
    in_scripts: f64,
    redis_us: f64,
    commands: BTreeMap<String, Count>,
}

/// One command's count in `INFO commandstats`: calls, and the server's time running them.
#[derive(Debug, Default, Clone, Copy)]
struct Count {
    calls: u64,
    usec: u64,
}

/// Redis as the bench sees it: the server's own command counts, and whether settlements are
/// still on their way.
struct Probe {
    conn: redis::aio::MultiplexedConnection,
}

/// The commands that are round trips: the layers send nothing but scripts, run by hash (or
/// loaded, then run, when the server does not have them yet), and the reference row sends
/// `PING`. Redis also counts the commands a script runs inside itself (`hget`, `zadd`, ...);
/// those are not round trips, and none of the scripts calls these.
const ROUND_TRIPS: [&str; 4] = ["evalsha", "eval", "script|load", "ping"];

/// Commands the probe sends itself, left out of the counts.
const PROBE: [&str; 3] = ["info", "config|resetstat", "keys"];

impl Probe {
    async fn reset(&mut self) {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut self.conn)
            .await
            .expect("CONFIG RESETSTAT");
    }

    /// The counts of every command but the probe's own since the last reset, from `INFO
    /// commandstats` (`cmdstat_evalsha:calls=12,usec=345,...`).
    async fn commands(&mut self) -> BTreeMap<String, Count> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.conn)
            .await
            .expect("INFO commandstats");
        info.lines()
            .filter_map(|line| {
                let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let field = |key: &str| -> Option<u64> {
                    let v = stats.split(',').find_map(|kv| kv.strip_prefix(key))?;
                    v.strip_prefix('=')?.parse().ok()
                };
                let count = Count {
                    calls: field("calls")?,
                    usec: field("usec")?,
                };
                Some((name.to_owned(), count))
            })
            .filter(|(name, _)| !PROBE.contains(&name.as_str()))
            .collect()
    }

    /// Waits until every reservation and every fleet hold under `prefix` is settled: the
    /// settlements run in background tasks after the calls have returned, and each removes
    /// its lease (an empty sorted set is deleted), so no key left means none is on its way.
    async fn settled(&mut self, prefix: &str) {
        let patterns = [
            format!("{prefix}:budget-lease:*"),
            format!("{prefix}:fleet:*:h"),
        ];
        let conn = self.conn.clone();
        let done = eventually(Duration::from_secs(60), || {
            let (mut conn, patterns) = (conn.clone(), patterns.clone());
            async move {
                for p in &patterns {
                    let keys: Vec<String> = conn.keys(p).await.expect("KEYS");
                    if !keys.is_empty() {
                        return false;
                    }
                }
                true
            }
        })
        .await;
        assert!(done, "settlements under {prefix} still pending after 60 s");
    }
}

/// Calls `svc` once and drops the response (which ends the call: hooks fire, permits go back).
async fn call<S>(svc: &mut S)
where
    S: Service<Bare, Response = Done, Error = LlmError>,
{
    let svc = svc.ready().await.expect("always ready");
    match svc.call(black_box(ASK)).await {
        Ok(done) => drop(black_box(done)),
        Err(e) => panic!("a call failed, so the figures would be wrong: {e}"),
    }
}

/// Measures one variant: warm-up, sequential latency, then throughput with [`TASKS`] tasks;
/// counts the Redis commands of everything after the warm-up.
async fn measure<S>(
    plan: &Plan,
    probe: &mut Probe,
    prefix: &str,
    layers: &'static str,
    state: &'static str,
    svc: S,
) -> Row
where
    S: Service<Bare, Response = Done, Error = LlmError> + Clone + Send + 'static,
    S::Future: Send,
{
    let mut one = svc.clone();
    for _ in 0..plan.warm_up {
        call(&mut one).await;
    }
    probe.settled(prefix).await;
    probe.reset().await;

    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("a histogram");
    for _ in 0..plan.sequential {
        let start = Instant::now();
        call(&mut one).await;
        hist.saturating_record(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }

    let calls = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + plan.throughput;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (mut svc, calls) = (svc.clone(), calls.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while Instant::now() < end {
                    call(&mut svc).await;
                    n += 1;
                }
                calls.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a calling task");
    }
    let elapsed = start.elapsed();
    let parallel = calls.load(Ordering::Relaxed);

    probe.settled(prefix).await;
    let commands = probe.commands().await;
    let attempts = plan.sequential as u64 + parallel;
    let per_attempt = |pick: fn(&str, &Count) -> Option<u64>| {
        let total: u64 = commands.iter().filter_map(|(n, c)| pick(n, c)).sum();
        total as f64 / attempts as f64
    };
    let row = Row {
        layers,
        state,
        p50_us: hist.value_at_quantile(0.50) as f64 / 1e3,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1e3,
        calls_per_s: parallel as f64 / elapsed.as_secs_f64(),
        round_trips: per_attempt(|name, c| ROUND_TRIPS.contains(&name).then_some(c.calls)),
        in_scripts: per_attempt(|name, c| (!ROUND_TRIPS.contains(&name)).then_some(c.calls)),
        // A script's time includes the commands it runs.
        redis_us: per_attempt(|name, c| ROUND_TRIPS.contains(&name).then_some(c.usec)),
        commands,
    };
    eprintln!(
        "{layers} ({state}): {attempts} attempts, Redis counted {:?}",
        row.commands
    );
    row
}

async fn run(plan: Plan, url: String) -> Vec<Row> {
    let client = redis::Client::open(url.as_str()).expect("a valid Redis URL");
    let mut probe = Probe {
        conn: client
            .get_multiplexed_async_connection()
            .await
            .expect("a connection to the bench's redis-server"),
    };
    let p = &plan;
    let probe = &mut probe;
    let store = |redis| RedisBudgetStore::new(redis);
    let fleet = |redis| FleetLimitLayer::new(redis, rates());
    // The stack's layers share one handle (one connection), as a replica's do.
    let stack = shared(&url, "v6");

    vec![
        measure(p, probe, "v0", "inner service alone", "-", noop()).await,
        measure(
            p,
            probe,
            "ping",
            "for scale: one `PING` through `SharedRedis::run`",
            "Redis",
            Ping(shared(&url, "ping")),
        )
        .await,
        measure(
            p,
            probe,
            "v1",
            "budget (3 budgets)",
            "in process",
            budget(None).layer(noop()),
        )
        .await,
        measure(
            p,
            probe,
            "v2",
            "budget (3 budgets)",
            "Redis",
            budget(Some(store(shared(&url, "v2")))).layer(noop()),
        )
        .await,
        measure(
            p,
            probe,
            "v3",
            "gate with RPM+TPM",
            "in process",
            gate(true).layer(noop()),
        )
        .await,
        measure(
            p,
            probe,
            "v4",
            "gate + fleet limits, RPM+TPM",
            "Redis",
            (gate(false), fleet(shared(&url, "v4"))).layer(noop()),
        )
        .await,
        measure(
            p,
            probe,
            "v5",
            "stack: budget, breaker, gate with RPM+TPM",
            "in process",
            (budget(None), breaker(None), gate(true)).layer(noop()),
        )
        .await,
        measure(
            p,
            probe,
            "v6",
            "stack: budget, shared breaker, gate, fleet limits",
            "Redis",
            (
                budget(Some(store(stack.clone()))),
                breaker(Some(stack.clone())),
                gate(false),
                fleet(stack),
            )
                .layer(noop()),
        )
        .await,
    ]
}

fn table(rows: &[Row]) {
    println!(
        "| layers | state | p50 µs | p99 µs | added p50 / p99 µs | calls/s ({TASKS} tasks, {WORKERS} workers) | Redis round trips per attempt | commands run by the scripts | Redis time per attempt, µs |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (i, r) in rows.iter().enumerate() {
        // A Redis row follows its in-process equivalent.
        let added = match (r.state, i.checked_sub(1).map(|j| &rows[j])) {
            ("Redis", Some(local)) => format!(
                "+{:.1} / +{:.1}",
                r.p50_us - local.p50_us,
                r.p99_us - local.p99_us
            ),
            _ => String::new(),
        };
        println!(
            "| {} | {} | {:.2} | {:.2} | {} | {:.0} | {:.2} | {:.1} | {:.1} |",
            r.layers,
            r.state,
            r.p50_us,
            r.p99_us,
            added,
            r.calls_per_s,
            r.round_trips,
            r.in_scripts,
            r.redis_us
        );
    }
}

fn main() -> ExitCode {
    let Ok(version) = Command::new("redis-server").arg("--version").output() else {
        eprintln!(
            "shared_state bench: `redis-server` is not on the PATH; install it (e.g. \
             `apt-get install redis-server`) to run this bench, which starts its own server"
        );
        return ExitCode::FAILURE;
    };
    let load_before = load_average();
    let plan = Plan::from_env();
    let note = format!(
        "{} warm-up and {} sequential calls, then {TASKS} tasks for {:?}, per row",
        plan.warm_up, plan.sequential, plan.throughput
    );
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let rows = rt.block_on(run(plan, server.url()));
    table(&rows);
    println!();
    println!(
        "{} on loopback; {note}; load average before {load_before}, after {}",
        String::from_utf8_lossy(&version.stdout).trim(),
        load_average()
    );
    ExitCode::SUCCESS
}

/// The 1, 5 and 15 minute load averages, for the machine note.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}
