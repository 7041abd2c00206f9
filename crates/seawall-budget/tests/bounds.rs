//! A flood of distinct, long model names cannot grow a per-model budget's counters past what
//! the operator set, nor wipe the spend of a key that has spent.

use std::alloc::System;
use std::sync::Arc;

use http::Extensions;
use seawall_budget::{Budget, CostBudgetLayer, MemoryStore, OVERFLOW_KEY, Price, PriceTable, Usd};
use seawall_core::{FailureClass, LlmError, LlmRequest};
use tower::{Layer, ServiceExt};

/// The system allocator, counting the bytes live in the process. The tests of this file take
/// [`SERIAL`] so that none allocates while the flood test measures.
#[global_allocator]
static ALLOC: cap::Cap<System> = cap::Cap::new(System, usize::MAX);

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn live() -> isize {
    ALLOC.allocated() as isize
}

/// A request whose model name is a slice of a shared buffer, so that a flood of 64 KiB names
/// costs no 64 KiB allocation per request.
struct Named {
    names: Arc<str>,
    at: std::ops::Range<usize>,
    max_out: u32,
    ext: Extensions,
}

impl Named {
    fn new(model: &str, max_out: u32) -> Self {
        Named {
            names: Arc::from(model),
            at: 0..model.len(),
            max_out,
            ext: Extensions::new(),
        }
    }
}

impl LlmRequest for Named {
    fn model(&self) -> Option<&str> {
        Some(&self.names[self.at.clone()])
    }
    fn max_output_tokens(&self) -> Option<u32> {
        Some(self.max_out)
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

fn name(names: &Arc<str>, i: usize, max_out: u32) -> Named {
    Named {
        names: names.clone(),
        at: i * 16..i * 16 + NAME_LEN,
        max_out,
        ext: Extensions::new(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_long_model_names_stays_bounded_and_spent_keys_keep_their_spend() {
    let _serial = SERIAL.lock().await;
    const MAX_KEYS: usize = 512;
    const FLOOD: usize = 100_000;
    // Every model at $1 per million tokens; each model may spend $1 a day.
    let prices = PriceTable::new().with_default(Price::per_million_f64(1.0, 1.0).unwrap());
    let store = Arc::new(MemoryStore::with_max_keys(MAX_KEYS));
    let layer = CostBudgetLayer::builder(prices)
        .budget(Budget::daily("per-model", Usd::from_dollars(1)).per_model())
        .store(store.clone())
        .build()
        .unwrap();
    let svc = layer.layer(tower::service_fn(|_: Named| async {
        Ok::<_, LlmError>(http::Response::new(String::from("ok")))
    }));
    let names = long_names(FLOOD + 1);

    // Before the flood, two models (a short and a 64 KiB name) spend 90 cents each.
    let victims = || [Named::new("victim", 0), name(&names, FLOOD, 0)];
    for mut v in victims() {
        v.max_out = 900_000;
        drop(svc.clone().oneshot(v).await.unwrap());
    }

    let live_before = live();
    let mut last = None;
    for i in 0..FLOOD {
        // A tenth of a cent each: every flood model spends, so none can be dropped.
        last = svc.clone().oneshot(name(&names, i, 1_000)).await.err();
        if i % 1_000 == 0 {
            let grown = (live() - live_before).max(0) as usize;
            assert!(
                grown <= MAX_KEYS * 2048,
                "{grown} bytes more after {i} models"
            );
            assert!(store.keyed_counters() <= MAX_KEYS);
        }
    }
    // The late flood models share the overflow counter, which ran out long ago.
    let err = last.expect("the overflow counter is spent");
    assert_eq!(err.class(), FailureClass::BudgetExceeded);
    assert!(err.to_string().contains(OVERFLOW_KEY), "{err}");
    assert_eq!(store.keyed_counters(), MAX_KEYS);

    // The victims' spend survived: 20 more cents is refused for each.
    assert_eq!(
        layer.spend("per-model", Some("victim")).unwrap().spent,
        Usd::from_cents(90)
    );
    for mut v in victims() {
        v.max_out = 200_000;
        let err = svc.clone().oneshot(v).await.unwrap_err();
        assert_eq!(err.class(), FailureClass::BudgetExceeded, "{err}");
        assert!(!err.to_string().contains(OVERFLOW_KEY), "{err}");
    }
}
