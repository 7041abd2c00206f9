//! A request a fallback stands by for (`seawall_core::Standby`) is not held for a long wait
//! before a retry: the retry layer gives up at once and the fallback answers instead.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{Mock, err, rate_limited, secs, server_error};
use seawall_core::{FailureClass, GiveUp, LlmError, Standby};
use seawall_retry::{BackoffRetryBuilder, BackoffRetryLayer, Jitter};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

/// A standby wait of 1 s, the gate's default.
fn builder() -> BackoffRetryBuilder {
    BackoffRetryLayer::builder().seed(7).standby_wait(secs(1.0))
}

fn request(standby: bool) -> http::Request<Bytes> {
    let mut req = http::Request::post("http://upstream.test/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Bytes::from_static(
            br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#,
        ))
        .unwrap();
    Standby::set(&mut req, standby);
    req
}

fn overloaded() -> LlmError {
    err(FailureClass::Overloaded, 529)
}

/// Fails once with `first`, then answers.
fn once_then_ok(first: fn() -> LlmError) -> Mock {
    Mock::new(move |n| if n == 0 { Err(first()) } else { Ok("ok") })
}

async fn call<S>(svc: &mut S, req: http::Request<Bytes>) -> Result<&'static str, LlmError>
where
    S: Service<http::Request<Bytes>, Response = &'static str, Error = LlmError>,
{
    ServiceExt::<http::Request<Bytes>>::ready(svc)
        .await?
        .call(req)
        .await
}

#[tokio::test(start_paused = true)]
async fn an_overloads_wait_is_not_held_when_a_fallback_stands_by() {
    let layer = builder().build().unwrap();

    // Marked: the 5 s overload minimum is longer than the standby wait; it ends at once,
    // with the upstream's class for the fallback to route.
    let mock = once_then_ok(overloaded);
    let mut svc = layer.layer(mock.clone());
    let start = Instant::now();
    let e = call(&mut svc, request(true)).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(mock.calls(), 1);
    assert_eq!(e.class(), FailureClass::Overloaded);
    assert_eq!(e.give_up(), Some(GiveUp::Standby));

    // Not marked (no fallback, or the chain's last target): the wait is waited out.
    let mock = once_then_ok(overloaded);
    let mut svc = layer.layer(mock.clone());
    let start = Instant::now();
    assert_eq!(call(&mut svc, request(false)).await.unwrap(), "ok");
    assert!(start.elapsed() >= secs(5.0), "{:?}", start.elapsed());
    assert_eq!(mock.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_wait_within_the_standby_wait_is_still_retried() {
    let layer = builder()
        .base_delay(secs(0.2))
        .jitter(Jitter::None)
        .build()
        .unwrap();
    let mock = once_then_ok(server_error);
    let mut svc = layer.layer(mock.clone());
    let start = Instant::now();
    assert_eq!(call(&mut svc, request(true)).await.unwrap(), "ok");
    assert_eq!(start.elapsed(), secs(0.2));
    assert_eq!(mock.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_servers_hint_past_the_standby_wait_goes_to_the_fallback_with_the_hint() {
    fn in_three_seconds() -> LlmError {
        rate_limited().with_retry_after(secs(3.0))
    }
    let mock = once_then_ok(in_three_seconds);
    let mut svc = builder().build().unwrap().layer(mock.clone());
    let e = call(&mut svc, request(true)).await.unwrap_err();
    assert_eq!(e.give_up(), Some(GiveUp::Standby));
    assert_eq!(e.class(), FailureClass::RateLimited);
    assert_eq!(e.retry_after(), Some(secs(3.0)), "the hint is kept");
    assert_eq!(mock.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_longer_standby_wait_lets_the_wait_run_and_it_is_off_by_default() {
    for layer in [
        builder().standby_wait(secs(12.0)).build().unwrap(),
        builder().standby_wait(Duration::MAX).build().unwrap(),
        BackoffRetryLayer::builder().seed(7).build().unwrap(),
    ] {
        let mock = once_then_ok(overloaded);
        let mut svc = layer.layer(mock.clone());
        let start = Instant::now();
        assert_eq!(call(&mut svc, request(true)).await.unwrap(), "ok");
        assert!(start.elapsed() >= secs(5.0));
        assert_eq!(mock.calls(), 2);
    }
}
