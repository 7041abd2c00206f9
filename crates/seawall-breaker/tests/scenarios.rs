//! Scenario tests of the breaker layer on paused tokio time.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{FutureExt, Stream, stream};
use http::Extensions;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use seawall_breaker::{
    BreakerGuard, BreakerHandle, CircuitBreakerBuilder, CircuitBreakerLayer, Mode, OVERFLOW_KEY,
    Reason, State, StateChange, Verdict,
};
use seawall_core::{
    CallContext, FailureClass, HookedBody, LlmError, LlmRequest, RateLimitSnapshot, SeededRandom,
};
use tokio::sync::mpsc;
use tokio::time::advance;
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt};

type Frames = Pin<Box<dyn Stream<Item = Result<Frame<Bytes>, LlmError>> + Send>>;
type Body = StreamBody<Frames>;
type Svc = BoxCloneService<Ask, http::Response<HookedBody<Body, BreakerGuard>>, LlmError>;

/// What the fake upstream does with one request.
enum Reply {
    /// A 200 with one chunk.
    Ok,
    /// An error of this class before any body.
    Fail(FailureClass),
    /// This error before any body.
    Error(LlmError),
    /// Never answers.
    Hang,
    /// Answers after a delay.
    After(Duration, Box<Reply>),
    /// A 200 whose body the test feeds through a channel.
    Stream(mpsc::UnboundedReceiver<Result<Frame<Bytes>, LlmError>>),
}

struct Ask {
    key: String,
    reply: Reply,
    ext: Extensions,
}

impl LlmRequest for Ask {
    fn model(&self) -> Option<&str> {
        Some(&self.key)
    }
    fn max_output_tokens(&self) -> Option<u32> {
        None
    }
    fn estimated_input_tokens(&self) -> u32 {
        0
    }
    fn extensions(&self) -> Option<&Extensions> {
        Some(&self.ext)
    }
    fn extensions_mut(&mut self) -> Option<&mut Extensions> {
        Some(&mut self.ext)
    }
}

fn ask(key: &str, reply: Reply) -> Ask {
    Ask {
        key: key.to_owned(),
        reply,
        ext: Extensions::new(),
    }
}

fn body_of(frames: Frames) -> http::Response<Body> {
    http::Response::new(StreamBody::new(frames))
}

fn answer(
    reply: Reply,
) -> Pin<Box<dyn Future<Output = Result<http::Response<Body>, LlmError>> + Send>> {
    Box::pin(async move {
        match reply {
            Reply::Ok => Ok(body_of(Box::pin(stream::iter([Ok(Frame::data(
                Bytes::from_static(b"hi"),
            ))])))),
            Reply::Fail(class) => Err(LlmError::new(class, "upstream said no")),
            Reply::Error(e) => Err(e),
            Reply::Hang => std::future::pending().await,
            Reply::After(d, then) => {
                tokio::time::sleep(d).await;
                answer(*then).await
            }
            Reply::Stream(rx) => Ok(body_of(Box::pin(stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|item| (item, rx))
            })))),
        }
    })
}

/// The breaker over a fake upstream that counts its calls.
fn stack(layer: &CircuitBreakerLayer) -> (Svc, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let upstream = tower::service_fn(move |a: Ask| {
        seen.fetch_add(1, Ordering::SeqCst);
        answer(a.reply)
    });
    (BoxCloneService::new(layer.layer(upstream)), calls)
}

/// Calls and reads the whole body.
async fn run(svc: &mut Svc, key: &str, reply: Reply) -> Result<(), LlmError> {
    let resp = svc.ready().await?.call(ask(key, reply)).await?;
    resp.into_body().collect().await.map(|_| ())
}

fn class_of(r: Result<(), LlmError>) -> Option<FailureClass> {
    r.err().map(|e| e.class())
}

fn recorder() -> (
    Arc<Mutex<Vec<StateChange>>>,
    impl Fn(&StateChange) + Send + Sync,
) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    (log, move |c: &StateChange| {
        l.lock().unwrap().push(c.clone())
    })
}

fn transitions(log: &Mutex<Vec<StateChange>>) -> Vec<(State, State, Reason)> {
    log.lock()
        .unwrap()
        .iter()
        .map(|c| (c.from, c.to, c.reason))
        .collect()
}

const K: &str = "api.openai.com/gpt-4o";

#[tokio::test(start_paused = true)]
async fn five_straight_500s_open_it() {
    let layer = CircuitBreakerLayer::new();
    let handle = layer.handle();
    let (mut svc, calls) = stack(&layer);
    for i in 0..5 {
        assert_eq!(
            handle.state(K).unwrap_or(State::Closed),
            State::Closed,
            "before call {i}"
        );
        let r = run(&mut svc, K, Reply::Fail(FailureClass::ServerError)).await;
        assert_eq!(class_of(r), Some(FailureClass::ServerError));
    }
    assert_eq!(handle.state(K), Some(State::Open));
    let err = run(&mut svc, K, Reply::Ok).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::CircuitOpen);
    let wait = err.retry_after().expect("says when to come back");
    assert!(
        wait > Duration::from_secs(8) && wait <= Duration::from_secs(10),
        "{wait:?}"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        5,
        "the rejected call never reached upstream"
    );
}

#[tokio::test(start_paused = true)]
async fn four_xx_429_and_local_storms_do_not_open_it() {
    let layer = CircuitBreakerLayer::new();
    let handle = layer.handle();
    let (mut svc, calls) = stack(&layer);
    let storm = [
        FailureClass::RateLimited,
        FailureClass::InvalidRequest,
        FailureClass::ContextLengthExceeded,
        FailureClass::ContentFiltered,
        FailureClass::Authentication,
        FailureClass::PermissionDenied,
        FailureClass::NotFound,
        FailureClass::RequestTimeout,
        FailureClass::Conflict,
        FailureClass::GateRejected,
        FailureClass::BudgetExceeded,
    ];
    for class in storm {
        for _ in 0..100 {
            let r = run(&mut svc, K, Reply::Fail(class)).await;
            assert_eq!(class_of(r), Some(class));
        }
    }
    let snap = handle.snapshot(K).unwrap();
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.calls, 0, "none of them is a call for the breaker");
    assert_eq!(calls.load(Ordering::SeqCst), 1100);
    // And they do not break a run of failures: 4 x 500, a 429, then one more 500 opens it.
    fail_times(&mut svc, 4, FailureClass::Overloaded).await;
    fail_times(&mut svc, 1, FailureClass::RateLimited).await;
    assert_eq!(handle.state(K), Some(State::Closed));
    fail_times(&mut svc, 1, FailureClass::Timeout).await;
    assert_eq!(handle.state(K), Some(State::Open));
}

#[tokio::test(start_paused = true)]
async fn an_exhausted_quota_opens_it_at_once_and_probes_find_the_key_topped_up() {
    let (log, on_change) = recorder();
    let layer = CircuitBreakerLayer::builder()
        .jitter(0.0)
        .on_state_change(on_change)
        .build()
        .unwrap();
    let handle = layer.handle();
    let (mut svc, calls) = stack(&layer);
    let quota = || Reply::Fail(FailureClass::QuotaExhausted);
    // One exhausted quota: the caller sees it, and the key opens for the first period.
    let r = run(&mut svc, K, quota()).await;
    assert_eq!(class_of(r), Some(FailureClass::QuotaExhausted));
    assert_eq!(handle.state(K), Some(State::Open));
    // Calls meanwhile never reach the upstream; the refusal names the cause and the wait.
    let err = run(&mut svc, K, Reply::Ok).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::CircuitOpen);
    assert!(err.message().contains("quota"), "{}", err.message());
    assert_eq!(cause(&err), Some(FailureClass::QuotaExhausted));
    assert_eq!(err.retry_after(), Some(Duration::from_secs(10)));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The probe after the period meets the quota again: open for twice as long.
    advance(Duration::from_secs(10)).await;
    run(&mut svc, K, quota()).await.unwrap_err();
    let err = run(&mut svc, K, Reply::Ok).await.unwrap_err();
    assert_eq!(err.retry_after(), Some(Duration::from_secs(20)));
    assert!(err.message().contains("quota"), "{}", err.message());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // The key is topped up: the next probe closes it.
    advance(Duration::from_secs(20)).await;
    run(&mut svc, K, Reply::Ok).await.unwrap();
    assert_eq!(handle.state(K), Some(State::Closed));
    assert_eq!(
        transitions(&log),
        [
            (
                State::Closed,
                State::Open,
                Reason::OpenAtOnce(FailureClass::QuotaExhausted)
            ),
            (State::Open, State::HalfOpen, Reason::OpenElapsed),
            (State::HalfOpen, State::Open, Reason::ProbeFailed),
            (State::Open, State::HalfOpen, Reason::OpenElapsed),
            (State::HalfOpen, State::Closed, Reason::ProbesSucceeded),
        ]
    );
    // A later opening for another cause does not name the quota.
    fail_times(&mut svc, 5, FailureClass::ServerError).await;
    let err = run(&mut svc, K, Reply::Ok).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::CircuitOpen);
    assert!(!err.message().contains("quota"), "{}", err.message());
    assert_eq!(cause(&err), None);
}

/// The class of the error a refusal carries as its source, if any.
fn cause(err: &LlmError) -> Option<FailureClass> {
    err.source_ref()?
        .downcast_ref::<LlmError>()
        .map(LlmError::class)
}

#[tokio::test(start_paused = true)]
async fn a_quota_opened_key_whose_probe_meets_a_server_error_no_longer_blames_the_quota() {
    let layer = CircuitBreakerLayer::builder().jitter(0.0).build().unwrap();
    let (mut svc, _) = stack(&layer);
    fail_times(&mut svc, 1, FailureClass::QuotaExhausted).await;
    advance(Duration::from_secs(10)).await;
    fail_times(&mut svc, 1, FailureClass::ServerError).await;
    let err = run(&mut svc, K, Reply::Ok).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::CircuitOpen);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(20)));
    assert!(!err.message().contains("quota"), "{}", err.message());
    assert_eq!(cause(&err), None);
}

#[tokio::test(start_paused = true)]
async fn concurrent_quota_errors_open_it_once() {
    let (log, on_change) = recorder();
    let layer = CircuitBreakerLayer::builder()
        .on_state_change(on_change)
        .build()
        .unwrap();
    let (svc, _) = stack(&layer);
    // Eight calls admitted together all meet the exhausted quota: one opening, not a re-open
    // by each of the others (which were admitted before it).
    let calls = (0..8).map(|_| {
        let mut svc = svc.clone();
        async move {
            let quota = Reply::Fail(FailureClass::QuotaExhausted);
            run(
                &mut svc,
                K,
                Reply::After(Duration::from_millis(50), Box::new(quota)),
            )
            .await
        }
    });
    for r in futures_util::future::join_all(calls).await {
        assert_eq!(class_of(r), Some(FailureClass::QuotaExhausted));
    }
    assert_eq!(
        transitions(&log),
        [(
            State::Closed,
            State::Open,
            Reason::OpenAtOnce(FailureClass::QuotaExhausted)
        )]
    );
}

#[tokio::test(start_paused = true)]
async fn classes_that_open_it_at_once_are_configurable() {
    // Off: an exhausted quota is neither success nor failure, however many.
    let layer = CircuitBreakerLayer::builder()
        .open_at_once([])
        .build()
        .unwrap();
    let handle = layer.handle();
    let (mut svc, calls) = stack(&layer);
    fail_times(&mut svc, 50, FailureClass::QuotaExhausted).await;
    assert_eq!(handle.state(K), Some(State::Closed));
    assert_eq!(calls.load(Ordering::SeqCst), 50);
    // Another class: an authentication failure opens it, the refusal without the quota's words.
    let layer = CircuitBreakerLayer::builder()
        .open_at_once([FailureClass::Authentication])
        .build()
        .unwrap();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);
    fail_times(&mut svc, 1, FailureClass::QuotaExhausted).await;
    assert_eq!(handle.state(K), Some(State::Closed));
    fail_times(&mut svc, 1, FailureClass::Authentication).await;
    assert_eq!(handle.state(K), Some(State::Open));
    let err = run(&mut svc, K, Reply::Ok).await.unwrap_err();
    assert!(!err.message().contains("quota"), "{}", err.message());
}

#[tokio::test(start_paused = true)]
async fn a_429_counts_when_configured() {
    let layer = CircuitBreakerLayer::builder()
        .verdict(FailureClass::RateLimited, Verdict::Failure)
        .build()
        .unwrap();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);
    fail_times(&mut svc, 5, FailureClass::RateLimited).await;
    assert_eq!(handle.state(K), Some(State::Open));
}

#[tokio::test(start_paused = true)]
async fn cancelled_calls_are_neither_by_default() {
    let layer = CircuitBreakerLayer::new();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);
    for _ in 0..20 {
        let fut = svc.ready().await.unwrap().call(ask(K, Reply::Hang));
        drop(fut);
        // A stream abandoned halfway.
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(Ok(Frame::data(Bytes::from_static(b"tok"))))
            .unwrap();
        let resp = run_head(&mut svc, Reply::Stream(rx)).await;
        let mut body = resp.into_body();
        body.frame().await.unwrap().unwrap();
        drop(body);
    }
    let snap = handle.snapshot(K).unwrap();
    assert_eq!((snap.state, snap.calls), (State::Closed, 0));

    let layer = CircuitBreakerLayer::builder()
        .on_cancel(Verdict::Failure)
        .build()
        .unwrap();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);
    for _ in 0..5 {
        drop(svc.ready().await.unwrap().call(ask(K, Reply::Hang)));
    }
    assert_eq!(handle.state(K), Some(State::Open));
}

async fn run_head(svc: &mut Svc, reply: Reply) -> http::Response<HookedBody<Body, BreakerGuard>> {
    svc.ready()
        .await
        .unwrap()
        .call(ask(K, reply))
        .await
        .unwrap()
}

/// The breaker `builder` makes, its handle, and a service through it.
fn built(builder: CircuitBreakerBuilder) -> (BreakerHandle, Svc) {
    let layer = builder.build().unwrap();
    (layer.handle(), stack(&layer).0)
}

/// `n` calls that fail at their head with `class`, one after the other.
async fn fail_times(svc: &mut Svc, n: usize, class: FailureClass) {
    for _ in 0..n {
        run(svc, K, Reply::Fail(class)).await.unwrap_err();
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_broken_after_its_first_token_is_a_failure() {
    // Every stream breaks after its first token: the failure rate opens the breaker (each
    // head ends a run of consecutive failures, so that rule is off here).
    let (handle, mut svc) = built(
        CircuitBreakerLayer::builder()
            .consecutive_failures(0)
            .failure_rate(0.5)
            .minimum_calls(2),
    );
    for i in 0..2 {
        let (tx, rx) = mpsc::unbounded_channel();
        let resp = run_head(&mut svc, Reply::Stream(rx)).await;
        // The head arrived; this call's outcome is not known yet.
        assert_eq!(handle.snapshot(K).unwrap().calls, i);
        tx.send(Ok(Frame::data(Bytes::from_static(b"tok"))))
            .unwrap();
        tx.send(Err(LlmError::new(FailureClass::StreamInterrupted, "reset")))
            .unwrap();
        let err = resp.into_body().collect().await.unwrap_err();
        assert_eq!(err.class(), FailureClass::StreamInterrupted);
    }
    assert_eq!(handle.state(K), Some(State::Open));
}

#[tokio::test(start_paused = true)]
async fn a_response_head_ends_a_run_of_failures() {
    let (handle, mut svc) = built(
        CircuitBreakerLayer::builder()
            .consecutive_failures(3)
            .no_failure_rate(),
    );
    fail_times(&mut svc, 2, FailureClass::ServerError).await;
    // A stream answers (its body still flowing, its outcome not known): the run is over.
    let (tx, rx) = mpsc::unbounded_channel();
    let open = run_head(&mut svc, Reply::Stream(rx)).await;
    fail_times(&mut svc, 2, FailureClass::ServerError).await;
    assert_eq!(handle.state(K), Some(State::Closed));
    fail_times(&mut svc, 1, FailureClass::ServerError).await;
    assert_eq!(
        handle.state(K),
        Some(State::Open),
        "three in a row after the head"
    );
    drop((tx, open));
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_answered_before_the_failures_does_not_end_their_run() {
    // A stream answers, then the upstream starts failing; the stream ends well among the
    // failures. Its head came before them: its end says nothing of the upstream now.
    let (handle, mut svc) = built(
        CircuitBreakerLayer::builder()
            .consecutive_failures(3)
            .no_failure_rate(),
    );
    let (tx, rx) = mpsc::unbounded_channel();
    let flowing = run_head(&mut svc, Reply::Stream(rx)).await;
    fail_times(&mut svc, 2, FailureClass::Overloaded).await;
    tx.send(Ok(Frame::data(Bytes::from_static(b"done"))))
        .unwrap();
    drop(tx);
    flowing.into_body().collect().await.unwrap();
    assert_eq!(handle.state(K), Some(State::Closed));
    fail_times(&mut svc, 1, FailureClass::Overloaded).await;
    assert_eq!(handle.state(K), Some(State::Open), "three in a row");
}

#[tokio::test(start_paused = true)]
async fn a_few_errors_among_a_burst_of_streams_do_not_open_the_breaker() {
    // A hundred streams start one after the other, every tenth failing at its head; none
    // has ended, so no success is recorded yet. The failures are one after the other, but
    // never in a row: answers came between them.
    let (handle, mut svc) = built(CircuitBreakerLayer::builder());
    let mut flowing = Vec::new();
    for i in 0..100 {
        if i % 10 == 9 {
            run(&mut svc, K, Reply::Fail(FailureClass::Overloaded))
                .await
                .unwrap_err();
        } else {
            let (tx, rx) = mpsc::unbounded_channel();
            flowing.push((tx, run_head(&mut svc, Reply::Stream(rx)).await));
        }
    }
    assert_eq!(handle.snapshot(K).unwrap().failures, 10);
    assert_eq!(handle.state(K), Some(State::Closed));
    // A dead upstream still opens it: five failures with no answer between them.
    fail_times(&mut svc, 5, FailureClass::Overloaded).await;
    assert_eq!(handle.state(K), Some(State::Open));
    drop(flowing);
}

/// Starts `n` streams whose heads arrive and whose bodies stay open, returning their feeds.
async fn open_streams(
    svc: &mut Svc,
    n: usize,
) -> Vec<(
    mpsc::UnboundedSender<Result<Frame<Bytes>, LlmError>>,
    http::Response<HookedBody<Body, BreakerGuard>>,
)> {
    let mut open = Vec::new();
    for _ in 0..n {
        let (tx, rx) = mpsc::unbounded_channel();
        open.push((tx, run_head(svc, Reply::Stream(rx)).await));
    }
    open
}

#[tokio::test(start_paused = true)]
async fn a_few_errors_while_the_first_streams_flow_do_not_trip_the_failure_rate() {
    // Two hundred streams answered and still flowing, none ended: the window's only
    // outcomes are 25 failures at the head. They are 25 of 225 calls, not 25 of 25.
    let (handle, mut svc) = built(CircuitBreakerLayer::builder().consecutive_failures(0));
    let flowing = open_streams(&mut svc, 200).await;
    fail_times(&mut svc, 25, FailureClass::ServerError).await;
    let snap = handle.snapshot(K).unwrap();
    assert_eq!((snap.calls, snap.failures), (25, 25));
    assert_eq!(handle.state(K), Some(State::Closed));
    drop(flowing);
}

#[tokio::test(start_paused = true)]
async fn once_the_window_is_full_only_outcomes_count() {
    // Every stream breaks after its head. While the count window of 20 fills, the streams
    // still flowing dilute the rate; once it is full, the 20 failures open the breaker.
    let (handle, mut svc) = built(
        CircuitBreakerLayer::builder()
            .consecutive_failures(0)
            .count_window(20)
            .minimum_calls(10),
    );
    let mut flowing = open_streams(&mut svc, 60).await;
    for i in 1..=20 {
        let (tx, resp) = flowing.pop().unwrap();
        tx.send(Err(LlmError::new(FailureClass::StreamInterrupted, "reset")))
            .unwrap();
        resp.into_body().collect().await.unwrap_err();
        let expected = if i < 20 { State::Closed } else { State::Open };
        assert_eq!(handle.state(K), Some(expected), "after {i} broken streams");
    }
    drop(flowing);
}

#[tokio::test(start_paused = true)]
async fn a_time_window_counts_the_flowing_streams_until_it_has_spanned_its_duration() {
    let (handle, mut svc) = built(
        CircuitBreakerLayer::builder()
            .consecutive_failures(0)
            .time_window(Duration::from_secs(10))
            .minimum_calls(5),
    );
    let flowing = open_streams(&mut svc, 50).await;
    advance(Duration::from_secs(5)).await;
    fail_times(&mut svc, 6, FailureClass::ServerError).await;
    assert_eq!(handle.state(K), Some(State::Closed));
    // Ten seconds since the window started: it is warm, and its outcomes alone count.
    advance(Duration::from_secs(5)).await;
    fail_times(&mut svc, 1, FailureClass::ServerError).await;
    assert_eq!(
        handle.state(K),
        Some(State::Open),
        "7 of 7 outcomes, the window warm"
    );
    drop(flowing);
}

#[tokio::test(start_paused = true)]
async fn every_transition_with_events() {
    let (log, on_change) = recorder();
    let layer = CircuitBreakerLayer::builder()
        .open_for(Duration::from_secs(10))
        .jitter(0.0)
        .on_state_change(on_change)
        .build()
        .unwrap();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);

    // Closed -> Open on consecutive failures.
    fail_times(&mut svc, 5, FailureClass::ServerError).await;
    advance(Duration::from_secs(4)).await;
    let snap = handle.snapshot(K).unwrap();
    assert_eq!(snap.retry_after, Some(Duration::from_secs(6)));
    // Open -> HalfOpen when the period ends; the probe fails: HalfOpen -> Open.
    advance(Duration::from_secs(6)).await;
    fail_times(&mut svc, 1, FailureClass::Overloaded).await;
    assert_eq!(handle.state(K), Some(State::Open));
    // Open -> HalfOpen -> Closed on a successful probe (its body must end first).
    advance(Duration::from_secs(10)).await;
    let (tx, rx) = mpsc::unbounded_channel();
    let resp = run_head(&mut svc, Reply::Stream(rx)).await;
    assert_eq!(handle.state(K), Some(State::HalfOpen));
    tx.send(Ok(Frame::data(Bytes::from_static(b"tok"))))
        .unwrap();
    drop(tx);
    resp.into_body().collect().await.unwrap();
    assert_eq!(handle.state(K), Some(State::Closed));
    // Manual modes and back.
    handle.set_mode(K, Mode::ForcedOpen);
    let err = run(&mut svc, K, Reply::Ok).await.unwrap_err();
    assert_eq!(
        (err.class(), err.retry_after()),
        (FailureClass::CircuitOpen, None)
    );
    handle.set_mode(K, Mode::Disabled);
    fail_times(&mut svc, 10, FailureClass::ServerError).await;
    assert_eq!(
        handle.snapshot(K).unwrap().calls,
        0,
        "disabled counts nothing"
    );
    handle.set_mode(K, Mode::MetricsOnly);
    fail_times(&mut svc, 10, FailureClass::ServerError).await;
    let snap = handle.snapshot(K).unwrap();
    assert_eq!((snap.state, snap.failures), (State::MetricsOnly, 10));
    handle.set_mode(K, Mode::Normal);
    run(&mut svc, K, Reply::Ok).await.unwrap();

    use Reason::*;
    use State::*;
    assert_eq!(
        transitions(&log),
        [
            (Closed, Open, ConsecutiveFailures),
            (Open, HalfOpen, OpenElapsed),
            (HalfOpen, Open, ProbeFailed),
            (Open, HalfOpen, OpenElapsed),
            (HalfOpen, Closed, ProbesSucceeded),
            (Closed, ForcedOpen, Manual),
            (ForcedOpen, Disabled, Manual),
            (Disabled, MetricsOnly, Manual),
            (MetricsOnly, Closed, Manual),
        ]
    );
    assert_eq!(
        log.lock().unwrap()[0].open_for,
        Some(Duration::from_secs(10))
    );
}

#[tokio::test(start_paused = true)]
async fn failure_rate_over_a_count_window() {
    let layer = CircuitBreakerLayer::builder()
        .consecutive_failures(0)
        .count_window(10)
        .minimum_calls(10)
        .failure_rate(0.3)
        .build()
        .unwrap();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);
    // Two failures in every ten calls, for a long time: 20% < 30%.
    for i in 0..100 {
        let reply = if i % 5 == 0 {
            Reply::Fail(FailureClass::ServerError)
        } else {
            Reply::Ok
        };
        let _ = run(&mut svc, K, reply).await;
    }
    assert_eq!(handle.state(K), Some(State::Closed));
    // Calls 91..=100 hold two failures (95 and 100); the next failure makes three of ten.
    fail_times(&mut svc, 1, FailureClass::ServerError).await;
    let snap = handle.snapshot(K).unwrap();
    assert_eq!(
        (snap.state, snap.calls, snap.failures),
        (State::Closed, 10, 2)
    );
    fail_times(&mut svc, 1, FailureClass::ServerError).await;
    assert_eq!(handle.state(K), Some(State::Open));
}

#[tokio::test(start_paused = true)]
async fn failure_rate_over_a_time_window_forgets_old_calls() {
    let (log, on_change) = recorder();
    let layer = CircuitBreakerLayer::builder()
        .consecutive_failures(0)
        .time_window(Duration::from_secs(10))
        .minimum_calls(4)
        .failure_rate(0.5)
        .on_state_change(on_change)
        .build()
        .unwrap();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);
    let fail = || Reply::Fail(FailureClass::ServerError);
    run(&mut svc, K, fail()).await.unwrap_err();
    run(&mut svc, K, Reply::Ok).await.unwrap();
    run(&mut svc, K, Reply::Ok).await.unwrap();
    advance(Duration::from_secs(11)).await;
    run(&mut svc, K, fail()).await.unwrap_err();
    run(&mut svc, K, Reply::Ok).await.unwrap();
    run(&mut svc, K, Reply::Ok).await.unwrap();
    assert_eq!(
        handle.state(K),
        Some(State::Closed),
        "3 calls in the window"
    );
    // Counting the expired calls it would be 3 of 7; without them it is 2 of 4.
    run(&mut svc, K, fail()).await.unwrap_err();
    assert_eq!(handle.state(K), Some(State::Open));
    assert_eq!(
        transitions(&log),
        [(State::Closed, State::Open, Reason::FailureRate)]
    );
}

#[tokio::test(start_paused = true)]
async fn slow_first_tokens_trip_but_long_streams_do_not() {
    let (log, on_change) = recorder();
    let layer = CircuitBreakerLayer::builder()
        .consecutive_failures(0)
        .count_window(4)
        .minimum_calls(4)
        .slow_calls(Duration::from_secs(2), 0.5)
        .on_state_change(on_change)
        .build()
        .unwrap();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);
    let after = |s: u64, r: Reply| Reply::After(Duration::from_secs(s), Box::new(r));
    // Fast heads with long bodies are not slow.
    for _ in 0..4 {
        let (tx, rx) = mpsc::unbounded_channel();
        let resp = run_head(&mut svc, after(1, Reply::Stream(rx))).await;
        advance(Duration::from_secs(30)).await;
        tx.send(Ok(Frame::data(Bytes::from_static(b"tok"))))
            .unwrap();
        drop(tx);
        resp.into_body().collect().await.unwrap();
    }
    let snap = handle.snapshot(K).unwrap();
    assert_eq!((snap.calls, snap.slow_calls), (4, 0));
    run(&mut svc, K, after(3, Reply::Ok)).await.unwrap();
    assert_eq!(handle.state(K), Some(State::Closed), "1 of 4 slow");
    run(&mut svc, K, after(3, Reply::Ok)).await.unwrap();
    assert_eq!(handle.state(K), Some(State::Open), "2 of 4 slow");
    assert_eq!(
        transitions(&log),
        [(State::Closed, State::Open, Reason::SlowCallRate)]
    );
}

async fn open_it(svc: &mut Svc) {
    for _ in 0..5 {
        run(svc, K, Reply::Fail(FailureClass::ServerError))
            .await
            .unwrap_err();
    }
}

#[test]
fn half_open_admits_exactly_n_of_1000_concurrent_callers() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let _in_rt = rt.enter();
    let layer = CircuitBreakerLayer::builder()
        .probes(3)
        .probe_successes(3)
        .open_for(Duration::from_secs(10))
        .jitter(0.0)
        .build()
        .unwrap();
    let handle = layer.handle();
    let (mut svc, calls) = stack(&layer);
    rt.block_on(async {
        open_it(&mut svc).await;
        advance(Duration::from_secs(10)).await;
    });
    assert_eq!(handle.state(K), Some(State::Open));
    let rt_handle = rt.handle().clone();
    // 8 threads x 125 callers race for the 3 probe slots; every admitted probe hangs.
    let barrier = std::sync::Barrier::new(8);
    let (admitted, rejected) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let mut svc = svc.clone();
                let (rt_handle, barrier) = (rt_handle.clone(), &barrier);
                s.spawn(move || {
                    let _clock = rt_handle.enter();
                    barrier.wait();
                    let futs: Vec<_> = (0..125).map(|_| svc.call(ask(K, Reply::Hang))).collect();
                    let (mut admitted, mut rejected) = (Vec::new(), 0);
                    for mut f in futs {
                        match (&mut f).now_or_never() {
                            None => admitted.push(f),
                            Some(Err(e)) if e.class() == FailureClass::CircuitOpen => rejected += 1,
                            Some(other) => panic!("unexpected {:?}", other.map(|_| ())),
                        }
                    }
                    (admitted, rejected)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).fold(
            (Vec::new(), 0),
            |(mut all, rej), (adm, r)| {
                all.extend(adm);
                (all, rej + r)
            },
        )
    });
    assert_eq!(admitted.len(), 3);
    assert_eq!(rejected, 997);
    assert_eq!(calls.load(Ordering::SeqCst), 5 + 3);
    let snap = handle.snapshot(K).unwrap();
    assert_eq!((snap.state, snap.probes_in_flight), (State::HalfOpen, 3));
    // Dropping the probes frees their slots at once.
    drop(admitted);
    assert_eq!(handle.snapshot(K).unwrap().probes_in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_never_ends_frees_its_slot_after_the_max_wait() {
    let layer = CircuitBreakerLayer::builder()
        .max_probe_wait(Duration::from_secs(30))
        .open_for(Duration::from_secs(10))
        .jitter(0.0)
        .build()
        .unwrap();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);
    open_it(&mut svc).await;
    advance(Duration::from_secs(10)).await;

    // A probe whose head arrived but whose stream is held, never read, never dropped.
    let (_tx, rx) = mpsc::unbounded_channel::<Result<Frame<Bytes>, LlmError>>();
    let held = run_head(&mut svc, Reply::Stream(rx)).await;
    let err = run(&mut svc, K, Reply::Ok).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::CircuitOpen);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(30)));
    advance(Duration::from_secs(29)).await;
    let err = run(&mut svc, K, Reply::Ok).await.unwrap_err();
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    advance(Duration::from_secs(1)).await;
    // The slot is reclaimed: a new probe goes, and hangs too (its future is held).
    let hung = svc.ready().await.unwrap().call(ask(K, Reply::Hang));
    let mut hung = Box::pin(hung);
    assert!((&mut hung).now_or_never().is_none());
    assert_eq!(handle.state(K), Some(State::HalfOpen));
    // The old probe's late end does not count and does not free the new probe's slot.
    drop(held);
    assert_eq!(handle.snapshot(K).unwrap().probes_in_flight, 1);
    assert_eq!(
        class_of(run(&mut svc, K, Reply::Ok).await),
        Some(FailureClass::CircuitOpen)
    );
    // Dropping the hung probe's future frees its slot at once, and the next probe closes it.
    drop(hung);
    run(&mut svc, K, Reply::Ok).await.unwrap();
    assert_eq!(handle.state(K), Some(State::Closed));
}

#[tokio::test(start_paused = true)]
async fn open_durations_grow_per_reopen_and_reset_on_close() {
    let layer = CircuitBreakerLayer::builder()
        .consecutive_failures(1)
        .open_backoff(Duration::from_secs(1), 2.0, Duration::from_secs(8))
        .jitter(0.0)
        .build()
        .unwrap();
    let (mut svc, _) = stack(&layer);
    let fail = || Reply::Fail(FailureClass::ServerError);
    run(&mut svc, K, fail()).await.unwrap_err();
    let mut seen = Vec::new();
    for _ in 0..5 {
        let wait = run(&mut svc, K, Reply::Ok)
            .await
            .unwrap_err()
            .retry_after()
            .unwrap();
        seen.push(wait.as_secs());
        advance(wait).await;
        run(&mut svc, K, fail()).await.unwrap_err();
    }
    assert_eq!(seen, [1, 2, 4, 8, 8]);
    let wait = run(&mut svc, K, Reply::Ok)
        .await
        .unwrap_err()
        .retry_after()
        .unwrap();
    advance(wait).await;
    run(&mut svc, K, Reply::Ok).await.unwrap();
    run(&mut svc, K, fail()).await.unwrap_err();
    let wait = run(&mut svc, K, Reply::Ok)
        .await
        .unwrap_err()
        .retry_after()
        .unwrap();
    assert_eq!(wait, Duration::from_secs(1), "closing reset the growth");
}

#[tokio::test(start_paused = true)]
async fn jittered_open_durations_stay_within_bounds() {
    let layer = CircuitBreakerLayer::builder()
        .consecutive_failures(1)
        .open_for(Duration::from_secs(10))
        .jitter(0.5)
        .random(SeededRandom::new(7))
        .build()
        .unwrap();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);
    let mut waits = Vec::new();
    for i in 0..20 {
        let key = format!("m{i}");
        run(&mut svc, &key, Reply::Fail(FailureClass::ServerError))
            .await
            .unwrap_err();
        waits.push(handle.snapshot(&key).unwrap().retry_after.unwrap());
    }
    assert!(
        waits
            .iter()
            .all(|w| *w >= Duration::from_secs(5) && *w <= Duration::from_secs(10))
    );
    waits.dedup();
    assert!(waits.len() > 10, "jitter spreads the probes: {waits:?}");
}

fn exhausted(reset: Duration) -> LlmError {
    // No limit given: the window's full reset is the earliest safe moment (with a limit,
    // `RateLimitWindow::wait_for` spreads the refill over the reset).
    let mut snap = RateLimitSnapshot::default();
    snap.requests.remaining = Some(0);
    snap.requests.reset_after = Some(reset);
    LlmError::new(FailureClass::RateLimited, "Rate limit reached for requests")
        .with_status(http::StatusCode::TOO_MANY_REQUESTS)
        .with_rate_limit(snap)
}

#[tokio::test(start_paused = true)]
async fn an_exhausted_rate_limit_opens_it_until_the_reset() {
    let layer = CircuitBreakerLayer::builder()
        .open_on_retry_hint(Duration::from_secs(300))
        .build()
        .unwrap();
    let handle = layer.handle();
    let (mut svc, calls) = stack(&layer);
    let err = run(
        &mut svc,
        K,
        Reply::Error(exhausted(Duration::from_secs(42))),
    )
    .await
    .unwrap_err();
    assert_eq!(err.class(), FailureClass::RateLimited);
    let snap = handle.snapshot(K).unwrap();
    assert_eq!(snap.state, State::Open);
    assert_eq!(snap.retry_after, Some(Duration::from_secs(42)));
    assert_eq!(snap.calls, 0, "the 429 itself is not a failure");
    let err = run(&mut svc, K, Reply::Ok).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::CircuitOpen);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(42)));
    advance(Duration::from_secs(42)).await;
    run(&mut svc, K, Reply::Ok).await.unwrap();
    assert_eq!(handle.state(K), Some(State::Closed));
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // A reset further away than the cap is capped; a retry-after works the same way.
    run(
        &mut svc,
        K,
        Reply::Error(exhausted(Duration::from_secs(3600))),
    )
    .await
    .unwrap_err();
    assert_eq!(
        handle.snapshot(K).unwrap().retry_after,
        Some(Duration::from_secs(300))
    );
    let other = "api.anthropic.com/claude";
    let overloaded =
        LlmError::new(FailureClass::Overloaded, "busy").with_retry_after(Duration::from_secs(7));
    run(&mut svc, other, Reply::Error(overloaded))
        .await
        .unwrap_err();
    assert_eq!(
        handle.snapshot(other).unwrap().retry_after,
        Some(Duration::from_secs(7))
    );

    // Not configured: the same error leaves the breaker closed.
    let layer = CircuitBreakerLayer::new();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);
    run(
        &mut svc,
        K,
        Reply::Error(exhausted(Duration::from_secs(42))),
    )
    .await
    .unwrap_err();
    assert_eq!(handle.state(K), Some(State::Closed));
}

#[tokio::test(start_paused = true)]
async fn keys_are_isolated() {
    let layer = CircuitBreakerLayer::new();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);
    let (sick, well) = ("api.openai.com/gpt-4o", "api.openai.com/gpt-4o-mini");
    open_it(&mut svc).await;
    assert_eq!(handle.state(sick), Some(State::Open));
    for _ in 0..50 {
        run(&mut svc, well, Reply::Ok).await.unwrap();
    }
    assert_eq!(handle.state(well), Some(State::Closed));
    // Another service made by the same layer shares the breakers.
    let (mut other, _) = stack(&layer);
    assert_eq!(
        class_of(run(&mut other, sick, Reply::Ok).await),
        Some(FailureClass::CircuitOpen)
    );
    let keys: Vec<_> = handle.snapshots().into_iter().map(|s| s.key).collect();
    assert_eq!(keys.iter().map(|k| &**k).collect::<Vec<_>>(), [sick, well]);
}

#[tokio::test(start_paused = true)]
async fn keys_are_capped_and_idle_ones_evicted() {
    let layer = CircuitBreakerLayer::builder()
        .max_keys(2)
        .idle_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);
    run(&mut svc, "a", Reply::Ok).await.unwrap();
    advance(Duration::from_secs(50)).await;
    run(&mut svc, "b", Reply::Ok).await.unwrap();
    advance(Duration::from_secs(20)).await;
    // "a" has been idle 70 s: evicted for "c"; "b" stays.
    run(&mut svc, "c", Reply::Ok).await.unwrap();
    assert_eq!(handle.len(), 2);
    assert_eq!(handle.state("a"), None);
    assert!(handle.state("b").is_some() && handle.state("c").is_some());
    // Nothing idle: the least recently used closed key ("b") goes.
    advance(Duration::from_secs(5)).await;
    run(&mut svc, "c", Reply::Ok).await.unwrap();
    run(&mut svc, "d", Reply::Ok).await.unwrap();
    assert_eq!(handle.state("b"), None);
    assert_eq!(handle.len(), 2);
    // Open keys are never evicted: the new key shares the overflow breaker instead.
    open_key(&mut svc, "c").await;
    open_key(&mut svc, "d").await;
    run(&mut svc, "e", Reply::Ok).await.unwrap();
    assert_eq!(handle.state("e"), None);
    assert_eq!(handle.state(OVERFLOW_KEY), Some(State::Closed));
    assert_eq!(handle.snapshot(OVERFLOW_KEY).unwrap().calls, 1);
    assert_eq!(handle.state("c"), Some(State::Open));
    assert_eq!(handle.state("d"), Some(State::Open));
    // A manual key may exceed the cap and is kept.
    handle.set_mode("f", Mode::ForcedOpen);
    assert_eq!(handle.len(), 3);
    advance(Duration::from_secs(3600)).await;
    run(&mut svc, "g", Reply::Ok).await.unwrap();
    assert_eq!(handle.state("f"), Some(State::ForcedOpen));
    assert_eq!(
        handle.state("c"),
        Some(State::Open),
        "idle open keys stay too"
    );
    assert_eq!(handle.state("g"), None);
}

#[tokio::test(start_paused = true)]
async fn overflow_keys_share_one_breaker_that_trips() {
    let layer = CircuitBreakerLayer::builder().max_keys(1).build().unwrap();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);
    open_key(&mut svc, "a").await;
    // The table is full of an open key: "b" and "c" share the overflow breaker.
    for _ in 0..5 {
        run(&mut svc, "b", Reply::Fail(FailureClass::ServerError))
            .await
            .unwrap_err();
    }
    assert_eq!(handle.state(OVERFLOW_KEY), Some(State::Open));
    assert_eq!(
        class_of(run(&mut svc, "c", Reply::Ok).await),
        Some(FailureClass::CircuitOpen)
    );
    assert_eq!(handle.len(), 1);
    assert!(
        handle
            .snapshots()
            .iter()
            .any(|s| &*s.key == OVERFLOW_KEY && s.state == State::Open)
    );
    // The handle steers the overflow breaker by its name.
    handle.set_mode(OVERFLOW_KEY, Mode::Disabled);
    run(&mut svc, "c", Reply::Ok).await.unwrap();
    assert_eq!(handle.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_overflow_breaker_can_be_forced_open_before_first_use() {
    let layer = CircuitBreakerLayer::builder().max_keys(1).build().unwrap();
    let handle = layer.handle();
    let (mut svc, _) = stack(&layer);
    handle.set_mode(OVERFLOW_KEY, Mode::ForcedOpen);
    assert_eq!(handle.len(), 0);
    open_key(&mut svc, "a").await;
    assert_eq!(
        class_of(run(&mut svc, "b", Reply::Ok).await),
        Some(FailureClass::CircuitOpen)
    );
}

async fn open_key(svc: &mut Svc, key: &str) {
    for _ in 0..5 {
        run(svc, key, Reply::Fail(FailureClass::ServerError))
            .await
            .unwrap_err();
    }
}

#[tokio::test(start_paused = true)]
async fn set_mode_all_reaches_new_keys_too() {
    let layer = CircuitBreakerLayer::new();
    let handle = layer.handle();
    let (mut svc, calls) = stack(&layer);
    run(&mut svc, "a", Reply::Ok).await.unwrap();
    handle.set_mode_all(Mode::ForcedOpen);
    for key in ["a", "b"] {
        assert_eq!(
            class_of(run(&mut svc, key, Reply::Ok).await),
            Some(FailureClass::CircuitOpen)
        );
    }
    handle.set_mode_all(Mode::Normal);
    run(&mut svc, "b", Reply::Ok).await.unwrap();
    run(&mut svc, "c", Reply::Ok).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert!(handle.remove("c"));
    assert!(!handle.remove("c"));
}

#[tokio::test(start_paused = true)]
async fn a_rejection_is_reported_to_the_call_context() {
    let layer = CircuitBreakerLayer::new();
    let (mut svc, _) = stack(&layer);
    layer.handle().set_mode(K, Mode::ForcedOpen);
    let cx = Arc::new(CallContext::new());
    let mut a = ask(K, Reply::Ok);
    a.ext.insert(cx.clone());
    let err = svc.ready().await.unwrap().call(a).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::CircuitOpen);
    assert_eq!(cx.snapshot().rejections, [FailureClass::CircuitOpen]);
}

#[tokio::test(start_paused = true)]
async fn http_requests_are_keyed_by_host_and_model() {
    let layer = CircuitBreakerLayer::new();
    let handle = layer.handle();
    let mut svc = layer.layer(tower::service_fn(|_req: http::Request<Bytes>| async {
        Err::<http::Response<String>, _>(LlmError::new(FailureClass::Connect, "refused"))
    }));
    let req = || {
        http::Request::post("https://api.openai.com/v1/chat/completions")
            .body(Bytes::from_static(br#"{"model":"gpt-4o","messages":[]}"#))
            .unwrap()
    };
    for _ in 0..5 {
        svc.ready().await.unwrap().call(req()).await.unwrap_err();
    }
    assert_eq!(handle.state("api.openai.com/gpt-4o"), Some(State::Open));
}

#[test]
fn a_key_opened_through_one_thread_is_open_for_every_thread() {
    // Calls hold their key's breaker through per-thread handles, and a service remembers its
    // last key: whatever thread a service (or its clone) runs on, the key has one breaker.
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    };
    let layer = CircuitBreakerLayer::new();
    let (mut svc, calls) = stack(&layer);
    let main = rt();
    main.block_on(async {
        run(&mut svc, K, Reply::Ok).await.unwrap();
        run(&mut svc, K, Reply::Ok).await.unwrap();
    });
    let mut moved = svc.clone();
    std::thread::spawn(move || rt().block_on(open_it(&mut moved)))
        .join()
        .unwrap();
    let err = main.block_on(run(&mut svc, K, Reply::Ok)).unwrap_err();
    assert_eq!(err.class(), FailureClass::CircuitOpen);
    assert_eq!(layer.handle().state(K), Some(State::Open));
    assert_eq!(calls.load(Ordering::SeqCst), 7);
}
