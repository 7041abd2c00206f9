//! A call past the caller's deadline is refused before it reserves anything: its answer
//! would come too late to be read, and its cost would be real.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use seawall_budget::{Budget, CostBudgetLayer, Usd};
use seawall_core::{Deadline, FailureClass, LlmError};
use tokio::time::{Instant, advance};
use tower::{Layer, ServiceExt};

#[tokio::test(start_paused = true)]
async fn a_call_past_its_deadline_fails_before_it_reserves_or_spends() {
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("all", Usd::from_dollars(10)))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let svc = layer.layer(tower::service_fn(move |_req: Ask| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, LlmError>(done(usage(1_000, 100, 0))) }
    }));

    let mut late = Ask::new("gpt-4o", 1_000, 100);
    late.ext.insert(Deadline::after(Duration::from_secs(2)));
    advance(Duration::from_secs(2)).await;
    let err = svc.clone().oneshot(late).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::DeadlineExceeded, "{err}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the upstream was never called"
    );
    let spend = layer.spend("all", None).unwrap();
    assert_eq!(
        spend.committed(),
        Usd::ZERO,
        "nothing reserved, nothing spent"
    );

    // With time left the same call goes through and is charged.
    let mut in_time = Ask::new("gpt-4o", 1_000, 100);
    in_time
        .ext
        .insert(Deadline::at(Instant::now() + Duration::from_secs(1)));
    svc.oneshot(in_time).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(layer.spend("all", None).unwrap().spent > Usd::ZERO);
}
