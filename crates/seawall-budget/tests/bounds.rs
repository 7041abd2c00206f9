//! A flood of distinct, long model names cannot grow a per-model budget's counters past what
//! the operator set, nor wipe the spend of a key that has spent.

use std::sync::Arc;

use seawall_budget::{Budget, CostBudgetLayer, MemoryStore, OVERFLOW_KEY, Price, PriceTable, Usd};
use seawall_core::{FailureClass, LlmError};
use seawall_test_support::{Ask, Name, long_names};
use tower::{Layer, ServiceExt};

seawall_test_support::counting_allocator!();

fn name(names: &Arc<str>, i: usize, max_out: u32) -> Ask {
    Ask {
        max: Some(max_out),
        ..Ask::named(Name::long(names, i))
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
    let svc = layer.layer(tower::service_fn(|_: Ask| async {
        Ok::<_, LlmError>(http::Response::new(String::from("ok")))
    }));
    let names = long_names(FLOOD + 1);

    // Before the flood, two models (a short and a 64 KiB name) spend 90 cents each.
    let victims = || [Ask::new("victim", 0, 0), name(&names, FLOOD, 0)];
    for mut v in victims() {
        v.max = Some(900_000);
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
        v.max = Some(200_000);
        let err = svc.clone().oneshot(v).await.unwrap_err();
        assert_eq!(err.class(), FailureClass::BudgetExceeded, "{err}");
        assert!(!err.to_string().contains(OVERFLOW_KEY), "{err}");
    }
}
