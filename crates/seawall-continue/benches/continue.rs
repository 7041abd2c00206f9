//! What `ContinueLayer` costs when nothing is cut: per call on a non-streamed answer, and per
//! chunk on a stream (the layer reads every event to keep the text delivered).
//!
//! `cargo bench -p seawall-continue --bench continue`
//!
//! Each figure has its baseline without the layer in the same group; the layer's cost is the
//! difference (per chunk: the difference over the stream's 100 content chunks).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use criterion::{Criterion, criterion_group};
use http_body::{Body, Frame};
use seawall_classify::ClassifyLayer;
use seawall_continue::ContinueLayer;
use tower::{Layer, Service};

const CHUNKS: usize = 100;

/// A body of prepared frames.
struct Frames(VecDeque<Bytes>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// An upstream that answers at once with prepared frames; as cheap to clone as a real
/// transport (the layer clones the service it wraps once per call).
#[derive(Clone)]
struct Inner {
    frames: std::sync::Arc<[Bytes]>,
    content_type: &'static str,
}

impl Service<http::Request<Bytes>> for Inner {
    type Response = http::Response<Frames>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: http::Request<Bytes>) -> Self::Future {
        let mut resp = http::Response::new(Frames(self.frames.iter().cloned().collect()));
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(self.content_type),
        );
        std::future::ready(Ok(resp))
    }
}

fn json_answer() -> Inner {
    Inner {
        frames: vec![Bytes::from_static(
            br#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Waves carry salt. Waves carry salt. Waves carry salt."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":12,"total_tokens":32}}"#,
        )]
        .into(),
        content_type: "application/json",
    }
}

fn stream_answer() -> Inner {
    let prefix = r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","system_fingerprint":null,"choices":[{"index":0,"delta":"#;
    let mut frames = vec![Bytes::from(format!(
        "{prefix}{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
    ))];
    for i in 0..CHUNKS {
        frames.push(Bytes::from(format!(
            "{prefix}{{\"content\":\" word{i}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        )));
    }
    frames.push(Bytes::from(format!(
        "{prefix}{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}]}}\n\ndata: [DONE]\n\n"
    )));
    Inner {
        frames: frames.into(),
        content_type: "text/event-stream",
    }
}

fn request(stream: bool) -> http::Request<Bytes> {
    let body = format!(
        r#"{{"model":"gpt-4o-mini","max_tokens":64,"stream":{stream},"messages":[{{"role":"system","content":"Be brief."}},{{"role":"user","content":"Tell me about the sea"}}]}}"#
    );
    http::Request::post("http://localhost/v1/chat/completions")
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-bench")
        .body(Bytes::from(body))
        .unwrap()
}

/// Calls `svc` and reads the whole body, polling by hand: every future here is ready at once.
fn run<S, B>(svc: &mut S, req: http::Request<Bytes>) -> usize
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(std::task::Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_ready());
    let mut fut = std::pin::pin!(svc.call(req));
    let Poll::Ready(resp) = fut.as_mut().poll(&mut cx) else {
        panic!("the bench's futures are ready at once");
    };
    let mut body = std::pin::pin!(resp.unwrap().into_body());
    let mut n = 0;
    while let Poll::Ready(Some(frame)) = body.as_mut().poll_frame(&mut cx) {
        n += frame.unwrap().into_data().map_or(0, |d| d.len());
    }
    n
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("continue");
    let prepared = request(false);
    let req = || {
        let mut r = http::Request::new(prepared.body().clone());
        *r.method_mut() = prepared.method().clone();
        *r.uri_mut() = prepared.uri().clone();
        *r.headers_mut() = prepared.headers().clone();
        r
    };
    group.bench_function("json_classify_only", |b| {
        let mut svc = ClassifyLayer::new().layer(json_answer());
        b.iter(|| run(&mut svc, req()))
    });
    group.bench_function("json_continue_over_classify", |b| {
        let mut svc = ContinueLayer::new().layer(ClassifyLayer::new().layer(json_answer()));
        b.iter(|| run(&mut svc, req()))
    });
    group.bench_function("json_bare", |b| {
        let mut svc = json_answer();
        b.iter(|| run(&mut svc, req()))
    });
    group.bench_function("json_continue_without_classifier", |b| {
        let mut svc = ContinueLayer::new().layer(json_answer());
        b.iter(|| run(&mut svc, req()))
    });

    let prepared = request(true);
    let req = || {
        let mut r = http::Request::new(prepared.body().clone());
        *r.method_mut() = prepared.method().clone();
        *r.uri_mut() = prepared.uri().clone();
        *r.headers_mut() = prepared.headers().clone();
        r
    };
    group.bench_function("stream_100_chunks_classify_only", |b| {
        let mut svc = ClassifyLayer::new().layer(stream_answer());
        b.iter(|| run(&mut svc, req()))
    });
    group.bench_function("stream_100_chunks_continue_over_classify", |b| {
        let mut svc = ContinueLayer::new().layer(ClassifyLayer::new().layer(stream_answer()));
        b.iter(|| run(&mut svc, req()))
    });
    group.finish();
}

criterion_group!(benches, bench);

fn main() {
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
