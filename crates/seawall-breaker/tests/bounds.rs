//! A flood of distinct, long model names cannot grow the breaker's table past what the
//! operator set, nor reset a breaker that is open.

use std::sync::Arc;
use std::time::Instant;

use http::Extensions;
use http_body_util::BodyExt;
use seawall_breaker::{BreakerGuard, CircuitBreakerLayer, State};
use seawall_core::{FailureClass, HookedBody, LlmError, LlmRequest, MAX_KEY_LEN};
use tower::{Layer, Service, ServiceExt};

/// A request keyed by its model name, which the fake upstream fails or answers.
struct Named {
    names: Arc<str>,
    at: std::ops::Range<usize>,
    fail: bool,
    ext: Extensions,
}

impl LlmRequest for Named {
    fn model(&self) -> Option<&str> {
        Some(&self.names[self.at.clone()])
    }
    fn max_output_tokens(&self) -> Option<u32> {
        None
    }
    fn estimated_input_tokens(&self) -> u32 {
        0
    }
    fn extensions(&self) -> Option<&Extensions> {
        Some(&self.ext)
    }
    fn extensions_mut(&mut self) -> Option<&mut Extensions> {
        Some(&mut self.ext)
    }
}

const NAME_LEN: usize = 64 * 1024;

/// `n` distinct model names of 64 KiB without 64 KiB of memory each: the counter 0, 1, 2, ...
/// in 16 hex digits, end to end; name `i` is the 64 KiB that start at counter `i`.
fn long_names(n: usize) -> Arc<str> {
    let mut s = String::with_capacity(n * 16 + NAME_LEN);
    for i in 0..(n + NAME_LEN / 16) as u64 {
        s.push_str(&format!("{i:016x}"));
    }
    s.into()
}

fn name(names: &Arc<str>, i: usize) -> Named {
    Named {
        names: names.clone(),
        at: i * 16..i * 16 + NAME_LEN,
        fail: false,
        ext: Extensions::new(),
    }
}

async fn call<S>(svc: &mut S, mut req: Named, fail: bool) -> Result<(), LlmError>
where
    S: Service<
            Named,
            Response = http::Response<HookedBody<String, BreakerGuard>>,
            Error = LlmError,
        >,
{
    req.fail = fail;
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
    let mut svc = layer.layer(tower::service_fn(|r: Named| async move {
        if r.fail {
            Err(LlmError::new(FailureClass::ServerError, "500"))
        } else {
            Ok(http::Response::new(String::from("ok")))
        }
    }));

    // Two keys tripped before the flood: a short one and a 64 KiB one.
    let long_victim = || name(&names, FLOOD);
    let short_victim = || Named {
        names: Arc::from("api.example/victim"),
        at: 0..18,
        fail: false,
        ext: Extensions::new(),
    };
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
    let svc = layer.layer(tower::service_fn(|r: Named| async move {
        if r.fail {
            Err(LlmError::new(FailureClass::ServerError, "500"))
        } else {
            Ok(http::Response::new(String::from("ok")))
        }
    }));
    let victim = || Named {
        names: Arc::from("victim"),
        at: 0..6,
        fail: false,
        ext: Extensions::new(),
    };
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
                    let req = Named {
                        at: 0..model.len(),
                        names: Arc::from(model),
                        fail: false,
                        ext: Extensions::new(),
                    };
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
