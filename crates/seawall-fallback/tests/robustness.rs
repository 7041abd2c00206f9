//! A caller's bug and extreme settings: a call polled after it finished panics with the
//! shared message, and no deadline or cache lifetime panics a call.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;
use seawall_core::{FailureClass, LlmError, LlmRequest};
use seawall_fallback::{FallbackLayer, ResponseCache, Target};
use seawall_test_support::{extreme_duration as extreme, paused_runtime, poll_twice};
use tower::{Layer, Service, ServiceExt};

type Resp = Response<UnsyncBoxBody<Bytes, LlmError>>;

fn request() -> Request<Bytes> {
    Request::post("https://api.example.com/v1/chat/completions")
        .body(Bytes::from_static(
            br#"{"model":"main","messages":[{"role":"user","content":"hi"}]}"#,
        ))
        .unwrap()
}

fn text(s: &'static str) -> Resp {
    Response::new(
        Full::new(Bytes::from_static(s.as_bytes()))
            .map_err(|e| match e {})
            .boxed_unsync(),
    )
}

/// The model `main` fails with a 503 after `delay` on its first `failures` calls; any other
/// model answers at once.
fn upstream(
    failures: usize,
    delay: Duration,
) -> impl Service<Request<Bytes>, Response = Resp, Error = LlmError> + Clone + Send + 'static {
    let calls = Arc::new(AtomicUsize::new(0));
    tower::service_fn(move |req: Request<Bytes>| {
        let main = req.model() == Some("main");
        let n = if main {
            calls.fetch_add(1, Ordering::SeqCst)
        } else {
            usize::MAX
        };
        async move {
            if n < failures {
                tokio::time::sleep(delay).await;
                Err(LlmError::new(FailureClass::Overloaded, "busy"))
            } else {
                Ok(text("ok"))
            }
        }
    })
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_finished_call_again_panics() {
    let layer = FallbackLayer::new([Target::model("spare")]);
    let mut svc = layer.layer(upstream(0, Duration::ZERO));
    poll_twice(svc.ready().await.unwrap().call(request()));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn no_deadline_or_cache_lifetime_panics_a_call(
        deadline in extreme(),
        ttl in extreme(),
        delay in 0u64..5,
        pause in extreme(),
    ) {
        let rt = paused_runtime();
        let layer = FallbackLayer::builder()
            .target(Target::model("spare"))
            .deadline(deadline)
            .cache(ResponseCache::new(ttl))
            .build()
            .unwrap();
        let answers = rt.block_on(async {
            // The first call is answered by `main` (and cached), the next two fall back.
            let svc = layer.layer(upstream(usize::MAX, Duration::from_secs(delay)));
            let primary = layer.layer(upstream(0, Duration::ZERO));
            let mut answers = vec![primary.oneshot(request()).await.map(drop).map_err(|e| e.class())];
            for _ in 0..2 {
                answers.push(svc.clone().oneshot(request()).await.map(drop).map_err(|e| e.class()));
                tokio::time::advance(pause.min(Duration::from_secs(100 * 365 * 86_400))).await;
            }
            answers
        });
        prop_assert_eq!(&answers[0], &Ok(()));
        for later in &answers[1..] {
            prop_assert!(matches!(later, Ok(()) | Err(FailureClass::DeadlineExceeded)), "{:?}", later);
        }
    }
}
