//! The cache's test harness: the chaos upstream behind a counting, optionally slow or failing
//! front, the classifier next to it, and helpers to read bodies and SSE streams.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use seawall_cache::{CacheBody, CacheLayer};
use seawall_classify::{ClassifiedBody, ClassifyLayer};
use seawall_core::{FailureClass, LlmError, SseDecoder, SseItem};
use seawall_mock::{MockBody, MockUpstream, Profile};
use serde_json::{Value, json};
use tower::{Layer, Service, ServiceExt};

/// The chaos upstream, counting its calls; it can wait before answering and fail a number of
/// calls first.
#[derive(Clone)]
pub struct Up {
    pub mock: MockUpstream,
    pub calls: Arc<AtomicUsize>,
    pub delay: Duration,
    pub failures: Arc<AtomicUsize>,
}

impl Up {
    pub fn new(profile: Profile) -> Up {
        Up {
            mock: MockUpstream::new(profile.seed(7)),
            calls: Arc::default(),
            delay: Duration::ZERO,
            failures: Arc::default(),
        }
    }

    pub fn plain() -> Up {
        Up::new(Profile::default())
    }

    pub fn slow(mut self, delay: Duration) -> Up {
        self.delay = delay;
        self
    }

    pub fn failing(self, n: usize) -> Up {
        self.failures.store(n, Ordering::SeqCst);
        self
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
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
        self.calls.fetch_add(1, Ordering::SeqCst);
        let (mock, delay, failures) = (self.mock.clone(), self.delay, self.failures.clone());
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let fail = failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if fail {
                return Err(LlmError::new(
                    FailureClass::Overloaded,
                    "upstream overloaded",
                ));
            }
            match mock.respond(req).await {
                Ok(r) => Ok(r),
                Err(never) => match never {},
            }
        })
    }
}

/// The stack under test: cache → classify → upstream.
pub type Stack = seawall_cache::Cache<seawall_classify::Classify<Up>>;

pub fn stack(cache: CacheLayer, up: &Up) -> Stack {
    cache.layer(ClassifyLayer::new().layer(up.clone()))
}

pub type Resp = Response<CacheBody<ClassifiedBody<MockBody>>>;

pub async fn send(svc: &Stack, req: Request<Bytes>) -> Result<Resp, LlmError> {
    svc.clone().oneshot(req).await
}

/// Sends and reads the whole body: (cache header, content type, body).
pub async fn fetch(svc: &Stack, req: Request<Bytes>) -> (String, String, String) {
    let resp = send(svc, req).await.expect("a response");
    read(resp).await
}

pub async fn read(resp: Resp) -> (String, String, String) {
    let header = |n: &str| {
        resp.headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (cache, ctype) = (
        header(seawall_cache::CACHE_HEADER.as_str()),
        header("content-type"),
    );
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("a whole body")
        .to_bytes();
    (cache, ctype, String::from_utf8(body.to_vec()).unwrap())
}

pub fn openai_body(stream: bool) -> Value {
    json!({"model": "gpt-4o-mini", "stream": stream, "temperature": 0,
           "messages": [{"role": "user", "content": "Tell me about the sea"}]})
}

pub fn anthropic_body(stream: bool) -> Value {
    json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": stream,
           "messages": [{"role": "user", "content": "Tell me about the sea"}]})
}

pub fn openai(body: &Value) -> Request<Bytes> {
    raw_openai(body.to_string())
}

pub fn raw_openai(body: impl Into<Bytes>) -> Request<Bytes> {
    Request::post("http://mock/v1/chat/completions")
        .header("authorization", "Bearer sk-test")
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap()
}

pub fn anthropic(body: &Value) -> Request<Bytes> {
    Request::post("http://mock/v1/messages")
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

/// The events of an SSE body, parsed with core's decoder: (name, data).
pub fn events(body: &str) -> Vec<(String, String)> {
    let mut decoder = SseDecoder::default();
    let mut out = Vec::new();
    let mut push = |item: SseItem<'_>| {
        if let SseItem::Event(e) = item {
            out.push((
                String::from_utf8(e.name.to_vec()).unwrap(),
                String::from_utf8(e.data.to_vec()).unwrap(),
            ));
        }
        ControlFlow::<()>::Continue(())
    };
    let _ = decoder.feed(body.as_bytes(), &mut push);
    assert!(
        decoder.pending_line().is_empty() && decoder.pending_data().is_none(),
        "the stream ends with a complete event"
    );
    out
}

/// The text of an answer in any of the four shapes.
pub fn answer_text(body: &str) -> String {
    if body.starts_with('{') {
        let v: Value = serde_json::from_str(body).unwrap();
        if let Some(t) = v["choices"][0]["message"]["content"].as_str() {
            return t.to_owned();
        }
        return v["content"][0]["text"].as_str().unwrap_or("").to_owned();
    }
    let mut text = String::new();
    for (_, data) in events(body) {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&data).unwrap();
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if let Some(t) = v["delta"]["text"].as_str() {
            text.push_str(t);
        }
    }
    text
}

/// Lets spawned tasks and paused timers run until nothing moves.
pub async fn settle() {
    seawall_test_support::settle().await;
}

/// An upstream answering `body` (JSON, or a stream with [`Fixed::stream`]) after `delay`,
/// counting its calls; the body can be changed between calls.
#[derive(Clone)]
pub struct Fixed {
    pub body: Arc<std::sync::Mutex<&'static str>>,
    pub delay: Duration,
    pub calls: Arc<AtomicUsize>,
    content_type: &'static str,
}

impl Fixed {
    pub fn new(body: &'static str) -> Self {
        Fixed {
            body: Arc::new(std::sync::Mutex::new(body)),
            delay: Duration::ZERO,
            calls: Arc::default(),
            content_type: "application/json",
        }
    }

    /// The same, answering `body` as a server-sent-events stream.
    pub fn stream(body: &'static str) -> Self {
        Fixed {
            content_type: "text/event-stream",
            ..Fixed::new(body)
        }
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Service<Request<Bytes>> for Fixed {
    type Response = Response<http_body_util::Full<Bytes>>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Self::Response, std::convert::Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Bytes>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let (body, delay, content_type) =
            (*self.body.lock().unwrap(), self.delay, self.content_type);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            let mut resp = Response::new(http_body_util::Full::new(Bytes::from_static(
                body.as_bytes(),
            )));
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(content_type),
            );
            Ok(resp)
        })
    }
}

/// An observe layer that keeps every call record, and the records it keeps.
pub fn recorded() -> (
    seawall_observe::ObserveLayer,
    Arc<std::sync::Mutex<Vec<seawall_observe::CallRecord>>>,
) {
    use seawall_observe::{CallRecord, ObserveLayer};
    let records: Arc<std::sync::Mutex<Vec<CallRecord>>> = Arc::default();
    let sink = records.clone();
    let observe = ObserveLayer::builder()
        .recorder(move |r: &CallRecord| sink.lock().unwrap().push(r.clone()))
        .build()
        .unwrap();
    (observe, records)
}
