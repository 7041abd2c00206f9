//! A caller's bug and extreme settings: a call polled after it finished panics with the
//! shared message, and no configured wait or pause panics a call.

mod common;

use std::time::Duration;

use common::{Ask, Reply, Upstream};
use proptest::prelude::*;
use seawall_gate::{ConcurrencyGateLayer, Rates};
use seawall_test_support::{extreme_duration as extreme, paused_runtime, poll_twice};
use tower::{Layer, Service, ServiceExt};

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_finished_call_again_panics() {
    let up = Upstream::new(|_| Reply::ok());
    let mut svc = ConcurrencyGateLayer::builder().build().unwrap().layer(up);
    poll_twice(svc.ready().await.unwrap().call(Ask::numbered(1)));
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_rejected_call_again_panics() {
    let up = Upstream::new(|_| Reply::ok());
    let layer = ConcurrencyGateLayer::builder()
        .limit(0)
        .max_queue(0)
        .build()
        .unwrap();
    let mut svc = layer.layer(up);
    poll_twice(svc.ready().await.unwrap().call(Ask::numbered(1)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn no_wait_or_pause_setting_panics_a_call(
        max_wait in extreme(),
        max_pause in extreme(),
        pause in extreme(),
        latency in extreme(),
        rate in 0u64..3,
    ) {
        let rt = paused_runtime();
        let answered = rt.block_on(async {
            let up = Upstream::new(move |_| Reply::after(latency.min(Duration::from_secs(3600))));
            let layer = ConcurrencyGateLayer::builder()
                .limit(1)
                .max_wait(max_wait)
                .max_pause(max_pause)
                .rates(Rates::new().requests_per_minute(rate))
                .build()
                .unwrap();
            layer.handle().pause_key(Some("m"), pause);
            let svc = layer.layer(up);
            // Two calls for one permit: the second waits in the queue.
            let first = tokio::spawn(svc.clone().oneshot(Ask::numbered(1)));
            let second = tokio::spawn(svc.clone().oneshot(Ask::numbered(2)));
            let year = Duration::from_secs(365 * 86_400);
            let mut answered = 0;
            for call in [first, second] {
                if let Ok(joined) = tokio::time::timeout(year, call).await {
                    // A panic inside the gate shows up here as a join error.
                    let result = joined.expect("the call must not panic");
                    answered += usize::from(result.is_ok());
                }
            }
            answered
        });
        prop_assert!(answered <= 2);
    }
}
