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

/// An upstream whose every answer used 20 prompt and 100 completion tokens.
fn fixed_upstream() -> impl tower::Service<
    http::Request<Bytes>,
    Response = http::Response<http_body_util::Full<Bytes>>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(|_req: http::Request<Bytes>| async {
        let body = r#"{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Twice half its length."},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":100,"total_tokens":120}}"#;
        let mut resp = http::Response::new(http_body_util::Full::new(Bytes::from_static(
            body.as_bytes(),
        )));
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        Ok(resp)
    })
}

#[tokio::test(start_paused = true)]
async fn a_budget_and_a_gate_stacked_outside_the_cache_charge_a_hit_nothing() {
    use seawall::gate::{Limit, Rates};
    let budget = CostBudgetLayer::builder(
        PriceTable::new().with_default(Price::per_million_f64(2.5, 10.0).unwrap()),
    )
    .budget(Budget::total("total", Usd::from_dollars(10)))
    .build()
    .unwrap();
    // 300 tokens a minute, all of them at once: the miss uses 120, and each call reserves its
    // prompt's estimate and its 64 tokens of output while it runs.
    let tpm = Limit::per_minute(300).with_burst(300);
    let client = ServiceBuilder::new()
        .layer(budget.clone())
        .layer(
            ConcurrencyGateLayer::builder()
                .limit(4)
                .rates(Rates::new().with_tokens(tpm))
                .build()
                .unwrap(),
        )
        .layer(CacheLayer::new(MemoryStore::new()))
        .layer(ClassifyLayer::default())
        .service(fixed_upstream());
    let call = |req| {
        let client = client.clone();
        async move {
            let resp = client.oneshot(req).await.unwrap();
            let status = resp.extensions().get::<CacheStatus>().copied();
            resp.into_body().collect().await.unwrap();
            status
        }
    };

    assert_eq!(call(ask(false)).await, Some(CacheStatus::Miss));
    let spent = budget.spend("total", None).unwrap().spent;
    assert_eq!(
        spent,
        Usd::from_micros(1_050),
        "20 in at $2.50/M, 100 out at $10/M"
    );

    assert_eq!(call(ask(false)).await, Some(CacheStatus::Hit));
    let after = budget.spend("total", None).unwrap();
    assert_eq!(after.spent, spent, "the hit cost nothing");
    assert_eq!(after.reserved, Usd::ZERO);

    // Charged the hit's 120 tokens, the gate would hold the next question for the tokens
    // to come back (about 4 s); it used none, so the next question goes at once.
    let mut other = ask(false);
    *other.body_mut() = Bytes::from(
        String::from_utf8(other.body().to_vec())
            .unwrap()
            .replace("piece of string", "ball of wool"),
    );
    let start = tokio::time::Instant::now();
    assert_eq!(call(other).await, Some(CacheStatus::Miss));
    assert!(
        start.elapsed() < std::time::Duration::from_millis(100),
        "the next question waited {:?} for tokens the hit never used",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_breaker_stacked_outside_the_cache_does_not_count_a_hit_as_the_upstreams_success() {
    use seawall::core::FailureClass;
    // The stored question's answer came while the upstream was well; every new one fails.
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = calls.clone();
    let upstream = tower::service_fn(move |req: http::Request<Bytes>| {
        let first = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        async move {
            let answer = fixed_upstream().oneshot(req).await?;
            if first {
                return Ok(answer);
            }
            let body = r#"{"error":{"message":"The server had an error","type":"server_error"}}"#;
            let mut resp = http::Response::new(http_body_util::Full::new(Bytes::from_static(
                body.as_bytes(),
            )));
            *resp.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    let client = ServiceBuilder::new()
        .layer(
            CircuitBreakerLayer::builder()
                .failure_rate(0.6)
                .minimum_calls(4)
                .build()
                .unwrap(),
        )
        .layer(CacheLayer::new(MemoryStore::new()))
        .layer(ClassifyLayer::default())
        .service(upstream);
    let question = |n: usize| {
        let mut req = ask(false);
        if n > 0 {
            let body = String::from_utf8(req.body().to_vec()).unwrap();
            *req.body_mut() = Bytes::from(body.replace("piece of string", &format!("rope {n}")));
        }
        req
    };
    // Each call read to its end (an answer is stored when its body ends): its class if it failed.
    let call = |n: usize| {
        let client = client.clone();
        async move {
            let resp = client.oneshot(question(n)).await.map_err(|e| e.class())?;
            resp.into_body().collect().await.unwrap();
            Ok(())
        }
    };

    assert_eq!(call(0).await, Ok(()));
    // Three failures of the upstream, the first two each followed by a hit of the stored answer.
    for n in 1..=2 {
        assert_eq!(call(n).await, Err(FailureClass::ServerError));
        assert_eq!(call(0).await, Ok(()));
    }
    assert_eq!(call(3).await, Err(FailureClass::ServerError));
    // The upstream answered 1 call of 4: the breaker is open. (Counting the two hits as
    // successes, it would have seen 3 failures in 6 calls, under its 60%, and stayed closed.)
    assert_eq!(call(4).await, Err(FailureClass::CircuitOpen));
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 4);
}
