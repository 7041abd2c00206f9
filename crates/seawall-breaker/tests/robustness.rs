//! A caller's bug and extreme settings: a call polled after it finished panics with the
//! shared message, and no configured duration panics a call.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use proptest::prelude::*;
use seawall_breaker::CircuitBreakerLayer;
use seawall_core::{FailureClass, LlmError};
use seawall_test_support::{extreme_duration as extreme, paused_runtime, poll_twice};
use tower::{Layer, Service, ServiceExt};

type Resp = http::Response<Empty<Bytes>>;

fn req() -> http::Request<Bytes> {
    http::Request::post("https://api.openai.com/v1/chat/completions")
        .body(Bytes::from_static(br#"{"model":"gpt-4o"}"#))
        .unwrap()
}

/// An upstream that fails with a 500 (and this retry hint) while `fail` says so.
fn upstream(
    fail: bool,
    hint: Duration,
) -> impl Service<http::Request<Bytes>, Response = Resp, Error = LlmError> + Clone {
    tower::service_fn(move |_: http::Request<Bytes>| async move {
        if fail {
            Err(LlmError::new(FailureClass::ServerError, "down").with_retry_after(hint))
        } else {
            Ok(Resp::new(Empty::new()))
        }
    })
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_finished_call_again_panics() {
    let mut svc = CircuitBreakerLayer::new().layer(upstream(false, Duration::ZERO));
    poll_twice(svc.ready().await.unwrap().call(req()));
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_rejected_call_again_panics() {
    let layer = CircuitBreakerLayer::builder()
        .consecutive_failures(1)
        .build()
        .unwrap();
    let mut failing = layer.layer(upstream(true, Duration::ZERO));
    let _ = failing.ready().await.unwrap().call(req()).await;
    let mut svc = layer.layer(upstream(false, Duration::ZERO));
    poll_twice(svc.ready().await.unwrap().call(req()));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn no_duration_setting_panics_a_call(
        window in extreme(),
        slow in extreme(),
        open in extreme(),
        (base, max) in (extreme(), extreme()),
        probe_wait in extreme(),
        hint_cap in extreme(),
        idle in extreme(),
        hint in extreme(),
        pause in extreme(),
    ) {
        let rt = paused_runtime();
        let built = CircuitBreakerLayer::builder()
            .time_window(window)
            .slow_calls(slow, 0.5)
            .open_for(open)
            .open_backoff(base, 2.0, max)
            .max_probe_wait(probe_wait)
            .open_on_retry_hint(hint_cap)
            .idle_timeout(idle)
            .consecutive_failures(1)
            .build();
        let layer = match built {
            Ok(layer) => layer,
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                return Ok(());
            }
        };
        let answers = rt.block_on(async {
            let mut answers = Vec::new();
            for fail in [true, false, false] {
                let svc = layer.layer(upstream(fail, hint));
                answers.push(svc.oneshot(req()).await.map(drop).map_err(|e| e.class()));
                tokio::time::advance(pause.min(Duration::from_secs(100 * 365 * 86_400))).await;
            }
            answers
        });
        prop_assert_eq!(&answers[0], &Err(FailureClass::ServerError));
        for later in &answers[1..] {
            prop_assert!(
                matches!(later, Ok(_) | Err(FailureClass::CircuitOpen)),
                "{:?}",
                later
            );
        }
    }
}
