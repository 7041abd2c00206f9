//! The guard's per-call cost: the check on a small request that fits (the common case, with
//! the body already parsed by an outer layer, and parsing it itself), a model it does not
//! know, a refusal, and the rewrites (trimming ten turns, lowering `max_tokens`), each
//! against the inner service alone. With `--features tiktoken`, the exact count of the same
//! small request too.
//!
//! `cargo bench -p seawall-guard --bench guard [--features tiktoken]`

use std::future::Future;
use std::task::{Context, Poll};

use bytes::Bytes;
use criterion::{BatchSize, Criterion, criterion_group};
use seawall_core::{LlmError, LlmRequest};
use seawall_guard::{ContextGuardLayer, ContextPolicy, ContextWindows, ModelLimits};
use tower::{Layer, Service};

fn small_body(model: &str) -> Bytes {
    Bytes::from(format!(
        r#"{{"model":"{model}","max_tokens":64,"messages":[{{"role":"system","content":"Be brief."}},{{"role":"user","content":"What is the capital of France?"}}]}}"#
    ))
}

/// Ten old turns of about 60 tokens each, and a last question.
fn long_conversation() -> Bytes {
    let mut messages = vec![r#"{"role":"system","content":"Be brief."}"#.to_owned()];
    for i in 0..10 {
        messages.push(format!(
            r#"{{"role":"user","content":"question {i}: {}"}},{{"role":"assistant","content":"answer {i}"}}"#,
            "the sea is salty ".repeat(12)
        ));
    }
    messages.push(r#"{"role":"user","content":"and now?"}"#.to_owned());
    Bytes::from(format!(
        r#"{{"model":"gpt-4o","max_tokens":64,"messages":[{}]}}"#,
        messages.join(",")
    ))
}

fn request(body: Bytes, prepared: bool) -> http::Request<Bytes> {
    let mut r = http::Request::post("https://api.openai.com/v1/chat/completions")
        .header("content-type", "application/json")
        .body(body)
        .unwrap();
    if prepared {
        r.prepare();
    }
    r
}

/// Calls `svc` once, polling by hand: every future here is ready at once.
fn run<S>(svc: &mut S, req: http::Request<Bytes>) -> bool
where
    S: Service<http::Request<Bytes>, Error = LlmError>,
{
    let mut cx = Context::from_waker(std::task::Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_ready());
    let fut = std::pin::pin!(svc.call(req));
    match fut.poll(&mut cx) {
        Poll::Ready(r) => r.is_ok(),
        Poll::Pending => unreachable!("the inner service is always ready"),
    }
}

fn inner() -> impl Service<http::Request<Bytes>, Response = (), Error = LlmError> + Clone {
    tower::service_fn(|_req: http::Request<Bytes>| std::future::ready(Ok::<_, LlmError>(())))
}

fn guard(windows: &ContextWindows, policy: ContextPolicy) -> ContextGuardLayer {
    ContextGuardLayer::builder(windows.clone())
        .policy(policy)
        .build()
        .unwrap()
}

fn bench(c: &mut Criterion) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/context_windows.example.toml");
    let windows = ContextWindows::from_file(path).unwrap();
    // A small window for the rewrites: the long conversation (about 700 tokens) does not fit.
    let tight = windows.clone().with("gpt-4o", ModelLimits::new(400));
    let small = small_body("gpt-4o-2024-08-06");
    let mut group = c.benchmark_group("guard");

    let batched = |group: &mut criterion::BenchmarkGroup<'_, _>,
                   name: &str,
                   mut svc: Box<dyn FnMut(http::Request<Bytes>) -> bool>,
                   body: Bytes,
                   prepared: bool,
                   want_ok: bool| {
        group.bench_function(name, |b| {
            b.iter_batched(
                || request(body.clone(), prepared),
                |req| assert_eq!(svc(req), want_ok),
                BatchSize::SmallInput,
            )
        });
    };

    let mut bare = inner();
    batched(
        &mut group,
        "bare_inner",
        Box::new(move |r| run(&mut bare, r)),
        small.clone(),
        true,
        true,
    );
    let mut fits = guard(&windows, ContextPolicy::Refuse).layer(inner());
    batched(
        &mut group,
        "fits_prepared",
        Box::new(move |r| run(&mut fits, r)),
        small.clone(),
        true,
        true,
    );
    let mut fits = guard(&windows, ContextPolicy::Refuse).layer(inner());
    batched(
        &mut group,
        "fits_unprepared",
        Box::new(move |r| run(&mut fits, r)),
        small.clone(),
        false,
        true,
    );
    let mut bare = inner();
    batched(
        &mut group,
        "parse_only_baseline",
        Box::new(move |mut r| {
            r.prepare();
            run(&mut bare, r)
        }),
        small.clone(),
        false,
        true,
    );
    let mut skip = guard(&windows, ContextPolicy::Refuse).layer(inner());
    batched(
        &mut group,
        "skipped_unknown_model",
        Box::new(move |r| run(&mut skip, r)),
        small_body("mystery"),
        true,
        true,
    );
    let mut refuse = guard(&tight, ContextPolicy::Refuse).layer(inner());
    batched(
        &mut group,
        "refuse_10_turns",
        Box::new(move |r| run(&mut refuse, r)),
        long_conversation(),
        true,
        false,
    );
    let mut trim = guard(&tight, ContextPolicy::TrimOldest).layer(inner());
    batched(
        &mut group,
        "trim_10_turns",
        Box::new(move |r| run(&mut trim, r)),
        long_conversation(),
        true,
        true,
    );
    let lower_windows = windows.clone().with("gpt-4o", ModelLimits::new(800));
    let mut lower = guard(&lower_windows, ContextPolicy::lower_max_tokens(16)).layer(inner());
    batched(
        &mut group,
        "lower_max_tokens_10_turns",
        Box::new(move |r| run(&mut lower, r)),
        long_conversation(),
        true,
        true,
    );

    #[cfg(feature = "tiktoken")]
    {
        use seawall_guard::{CharEstimate, TiktokenEstimate, TokenEstimator};
        let req = request(small.clone(), true);
        let exact = TiktokenEstimate::new();
        exact.prompt_tokens(&req); // loads the encoding
        group.bench_function("estimate_chars_small", |b| {
            b.iter(|| CharEstimate::new().prompt_tokens(std::hint::black_box(&req)))
        });
        group.bench_function("estimate_tiktoken_small", |b| {
            b.iter(|| exact.prompt_tokens(std::hint::black_box(&req)))
        });
        let long = request(long_conversation(), true);
        group.bench_function("estimate_tiktoken_10_turns", |b| {
            b.iter(|| exact.prompt_tokens(std::hint::black_box(&long)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
