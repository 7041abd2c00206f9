//! A call past the caller's deadline is refused before the breaker is asked: it takes no
//! half-open probe slot, counts neither way, and never reaches the upstream.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use seawall_breaker::CircuitBreakerLayer;
use seawall_core::{Deadline, FailureClass, LlmError};
use seawall_test_support::{Ask, ChanBody};
use tokio::time::advance;
use tower::{Layer, ServiceExt};

#[tokio::test(start_paused = true)]
async fn a_call_past_its_deadline_fails_before_the_breaker_or_the_upstream_sees_it() {
    let layer = CircuitBreakerLayer::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let svc = layer.layer(tower::service_fn(move |_req: Ask| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, LlmError>(http::Response::new(ChanBody::empty())) }
    }));
    let mut late = Ask::named("gpt-4o");
    late.ext.insert(Deadline::after(Duration::from_secs(1)));
    advance(Duration::from_secs(1)).await;
    let err = svc.clone().oneshot(late).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::DeadlineExceeded, "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert!(
        layer.handle().is_empty(),
        "no breaker was looked up or made"
    );

    let mut in_time = Ask::named("gpt-4o");
    in_time.ext.insert(Deadline::after(Duration::from_secs(1)));
    svc.oneshot(in_time).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(layer.handle().len(), 1);
}
