//! A flood of distinct, long model names cannot grow the breaker's table past what the
//! operator set, nor reset a breaker that is open.

use std::sync::Arc;
use std::time::Instant;

use http_body_util::BodyExt;
use seawall_breaker::{BreakerGuard, CircuitBreakerLayer, State};
use seawall_core::{FailureClass, HookedBody, LlmError, LlmRequest, MAX_KEY_LEN};
use seawall_test_support::{Ask, Name, long_names};
use tower::{Layer, Service, ServiceExt};

/// Marks a request the fake upstream fails.
#[derive(Clone, Copy)]
struct Fail;

fn name(names: &Arc<str>, i: usize) -> Ask {
    Ask::named(Name::long(names, i))
}

async fn call<S>(svc: &mut S, mut req: Ask, fail: bool) -> Result<(), LlmError>
where
    S: Service<Ask, Response = http::Response<HookedBody<String, BreakerGuard>>, Error = LlmError>,
{
    if fail {
        req.ext.insert(Fail);
    }
    let resp = svc.ready().await?.call(req).await?;
    resp.into_body()
        .collect()
        .await
        .map(|_| ())
        .map_err(|e| match e {})
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_long_model_names_stays_bounded_and_open_keys_stay_open() {
    const MAX_KEYS: usize = 512;
    const FLOOD: usize = 100_000;
    let names = long_names(FLOOD + 1);
    let layer = CircuitBreakerLayer::builder()
        .max_keys(MAX_KEYS)
        .build()
        .unwrap();
    let handle = layer.handle();
    let mut svc = layer.layer(tower::service_fn(|r: Ask| async move {
        if r.ext.get::<Fail>().is_some() {
            Err(LlmError::new(FailureClass::ServerError, "500"))
        } else {
            Ok(http::Response::new(String::from("ok")))
        }
    }));

    // Two keys tripped before the flood: a short one and a 64 KiB one.
    let long_victim = || name(&names, FLOOD);
    let short_victim = || Ask::named("api.example/victim");
    for _ in 0..5 {
        call(&mut svc, short_victim(), true).await.unwrap_err();
        call(&mut svc, long_victim(), true).await.unwrap_err();
    }
    let victim_keys = [
        short_victim().model().unwrap().to_owned(),
        long_victim().model().unwrap().to_owned(),
    ];
    for key in &victim_keys {
        assert_eq!(handle.state(key), Some(State::Open));
    }

    let started = Instant::now();
    for i in 0..FLOOD {
        call(&mut svc, name(&names, i), false).await.unwrap();
        if i % 10_000 == 0 {
            assert!(handle.len() <= MAX_KEYS);
        }
    }
    eprintln!(
        "{FLOOD} long keys through the breaker in {:?}",
        started.elapsed()
    );

    // Entries: at most the cap (plus the overflow breaker). Bytes: every stored key is at most
    // MAX_KEY_LEN, so the keys of the table hold at most (MAX_KEYS + 1) * MAX_KEY_LEN bytes,
    // 128 KiB here, where one unbounded name alone is 64 KiB.
    let snapshots = handle.snapshots();
    assert!(handle.len() <= MAX_KEYS, "{} keys", handle.len());
    assert!(snapshots.len() <= MAX_KEYS + 1);
    let key_bytes: usize = snapshots.iter().map(|s| s.key.len()).sum();
    assert!(
        key_bytes <= (MAX_KEYS + 1) * MAX_KEY_LEN,
        "{key_bytes} bytes of keys"
    );

    for key in &victim_keys {
        assert_eq!(handle.state(key), Some(State::Open));
    }
    for req in [short_victim(), long_victim()] {
        let err = call(&mut svc, req, false).await.unwrap_err();
        assert_eq!(err.class(), FailureClass::CircuitOpen);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_floods_never_pass_the_cap_nor_close_an_open_key() {
    const MAX_KEYS: usize = 64;
    let layer = CircuitBreakerLayer::builder()
        .max_keys(MAX_KEYS)
        .build()
        .unwrap();
    let handle = layer.handle();
    let svc = layer.layer(tower::service_fn(|r: Ask| async move {
        if r.ext.get::<Fail>().is_some() {
            Err(LlmError::new(FailureClass::ServerError, "500"))
        } else {
            Ok(http::Response::new(String::from("ok")))
        }
    }));
    let victim = || Ask::named("victim");
    let mut tripper = svc.clone();
    for _ in 0..5 {
        call(&mut tripper, victim(), true).await.unwrap_err();
    }
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let mut svc = svc.clone();
            let handle = handle.clone();
            tokio::spawn(async move {
                for i in 0..5_000 {
                    let model = format!("flood-{t}-{i}");
                    let req = Ask::named(model.as_str());
                    call(&mut svc, req, false).await.unwrap();
                    assert!(handle.len() <= MAX_KEYS);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert!(handle.len() <= MAX_KEYS);
    assert_eq!(handle.state("victim"), Some(State::Open));
}
