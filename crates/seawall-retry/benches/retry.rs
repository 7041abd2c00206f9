//! Overhead of a call that needs no retry: `BackoffRetry` (defaults: retry budget and time
//! budget on) beside `tower::retry::Retry` with a trivial policy, on the same no-op inner
//! service, in the same run.
//!
//! `cargo bench -p seawall-retry --bench retry`

use std::future::{Future, Ready, ready};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use seawall_core::{Deadline, LlmError, LlmRequest};
use seawall_retry::{BackoffRetryLayer, IDEMPOTENCY_KEY};
use tower::retry::{Policy, Retry};
use tower::{Layer, Service};

/// A typed request whose clone is one reference-count increment.
#[derive(Clone)]
struct Ask {
    prompt: Arc<str>,
}

impl LlmRequest for Ask {
    fn model(&self) -> Option<&str> {
        Some("bench-model")
    }
    fn max_output_tokens(&self) -> Option<u32> {
        Some(16)
    }
    fn estimated_input_tokens(&self) -> u32 {
        self.prompt.len() as u32 / 4
    }
}

/// Answers at once.
#[derive(Clone, Copy)]
struct Noop;

impl<R> Service<R> for Noop {
    type Response = u32;
    type Error = LlmError;
    type Future = Ready<Result<u32, LlmError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: R) -> Self::Future {
        ready(Ok(7))
    }
}

/// tower's retry with the least a policy can do: clone the request, never retry.
#[derive(Clone, Copy)]
struct NeverRetry;

impl<R: Clone, Res, E> Policy<R, Res, E> for NeverRetry {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut R, _: &mut Result<Res, E>) -> Option<Self::Future> {
        None
    }

    fn clone_request(&mut self, req: &R) -> Option<R> {
        Some(req.clone())
    }
}

/// One call: ready, call, poll the response future to completion (it is ready at once).
fn one_call<S, R>(svc: &mut S, req: R, cx: &mut Context<'_>) -> u32
where
    S: Service<R, Response = u32>,
    S::Error: std::fmt::Debug,
{
    match svc.poll_ready(cx) {
        Poll::Ready(Ok(())) => {}
        _ => unreachable!("the no-op service is always ready"),
    }
    let fut = pin!(svc.call(req));
    match fut.poll(cx) {
        Poll::Ready(Ok(n)) => n,
        _ => unreachable!("the no-op service answers at once"),
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let mut cx = Context::from_waker(Waker::noop());

    let ask = Ask {
        prompt: Arc::from("Say hello to the whole wide world"),
    };
    let mut group = c.benchmark_group("no_retry_needed/typed_request");
    let mut tower_retry = Retry::new(NeverRetry, Noop);
    group.bench_function("tower_retry", |b| {
        b.iter(|| one_call(&mut tower_retry, ask.clone(), &mut cx))
    });
    let mut seawall = BackoffRetryLayer::new().layer(Noop);
    group.bench_function("backoff_retry", |b| {
        b.iter(|| one_call(&mut seawall, ask.clone(), &mut cx))
    });
    group.finish();

    let http_req = http::Request::post("https://api.openai.com/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Bytes::from_static(
            br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#,
        ))
        .expect("request");
    let mut http_req = http_req;
    // Parsed once, as the outermost seawall layer would have done.
    http_req.prepare();
    let mut group = c.benchmark_group("no_retry_needed/http_request");
    let mut tower_retry = Retry::new(NeverRetry, Noop);
    group.bench_function("tower_retry", |b| {
        b.iter(|| one_call(&mut tower_retry, http_req.clone(), &mut cx))
    });
    let mut seawall = BackoffRetryLayer::new().layer(Noop);
    group.bench_function("backoff_retry", |b| {
        b.iter(|| one_call(&mut seawall, http_req.clone(), &mut cx))
    });
    let mut keyed = BackoffRetryLayer::builder()
        .idempotency_key(IDEMPOTENCY_KEY)
        .build()
        .expect("layer")
        .layer(Noop);
    group.bench_function("backoff_retry_idempotency_key", |b| {
        b.iter(|| one_call(&mut keyed, http_req.clone(), &mut cx))
    });
    // The same call carrying a caller's deadline far away: the lookup, one clock read, and
    // the deadline kept in the future.
    let mut with_deadline = http_req.clone();
    with_deadline
        .extensions_mut()
        .insert(Deadline::after(Duration::from_secs(3600)));
    // Its baseline: cloning a request with one more extension costs by itself.
    group.bench_function("tower_retry_with_deadline", |b| {
        b.iter(|| one_call(&mut tower_retry, with_deadline.clone(), &mut cx))
    });
    group.bench_function("backoff_retry_with_deadline", |b| {
        b.iter(|| one_call(&mut seawall, with_deadline.clone(), &mut cx))
    });
    group.finish();

    // What each layer's deadline check costs by itself: the extension lookup, and the clock
    // read when a deadline is set.
    let mut group = c.benchmark_group("deadline_check");
    group.bench_function("no_deadline", |b| {
        b.iter(|| {
            std::hint::black_box(&http_req)
                .deadline()
                .map(|d| d.check().is_err())
        })
    });
    group.bench_function("with_deadline", |b| {
        b.iter(|| {
            std::hint::black_box(&with_deadline)
                .deadline()
                .map(|d| d.check().is_err())
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
