//! Heap allocations per call of every variant of the overhead bench (each seawall layer alone,
//! the recommended stack, tower's layers, tower-resilience's), counted by dhat's global
//! allocator (which wraps the system's).
//!
//! ```text
//! cargo bench -p seawall --bench allocs
//! ```
//!
//! Each variant gets the same call as in `benches/overhead.rs` (fresh request, ready, call,
//! body read to its end) on one current-thread runtime: a warm-up of calls first (so one-time
//! setup such as a breaker's first key, a timer wheel or a lazily built table is not counted),
//! then the allocations of [`CALLS`] calls are counted and divided. `retained B/call` is heap
//! growth per call over the counted calls (freed bytes subtracted): anything but 0 means a
//! call leaves something behind (a cache filling, a map growing, or a leak). Counts are exact
//! and do not depend on the machine, so this table can be produced anywhere.
//!
//! The output is a Markdown table that pastes into BENCHMARKS.md.

use std::hint::black_box;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use seawall::LlmRequest;
use tokio::runtime::Runtime;
use tower::Service;

mod support;

use support::{Visit, call_ok, call_rejected};

/// Calls counted per variant.
const CALLS: u64 = 2_000;
/// Calls before counting starts.
const WARM_UP: u64 = 200;
/// The same, when run as a test (`cargo test --benches`): only checks that every variant runs.
const TEST_CALLS: u64 = 10;

/// dhat's global allocator counts every allocation (a `realloc` counts as one), the bytes
/// asked for and the live bytes, while a profiler runs.
#[global_allocator]
static GLOBAL: dhat::Alloc = dhat::Alloc;

/// Allocations, bytes and retained bytes per call.
#[derive(Clone, Copy)]
struct PerCall {
    allocs: f64,
    bytes: f64,
    retained: f64,
}

/// Counts what `calls` runs of `f` allocate.
fn count(calls: u64, mut f: impl FnMut()) -> PerCall {
    let before = dhat::HeapStats::get();
    for _ in 0..calls {
        f();
    }
    let after = dhat::HeapStats::get();
    let n = calls as f64;
    PerCall {
        allocs: (after.total_blocks - before.total_blocks) as f64 / n,
        bytes: (after.total_bytes - before.total_bytes) as f64 / n,
        retained: (after.curr_bytes as f64 - before.curr_bytes as f64) / n,
    }
}

struct Table {
    rt: Runtime,
    rows: Vec<(&'static str, PerCall)>,
    /// The sizes of each variant's response future and body, in bytes: what every layer
    /// above moves (a future as the calls nest, a response as it is handed up).
    sizes: Vec<(&'static str, usize, usize)>,
    /// Names to measure (any that contains one of them); empty: all.
    filters: Vec<String>,
    warm_up: u64,
    calls: u64,
}

impl Table {
    fn run(&mut self, name: &'static str, mut one: impl FnMut(&Runtime)) {
        let reference = name == "baseline" || name.starts_with("ref_");
        if !reference
            && !self.filters.is_empty()
            && !self.filters.iter().any(|f| name.contains(&**f))
        {
            return;
        }
        for _ in 0..self.warm_up {
            one(&self.rt);
        }
        let rt = &self.rt;
        let per_call = count(self.calls, || one(rt));
        self.rows.push((name, per_call));
    }

    fn print(&self) {
        let row = |name: &str| self.rows.iter().find(|(n, _)| *n == name).map(|(_, p)| *p);
        let (base, prepared) = (row("baseline"), row("ref_prepare_only"));
        println!(
            "| variant | allocs/call | bytes/call | allocs over baseline | bytes over baseline \
             | allocs over ref_prepare_only | retained B/call | future B | body B |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        let diff = |a: f64, b: Option<f64>, prec: usize| {
            b.map_or(String::new(), |b| format!("{:+.prec$}", a - b))
        };
        for (name, p) in &self.rows {
            let is_call = !name.starts_with("ref_request") && *name != "ref_block_on";
            let (da, db) = if is_call {
                (
                    diff(p.allocs, base.map(|b| b.allocs), 1),
                    diff(p.bytes, base.map(|b| b.bytes), 0),
                )
            } else {
                (String::new(), String::new())
            };
            let dp = if name.contains("seawall_") {
                diff(p.allocs, prepared.map(|b| b.allocs), 1)
            } else {
                String::new()
            };
            let (future, body) = self
                .sizes
                .iter()
                .find(|(n, ..)| n == name)
                .map_or((String::new(), String::new()), |(_, f, b)| {
                    (f.to_string(), b.to_string())
                });
            println!(
                "| {name} | {:.1} | {:.0} | {da} | {db} | {dp} | {:.0} | {future} | {body} |",
                p.allocs, p.bytes, p.retained
            );
        }
        // The figure the stack is held to: allocations per call over the baseline, beside
        // tower-resilience's stack of four layers.
        if let (Some(b), Some(s), Some(r)) =
            (base, row("seawall_recommended"), row("resilience_stack"))
        {
            println!(
                "\nseawall_recommended: {:+.1} allocs/call over baseline; resilience_stack: {:+.1} \
                 ({:.2}x)",
                s.allocs - b.allocs,
                r.allocs - b.allocs,
                (s.allocs - b.allocs) / (r.allocs - b.allocs),
            );
        }
    }
}

impl Visit for Table {
    fn ok<S, B>(&mut self, name: &'static str, svc: S)
    where
        S: Service<Request<Bytes>, Response = Response<B>> + Clone + Send + 'static,
        S::Error: std::fmt::Debug,
        B: Body,
        B::Error: std::fmt::Debug,
    {
        let mut svc = svc;
        self.sizes
            .push((name, size_of::<S::Future>(), size_of::<B>()));
        self.run(name, |rt| {
            black_box(rt.block_on(call_ok(&mut svc)));
        });
    }

    fn rejected<S>(&mut self, name: &'static str, svc: S)
    where
        S: Service<Request<Bytes>> + Clone + Send + 'static,
        S::Error: std::fmt::Debug,
    {
        let mut svc = svc;
        self.run(name, |rt| {
            assert!(black_box(rt.block_on(call_rejected(&mut svc))));
        });
    }
}

fn main() {
    // `cargo bench` passes `--bench` and any filter words; `cargo test` passes no `--bench`.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bench = args.iter().any(|a| a == "--bench");
    // Testing mode: heap statistics only, no profile file written at the end.
    let _profiler = dhat::Profiler::builder().testing().build();
    let (warm_up, calls) = if bench {
        (WARM_UP, CALLS)
    } else {
        (TEST_CALLS, TEST_CALLS)
    };
    let mut table = Table {
        rt: tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime"),
        rows: Vec::new(),
        sizes: Vec::new(),
        filters: args.into_iter().filter(|a| !a.starts_with("--")).collect(),
        warm_up,
        calls,
    };
    // Reference rows: what building the request costs, and its one JSON parse.
    table.run("ref_request_build", |_| {
        black_box(support::request());
    });
    table.run("ref_request_prepare", |_| {
        let mut req = support::request();
        req.prepare();
        black_box(req);
    });
    // An empty block_on, to show the runtime itself allocates nothing per call.
    table.run("ref_block_on", |rt| rt.block_on(async {}));
    support::variants(&mut table);
    support::leave_one_out(&mut table);
    println!("Heap allocations per call ({calls} calls counted after {warm_up} warm-up calls):\n");
    table.print();
}
