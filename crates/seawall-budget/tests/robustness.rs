//! A caller's bug and extreme settings: a call polled after it finished panics with the
//! shared message, and no window length panics a call.

mod common;

use std::time::Duration;

use common::*;
use http_body_util::BodyExt;
use proptest::prelude::*;
use seawall_budget::*;
use seawall_core::LlmError;
use seawall_test_support::{extreme_duration as extreme, paused_runtime, poll_twice};
use tower::{Layer, Service, ServiceExt};

fn upstream() -> impl Service<Ask, Response = Resp, Error = LlmError, Future: Send> + Clone {
    tower::service_fn(|_: Ask| async { Ok::<_, LlmError>(done_without_usage()) })
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_finished_call_again_panics() {
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::daily("daily", Usd::from_dollars(1)))
        .build()
        .unwrap();
    let mut svc = layer.layer(upstream());
    poll_twice(
        svc.ready()
            .await
            .unwrap()
            .call(Ask::new("gpt-4o", 1_000, 100)),
    );
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_refused_call_again_panics() {
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::daily("daily", Usd::ZERO))
        .build()
        .unwrap();
    let mut svc = layer.layer(upstream());
    poll_twice(
        svc.ready()
            .await
            .unwrap()
            .call(Ask::new("gpt-4o", 1_000, 100)),
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn no_window_length_panics_a_call(window in extreme(), advance in extreme()) {
        let rt = paused_runtime();
        let built = CostBudgetLayer::builder(prices())
            .budget(Budget::rolling("rolling", Usd::from_dollars(1), window))
            .wall_clock_origin(std::time::SystemTime::UNIX_EPOCH)
            .build();
        let layer = match built {
            Ok(layer) => layer,
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                return Ok(());
            }
        };
        let answers = rt.block_on(async {
            let mut svc = layer.layer(upstream());
            let mut answers = Vec::new();
            for _ in 0..2 {
                let r = match svc.ready().await {
                    Ok(s) => s.call(Ask::new("gpt-4o", 1_000, 100)).await,
                    Err(e) => Err(e),
                };
                if let Ok(resp) = r {
                    let _ = resp.collect().await;
                    answers.push(true);
                } else {
                    answers.push(false);
                }
                tokio::time::advance(advance.min(Duration::from_secs(100 * 365 * 86_400))).await;
            }
            answers
        });
        // One estimate (0.0035 $) fits in the dollar: the first call always passes.
        prop_assert_eq!(answers[0], true);
        prop_assert!(layer.spend("rolling", None).is_some());
    }
}
