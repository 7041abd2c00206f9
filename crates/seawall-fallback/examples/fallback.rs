//! A primary model that is overloaded for a while, a smaller model on the same provider, and
//! another provider behind its own stack; a degraded answer when everything is down.
//!
//! Run with `cargo run -p seawall-fallback --example fallback`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use seawall_core::{FailureClass, LlmError, LlmRequest, ServedBy};
use seawall_fallback::{FallbackLayer, LastResort, ResponseCache, Target, box_response};
use tower::{ServiceBuilder, ServiceExt};

type Resp = Response<UnsyncBoxBody<Bytes, LlmError>>;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // Call numbers at which each upstream fails: the primary's big model for calls 0..3, the
    // whole first provider for calls 5..8, the second provider for calls 6..8.
    let calls = Arc::new(AtomicUsize::new(0));
    let clock = calls.clone();
    let openai = tower::service_fn(move |req: Request<Bytes>| {
        let n = clock.load(Ordering::SeqCst);
        async move {
            let model = req.model().unwrap_or("?").to_owned();
            if (5..8).contains(&n) || (n < 3 && model == "gpt-4o") {
                return Err(LlmError::new(
                    FailureClass::Overloaded,
                    "529 overloaded_error",
                ));
            }
            Ok(Response::new(Full::new(Bytes::from(format!(
                "{{\"model\":\"{model}\"}}"
            )))))
        }
    });
    let clock = calls.clone();
    let anthropic = tower::service_fn(move |_req: Request<Bytes>| {
        let n = clock.load(Ordering::SeqCst);
        async move {
            if (6..8).contains(&n) {
                return Err(LlmError::new(FailureClass::ServerError, "500"));
            }
            Ok(Response::new(Full::new(Bytes::from_static(
                b"{\"model\":\"claude\"}",
            ))))
        }
    })
    // Another stack, another body type: box both so they serve in one chain.
    .map_response(box_response);

    let fallback = FallbackLayer::builder()
        .target(Target::model("gpt-4o-mini"))
        .target(Target::service("anthropic", anthropic).with_model("claude-haiku-4-5"))
        .deadline(Duration::from_secs(120))
        .cache(ResponseCache::new(Duration::from_secs(300)))
        .degraded(|_req, err: &LlmError| -> Resp {
            let msg = format!("{{\"degraded\":\"{}\"}}", err.message());
            box_response(Response::new(Full::new(Bytes::from(msg))))
        })
        .build()
        .expect("the fallback settings are valid");
    let client = ServiceBuilder::new()
        .layer(fallback)
        .map_response(box_response)
        .service(openai);

    for n in 0..9 {
        calls.store(n, Ordering::SeqCst);
        // Call 6 repeats call 4's question (a cached answer exists); call 7 is new.
        let prompt = match n {
            7 => "a new question".to_owned(),
            _ => format!("question {}", n % 2),
        };
        let body =
            format!(r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"{prompt}"}}]}}"#);
        let req = Request::post("https://api.openai.com/v1/chat/completions")
            .body(Bytes::from(body))
            .unwrap();
        match client.clone().oneshot(req).await {
            Ok(resp) => {
                let by = resp.extensions().get::<ServedBy>().cloned().unwrap();
                let how = match resp.extensions().get::<LastResort>() {
                    Some(LastResort::Cached { age, .. }) => format!(" (cached, {age:?} old)"),
                    Some(_) => " (degraded)".to_owned(),
                    None => String::new(),
                };
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                println!(
                    "call {n}: served by {} [{}]{how}: {}",
                    by.target,
                    by.model.as_deref().unwrap_or("-"),
                    String::from_utf8_lossy(&body)
                );
            }
            Err(e) => println!("call {n}: error {e}"),
        }
    }
}
