//! One answer, even when it was cut: `ContinueLayer` against the embedded chaos upstream.
//!
//! ```text
//! cargo run --example continuation
//! ```
//!
//! Two calls through observe → continue → retry → stream timeouts → classify → the chaos
//! upstream (in process, no sockets):
//!
//! 1. a non-streamed answer with `max_tokens: 8` to a model that has 40 words to say: the
//!    layer asks the model to go on (an instruction on the OpenAI wire: plain OpenAI has no
//!    continuation support) and returns one answer, its text joined, its usage summed;
//! 2. a streamed answer to an Anthropic-style upstream whose streams are cut mid-way half of
//!    the time: instead of a `StreamInterrupted` error, the caller's stream goes on with the
//!    continuation (an assistant prefill), without a duplicated word.
//!
//! After each call it prints the observe layer's record: `continuations` and `resumed` count
//! the follow-up requests.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use seawall::classify::ClassifyLayer;
use seawall::continuation::ContinueLayer;
use seawall::mock::{Count, MockUpstream, Profile};
use seawall::observe::{CallRecord, ObserveLayer};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::StreamTimeoutLayer;
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let profile = Profile::default()
        .seed(4)
        .output_tokens(Count::fixed(40))
        .cut_streams(0.5, Count::range(3, 12), true);
    let upstream = MockUpstream::new(profile);

    let records: Arc<Mutex<Vec<CallRecord>>> = Arc::default();
    let sink = records.clone();
    let stack = ServiceBuilder::new()
        .layer(
            ObserveLayer::builder()
                .recorder(move |r: &CallRecord| sink.lock().unwrap().push(r.clone()))
                .build()?,
        )
        .layer(ContinueLayer::builder().max_continuations(6).build()?)
        .layer(BackoffRetryLayer::new())
        .layer(
            StreamTimeoutLayer::builder()
                .first_token(Duration::from_secs(20))
                .build()?,
        )
        .layer(ClassifyLayer::new())
        .service(upstream);

    // 1. Cut by max_tokens, continued.
    let ask = json!({"model": "gpt-4o-mini", "max_tokens": 8,
                     "messages": [{"role": "user", "content": "Tell me about the sea"}]});
    let req = http::Request::post("http://mock/v1/chat/completions")
        .header("authorization", "Bearer sk-example")
        .body(Bytes::from(ask.to_string()))?;
    let resp = stack.clone().oneshot(req).await?;
    let answer: Value = serde_json::from_slice(&resp.into_body().collect().await?.to_bytes())?;
    println!("1. max_tokens 8, continued:");
    println!("   text:   {}", answer["choices"][0]["message"]["content"]);
    println!("   finish: {}", answer["choices"][0]["finish_reason"]);
    println!("   usage:  {}", answer["usage"]);
    report(&records);

    // 2. A stream cut mid-way, resumed.
    let ask = json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "stream": true,
                     "messages": [{"role": "user", "content": "Tell me about the sea"}]});
    for attempt in 1..=3 {
        let req = http::Request::post("http://mock/v1/messages")
            .header("x-api-key", "sk-ant-example")
            .header("anthropic-version", "2023-06-01")
            .body(Bytes::from(ask.to_string()))?;
        let resp = stack.clone().oneshot(req).await?;
        let mut body = resp.into_body();
        print!("2.{attempt} streamed: ");
        while let Some(frame) = body.frame().await {
            let frame = match frame {
                Ok(f) => f,
                Err(e) => {
                    println!("\n   error: {e}");
                    break;
                }
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            for line in String::from_utf8_lossy(&data).lines() {
                let Some(event) = line.strip_prefix("data: ") else {
                    continue;
                };
                let Ok(v) = serde_json::from_str::<Value>(event) else {
                    continue;
                };
                if let Some(t) = v.pointer("/delta/text").and_then(Value::as_str) {
                    print!("{t}");
                }
            }
        }
        println!();
        report(&records);
    }
    Ok(())
}

fn report(records: &Mutex<Vec<CallRecord>>) {
    if let Some(r) = records.lock().unwrap().last() {
        println!(
            "   record: outcome {:?}, attempts {}, continuations {}, resumed {}, usage {:?}",
            r.outcome, r.attempts, r.continuations, r.resumed, r.usage
        );
    }
}
