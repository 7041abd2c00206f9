//! The gateway example under load, measured as a user would before putting it in production:
//! what it adds to each call's latency at fixed request rates, and up to what rate it adds
//! under a millisecond at the 99th percentile.
//!
//! ```text
//! cargo run --release --example gateway_load 2>/tmp/gateway.log
//! cargo run --release --example gateway_load -- --rates 500,1000,2000 --duration 20
//! cargo run --release --example gateway_load -- --clients 40       # streams, auto vs 16 permits
//! ```
//!
//! It starts an instant `seawall-mock` upstream (no latency, no faults, a limit of 1,000,000
//! requests a minute in its rate-limit headers) and the gateway
//! example in front of it, each on loopback and on a tokio runtime of its own (1 and 2 worker
//! threads; `--gateway-threads`), and a client on a third (1 thread, `--client-threads`).
//! The gateway logs as `cargo run --example gateway` does (`RUST_LOG`, default `info`, to
//! stderr through its writer thread, a record per call).
//!
//! **Open loop** (the default): for each mode (non-streamed, streamed) and each rate, requests
//! leave at fixed intervals whether or not earlier ones have answered, taking turns: one
//! through the gateway, the next straight to the upstream, and so on, each target at the
//! rate (so twice the rate leaves the client). Each call's latency is counted from when it
//! was due to leave (so a stalled client or server counts against itself rather than sending
//! less), to the end of its body. The table gives p50/p99/p99.9 of both and the latency the
//! gateway adds, percentile by percentile (gateway minus direct), then the highest rate held:
//! every call answered 200, the rate reached, and p99 added at most 1 ms.
//!
//! Why in turns: the client, the gateway and the upstream share the machine's cores (and, on
//! a shared machine, with whatever else runs), so a scheduling stall of a few milliseconds
//! lands on whichever calls are in flight. Measured one after the other, the direct run and
//! the gateway run each see their own stalls, and their difference at p99 is mostly which
//! run was unluckier; in turns, both see the same seconds of the same machine, and the
//! difference is what the gateway adds. The runtimes are not pinned to cores: with two cores
//! and three runtimes, pinning would only decide which of them waits.
//!
//! **Closed loop** (`--clients N`): N clients each send a streamed call as soon as their last
//! one ended, against an upstream that takes a while (20 ms to its head, 100 ms to the first
//! token, 16 tokens 10 ms apart) and allows 100,000 requests a minute, straight, through the
//! gateway as it ships (auto-sized permits), and through one with a fixed 16 permits; it
//! prints each median and the ratio to the direct one.
//!
//! Why an example and not a bench of `benches/`: it runs the gateway example's own code
//! (its app, its stack), which needs the root package's HTTP, mock and axum dependencies;
//! the benches package leaves those out so that its benches build light.

#[path = "gateway.rs"]
#[allow(dead_code)] // `main`, the chaos profile and the banner are the gateway's own.
mod gateway;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use bytes::Bytes;
use gateway::{ClientKeys, Permits, Settings};
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use seawall::core::BoxError;
use seawall::mock::{Count, Delay, MockUpstream, Profile};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

const PLAIN: &[u8] =
    br#"{"model":"gpt-4o-mini","max_tokens":32,"messages":[{"role":"user","content":"Hello!"}]}"#;
const STREAM: &[u8] = br#"{"model":"gpt-4o-mini","max_tokens":32,"stream":true,"messages":[{"role":"user","content":"Hello!"}]}"#;

/// What the command line asks for.
#[derive(Debug, Clone)]
struct Args {
    rates: Vec<u32>,
    duration: Duration,
    warmup: Duration,
    modes: Vec<Mode>,
    clients: Option<usize>,
    gateway_threads: usize,
    client_threads: usize,
    /// Only through the gateway (for a profiler): no direct runs.
    gateway_only: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    Stream,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "non-streamed",
            Mode::Stream => "streamed",
        }
    }
    fn body(self) -> &'static [u8] {
        match self {
            Mode::Plain => PLAIN,
            Mode::Stream => STREAM,
        }
    }
}

const USAGE: &str = "usage: gateway_load [--rates 500,1000,2000] [--duration SECS] [--warmup SECS] \
     [--modes plain,stream] [--clients N] [--gateway-threads N] [--client-threads N] [--gateway-only]";

impl Args {
    fn parse() -> Result<Args, String> {
        let mut a = Args {
            rates: vec![500, 1000, 2000],
            duration: Duration::from_secs(5),
            warmup: Duration::from_secs(1),
            modes: vec![Mode::Plain, Mode::Stream],
            clients: None,
            gateway_threads: 2,
            client_threads: 1,
            gateway_only: false,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            if flag == "--gateway-only" {
                a.gateway_only = true;
                continue;
            }
            let value = it
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
            let bad = |_| format!("{flag}: cannot read {value:?}\n{USAGE}");
            let secs = |v: &str| v.parse::<f64>().ok().filter(|s| *s >= 0.0 && s.is_finite());
            match flag.as_str() {
                "--rates" => {
                    a.rates = value
                        .split(',')
                        .map(|r| r.trim().parse::<u32>().ok().filter(|&r| r > 0))
                        .collect::<Option<_>>()
                        .ok_or_else(|| format!("--rates: positive integers, got {value:?}"))?;
                }
                "--duration" => {
                    a.duration = Duration::from_secs_f64(
                        secs(&value)
                            .ok_or_else(|| format!("--duration: seconds, got {value:?}"))?,
                    );
                }
                "--warmup" => {
                    a.warmup = Duration::from_secs_f64(
                        secs(&value).ok_or_else(|| format!("--warmup: seconds, got {value:?}"))?,
                    );
                }
                "--modes" => {
                    a.modes = value
                        .split(',')
                        .map(|m| match m.trim() {
                            "plain" => Ok(Mode::Plain),
                            "stream" => Ok(Mode::Stream),
                            other => Err(format!("--modes: plain or stream, got {other:?}")),
                        })
                        .collect::<Result<_, _>>()?;
                }
                "--clients" => a.clients = Some(value.parse().map_err(bad)?),
                "--gateway-threads" => a.gateway_threads = value.parse().map_err(bad)?,
                "--client-threads" => a.client_threads = value.parse().map_err(bad)?,
                _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
            }
        }
        if a.gateway_threads == 0 || a.client_threads == 0 || a.clients == Some(0) {
            return Err(format!(
                "thread and client counts must be at least 1\n{USAGE}"
            ));
        }
        Ok(a)
    }
}

/// A multi-threaded runtime whose workers run what is spawned on it.
fn runtime(name: &str, threads: usize) -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .enable_all()
        .build()
}

/// Serves `upstream` on a free loopback port, on `rt`.
fn start_upstream(rt: &Runtime, upstream: MockUpstream) -> Result<SocketAddr, BoxError> {
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(seawall::mock::serve(listener, upstream));
        Ok(addr)
    })
}

/// Serves the gateway example in front of `upstream` on a free loopback port, on `rt`.
fn start_gateway(
    rt: &Runtime,
    upstream: SocketAddr,
    permits: Permits,
) -> Result<SocketAddr, BoxError> {
    rt.block_on(async {
        let settings = Settings {
            addr: "127.0.0.1:0".to_owned(),
            keys: ClientKeys::default(),
            fallback_model: "gpt-4o-mini".to_owned(),
            anthropic_fallback_model: "claude-haiku-4-5".to_owned(),
            allow_unpriced: false,
            cache_ttl: None,
        };
        let (openai, _) = gateway::mock_upstreams(upstream, "sk-load-upstream")?;
        let providers = gateway::Providers::with_permits(Some(openai), None, &settings, permits)?;
        let listener = gateway::bind(&settings.addr, &settings.keys).await?;
        let addr = listener.local_addr()?;
        let app = gateway::app(providers, settings.keys);
        tokio::spawn(async move { axum::serve(listener.tap_io(gateway::no_delay), app).await });
        Ok(addr)
    })
}

/// The chat completions URL of a target: the upstream's (`/v1` in its base) or the gateway's.
fn url(addr: SocketAddr) -> String {
    format!("http://{addr}/v1/chat/completions")
}

/// One call; `Ok` when it answered 200 and its body was read to the end.
async fn call(client: &HttpClient, url: &str, body: &'static [u8]) -> Result<(), String> {
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-load-client")
        .body(Full::new(Bytes::from_static(body)))
        .map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    if status != http::StatusCode::OK {
        let text = body.to_bytes();
        return Err(format!("{status}: {}", String::from_utf8_lossy(&text)));
    }
    Ok(())
}

/// Latencies of one run, in microseconds.
struct Outcome {
    hist: Histogram<u64>,
    errors: usize,
    first_error: Option<String>,
    /// Calls per second sent over the measured part.
    achieved: f64,
}

/// A pooled HTTP/1 client that sends without Nagle's delay, as the SDKs' clients do.
fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .build(connector)
}

fn histogram() -> Histogram<u64> {
    // 1 µs to 100 s at 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid bounds")
}

/// Sends `rate` calls per second to each of `urls` for `warmup + duration`, on one fixed
/// schedule that takes the targets in turn (call `i` goes to `urls[i % n]`, at `n * rate`
/// calls a second in all), and records the calls of the measured part, one outcome per
/// target. Taking turns, every target sees the same scheduling noise of the shared machine
/// over the same seconds, where runs one after the other would each see their own.
async fn open_loop(
    client: &HttpClient,
    urls: &[&str],
    mode: Mode,
    rate: u32,
    warmup: Duration,
    duration: Duration,
) -> Vec<Outcome> {
    let n = urls.len();
    let all = f64::from(rate) * n as f64;
    let interval = Duration::from_secs_f64(1.0 / all);
    let total = ((warmup + duration).as_secs_f64() * all).round() as u64;
    let skip = (warmup.as_secs_f64() * all).round() as u64;
    let urls: Vec<Arc<str>> = urls.iter().map(|&u| u.into()).collect();
    let start = tokio::time::Instant::now();
    let mut tasks: Vec<Vec<_>> = (0..n)
        .map(|_| Vec::with_capacity((total - skip) as usize / n + 1))
        .collect();
    for i in 0..total {
        let due = start + interval.mul_f64(i as f64);
        tokio::time::sleep_until(due).await;
        let target = (i % n as u64) as usize;
        let (client, url) = (client.clone(), urls[target].clone());
        let task = tokio::spawn(async move {
            let out = call(&client, &url, mode.body()).await;
            (
                out,
                tokio::time::Instant::now().saturating_duration_since(due),
            )
        });
        if i >= skip {
            tasks[target].push(task);
        }
    }
    let sent_in = start
        .elapsed()
        .saturating_sub(warmup)
        .as_secs_f64()
        .max(1e-9);
    let mut outcomes = Vec::with_capacity(n);
    for tasks in tasks {
        let mut outcome = Outcome {
            hist: histogram(),
            errors: 0,
            first_error: None,
            achieved: tasks.len() as f64 / sent_in,
        };
        for t in tasks {
            let (out, took) = t.await.expect("a call task panicked");
            match out {
                Ok(()) => {
                    let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
                    let _ = outcome.hist.record(us.min(100_000_000));
                }
                Err(e) => {
                    outcome.errors += 1;
                    outcome.first_error.get_or_insert(e);
                }
            }
        }
        outcomes.push(outcome);
    }
    outcomes
}

/// `clients` callers, each sending its next streamed call when the last one ended.
async fn closed_loop(
    client: &HttpClient,
    url: &str,
    clients: usize,
    duration: Duration,
) -> Outcome {
    let end = tokio::time::Instant::now() + duration;
    let url: Arc<str> = url.into();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let mut hist = histogram();
                let (mut errors, mut first_error, mut calls) = (0, None, 0u64);
                while tokio::time::Instant::now() < end {
                    let t = tokio::time::Instant::now();
                    calls += 1;
                    match call(&client, &url, STREAM).await {
                        Ok(()) => {
                            let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
                            let _ = hist.record(us.clamp(1, 100_000_000));
                        }
                        Err(e) => {
                            errors += 1;
                            first_error.get_or_insert(e);
                        }
                    }
                }
                (hist, errors, first_error, calls)
            })
        })
        .collect();
    let mut outcome = Outcome {
        hist: histogram(),
        errors: 0,
        first_error: None,
        achieved: 0.0,
    };
    let mut calls = 0;
    for t in tasks {
        let (h, errors, first, n) = t.await.expect("a client task panicked");
        outcome.hist.add(h).expect("same bounds");
        outcome.errors += errors;
        if outcome.first_error.is_none() {
            outcome.first_error = first;
        }
        calls += n;
    }
    outcome.achieved = calls as f64 / duration.as_secs_f64();
    outcome
}

fn ms(us: u64) -> String {
    format!("{:.3}", us as f64 / 1e3)
}

fn added(gw: u64, direct: u64) -> String {
    format!("{:+.3}", (gw as f64 - direct as f64) / 1e3)
}

const QUANTILES: [f64; 3] = [0.5, 0.99, 0.999];

fn open_loop_report(args: &Args, client_rt: &Runtime, direct: &str, gw: &str) {
    let client = client();
    println!(
        "open loop, {} s per run after {} s of warm-up; latency in ms from the scheduled send to the end of the body",
        args.duration.as_secs_f64(),
        args.warmup.as_secs_f64()
    );
    println!(
        "| mode | rate/s | sent/s | direct p50 | p99 | p99.9 | gateway p50 | p99 | p99.9 | added p50 | p99 | p99.9 | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &mode in &args.modes {
        let mut held = None;
        for &rate in &args.rates {
            let urls: &[&str] = if args.gateway_only {
                &[gw]
            } else {
                &[gw, direct]
            };
            let mut outcomes = client_rt
                .block_on(open_loop(
                    &client,
                    urls,
                    mode,
                    rate,
                    args.warmup,
                    args.duration,
                ))
                .into_iter();
            let g = outcomes.next().expect("one outcome per target");
            let d = outcomes.next();
            let q = |o: &Outcome| QUANTILES.map(|q| o.hist.value_at_quantile(q));
            let gq = q(&g);
            let dq = d.as_ref().map(q);
            let cell = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), ms);
            let errors = g.errors + d.as_ref().map_or(0, |d| d.errors);
            println!(
                "| {} | {rate} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {errors} |",
                mode.name(),
                g.achieved,
                cell(dq.map(|d| d[0])),
                cell(dq.map(|d| d[1])),
                cell(dq.map(|d| d[2])),
                ms(gq[0]),
                ms(gq[1]),
                ms(gq[2]),
                dq.map_or_else(|| "-".to_owned(), |d| added(gq[0], d[0])),
                dq.map_or_else(|| "-".to_owned(), |d| added(gq[1], d[1])),
                dq.map_or_else(|| "-".to_owned(), |d| added(gq[2], d[2])),
            );
            for e in [
                &g.first_error,
                &d.as_ref().and_then(|d| d.first_error.clone()),
            ]
            .into_iter()
            .flatten()
            {
                eprintln!("  first error at {rate}/s ({}): {e}", mode.name());
            }
            let kept_up = g.achieved >= 0.95 * f64::from(rate);
            let ok =
                errors == 0 && kept_up && dq.is_some_and(|d| gq[1].saturating_sub(d[1]) <= 1_000);
            if ok {
                held = Some(rate);
            }
        }
        if !args.gateway_only {
            match held {
                Some(r) => println!(
                    "{}: highest rate held with p99 added <= 1 ms: {r}/s",
                    mode.name()
                ),
                None => println!(
                    "{}: no rate held with p99 added <= 1 ms (of {:?})",
                    mode.name(),
                    args.rates
                ),
            }
        }
    }
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse()?;
    let _log = gateway::init_logging();
    let upstream_rt = runtime("upstream", 1)?;
    let gateway_rt = runtime("gateway", args.gateway_threads)?;
    let client_rt = runtime("client", args.client_threads)?;
    match args.clients {
        None => {
            // Instant, with the rate-limit headers of a key with room for every rate tried
            // (1,000,000 requests a minute), as a real provider sends them.
            let profile = Profile::default().rpm(1_000_000);
            let upstream = start_upstream(&upstream_rt, MockUpstream::new(profile))?;
            let gw = start_gateway(&gateway_rt, upstream, Permits::Auto)?;
            open_loop_report(&args, &client_rt, &url(upstream), &url(gw));
        }
        Some(clients) => {
            let millis = Duration::from_millis;
            let profile = Profile::default()
                .rpm(100_000)
                .head_latency(Delay::fixed(millis(20)))
                .first_token_latency(Delay::fixed(millis(100)))
                .per_token_latency(Delay::fixed(millis(10)))
                .output_tokens(Count::fixed(16));
            let upstream = start_upstream(&upstream_rt, MockUpstream::new(profile))?;
            let auto = start_gateway(&gateway_rt, upstream, Permits::Auto)?;
            let fixed = start_gateway(&gateway_rt, upstream, Permits::Fixed(16))?;
            let client = client();
            println!(
                "closed loop: {clients} clients, streamed calls (20 ms head, 100 ms first token, 16 tokens 10 ms apart), {} s each after {} s of warm-up; ms",
                args.duration.as_secs_f64(),
                args.warmup.as_secs_f64()
            );
            println!("| target | calls/s | p50 | p99 | p50 / direct p50 | errors |");
            println!("|---|---|---|---|---|---|");
            let mut direct_p50 = None;
            for (name, addr) in [
                ("direct", upstream),
                ("gateway, auto-sized permits", auto),
                ("gateway, 16 fixed permits", fixed),
            ] {
                let target = url(addr);
                client_rt.block_on(closed_loop(&client, &target, clients, args.warmup));
                let o = client_rt.block_on(closed_loop(&client, &target, clients, args.duration));
                let p50 = o.hist.value_at_quantile(0.5);
                let base = *direct_p50.get_or_insert(p50);
                println!(
                    "| {name} | {:.0} | {} | {} | {:.3} | {} |",
                    o.achieved,
                    ms(p50),
                    ms(o.hist.value_at_quantile(0.99)),
                    p50 as f64 / base as f64,
                    o.errors
                );
                if let Some(e) = o.first_error {
                    eprintln!("  first error ({name}): {e}");
                }
            }
        }
    }
    Ok(())
}
