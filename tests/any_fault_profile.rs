//! The recommended stack's promises under any fault profile, not only the demo's: the chaos
//! upstream is given random rates of every fault it knows (error statuses, streams cut with
//! or without an abort, error events mid-stream, HTML 502s, truncated JSON, 200s holding an
//! error, empty answers, keep-alives, slow heads and first tokens), and concurrent OpenAI and
//! Anthropic calls, streamed and not, go through the stack on paused time. For every call:
//!
//! - it ends, and so does its body (within an hour);
//! - an answer whose body ends without an error is whole: a stream ends with its finish
//!   marker and a finish reason, a JSON answer has its finish reason and text, and no error
//!   event rides inside a stream handed over as a success;
//! - one call record is written per call, and the budget never spends past its limit.
//!
//! Each proptest case is one profile and one workload drawn from a seed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use proptest::prelude::*;
use seawall::breaker::CircuitBreakerLayer;
use seawall::budget::{Budget, CostBudgetLayer, Price, PriceTable, Usd};
use seawall::cache::{CacheLayer, MemoryStore};
use seawall::classify::ClassifyLayer;
use seawall::continuation::ContinueLayer;
use seawall::fallback::{FallbackLayer, Target, box_response};
use seawall::gate::ConcurrencyGateLayer;
use seawall::guard::{ContextGuardLayer, ContextWindows, ModelLimits};
use seawall::mock::{
    Count, Delay, ErrorRule, KeepAliveStyle, MalformedKind, MockUpstream, Profile,
};
use seawall::observe::{CallRecord, ObserveLayer};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::StreamTimeoutLayer;
use seawall_test_support::Draws;
use tower::{ServiceBuilder, ServiceExt};

/// Calls per profile, started 50 ms apart.
const CALLS: u64 = 40;

/// A profile with a random rate of every fault.
fn profile(r: &mut Draws) -> Profile {
    let kinds = [
        MalformedKind::Html502,
        MalformedKind::TruncatedJson,
        MalformedKind::Error200,
        MalformedKind::Empty,
    ];
    let mut profile = Profile::default()
        .seed(r.next_u64())
        .head_latency(Delay::fixed(r.ms(500)))
        .first_token_latency(Delay::fixed(r.ms(3_000)))
        .per_token_latency(Delay::fixed(r.ms(100)))
        .output_tokens(Count::range(1, 1 + r.below(300) as u32))
        .keepalives(
            r.rate(0.5),
            Duration::from_millis(200) + r.ms(2_000),
            KeepAliveStyle::Comment,
        )
        .cut_streams(
            r.rate(0.4),
            Count::range(0, 1 + r.below(100) as u32),
            r.below(2) == 0,
        )
        .mid_stream_errors(r.rate(0.3), Count::range(0, 1 + r.below(50) as u32))
        .malformed(r.rate(0.3), &kinds[..1 + r.below(4)]);
    for _ in 0..r.below(3) {
        let statuses = [429, 500, 502, 503, 504, 529, 400, 401, 403, 408];
        let status = *r.pick(&statuses);
        profile = profile.error(ErrorRule::random(status, r.rate(0.4)));
    }
    profile
}

/// Whether `body` is a whole answer of its wire format; the body itself when it is not.
fn whole(body: &[u8], stream: bool, anthropic: bool) -> Result<(), String> {
    let text = String::from_utf8_lossy(body);
    let whole = if stream {
        let ended = if anthropic {
            text.contains("event: message_stop") && text.contains("\"stop_reason\":\"")
        } else {
            text.trim_end().ends_with("data: [DONE]") && text.contains("\"finish_reason\":\"")
        };
        ended && !text.contains("\"error\":{")
    } else {
        serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| {
            let (finish, answer) = if anthropic {
                (&v["stop_reason"], &v["content"][0]["text"])
            } else {
                (
                    &v["choices"][0]["finish_reason"],
                    &v["choices"][0]["message"]["content"],
                )
            };
            finish.is_string() && answer.as_str().is_some_and(|t| !t.is_empty())
        })
    };
    if whole {
        Ok(())
    } else {
        Err(text.into_owned())
    }
}

/// One call: its request drawn from `r`, sent after `delay`. `Err` names a broken promise.
async fn call<S, B>(client: S, delay: Duration, r: &mut Draws) -> Result<(), String>
where
    S: tower::Service<http::Request<Bytes>, Response = http::Response<B>>,
    B: http_body::Body,
{
    let stream = r.below(2) == 0;
    let anthropic = r.below(2) == 0;
    let question = r.below(1_000);
    let (uri, model) = if anthropic {
        ("https://api.anthropic.com/v1/messages", "claude-haiku-4-5")
    } else {
        ("https://api.openai.com/v1/chat/completions", "gpt-4o")
    };
    let body = serde_json::json!({
        "model": model,
        "max_tokens": 200,
        "stream": stream,
        "messages": [{"role": "user", "content": format!("question {question}")}],
    });
    let mut req = http::Request::post(uri).header("content-type", "application/json");
    if anthropic {
        req = req.header("anthropic-version", "2023-06-01");
    }
    let req = req.body(Bytes::from(body.to_string())).unwrap();

    tokio::time::sleep(delay).await;
    let hour = Duration::from_secs(3600);
    let Ok(answer) = tokio::time::timeout(hour, client.oneshot(req)).await else {
        return Err("the call did not end within an hour".into());
    };
    // A failed call is allowed: the faults may leave nothing to answer with.
    let Ok(resp) = answer else { return Ok(()) };
    let status = resp.status();
    let Ok(read) = tokio::time::timeout(hour, resp.into_body().collect()).await else {
        return Err("the body did not end within an hour".into());
    };
    // A body that fails says so: the caller knows the answer is not whole.
    let Ok(read) = read else { return Ok(()) };
    if !status.is_success() {
        return Err(format!("a {status} handed over as an answer"));
    }
    whole(&read.to_bytes(), stream, anthropic)
        .map_err(|body| format!("not whole (stream {stream}, anthropic {anthropic}): {body}"))
}

async fn one_profile(seed: u64) -> Result<(), String> {
    let mut r = Draws::new(seed);
    let upstream = MockUpstream::new(profile(&mut r));
    let records: Arc<Mutex<Vec<CallRecord>>> = Arc::default();
    let sink = records.clone();
    let limit = Usd::from_dollars(1);
    let budget = CostBudgetLayer::builder(
        PriceTable::new().with_default(Price::per_million_f64(2.5, 10.0).unwrap()),
    )
    .budget(Budget::total("total", limit))
    .build()
    .unwrap();
    let windows =
        ContextWindows::new().with("gpt-4o", ModelLimits::new(128_000).with_max_output(16_384));
    let client = ServiceBuilder::new()
        .layer(
            ObserveLayer::builder()
                .recorder(move |record: &CallRecord| sink.lock().unwrap().push(record.clone()))
                .build()
                .unwrap(),
        )
        .layer(CacheLayer::new(MemoryStore::new()))
        .layer(ContinueLayer::new())
        .layer(FallbackLayer::new([Target::model("gpt-4o-mini")]))
        .map_response(box_response)
        .layer(ContextGuardLayer::new(windows))
        .layer(BackoffRetryLayer::new())
        .layer(budget.clone())
        .layer(CircuitBreakerLayer::new())
        .layer(ConcurrencyGateLayer::new(8))
        .layer(StreamTimeoutLayer::new())
        .layer(ClassifyLayer::default())
        .service(upstream);

    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let client = client.clone();
            let mut r = Draws::new(r.next_u64());
            tokio::spawn(async move { call(client, Duration::from_millis(50 * i), &mut r).await })
        })
        .collect();
    for done in calls {
        done.await.map_err(|e| format!("a call panicked: {e}"))??;
    }
    let spent = budget.spend("total", None).unwrap().spent;
    if spent > limit {
        return Err(format!("spent {spent:?} past the limit of {limit:?}"));
    }
    let written = records.lock().unwrap().len() as u64;
    if written != CALLS {
        return Err(format!("{written} call records for {CALLS} calls"));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn under_any_fault_profile_an_answer_that_ends_cleanly_is_whole(seed in any::<u64>()) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let outcome = rt.block_on(one_profile(seed));
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}

#[test]
fn the_wholeness_check_tells_a_cut_answer_from_a_whole_one() {
    let sse = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n\
               data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    assert!(whole(sse.as_bytes(), true, false).is_ok());
    let cut = &sse[..sse.find("data: {\"choices\":[{\"delta\":{}").unwrap()];
    assert!(whole(cut.as_bytes(), true, false).is_err());
    let json = r#"{"choices":[{"message":{"content":"Hi"},"finish_reason":"stop"}]}"#;
    assert!(whole(json.as_bytes(), false, false).is_ok());
    let empty = r#"{"choices":[{"message":{"content":""},"finish_reason":"stop"}]}"#;
    assert!(whole(empty.as_bytes(), false, false).is_err());
    let anthropic = r#"{"content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn"}"#;
    assert!(whole(anthropic.as_bytes(), false, true).is_ok());
    assert!(whole(&anthropic.as_bytes()[..30], false, true).is_err());
}
