//! The caller's deadline in the retry loop, on paused time: it cuts the time budget, a wait
//! that would end past it is not slept, no attempt starts past it, and the call ends with
//! `DeadlineExceeded`, the last failure as its source.

mod common;

use std::time::Duration;

use common::{Ask, Mock, err, secs, server_error};
use seawall_core::{Deadline, FailureClass, GiveUp, LlmError, TIMEOUT_HEADER};
use seawall_retry::{BackoffRetryBuilder, BackoffRetryLayer, Jitter};
use tokio::time::{Instant, advance};
use tower::{Layer, ServiceExt};

/// No jitter, no shared retry budget: the waits are 0.5 s, 1 s, 2 s, 4 s, ...
fn builder() -> BackoffRetryBuilder {
    BackoffRetryLayer::builder()
        .seed(7)
        .jitter(Jitter::None)
        .no_retry_budget()
        .max_attempts(20)
        .max_retries(FailureClass::ServerError, 20)
}

fn ask_within(timeout: Duration) -> Ask {
    let mut ask = Ask::default();
    ask.ext.insert(Deadline::after(timeout));
    ask
}

#[tokio::test(start_paused = true)]
async fn a_wait_past_the_deadline_is_not_slept_and_the_call_fails_with_deadline_exceeded() {
    // Attempts at 0, 0.5, 1.5 and 3.5 s; the next wait (4 s) would end at 7.5 s, past the
    // caller's 5 s, though well within the layer's 60 s budget.
    let mock = Mock::failing(server_error);
    let svc = builder()
        .time_budget(secs(60.0))
        .build()
        .unwrap()
        .layer(mock.clone());
    let start = Instant::now();
    let e = svc.oneshot(ask_within(secs(5.0))).await.unwrap_err();
    assert_eq!(
        start.elapsed(),
        secs(3.5),
        "ended at once, not at 5 s nor at 60 s"
    );
    assert_eq!(mock.calls(), 4);
    assert_eq!(e.class(), FailureClass::DeadlineExceeded, "{e}");
    assert_eq!(e.give_up(), Some(GiveUp::DeadlineTooClose));
    assert_eq!(e.attempts().len(), 3, "the earlier attempts' history");
    let last = e
        .source_ref()
        .and_then(|s| s.downcast_ref::<LlmError>())
        .expect("the last failure is the source");
    assert_eq!(last.class(), FailureClass::ServerError);
    assert!(e.message().contains("last error: server_error"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn the_layers_own_budget_still_reports_the_last_error_when_it_is_the_tighter_bound() {
    let mock = Mock::failing(server_error);
    let svc = builder()
        .time_budget(secs(5.0))
        .build()
        .unwrap()
        .layer(mock.clone());
    let e = svc.oneshot(ask_within(secs(60.0))).await.unwrap_err();
    assert_eq!(mock.calls(), 4);
    assert_eq!(e.class(), FailureClass::ServerError, "{e}");
    assert_eq!(e.give_up(), Some(GiveUp::DeadlineTooClose));
}

#[tokio::test(start_paused = true)]
async fn the_deadline_cuts_the_attempt_in_flight_without_a_time_budget() {
    let mock = Mock::failing(server_error).latency(secs(30.0));
    let svc = builder()
        .no_time_budget()
        .build()
        .unwrap()
        .layer(mock.clone());
    let start = Instant::now();
    let e = svc.oneshot(ask_within(secs(2.0))).await.unwrap_err();
    assert_eq!(start.elapsed(), secs(2.0));
    assert_eq!(e.class(), FailureClass::DeadlineExceeded, "{e}");
    assert!(e.message().contains("caller's deadline"), "{e}");
    assert_eq!(mock.dropped(), 1, "the attempt was cancelled");
}

#[tokio::test(start_paused = true)]
async fn a_hint_past_the_deadline_ends_the_call_at_once_and_keeps_the_hint() {
    let mock = Mock::failing(|| err(FailureClass::RateLimited, 429).with_retry_after(secs(8.0)));
    let svc = builder().build().unwrap().layer(mock.clone());
    let start = Instant::now();
    let e = svc.oneshot(ask_within(secs(5.0))).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(mock.calls(), 1);
    assert_eq!(e.class(), FailureClass::DeadlineExceeded);
    assert_eq!(e.retry_after(), Some(secs(8.0)), "when to come back");
}

#[tokio::test(start_paused = true)]
async fn a_call_past_its_deadline_makes_no_attempt() {
    let mock = Mock::new(|_| Ok("ok"));
    let svc = builder().build().unwrap().layer(mock.clone());
    let ask = ask_within(secs(1.0));
    advance(secs(1.0)).await;
    let e = svc.oneshot(ask).await.unwrap_err();
    assert_eq!(e.class(), FailureClass::DeadlineExceeded);
    assert_eq!(mock.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_timeout_header_becomes_the_deadline() {
    let mock = Mock::failing(server_error);
    let svc = builder().build().unwrap().layer(mock.clone());
    let req = http::Request::post("/v1/chat/completions")
        .header(TIMEOUT_HEADER, "2")
        .body(bytes::Bytes::from_static(br#"{"model":"m"}"#))
        .unwrap();
    let start = Instant::now();
    let e = svc.oneshot(req).await.unwrap_err();
    // Attempts at 0, 0.5 and 1.5 s; the next wait (2 s) would end at 3.5 s.
    assert_eq!(start.elapsed(), secs(1.5));
    assert_eq!(e.class(), FailureClass::DeadlineExceeded, "{e}");
    assert!(mock.times().iter().all(|t| *t < start + secs(2.0)));
}
