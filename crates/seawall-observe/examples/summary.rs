//! Prints a summary of calls: P50/P95/P99 latency and time to first token, retry rate, error
//! rate by class and cost.
//!
//! `cargo run -p seawall-observe --example summary`
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use seawall_core::{FailureClass, LlmError, LlmRequest};
use seawall_observe::{ObserveLayer, Summary};
use tower::{Service, ServiceBuilder, ServiceExt};

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    let summary = Arc::new(Summary::new());
    let mut svc = ServiceBuilder::new()
        .layer(
            ObserveLayer::builder()
                .shared_recorder(summary.clone())
                .build()
                .expect("the observe settings are valid"),
        )
        .service_fn(|req: http::Request<Bytes>| async move {
            // A stand-in upstream with a latency tail, some retries, costs and failures.
            let n = u64::from(req.estimated_input_tokens());
            if let Some(cx) = req.call_context() {
                cx.update(|f| {
                    f.attempts = 1 + u32::from(n % 7 == 0);
                    f.cost_usd = Some(0.0004 * n as f64);
                    f.time_to_first_token = Some(Duration::from_millis(150 + n * 3));
                });
            }
            tokio::time::sleep(Duration::from_millis(200 + (n * n) % 900)).await;
            match n % 25 {
                0 => Err(LlmError::new(FailureClass::Overloaded, "overloaded")),
                13 => Err(LlmError::new(
                    FailureClass::ContextLengthExceeded,
                    "too long",
                )),
                _ => Ok::<_, LlmError>(http::Response::new(Full::new(Bytes::from("{}")))),
            }
        });
    for i in 0..500 {
        let body = format!(
            r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"{}"}}]}}"#,
            "x".repeat((i * 37) % 400)
        );
        let req = http::Request::post("http://localhost/v1/chat/completions")
            .body(Bytes::from(body))
            .unwrap();
        if let Ok(resp) = svc.ready().await.unwrap().call(req).await {
            // The record is complete when the body has been read to its end.
            let _ = resp.into_body().collect().await;
        }
    }
    print!("{}", summary.report());
}
