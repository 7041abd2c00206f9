//! The context guard: a request too long for its model is dealt with before it is sent.
//!
//! ```text
//! cargo run --example context_guard
//! ```
//!
//! The chaos upstream plays OpenAI with real context windows (gpt-4o 128,000 tokens, gpt-4.1
//! 1,047,576), and the guard reads the same figures from
//! `crates/seawall-guard/context_windows.example.toml`. Three calls with a prompt of about
//! 150,000 tokens:
//!
//! 1. `Refuse` (the default), inside a fallback with a larger-context list: the guard refuses
//!    gpt-4o at once, the fallback switches to gpt-4.1, the guard checks it against gpt-4.1's
//!    window, and only that call goes upstream;
//! 2. `TrimOldest`: the oldest turns of a long conversation are dropped until it fits gpt-4o;
//! 3. `LowerMaxTokens`: a prompt that fits leaves less room than `max_tokens` asks for, so the
//!    bound is lowered to the room left.
//!
//! After each, the call record (its `context_guard` field) and what the upstream saw.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::BodyExt;
use seawall::classify::ClassifyLayer;
use seawall::fallback::{FallbackLayer, Target};
use seawall::guard::{ContextGuardLayer, ContextPolicy, ContextWindows};
use seawall::mock::{MockUpstream, Profile};
use seawall::observe::{CallRecord, ObserveLayer};
use tower::{ServiceBuilder, ServiceExt};

/// About `tokens` tokens of prose (4 characters a token).
fn prose(tokens: usize) -> String {
    "the sea ".repeat(tokens / 2)
}

fn chat(body: serde_json::Value) -> http::Request<Bytes> {
    http::Request::post("http://mock/v1/chat/completions")
        .header("authorization", "Bearer sk-example")
        .body(Bytes::from(body.to_string()))
        .expect("a valid request")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), seawall::core::BoxError> {
    let windows = ContextWindows::from_file(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/seawall-guard/context_windows.example.toml"
    ))?;
    let upstream = MockUpstream::new(
        Profile::default()
            .model_context_window("gpt-4o", 128_000)
            .model_context_window("gpt-4.1", 1_047_576),
    );
    let last = Arc::new(Mutex::new(None::<CallRecord>));
    let seen = last.clone();
    let observe = ObserveLayer::builder()
        .recorder(move |r: &CallRecord| *seen.lock().expect("not poisoned") = Some(r.clone()))
        .build()?;
    let record = || {
        let r = last.lock().expect("not poisoned").take().expect("a record");
        format!(
            "context_guard: {}, served by: {}, attempts: {}",
            r.context_guard.map_or("-".to_owned(), |a| a.to_string()),
            r.served_model.as_deref().unwrap_or("-"),
            r.attempts
        )
    };

    // 1. Refuse, and let the fallback's larger-context list take it.
    let client = ServiceBuilder::new()
        .layer(observe.clone())
        .layer(
            FallbackLayer::builder()
                .larger_context(Target::model("gpt-4.1"))
                .build()?,
        )
        .layer(ContextGuardLayer::new(windows.clone()))
        .layer(ClassifyLayer::new())
        .service(upstream.clone());
    let ask = chat(serde_json::json!({"model": "gpt-4o", "max_tokens": 1000,
        "messages": [{"role": "user", "content": prose(150_000)}]}));
    let answer = client.oneshot(ask).await?;
    answer.into_body().collect().await?;
    println!("1. refuse + fallback: {}", record());
    let stats = upstream.stats();
    println!(
        "   upstream: {} request(s), {} context-length error(s)",
        stats.requests, stats.context_length
    );

    // 2. Trim the oldest turns of a long conversation.
    let client = ServiceBuilder::new()
        .layer(observe.clone())
        .layer(
            ContextGuardLayer::builder(windows.clone())
                .policy(ContextPolicy::TrimOldest)
                .build()?,
        )
        .layer(ClassifyLayer::new())
        .service(upstream.clone());
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "You are a careful reader."})];
    for i in 0..30 {
        messages.push(serde_json::json!({"role": "user", "content": format!("chapter {i}: {}", prose(5_000))}));
        messages.push(
            serde_json::json!({"role": "assistant", "content": format!("noted chapter {i}")}),
        );
    }
    messages.push(serde_json::json!({"role": "user", "content": "Who is the villain?"}));
    let ask =
        chat(serde_json::json!({"model": "gpt-4o", "max_tokens": 1000, "messages": messages}));
    let answer = client.oneshot(ask).await?;
    answer.into_body().collect().await?;
    println!("2. trim oldest:       {}", record());

    // 3. Lower max_tokens to the room the prompt leaves (at least 256).
    let client = ServiceBuilder::new()
        .layer(observe)
        .layer(
            ContextGuardLayer::builder(windows)
                .policy(ContextPolicy::lower_max_tokens(256))
                .build()?,
        )
        .layer(ClassifyLayer::new())
        .service(upstream.clone());
    let ask = chat(serde_json::json!({"model": "gpt-4o", "max_tokens": 16_000,
        "messages": [{"role": "user", "content": prose(120_000)}]}));
    let answer = client.oneshot(ask).await?;
    answer.into_body().collect().await?;
    println!("3. lower max_tokens:  {}", record());
    let stats = upstream.stats();
    println!(
        "   upstream in all: {} request(s), {} context-length error(s)",
        stats.requests, stats.context_length
    );
    Ok(())
}
