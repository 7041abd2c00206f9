//! The budget's test fixtures: prices, usage, and responses complete or streamed; the typed
//! request and the channel-fed body come from the shared test support.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::sync::Arc;

use seawall_budget::{Price, PriceTable, ScopeKeys, Usd};
use seawall_core::{BodyReport, Usage};
pub use seawall_test_support::{Ask, ChanBody, Feed, Tenant, tenant_key};

pub type Resp = http::Response<ChanBody>;

/// The keys of the `tenant` scope, read by [`tenant_key`]; other scopes have none.
pub fn tenant_keys() -> ScopeKeys<Ask> {
    ScopeKeys::new().scope("tenant", tenant_key)
}

/// A complete response that reports `usage` at its head.
pub fn done(usage: Usage) -> Resp {
    let mut r = http::Response::new(ChanBody::empty());
    r.extensions_mut().insert(usage);
    r
}

/// A complete response without usage.
pub fn done_without_usage() -> Resp {
    http::Response::new(ChanBody::empty())
}

/// A streamed response: the sender feeds the body, the report carries its usage.
pub fn stream() -> (Resp, Feed, Arc<BodyReport>) {
    let (tx, body) = ChanBody::channel();
    let report = Arc::new(BodyReport::new());
    let mut r = http::Response::new(body);
    r.extensions_mut().insert(report.clone());
    (r, tx, report)
}

pub fn usage(input: u64, output: u64, cached: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cached_input_tokens: cached,
        cache_write_input_tokens: 0,
        cache_write_1h_input_tokens: 0,
    }
}

/// $2.50 / $10 / cached $1.25 per million.
pub fn gpt4o() -> Price {
    Price::per_million(Usd::from_cents(250), Usd::from_dollars(10))
        .with_cached_input(Usd::from_cents(125))
}

/// $1 / $5 / cached $0.10 per million.
pub fn haiku() -> Price {
    Price::per_million(Usd::from_dollars(1), Usd::from_dollars(5))
        .with_cached_input(Usd::from_cents(10))
}

pub fn prices() -> PriceTable {
    PriceTable::new()
        .with("gpt-4o", gpt4o())
        .with("claude-haiku-4-5*", haiku())
}
