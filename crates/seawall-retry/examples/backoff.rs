//! `BackoffRetryLayer` around a flaky in-process upstream, on virtual time (runs instantly).
//!
//! `cargo run -p seawall-retry --example backoff`

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use http::StatusCode;
use seawall_core::{FailureClass, LlmError, LlmRequest};
use seawall_retry::{BackoffRetryLayer, RetryBudget};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

/// A typed request; `Clone` is cheap because the prompt is shared.
#[derive(Clone)]
struct Ask {
    prompt: Arc<str>,
}

impl LlmRequest for Ask {
    fn model(&self) -> Option<&str> {
        Some("demo-model")
    }
    fn max_output_tokens(&self) -> Option<u32> {
        Some(64)
    }
    fn estimated_input_tokens(&self) -> u32 {
        (self.prompt.len() / 4) as u32
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::pause();
    let layer = BackoffRetryLayer::builder()
        .max_attempts(4)
        .time_budget(Duration::from_secs(60))
        .retry_budget(RetryBudget::new(0.2, 10, Duration::from_secs(10))?)
        .seed(42)
        .build()?;
    let handle = layer.handle();

    // The upstream: a rate limit with a hint, then an overload, then an answer; forever after,
    // a 401.
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let upstream = service_fn(move |ask: Ask| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            match n {
                0 => Err(
                    LlmError::new(FailureClass::RateLimited, "Rate limit reached")
                        .with_status(StatusCode::TOO_MANY_REQUESTS)
                        .with_retry_after(Duration::from_millis(1500)),
                ),
                1 => Err(LlmError::new(FailureClass::Overloaded, "Overloaded")
                    .with_status(StatusCode::SERVICE_UNAVAILABLE)),
                2 => Ok(format!("answer to {:?}", &*ask.prompt)),
                _ => Err(LlmError::new(FailureClass::Authentication, "bad key")
                    .with_status(StatusCode::UNAUTHORIZED)),
            }
        }
    });
    let mut svc = ServiceBuilder::new().layer(layer).service(upstream);

    let start = tokio::time::Instant::now();
    let ask = Ask {
        prompt: Arc::from("why is the sky blue?"),
    };
    let answer = svc.ready().await?.call(ask.clone()).await?;
    println!(
        "{answer} after {} calls, {:.1?} of virtual time",
        calls.load(Ordering::SeqCst),
        start.elapsed()
    );

    // A 401 is final: one call, and the error says why nothing was retried.
    let err = svc.ready().await?.call(ask.clone()).await.unwrap_err();
    println!("{err} (gave up: {:?})", err.give_up());

    // The operator's lever: retries off for every clone of the layer, at once.
    handle.set_enabled(false);
    println!(
        "retries enabled: {}; retries made so far: {}; refused by the retry budget: {}",
        handle.is_enabled(),
        handle.retries(),
        handle.budget_exhausted()
    );
    Ok(())
}
