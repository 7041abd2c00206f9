//! Exports seawall's per-call metrics in the Prometheus text format.
//!
//! `cargo run -p seawall-observe --example prometheus`
//!
//! A real service would serve `handle.render()` on `/metrics` (an axum route, say); here a few
//! simulated calls go through the layer and the scrape output is printed.
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use metrics_exporter_prometheus::PrometheusBuilder;
use seawall_core::{FailureClass, LlmError, LlmRequest};
use seawall_observe::{MetricsRecorder, ObserveLayer};
use tower::{Service, ServiceBuilder, ServiceExt};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("no other metrics recorder is installed");
    let mut svc = ServiceBuilder::new()
        .layer(
            ObserveLayer::builder()
                .recorder(MetricsRecorder::new())
                .build()
                .expect("the observe settings are valid"),
        )
        .service_fn(|req: http::Request<Bytes>| async move {
            // Stand-in upstream: every third call is rate limited after two attempts.
            let n = req.estimated_input_tokens();
            if let Some(cx) = req.call_context() {
                cx.update(|f| f.attempts = 1 + u32::from(n % 3 == 0));
            }
            tokio::time::sleep(Duration::from_millis(20 + u64::from(n))).await;
            if n % 3 == 0 {
                return Err(LlmError::new(FailureClass::RateLimited, "slow down"));
            }
            Ok::<_, LlmError>(http::Response::new(Full::new(Bytes::from("{}"))))
        });
    for i in 0..12 {
        let body = format!(
            r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"{}"}}]}}"#,
            "x".repeat(i * 4)
        );
        let req = http::Request::post("http://localhost/v1/chat/completions")
            .body(Bytes::from(body))
            .unwrap();
        if let Ok(resp) = svc.ready().await.unwrap().call(req).await {
            // The record is complete when the body has been read to its end.
            let _ = resp.into_body().collect().await;
        }
    }
    println!("{}", handle.render());
}
