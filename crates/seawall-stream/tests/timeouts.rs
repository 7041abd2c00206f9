//! Every timeout and the commit point, on paused time.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use seawall_core::{BodyReport, CallContext, FailureClass, FinishReason, LlmError, Usage};
use seawall_stream::{StreamEnd, StreamStats, StreamTimeoutLayer, StreamTimeouts, TimedBody};
use seawall_test_support::ChanBody;
use tokio::sync::mpsc;
use tokio::time::{Instant, advance, sleep};
use tower::{Layer, Service, ServiceExt};

type Item = Result<Frame<Bytes>, LlmError>;

struct Upstream {
    tx: mpsc::UnboundedSender<Item>,
    svc: tower::util::BoxService<Request<Bytes>, Response<ChanBody>, LlmError>,
}

/// An upstream whose head arrives after `head_delay` with `content_type`, and whose body the
/// test feeds through `tx`.
fn upstream(head_delay: Duration, content_type: &'static str, report: bool) -> Upstream {
    let (tx, body) = ChanBody::channel();
    let body = Arc::new(Mutex::new(Some(body)));
    let svc = tower::service_fn(move |_req: Request<Bytes>| {
        let body = body.lock().unwrap().take().expect("one call per upstream");
        async move {
            sleep(head_delay).await;
            let report = report.then(|| Arc::new(BodyReport::new()));
            let body = match &report {
                Some(r) => body.recording_content(r.clone()),
                None => body,
            };
            let mut resp = Response::builder()
                .header("content-type", content_type)
                .body(body)
                .unwrap();
            if let Some(r) = report {
                resp.extensions_mut().insert(r);
            }
            Ok::<_, LlmError>(resp)
        }
    });
    Upstream {
        tx,
        svc: tower::util::BoxService::new(svc),
    }
}

const SSE: &str = "text/event-stream";

fn data(s: &str) -> Item {
    Ok(Frame::data(Bytes::copy_from_slice(s.as_bytes())))
}

fn chat_req(stream: bool) -> Request<Bytes> {
    let body = format!(r#"{{"model":"m","stream":{stream},"messages":[]}}"#);
    Request::post("http://up/v1/chat/completions")
        .body(Bytes::from(body))
        .unwrap()
}

const DELTA: &str =
    "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n";
const ROLE: &str = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n";
const STOP: &str = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

async fn call(
    up: Upstream,
    t: StreamTimeouts,
    req: Request<Bytes>,
) -> (
    mpsc::UnboundedSender<Item>,
    Result<Response<TimedBody<ChanBody>>, LlmError>,
) {
    let svc = StreamTimeoutLayer::builder()
        .timeouts(t)
        .build()
        .unwrap()
        .layer(up.svc);
    let res = svc.oneshot(req).await;
    (up.tx, res)
}

async fn collect_text(body: TimedBody<ChanBody>) -> Result<String, LlmError> {
    let bytes = body.collect().await?.to_bytes();
    Ok(String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test(start_paused = true)]
async fn attempt_timeout_fires_before_the_head() {
    let up = upstream(secs(10), SSE, false);
    let start = Instant::now();
    let t = StreamTimeouts::none().with_attempt(secs(2));
    let (_tx, res) = call(up, t, chat_req(false)).await;
    let err = res.unwrap_err();
    assert_eq!(err.class(), FailureClass::Timeout);
    assert!(err.message().contains("head"), "{err}");
    assert_eq!(start.elapsed(), secs(2));
}

#[tokio::test(start_paused = true)]
async fn keepalives_do_not_count_as_a_first_token() {
    let up = upstream(Duration::ZERO, SSE, false);
    let tx = up.tx.clone();
    tokio::spawn(async move {
        for _ in 0..10 {
            sleep(secs(1)).await;
            // DeepSeek under load: comments and blank lines, then OpenAI's role-only delta.
            let _ = tx.send(data(": keep-alive\n\n"));
            let _ = tx.send(data("\n\n"));
            let _ = tx.send(data(ROLE));
        }
    });
    let start = Instant::now();
    let t = StreamTimeouts::none().with_first_token(secs(5));
    let (tx, res) = call(up, t, chat_req(true)).await;
    let err = res.unwrap_err();
    assert_eq!(err.class(), FailureClass::Timeout);
    assert!(err.message().contains("first token"), "{err}");
    assert_eq!(start.elapsed(), secs(5));
    // The timeout dropped the upstream body: the connection is released.
    assert!(tx.is_closed());
}

#[tokio::test(start_paused = true)]
async fn first_content_commits_and_held_frames_are_replayed_in_order() {
    let up = upstream(Duration::ZERO, SSE, false);
    let tx = up.tx.clone();
    tokio::spawn(async move {
        sleep(secs(1)).await;
        let _ = tx.send(data(": keep-alive\n\n"));
        sleep(secs(1)).await;
        let _ = tx.send(data("event: ping\ndata: {\"type\":\"ping\"}\n\n"));
        let _ = tx.send(data(ROLE));
        sleep(secs(1)).await;
        let _ = tx.send(data(DELTA));
        sleep(secs(1)).await;
        let _ = tx.send(data(STOP));
        let _ = tx.send(data(DONE));
    });
    let cx = Arc::new(CallContext::new());
    let mut req = chat_req(true);
    req.extensions_mut().insert(cx.clone());
    let start = Instant::now();
    let (tx, res) = call(up, StreamTimeouts::new().with_first_token(secs(5)), req).await;
    let resp = res.unwrap();
    assert_eq!(start.elapsed(), secs(3), "resolved at the first real token");
    let stats = StreamStats::of(&resp).unwrap();
    assert_eq!(stats.time_to_first_token(), Some(secs(3)));
    assert_eq!(cx.snapshot().time_to_first_token, Some(secs(3)));
    assert!(stats.is_streamed());
    drop(tx);
    let text = collect_text(resp.into_body()).await.unwrap();
    let expected = [
        ": keep-alive\n\n",
        "event: ping\ndata: {\"type\":\"ping\"}\n\n",
        ROLE,
        DELTA,
        STOP,
        DONE,
    ]
    .concat();
    assert_eq!(text, expected);
    assert_eq!(stats.end(), Some(StreamEnd::Complete));
    assert_eq!(stats.finish_reason(), Some(&FinishReason::Stop));
    // One content event (STOP carries none): no per-token figure from a single event.
    assert_eq!(stats.time_per_output_token(), None);
}

#[tokio::test(start_paused = true)]
async fn a_body_error_before_content_is_an_err_of_its_own_class() {
    let up = upstream(Duration::ZERO, SSE, true);
    up.tx.send(data(": keep-alive\n\n")).unwrap();
    up.tx
        .send(Err(LlmError::new(FailureClass::Overloaded, "Overloaded")))
        .unwrap();
    let (_tx, res) = call(up, StreamTimeouts::new(), chat_req(true)).await;
    assert_eq!(res.unwrap_err().class(), FailureClass::Overloaded);
}

#[tokio::test(start_paused = true)]
async fn an_error_event_before_content_is_an_err_without_a_classifier() {
    let up = upstream(Duration::ZERO, SSE, false);
    up.tx
        .send(data(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n",
        ))
        .unwrap();
    up.tx
        .send(data("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"))
        .unwrap();
    let (tx, res) = call(up, StreamTimeouts::new(), chat_req(true)).await;
    let err = res.unwrap_err();
    assert_eq!(err.class(), FailureClass::Overloaded);
    assert!(tx.is_closed());
}

/// A whole stream of `frames`, complete before the call (its sender is dropped first).
async fn whole_stream(frames: &[&str]) -> Result<Response<TimedBody<ChanBody>>, LlmError> {
    let Upstream { tx, svc } = upstream(Duration::ZERO, SSE, false);
    for frame in frames {
        tx.send(data(frame)).unwrap();
    }
    drop(tx);
    StreamTimeoutLayer::new()
        .layer(svc)
        .oneshot(chat_req(true))
        .await
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_finishes_without_content_is_an_empty_response_err() {
    let err = whole_stream(&[ROLE, STOP, DONE]).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::EmptyResponse);

    // Stopped by the content filter before any content: not a glitch a retry fixes.
    let filtered = STOP.replace("stop", "content_filter");
    let err = whole_stream(&[ROLE, &filtered, DONE]).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::ContentFiltered);

    // Stopped at the token limit before any content: an answer, not a glitch.
    let length = STOP.replace("stop", "length");
    let resp = whole_stream(&[ROLE, &length, DONE])
        .await
        .expect("a length stop is handed on");
    assert!(StreamStats::of(&resp).unwrap().hit_length_limit());
}

#[tokio::test(start_paused = true)]
async fn a_body_error_after_content_is_a_stream_interrupted_body_error() {
    let up = upstream(Duration::ZERO, SSE, true);
    up.tx.send(data("data: CONTENT\n\n")).unwrap();
    let (tx, res) = call(up, StreamTimeouts::new(), chat_req(true)).await;
    let resp = res.expect("committed at the first content");
    let stats = StreamStats::of(&resp).unwrap();
    tx.send(Err(LlmError::new(FailureClass::Overloaded, "Overloaded")))
        .unwrap();
    let mut body = resp.into_body();
    assert!(body.frame().await.unwrap().is_ok());
    let err = body.frame().await.unwrap().unwrap_err();
    assert_eq!(err.class(), FailureClass::StreamInterrupted);
    assert!(
        body.frame().await.is_none(),
        "the body ends after its error"
    );
    assert_eq!(stats.end(), Some(StreamEnd::Interrupted));
    assert!(
        tx.is_closed(),
        "the upstream body was released at the error"
    );
}

#[tokio::test(start_paused = true)]
async fn an_error_event_after_content_without_a_classifier_is_stream_interrupted() {
    let up = upstream(Duration::ZERO, SSE, false);
    up.tx.send(data(DELTA)).unwrap();
    let (tx, res) = call(up, StreamTimeouts::new(), chat_req(true)).await;
    let mut body = res.unwrap().into_body();
    tx.send(data("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"))
        .unwrap();
    assert!(body.frame().await.unwrap().is_ok()); // DELTA
    assert!(body.frame().await.unwrap().is_ok()); // the frame with the event
    let err = body.frame().await.unwrap().unwrap_err();
    assert_eq!(err.class(), FailureClass::StreamInterrupted);
    assert_eq!(err.error_type(), Some("overloaded_error"));
}

#[tokio::test(start_paused = true)]
async fn idle_timeout_after_commit_cuts_the_body_and_releases_the_upstream() {
    let up = upstream(Duration::ZERO, SSE, false);
    up.tx.send(data(DELTA)).unwrap();
    let t = StreamTimeouts::none().with_idle(secs(3));
    let (tx, res) = call(up, t, chat_req(true)).await;
    let mut body = res.unwrap().into_body();
    let stats = body.stats().clone();
    let start = Instant::now();
    assert!(body.frame().await.unwrap().is_ok());
    // Chunks every 2 s keep it alive, whatever the total.
    for _ in 0..5 {
        sleep(secs(2)).await;
        tx.send(data(DELTA)).unwrap();
        assert!(body.frame().await.unwrap().is_ok());
    }
    assert_eq!(start.elapsed(), secs(10));
    let err = body.frame().await.unwrap().unwrap_err();
    assert_eq!(err.class(), FailureClass::StreamInterrupted);
    assert!(err.message().contains("idle"), "{err}");
    assert_eq!(start.elapsed(), secs(13));
    assert_eq!(stats.end(), Some(StreamEnd::TimedOut));
    assert!(tx.is_closed());
}

/// With a classifier's report inside: the first content frame (the commit point) at once, then
/// each of `frames` 2 s after the one before, the body read as they come; gives the time from
/// the start to the idle timeout (3 s) that follows the last of them.
async fn idle_timeout_after(frames: &[&str]) -> Duration {
    let up = upstream(Duration::ZERO, SSE, true);
    up.tx.send(data("data: CONTENT 0\n\n")).unwrap();
    let start = Instant::now();
    let t = StreamTimeouts::none().with_idle(secs(3));
    let (tx, res) = call(up, t, chat_req(true)).await;
    let mut body = res.unwrap().into_body();
    assert!(body.frame().await.unwrap().is_ok());
    for frame in frames {
        sleep(secs(2)).await;
        tx.send(data(frame)).unwrap();
        assert!(body.frame().await.unwrap().is_ok());
    }
    let err = body.frame().await.unwrap().unwrap_err();
    assert!(err.message().contains("idle"), "{err}");
    start.elapsed()
}

/// The idle timer runs from the last frame, whether the classifier inside counted it as
/// content (its time is then the one the classifier recorded) or not (a keep-alive).
#[tokio::test(start_paused = true)]
async fn with_a_classifier_inside_the_idle_timer_runs_from_the_last_frame_content_or_not() {
    const KEEP_ALIVE: &str = ": keep-alive\n\n";
    const CONTENT: &str = "data: CONTENT\n\n";
    // The last frame content: 3 s after it, not after the first content.
    assert_eq!(
        idle_timeout_after(&[KEEP_ALIVE, CONTENT, KEEP_ALIVE, CONTENT]).await,
        secs(11)
    );
    // The last frame a keep-alive after content: 3 s after the keep-alive, not the content.
    assert_eq!(idle_timeout_after(&[CONTENT, KEEP_ALIVE]).await, secs(7));
}

#[tokio::test(start_paused = true)]
async fn total_deadline_before_commit_is_a_timeout_and_after_it_interrupts() {
    // Before the commit point: an Err the retry layer may act on.
    let up = upstream(secs(1), SSE, false);
    up.tx.send(data(": keep-alive\n\n")).unwrap();
    let start = Instant::now();
    let t = StreamTimeouts::none().with_total(secs(4));
    let (_tx, res) = call(up, t, chat_req(true)).await;
    assert_eq!(res.unwrap_err().class(), FailureClass::Timeout);
    assert_eq!(start.elapsed(), secs(4));

    // After it: a healthy stream is cut at the deadline, as a body error.
    let up = upstream(secs(1), SSE, false);
    up.tx.send(data(DELTA)).unwrap();
    let start = Instant::now();
    let t = StreamTimeouts::none()
        .with_total(secs(4))
        .with_idle(secs(3));
    let (tx, res) = call(up, t, chat_req(true)).await;
    let mut body = res.unwrap().into_body();
    let feeder = tokio::spawn(async move {
        while !tx.is_closed() {
            sleep(Duration::from_millis(700)).await;
            let _ = tx.send(data(DELTA));
        }
    });
    let mut frames = 0;
    let err = loop {
        match body.frame().await.unwrap() {
            Ok(_) => frames += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(err.class(), FailureClass::StreamInterrupted);
    assert!(err.message().contains("total"), "{err}");
    assert_eq!(start.elapsed(), secs(4));
    assert_eq!(
        frames, 5,
        "the first delta and those at 1.7, 2.4, 3.1 and 3.8 s"
    );
    feeder.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_stream_without_its_finish_marker_is_never_a_silent_truncation() {
    let up = upstream(Duration::ZERO, SSE, false);
    up.tx.send(data(DELTA)).unwrap();
    let (tx, res) = call(up, StreamTimeouts::new(), chat_req(true)).await;
    let resp = res.unwrap();
    let stats = StreamStats::of(&resp).unwrap();
    tx.send(data(DELTA)).unwrap();
    drop(tx); // EOF without finish_reason or [DONE]
    let err = collect_text(resp.into_body()).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::StreamInterrupted);
    assert!(err.message().contains("finish marker"));
    assert!(!stats.is_complete());

    // The same cut before any content: an Err from the future.
    let up = upstream(Duration::ZERO, SSE, false);
    up.tx.send(data(ROLE)).unwrap();
    let Upstream { tx, svc } = up;
    drop(tx);
    let svc = StreamTimeoutLayer::new().layer(svc);
    let res = svc.oneshot(chat_req(true)).await;
    assert_eq!(res.unwrap_err().class(), FailureClass::Disconnected);
}

#[tokio::test(start_paused = true)]
async fn finish_reason_length_is_exposed_for_a_continuation() {
    let up = upstream(Duration::ZERO, SSE, false);
    up.tx.send(data(DELTA)).unwrap();
    let (tx, res) = call(up, StreamTimeouts::new(), chat_req(true)).await;
    let resp = res.unwrap();
    let stats = StreamStats::of(&resp).unwrap();
    tx.send(data(
        "data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":\"length\"}]}\n\n",
    ))
    .unwrap();
    tx.send(data(DONE)).unwrap();
    drop(tx);
    collect_text(resp.into_body()).await.unwrap();
    assert!(stats.is_complete());
    assert!(stats.hit_length_limit());
}

/// Four more content events 100 ms apart, each read from `body`, then five output tokens and
/// `finish` in the classifier's `report`: a pace of 100 ms a token.
async fn paced_content<B>(
    body: &mut B,
    tx: &mpsc::UnboundedSender<Item>,
    report: &BodyReport,
    finish: FinishReason,
) where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    for _ in 0..4 {
        advance(Duration::from_millis(100)).await;
        tx.send(data("data: CONTENT\n\n")).unwrap();
        assert!(body.frame().await.unwrap().is_ok());
    }
    report.set_usage(Usage {
        input_tokens: 5,
        output_tokens: 5,
        cached_input_tokens: 0,
        cache_write_input_tokens: 0,
        cache_write_1h_input_tokens: 0,
    });
    report.set_finish_reason(finish);
}

#[tokio::test(start_paused = true)]
async fn with_a_report_the_classifier_decides_content_finish_and_tpot() {
    let up = upstream(Duration::ZERO, SSE, true);
    // Looks like content, but the classifier (the report) has not seen any: held.
    up.tx.send(data("data: not-yet\n\n")).unwrap();
    let tx = up.tx.clone();
    tokio::spawn(async move {
        sleep(secs(2)).await;
        let _ = tx.send(data("data: CONTENT 1\n\n"));
    });
    let cx = Arc::new(CallContext::new());
    let mut req = chat_req(true);
    req.extensions_mut().insert(cx.clone());
    let start = Instant::now();
    let (tx, res) = call(up, StreamTimeouts::new(), req).await;
    let resp = res.unwrap();
    assert_eq!(start.elapsed(), secs(2));
    let report = resp.extensions().get::<Arc<BodyReport>>().unwrap().clone();
    let stats = StreamStats::of(&resp).unwrap();
    let mut body = resp.into_body();
    assert_eq!(
        &body.frame().await.unwrap().unwrap().into_data().unwrap()[..],
        b"data: not-yet\n\n"
    );
    assert!(body.frame().await.unwrap().is_ok());
    paced_content(&mut body, &tx, &report, FinishReason::Length).await;
    drop(tx); // no [DONE]: with a classifier stacked, completeness is its job
    assert!(body.frame().await.is_none());
    assert!(stats.hit_length_limit());
    assert_eq!(
        stats.time_per_output_token(),
        Some(Duration::from_millis(100))
    );
    assert_eq!(
        cx.snapshot().time_per_output_token,
        Some(Duration::from_millis(100))
    );
}

/// Two stream layers over a classifier: the inner one times the classifier's report, the
/// outer one keeps a report of its own, and both give the pace the classifier measured.
#[tokio::test(start_paused = true)]
async fn a_second_stream_layer_reads_the_pace_from_the_classifiers_report() {
    let Upstream { tx, svc } = upstream(Duration::ZERO, SSE, true);
    tx.send(data("data: CONTENT 1\n\n")).unwrap();
    let layer = || StreamTimeoutLayer::new();
    let resp = layer()
        .layer(layer().layer(svc))
        .oneshot(chat_req(true))
        .await
        .unwrap();
    let report = resp.extensions().get::<Arc<BodyReport>>().unwrap().clone();
    let inner = StreamStats::of(&resp).unwrap();
    let mut body = resp.into_body();
    let outer = body.stats().clone();
    assert!(body.frame().await.unwrap().is_ok());
    paced_content(&mut body, &tx, &report, FinishReason::Stop).await;
    drop(tx);
    assert!(body.frame().await.is_none());
    let pace = Some(Duration::from_millis(100));
    assert_eq!(inner.time_per_output_token(), pace);
    assert_eq!(outer.time_per_output_token(), pace);
}

#[tokio::test(start_paused = true)]
async fn with_a_classifier_inside_the_stats_live_in_its_report_and_add_no_extension() {
    let up = upstream(Duration::ZERO, SSE, true);
    up.tx.send(data("data: CONTENT\n\n")).unwrap();
    let (tx, res) = call(up, StreamTimeouts::new(), chat_req(true)).await;
    let resp = res.unwrap();
    // Only the classifier's report: the layer put nothing of its own in the extensions.
    assert_eq!(resp.extensions().len(), 1);
    let report = resp.extensions().get::<Arc<BodyReport>>().unwrap().clone();
    let stats = StreamStats::of(&resp).unwrap();
    assert_eq!(
        report.stream_timing().unwrap().time_to_first_token(),
        Some(Duration::ZERO)
    );
    assert_eq!(stats.end(), None);
    report.set_finished();
    drop(tx);
    collect_text(resp.into_body()).await.unwrap();
    assert_eq!(
        report.stream_timing().unwrap().end(),
        Some(StreamEnd::Complete)
    );
    assert!(stats.is_complete() && stats.is_streamed());
}

#[tokio::test(start_paused = true)]
async fn without_a_classifier_the_outer_layers_see_no_body_report() {
    let up = upstream(Duration::ZERO, SSE, false);
    up.tx.send(data(DELTA)).unwrap();
    let (tx, res) = call(up, StreamTimeouts::new(), chat_req(true)).await;
    let resp = res.unwrap();
    // The usage readers outside must not take the layer's own record for a classifier's.
    assert!(resp.extensions().get::<Arc<BodyReport>>().is_none());
    let stats = StreamStats::of(&resp).unwrap();
    tx.send(data(STOP)).unwrap();
    tx.send(data(DONE)).unwrap();
    drop(tx);
    collect_text(resp.into_body()).await.unwrap();
    assert!(stats.is_complete());
    assert_eq!(stats.finish_reason(), Some(&FinishReason::Stop));
}

#[tokio::test(start_paused = true)]
async fn own_tpot_without_a_classifier() {
    let up = upstream(Duration::ZERO, SSE, false);
    up.tx.send(data(DELTA)).unwrap();
    let (tx, res) = call(up, StreamTimeouts::new(), chat_req(true)).await;
    let mut body = res.unwrap().into_body();
    let stats = body.stats().clone();
    assert!(body.frame().await.unwrap().is_ok());
    for _ in 0..3 {
        sleep(Duration::from_millis(40)).await;
        tx.send(data(DELTA)).unwrap();
        assert!(body.frame().await.unwrap().is_ok());
    }
    tx.send(data(DONE)).unwrap();
    drop(tx);
    while let Some(f) = body.frame().await {
        f.unwrap();
    }
    assert_eq!(
        stats.time_per_output_token(),
        Some(Duration::from_millis(40))
    );
}

#[tokio::test(start_paused = true)]
async fn a_plain_json_body_commits_at_its_first_bytes_and_ttft_does_not_apply() {
    // Not streamed: the head comes after the whole generation (8 s), past the 5 s TTFT.
    let up = upstream(secs(8), "application/json", false);
    up.tx.send(data("  ")).unwrap();
    up.tx.send(data("{\"choices\":[]}")).unwrap();
    let t = StreamTimeouts::none()
        .with_first_token(secs(5))
        .with_attempt(secs(30));
    let (tx, res) = call(up, t, chat_req(false)).await;
    let resp = res.unwrap();
    let stats = StreamStats::of(&resp).unwrap();
    assert!(!stats.is_streamed());
    assert_eq!(stats.time_to_first_token(), Some(secs(8)));
    drop(tx);
    // No finish marker needed outside a stream.
    assert_eq!(
        collect_text(resp.into_body()).await.unwrap(),
        "  {\"choices\":[]}"
    );
    assert!(stats.is_complete());
}

#[tokio::test(start_paused = true)]
async fn a_streamed_request_is_bounded_by_ttft_before_its_head() {
    let up = upstream(secs(8), SSE, false);
    let t = StreamTimeouts::none()
        .with_first_token(secs(5))
        .with_attempt(secs(30));
    let start = Instant::now();
    let (_tx, res) = call(up, t, chat_req(true)).await;
    assert_eq!(res.unwrap_err().class(), FailureClass::Timeout);
    assert_eq!(start.elapsed(), secs(5));
}

#[tokio::test(start_paused = true)]
async fn the_held_frames_are_bounded() {
    let up = upstream(Duration::ZERO, SSE, false);
    for _ in 0..20 {
        up.tx.send(data(": keep-alive\n\n")).unwrap();
    }
    let t = StreamTimeouts::none().with_max_buffer(100);
    let (tx, res) = call(up, t, chat_req(true)).await;
    let resp = res.expect("past the bound the response is handed over");
    let stats = StreamStats::of(&resp).unwrap();
    assert_eq!(stats.time_to_first_token(), None);
    tx.send(data(DELTA)).unwrap();
    tx.send(data(DONE)).unwrap();
    drop(tx);
    let text = collect_text(resp.into_body()).await.unwrap();
    assert_eq!(
        text,
        format!("{}{DELTA}{DONE}", ": keep-alive\n\n".repeat(20))
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_the_future_or_the_body_releases_the_upstream() {
    // Mid-wait for content.
    let up = upstream(Duration::ZERO, SSE, false);
    up.tx.send(data(": keep-alive\n\n")).unwrap();
    let tx = up.tx.clone();
    let mut svc = StreamTimeoutLayer::new().layer(up.svc);
    let fut = svc.ready().await.unwrap().call(chat_req(true));
    let fut = tokio::spawn(fut);
    sleep(secs(1)).await;
    assert!(!tx.is_closed());
    fut.abort();
    assert!(fut.await.unwrap_err().is_cancelled());
    assert!(tx.is_closed());

    // Mid-stream.
    let up = upstream(Duration::ZERO, SSE, false);
    up.tx.send(data(DELTA)).unwrap();
    let (tx, res) = call(up, StreamTimeouts::new(), chat_req(true)).await;
    let mut body = res.unwrap().into_body();
    assert!(body.frame().await.unwrap().is_ok());
    tx.send(data(DELTA)).unwrap();
    assert!(!tx.is_closed());
    drop(body);
    assert!(tx.is_closed());
}

#[tokio::test(start_paused = true)]
async fn errors_of_the_inner_service_pass_through() {
    let svc = tower::service_fn(|_req: Request<Bytes>| async {
        Err::<Response<ChanBody>, _>(LlmError::new(FailureClass::RateLimited, "slow down"))
    });
    let svc = StreamTimeoutLayer::default().layer(svc);
    let err = svc.oneshot(chat_req(true)).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::RateLimited);
}
