//! A flood of distinct, long model names cannot grow the gate's key table past what the
//! operator set, nor lift a key's pause or rate-limit debt.

use std::sync::Arc;
use std::time::Duration;

use seawall_core::{LlmError, LlmRequest};
use seawall_gate::{ConcurrencyGateLayer, Limit, Rates, RejectReason, Rejection};
use seawall_test_support::{Ask, Name, long_names};
use tower::{Layer, ServiceExt};

seawall_test_support::counting_allocator!();

fn name(names: &Arc<str>, i: usize) -> Ask {
    Ask::named(Name::long(names, i))
}

fn reason(r: Result<http::Response<impl Sized>, LlmError>) -> RejectReason {
    Rejection::of(&r.err().expect("a rejection"))
        .expect("a gate rejection")
        .reason()
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_long_model_names_stays_bounded_and_paused_keys_stay_paused() {
    let _serial = SERIAL.lock().await;
    const MAX_KEYS: usize = 512;
    const FLOOD: usize = 100_000;
    let names = long_names(FLOOD + 1);
    let long_victim = || name(&names, FLOOD);
    let layer = ConcurrencyGateLayer::builder()
        .max_keys(MAX_KEYS)
        .max_wait(Duration::from_secs(1))
        .key_rates(
            "api.example/debtor",
            Rates::new().with_requests(Limit::per_minute(1).with_burst(1)),
        )
        .build()
        .unwrap();
    let handle = layer.handle();
    let svc = layer.layer(tower::service_fn(|_: Ask| async {
        Ok::<_, LlmError>(http::Response::new(String::from("ok")))
    }));

    // Before the flood: two paused keys (a short and a 64 KiB one) and one whose rate limit
    // is spent for the next minute.
    handle.pause_key(Some("api.example/victim"), Duration::from_secs(3600));
    handle.pause_key(long_victim().model(), Duration::from_secs(3600));
    drop(
        svc.clone()
            .oneshot(Ask::named("api.example/debtor"))
            .await
            .unwrap(),
    );

    let live_before = live();
    for i in 0..FLOOD {
        drop(svc.clone().oneshot(name(&names, i)).await.unwrap());
        assert!(handle.keys() <= MAX_KEYS);
    }
    // The table holds at most MAX_KEYS states of at most MAX_KEY_LEN-byte keys: well under
    // 2 KiB each with the map's share. Unbounded, each of them alone would pin 64 KiB.
    let grown = (live() - live_before).max(0) as usize;
    assert!(
        grown <= MAX_KEYS * 2048,
        "{grown} bytes more after the flood"
    );

    for req in [Ask::named("api.example/victim"), long_victim()] {
        assert_eq!(
            reason(svc.clone().oneshot(req).await),
            RejectReason::KeyPaused
        );
    }
    assert_eq!(
        reason(svc.clone().oneshot(Ask::named("api.example/debtor")).await),
        RejectReason::RateLimited
    );
}

#[tokio::test(start_paused = true)]
async fn keys_beyond_a_table_of_paused_keys_share_the_unkeyed_state() {
    let _serial = SERIAL.lock().await;
    let layer = ConcurrencyGateLayer::builder()
        .max_keys(2)
        .max_wait(Duration::from_secs(1))
        .build()
        .unwrap();
    let handle = layer.handle();
    let svc = layer.layer(tower::service_fn(|_: Ask| async {
        Ok::<_, LlmError>(http::Response::new(String::from("ok")))
    }));
    handle.pause_key(Some("a"), Duration::from_secs(3600));
    handle.pause_key(Some("b"), Duration::from_secs(3600));
    // The table is full of paused keys: new keys go through, under the unkeyed state.
    for i in 0..1_000 {
        let model = format!("new-{i}");
        drop(
            svc.clone()
                .oneshot(Ask::named(model.as_str()))
                .await
                .unwrap(),
        );
    }
    assert_eq!(handle.keys(), 2);
    assert_eq!(
        reason(svc.clone().oneshot(Ask::named("a")).await),
        RejectReason::KeyPaused
    );
    // A pause of the unkeyed state holds every key beyond the table.
    handle.pause_key(None, Duration::from_secs(3600));
    assert_eq!(
        reason(svc.clone().oneshot(Ask::named("new-0")).await),
        RejectReason::KeyPaused
    );
    assert_eq!(
        reason(svc.clone().oneshot(Ask::named("yet another")).await),
        RejectReason::KeyPaused
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_floods_never_pass_the_cap_nor_lift_a_pause() {
    let _serial = SERIAL.lock().await;
    const MAX_KEYS: usize = 64;
    let layer = ConcurrencyGateLayer::builder()
        .max_keys(MAX_KEYS)
        .max_wait(Duration::from_secs(1))
        .build()
        .unwrap();
    let handle = layer.handle();
    let svc = layer.layer(tower::service_fn(|_: Ask| async {
        Ok::<_, LlmError>(http::Response::new(String::from("ok")))
    }));
    handle.pause_key(Some("victim"), Duration::from_secs(3600));
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let svc = svc.clone();
            let handle = handle.clone();
            tokio::spawn(async move {
                for i in 0..5_000 {
                    let model = format!("flood-{t}-{i}");
                    drop(
                        svc.clone()
                            .oneshot(Ask::named(model.as_str()))
                            .await
                            .unwrap(),
                    );
                    assert!(handle.keys() <= MAX_KEYS);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        reason(svc.clone().oneshot(Ask::named("victim")).await),
        RejectReason::KeyPaused
    );
}
