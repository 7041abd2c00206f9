//! How each layer learns the end of a streamed body, over a real hyper connection.
//!
//! hyper stops polling a response body as soon as it reports `is_end_stream()` after a data
//! frame, and drops it: it never sees the `None` that would otherwise end it. Each test here
//! serves a layer's responses with a hyper server on a loopback port and reads them with a
//! hyper client; the upstream body reports its end right after its last frame, as hyper's own
//! bodies and `Full` do. The layer must then treat the call as complete, not as cancelled.
//!
//! Two tests check the order in which nested hooks fire when a call is cancelled: the budget
//! layer settles (and writes the cost into the call context) before the observe layer makes
//! its record. Two more put the classifier under the hooks: a JSON answer of known length,
//! which hyper stops reading at its last byte, still completes, and a stream without its
//! finish marker still fails.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use seawall::breaker::{CircuitBreakerLayer, State};
use seawall::budget::{Budget, CostBudgetLayer, Price, PriceTable, Settlement, Usd};
use seawall::classify::ClassifyLayer;
use seawall::core::BoxError;
use seawall::gate::{Adaptive, ConcurrencyGateLayer};
use seawall::observe::{CallOutcome, CallRecord, ObserveLayer};
use seawall::{FailureClass, LlmError};
use std::future::Future;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

const ASK: &str = r#"{"model":"gpt-4o-mini","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

const CHUNKS: [&str; 3] = [
    "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
    "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n",
    "data: [DONE]\n\n",
];

/// A streamed body that reports `is_end_stream()` as soon as its last frame is out.
struct Chunks(VecDeque<Bytes>);

impl Chunks {
    fn new() -> Self {
        Self::of(&CHUNKS)
    }

    fn of(chunks: &[&'static str]) -> Self {
        Chunks(
            chunks
                .iter()
                .map(|c| Bytes::from_static(c.as_bytes()))
                .collect(),
        )
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|c| Ok(Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// The request as the server side sees it, and as the tests send it directly.
fn ask() -> http::Request<Bytes> {
    http::Request::post("/v1/chat/completions")
        .header(http::header::HOST, "upstream.test")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Bytes::from_static(ASK.as_bytes()))
        .unwrap()
}

/// An upstream that streams [`CHUNKS`], or fails with `fail` while `failing` is set.
#[derive(Clone)]
struct Upstream {
    failing: Arc<AtomicBool>,
    fail: FailureClass,
}

impl Upstream {
    fn healthy() -> Self {
        Upstream {
            failing: Arc::default(),
            fail: FailureClass::ServerError,
        }
    }

    fn failing_first(fail: FailureClass) -> Self {
        Upstream {
            failing: Arc::new(AtomicBool::new(true)),
            fail,
        }
    }
}

impl Service<http::Request<Bytes>> for Upstream {
    type Response = http::Response<Chunks>;
    type Error = LlmError;
    type Future = std::future::Ready<Result<http::Response<Chunks>, LlmError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<Bytes>) -> Self::Future {
        std::future::ready(if self.failing.swap(false, Ordering::SeqCst) {
            Err(LlmError::new(self.fail, "upstream failed"))
        } else {
            Ok(http::Response::new(Chunks::new()))
        })
    }
}

/// Serves `svc` with hyper's HTTP/1 server on a free loopback port.
async fn serve<S, B>(svc: S) -> SocketAddr
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>, Error = LlmError>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = svc.clone();
            let handler = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                let svc = svc.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let body = body.collect().await?.to_bytes();
                    let req = http::Request::from_parts(parts, body);
                    svc.oneshot(req).await.map_err(BoxError::from)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), handler),
            );
        }
    });
    addr
}

/// Sends [`ask`] with hyper's HTTP/1 client and reads the whole answer.
async fn fetch(addr: SocketAddr) -> Bytes {
    try_fetch(addr).await.unwrap()
}

/// Sends [`ask`] with hyper's HTTP/1 client and reads the answer, or the error that cut it.
async fn try_fetch(addr: SocketAddr) -> Result<Bytes, hyper::Error> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let (parts, body) = ask().into_parts();
    let resp = sender
        .send_request(http::Request::from_parts(parts, Full::new(body)))
        .await?;
    assert_eq!(resp.status(), http::StatusCode::OK);
    Ok(resp.into_body().collect().await?.to_bytes())
}

fn whole_stream() -> Bytes {
    Bytes::from(CHUNKS.concat())
}

#[tokio::test(start_paused = true)]
async fn a_half_open_probe_served_by_hyper_closes_the_breaker() {
    let layer = CircuitBreakerLayer::builder()
        .consecutive_failures(1)
        .open_for(Duration::from_secs(10))
        .jitter(0.0)
        .build()
        .unwrap();
    let breaker = layer.handle();
    let svc = layer.layer(Upstream::failing_first(FailureClass::ServerError));

    let err = svc.clone().oneshot(ask()).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::ServerError);
    assert_eq!(breaker.snapshots()[0].state, State::Open);

    tokio::time::advance(Duration::from_secs(11)).await;
    let addr = serve(svc).await;
    assert_eq!(fetch(addr).await, whole_stream());

    let keys = breaker.snapshots();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(keys[0].state, State::Closed, "{keys:?}");
}

#[tokio::test]
async fn a_call_served_by_hyper_counts_as_a_success_for_the_adaptive_gate() {
    let layer = ConcurrencyGateLayer::builder()
        .limit(2)
        .adaptive(Adaptive::new())
        .build()
        .unwrap();
    let gate = layer.handle();
    let svc = layer.layer(Upstream::failing_first(FailureClass::RateLimited));

    let err = svc.clone().oneshot(ask()).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::RateLimited);
    assert_eq!(gate.limit(), 1, "a rate limit cuts the limit");

    let addr = serve(svc).await;
    assert_eq!(fetch(addr).await, whole_stream());

    let stats = gate.stats();
    assert_eq!(stats.in_flight, 0, "{stats:?}");
    assert_eq!(stats.limit, 2, "one success at limit 1 grows it: {stats:?}");
}

#[tokio::test]
async fn a_call_served_by_hyper_stays_charged_when_drops_are_released() {
    let layer = CostBudgetLayer::builder(
        PriceTable::new().with_default(Price::per_million_f64(10.0, 10.0).unwrap()),
    )
    .budget(Budget::total("total", Usd::from_dollars(1)))
    .on_drop(Settlement::Release)
    .build()
    .unwrap();
    let addr = serve(layer.layer(Upstream::healthy())).await;

    assert_eq!(fetch(addr).await, whole_stream());

    let spend = layer.spend("total", None).unwrap();
    assert_eq!(spend.reserved, Usd::ZERO, "{spend:?}");
    assert!(
        spend.spent > Usd::ZERO,
        "a complete call without usage is charged its estimate: {spend:?}"
    );
}

fn observe(tx: mpsc::UnboundedSender<CallRecord>) -> ObserveLayer {
    ObserveLayer::builder()
        .recorder(move |r: &CallRecord| {
            let _ = tx.send(r.clone());
        })
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_call_served_by_hyper_is_recorded_as_a_success() {
    let (tx, mut records) = mpsc::unbounded_channel();
    let addr = serve(observe(tx).layer(Upstream::healthy())).await;

    assert_eq!(fetch(addr).await, whole_stream());

    let record = records.recv().await.unwrap();
    assert_eq!(record.outcome, CallOutcome::Success, "{record:?}");
    assert!(records.try_recv().is_err(), "one record per call");
}

fn budget() -> CostBudgetLayer {
    CostBudgetLayer::builder(
        PriceTable::new().with_default(Price::per_million_f64(10.0, 10.0).unwrap()),
    )
    .budget(Budget::total("total", Usd::from_dollars(1)))
    .build()
    .unwrap()
}

#[tokio::test]
async fn a_call_dropped_mid_stream_is_recorded_with_the_cost_the_budget_charged() {
    let (tx, mut records) = mpsc::unbounded_channel();
    let budget = budget();
    let svc = ServiceBuilder::new()
        .layer(observe(tx))
        .layer(budget.clone())
        .service(Upstream::healthy());

    let mut body = svc.oneshot(ask()).await.unwrap().into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    drop(body);

    let charged = budget.spend("total", None).unwrap().spent;
    assert!(
        charged > Usd::ZERO,
        "a dropped call is charged its estimate"
    );
    let record = records.recv().await.unwrap();
    assert_eq!(record.outcome, CallOutcome::Cancelled, "{record:?}");
    assert_eq!(record.cost_usd, Some(charged.as_f64()), "{record:?}");
}

#[tokio::test]
async fn a_call_dropped_before_its_head_is_recorded_with_the_cost_the_budget_charged() {
    let (tx, mut records) = mpsc::unbounded_channel();
    let budget = budget();
    let svc = ServiceBuilder::new()
        .layer(observe(tx))
        .layer(budget.clone())
        .service_fn(|_: http::Request<Bytes>| {
            std::future::pending::<Result<http::Response<Chunks>, LlmError>>()
        });

    // Polled once: admitted by the budget, waiting for the upstream's head.
    let mut call = Box::pin(svc.oneshot(ask()));
    let mut cx = Context::from_waker(std::task::Waker::noop());
    assert!(call.as_mut().poll(&mut cx).is_pending());
    assert!(budget.spend("total", None).unwrap().reserved > Usd::ZERO);
    drop(call);

    let charged = budget.spend("total", None).unwrap().spent;
    assert!(
        charged > Usd::ZERO,
        "a dropped call is charged its estimate"
    );
    let record = records.recv().await.unwrap();
    assert_eq!(record.outcome, CallOutcome::Cancelled, "{record:?}");
    assert_eq!(record.cost_usd, Some(charged.as_f64()), "{record:?}");
}

#[tokio::test]
async fn a_json_answer_of_known_length_through_the_classifier_is_recorded_as_a_success() {
    const ANSWER: &str = r#"{"id":"c1","model":"gpt-4o-mini","choices":[{"message":{"content":"Hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}"#;
    let (tx, mut records) = mpsc::unbounded_channel();
    // `Full` has an exact size hint, so hyper sends a content-length and stops after the
    // last byte, whether or not the body said it had ended.
    let svc = ServiceBuilder::new()
        .layer(observe(tx))
        .layer(ClassifyLayer::default())
        .service_fn(|_: http::Request<Bytes>| async {
            let resp = http::Response::builder()
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from_static(ANSWER.as_bytes())))
                .unwrap();
            Ok::<_, LlmError>(resp)
        });
    let addr = serve(svc).await;

    assert_eq!(fetch(addr).await, ANSWER);

    let record = records.recv().await.unwrap();
    assert_eq!(record.outcome, CallOutcome::Success, "{record:?}");
    assert_eq!(record.usage.map(|u| u.total()), Some(7), "{record:?}");
}

#[tokio::test]
async fn a_stream_without_its_finish_marker_still_fails_when_its_body_reports_the_end() {
    let (tx, mut records) = mpsc::unbounded_channel();
    let svc = ServiceBuilder::new()
        .layer(observe(tx))
        .layer(ClassifyLayer::default())
        .service_fn(|_: http::Request<Bytes>| async {
            let resp = http::Response::builder()
                .header(http::header::CONTENT_TYPE, "text/event-stream")
                .body(Chunks::of(&CHUNKS[..2]))
                .unwrap();
            Ok::<_, LlmError>(resp)
        });
    let addr = serve(svc).await;

    // hyper polls once more for the classifier's error, and cuts the answer short.
    assert!(try_fetch(addr).await.is_err());

    let record = records.recv().await.unwrap();
    assert_eq!(record.outcome, CallOutcome::Interrupted, "{record:?}");
    assert_eq!(
        record.class,
        Some(FailureClass::StreamInterrupted),
        "{record:?}"
    );
}
