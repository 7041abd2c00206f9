//! The caller's deadline through the recommended stack, end to end: observe, cache, fallback,
//! retry, budget, breaker, gate, stream timeouts and classify over the in-process chaos
//! upstream, on paused time. A caller that waits 12 s (`x-seawall-timeout`) against an
//! upstream in a 529 storm gets `DeadlineExceeded` by its deadline, and the upstream sees no
//! attempt started after it; the same call without the header runs on through the retry
//! layer's budget and the fallback chain.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use seawall::breaker::CircuitBreakerLayer;
use seawall::budget::{Budget, CostBudgetLayer, MissingMaxOutput, Price, PriceTable, Usd};
use seawall::cache::{CacheLayer, MemoryStore};
use seawall::classify::ClassifyLayer;
use seawall::core::{FailureClass, GiveUp, LlmError, TIMEOUT_HEADER};
use seawall::fallback::{FallbackLayer, Target};
use seawall::gate::ConcurrencyGateLayer;
use seawall::mock::{Delay, ErrorRule, MockUpstream, Profile};
use seawall::observe::{CallOutcome, CallRecord, ObserveLayer};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::StreamTimeoutLayer;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};

type Stack = BoxCloneService<http::Request<Bytes>, http::Response<()>, LlmError>;

/// When each upstream attempt started.
type Starts = Arc<Mutex<Vec<Instant>>>;

/// The longest wait the retry layer takes after an overload: 5 s and up to 10 % of jitter.
const OVERLOAD_WAIT: Duration = Duration::from_millis(5_500);

/// The recommended stack (README), over `upstream`, noting when each attempt starts.
fn stack(upstream: MockUpstream, starts: &Starts, records: &Arc<Mutex<Vec<CallRecord>>>) -> Stack {
    let starts = starts.clone();
    let records = records.clone();
    let prices = PriceTable::new()
        .with("gpt-4o", Price::per_million_f64(2.5, 10.0).unwrap())
        .with("gpt-4o-mini", Price::per_million_f64(0.15, 0.6).unwrap());
    let svc = ServiceBuilder::new()
        .map_response(|resp: http::Response<_>| resp.map(|_| ()))
        .layer(
            ObserveLayer::builder()
                .recorder(move |r: &CallRecord| records.lock().unwrap().push(r.clone()))
                .build()
                .unwrap(),
        )
        .layer(CacheLayer::new(MemoryStore::new()))
        .layer(FallbackLayer::new([Target::model("gpt-4o-mini")]))
        .layer(
            BackoffRetryLayer::builder()
                .seed(11)
                .time_budget(Duration::from_secs(60))
                .build()
                .unwrap(),
        )
        .layer(
            CostBudgetLayer::builder(prices)
                .budget(Budget::daily("daily", Usd::from_dollars(20)))
                .missing_max_output(MissingMaxOutput::Default(1024))
                .build()
                .unwrap(),
        )
        .layer(CircuitBreakerLayer::new())
        .layer(
            ConcurrencyGateLayer::builder()
                .limit(16)
                .max_queue(256)
                .build()
                .unwrap(),
        )
        .layer(
            StreamTimeoutLayer::builder()
                .first_token(Duration::from_secs(20))
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::new())
        .map_request(move |req: http::Request<Bytes>| {
            starts.lock().unwrap().push(Instant::now());
            req
        })
        .service(upstream);
    BoxCloneService::new(svc)
}

fn ask(timeout: Option<&str>) -> http::Request<Bytes> {
    let mut req = http::Request::post("https://api.openai.com/v1/chat/completions");
    if let Some(t) = timeout {
        req = req.header(TIMEOUT_HEADER, t);
    }
    req.body(Bytes::from_static(
        br#"{"model":"gpt-4o","max_tokens":64,"stream":true,
             "messages":[{"role":"user","content":"Are you there?"}]}"#,
    ))
    .unwrap()
}

fn storm() -> MockUpstream {
    MockUpstream::new(
        Profile::default()
            .seed(5)
            .error(ErrorRule::random(529, 1.0).statuses(&[529, 503])),
    )
}

#[tokio::test(start_paused = true)]
async fn a_deadline_shorter_than_the_retry_budget_ends_a_529_storm_by_the_deadline() {
    let (starts, records) = (Starts::default(), Arc::default());
    let client = stack(storm(), &starts, &records);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(12);
    let err = client
        .oneshot(ask(Some("12")))
        .await
        .expect_err("the storm never lets a call through");
    let ended = Instant::now();

    assert_eq!(err.class(), FailureClass::DeadlineExceeded, "{err}");
    // The retry loop saw that its next wait would not fit and stopped at once, rather than
    // sleeping into the deadline for an outer layer to cut.
    assert_eq!(err.give_up(), Some(GiveUp::DeadlineTooClose), "{err}");
    assert!(ended < deadline, "before the deadline: {:?}", ended - t0);
    assert!(
        deadline - ended < OVERLOAD_WAIT,
        "within one backoff of it: ended at {:?}",
        ended - t0
    );
    let starts = starts.lock().unwrap().clone();
    assert!(!starts.is_empty());
    assert!(
        starts.iter().all(|t| *t < deadline),
        "no attempt started past the deadline: {:?}",
        starts.iter().map(|t| *t - t0).collect::<Vec<_>>()
    );
    let records = records.lock().unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].outcome, CallOutcome::Failed);
    assert_eq!(records[0].class, Some(FailureClass::DeadlineExceeded));
    assert!(
        !records[0].fallback,
        "no fallback was started for a caller out of time"
    );
}

#[tokio::test(start_paused = true)]
async fn without_a_deadline_the_same_call_runs_on_past_it() {
    // The contrast that shows the header did the work above: the retry budget and the fallback
    // chain keep the call going well past 12 s, with more attempts.
    let (starts, records) = (Starts::default(), Arc::default());
    let client = stack(storm(), &starts, &records);
    let t0 = Instant::now();
    let err = client.oneshot(ask(None)).await.unwrap_err();
    assert_ne!(err.class(), FailureClass::DeadlineExceeded, "{err}");
    assert!(t0.elapsed() > Duration::from_secs(12), "{:?}", t0.elapsed());
    let late = starts
        .lock()
        .unwrap()
        .iter()
        .filter(|t| **t >= t0 + Duration::from_secs(12))
        .count();
    assert!(late > 0, "attempts after 12 s");
}

#[tokio::test(start_paused = true)]
async fn a_slow_first_token_is_cut_at_the_deadline_not_at_the_layers_20_s() {
    let slow = MockUpstream::new(
        Profile::default()
            .seed(5)
            .first_token_latency(Delay::fixed(Duration::from_secs(30))),
    );
    let (starts, records) = (Starts::default(), Arc::default());
    let client = stack(slow, &starts, &records);
    let t0 = Instant::now();
    let err = client.oneshot(ask(Some("4.5"))).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::DeadlineExceeded, "{err}");
    assert_eq!(t0.elapsed(), Duration::from_millis(4_500));
    assert_eq!(
        starts.lock().unwrap().len(),
        1,
        "one attempt, never retried"
    );
}
