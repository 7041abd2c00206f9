//! A caller that waits 2 s, against an upstream in a 529 storm: with its deadline on the
//! request (`x-seawall-timeout: 2`, or a `Deadline` extension set in code), the stack fails
//! fast with `DeadlineExceeded` instead of retrying for its whole time budget and then
//! falling back, all for an answer nobody would read.
//!
//! ```text
//! cargo run --example deadline
//! ```
//!
//! The upstream is the chaos upstream in process, and the run is on tokio's paused clock, so
//! the minute of virtual time the call without a deadline takes passes in milliseconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use seawall::breaker::CircuitBreakerLayer;
use seawall::classify::ClassifyLayer;
use seawall::core::{BoxError, Deadline, TIMEOUT_HEADER};
use seawall::fallback::{FallbackLayer, Target};
use seawall::gate::ConcurrencyGateLayer;
use seawall::mock::{ErrorRule, MockUpstream, Profile};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::StreamTimeoutLayer;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};

fn request(timeout: Option<&str>) -> Result<http::Request<Bytes>, BoxError> {
    let mut req = http::Request::post("https://api.openai.com/v1/chat/completions");
    if let Some(t) = timeout {
        // What the caller will wait, in seconds. The OpenAI and Anthropic SDKs send their own
        // timeout as `x-stainless-timeout`, gRPC clients as `grpc-timeout`; both work too.
        req = req.header(TIMEOUT_HEADER, t);
    }
    let body = r#"{"model":"gpt-4o","max_tokens":64,"stream":true,
                   "messages":[{"role":"user","content":"Hello"}]}"#;
    Ok(req.body(Bytes::from_static(body.as_bytes()))?)
}

fn main() -> Result<(), BoxError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?
        .block_on(run())
}

async fn run() -> Result<(), BoxError> {
    // Every call is answered 529 (overloaded).
    let upstream = MockUpstream::new(Profile::default().error(ErrorRule::random(529, 1.0)));
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = attempts.clone();
    let client = ServiceBuilder::new()
        .layer(FallbackLayer::new([Target::model("gpt-4o-mini")]))
        .layer(
            BackoffRetryLayer::builder()
                .time_budget(Duration::from_secs(60))
                .build()?,
        )
        .layer(CircuitBreakerLayer::new())
        .layer(ConcurrencyGateLayer::new(16))
        .layer(StreamTimeoutLayer::new())
        .layer(ClassifyLayer::new())
        .map_request(move |req: http::Request<Bytes>| {
            counted.fetch_add(1, Ordering::Relaxed);
            req
        })
        .service(upstream);

    for (label, req) in [
        ("with a 2 s deadline", request(Some("2"))?),
        ("without a deadline ", request(None)?),
    ] {
        attempts.store(0, Ordering::Relaxed);
        let start = Instant::now();
        let outcome = client.clone().oneshot(req).await;
        let took = start.elapsed().as_secs_f64();
        let n = attempts.load(Ordering::Relaxed);
        match outcome {
            Ok(resp) => println!("{label}: {} after {took:.1} s", resp.status()),
            Err(e) => println!(
                "{label}: {} after {took:.1} s and {n} upstream attempt{}",
                e.class(),
                if n == 1 { "" } else { "s" }
            ),
        }
    }

    // In code, the same deadline is an extension (an outer layer may set it too).
    let mut req = request(None)?;
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_secs(2)));
    let err = client.oneshot(req).await.expect_err("the storm goes on");
    println!("a Deadline extension : {}", err.class());
    Ok(())
}
