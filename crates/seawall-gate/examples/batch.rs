//! A batch job of 200 calls through a gate of 8 permits with a 120 RPM limit, against an
//! in-process upstream that answers one 429 with a 2-second hint. Runs on paused time, so it
//! finishes at once and prints what the gate did.
//!
//! `cargo run -p seawall-gate --example batch`

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use seawall_core::{FailureClass, LlmError};
use seawall_gate::{Adaptive, ConcurrencyGateLayer, QueueWait, Rates};
use tower::{ServiceBuilder, ServiceExt, service_fn};

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    let gate = ConcurrencyGateLayer::builder()
        .limit(8)
        .max_queue(500)
        .max_wait(Duration::from_secs(300))
        .rates(Rates::new().requests_per_minute(120))
        .adaptive(Adaptive::new())
        .build()
        .expect("the gate settings are valid");
    let handle = gate.handle();

    let calls = Arc::new(AtomicUsize::new(0));
    let transport = service_fn(move |_req: Request<Bytes>| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(800)).await;
            if n == 30 {
                return Err(
                    LlmError::new(FailureClass::RateLimited, "rate limit reached")
                        .with_status(StatusCode::TOO_MANY_REQUESTS)
                        .with_retry_after(Duration::from_secs(2)),
                );
            }
            Ok(Response::new(Full::new(Bytes::from_static(b"{}"))))
        }
    });
    let svc = ServiceBuilder::new().layer(gate).service(transport);

    let start = tokio::time::Instant::now();
    let jobs: Vec<_> = (0..200)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let req = Request::post("https://api.example.com/v1/chat/completions")
                    .body(Bytes::from_static(
                        br#"{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}"#,
                    ))
                    .expect("a valid request");
                let resp = svc.oneshot(req).await?;
                let wait = resp.extensions().get::<QueueWait>().map(|w| w.0);
                // Reading the body to its end returns the permit and counts as a success for
                // the adaptive mode.
                resp.into_body().collect().await?;
                Ok::<_, LlmError>(wait)
            })
        })
        .collect();
    let (mut ok, mut failed, mut longest) = (0, 0, Duration::ZERO);
    for j in jobs {
        match j.await.expect("the task ran") {
            Ok(wait) => {
                ok += 1;
                longest = longest.max(wait.unwrap_or_default());
            }
            Err(e) => {
                failed += 1;
                println!("failed: {e}");
            }
        }
    }
    let s = handle.stats();
    println!(
        "{ok} ok, {failed} failed in {:?} (virtual); longest queue wait {longest:?}; \
         limit now {} of {}; {} admitted, {} rejected",
        start.elapsed(),
        s.limit,
        s.max_limit,
        s.admitted,
        s.rejected
    );
}
