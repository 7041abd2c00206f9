//! A retry that is waiting to try again when the circuit breaker below it opens.
//!
//! The retry layer sits outside the breaker. A call whose attempt failed waits (after an
//! overload, at least 5 s) while other calls' failures open the breaker. If the breaker will
//! still be open when the wait ends, the attempt the wait is for would only be refused: the
//! call ends as soon as the breaker opens, with that refusal, and a fallback outside answers
//! it at once. If the breaker will have gone half-open by then, the wait goes on as before.
//!
//! Everything runs on tokio's paused clock, so the times asserted are exact.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use seawall::breaker::{CircuitBreakerLayer, Mode};
use seawall::classify::ClassifyLayer;
use seawall::core::{CallContext, FailureClass, GiveUp, LlmError, ServedBy};
use seawall::fallback::{FallbackLayer, Target};
use seawall::mock::{Delay, ErrorRule, MockUpstream, Profile};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::StreamTimeoutLayer;
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};

const KEY: &str = "api.example/gpt-4o";

fn ask() -> http::Request<Bytes> {
    http::Request::post("https://api.example/v1/chat/completions")
        .body(Bytes::from_static(
            br#"{"model":"gpt-4o","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#,
        ))
        .unwrap()
}

/// An upstream that answers every call with a 529 overload after 100 ms, counting the calls.
fn overloaded(
    calls: Arc<AtomicUsize>,
) -> impl Service<
    http::Request<Bytes>,
    Response = http::Response<String>,
    Error = LlmError,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |_req: http::Request<Bytes>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Err::<http::Response<String>, _>(
                LlmError::new(FailureClass::Overloaded, "overloaded")
                    .with_status(http::StatusCode::from_u16(529).unwrap()),
            )
        }
    })
}

/// Retry (defaults: an overload waits at least 5 s) over a breaker that opens after two
/// failures in a row, for `open` without jitter.
fn breaker(open: Duration) -> CircuitBreakerLayer {
    CircuitBreakerLayer::builder()
        .consecutive_failures(2)
        .open_for(open)
        .jitter(0.0)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_retry_waiting_when_the_circuit_opens_ends_at_once_with_the_refusal() {
    let t0 = Instant::now();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = ServiceBuilder::new()
        .layer(BackoffRetryLayer::builder().seed(1).build().unwrap())
        .layer(breaker(Duration::from_secs(30)))
        .service(overloaded(calls.clone()));

    // The first call fails at 0.1 s and waits at least 5 s; the second fails at 0.6 s and
    // opens the breaker (two in a row) for 30 s.
    let context = CallContext::shared();
    let mut req = ask();
    req.extensions_mut().insert(context.clone());
    let first = tokio::spawn(svc.clone().oneshot(req));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = tokio::spawn(svc.clone().oneshot(ask()));

    for call in [first, second] {
        let err = call.await.unwrap().unwrap_err();
        // Ended when the breaker opened, not after the wait, with the breaker's refusal and
        // the failed attempt in its history.
        assert_eq!(t0.elapsed(), Duration::from_millis(600));
        assert_eq!(err.class(), FailureClass::CircuitOpen, "{err:?}");
        assert_eq!(err.give_up(), Some(GiveUp::NotRetryable));
        assert_eq!(err.attempts().len(), 1, "{err:?}");
        assert_eq!(err.attempts()[0].class, FailureClass::Overloaded);
        assert!(
            err.retry_after().unwrap() > Duration::from_secs(29),
            "{err:?}"
        );
    }
    // Neither call sent a second attempt upstream, and the call record has the refusal.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(context.snapshot().rejections, [FailureClass::CircuitOpen]);
}

#[tokio::test(start_paused = true)]
async fn a_circuit_half_open_by_the_end_of_the_wait_does_not_cut_it_short() {
    let t0 = Instant::now();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = breaker(Duration::from_secs(2));
    let svc = ServiceBuilder::new()
        .layer(
            BackoffRetryLayer::builder()
                .max_attempts(2)
                .seed(1)
                .build()
                .unwrap(),
        )
        .layer(layer.clone())
        .service(overloaded(calls.clone()));
    // Another caller of the same breaker, without a retry of its own.
    let other = ServiceBuilder::new()
        .layer(layer)
        .service(overloaded(calls.clone()));

    let first = tokio::spawn(svc.oneshot(ask()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Opens the breaker at 0.6 s until 2.6 s: before the first call's wait ends.
    let opener = other.oneshot(ask()).await.unwrap_err();
    assert_eq!(opener.class(), FailureClass::Overloaded, "{opener:?}");

    let err = first.await.unwrap().unwrap_err();
    // The first call waited its whole 5 s and more, then made its retry: the half-open
    // probe, refused by the upstream again.
    assert!(
        t0.elapsed() >= Duration::from_millis(5_100),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(err.class(), FailureClass::Overloaded, "{err:?}");
    assert_eq!(err.give_up(), Some(GiveUp::AttemptsExhausted), "{err:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_breaker_forced_open_by_hand_ends_the_waits_under_it() {
    let t0 = Instant::now();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = breaker(Duration::from_secs(30));
    let handle = layer.handle();
    let svc = ServiceBuilder::new()
        .layer(BackoffRetryLayer::builder().seed(1).build().unwrap())
        .layer(layer)
        .service(overloaded(calls.clone()));

    let call = tokio::spawn(svc.oneshot(ask()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    handle.set_mode(KEY, Mode::ForcedOpen);

    let err = call.await.unwrap().unwrap_err();
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
    assert_eq!(err.class(), FailureClass::CircuitOpen, "{err:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn calls_waiting_to_retry_fail_over_as_soon_as_the_primary_circuit_opens() {
    let profile = |seed| {
        Profile::default()
            .seed(seed)
            .head_latency(Delay::fixed(Duration::from_millis(200)))
            .first_token_latency(Delay::fixed(Duration::from_millis(300)))
            .per_token_latency(Delay::fixed(Duration::from_millis(10)))
    };
    let primary = MockUpstream::new(profile(1).error(ErrorRule::outage(
        529,
        Duration::ZERO,
        Duration::from_secs(600),
    )));
    let backup = MockUpstream::new(profile(2));
    let stack = |breaker: CircuitBreakerLayer, upstream: MockUpstream| {
        ServiceBuilder::new()
            .layer(BackoffRetryLayer::builder().seed(3).build().unwrap())
            .layer(breaker)
            .layer(StreamTimeoutLayer::new())
            .layer(ClassifyLayer::default())
            .service(upstream)
    };
    let client = ServiceBuilder::new()
        .layer(FallbackLayer::new([Target::service(
            "backup",
            stack(CircuitBreakerLayer::new(), backup.clone()),
        )]))
        .service(stack(breaker(Duration::from_secs(30)), primary.clone()));

    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let resp = client.oneshot(ask()).await.unwrap();
            let served = resp.extensions().get::<ServedBy>().cloned().unwrap();
            resp.into_body().collect().await.unwrap();
            (served.target.to_string(), t0.elapsed())
        }));
        // Each call starts after the one before has failed (a 529 takes 200 ms), so their
        // failures are in a row.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for task in tasks {
        let (target, end) = task.await.unwrap();
        assert_eq!(target, "backup");
        // The second 529 (at 0.45 s) opens the primary's breaker; the first call, waiting
        // since 0.2 s to retry after its overload, moves to the backup then, and the second
        // at once. Without that, each would wait its 5 s first. The third is refused by the
        // open breaker when it starts.
        assert!(end < Duration::from_secs(2), "answered at {end:?}");
    }
    // The primary got the first two calls once each, and none a second time.
    assert_eq!(primary.stats().requests, 2);
    assert_eq!(backup.stats().requests, 3);
}
