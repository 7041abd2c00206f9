//! A caller's bug and extreme settings: a call polled after it finished panics with the
//! shared message, and no configured wait or pause panics a call.

mod common;

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Waker};
use std::time::Duration;

use common::{Reply, Req, Upstream};
use proptest::prelude::*;
use seawall_gate::{ConcurrencyGateLayer, Rates};
use tower::{Layer, Service, ServiceExt};

fn poll_twice<F: Future>(fut: F) {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(fut.as_mut().poll(&mut cx).is_ready());
    let _ = fut.as_mut().poll(&mut cx);
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_finished_call_again_panics() {
    let up = Upstream::new(|_| Reply::ok());
    let mut svc = ConcurrencyGateLayer::builder().build().unwrap().layer(up);
    poll_twice(svc.ready().await.unwrap().call(Req::new(1)));
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
    poll_twice(svc.ready().await.unwrap().call(Req::new(1)));
}

/// Durations at and near the edges of what a `Duration` holds.
fn extreme() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(Duration::MAX),
        Just(Duration::from_secs(u64::MAX)),
        any::<u64>().prop_map(Duration::from_nanos),
        any::<u64>().prop_map(Duration::from_secs),
    ]
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
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
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
            let first = tokio::spawn(svc.clone().oneshot(Req::new(1)));
            let second = tokio::spawn(svc.clone().oneshot(Req::new(2)));
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
