//! A flood of distinct, long model names cannot grow the gate's key table past what the
//! operator set, nor lift a key's pause or rate-limit debt.

use std::alloc::System;
use std::sync::Arc;
use std::time::Duration;

use http::Extensions;
use seawall_core::{LlmError, LlmRequest};
use seawall_gate::{ConcurrencyGateLayer, Limit, Rates, RejectReason, Rejection};
use tower::{Layer, ServiceExt};

/// The system allocator, counting the bytes live in the process. The tests of this file take
/// [`SERIAL`] so that none allocates while the flood test measures.
#[global_allocator]
static ALLOC: cap::Cap<System> = cap::Cap::new(System, usize::MAX);

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn live() -> isize {
    ALLOC.allocated() as isize
}

/// A request keyed by its model name: a slice of a shared buffer, so that a flood of 64 KiB
/// names costs no 64 KiB allocation per request.
struct Named {
    names: Arc<str>,
    at: std::ops::Range<usize>,
    ext: Extensions,
}

impl Named {
    fn new(model: &str) -> Self {
        Named {
            names: Arc::from(model),
            at: 0..model.len(),
            ext: Extensions::new(),
        }
    }
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

/// `n` distinct model names of 64 KiB in one buffer: the counter 0, 1, 2, ... in 16 hex
/// digits, end to end; name `i` is the 64 KiB that start at counter `i`.
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
        ext: Extensions::new(),
    }
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
    let svc = layer.layer(tower::service_fn(|_: Named| async {
        Ok::<_, LlmError>(http::Response::new(String::from("ok")))
    }));

    // Before the flood: two paused keys (a short and a 64 KiB one) and one whose rate limit
    // is spent for the next minute.
    handle.pause_key(Some("api.example/victim"), Duration::from_secs(3600));
    handle.pause_key(long_victim().model(), Duration::from_secs(3600));
    drop(
        svc.clone()
            .oneshot(Named::new("api.example/debtor"))
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

    for req in [Named::new("api.example/victim"), long_victim()] {
        assert_eq!(
            reason(svc.clone().oneshot(req).await),
            RejectReason::KeyPaused
        );
    }
    assert_eq!(
        reason(svc.clone().oneshot(Named::new("api.example/debtor")).await),
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
    let svc = layer.layer(tower::service_fn(|_: Named| async {
        Ok::<_, LlmError>(http::Response::new(String::from("ok")))
    }));
    handle.pause_key(Some("a"), Duration::from_secs(3600));
    handle.pause_key(Some("b"), Duration::from_secs(3600));
    // The table is full of paused keys: new keys go through, under the unkeyed state.
    for i in 0..1_000 {
        let model = format!("new-{i}");
        drop(svc.clone().oneshot(Named::new(&model)).await.unwrap());
    }
    assert_eq!(handle.keys(), 2);
    assert_eq!(
        reason(svc.clone().oneshot(Named::new("a")).await),
        RejectReason::KeyPaused
    );
    // A pause of the unkeyed state holds every key beyond the table.
    handle.pause_key(None, Duration::from_secs(3600));
    assert_eq!(
        reason(svc.clone().oneshot(Named::new("new-0")).await),
        RejectReason::KeyPaused
    );
    assert_eq!(
        reason(svc.clone().oneshot(Named::new("yet another")).await),
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
    let svc = layer.layer(tower::service_fn(|_: Named| async {
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
                    drop(svc.clone().oneshot(Named::new(&model)).await.unwrap());
                    assert!(handle.keys() <= MAX_KEYS);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        reason(svc.clone().oneshot(Named::new("victim")).await),
        RejectReason::KeyPaused
    );
}
