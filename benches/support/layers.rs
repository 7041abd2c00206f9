//! The hook layers of the recommended stack as every bench builds them: a budget, a gate, a
//! fallback and an observer set so that no call is ever refused, throttled, sent elsewhere or
//! recorded (their code paths all run). Shared by the overhead, allocation and chunk benches.

use bytes::Bytes;
use http::Request;
use seawall::budget::{Budget, CostBudgetLayer, FixedKey, PriceTable, Usd};
use seawall::fallback::{FallbackLayer, Target};
use seawall::gate::{ConcurrencyGateLayer, Rates};
use seawall::observe::{NoopRecorder, ObserveLayer};

/// A dozen models, as a production price table would list them: the budget crate's example
/// price file.
const PRICES: &str = include_str!("../../crates/seawall-budget/prices.example.toml");

/// Three budgets a team would set: a monthly total, a daily one per model, an hourly one per
/// tenant. The limits are far above what a bench spends, so no call is refused.
pub(crate) fn budget() -> CostBudgetLayer<FixedKey> {
    CostBudgetLayer::builder(PriceTable::from_toml_str(PRICES).expect("price table"))
        .budget(Budget::monthly("monthly", Usd::from_dollars(1_000_000_000)))
        .budget(Budget::daily("per-model", Usd::from_dollars(1_000_000_000)).per_model())
        .budget(Budget::hourly("per-tenant", Usd::from_dollars(1_000_000_000)).per_key("tenant"))
        .keys(FixedKey::new("acme"))
        .build()
        .expect("budget layer")
}

/// The gate of the recommended stack: permits far above what one or two threads hold, and
/// request/token rates so high that they never throttle (the rate path still runs).
pub(crate) fn gate() -> ConcurrencyGateLayer {
    ConcurrencyGateLayer::builder()
        .limit(64)
        .rates(
            Rates::new()
                .requests_per_minute(u64::MAX / 4)
                .tokens_per_minute(u64::MAX / 4),
        )
        .build()
        .expect("the bench gate's settings are valid")
}

/// A fallback to a smaller model that a successful call never uses.
pub(crate) fn fallback_layer<Resp>() -> FallbackLayer<Request<Bytes>, Resp> {
    FallbackLayer::new([Target::model("gpt-4o-mini")])
}

/// The stack's observer, recording nothing.
pub(crate) fn observe() -> ObserveLayer {
    ObserveLayer::builder()
        .recorder(NoopRecorder)
        .build()
        .expect("the bench observe settings are valid")
}
