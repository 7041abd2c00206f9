//! Recovery from a provider outage, end to end: two providers of the chaos upstream; the primary
//! answers 529 for an outage window; every call in the window is answered by the fallback and
//! marked so; when the primary recovers, traffic returns to it.
//!
//! Both providers are in-process `MockUpstream`s on tokio's paused clock, each behind its own
//! stack (retry, breaker, stream timeouts, classify), so the run is deterministic and takes
//! milliseconds of real time although it spans two virtual minutes.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use seawall::breaker::{CircuitBreakerLayer, State};
use seawall::classify::ClassifyLayer;
use seawall::core::ServedBy;
use seawall::fallback::{FallbackLayer, Target};
use seawall::mock::{Delay, ErrorRule, MockUpstream, Profile};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::StreamTimeoutLayer;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};

const OUTAGE_START: Duration = Duration::from_secs(10);
const OUTAGE_END: Duration = Duration::from_secs(60);
const RUN: Duration = Duration::from_secs(150);
const PRIMARY_KEY: &str = "primary.example/gpt-4o";

fn profile(seed: u64) -> Profile {
    Profile::default()
        .seed(seed)
        .first_token_latency(Delay::fixed(Duration::from_millis(300)))
        .per_token_latency(Delay::fixed(Duration::from_millis(10)))
}

fn ask() -> http::Request<Bytes> {
    http::Request::post("https://primary.example/v1/chat/completions")
        .body(Bytes::from_static(
            br#"{"model":"gpt-4o","max_tokens":64,"stream":true,
                 "messages":[{"role":"user","content":"Status report, please."}]}"#,
        ))
        .unwrap()
}

/// One call as the caller saw it.
struct Call {
    start: Duration,
    end: Duration,
    target: String,
    breaker: Option<State>,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>8.3?}..{:>8.3?} {:<7} breaker {:?}",
            self.start, self.end, self.target, self.breaker
        )
    }
}

#[tokio::test(start_paused = true)]
async fn the_fallback_answers_during_an_outage_and_traffic_returns_after_it() {
    let t0 = Instant::now();
    let primary =
        MockUpstream::new(profile(1).error(ErrorRule::outage(529, OUTAGE_START, OUTAGE_END)));
    let backup = MockUpstream::new(profile(2));

    // Each provider has its own retry loop and breaker (the recommended stack, minus the
    // layers this scenario does not need). With a fallback at hand the primary gets one retry,
    // and its breaker stays open longer than the retry layer's overload wait (5 s), so a retry
    // meets the open circuit and the call moves on to the fallback at once.
    let breaker = CircuitBreakerLayer::builder()
        .consecutive_failures(3)
        .open_for(Duration::from_secs(10))
        .build()
        .unwrap();
    let handle = breaker.handle();
    let primary_stack = ServiceBuilder::new()
        .layer(
            BackoffRetryLayer::builder()
                .max_attempts(2)
                .seed(1)
                .build()
                .unwrap(),
        )
        .layer(breaker)
        .layer(StreamTimeoutLayer::new())
        .layer(ClassifyLayer::default())
        .service(primary.clone());
    let backup_stack = ServiceBuilder::new()
        .layer(BackoffRetryLayer::builder().seed(2).build().unwrap())
        .layer(CircuitBreakerLayer::new())
        .layer(StreamTimeoutLayer::new())
        .layer(ClassifyLayer::default())
        .service(backup.clone());
    let client = ServiceBuilder::new()
        .layer(FallbackLayer::new([Target::service(
            "backup",
            backup_stack,
        )]))
        .service(primary_stack);

    // Traffic: a new call every second for two and a half virtual minutes, each read to its
    // end; calls overlap when the primary is slow to fail.
    let mut tasks = Vec::new();
    while t0.elapsed() < RUN {
        let (client, handle) = (client.clone(), handle.clone());
        tasks.push(tokio::spawn(async move {
            let start = t0.elapsed();
            let resp = client
                .oneshot(ask())
                .await
                .unwrap_or_else(|e| panic!("a call at {start:?} was not answered: {e}"));
            let served = resp
                .extensions()
                .get::<ServedBy>()
                .cloned()
                .expect("every answer says who served it");
            assert!(!served.degraded);
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert!(body.ends_with(b"data: [DONE]\n\n"), "a whole answer");
            Call {
                start,
                end: t0.elapsed(),
                target: served.target.to_string(),
                breaker: handle.state(PRIMARY_KEY),
            }
        }));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut calls = Vec::new();
    for task in tasks {
        calls.push(task.await.unwrap());
    }

    let in_outage = |d: Duration| (OUTAGE_START..OUTAGE_END).contains(&d);
    let by = |target: &str| calls.iter().filter(|c| c.target == target).count();
    assert_eq!(by("primary") + by("backup"), calls.len(), "{calls:#?}");

    // Before the outage, the primary answers.
    assert!(
        calls
            .iter()
            .filter(|c| c.end < OUTAGE_START)
            .all(|c| c.target == "primary")
    );
    // Every call made inside the outage is answered by the fallback, and marked so.
    let during: Vec<_> = calls
        .iter()
        .filter(|c| in_outage(c.start) && in_outage(c.end))
        .collect();
    assert!(during.len() >= 40, "{calls:#?}");
    assert!(during.iter().all(|c| c.target == "backup"), "{calls:#?}");
    // The primary never answers from inside its outage.
    assert!(
        calls
            .iter()
            .filter(|c| c.target == "primary")
            .all(|c| c.start < OUTAGE_START || c.end >= OUTAGE_END),
        "{calls:#?}"
    );
    // Its breaker opened, so most outage calls went to the fallback without waiting on it.
    assert!(
        during.iter().any(|c| c.breaker == Some(State::Open)),
        "{calls:#?}"
    );

    // After the outage, traffic returns to the primary and stays there.
    let back = calls
        .iter()
        .position(|c| c.start >= OUTAGE_END && c.target == "primary")
        .expect("traffic returns to the primary");
    assert!(
        calls[back..].iter().all(|c| c.target == "primary"),
        "{calls:#?}"
    );
    assert!(
        calls[back].start < OUTAGE_END + Duration::from_secs(15),
        "back within the breaker's open time and one probe: {calls:#?}"
    );
    assert!(calls.len() - back >= 60);

    // The backup served exactly the calls marked as its own, each in one attempt.
    let b = backup.stats();
    assert_eq!(b.requests as usize, by("backup"));
    assert_eq!(b.streams_completed as usize, by("backup"));
    let p = primary.stats();
    assert_eq!(p.streams_completed as usize, by("primary"));
    assert!(p.status(529) > 0);
}
