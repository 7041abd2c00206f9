//! Per-call overhead of the breaker in its closed state and its open-state rejection, beside
//! tower-resilience's circuit breaker, over a no-op inner service.
//!
//! `cargo bench -p seawall-breaker --bench breaker`
//!
//! Every variant runs `ready().await` then `call(req).await` on a current-thread runtime, so
//! the runtime's cost is the same for all; `baseline` is the inner service alone;
//! `seawall_shared` is seawall's breaker with a (no-op) fleet state, to show what sharing adds
//! to a call through a closed breaker.

use std::future::{Ready, ready};
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Bencher, Criterion, criterion_group, criterion_main};
use seawall_breaker::{CircuitBreakerLayer, FleetLink, SharedBreakerState, State, StateChange};
use seawall_core::{ConfigError, FailureClass, LlmError};
use seawall_test_support::{Bare as Ask, Done as Answer};
use tokio::runtime::Runtime;
use tower::{Layer, Service, ServiceExt};

#[derive(Clone, Copy)]
struct Noop;

impl Service<Ask> for Noop {
    type Response = Answer;
    type Error = LlmError;
    type Future = Ready<Result<Answer, LlmError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), LlmError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Ask) -> Self::Future {
        ready(Ok(Answer))
    }
}

/// A shared state that shares nothing: what sharing itself adds to a call (the outcome
/// counted for the fleet), without any store's background work.
struct NoFleet;

impl SharedBreakerState for NoFleet {
    fn attach(&self, _: FleetLink) -> Result<(), ConfigError> {
        Ok(())
    }
    fn on_state_change(&self, _: &StateChange) {}
    fn interval(&self) -> Duration {
        Duration::from_millis(250)
    }
}

const REQ: Ask = Ask {
    model: "api.openai.com/gpt-4o",
    input: 0,
    max: None,
};

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();

    let seawall = CircuitBreakerLayer::new();
    let seawall_svc = seawall.layer(Noop);
    let shared = CircuitBreakerLayer::builder()
        .shared_state(NoFleet)
        .build()
        .unwrap();
    let shared_svc = shared.layer(Noop);
    let resilience = tower_resilience::circuitbreaker::CircuitBreakerLayer::builder()
        .failure_rate_threshold(0.5)
        .sliding_window_size(100)
        .wait_duration_in_open(Duration::from_secs(3600))
        .build()
        .unwrap();
    let resilience_svc = resilience.layer_fn(Noop);

    let mut group = c.benchmark_group("closed");
    group.bench_function("baseline", |b| run(b, &rt, &Noop, true));
    group.bench_function("seawall", |b| run(b, &rt, &seawall_svc, true));
    group.bench_function("seawall_shared", |b| run(b, &rt, &shared_svc, true));
    group.bench_function("tower_resilience", |b| run(b, &rt, &resilience_svc, true));
    group.finish();

    // As axum does: a fresh clone of the service per call. seawall's per-service memory of
    // the last key is then empty, so every call goes through the shared key map.
    let mut group = c.benchmark_group("closed_clone_per_call");
    group.bench_function("baseline", |b| run_cloned(b, &rt, &Noop, true));
    group.bench_function("seawall", |b| run_cloned(b, &rt, &seawall_svc, true));
    group.bench_function("tower_resilience", |b| {
        run_cloned(b, &rt, &resilience_svc, true)
    });
    group.finish();

    // Trip seawall's breaker for real (Open, not ForcedOpen): five server errors.
    let mut failing = seawall.layer(tower::service_fn(|_: Ask| {
        ready(Err::<Answer, _>(LlmError::new(
            FailureClass::ServerError,
            "500",
        )))
    }));
    rt.block_on(async {
        for _ in 0..5 {
            if let Ok(s) = failing.ready().await {
                let _ = s.call(REQ).await;
            }
        }
        resilience_svc.force_open().await;
    });
    assert!(seawall.handle().state(REQ.model) == Some(State::Open));

    let mut group = c.benchmark_group("open");
    group.bench_function("seawall", |b| run(b, &rt, &seawall_svc, false));
    group.bench_function("tower_resilience", |b| run(b, &rt, &resilience_svc, false));
    group.finish();
}

/// `iters` calls in a row on a clone of `svc`, each `ready()` then `call()`.
fn run<S>(b: &mut Bencher<'_>, rt: &Runtime, svc: &S, expect_ok: bool)
where
    S: Service<Ask> + Clone + 'static,
{
    b.to_async(rt).iter_custom(|iters| {
        let mut svc = svc.clone();
        async move {
            let start = Instant::now();
            for _ in 0..iters {
                let ok = match svc.ready().await {
                    Ok(s) => s.call(black_box(REQ)).await.is_ok(),
                    Err(_) => false,
                };
                assert_eq!(black_box(ok), expect_ok);
            }
            start.elapsed()
        }
    })
}

/// `iters` calls, each on a fresh clone of `svc`.
fn run_cloned<S>(b: &mut Bencher<'_>, rt: &Runtime, svc: &S, expect_ok: bool)
where
    S: Service<Ask> + Clone + 'static,
{
    b.to_async(rt).iter_custom(|iters| {
        let svc = svc.clone();
        async move {
            let start = Instant::now();
            for _ in 0..iters {
                let mut svc = svc.clone();
                let ok = match svc.ready().await {
                    Ok(s) => s.call(black_box(REQ)).await.is_ok(),
                    Err(_) => false,
                };
                assert_eq!(black_box(ok), expect_ok);
            }
            start.elapsed()
        }
    })
}

criterion_group!(benches, bench);
criterion_main!(benches);
