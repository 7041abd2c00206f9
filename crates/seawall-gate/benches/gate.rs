//! Overhead of the gate on a no-op inner service, beside tower's `ConcurrencyLimit` and
//! tower-resilience's bulkhead, in one run:
//!
//! - `uncontended`: one task, a limit far above one call in flight: the acquire/release path.
//! - `contended_2_threads`: two tasks on a two-thread runtime sharing a limit of 1, so callers
//!   really queue.
//!
//! `seawall_gate_with_lanes` is the gate with a batch lane configured (every call here is in
//! the default, interactive lane): the cost of the lanes' bookkeeping.
//!
//! `cargo bench -p seawall-gate --bench gate`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use seawall_core::LlmError;
use seawall_gate::{ConcurrencyGateLayer, LaneShare, Priority, Rates};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_resilience::bulkhead::BulkheadLayer;

use seawall_test_support::{Bare, Done as Answer};

/// The smallest request: a key and a token estimate.
type Ask = Bare;
const ASK: Bare = Bare {
    model: "gpt-4o-mini",
    input: 100,
    max: Some(256),
};

fn noop() -> impl Service<Ask, Response = Answer, Error = LlmError, Future: Send> + Clone + Send {
    service_fn(|_: Ask| std::future::ready(Ok::<_, LlmError>(Answer)))
}

/// Runs `iters` calls on `tasks` tasks of a runtime with `threads` workers.
fn drive<S>(svc: S, iters: u64, tasks: u64, threads: usize) -> Duration
where
    S: Service<Ask> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: std::fmt::Debug,
{
    let rt = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_time()
            .build()
    }
    .unwrap();
    rt.block_on(async move {
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let mut svc = svc.clone();
                tokio::spawn(async move {
                    for _ in 0..iters / tasks {
                        let svc = svc.ready().await.unwrap();
                        black_box(svc.call(ASK).await.unwrap());
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
        start.elapsed()
    })
}

fn bench(c: &mut Criterion, group: &str, limit: usize, tasks: u64, threads: usize) {
    let mut g = c.benchmark_group(group);
    g.bench_function("seawall_gate", |b| {
        let svc = ConcurrencyGateLayer::builder()
            .limit(limit)
            .max_queue(1 << 20)
            .build()
            .unwrap()
            .layer(noop());
        b.iter_custom(|iters| drive(svc.clone(), iters, tasks, threads));
    });
    g.bench_function("seawall_gate_with_rpm_tpm", |b| {
        let svc = ConcurrencyGateLayer::builder()
            .limit(limit)
            .max_queue(1 << 20)
            .rates(
                Rates::new()
                    .requests_per_minute(u64::MAX / 4)
                    .tokens_per_minute(u64::MAX / 4),
            )
            .build()
            .unwrap()
            .layer(noop());
        b.iter_custom(|iters| drive(svc.clone(), iters, tasks, threads));
    });
    g.bench_function("seawall_gate_with_lanes", |b| {
        let svc = ConcurrencyGateLayer::builder()
            .limit(limit)
            .max_queue(1 << 20)
            .lane(
                Priority::Batch,
                LaneShare {
                    permits: 0.5,
                    rate: 0.5,
                },
            )
            .build()
            .unwrap()
            .layer(noop());
        b.iter_custom(|iters| drive(svc.clone(), iters, tasks, threads));
    });
    g.bench_function("tower_concurrency_limit", |b| {
        // Clones of one `ConcurrencyLimit` share its semaphore.
        let svc = tower::limit::ConcurrencyLimitLayer::new(limit).layer(noop());
        b.iter_custom(|iters| drive(svc.clone(), iters, tasks, threads));
    });
    g.bench_function("tower_resilience_bulkhead", |b| {
        let svc = BulkheadLayer::builder()
            .max_concurrent_calls(limit)
            .build()
            .unwrap()
            .layer(noop());
        b.iter_custom(|iters| drive(svc.clone(), iters, tasks, threads));
    });
    g.finish();
}

fn uncontended(c: &mut Criterion) {
    bench(c, "uncontended", 1024, 1, 1);
}

fn contended(c: &mut Criterion) {
    bench(c, "contended_2_threads", 1, 2, 2);
}

criterion_group!(benches, uncontended, contended);
criterion_main!(benches);
