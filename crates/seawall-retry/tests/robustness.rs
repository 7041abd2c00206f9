//! A caller's bug and extreme settings: a call polled after it finished panics with the
//! shared message, and no configured duration panics a call.

mod common;

use std::time::Duration;

use common::{Ask, Mock, rate_limited, server_error};
use proptest::prelude::*;
use seawall_retry::{BackoffRetryBuilder, BackoffRetryLayer, LlmError};
use seawall_test_support::{extreme_duration as extreme, paused_runtime, poll_again_after};
use tower::{Layer, Service, ServiceExt};

async fn call(builder: BackoffRetryBuilder, mock: Mock) -> Result<&'static str, LlmError> {
    let mut svc = builder.build().unwrap().layer(mock);
    ServiceExt::<Ask>::ready(&mut svc)
        .await?
        .call(Ask::default())
        .await
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_finished_call_again_panics() {
    let mut svc = BackoffRetryLayer::builder()
        .build()
        .unwrap()
        .layer(Mock::new(|_| Ok("ok")));
    poll_again_after(
        ServiceExt::<Ask>::ready(&mut svc)
            .await
            .unwrap()
            .call(Ask::default()),
        |out| assert!(matches!(out, Ok("ok"))),
    );
}

#[tokio::test(start_paused = true)]
async fn a_time_budget_of_duration_max_is_no_deadline() {
    let mock = Mock::new(|_| Ok("ok")).latency(Duration::from_secs(30));
    let builder = BackoffRetryLayer::builder().time_budget(Duration::MAX);
    assert_eq!(call(builder, mock).await.unwrap(), "ok");
}

#[tokio::test(start_paused = true)]
async fn a_server_hint_too_long_for_the_clock_waits_without_panicking() {
    let mock = Mock::new(|n| match n {
        0 => Err(rate_limited().with_retry_after(Duration::MAX)),
        _ => Ok("ok"),
    });
    let builder = BackoffRetryLayer::builder()
        .max_server_hint(Duration::MAX)
        .no_time_budget()
        .seed(1);
    let year = Duration::from_secs(365 * 86_400);
    let waited = tokio::time::timeout(year, call(builder, mock.clone())).await;
    assert!(waited.is_err(), "the call must still be waiting");
    assert_eq!(mock.calls(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn no_duration_setting_panics_a_call(
        base in extreme(),
        max in extreme(),
        hint_cap in extreme(),
        overload in extreme(),
        budget in extreme(),
        hint in extreme(),
        latency in prop_oneof![Just(Duration::ZERO), Just(Duration::from_secs(1))],
    ) {
        let rt = paused_runtime();
        let builder = BackoffRetryLayer::builder()
            .base_delay(base)
            .max_delay(max)
            .max_server_hint(hint_cap)
            .overload_min_delay(overload)
            .time_budget(budget)
            .seed(3);
        let mock = Mock::new(move |n| match n {
            0 => Err(server_error()),
            1 => Err(rate_limited().with_retry_after(hint)),
            _ => Ok("ok"),
        })
        .latency(latency);
        let outcome = rt.block_on(async {
            let mut svc = match builder.build() {
                Ok(layer) => layer.layer(mock.clone()),
                Err(e) => return Some(Err(e.to_string())),
            };
            let call = async { ServiceExt::<Ask>::ready(&mut svc).await?.call(Ask::default()).await };
            // Ten years of paused time: long waits are cut short here, not in the layer.
            tokio::time::timeout(Duration::from_secs(10 * 365 * 86_400), call)
                .await
                .ok()
                .map(|r| r.map_err(|e| e.to_string()))
        });
        match outcome {
            Some(Err(message)) => prop_assert!(!message.is_empty()),
            Some(Ok(answer)) => prop_assert_eq!(answer, "ok"),
            None => prop_assert!(mock.calls() >= 1),
        }
    }
}
