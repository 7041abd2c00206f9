//! The storm demo: one seeded LLM incident, six client policies, one table.
//!
//! ```text
//! cargo run --release --example storm                 # virtual time, in-process chaos upstream
//! cargo run --release --example storm -- --scenario outage   # the long outage instead
//! cargo run --release --example storm -- --http       # the same over loopback HTTP, real time
//! cargo run --release --example storm -- --replicas 4 # a fleet of 4, per-process vs shared state
//! cargo run --release --example storm -- --help
//! ```
//!
//! 200 clients send 3,000 streamed chat completions to a provider with RPM/TPM limits while it
//! has a bad minute: a burst of 503/529, background 500s and 503s, slow first tokens, a few
//! streams cut or ending in an error event. The same seeded workload runs through six client
//! policies (no retries; a naive retry loop; the openai-python SDK's retry rules;
//! tower-resilience's retry, circuit breaker, bulkhead and fallback; a LiteLLM-Router-style
//! router with cooldowns and fallbacks; seawall's recommended stack), and once against a calm
//! upstream for the reference latency. The three policies with a fallback get the same backup
//! provider, which has stream faults of its own, and the same larger-context model.
//! `--scenario outage` runs the second incident instead: the primary's key out of quota early in
//! the run, a three-minute outage of the primary, 3% of prompts too long for the model. Everything
//! runs on a paused tokio clock against `seawall-mock`'s in-process upstream, so minutes of traffic
//! take seconds and every run prints the same table. The table counts what a user feels: how many
//! calls got a complete answer, how long that took, how much load the policy added upstream, what
//! it cost and what it wasted (in all and per delivered answer: what was billed beyond the clean
//! cost of the answers delivered, the same measure for every row, explained per row under the table
//! from a ledger of every upstream attempt), and how far it went over the run's spend limit. Under
//! the table the demo checks its goals for seawall's row (best success, P95 and P99, no overrun,
//! waste per answer no worse than the best row that delivers 95%) and prints PASS or FAIL for each;
//! `--check` makes a FAIL the exit status.
//!
//! `--seeds A-B` checks the goals at every seed of a range instead (in process, on virtual
//! time, several seeds at once): one line a seed, then for each goal the seeds that missed it,
//! and seawall's waste per answer over the yardstick's across the range. One seed's table
//! says little about "any seed"; this is how the figures over seeds are made.
//!
//! `--repeat SHARE` makes a share of the calls ask one of 40 frequent questions again, word for
//! word, and runs seawall's stack once more with a `CacheLayer` (in memory) between observe
//! and fallback: the extra row and the lines under the table show what it saves in spend,
//! upstream calls and P50.
//!
//! `--replicas N` asks what one process cannot show: the same incident through a fleet of N
//! replicas of seawall's stack, the clients split evenly over them, run once with each
//! replica's budget, rate limits and breakers in its own memory and once with them shared in
//! Redis (`seawall-redis`: `RedisBudgetStore`, `FleetLimitLayer`, `RedisBreakerState`). Its
//! table shows the spend over the fleet's limit, the 429s the providers answered, the
//! amplification, success, latency and the round trips to Redis (module `fleet`). Redis I/O needs real time, so this run is on real time
//! with a scaled workload; it needs `redis-server` on the `PATH` (started on a free loopback
//! port without persistence and stopped at the end) or `--redis URL`, and stops with an error
//! without either.

mod fleet;
mod policies;
mod report;
mod scenario;
mod tally;

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant as WallClock, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use http::{Request, Response};
use http_body::Body;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use seawall::budget::Usd;
use seawall::core::BoxError;
use seawall::mock::{MockUpstream, Stats};
use seawall::observe::Summary;
use tower::Service;
use tower::layer::util::Identity;

use policies::{Delivered, Outcome, Policy, Providers, Reading, SeawallSetup, classified};
use report::{Goal, Row, RunResult, dollars};
use scenario::{ClientPlan, Incident, Scenario};
use tally::{CallId, Ledger, Tally};

const USAGE: &str = "\
usage: cargo run --release --example storm -- [options]

  --http            run over loopback HTTP on real time (a scaled-down workload)
  --svg PATH        where to write the latency chart (default target/storm.svg; none with
                    --replicas)
  --scenario NAME   the incident: storm (default; a bad minute: a 503/529 burst, RPM/TPM
                    limits, slow first tokens, cut streams) or outage (the primary down for
                    three minutes, its key out of quota early on; 3% of prompts too long for the
                    model, which a larger-context model serves)
  --check           exit with status 1 when a goal for seawall's row is not met (at any seed
                    of --seeds)
  --seed N          the seed of the workload and the upstream (default 2024)
  --seeds A-B       the sweep: the same incident at every seed from A to B, as many at a time
                    as there are cores; one line a seed (seawall's success, P95, P99 and waste
                    per answer beside the yardstick's), then each goal's misses over the range
  --clients N       concurrent clients (default 200; 100 with --http)
  --requests N      logical calls in all (default 3000, 6000 for outage; 500 with --http;
                    1200 with --replicas)
  --replicas N      the fleet run: the clients split over N replicas, each its own seawall
                    stack, first with per-process state, then with the budget and the providers'
                    rate limits shared in Redis; in process, on real time (a scaled workload)
  --repeat SHARE    a share of calls (0 to 1, e.g. 0.3) asks one of 40 frequent questions again,
                    word for word, and seawall runs once more with a CacheLayer in its stack
  --no-resume       seawall runs once more without the ContinueLayer of its recommended stack:
                    what resuming streams cut after their first token buys
  --restart-within N
                    seawall's ContinueLayer holds a stream's first N tokens back from the
                    caller and asks a stream cut before them again from the start instead of
                    resuming it (off by default, as in the recommended stack)
  --redis URL       the Redis of --replicas (default: start redis-server from the PATH on a
                    free loopback port, without persistence, and stop it at the end)
  -h, --help        this text";

struct Args {
    http: bool,
    incident: Incident,
    check: bool,
    svg: PathBuf,
    seed: u64,
    /// `--seeds FIRST-LAST`: the sweep instead of one run.
    seeds: Option<(u64, u64)>,
    clients: Option<usize>,
    requests: Option<usize>,
    replicas: Option<usize>,
    redis: Option<String>,
    repeat: f64,
    /// `--no-resume`: one more row, seawall without its `ContinueLayer`.
    no_resume_row: bool,
    restart_within: u32,
}

fn parse_args() -> Result<Option<Args>, String> {
    parse(std::env::args())
}

/// Reads the arguments (the first is the program's name); `None` for `--help`.
fn parse(argv: impl IntoIterator<Item = String>) -> Result<Option<Args>, String> {
    let mut args = Args {
        http: false,
        incident: Incident::Storm,
        check: false,
        svg: PathBuf::from("target/storm.svg"),
        seed: 2024,
        seeds: None,
        clients: None,
        requests: None,
        replicas: None,
        redis: None,
        repeat: 0.0,
        no_resume_row: false,
        restart_within: 0,
    };
    let mut seed_given = false;
    let mut it = argv.into_iter().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let number = |name: &str, v: String| {
            v.parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{name} wants a positive whole number, got {v:?}"))
        };
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--http" => args.http = true,
            "--check" => args.check = true,
            "--scenario" => {
                let v = value("--scenario")?;
                args.incident = Incident::parse(&v).ok_or_else(|| {
                    let names: Vec<&str> = Incident::ALL.iter().map(|i| i.name()).collect();
                    format!("--scenario wants one of {}, got {v:?}", names.join(", "))
                })?;
            }
            "--svg" => args.svg = PathBuf::from(value("--svg")?),
            "--seed" => {
                args.seed = number("--seed", value("--seed")?)?;
                seed_given = true;
            }
            "--seeds" => {
                let v = value("--seeds")?;
                let (first, last) = v.split_once('-').unwrap_or((&v, &v));
                let (first, last) = (
                    number("--seeds", first.into())?,
                    number("--seeds", last.into())?,
                );
                if first > last {
                    return Err(format!(
                        "--seeds wants FIRST-LAST with FIRST <= LAST, got {v:?}"
                    ));
                }
                args.seeds = Some((first, last));
            }
            "--clients" => args.clients = Some(number("--clients", value("--clients")?)? as usize),
            "--requests" => {
                args.requests = Some(number("--requests", value("--requests")?)? as usize)
            }
            "--replicas" => {
                args.replicas = Some(number("--replicas", value("--replicas")?)? as usize)
            }
            "--redis" => args.redis = Some(value("--redis")?),
            "--no-resume" => args.no_resume_row = true,
            "--restart-within" => {
                let v = value("--restart-within")?;
                args.restart_within = number("--restart-within", v)?
                    .try_into()
                    .map_err(|_| "--restart-within is too large".to_owned())?;
            }
            "--repeat" => {
                let v = value("--repeat")?;
                args.repeat = v
                    .parse::<f64>()
                    .ok()
                    .filter(|r| *r > 0.0 && *r <= 1.0)
                    .ok_or_else(|| {
                        format!("--repeat wants a share above 0 and at most 1, got {v:?}")
                    })?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.seeds.is_some() && (seed_given || args.http || args.replicas.is_some()) {
        return Err(
            "--seeds is the sweep of in-process runs; it does not combine with --seed, --http or \
             --replicas"
                .into(),
        );
    }
    if args.replicas.is_some() && args.http {
        return Err("--replicas runs in process; it does not combine with --http".into());
    }
    if args.repeat > 0.0 && args.replicas.is_some() {
        return Err(
            "--repeat is for the single-process run; it does not combine with --replicas".into(),
        );
    }
    if args.no_resume_row && args.replicas.is_some() {
        return Err(
            "--no-resume is for the single-process run; it does not combine with --replicas".into(),
        );
    }
    if args.restart_within > 0 && args.replicas.is_some() {
        return Err(
            "--restart-within is for the single-process run; it does not combine with --replicas"
                .into(),
        );
    }
    if args.incident != Incident::Storm && args.replicas.is_some() {
        return Err("--scenario is for the single-process run; the fleet runs the storm".into());
    }
    if args.redis.is_some() && args.replicas.is_none() {
        return Err("--redis is for the fleet run: give --replicas N too".into());
    }
    Ok(Some(args))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("storm: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) if !args.check => ExitCode::SUCCESS,
        Ok(failed) => {
            eprintln!("storm: {failed} goal(s) not met");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("storm: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the demo; returns how many goals were not met.
fn run(args: &Args) -> Result<usize, String> {
    if let Some(replicas) = args.replicas {
        return fleet::run(args, replicas).map(|()| 0);
    }
    if let Some((first, last)) = args.seeds {
        return sweep(args, first, last);
    }
    let started = WallClock::now();
    let scenario = scenario_for(args, args.seed)?;
    let mode = if args.http {
        "loopback HTTP, real time, upstream timings x0.1"
    } else {
        "in process, virtual time"
    };
    println!("seawall storm demo\n");
    println!("{}\n", scenario.describe(mode));

    let progress = progress_bar((Policy::ALL.len() as u64 + 1) * scenario.requests as u64);
    let Played {
        mut runs,
        cached,
        no_resume,
        limit,
    } = play(args, &scenario, &progress, true)?;
    progress.finish_and_clear();

    println!(
        "spend limit for the run: ${limit:.2} (the calm run's spend for every call + 10%); \
         seawall enforces it with its cost budget layer, the others are only measured against \
         it\n"
    );
    println!("policies");
    for policy in Policy::ALL {
        for (i, line) in policy.explain().iter().enumerate() {
            let name = if i == 0 { policy.name() } else { "" };
            println!("  {name:<20} {line}");
        }
    }
    if cached.is_some() {
        println!(
            "  {:<20} the same stack with a CacheLayer (exact answers, in memory) between observe \
             and fallback",
            "7 seawall + cache"
        );
    }
    if no_resume.is_some() {
        println!(
            "  {:<20} the same stack without its ContinueLayer: a stream cut after its first token \
             fails instead of resuming",
            "8 seawall, no resume"
        );
    }
    println!();

    let rows: Vec<Row> = runs.iter().map(|r| Row::new(r, limit)).collect();
    let cached_row = cached.as_ref().map(|r| Row::new(r, limit));
    let no_resume_shown = no_resume.as_ref().map(|r| Row::new(r, limit));
    let mut shown = rows.clone();
    shown.extend(cached_row.clone());
    shown.extend(no_resume_shown.clone());
    println!("{}", report::table(&shown));
    const LEGEND: &[&str] = &[
        "success        share of calls that got a complete answer (the stream ended with its finish marker)",
        "upstream/call  requests the providers received per logical call (amplification)",
        "P50/P95/P99    time from the call to the end of a complete answer; a call that never got one counts as",
        "               slower than any answer (\"no answer\" when the percentile falls on such calls)",
        "spend, wasted  billed by the providers; wasted: billed beyond what the complete answers delivered would",
        "               have cost in one clean call each (their prompt and text): failed calls whole, the broken",
        "               first tries of answers asked again, the follow-ups' prompts of resumed answers",
        "wasted/1k      wasted per 1,000 complete answers: what the waste bought (raw waste is lowest for a",
        "               policy that gives up early)",
        "over budget    spend above the run's limit",
    ];
    for line in LEGEND {
        println!("{line}");
    }
    println!();
    println!("why calls failed (final error class)");
    print!("{}", report::failures(&shown));
    println!("\ntime to the caller's first token (answered calls)");
    print!("{}", report::first_tokens(&shown));
    println!("\nwhat the providers saw");
    for r in &runs {
        for note in &r.notes {
            println!("  {:<20} {note}", r.label);
        }
    }
    println!();
    if args.http {
        println!(
            "note: over HTTP the upstream runs 10x faster but the policies' own waits (retry \
             delays, breaker open times,\ntimeouts) are not compressed, so this table checks \
             the stack over real sockets; compare policies on the\nvirtual-time table.\n"
        );
    }

    if let (Some(cached), Some(plain)) = (&cached_row, rows.last()) {
        println!("what the cache changed (seawall's stack, without and with a CacheLayer)");
        print!("{}", report::cache_effect(plain, cached));
        println!();
    }
    let (seawall_row, others) = seawall_and_others(&rows)?;
    let (goals, failed) = report::goals(seawall_row, &others);
    println!("goals for the seawall row");
    print!("{goals}");
    if failed.is_empty() {
        println!("  all goals met");
    } else {
        println!("  {} goal(s) not met (see FAIL above)", failed.len());
    }
    println!();

    if let Some(dir) = args.svg.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    runs.extend(cached);
    runs.extend(no_resume);
    report::chart(&args.svg, &runs)?;
    println!("latency chart (CDF per policy): {}", args.svg.display());
    println!("wall-clock time: {:.1} s", started.elapsed().as_secs_f64());
    Ok(failed.len())
}

/// One seed of a sweep: seawall's row, the row its waste is held to, and the goals missed.
struct Verdict {
    seed: u64,
    seawall: Row,
    yardstick: Option<Row>,
    missed: Vec<Goal>,
}

impl Verdict {
    fn of(args: &Args, seed: u64) -> Result<Verdict, String> {
        let scenario = scenario_for(args, seed)?;
        // Seawall's extra rows are not checked: they are not played.
        let played = play(args, &scenario, &ProgressBar::hidden(), false)?;
        let rows: Vec<Row> = played
            .runs
            .iter()
            .map(|r| Row::new(r, played.limit))
            .collect();
        let (seawall, others) = seawall_and_others(&rows)?;
        let (_, missed) = report::goals(seawall, &others);
        Ok(Verdict {
            seed,
            seawall: seawall.clone(),
            yardstick: report::yardstick(&others).cloned(),
            missed,
        })
    }

    /// Seawall's waste per answer over the yardstick's, when a row delivers 95% (1 when
    /// neither wasted anything).
    fn waste_ratio(&self) -> Option<f64> {
        let mine = self.seawall.wasted_per_answer;
        self.yardstick.as_ref().map(|y| {
            if mine == 0.0 && y.wasted_per_answer == 0.0 {
                1.0
            } else {
                mine / y.wasted_per_answer
            }
        })
    }

    fn line(&self) -> String {
        let s = &self.seawall;
        let yardstick = match (&self.yardstick, self.waste_ratio()) {
            (Some(y), Some(ratio)) => format!(
                "${:.4} {:<22} {ratio:>5.2}x",
                y.wasted_per_answer,
                y.label.trim()
            ),
            _ => "no other row delivers 95%".to_owned(),
        };
        let missed: Vec<&str> = self.missed.iter().map(|g| g.name()).collect();
        format!(
            "{:>6}  {:>7.2}%  {:>8}  {:>8}  ${:.4}    {yardstick:<38}  {}",
            self.seed,
            s.success * 100.0,
            report::secs(s.latency[1]),
            report::secs(s.latency[2]),
            s.wasted_per_answer,
            if missed.is_empty() {
                "-".to_owned()
            } else {
                missed.join(", ")
            }
        )
    }
}

/// `--seeds`: the same incident at every seed of a range, as many at a time as the machine
/// has cores (each run is on its own paused clock, so the figures are those of `--seed`); one
/// line a seed, then each goal's misses over the range. Returns how many goals were missed.
fn sweep(args: &Args, first: u64, last: u64) -> Result<usize, String> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    let started = WallClock::now();
    let count = last - first + 1;
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get() as u64)
        .min(count);
    println!("seawall storm demo: a sweep of seeds {first}-{last}\n");
    println!(
        "{}",
        scenario_for(args, first)?.describe("in process, virtual time")
    );
    println!("the same incident at each seed, {workers} at a time; lines in the order they end\n");
    println!(
        "{:>6}  {:>8}  {:>8}  {:>8}  {:<10} {:<38}  goals missed",
        "seed", "success", "P95", "P99", "wasted/1k", "yardstick's wasted/1k, ratio"
    );
    let next = AtomicU64::new(first);
    let verdicts = Mutex::new(Vec::new());
    let failure = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed > last || failure.lock().is_ok_and(|f| f.is_some()) {
                        return;
                    }
                    match Verdict::of(args, seed) {
                        Ok(v) => {
                            println!("{}", v.line());
                            if let Ok(mut all) = verdicts.lock() {
                                all.push(v);
                            }
                        }
                        Err(e) => {
                            if let Ok(mut f) = failure.lock() {
                                f.get_or_insert(format!("seed {seed}: {e}"));
                            }
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().ok().flatten() {
        return Err(e);
    }
    let mut verdicts = verdicts
        .into_inner()
        .map_err(|_| "a sweep thread panicked")?;
    verdicts.sort_by_key(|v| v.seed);
    print!("\n{}", tally(&verdicts));
    println!("wall-clock time: {:.1} s", started.elapsed().as_secs_f64());
    Ok(verdicts.iter().map(|v| v.missed.len()).sum())
}

/// The sweep's summary: for each goal, the seeds that missed it; and seawall's waste per
/// answer over the yardstick's across the seeds.
fn tally(verdicts: &[Verdict]) -> String {
    use std::fmt::Write as _;

    let mut s = String::new();
    let _ = writeln!(s, "goals for the seawall row over {} seeds", verdicts.len());
    for goal in Goal::ALL {
        let missed: Vec<String> = verdicts
            .iter()
            .filter(|v| v.missed.contains(&goal))
            .map(|v| match (goal, v.waste_ratio()) {
                (Goal::Waste, Some(r)) => format!("{} ({r:.2}x)", v.seed),
                _ => v.seed.to_string(),
            })
            .collect();
        if missed.is_empty() {
            let _ = writeln!(s, "  {:<8} met at every seed", goal.name());
        } else {
            let _ = writeln!(
                s,
                "  {:<8} missed at {}: {}",
                goal.name(),
                missed.len(),
                missed.join(", ")
            );
        }
    }
    let mut ratios: Vec<(f64, u64)> = verdicts
        .iter()
        .filter_map(|v| v.waste_ratio().map(|r| (r, v.seed)))
        .collect();
    ratios.sort_by(|a, b| a.0.total_cmp(&b.0));
    let rank = |q: f64| report::percentile(&ratios, q, ratios.len());
    if let (Some((median, _)), Some((p90, _)), Some(&(largest, seed))) =
        (rank(0.5), rank(0.9), ratios.last())
    {
        let _ = writeln!(
            s,
            "  seawall's waste per answer over the yardstick's ({} seeds with one): median \
             {median:.2}x, 90th percentile {p90:.2}x, largest {largest:.2}x (seed {seed})",
            ratios.len(),
        );
    }
    s
}

/// The incident of the arguments at `seed`.
fn scenario_for(args: &Args, seed: u64) -> Result<Scenario, String> {
    let scenario = if args.http {
        Scenario::real_time(
            args.incident,
            seed,
            args.clients.unwrap_or(100),
            args.requests
                .unwrap_or(args.incident.default_requests() / 6),
        )
    } else {
        Scenario::incident(
            args.incident,
            seed,
            args.clients.unwrap_or(200),
            args.requests.unwrap_or(args.incident.default_requests()),
        )
    };
    if scenario.requests < scenario.clients {
        return Err("--requests must be at least --clients".into());
    }
    Ok(Scenario {
        repeat: args.repeat,
        ..scenario
    })
}

/// Every run of one scenario: the calm baseline and each policy in the incident, then
/// seawall's extra rows when asked for, and the spend limit the calm run set.
struct Played {
    runs: Vec<RunResult>,
    cached: Option<RunResult>,
    no_resume: Option<RunResult>,
    limit: f64,
}

/// Seawall's row and the other policies' rows, of the rows of [`Played::runs`] (the calm
/// baseline first, then the policies in [`Policy::ALL`]'s order, seawall's last).
fn seawall_and_others(rows: &[Row]) -> Result<(&Row, Vec<&Row>), String> {
    let policies = rows.get(1..=Policy::ALL.len()).ok_or("a run is missing")?;
    let (seawall, others) = policies.split_last().ok_or("a run is missing")?;
    Ok((seawall, others.iter().collect()))
}

/// Plays `scenario`; seawall's extra rows (`--repeat`, `--no-resume`) only with `extra_rows`.
fn play(
    args: &Args,
    scenario: &Scenario,
    progress: &ProgressBar,
    extra_rows: bool,
) -> Result<Played, String> {
    // As many permits as clients (tower-resilience's bulkheads get as many, each): the demo's
    // limits on the upstream are its rates, which seawall's gate enforces; with fewer permits
    // than clients the rows would compare queues of different sizes (one gate for every
    // provider against a bulkhead per provider).
    let mut setup = SeawallSetup {
        concurrency: scenario.clients,
        restart_within: args.restart_within,
        ..SeawallSetup::in_process()
    };

    progress.set_message("0 calm baseline");
    let baseline = run_once(scenario, None, &setup, progress, args.http)?;
    // The run's spend limit: what the calm run cost, plus 10% for the bad day. A calm run
    // that could not answer every call (more clients than the upstream's rates carry) counts
    // at its cost per answer for every call, or the limit would not cover the workload.
    let answered = baseline.calls.iter().filter(|(_, o)| o.is_ok()).count();
    let calm = baseline.spend * baseline.calls.len() as f64 / answered.max(1) as f64;
    let limit = (calm * 1.10 * 100.0).ceil() / 100.0;
    setup.budget = Usd::from_f64(limit).map_err(|e| e.to_string())?;

    let mut runs = vec![baseline];
    for policy in Policy::ALL {
        progress.set_message(policy.name());
        runs.push(run_once(
            scenario,
            Some(policy),
            &setup,
            progress,
            args.http,
        )?);
    }
    // Seawall's stack again with one change, in a row of its own.
    let again = |label: &str, setup: SeawallSetup| -> Result<RunResult, String> {
        progress.set_message(label.to_owned());
        let mut run = run_once(scenario, Some(Policy::Seawall), &setup, progress, args.http)?;
        run.label = label.to_owned();
        Ok(run)
    };
    // The cache's run: with a CacheLayer between observe and fallback.
    let cached = (extra_rows && scenario.repeat > 0.0)
        .then(|| {
            let with_cache = SeawallSetup {
                cache: true,
                ..setup.clone()
            };
            again("7 seawall + cache", with_cache)
        })
        .transpose()?;
    // The run without resumption: without its ContinueLayer.
    let no_resume = (extra_rows && args.no_resume_row)
        .then(|| {
            let without = SeawallSetup {
                resume: false,
                ..setup.clone()
            };
            again("8 seawall, no resume", without)
        })
        .transpose()?;
    Ok(Played {
        runs,
        cached,
        no_resume,
        limit,
    })
}

fn progress_bar(total: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{msg:<20} [{bar:40}] {pos}/{len} calls  {elapsed}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// A fixed wall-clock origin for the upstreams' dates and ids: byte-identical runs.
fn epoch() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_767_225_600)
}

/// One run: the calm baseline (`policy` None) or one policy in the storm.
fn run_once(
    scenario: &Scenario,
    policy: Option<Policy>,
    setup: &SeawallSetup,
    progress: &ProgressBar,
    http: bool,
) -> Result<RunResult, String> {
    let label = match policy {
        Some(p) => p.name().to_owned(),
        None => "0 calm baseline".to_owned(),
    };
    let runtime = if http {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
    }
    .map_err(|e| format!("cannot start a tokio runtime: {e}"))?;
    let ledger = Ledger::default();
    runtime.block_on(async {
        let primary = MockUpstream::with_epoch(scenario.primary_profile(policy.is_some()), epoch());
        let backup = MockUpstream::with_epoch(scenario.backup_profile(), epoch());
        let policy = policy.unwrap_or(Policy::NoRetry);
        let (calls, mut notes) = if http {
            let (transport, servers) = http_transport(scenario, &primary, &backup).await?;
            let out = run_policy(scenario, policy, transport, setup, progress).await;
            for s in servers {
                s.abort();
            }
            out?
        } else {
            let providers = Providers {
                primary: primary.clone(),
                backup: backup.clone(),
            };
            let transport = Tally::new(providers, ledger.clone());
            run_policy(scenario, policy, transport, setup, progress).await?
        };
        let (p, b) = (primary.stats(), backup.stats());
        notes.push(providers_saw(&p, &b));
        let mut run = result(label, calls, notes, &p, &b);
        if !http {
            let outcomes: Vec<Outcome> = run.calls.iter().map(|(_, o)| *o).collect();
            run.notes.push(format!(
                "waste ${:.4}: {}",
                run.wasted,
                ledger.explain(&outcomes, run.spend)
            ));
        }
        Ok(run)
    })
}

/// One line on what the providers saw in a run.
fn providers_saw(p: &Stats, b: &Stats) -> String {
    format!(
        "primary {} requests: {} x 429, {} x 400, {} x 5xx, {} streams cut, {} error events, {} \
         abandoned; backup {} requests: {} x 429, {} x 400, {} x 5xx, {} cut, {} error events, \
         {} abandoned; {:.0} s of traffic",
        p.requests,
        p.status(429),
        p.status(400),
        server_errors(p),
        p.streams_cut,
        p.streams_errored,
        p.abandoned,
        b.requests,
        b.status(429),
        b.status(400),
        server_errors(b),
        b.streams_cut,
        b.streams_errored,
        b.abandoned,
        p.elapsed.as_secs_f64().max(b.elapsed.as_secs_f64()),
    )
}

/// A run's result from its calls and the providers' counts.
///
/// The waste is the caller's view, the same for every row: what the providers billed, less
/// what the complete answers delivered would have cost in one clean call each (their prompt
/// and their text). The providers' own count (a stream that did not end with its finish
/// marker billed as waste in full) also counts the text of a stream cut and then resumed,
/// which the caller did get, and misses the prompt its follow-up sends again.
fn result(
    label: String,
    calls: Vec<(Duration, Outcome)>,
    notes: Vec<String>,
    p: &Stats,
    b: &Stats,
) -> RunResult {
    let spend = dollars(
        p.input_tokens + b.input_tokens,
        p.output_tokens + b.output_tokens,
    );
    let delivered: f64 = calls
        .iter()
        .filter_map(|(_, o)| o.ok())
        .map(|d| dollars(u64::from(d.input), u64::from(d.output)))
        .sum();
    RunResult {
        label,
        calls,
        upstream_calls: p.requests + b.requests,
        spend,
        wasted: (spend - delivered).max(0.0),
        notes,
    }
}

/// Sends one call through a policy: the request carries its [`CallId`], and a complete answer
/// is priced by its prompt's tokens and the text the caller read.
pub(crate) async fn ask_one(
    ask: &impl AsyncFn(Request<Bytes>) -> Reading,
    mut req: Request<Bytes>,
    id: u32,
) -> Outcome {
    use seawall::core::LlmRequest as _;
    req.prepare();
    let input = req.estimated_input_tokens();
    req.extensions_mut().insert(CallId(id));
    let start = tokio::time::Instant::now();
    ask(req).await.map(|read| Delivered {
        input,
        output: read.tokens,
        first_token: read.first_token.map(|t| t - start),
    })
}

fn server_errors(s: &Stats) -> u64 {
    s.by_status
        .iter()
        .filter(|(status, _)| *status >= 500)
        .map(|(_, n)| n)
        .sum()
}

type Servers = Vec<tokio::task::JoinHandle<()>>;

/// Both upstreams behind axum on loopback, and an HTTP transport to each.
async fn http_transport(
    scenario: &Scenario,
    primary: &MockUpstream,
    backup: &MockUpstream,
) -> Result<(Providers<seawall::http::HttpTransport>, Servers), String> {
    let mut servers = Vec::new();
    let mut transports = Vec::new();
    for upstream in [primary, backup] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("cannot listen on loopback: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("no local address: {e}"))?;
        let upstream = upstream.clone();
        servers.push(tokio::spawn(async move {
            let _ = seawall::mock::serve(listener, upstream).await;
        }));
        let base =
            seawall::http::Upstream::new(&format!("http://{addr}")).map_err(|e| e.to_string())?;
        transports.push(
            seawall::http::HttpTransport::builder()
                .pool_max_idle_per_host(scenario.clients + 16)
                .upstream(base)
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    let backup = transports.pop().ok_or("no backup transport")?;
    let primary = transports.pop().ok_or("no primary transport")?;
    Ok((Providers { primary, backup }, servers))
}

/// Builds `policy` on `transport` and drives the workload through it.
async fn run_policy<T, B>(
    scenario: &Scenario,
    policy: Policy,
    transport: T,
    setup: &SeawallSetup,
    progress: &ProgressBar,
) -> Result<(Vec<(Duration, Outcome)>, Vec<String>), String>
where
    T: Service<Request<Bytes>, Response = Response<B>> + Clone + Send + Sync + 'static,
    T::Error: Into<BoxError> + Send + Sync + 'static,
    T::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError> + Send + Sync + 'static,
{
    let plans = scenario.workload();
    let mut notes = Vec::new();
    let calls = match policy {
        Policy::NoRetry => {
            let ask = policies::no_retry(classified(transport));
            drive(&plans, &ask, progress).await
        }
        Policy::Naive => {
            let ask = policies::naive(classified(transport));
            drive(&plans, &ask, progress).await
        }
        Policy::OpenAi => {
            let ask = policies::openai(classified(transport), scenario.seed ^ 0x0a1);
            drive(&plans, &ask, progress).await
        }
        Policy::TowerResilience => {
            let ask = policies::tower_resilience(classified(transport), setup.concurrency)?;
            drive(&plans, &ask, progress).await
        }
        Policy::LiteLlm => {
            let ask = policies::litellm(classified(transport), scenario.seed ^ 0x117e);
            drive(&plans, &ask, progress).await
        }
        Policy::Seawall => {
            let summary = Arc::new(Summary::new());
            let ask =
                policies::seawall(transport, scenario, setup, summary.clone(), Identity::new())?;
            let calls = drive(&plans, &ask, progress).await;
            notes.push(format!(
                "{} answers came from the backup provider",
                summary.report().fallbacks
            ));
            calls
        }
    };
    Ok((calls, notes))
}

/// Runs every client's plan at once; returns each call's latency and outcome, in the order of
/// the plans (a call's index is its [`CallId`]).
async fn drive(
    plans: &[ClientPlan],
    ask: &impl AsyncFn(Request<Bytes>) -> Reading,
    progress: &ProgressBar,
) -> Vec<(Duration, Outcome)> {
    let mut first = 0u32;
    let mut clients: FuturesUnordered<_> = plans
        .iter()
        .enumerate()
        .map(|(i, plan)| {
            let base = first;
            first += plan.calls.len() as u32;
            async move {
                let mut out = Vec::with_capacity(plan.calls.len());
                tokio::time::sleep(plan.start).await;
                for (j, call) in plan.calls.iter().enumerate() {
                    let start = tokio::time::Instant::now();
                    let outcome = ask_one(ask, call.request(), base + j as u32).await;
                    out.push((start.elapsed(), outcome));
                    progress.inc(1);
                    tokio::time::sleep(call.think).await;
                }
                (i, out)
            }
        })
        .collect();
    let mut all = Vec::new();
    while let Some(calls) = clients.next().await {
        all.push(calls);
    }
    all.sort_unstable_by_key(|(i, _)| *i);
    all.into_iter().flat_map(|(_, calls)| calls).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small outage workload in which every prompt is too long for the model.
    fn all_long() -> Scenario {
        Scenario {
            long_prompts: 1.0,
            outage: (Duration::from_secs(1_000), Duration::from_secs(1_001), 1.0),
            ..Scenario::incident(Incident::Outage, 11, 10, 40)
        }
    }

    fn success(policy: Policy) -> f64 {
        let run = run_once(
            &all_long(),
            Some(policy),
            &SeawallSetup::in_process(),
            &ProgressBar::hidden(),
            false,
        )
        .expect("the run completes");
        let ok = run.calls.iter().filter(|(_, o)| o.is_ok()).count();
        ok as f64 / run.calls.len() as f64
    }

    #[test]
    fn only_the_policies_with_a_larger_context_fallback_serve_prompts_too_long_for_the_model() {
        assert_eq!(success(Policy::OpenAi), 0.0);
        for policy in [Policy::TowerResilience, Policy::LiteLlm, Policy::Seawall] {
            // Every call long: a few may still meet a cut stream or a 500 at the backup.
            assert!(success(policy) >= 0.85, "{policy:?}");
        }
    }

    #[test]
    fn waste_is_what_was_billed_beyond_the_clean_cost_of_the_answers_delivered() {
        // A resumed answer: a first attempt cut after 40 of 100 words (prompt 100), and a
        // follow-up with the prompt, the 40 words and an instruction (170 in all) giving the
        // other 60; and a failed call whose one attempt was cut after 10 words (prompt 200).
        let mut p = Stats::default();
        p.input_tokens = 100 + 170 + 200;
        p.output_tokens = 40 + 60 + 10;
        // The providers count every broken stream whole: 40 delivered words among them.
        p.wasted_input_tokens = 100 + 200;
        p.wasted_output_tokens = 40 + 10;
        let calls = vec![
            (
                Duration::from_secs(1),
                Ok(Delivered {
                    input: 100,
                    output: 100,
                    first_token: None,
                }),
            ),
            (Duration::from_secs(1), Err("stream_interrupted")),
        ];
        let run = result("r".into(), calls, Vec::new(), &p, &Stats::default());
        // Waste: the follow-up's prompt, and the failed call whole; not the 40 words delivered.
        let expected = dollars(170 + 200, 10);
        assert!((run.wasted - expected).abs() < 1e-12, "{}", run.wasted);
        assert!(run.wasted < dollars(300, 50));
    }

    #[test]
    fn check_and_scenario_are_read_from_the_command_line() {
        let args = |v: &[&str]| {
            let mut all = vec!["storm".to_owned()];
            all.extend(v.iter().map(|s| (*s).to_owned()));
            parse(all)
        };
        let a = args(&["--scenario", "outage", "--check"]).unwrap().unwrap();
        assert_eq!(a.incident, Incident::Outage);
        assert!(a.check);
        let e = args(&["--scenario", "flood"]).err().unwrap();
        assert!(e.contains("storm, outage"), "{e}");
        assert_eq!(args(&[]).unwrap().unwrap().restart_within, 0);
        let a = args(&["--restart-within", "22"]).unwrap().unwrap();
        assert_eq!(a.restart_within, 22);
        assert!(args(&["--restart-within", "many"]).is_err());
        assert_eq!(
            args(&["--seeds", "3-7"]).unwrap().unwrap().seeds,
            Some((3, 7))
        );
        assert_eq!(
            args(&["--seeds", "9"]).unwrap().unwrap().seeds,
            Some((9, 9))
        );
        for wrong in [
            &["--seeds", "7-3"][..],
            &["--seeds", "0-3"],
            &["--seeds", "a-b"],
            &["--seeds", "1-3", "--seed", "2"],
            &["--seeds", "1-3", "--http"],
            &["--seeds", "1-3", "--replicas", "2"],
        ] {
            assert!(args(wrong).is_err(), "{wrong:?}");
        }
    }

    fn verdict(seed: u64, wasted: f64, yardstick: Option<f64>, missed: &[Goal]) -> Verdict {
        let row = |label: &str, wasted_per_answer: f64| Row {
            label: label.to_owned(),
            calls: 100,
            success: 1.0,
            amplification: 1.0,
            latency: [None; 3],
            spend: 1.0,
            wasted: 0.0,
            per_answer: 0.01,
            wasted_per_answer,
            overrun: 0.0,
            failures: Default::default(),
            first_token: [None; 2],
        };
        Verdict {
            seed,
            seawall: row("6 seawall", wasted),
            yardstick: yardstick.map(|w| row("4 tower-resilience", w)),
            missed: missed.to_vec(),
        }
    }

    #[test]
    fn a_sweep_checks_each_seed_as_the_run_of_that_seed_does() {
        let argv = |extra: &[&str]| {
            let mut all: Vec<String> = ["storm", "--requests", "40", "--clients", "10"]
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
            all.extend(extra.iter().map(|s| (*s).to_owned()));
            parse(all).unwrap().unwrap()
        };
        let svg = std::env::temp_dir().join(format!("storm-sweep-test-{}.svg", std::process::id()));
        let svg = svg.to_string_lossy().into_owned();
        let mut each = 0;
        for seed in 1..=3u64 {
            let one = run(&argv(&["--seed", &seed.to_string(), "--svg", &svg])).unwrap();
            let verdict = Verdict::of(&argv(&["--seeds", "1-3"]), seed).unwrap();
            assert_eq!(verdict.missed.len(), one, "seed {seed}");
            each += one;
        }
        let _ = std::fs::remove_file(&svg);
        assert_eq!(sweep(&argv(&["--seeds", "1-3"]), 1, 3).unwrap(), each);
    }

    #[test]
    fn a_sweep_names_the_seeds_that_missed_each_goal_and_the_spread_of_the_waste_ratio() {
        let verdicts = [
            verdict(1, 0.9, Some(1.0), &[]),
            verdict(2, 1.2, Some(1.0), &[Goal::Waste]),
            verdict(3, 0.8, Some(1.0), &[Goal::P99]),
            verdict(4, 0.5, None, &[]),
            verdict(5, 1.0, Some(1.0), &[]),
        ];
        assert_eq!(verdict(6, 0.0, Some(0.0), &[]).waste_ratio(), Some(1.0));
        assert_eq!(verdict(7, 0.0, Some(0.5), &[]).waste_ratio(), Some(0.0));
        let t = tally(&verdicts);
        assert!(t.contains("over 5 seeds"), "{t}");
        assert!(t.contains("success  met at every seed"), "{t}");
        assert!(t.contains("P99      missed at 1: 3\n"), "{t}");
        assert!(t.contains("waste    missed at 1: 2 (1.20x)"), "{t}");
        // Ratios 0.8, 0.9, 1.0, 1.2 (seed 4 has no yardstick): the nearest-rank median is the
        // second, the 90th percentile the fourth.
        assert!(
            t.contains(
                "(4 seeds with one): median 0.90x, 90th percentile 1.20x, largest 1.20x (seed 2)"
            ),
            "{t}"
        );
        assert!(verdicts[3].line().contains("no other row delivers 95%"));
        assert!(
            verdicts[1].line().ends_with("waste"),
            "{}",
            verdicts[1].line()
        );
    }
}
