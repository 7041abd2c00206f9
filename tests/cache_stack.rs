//! The cache in the recommended stack (observe → cache → fallback → retry → budget → breaker →
//! gate → stream → classify), over the in-process chaos upstream on paused time: a hit makes
//! no upstream call, takes no attempt and no permit, is never charged by the budget, and is
//! recorded once as `cache: hit` with zero cost and the answer's usage; a streamed request is
//! served from a non-streamed answer as a stream ending with `[DONE]`.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::BodyExt;
use seawall::breaker::CircuitBreakerLayer;
use seawall::budget::{Budget, CostBudgetLayer, Price, PriceTable, Usd};
use seawall::cache::{CacheLayer, CacheStatus, MemoryStore};
use seawall::classify::ClassifyLayer;
use seawall::fallback::{FallbackLayer, Target, box_response};
use seawall::gate::ConcurrencyGateLayer;
use seawall::mock::{MockUpstream, Profile};
use seawall::observe::{CallRecord, ObserveLayer};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::StreamTimeoutLayer;
use tower::{ServiceBuilder, ServiceExt};

fn ask(stream: bool) -> http::Request<Bytes> {
    let mut body = serde_json::json!({
        "model": "gpt-4o",
        "max_tokens": 64,
        "temperature": 0,
        "stream": stream,
        "messages": [{"role": "user", "content": "How long is a piece of string?"}],
    });
    if stream {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    http::Request::post("https://api.openai.com/v1/chat/completions")
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_hit_in_the_recommended_stack_costs_no_call_no_attempt_and_no_budget() {
    let upstream = MockUpstream::new(Profile::default().seed(5));
    let records: Arc<Mutex<Vec<CallRecord>>> = Arc::default();
    let sink = records.clone();
    let budget = CostBudgetLayer::builder(
        PriceTable::new().with_default(Price::per_million_f64(2.5, 10.0).unwrap()),
    )
    .budget(Budget::total("total", Usd::from_dollars(10)))
    .build()
    .unwrap();
    let client = ServiceBuilder::new()
        .layer(
            ObserveLayer::builder()
                .recorder(move |r: &CallRecord| sink.lock().unwrap().push(r.clone()))
                .build()
                .unwrap(),
        )
        .layer(CacheLayer::new(MemoryStore::new()))
        .layer(FallbackLayer::new([Target::model("gpt-4o-mini")]))
        .map_response(box_response)
        .layer(BackoffRetryLayer::new())
        .layer(budget.clone())
        .layer(CircuitBreakerLayer::new())
        .layer(ConcurrencyGateLayer::new(4))
        .layer(StreamTimeoutLayer::new())
        .layer(ClassifyLayer::default())
        .service(upstream.clone());

    let first = client.clone().oneshot(ask(false)).await.unwrap();
    let answer = first.into_body().collect().await.unwrap().to_bytes();
    let spent = budget.spend("total", None).unwrap().spent;
    assert!(spent > Usd::ZERO, "the miss was charged");

    let hit = client.clone().oneshot(ask(true)).await.unwrap();
    assert_eq!(
        hit.extensions().get::<CacheStatus>(),
        Some(&CacheStatus::Hit)
    );
    let replay = hit.into_body().collect().await.unwrap().to_bytes();
    assert!(replay.ends_with(b"data: [DONE]\n\n"), "a complete stream");
    let text = |v: serde_json::Value| v["choices"][0]["message"]["content"].clone();
    let original: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert!(
        String::from_utf8_lossy(&replay).contains(&serde_json::to_string(&text(original)).unwrap()),
        "the stream carries the stored text"
    );

    assert_eq!(
        upstream.stats().requests,
        1,
        "the hit made no upstream call"
    );
    let after = budget.spend("total", None).unwrap();
    assert_eq!(after.spent, spent, "the budget never saw the hit");
    assert_eq!(after.reserved, Usd::ZERO);

    let records = records.lock().unwrap();
    let [miss, hit] = &records[..] else {
        panic!("one record per call: {records:#?}");
    };
    assert_eq!(miss.cache, Some(CacheStatus::Miss));
    assert_eq!(miss.attempts, 1);
    assert!(miss.cost_usd.is_some_and(|c| c > 0.0));
    assert_eq!(hit.cache, Some(CacheStatus::Hit));
    assert_eq!(hit.attempts, 0);
    assert_eq!(hit.cost_usd, Some(0.0));
    assert_eq!(hit.usage, miss.usage, "the hit reports the answer's usage");
    assert_eq!(hit.queue_wait, None, "no permit was taken");
}
