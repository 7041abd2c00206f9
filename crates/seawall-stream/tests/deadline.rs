//! The caller's deadline against the layer's own timeouts, on paused time: the deadline cuts
//! every bound before the commit point and fires as `DeadlineExceeded`; the layer's own
//! timeouts still fire as `Timeout` when they come first; the body after the commit point is
//! the caller's.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use seawall_core::{Deadline, FailureClass, LlmError, TIMEOUT_HEADER};
use seawall_stream::StreamTimeoutLayer;
use seawall_test_support::{ChanBody, drain};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep};
use tower::{Layer, ServiceExt};

type Feed = mpsc::UnboundedSender<Result<Frame<Bytes>, LlmError>>;

const DELTA: &str =
    "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n";
const STOP: &str = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn data(s: &str) -> Result<Frame<Bytes>, LlmError> {
    Ok(Frame::data(Bytes::copy_from_slice(s.as_bytes())))
}

/// A streamed chat request whose caller stops waiting after `timeout` seconds.
fn streamed(timeout: &str) -> Request<Bytes> {
    Request::post("http://up/v1/chat/completions")
        .header(TIMEOUT_HEADER, timeout)
        .body(Bytes::from_static(
            br#"{"model":"m","stream":true,"messages":[]}"#,
        ))
        .unwrap()
}

/// An upstream that answers an SSE head after `head_delay`, with a body the test feeds through
/// the returned sender, and counts its calls.
fn upstream(
    head_delay: Duration,
) -> (
    impl tower::Service<Request<Bytes>, Response = Response<ChanBody>, Error = LlmError, Future: Send>
    + Clone,
    Feed,
    Arc<AtomicUsize>,
) {
    let (tx, body) = ChanBody::channel();
    let body = Arc::new(std::sync::Mutex::new(Some(body)));
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let svc = tower::service_fn(move |_req: Request<Bytes>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let body = body.lock().unwrap().take().unwrap_or_else(ChanBody::empty);
        async move {
            sleep(head_delay).await;
            Ok::<_, LlmError>(
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(body)
                    .unwrap(),
            )
        }
    });
    (svc, tx, calls)
}

#[tokio::test(start_paused = true)]
async fn the_deadline_cuts_the_first_token_timeout_and_fails_as_deadline_exceeded() {
    let (svc, _feed, _) = upstream(Duration::ZERO);
    let layer = StreamTimeoutLayer::builder()
        .first_token(secs(60))
        .build()
        .unwrap();
    let start = Instant::now();
    let err = layer
        .layer(svc)
        .oneshot(streamed("2"))
        .await
        .expect_err("no token ever comes");
    assert_eq!(err.class(), FailureClass::DeadlineExceeded, "{err}");
    assert_eq!(start.elapsed(), secs(2), "at the deadline, not at 60 s");
}

#[tokio::test(start_paused = true)]
async fn the_deadline_cuts_the_attempt_timeout_before_the_head() {
    let (svc, _feed, _) = upstream(secs(100));
    let layer = StreamTimeoutLayer::builder()
        .attempt(secs(300))
        .first_token(None)
        .build()
        .unwrap();
    let start = Instant::now();
    let err = layer.layer(svc).oneshot(streamed("3")).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::DeadlineExceeded, "{err}");
    assert_eq!(start.elapsed(), secs(3));
}

#[tokio::test(start_paused = true)]
async fn the_layers_own_timeout_still_fires_as_a_timeout_when_it_comes_first() {
    let (svc, _feed, _) = upstream(Duration::ZERO);
    let layer = StreamTimeoutLayer::builder()
        .first_token(secs(2))
        .build()
        .unwrap();
    let start = Instant::now();
    let err = layer.layer(svc).oneshot(streamed("10")).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Timeout, "{err}");
    assert_eq!(start.elapsed(), secs(2));
}

#[tokio::test(start_paused = true)]
async fn an_attempt_past_the_deadline_is_never_made() {
    let (svc, _feed, calls) = upstream(Duration::ZERO);
    let mut req = streamed("600");
    // An outer layer already set the deadline, and it has passed: the header is not read.
    req.extensions_mut().insert(Deadline::at(Instant::now()));
    let err = StreamTimeoutLayer::new()
        .layer(svc)
        .oneshot(req)
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::DeadlineExceeded, "{err}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the upstream was never called"
    );
}

#[tokio::test(start_paused = true)]
async fn after_the_commit_point_the_body_is_not_cut_at_the_deadline() {
    let (svc, feed, _) = upstream(Duration::ZERO);
    let layer = StreamTimeoutLayer::builder()
        .idle(secs(30))
        .build()
        .unwrap();
    feed.send(data(DELTA)).unwrap();
    let resp = layer
        .layer(svc)
        .oneshot(streamed("2"))
        .await
        .expect("the first token came before the deadline");
    tokio::spawn(async move {
        sleep(secs(5)).await; // past the caller's deadline, within the idle timeout
        feed.send(data(DELTA)).unwrap();
        feed.send(data(STOP)).unwrap();
        feed.send(data(DONE)).unwrap();
    });
    let start = Instant::now();
    let (text, err) = drain(resp.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(text.matches("\"Hi\"").count(), 2, "{text}");
    assert_eq!(start.elapsed(), secs(5));
}
