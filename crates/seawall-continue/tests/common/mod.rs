//! The continuation layer's harness: the chaos upstream behind a front that sends the first
//! call to one mock and the follow-ups to another (so a first attempt can be cut while its
//! continuations are not), the real classifier next to it, and the observer outside.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use seawall_classify::ClassifyLayer;
use seawall_continue::ContinueLayer;
use seawall_core::LlmError;
use seawall_mock::{Count, MockBody, MockUpstream, Profile};
use seawall_observe::{CallRecord, ObserveLayer};
use serde_json::{Value, json};
use tower::{Layer, Service, ServiceExt};

pub const SEED: u64 = 21;

/// The answer every test's mocks would give uncut: 16 words.
pub fn profile() -> Profile {
    Profile::default()
        .seed(SEED)
        .output_tokens(Count::fixed(16))
}

/// The first call goes to `first`, every later one to `rest`; the bodies of the requests are
/// kept.
#[derive(Clone)]
pub struct Up {
    pub first: MockUpstream,
    pub rest: MockUpstream,
    pub seen: Arc<Mutex<Vec<Value>>>,
    /// How many calls go to `first` (1 unless changed).
    pub first_calls: usize,
}

/// An upstream whose wall-clock times (`created`, `date`) start at a fixed instant: two
/// upstreams made a moment apart answer byte for byte alike, whatever second the clock is in.
pub fn mock(profile: Profile) -> MockUpstream {
    MockUpstream::with_epoch(profile, UNIX_EPOCH + Duration::from_secs(1_796_234_761))
}

impl Up {
    pub fn new(first: Profile, rest: Profile) -> Up {
        Up {
            first: mock(first),
            rest: mock(rest),
            seen: Arc::default(),
            first_calls: 1,
        }
    }

    /// The first `n` calls go to the first upstream.
    pub fn first_calls(mut self, n: usize) -> Up {
        self.first_calls = n;
        self
    }

    /// One upstream for every call.
    pub fn single(profile: Profile) -> Up {
        let mock = mock(profile);
        Up {
            first: mock.clone(),
            rest: mock,
            seen: Arc::default(),
            first_calls: 1,
        }
    }

    pub fn calls(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub fn request(&self, i: usize) -> Value {
        self.seen.lock().unwrap()[i].clone()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Service<Request<Bytes>> for Up {
    type Response = Response<MockBody>;
    type Error = LlmError;
    type Future = BoxFuture<Result<Response<MockBody>, LlmError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        let mut seen = self.seen.lock().unwrap();
        let mock = if seen.len() < self.first_calls {
            self.first.clone()
        } else {
            self.rest.clone()
        };
        seen.push(serde_json::from_slice(req.body()).unwrap_or(Value::Null));
        Box::pin(async move {
            match mock.oneshot(req).await {
                Ok(r) => Ok(r),
                Err(never) => match never {},
            }
        })
    }
}

/// The records an observer made.
pub type Records = Arc<Mutex<Vec<CallRecord>>>;

/// observe → continue → classify → `upstream` (an [`Up`], or any service).
pub fn stack<S, B>(
    upstream: S,
    layer: ContinueLayer,
) -> (
    impl Service<
        Request<Bytes>,
        Response = Response<impl http_body::Body<Data = Bytes, Error = LlmError> + Unpin>,
        Error = LlmError,
    > + Clone,
    Records,
)
where
    S: Service<Request<Bytes>, Response = Response<B>, Error = LlmError> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<seawall_core::BoxError>,
{
    let records: Records = Arc::default();
    let sink = records.clone();
    let observe = ObserveLayer::builder()
        .recorder(move |r: &CallRecord| sink.lock().unwrap().push(r.clone()))
        .build()
        .unwrap();
    let svc = observe.layer(layer.layer(ClassifyLayer::new().layer(upstream)));
    (svc, records)
}

pub fn openai(stream: bool, max_tokens: u32) -> Request<Bytes> {
    let mut body = json!({"model": "gpt-4o-mini", "max_tokens": max_tokens, "stream": stream,
                         "messages": [{"role": "user", "content": "Tell me about the sea"}]});
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    Request::post("http://mock/v1/chat/completions")
        .header("authorization", "Bearer sk-test")
        .header("content-type", "application/json")
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

pub fn anthropic(stream: bool, max_tokens: u32) -> Request<Bytes> {
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": max_tokens, "stream": stream,
                      "messages": [{"role": "user", "content": "Tell me about the sea"}]});
    Request::post("http://mock/v1/messages")
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

pub fn ask(anthropic_wire: bool, stream: bool, max_tokens: u32) -> Request<Bytes> {
    if anthropic_wire {
        anthropic(stream, max_tokens)
    } else {
        openai(stream, max_tokens)
    }
}

/// The text the mock answers `req` with, uncut, from a fresh upstream of `profile` (the first
/// call of an upstream on a seed draws the same answer as the first call of another).
pub async fn uncut(profile: Profile, anthropic_wire: bool) -> String {
    let resp = mock(profile)
        .oneshot(ask(anthropic_wire, false, 1000))
        .await
        .unwrap();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    answer_text(&v)
}

pub fn answer_text(v: &Value) -> String {
    v.pointer("/choices/0/message/content")
        .or_else(|| v.pointer("/content/0/text"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// Every SSE event of a stream: (event name, data).
pub fn events(sse: &str) -> Vec<(String, String)> {
    sse.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = String::new();
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_owned();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = d.to_owned();
                }
            }
            (name, data)
        })
        .collect()
}

/// The text of a stream's content deltas, in both formats.
pub fn streamed_text(sse: &str) -> String {
    events(sse)
        .iter()
        .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v.pointer("/choices/0/delta/content")
                .or_else(|| v.pointer("/delta/text"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect()
}

/// The events named or holding `needle`.
pub fn count(sse: &str, needle: &str) -> usize {
    events(sse)
        .iter()
        .filter(|(n, d)| n == needle || d.contains(needle))
        .count()
}
