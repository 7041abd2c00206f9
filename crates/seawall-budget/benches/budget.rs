//! Per-call overhead of the cost budget layer over a no-op service, with a realistic price
//! table (a dozen models) and three budgets (a monthly total, a daily one per model and an
//! hourly one per tenant).
//!
//! ```text
//! cargo bench -p seawall-budget --bench budget
//! ```

use std::hint::black_box;
use std::task::{Context, Poll};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use futures_util::FutureExt;
use http_body_util::Empty;
use seawall_budget::{Budget, CostBudgetLayer, FixedKey, PriceTable, SpendRecord, Usd};
use seawall_core::{LlmError, LlmRequest, Usage};
use tower::{Layer, Service};

#[derive(Clone)]
struct Ask {
    model: &'static str,
    ext: http::Extensions,
}

impl LlmRequest for Ask {
    fn model(&self) -> Option<&str> {
        Some(self.model)
    }
    fn max_output_tokens(&self) -> Option<u32> {
        Some(512)
    }
    fn estimated_input_tokens(&self) -> u32 {
        1_200
    }
    fn extensions(&self) -> Option<&http::Extensions> {
        Some(&self.ext)
    }
}

/// Answers at once with usage on an empty body.
#[derive(Clone)]
struct Noop;

impl Service<Ask> for Noop {
    type Response = http::Response<Empty<Bytes>>;
    type Error = LlmError;
    type Future = std::future::Ready<Result<Self::Response, LlmError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Ask) -> Self::Future {
        let mut r = http::Response::new(Empty::new());
        r.extensions_mut().insert(Usage {
            input_tokens: 1_100,
            output_tokens: 300,
            cached_input_tokens: 500,
            cache_write_input_tokens: 0,
            cache_write_1h_input_tokens: 0,
        });
        std::future::ready(Ok(r))
    }
}

/// A dozen models: the crate's example price file.
const PRICES: &str = include_str!("../prices.example.toml");

fn layer(limit: Usd, with_sink: bool) -> CostBudgetLayer<FixedKey> {
    let mut b = CostBudgetLayer::builder(PriceTable::from_toml_str(PRICES).unwrap())
        .budget(Budget::monthly("monthly", limit))
        .budget(Budget::daily("per-model", limit).per_model())
        .budget(Budget::hourly("per-tenant", limit).per_key("tenant"))
        .keys(FixedKey::new("acme"));
    if with_sink {
        b = b.sink(|r: SpendRecord| {
            black_box(r);
        });
    }
    b.build().unwrap()
}

fn one<S: Service<Ask>>(svc: &mut S, req: Ask) -> bool {
    let ready = svc.poll_ready(&mut Context::from_waker(std::task::Waker::noop()));
    assert!(matches!(ready, Poll::Ready(Ok(()))));
    matches!(svc.call(req).now_or_never(), Some(Ok(_)))
}

fn bench(c: &mut Criterion) {
    let req = |model| Ask {
        model,
        ext: http::Extensions::new(),
    };
    let mut g = c.benchmark_group("budget");
    g.bench_function("noop_service_alone", |b| {
        let mut svc = Noop;
        b.iter(|| one(&mut svc, black_box(req("gpt-4o"))))
    });
    g.bench_function("admit_and_settle", |b| {
        let mut svc = layer(Usd::MAX, false).layer(Noop);
        b.iter(|| one(&mut svc, black_box(req("gpt-4o"))))
    });
    g.bench_function("admit_and_settle_prefix_model", |b| {
        let mut svc = layer(Usd::MAX, false).layer(Noop);
        b.iter(|| one(&mut svc, black_box(req("claude-sonnet-4-5-20250929"))))
    });
    g.bench_function("admit_settle_and_record", |b| {
        let mut svc = layer(Usd::MAX, true).layer(Noop);
        b.iter(|| one(&mut svc, black_box(req("gpt-4o"))))
    });
    g.bench_function("refused", |b| {
        let mut svc = layer(Usd::ZERO, false).layer(Noop);
        b.iter(|| one(&mut svc, black_box(req("gpt-4o"))))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
