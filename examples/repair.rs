//! Repair turns: an answer that fails validation gets a new turn that shows the model its
//! answer and what was wrong, instead of a blind retry.
//!
//! ```text
//! cargo run --example repair
//! ```
//!
//! Two calls, through observe → repair → retry → classify:
//!
//! 1. an in-process "model" that first answers in prose, and answers JSON once it is told
//!    what was wrong: the layer repairs it on the second turn, and the record says
//!    `repairs: 1`;
//! 2. the chaos upstream (in process), whose answers are never JSON: the layer gives up after
//!    two repair turns with a `ContentInvalid` error listing every answer's complaint.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use seawall::classify::ClassifyLayer;
use seawall::mock::{MockUpstream, Profile};
use seawall::observe::{CallRecord, ObserveLayer};
use seawall::repair::{ContentInvalid, RepairLayer, require_fields};
use seawall::retry::BackoffRetryLayer;
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt};

const REQUEST: &str = r#"{"model": "gpt-4o-mini", "max_tokens": 100,
    "messages": [{"role": "system", "content": "Reply with a JSON object: city, country."},
                 {"role": "user", "content": "Where is the Vigeland park?"}]}"#;

/// A model that needs to be told: prose first, JSON once a message says what was wrong.
async fn model(req: http::Request<Bytes>) -> Result<http::Response<Full<Bytes>>, Infallible> {
    let body: Value = serde_json::from_slice(req.body()).unwrap_or_default();
    let turns = body["messages"].as_array().map_or(0, Vec::len);
    println!("  model sees {turns} messages");
    let text = if turns > 2 {
        let last = &body["messages"][turns - 1]["content"];
        println!("  the repair message: {last}");
        r#"{"city": "Oslo", "country": "Norway"}"#
    } else {
        "The Vigeland park is in Oslo, Norway."
    };
    let answer = json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}});
    Ok(http::Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(answer.to_string())))
        .expect("a valid response"))
}

fn request() -> http::Request<Bytes> {
    http::Request::post("http://localhost/v1/chat/completions")
        .header("authorization", "Bearer sk-example")
        .body(Bytes::from_static(REQUEST.as_bytes()))
        .expect("a valid request")
}

fn observe(records: &Arc<Mutex<Vec<CallRecord>>>) -> ObserveLayer {
    let sink = records.clone();
    ObserveLayer::builder()
        .recorder(move |r: &CallRecord| sink.lock().unwrap().push(r.clone()))
        .build()
        .expect("a valid observe layer")
}

#[tokio::main]
async fn main() -> Result<(), seawall::core::BoxError> {
    let records = Arc::new(Mutex::new(Vec::new()));
    let repair = RepairLayer::new(require_fields(&["city", "country"]));

    println!("1. a model that answers prose first");
    let stack = ServiceBuilder::new()
        .layer(observe(&records))
        .layer(repair.clone())
        .layer(BackoffRetryLayer::new())
        .layer(ClassifyLayer::new())
        .service(tower::service_fn(model));
    let resp = stack.oneshot(request()).await?;
    let body: Value = serde_json::from_slice(&resp.into_body().collect().await?.to_bytes())?;
    println!(
        "  answer: {}",
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
    );
    if let Some(r) = records.lock().unwrap().last() {
        println!(
            "  record: repairs {}, attempts {}, retries {}",
            r.repairs,
            r.attempts,
            r.retries()
        );
    }

    println!("2. a model that never answers JSON (the chaos upstream's lorem ipsum)");
    let mock = MockUpstream::new(Profile::default());
    let stack = ServiceBuilder::new()
        .layer(observe(&records))
        .layer(repair)
        .layer(BackoffRetryLayer::new())
        .layer(ClassifyLayer::new())
        .service(mock.clone());
    match stack.oneshot(request()).await {
        Ok(_) => println!("  unexpectedly valid"),
        Err(e) => {
            println!("  error: {e}");
            for (i, text) in ContentInvalid::of(&e)
                .map(ContentInvalid::errors)
                .unwrap_or_default()
                .iter()
                .enumerate()
            {
                println!("    answer {}: {text}", i + 1);
            }
        }
    }
    println!("  the upstream got {} requests", mock.stats().requests);
    if let Some(r) = records.lock().unwrap().last() {
        println!(
            "  record: class {:?}, repairs {}",
            r.class.map(|c| c.as_str()),
            r.repairs
        );
    }
    Ok(())
}
