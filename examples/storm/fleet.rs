//! The fleet run (`--replicas N`): the same incident through N replicas of seawall's stack,
//! first with per-process state, then with the state a fleet must share kept in Redis.
//!
//! One process cannot show what goes wrong in a fleet: a budget or a rate limit that each
//! replica enforces on its own is N budgets and N times the rate. So the clients are split
//! evenly over N independent stacks (each its own layers, state and, in the shared run, its own
//! Redis connection) in front of the same two providers, and the incident runs twice:
//!
//! - per-process: every replica has the whole run's budget in memory and gate rates equal to
//!   the providers' limits, as a single-process configuration copied N times would;
//! - shared: one budget for the fleet in Redis (`RedisBudgetStore`, failing closed) and the
//!   providers' rates counted for the fleet (`FleetLimitLayer` just inside the gate, failing
//!   open to a 1/N share), the gate keeping only its permits and queue.
//!
//! Redis cannot be driven on a paused tokio clock (auto-advance would fire every timeout
//! while a call waits on its socket), so this run is on real time, with the scaled workload
//! of `--http` ([`Scenario::fleet`]), in process.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant as WallClock, SystemTime, UNIX_EPOCH};

use seawall::budget::Usd;
use seawall::mock::MockUpstream;
use seawall::observe::Summary;
use seawall::redis::redis;
use seawall::redis::{
    FleetLimitLayer, OnUnavailable, RedisBreakerState, RedisBudgetStore, SharedRedis,
};
use seawall_test_support::RedisServer;
use tower::layer::util::Identity;

use crate::policies::{self, Outcome, Providers, Reading, SeawallSetup, classified};
use crate::report::{self, FleetRow, Row, RunResult};
use crate::scenario::{ClientPlan, Scenario};
use crate::{Args, drive, epoch, progress_bar, providers_saw, result};

/// The fleet's spend limit as a share of what the calm run cost: below the incident's spend,
/// so the limit is reached during the run and the question is whether the fleet stops there.
const LIMIT_SHARE: f64 = 0.7;

/// Which state the replicas keep.
#[derive(Debug, Clone, Copy)]
enum State<'a> {
    /// The calm reference: one process, no retries, no faults, no rate limits.
    Calm,
    /// Each replica its own budget and rates, in memory.
    PerProcess,
    /// The budget and the rates in the Redis at this URL, under this key prefix.
    Shared(&'a str, &'a str),
}

/// What a fleet run adds to a [`RunResult`].
#[derive(Debug, Clone, Default)]
struct Extra {
    /// 429s the providers answered.
    rate_limited: u64,
    /// Round trips to Redis during the run, and the replicas' calls that failed or timed out.
    redis: Option<(u64, u64)>,
}

/// The fleet run: checks that a Redis is there, runs the calm reference and the two fleet
/// runs, and prints the table.
pub(crate) fn run(args: &Args, replicas: usize) -> Result<(), String> {
    let started = WallClock::now();
    let scenario = Scenario::fleet(
        args.seed,
        args.clients.unwrap_or(100),
        args.requests.unwrap_or(1200),
    );
    if scenario.requests < scenario.clients {
        return Err("--requests must be at least --clients".into());
    }
    if replicas > scenario.clients {
        return Err("--replicas must be at most --clients (each replica serves clients)".into());
    }
    // Redis first, before anything runs: never a fleet run that quietly keeps its state in
    // process.
    let mut server = None;
    let url = match &args.redis {
        Some(url) => url.clone(),
        None => {
            if !redis_server_on_path() {
                return Err(
                    "--replicas needs a Redis for the shared run: put redis-server \
                            on the PATH (it is started on a free loopback port and stopped \
                            at the end) or pass --redis URL"
                        .into(),
                );
            }
            let own = RedisServer::start();
            let url = own.url();
            server = Some(own);
            url
        }
    };
    let runtime = real_time_runtime()?;
    runtime.block_on(round_trips(&url))?;

    println!("seawall storm demo: a fleet of {replicas} replicas\n");
    println!(
        "{}\n",
        scenario.describe(&format!(
            "in process, real time, upstream timings x0.1; {replicas} replicas"
        ))
    );
    let progress = progress_bar(3 * scenario.requests as u64);
    let mut setup = SeawallSetup::in_process();
    let measure = |state, setup: &SeawallSetup, label: &str| {
        progress.set_message(label.to_owned());
        run_fleet(
            &runtime, &scenario, state, setup, replicas, &progress, label,
        )
    };
    let (baseline, _) = measure(State::Calm, &setup, "0 calm baseline")?;
    let limit = (baseline.spend * LIMIT_SHARE * 100.0).floor() / 100.0;
    setup.budget = Usd::from_f64(limit).map_err(|e| e.to_string())?;

    let (per_process, per_process_extra) = measure(
        State::PerProcess,
        &setup,
        &format!("{replicas} x seawall, per-process"),
    )?;
    let prefix = format!("storm-{}-{}", std::process::id(), unix_millis());
    let shared_run = measure(
        State::Shared(&url, &prefix),
        &setup,
        &format!("{replicas} x seawall, shared"),
    );
    // The keys of the run go whatever happened (a --redis server outlives the demo).
    let cleaned = runtime.block_on(delete_prefix(&url, &prefix));
    let (shared, shared_extra) = shared_run?;
    cleaned?;
    progress.finish_and_clear();

    println!(
        "spend limit for the fleet: ${limit:.2} ({:.0}% of the calm run's spend, so the \
         incident needs more than the limit); per-process, every replica enforces it alone\n",
        LIMIT_SHARE * 100.0
    );
    println!("runs");
    println!(
        "  calm baseline one process, no retries, against the providers without faults and \
         without rate limits: the reference"
    );
    println!(
        "  per-process   each replica: the seawall stack of the single-process demo, its own \
         budget of the limit in memory, gate rates = the providers' limits"
    );
    println!(
        "  shared        the same stack with one budget in Redis (RedisBudgetStore, fail \
         closed) and the providers' rates for the fleet (FleetLimitLayer inside the gate, \
         fail open to 1/{replicas}) and the breakers' view shared (RedisBreakerState); the \
         gate keeps its permits and queue"
    );
    println!();
    let runs = [
        (&baseline, Extra::default()),
        (&per_process, per_process_extra),
        (&shared, shared_extra),
    ];
    let rows: Vec<FleetRow> = runs
        .iter()
        .enumerate()
        .map(|(i, (r, extra))| FleetRow {
            row: Row::new(r, limit),
            reference: i == 0,
            rate_limited: extra.rate_limited,
            redis: extra.redis,
        })
        .collect();
    println!("{}", report::fleet_table(&rows));
    const LEGEND: &[&str] = &[
        "over budget    the fleet's spend above its limit",
        "429s           answers of 429 the providers gave (a rate limit the fleet went over)",
        "upstream/call  requests the providers received per logical call (amplification)",
        "success        share of calls that got a complete answer; a call the fleet's budget refused is not one",
        "P50/P99        time from the call to the end of a complete answer (\"no answer\" as in the main table)",
        "redis          round trips to Redis per logical call (the scripts the server ran: on a shared server,",
        "               other clients' too), and the replicas' calls to it that failed or timed out (50 ms)",
    ];
    for line in LEGEND {
        println!("{line}");
    }
    println!();
    let plain: Vec<Row> = rows.iter().map(|r| r.row.clone()).collect();
    println!("why calls failed (final error class)");
    print!("{}", report::failures(&plain));
    println!("\nwhat the providers saw");
    for r in [&baseline, &per_process, &shared] {
        for note in &r.notes {
            println!("  {:<26} {note}", r.label);
        }
    }
    println!(
        "\nnote: scaled for real time: upstream timings, think times, start spread and outage \
         x0.1 (as with --http), {} clients and\n{} calls; each provider {} RPM / {} TPM, \
         buckets holding a minute's worth as a provider's do (seawall's rate buckets too, as \
         in every run),\nwhich the fleet's traffic outruns in its few seconds; the policies' own \
         waits (retry delays, breaker open time, timeouts) are\nnot compressed. Real time: \
         the figures move from run to run (which provider the breakers send the traffic to \
         most).\n",
        scenario.clients, scenario.requests, scenario.primary_rpm, scenario.primary_tpm
    );
    println!("wall-clock time: {:.1} s", started.elapsed().as_secs_f64());
    // Our own server goes with the run (a --redis server is left as it was found).
    drop(server);
    Ok(())
}

/// Splits the clients over `replicas` as a load balancer would: client `i` to replica
/// `i % replicas`, so every replica gets the same number (give or take one) and the same
/// spread of start times. Empty for zero replicas.
pub(crate) fn split<T: Clone>(clients: &[T], replicas: usize) -> Vec<Vec<T>> {
    let mut out = vec![Vec::new(); replicas];
    for (i, client) in clients.iter().enumerate() {
        if let Some(replica) = out.get_mut(i % replicas.max(1)) {
            replica.push(client.clone());
        }
    }
    out
}

fn real_time_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a tokio runtime: {e}"))
}

/// One run of the workload in `state`, on real time.
fn run_fleet(
    runtime: &tokio::runtime::Runtime,
    scenario: &Scenario,
    state: State<'_>,
    setup: &SeawallSetup,
    replicas: usize,
    progress: &indicatif::ProgressBar,
    label: &str,
) -> Result<(RunResult, Extra), String> {
    runtime.block_on(async {
        let calm = matches!(state, State::Calm);
        let mut primary_profile = scenario.primary_profile(!calm);
        let mut backup_profile = scenario.backup_profile();
        if calm {
            // The reference: what the workload costs and how fast it is answered, unthrottled.
            for p in [&mut primary_profile, &mut backup_profile] {
                p.limits.rpm = None;
                p.limits.tpm = None;
            }
        }
        let primary = MockUpstream::with_epoch(primary_profile, epoch());
        let backup = MockUpstream::with_epoch(backup_profile, epoch());
        let providers = Providers {
            primary: primary.clone(),
            backup: backup.clone(),
        };
        let plans = split(&scenario.workload(), replicas);
        let summary = Arc::new(Summary::new());
        let mut redis = None;
        let calls = match state {
            State::Calm => {
                let ask = policies::no_retry(classified(providers));
                drive(&plans.concat(), &ask, progress).await
            }
            State::PerProcess => {
                let asks = (0..replicas)
                    .map(|_| {
                        policies::seawall(
                            providers.clone(),
                            scenario,
                            setup,
                            summary.clone(),
                            Identity::new(),
                        )
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                drive_fleet(&plans, &asks, progress).await
            }
            State::Shared(url, prefix) => {
                let before = round_trips(url).await?;
                let mut handles = Vec::new();
                let mut asks = Vec::new();
                for i in 0..replicas {
                    let handle = SharedRedis::builder(url)
                        .prefix(prefix)
                        .replica(format!("replica-{i}"))
                        .build()
                        .map_err(|e| e.to_string())?;
                    let store = RedisBudgetStore::builder(handle.clone())
                        .build()
                        .map_err(|e| e.to_string())?;
                    let mut fleet = FleetLimitLayer::builder(handle.clone())
                        .on_unavailable(OnUnavailable::fail_open(replicas as u32));
                    for (key, rates) in policies::provider_rates(scenario) {
                        fleet = fleet.key_rates(key, rates);
                    }
                    let fleet = fleet.build().map_err(|e| e.to_string())?;
                    let setup = SeawallSetup {
                        budget_store: Some(store),
                        gate_rates: false,
                        breaker_state: Some(RedisBreakerState::new(handle.clone())),
                        ..setup.clone()
                    };
                    asks.push(policies::seawall(
                        providers.clone(),
                        scenario,
                        &setup,
                        summary.clone(),
                        fleet,
                    )?);
                    handles.push(handle);
                }
                let calls = drive_fleet(&plans, &asks, progress).await;
                let after = round_trips(url).await?;
                let failures = handles.iter().map(SharedRedis::failures).sum();
                redis = Some((after.saturating_sub(before), failures));
                calls
            }
        };
        let mut notes = Vec::new();
        if !calm {
            notes.push(format!(
                "{} answers came from the backup provider",
                summary.report().fallbacks
            ));
        }
        let (p, b) = (primary.stats(), backup.stats());
        notes.push(providers_saw(&p, &b));
        let extra = Extra {
            rate_limited: p.status(429) + b.status(429),
            redis,
        };
        Ok((result(label.to_owned(), calls, notes, &p, &b), extra))
    })
}

/// Every replica's clients at once, each replica through its own stack.
async fn drive_fleet(
    plans: &[Vec<ClientPlan>],
    asks: &[impl AsyncFn(http::Request<bytes::Bytes>) -> Reading],
    progress: &indicatif::ProgressBar,
) -> Vec<(Duration, Outcome)> {
    let replicas = plans
        .iter()
        .zip(asks)
        .map(|(plans, ask)| drive(plans, ask, progress));
    futures_util::future::join_all(replicas)
        .await
        .into_iter()
        .flatten()
        .collect()
}

fn redis_server_on_path() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn unix_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// A plain connection for the demo's own bookkeeping (not the replicas' handles). Errors
/// name the kind of failure only: the URL may hold a password.
async fn connect(url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    let client = redis::Client::open(url)
        .map_err(|e| format!("--redis is not a Redis URL ({:?})", e.kind()))?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("cannot reach the Redis of the fleet run ({:?})", e.kind()))
}

/// The round trips the server has answered to the stores: its count of the commands they
/// send (`EVALSHA`, `EVAL`, `SCRIPT LOAD`), from `INFO commandstats`; the commands a script
/// runs inside are not round trips and not counted. Also the check that the server answers.
async fn round_trips(url: &str) -> Result<u64, String> {
    let mut conn = connect(url).await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .map_err(|e| format!("Redis did not answer INFO ({:?})", e.kind()))?;
    Ok(info
        .lines()
        .filter_map(|l| {
            let rest = ["cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_script|load:"]
                .iter()
                .find_map(|name| l.strip_prefix(name))?;
            rest.strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum())
}

/// Deletes the keys the shared run wrote under `prefix`.
async fn delete_prefix(url: &str, prefix: &str) -> Result<(), String> {
    let mut conn = connect(url).await?;
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("cannot list the run's keys in Redis ({:?})", e.kind()))?;
        if !keys.is_empty() {
            redis::cmd("DEL")
                .arg(&keys)
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| format!("cannot delete the run's keys in Redis ({:?})", e.kind()))?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn split_gives_every_client_to_one_replica_evenly_and_in_order() {
        let clients: Vec<usize> = (0..10).collect();
        let replicas = split(&clients, 4);
        assert_eq!(
            replicas,
            vec![vec![0, 4, 8], vec![1, 5, 9], vec![2, 6], vec![3, 7]]
        );
    }

    #[test]
    fn split_over_one_replica_keeps_every_client() {
        assert_eq!(split(&[1, 2, 3], 1), vec![vec![1, 2, 3]]);
    }

    #[test]
    fn split_over_more_replicas_than_clients_leaves_some_empty() {
        assert_eq!(split(&[7], 3), vec![vec![7], vec![], vec![]]);
    }

    #[test]
    fn split_over_no_replicas_is_empty() {
        assert!(split(&[1, 2], 0).is_empty());
    }
}
