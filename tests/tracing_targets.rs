//! Operators turn seawall's logs on with one filter, `RUST_LOG=seawall=debug`: every layer that
//! logs does so under a `seawall::<layer>` target, so that filter sees all of it and nothing is
//! left under a crate path (`seawall_gate::shared`) that a stricter filter would miss.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use seawall::LlmError;
use seawall::breaker::CircuitBreakerLayer;
use seawall::budget::{Budget, CostBudgetLayer, Price, PriceTable, Usd};
use seawall::core::FailureClass;
use seawall::fallback::{FallbackLayer, Target};
use seawall::gate::ConcurrencyGateLayer;
use seawall::observe::{ObserveLayer, TracingRecorder};
use seawall::retry::BackoffRetryLayer;
use tower::{ServiceBuilder, ServiceExt};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// Keeps the target of every span and event the filter lets through.
#[derive(Clone, Default)]
struct Targets(Arc<Mutex<BTreeSet<String>>>);

impl Targets {
    fn seen(&self) -> BTreeSet<String> {
        self.0.lock().unwrap().clone()
    }
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for Targets {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        let target = attrs.metadata().target().to_owned();
        self.0.lock().unwrap().insert(target);
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let target = event.metadata().target().to_owned();
        self.0.lock().unwrap().insert(target);
    }
}

fn ask(max_tokens: u64) -> http::Request<Bytes> {
    let body = serde_json::json!({
        "model": "gpt-4o",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Is anyone there?"}],
    });
    http::Request::post("https://api.openai.com/v1/chat/completions")
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_seawall_debug_filter_sees_every_layer_that_logs() {
    let targets = Targets::default();
    let subscriber = tracing_subscriber::registry()
        .with(EnvFilter::new("seawall=debug"))
        .with(targets.clone());
    // A current-thread runtime: the layers log on this thread.
    let _guard = tracing::subscriber::set_default(subscriber);

    // An upstream that is always rate limited and says when to come back.
    let transport = tower::service_fn(|_req: http::Request<Bytes>| async {
        Err::<http::Response<Full<Bytes>>, _>(
            LlmError::new(FailureClass::RateLimited, "slow down")
                .with_status(http::StatusCode::TOO_MANY_REQUESTS)
                .with_retry_after(Duration::from_secs(1)),
        )
    });
    let prices = PriceTable::new().with_default(Price::per_million_f64(2.5, 10.0).unwrap());
    let client = ServiceBuilder::new()
        .layer(
            ObserveLayer::builder()
                .recorder(TracingRecorder)
                .build()
                .unwrap(),
        )
        .layer(FallbackLayer::new([Target::model("gpt-4o-mini")]))
        .layer(BackoffRetryLayer::new())
        .layer(
            CostBudgetLayer::builder(prices)
                .budget(Budget::total("total", Usd::from_dollars(1)))
                .build()
                .unwrap(),
        )
        .layer(
            CircuitBreakerLayer::builder()
                .open_on_retry_hint(Duration::from_secs(60))
                .build()
                .unwrap(),
        )
        .layer(ConcurrencyGateLayer::new(4))
        .service(transport);

    // Rate limited throughout: a paused gate key, a breaker opened for the hint, retries, a
    // fallback, and the call's record.
    let err = client.clone().oneshot(ask(16)).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::RateLimited, "{err}");
    // 10M output tokens cost $100, past the $1 budget: refused before the upstream.
    let err = client.oneshot(ask(10_000_000)).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::BudgetExceeded, "{err}");

    let seen = targets.seen();
    for layer in [
        "seawall::observe",
        "seawall::call",
        "seawall::fallback",
        "seawall::retry",
        "seawall::budget",
        "seawall::breaker",
        "seawall::gate",
    ] {
        assert!(seen.contains(layer), "no {layer} event or span in {seen:?}");
    }
    assert!(
        seen.iter().all(|t| t.starts_with("seawall::")),
        "an event or span under a crate path instead of a seawall:: target: {seen:?}"
    );
}
