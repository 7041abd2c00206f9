//! The call record, integrated: with the real layers stacked over the in-process chaos upstream on
//! paused time, each field of the observe layer's `CallRecord` is filled by the layer that knows
//! it: the queue wait by the gate, the attempts by the retry layer, the cost by the budget, the
//! time to first token and per output token by the stream layer and the classifier, the serving
//! target by the fallback. A stack without a gate has no queue time rather than a wrong one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use seawall::budget::{Budget, CostBudgetLayer, Price, PriceTable, Usd};
use seawall::classify::ClassifyLayer;
use seawall::core::Usage;
use seawall::fallback::{FallbackLayer, Target};
use seawall::gate::ConcurrencyGateLayer;
use seawall::mock::{Delay, ErrorRule, MockUpstream, Profile};
use seawall::observe::{CallOutcome, CallRecord, ObserveLayer};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::StreamTimeoutLayer;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

const FIRST_TOKEN: Duration = Duration::from_millis(400);
const PER_TOKEN: Duration = Duration::from_millis(50);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A healthy upstream with fixed latencies: 16 output tokens, the first after 400 ms, then one
/// every 50 ms.
fn profile() -> Profile {
    Profile::default()
        .seed(9)
        .first_token_latency(Delay::fixed(FIRST_TOKEN))
        .per_token_latency(Delay::fixed(PER_TOKEN))
}

fn ask(model: &str) -> http::Request<Bytes> {
    let body = serde_json::json!({
        "model": model,
        "max_tokens": 64,
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "How long is a piece of string?"}],
    });
    http::Request::post("https://api.openai.com/v1/chat/completions")
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

fn price() -> Price {
    Price::per_million_f64(2.5, 10.0).unwrap()
}

fn budget() -> CostBudgetLayer {
    CostBudgetLayer::builder(PriceTable::new().with_default(price()))
        .budget(Budget::total("total", Usd::from_dollars(10)))
        .build()
        .unwrap()
}

fn retry() -> BackoffRetryLayer {
    BackoffRetryLayer::builder().seed(3).build().unwrap()
}

type Records = Arc<Mutex<Vec<CallRecord>>>;

fn observe(records: &Records) -> ObserveLayer {
    let records = records.clone();
    ObserveLayer::builder()
        .config_version("e2e-1")
        .recorder(move |r: &CallRecord| records.lock().unwrap().push(r.clone()))
        .build()
        .unwrap()
}

fn only(records: &Records) -> CallRecord {
    let all = records.lock().unwrap();
    assert_eq!(all.len(), 1, "one record per logical call: {all:#?}");
    all[0].clone()
}

#[tokio::test(start_paused = true)]
async fn every_field_is_filled_by_the_layer_that_knows_it() {
    // The upstream answers 529 for its first three seconds.
    let upstream = MockUpstream::new(profile().error(ErrorRule::outage(529, secs(0), secs(3))));
    let records = Records::default();
    let gate = ConcurrencyGateLayer::builder()
        .limit(1)
        .max_wait(secs(60))
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(observe(&records))
        .layer(FallbackLayer::new([Target::model("gpt-4o-mini")]))
        .layer(retry())
        .layer(budget())
        .layer(gate.clone())
        .layer(StreamTimeoutLayer::new())
        .layer(ClassifyLayer::default())
        .service(upstream.clone());

    // Another caller holds the gate's only permit for two seconds.
    let mut holder = gate.layer(tower::service_fn(|_req: http::Request<Bytes>| async {
        Ok::<_, seawall::LlmError>(http::Response::new(http_body_util::Full::new(Bytes::from(
            "{}",
        ))))
    }));
    let held = holder
        .ready()
        .await
        .unwrap()
        .call(ask("other"))
        .await
        .unwrap();

    let call = tokio::spawn(async move {
        let resp = client.oneshot(ask("gpt-4o")).await.unwrap();
        resp.into_body().collect().await.unwrap().to_bytes()
    });
    tokio::time::sleep(secs(2)).await;
    drop(held);
    let body = call.await.unwrap();
    assert!(body.ends_with(b"data: [DONE]\n\n"));

    let r = only(&records);
    // Gate: the first attempt queued behind the holder for exactly its two seconds.
    assert_eq!(r.queue_wait, Some(secs(2)));
    // Retry: the first attempt (at t = 2 s, inside the outage) got a 529, the second answered.
    assert_eq!(r.attempts, 2);
    assert_eq!(r.retries(), 1);
    // Classify: the usage of the final chunk; stream: first token and pace of the final attempt.
    let usage = r.usage.expect("usage from the stream's last chunk");
    assert_eq!(usage.output_tokens, 16);
    assert!(usage.input_tokens > 0);
    assert_eq!(r.time_to_first_token, Some(FIRST_TOKEN));
    assert_eq!(r.time_per_output_token, Some(PER_TOKEN));
    // Budget: exactly the priced usage of the answered attempt (the 529 cost nothing).
    let cost = r.cost_usd.expect("cost from the budget layer");
    assert!(
        (cost - price().cost(&usage).as_f64()).abs() < 1e-12,
        "{cost}"
    );
    // Fallback: the primary served, no fallback.
    assert_eq!(r.target.as_deref(), Some("primary"));
    assert!(!r.fallback && !r.degraded);
    // Observe itself and the response head.
    assert_eq!(r.outcome, CallOutcome::Success);
    assert_eq!((r.status, r.class), (Some(200), None));
    assert_eq!(r.model.as_deref(), Some("gpt-4o"));
    assert_eq!(r.served_model.as_deref(), Some("gpt-4o"));
    assert!(
        r.request_id
            .as_deref()
            .is_some_and(|id| id.starts_with("req_"))
    );
    assert_eq!(r.config_version.as_deref(), Some("e2e-1"));
    assert!(r.latency >= secs(2) + FIRST_TOKEN);
    assert_eq!(upstream.stats().status(529), 1);
}

#[tokio::test(start_paused = true)]
async fn a_fallback_records_the_target_and_model_that_served() {
    let upstream = MockUpstream::new(profile().error(ErrorRule::random(529, 1.0).model("gpt-4o")));
    let records = Records::default();
    let client = ServiceBuilder::new()
        .layer(observe(&records))
        .layer(FallbackLayer::new([Target::model("gpt-4o-mini")]))
        .layer(retry())
        .layer(budget())
        .layer(ConcurrencyGateLayer::new(4))
        .layer(StreamTimeoutLayer::new())
        .layer(ClassifyLayer::default())
        .service(upstream.clone());

    let resp = client.oneshot(ask("gpt-4o")).await.unwrap();
    resp.into_body().collect().await.unwrap();

    let r = only(&records);
    assert_eq!(r.target.as_deref(), Some("gpt-4o-mini"));
    assert_eq!(r.served_model.as_deref(), Some("gpt-4o-mini"));
    assert_eq!(r.model.as_deref(), Some("gpt-4o"));
    assert!(r.fallback && !r.degraded);
    assert_eq!(r.outcome, CallOutcome::Success);
    // The primary's four attempts (one call and three overload retries), then the fallback's.
    assert_eq!(upstream.stats().requests, 5);
    // No contention: the gate reports a zero wait, not a missing one.
    assert_eq!(r.queue_wait, Some(Duration::ZERO));
    assert_eq!(r.time_to_first_token, Some(FIRST_TOKEN));
}

#[tokio::test(start_paused = true)]
async fn a_stack_without_a_gate_has_no_queue_time() {
    let upstream = MockUpstream::new(profile());
    let records = Records::default();
    let client = ServiceBuilder::new()
        .layer(observe(&records))
        .layer(retry())
        .layer(StreamTimeoutLayer::new())
        .layer(ClassifyLayer::default())
        .service(upstream);

    let resp = client.oneshot(ask("gpt-4o")).await.unwrap();
    resp.into_body().collect().await.unwrap();

    let r = only(&records);
    assert_eq!(r.queue_wait, None, "no gate, no queue time");
    assert_eq!(r.cost_usd, None, "no budget, no cost");
    assert_eq!(r.target, None, "no fallback, no target");
    assert_eq!(r.attempts, 1);
    assert_eq!(r.time_to_first_token, Some(FIRST_TOKEN));
    assert_eq!(r.time_per_output_token, Some(PER_TOKEN));
    assert_eq!(
        r.usage.map(|u: Usage| u.output_tokens),
        Some(16),
        "usage still comes from the classifier"
    );
}
