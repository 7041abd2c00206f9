//! What a streamed answer costs per chunk once it streams (after the commit point), and what a
//! small non-streamed answer costs to classify: the layers that read every chunk (classify,
//! the stream timeouts, continue), and the recommended stack whose hooks pass every chunk on,
//! over a realistic OpenAI Chat Completions and Anthropic Messages SSE stream, one event per
//! frame as a transport hands them on.
//!
//! ```text
//! cargo bench -p seawall-benches --bench chunks
//! ```
//!
//! Each row is one whole call (request, response head, every frame read, end). Per chunk:
//! the row's time minus `bare`'s, divided by the frames of the stream (printed at the start
//! with their bytes; `openai_stream_by_four` carries four events a frame: per event, divide
//! by its 44 events). For instruction counts, `CHUNKS_CALLS=<n> CHUNKS_ROW=<row>` runs one row
//! `n` times without criterion, to run under `valgrind --tool=callgrind` (the difference of
//! two runs with different `n`, divided by the difference, is the cost of one call).

use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use criterion::Criterion;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response};
use http_body::{Body, Frame};
use seawall::core::LlmError;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

#[path = "support/layers.rs"]
mod layers;

/// Reads a body to its end; returns the bytes read.
async fn drain<B: Body>(body: B) -> usize
where
    B::Error: std::fmt::Debug,
{
    let mut body = std::pin::pin!(body);
    let mut read = 0;
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        if let Some(data) = frame.expect("the body never fails").data_ref() {
            read += bytes::Buf::remaining(data);
        }
    }
    read
}

const OPENAI_REQUEST: &[u8] = br#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"max_tokens":256,"messages":[{"role":"user","content":"Say hello to the whole wide world."}]}"#;
const ANTHROPIC_REQUEST: &[u8] = br#"{"model":"claude-sonnet-4-5","stream":true,"max_tokens":256,"messages":[{"role":"user","content":"Say hello to the whole wide world."}]}"#;

/// Words of the answer, one per content chunk.
const WORDS: [&str; 40] = [
    "Hello", ",", " whole", " wide", " world", "!", " It", " is", " a", " fine", " day", " to",
    " say", " hello", ",", " and", " so", " I", " say", " it", " again", ":", " hello", ",",
    " world", ".", " Have", " a", " good", " one", ",", " and", " thank", " you", " for",
    " asking", " me", " to", " greet", ".",
];

/// One OpenAI Chat Completions stream: a role chunk, a chunk per word, the finish chunk, the
/// usage chunk, `[DONE]`; one event per frame.
fn openai_stream() -> Vec<Bytes> {
    let head = r#"{"id":"chatcmpl-AbCdEf0123456789","object":"chat.completion.chunk","created":1732000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_0123456789","#;
    let mut frames = vec![format!(
        "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
    )];
    for w in WORDS {
        frames.push(format!(
            "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{w}\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
        ));
    }
    frames.push(format!(
        "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}],\"usage\":null}}\n\n"
    ));
    frames.push(format!(
        "data: {head}\"choices\":[],\"usage\":{{\"prompt_tokens\":17,\"completion_tokens\":40,\"total_tokens\":57,\"prompt_tokens_details\":{{\"cached_tokens\":0,\"audio_tokens\":0}},\"completion_tokens_details\":{{\"reasoning_tokens\":0,\"audio_tokens\":0,\"accepted_prediction_tokens\":0,\"rejected_prediction_tokens\":0}}}}}}\n\n"
    ));
    frames.push("data: [DONE]\n\n".to_owned());
    frames.into_iter().map(Bytes::from).collect()
}

/// One Anthropic Messages stream: `message_start`, a text block with a delta per word (and a
/// `ping`), `message_delta` with the stop reason and usage, `message_stop`.
fn anthropic_stream() -> Vec<Bytes> {
    let mut frames = vec![
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01AbCdEf0123456789\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5-20250929\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":17,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n".to_owned(),
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n".to_owned(),
        "event: ping\ndata: {\"type\": \"ping\"}\n\n".to_owned(),
    ];
    for w in WORDS {
        frames.push(format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{w}\"}}}}\n\n"
        ));
    }
    frames.push(
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
            .to_owned(),
    );
    frames.push("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":40}}\n\n".to_owned());
    frames.push("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_owned());
    frames.into_iter().map(Bytes::from).collect()
}

/// A body that hands on the frames of a stream, one per poll.
struct Frames {
    frames: &'static [Bytes],
    next: usize,
}

impl Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = self.frames.get(self.next).cloned();
        self.next += 1;
        Poll::Ready(frame.map(|f| Ok(Frame::data(f))))
    }

    fn is_end_stream(&self) -> bool {
        self.next >= self.frames.len()
    }
}

/// The upstream: answers at once with a stream (`text/event-stream`), or with a small JSON
/// answer.
#[derive(Clone, Copy)]
struct Upstream {
    frames: &'static [Bytes],
    content_type: &'static str,
}

impl Service<Request<Bytes>> for Upstream {
    type Response = Response<Frames>;
    type Error = LlmError;
    type Future = std::future::Ready<Result<Response<Frames>, LlmError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Bytes>) -> Self::Future {
        let mut resp = Response::new(Frames {
            frames: self.frames,
            next: 0,
        });
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(self.content_type));
        std::future::ready(Ok(resp))
    }
}

fn request(url: &'static str, body: &'static [u8]) -> Request<Bytes> {
    let mut req = Request::new(Bytes::from_static(body));
    *req.method_mut() = http::Method::POST;
    *req.uri_mut() = http::Uri::from_static(url);
    req.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if url.contains("anthropic") {
        req.headers_mut()
            .insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
    }
    req
}

/// One dialect's stream and request.
#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    upstream: Upstream,
    url: &'static str,
    body: &'static [u8],
}

fn cases() -> [Case; 4] {
    let leak = |v: Vec<Bytes>| -> &'static [Bytes] { Vec::leak(v) };
    [
        Case {
            name: "openai_stream",
            upstream: Upstream {
                frames: leak(openai_stream()),
                content_type: "text/event-stream; charset=utf-8",
            },
            url: "https://api.openai.com/v1/chat/completions",
            body: OPENAI_REQUEST,
        },
        // The same stream read four events at a time, as a transport hands it over when the
        // events come faster than the caller reads them (per event: divide by 44, not 11).
        Case {
            name: "openai_stream_by_four",
            upstream: Upstream {
                frames: leak(
                    openai_stream()
                        .chunks(4)
                        .map(|four| Bytes::from(four.concat()))
                        .collect(),
                ),
                content_type: "text/event-stream; charset=utf-8",
            },
            url: "https://api.openai.com/v1/chat/completions",
            body: OPENAI_REQUEST,
        },
        Case {
            name: "anthropic_stream",
            upstream: Upstream {
                frames: leak(anthropic_stream()),
                content_type: "text/event-stream; charset=utf-8",
            },
            url: "https://api.anthropic.com/v1/messages",
            body: ANTHROPIC_REQUEST,
        },
        Case {
            name: "openai_json",
            upstream: Upstream {
                frames: leak(vec![Bytes::from_static(
                    br#"{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"Hello, world!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":27,"completion_tokens":4,"total_tokens":31}}"#,
                )]),
                content_type: "application/json",
            },
            url: "https://api.openai.com/v1/chat/completions",
            body: br#"{"model":"gpt-4o","max_tokens":256,"messages":[{"role":"user","content":"Say hello to the whole wide world."}]}"#,
        },
    ]
}

/// One whole call: ready, call, every frame read.
async fn call<S, B>(svc: &mut S, case: Case) -> usize
where
    S: Service<Request<Bytes>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
    B::Error: std::fmt::Debug,
{
    let svc = svc.ready().await.expect("always ready");
    let resp = svc
        .call(request(case.url, case.body))
        .await
        .expect("the call succeeds");
    drain(resp.into_body()).await
}

/// What is done with each row.
trait Row {
    fn row<S, B>(&mut self, name: &str, case: Case, svc: S)
    where
        S: Service<Request<Bytes>, Response = Response<B>> + Clone,
        S::Error: std::fmt::Debug,
        B: Body,
        B::Error: std::fmt::Debug;
}

/// The rows of one case: each a stack over the upstream, inner layers first.
fn rows(case: Case, r: &mut impl Row) {
    let up = case.upstream;
    r.row("bare", case, up);
    r.row(
        "classify",
        case,
        seawall::classify::ClassifyLayer::default().layer(up),
    );
    r.row(
        "stream_classify",
        case,
        seawall::stream::StreamTimeoutLayer::new()
            .layer(seawall::classify::ClassifyLayer::default().layer(up)),
    );
    r.row(
        "continue_stream_classify",
        case,
        seawall::continuation::ContinueLayer::new().layer(
            seawall::stream::StreamTimeoutLayer::new()
                .layer(seawall::classify::ClassifyLayer::default().layer(up)),
        ),
    );
    // The recommended stack but its context guard (which reads only the request): the hooks
    // of the budget, breaker, gate and observer ride on every chunk too.
    r.row(
        "recommended",
        case,
        ServiceBuilder::new()
            .layer(layers::observe())
            .layer(seawall::continuation::ContinueLayer::new())
            .layer(layers::fallback_layer())
            .layer(seawall::retry::BackoffRetryLayer::new())
            .layer(layers::budget())
            .layer(seawall::breaker::CircuitBreakerLayer::new())
            .layer(layers::gate())
            .layer(seawall::stream::StreamTimeoutLayer::new())
            .layer(seawall::classify::ClassifyLayer::default())
            .service(up),
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

/// Runs one row `n` times (for callgrind).
struct Loop<'a> {
    rt: &'a tokio::runtime::Runtime,
    row: String,
    n: u64,
}

impl Row for Loop<'_> {
    fn row<S, B>(&mut self, name: &str, case: Case, mut svc: S)
    where
        S: Service<Request<Bytes>, Response = Response<B>> + Clone,
        S::Error: std::fmt::Debug,
        B: Body,
        B::Error: std::fmt::Debug,
    {
        if format!("{}/{name}", case.name) != self.row {
            return;
        }
        self.rt.block_on(async {
            for _ in 0..self.n {
                black_box(call(&mut svc, case).await);
            }
        });
    }
}

/// Measures each row with criterion.
struct Bench<'a, 'c> {
    rt: &'a tokio::runtime::Runtime,
    group: criterion::BenchmarkGroup<'c, criterion::measurement::WallTime>,
}

impl Row for Bench<'_, '_> {
    fn row<S, B>(&mut self, name: &str, case: Case, svc: S)
    where
        S: Service<Request<Bytes>, Response = Response<B>> + Clone,
        S::Error: std::fmt::Debug,
        B: Body,
        B::Error: std::fmt::Debug,
    {
        self.group.bench_function(name, |b| {
            b.to_async(self.rt).iter_batched(
                || svc.clone(),
                |mut svc| async move { black_box(call(&mut svc, case).await) },
                criterion::BatchSize::SmallInput,
            );
        });
    }
}

fn main() {
    if let (Ok(n), Ok(row)) = (std::env::var("CHUNKS_CALLS"), std::env::var("CHUNKS_ROW")) {
        let rt = runtime();
        let mut l = Loop {
            rt: &rt,
            row,
            n: n.parse().expect("CHUNKS_CALLS is a number"),
        };
        for case in cases() {
            rows(case, &mut l);
        }
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500))
        .sample_size(30)
        .without_plots()
        .configure_from_args();
    let rt = runtime();
    for case in cases() {
        let bytes: usize = case.upstream.frames.iter().map(Bytes::len).sum();
        println!(
            "{}: {} frames, {bytes} bytes",
            case.name,
            case.upstream.frames.len()
        );
        let mut b = Bench {
            rt: &rt,
            group: c.benchmark_group(case.name),
        };
        rows(case, &mut b);
        b.group.finish();
    }
    c.final_summary();
}
