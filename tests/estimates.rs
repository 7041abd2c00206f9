//! A cost budget in front of the in-process chaos upstream, on paused time, with requests that
//! ask for several answers (`n`), which the upstream generates and bills in full.
//!
//! The budget's promise only holds if a reservation bounds what the upstream can bill: at
//! every admission settled spend plus reservations stays within the limit, so spend ends within
//! it, and the spend is exactly what the per-attempt records (and the upstream's own bill) add
//! up to.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use seawall::FailureClass;
use seawall::budget::{Budget, CostBudgetLayer, MemorySink, Price, PriceTable, Usd};
use seawall::classify::ClassifyLayer;
use seawall::core::Usage;
use seawall::mock::{Count, Delay, MockUpstream, Profile};
use seawall_test_support::AuditStore;
use tower::{ServiceBuilder, ServiceExt};

const CALLS: usize = 300;
const MAX_TOKENS: u32 = 200;

fn price() -> Price {
    Price::per_million_f64(2.5, 10.0).unwrap()
}

fn ask(i: usize) -> http::Request<Bytes> {
    let body = serde_json::json!({
        "model": "gpt-4o",
        "n": 1 + i % 8,
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": format!("Name {i} sea birds")}],
    });
    http::Request::post("https://api.openai.com/v1/chat/completions")
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_for_n_answers_never_push_spend_past_the_limit() {
    // Every answer uses its whole maximum, so each call bills n × 200 output tokens: 300 calls
    // could bill about $2.70, against a $1 limit.
    let upstream = MockUpstream::new(
        Profile::default()
            .seed(5)
            .output_tokens(Count::fixed(MAX_TOKENS))
            .first_token_latency(Delay::fixed(Duration::from_millis(300)))
            .per_token_latency(Delay::fixed(Duration::from_millis(2))),
    );
    let store = Arc::new(AuditStore::default());
    let sink = Arc::new(MemorySink::new());
    let limit = Usd::from_dollars(1);
    let budget = CostBudgetLayer::builder(PriceTable::new().with("gpt-4o", price()))
        .budget(Budget::total("total", limit))
        .store(store.clone())
        .sink(sink.clone())
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(budget.clone())
        .layer(ClassifyLayer::default())
        .service(upstream.clone());

    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let resp = client.oneshot(ask(i)).await?;
                resp.into_body().collect().await.map(drop)
            })
        })
        .collect();
    let mut refused = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(()) => {}
            Err(e) => {
                assert_eq!(e.class(), FailureClass::BudgetExceeded, "{e}");
                refused += 1;
            }
        }
    }

    assert!(refused > 0, "the limit was reached");
    assert!(store.admissions.load(Ordering::Relaxed) > 0);
    assert_eq!(store.violations.load(Ordering::Relaxed), 0);
    let records = sink.records();
    assert_eq!(records.len(), CALLS);
    for r in &records {
        assert!(r.cost_nanos <= r.reserved_nanos, "{r:?}");
    }
    let spent = budget.spend("total", None).unwrap().spent;
    assert!(spent <= limit, "spent {spent} of {limit}");
    let recorded: u64 = records.iter().map(|r| r.cost_nanos).sum();
    assert_eq!(spent.as_nanos(), recorded);
    // And it is what the upstream billed: every answer of every admitted call.
    let billed = upstream.stats();
    let bill = price().cost(&Usage {
        input_tokens: billed.input_tokens,
        output_tokens: billed.output_tokens,
        cached_input_tokens: 0,
        cache_write_input_tokens: 0,
        cache_write_1h_input_tokens: 0,
    });
    assert_eq!(spent, bill);
    assert_eq!(
        billed.output_tokens % u64::from(MAX_TOKENS),
        0,
        "whole answers"
    );
}
