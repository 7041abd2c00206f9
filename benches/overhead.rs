//! Per-call overhead of every seawall layer alone and of the recommended stack, beside tower's
//! own layers and tower-resilience's, in one run, on one no-op inner service.
//!
//! ```text
//! cargo bench -p seawall --bench overhead
//! cargo bench -p seawall --bench overhead -- --output-format bencher   # one line per bench
//! cargo bench -p seawall --bench overhead -- 'overhead/seawall_'       # a subset
//! ```
//!
//! One measured call is what an application does: build a fresh `http::Request<Bytes>` with a
//! small OpenAI-style JSON body, `ready().await`, `call(req).await`, and read the response body
//! to its end (so permits, reservations and records held until the end of the body are
//! released inside the measurement). The inner service answers at once with a small JSON chat
//! completion. `baseline` is that call on the inner service alone; a variant's overhead is its
//! time minus the baseline.
//!
//! - `overhead/*` (uncontended): one thread, one current-thread tokio runtime.
//! - `overhead_2_threads/*` (contended): two OS threads, each with its own current-thread
//!   runtime, each calling its own clone of the same service at once, so the layer's shared
//!   state (permits, windows, counters, budgets) is contended. The time is per call as seen by
//!   either thread (wall time of the slower thread divided by its calls).
//!
//! Variants (`benches/support/mod.rs` builds them):
//! - `baseline`: the inner service alone; `ref_prepare_only`: only the request's one JSON
//!   parse (`LlmRequest::prepare`), which the outermost seawall layer of a stack pays;
//!   `ref_answer_checked`: that, and the answer's bytes checked as JSON by `serde_json`
//!   (nothing kept), the least a classifier that tells whole answers from damaged ones pays;
//!   `ref_clock_read` (not a call): one read of the clock, which the layers take for their
//!   timings;
//! - `seawall_*`: each layer alone with its defaults (`seawall_gate_rates` adds RPM/TPM limits
//!   that never bind; `seawall_budget` has a 12-model price table and three budgets);
//!   `seawall_stack` is the recommended stack's eight core layers, and `seawall_recommended`
//!   the README's whole recommended stack (those eight, the continuation layer and the context
//!   guard; `benches/summarize.awk` divides its time by tower-resilience's stack);
//! - `*_long_prompt` (`baseline`, `ref_prepare_only`, `seawall_recommended`): each call's user
//!   message about 4 KiB of prose instead of a sentence, where reading the request's strings
//!   costs by the byte;
//! - the cache over `seawall_recommended`: `cache_hit_over_recommended` (the same question
//!   every call: all hits but the first), and `cache_miss_over_recommended_new_questions`
//!   against `recommended_new_questions` (each call a question not asked before, the
//!   difference being what a miss adds over the stack), and `cache_miss_added_paired`, that
//!   difference itself, the two timed in alternating batches so that the machine's drift
//!   between two rows falls on both; `cache_miss_added_paired_under_observe` is the same with
//!   the cache where the README puts it, under the observing layer (`observe → cache → ...`);
//! - `tower_*`: `Retry` with a policy that never retries, `ConcurrencyLimit`, `Timeout`, and
//!   a stack of the three; `resilience_*`: tower-resilience's retry, circuit breaker, bulkhead,
//!   and a stack of them with tower's timeout;
//! - `pending_*`: the inner future is `Pending` once before it answers, as a real transport's
//!   is, so timeouts arm their timers;
//! - `*_breaker_open`: the rejection of an open breaker.
//!
//! `benches/run-all.sh` runs this with the per-crate benches and the allocation table and
//! prints the tables of BENCHMARKS.md.

use std::future::Future;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body::Body;
use tokio::runtime::Runtime;
use tower::Service;

mod support;

use support::{Visit, call_ok, call_rejected};

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

/// `iters` successful calls in a row on `svc`; the time they took.
async fn ok_loop<S, B>(mut svc: S, iters: u64) -> Duration
where
    S: Service<Request<Bytes>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
    B::Error: std::fmt::Debug,
{
    let start = Instant::now();
    for _ in 0..iters {
        black_box(call_ok(&mut svc).await);
    }
    start.elapsed()
}

/// `iters` calls on each of `with` and `without`, in alternating batches (each batch's order
/// alternating too); the time the calls on `with` took beyond those on `without`. Slow drift
/// of the machine (another tenant's load, the CPU's clock) falls on both alike, where two
/// rows timed seconds apart each take their own share of it.
async fn paired_loop<S1, B1, S2, B2>(mut with: S1, mut without: S2, iters: u64) -> Duration
where
    S1: Service<Request<Bytes>, Response = Response<B1>>,
    S1::Error: std::fmt::Debug,
    B1: Body,
    B1::Error: std::fmt::Debug,
    S2: Service<Request<Bytes>, Response = Response<B2>>,
    S2::Error: std::fmt::Debug,
    B2: Body,
    B2::Error: std::fmt::Debug,
{
    const BATCH: u64 = 256;
    let (mut on_with, mut on_without) = (Duration::ZERO, Duration::ZERO);
    let mut left = iters;
    let mut with_first = false;
    while left > 0 {
        let n = left.min(BATCH);
        for turn in [with_first, !with_first] {
            let start = Instant::now();
            for _ in 0..n {
                if turn {
                    black_box(call_ok(&mut with).await);
                } else {
                    black_box(call_ok(&mut without).await);
                }
            }
            *if turn { &mut on_with } else { &mut on_without } += start.elapsed();
        }
        with_first = !with_first;
        left -= n;
    }
    on_with.saturating_sub(on_without)
}

/// `iters` rejected calls in a row on `svc`; the time they took.
async fn rejected_loop<S>(mut svc: S, iters: u64) -> Duration
where
    S: Service<Request<Bytes>>,
    S::Error: std::fmt::Debug,
{
    let start = Instant::now();
    for _ in 0..iters {
        assert!(black_box(call_rejected(&mut svc).await));
    }
    start.elapsed()
}

/// Runs `run(clone of svc, iters)` on two threads at once, each on its own runtime; returns
/// the slower thread's time.
fn on_two_threads<S, F, Fut>(rts: &[Runtime; 2], svc: &S, iters: u64, run: F) -> Duration
where
    S: Clone + Send,
    F: Fn(S, u64) -> Fut + Sync,
    Fut: Future<Output = Duration>,
{
    let start_together = Barrier::new(2);
    std::thread::scope(|scope| {
        let threads: Vec<_> = rts
            .iter()
            .map(|rt| {
                let svc = svc.clone();
                let (start_together, run) = (&start_together, &run);
                scope.spawn(move || {
                    start_together.wait();
                    rt.block_on(run(svc, iters))
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("bench thread"))
            .max()
            .unwrap_or_default()
    })
}

struct Uncontended<'a> {
    group: BenchmarkGroup<'a, WallTime>,
    rt: Runtime,
}

impl Visit for Uncontended<'_> {
    fn ok<S, B>(&mut self, name: &'static str, svc: S)
    where
        S: Service<Request<Bytes>, Response = Response<B>> + Clone + Send + 'static,
        S::Error: std::fmt::Debug,
        B: Body,
        B::Error: std::fmt::Debug,
    {
        let rt = &self.rt;
        self.group.bench_function(name, |b| {
            b.iter_custom(|iters| rt.block_on(ok_loop(svc.clone(), iters)))
        });
    }

    fn rejected<S>(&mut self, name: &'static str, svc: S)
    where
        S: Service<Request<Bytes>> + Clone + Send + 'static,
        S::Error: std::fmt::Debug,
    {
        let rt = &self.rt;
        self.group.bench_function(name, |b| {
            b.iter_custom(|iters| rt.block_on(rejected_loop(svc.clone(), iters)))
        });
    }

    fn paired<S1, B1, S2, B2>(&mut self, name: &'static str, with: S1, without: S2)
    where
        S1: Service<Request<Bytes>, Response = Response<B1>> + Clone + Send + 'static,
        S1::Error: std::fmt::Debug,
        B1: Body,
        B1::Error: std::fmt::Debug,
        S2: Service<Request<Bytes>, Response = Response<B2>> + Clone + Send + 'static,
        S2::Error: std::fmt::Debug,
        B2: Body,
        B2::Error: std::fmt::Debug,
    {
        let rt = &self.rt;
        self.group.bench_function(name, |b| {
            b.iter_custom(|iters| rt.block_on(paired_loop(with.clone(), without.clone(), iters)))
        });
    }
}

struct Contended<'a> {
    group: BenchmarkGroup<'a, WallTime>,
    rts: [Runtime; 2],
}

impl Visit for Contended<'_> {
    fn ok<S, B>(&mut self, name: &'static str, svc: S)
    where
        S: Service<Request<Bytes>, Response = Response<B>> + Clone + Send + 'static,
        S::Error: std::fmt::Debug,
        B: Body,
        B::Error: std::fmt::Debug,
    {
        let rts = &self.rts;
        self.group.bench_function(name, |b| {
            b.iter_custom(|iters| on_two_threads(rts, &svc, iters, ok_loop::<S, B>))
        });
    }

    fn rejected<S>(&mut self, name: &'static str, svc: S)
    where
        S: Service<Request<Bytes>> + Clone + Send + 'static,
        S::Error: std::fmt::Debug,
    {
        let rts = &self.rts;
        self.group.bench_function(name, |b| {
            b.iter_custom(|iters| on_two_threads(rts, &svc, iters, rejected_loop::<S>))
        });
    }
}

fn uncontended(c: &mut Criterion) {
    let mut v = Uncontended {
        group: c.benchmark_group("overhead"),
        rt: runtime(),
    };
    support::variants(&mut v);
    support::leave_one_out(&mut v);
    // The price of one read of the clock, which the layers take for their timings: a few
    // dozen instructions under callgrind, tens of nanoseconds on a VM.
    v.group.bench_function("ref_clock_read", |b| {
        b.iter(|| black_box(tokio::time::Instant::now()))
    });
    v.group.finish();
}

fn contended(c: &mut Criterion) {
    let mut v = Contended {
        group: c.benchmark_group("overhead_2_threads"),
        rts: [runtime(), runtime()],
    };
    support::variants(&mut v);
    v.group.finish();
}

/// Short runs: about 2 s per bench, the whole file in a few minutes on 2 cores. Command-line
/// flags (`--measurement-time`, `--sample-size`, `--quick`) override these.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500))
        .sample_size(30)
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = uncontended, contended
}
criterion_main!(benches);
