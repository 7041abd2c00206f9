//! Overhead of the observe layer with a no-op recorder, beside the bare service.
//!
//! `cargo bench -p seawall-observe --bench observe`
use std::convert::Infallible;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::Full;
use seawall_observe::{NoopRecorder, ObserveLayer};
use tower::{Layer, Service, ServiceExt, service_fn};

fn request() -> http::Request<Bytes> {
    http::Request::post("http://localhost/v1/chat/completions")
        .body(Bytes::from_static(br#"{"model":"gpt-4o-mini","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#))
        .unwrap()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let inner = service_fn(|_req: http::Request<Bytes>| async {
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new())))
    });
    let mut group = c.benchmark_group("observe");
    group.bench_function("bare", |b| {
        let mut svc = inner;
        b.iter(|| {
            rt.block_on(async {
                let resp = svc.ready().await.unwrap().call(request()).await.unwrap();
                drop(resp);
            })
        })
    });
    group.bench_function("observe_noop_recorder", |b| {
        let mut svc = ObserveLayer::builder()
            .recorder(NoopRecorder)
            .build()
            .expect("the observe settings are valid")
            .layer(inner);
        b.iter(|| {
            rt.block_on(async {
                let resp = svc.ready().await.unwrap().call(request()).await.unwrap();
                drop(resp);
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
