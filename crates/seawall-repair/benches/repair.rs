//! The repair layer's cost on the path nearly every call takes: a small valid answer, read
//! whole, parsed, validated and re-emitted, against the same call without the layer. Also a
//! streamed request, which the layer passes through.
//!
//! `cargo bench -p seawall-repair --bench repair`
//!
//! The upstream answers at once and every future is ready at its first poll, so the figures
//! are the layer's own work (no runtime, no I/O); the request is built (and prepared, as the
//! observe layer outside would) before the timing.

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use http_body_util::{BodyExt, Full};
use seawall_core::LlmRequest;
use seawall_repair::{RepairLayer, require_fields, validate_json};
use tower::{Layer, Service, ServiceExt};

const QUESTION: &str = r#"{"model":"gpt-4o-mini","max_tokens":64,"messages":[{"role":"system","content":"Reply with a JSON object: city, country."},{"role":"user","content":"Where is the Vigeland park?"}]}"#;

const STREAMED: &str = r#"{"model":"gpt-4o-mini","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"Where is the Vigeland park?"}]}"#;

const ANSWER: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"{\"city\": \"Oslo\", \"country\": \"Norway\"}"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":12,"total_tokens":42}}"#;

/// A request as the layer meets it in a stack: already prepared (its body parsed once into
/// the request facts) by the observe layer outside, so its parse is not the layer's cost.
fn request(body: &'static str) -> http::Request<Bytes> {
    let mut req = http::Request::post("http://localhost/v1/chat/completions")
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-bench")
        .body(Bytes::from_static(body.as_bytes()))
        .unwrap();
    req.prepare();
    req
}

/// An upstream that answers at once.
#[derive(Clone)]
struct Upstream;

impl Service<http::Request<Bytes>> for Upstream {
    type Response = http::Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<Bytes>) -> Self::Future {
        std::future::ready(Ok(http::Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(ANSWER.as_bytes())))
            .unwrap()))
    }
}

/// Polls a future that is ready at once.
fn now<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the bench's futures are ready at once"),
    }
}

/// One call through `svc`, its body read to the end; the body's length.
fn call<S, B>(svc: &S, req: http::Request<Bytes>) -> usize
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    now(async {
        let resp = svc.clone().oneshot(req).await.unwrap();
        resp.into_body().collect().await.unwrap().to_bytes().len()
    })
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("repair");
    let bare = Upstream;
    let json = RepairLayer::new(validate_json()).layer(Upstream);
    let fields = RepairLayer::new(require_fields(&["city", "country"])).layer(Upstream);
    assert_eq!(call(&bare, request(QUESTION)), ANSWER.len());
    assert_eq!(call(&json, request(QUESTION)), ANSWER.len());
    assert_eq!(call(&fields, request(QUESTION)), ANSWER.len());

    group.bench_function("bare", |b| {
        b.iter_batched(
            || request(QUESTION),
            |r| call(&bare, r),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("valid_json", |b| {
        b.iter_batched(
            || request(QUESTION),
            |r| call(&json, r),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("valid_require_fields", |b| {
        b.iter_batched(
            || request(QUESTION),
            |r| call(&fields, r),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("streamed_passed_through", |b| {
        b.iter_batched(
            || request(STREAMED),
            |r| call(&json, r),
            BatchSize::SmallInput,
        )
    });
    // For scale: a parse of the answer into a JSON value (what the layer's typed read of the
    // few fields it needs avoids; a validator that calls `Answer::json` pays it), and one
    // clone of the request (kept to build a repair turn from).
    group.bench_function("part_parse_answer_as_value", |b| {
        b.iter(|| {
            serde_json::from_slice::<serde_json::Value>(std::hint::black_box(ANSWER.as_bytes()))
                .unwrap()
        })
    });
    let prepared = request(QUESTION);
    group.bench_function("part_clone_request", |b| {
        b.iter(|| std::hint::black_box(&prepared).clone())
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
