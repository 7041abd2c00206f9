//! The caller's deadline in the gate, on paused tokio time: it cuts the maximum wait, a wait
//! it ends fails with `DeadlineExceeded` (not `GateRejected`), and a call already past it
//! fails before taking a permit.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{Ask, Reply, Upstream, settle};
use seawall_core::{CallContext, Deadline, FailureClass, LlmError};
use seawall_gate::{
    ConcurrencyGate, ConcurrencyGateLayer, LaneShare, Limit, Priority, Rates, RejectReason,
    Rejection,
};
use tokio::time::{Instant, advance};
use tower::{Layer, ServiceExt};

type Gate = ConcurrencyGate<Upstream>;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn with_deadline(mut a: Ask, after: Duration) -> Ask {
    a.ext.insert(Deadline::after(after));
    a
}

/// A gate of one permit and a 30 s maximum wait, its permit held by a stream.
async fn busy_gate(lanes: bool) -> (Gate, Upstream, common::Resp2) {
    let up = Upstream::new(|r| {
        if r.id == 0 {
            Reply::stream()
        } else {
            Reply::ok()
        }
    });
    let mut b = ConcurrencyGateLayer::builder().limit(1).max_wait(secs(30));
    if lanes {
        b = b.lane(
            Priority::Batch,
            LaneShare {
                permits: 0.5,
                rate: 0.5,
            },
        );
    }
    let svc: Gate = b.build().unwrap().layer(up.clone());
    let blocker = svc.clone().oneshot(Ask::numbered(0)).await.unwrap();
    (svc, up, blocker)
}

#[tokio::test(start_paused = true)]
async fn a_call_past_its_deadline_fails_at_once_without_taking_a_permit() {
    let up = Upstream::new(|_| Reply::ok());
    let svc: Gate = ConcurrencyGateLayer::new(4).layer(up.clone());
    let req = with_deadline(Ask::numbered(1), secs(1));
    advance(secs(2)).await;
    let err = svc.clone().oneshot(req).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::DeadlineExceeded, "{err}");
    let s = svc.handle().stats();
    assert_eq!(up.calls(), 0);
    assert_eq!((s.admitted, s.rejected, s.deadline_exceeded), (0, 0, 1));
    assert_eq!(s.available, 4);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_shorter_than_the_max_wait_ends_the_wait_with_deadline_exceeded() {
    for lanes in [false, true] {
        let (svc, up, blocker) = busy_gate(lanes).await;
        let cx = Arc::new(CallContext::new());
        let mut req = with_deadline(Ask::numbered(1), secs(2));
        req.ext.insert(cx.clone());
        let start = Instant::now();
        let err = svc.clone().oneshot(req).await.unwrap_err();
        assert_eq!(err.class(), FailureClass::DeadlineExceeded, "{err}");
        assert!(Rejection::of(&err).is_none());
        assert_eq!(
            start.elapsed(),
            secs(2),
            "cut to the deadline, not the 30 s wait"
        );
        let facts = cx.snapshot();
        assert_eq!(facts.queue_wait, Some(secs(2)));
        assert!(facts.rejections.is_empty(), "not a gate rejection");
        let s = svc.handle().stats();
        assert_eq!((s.queued, s.rejected, s.deadline_exceeded), (0, 0, 1));
        // The permit it never got is still there for the next call.
        drop(blocker);
        settle().await;
        assert_eq!(svc.handle().stats().available, 1);
        drop(svc.clone().oneshot(Ask::numbered(2)).await.unwrap());
        assert_eq!(up.calls(), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn a_deadline_later_than_the_max_wait_leaves_the_gate_rejection() {
    let (svc, _up, _blocker) = busy_gate(false).await;
    let start = Instant::now();
    let err = svc
        .clone()
        .oneshot(with_deadline(Ask::numbered(1), secs(60)))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::GateRejected, "{err}");
    assert_eq!(
        Rejection::of(&err).unwrap().reason(),
        RejectReason::WaitTimeout
    );
    assert_eq!(start.elapsed(), secs(30));
}

#[tokio::test(start_paused = true)]
async fn a_batch_call_whose_deadline_passes_in_its_lane_leaves_the_lane_clean() {
    let (svc, _up, blocker) = busy_gate(true).await;
    let mut req = with_deadline(Ask::numbered(1), secs(3));
    req.ext.insert(Priority::Batch);
    let err = svc.clone().oneshot(req).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::DeadlineExceeded, "{err}");
    let lane = svc.handle().lane_stats(Priority::Batch);
    assert_eq!((lane.in_flight, lane.queued), (0, 0));
    drop(blocker);
    settle().await;
    let mut next = Ask::numbered(2);
    next.ext.insert(Priority::Batch);
    drop(svc.clone().oneshot(next).await.unwrap());
}

/// A key whose rate admits the call only after the caller's deadline fails at once: waiting
/// could not help.
#[tokio::test(start_paused = true)]
async fn a_rate_wait_past_the_deadline_fails_at_once() {
    let up = Upstream::new(|_| Reply::ok());
    let svc: Gate = ConcurrencyGateLayer::builder()
        .max_wait(secs(30))
        .rates(Rates::new().with_requests(Limit::per_minute(60).with_burst(1)))
        .build()
        .unwrap()
        .layer(up.clone());
    drop(svc.clone().oneshot(Ask::numbered(0)).await.unwrap());
    let start = Instant::now();
    let err = svc
        .clone()
        .oneshot(with_deadline(Ask::numbered(1), Duration::from_millis(500)))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::DeadlineExceeded, "{err}");
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Without a deadline the same call waits its second for the refill.
    drop(svc.clone().oneshot(Ask::numbered(2)).await.unwrap());
    assert_eq!(start.elapsed(), secs(1));
}

/// An HTTP request's `x-seawall-timeout` header becomes its deadline at `prepare`, and the
/// gate respects it.
#[tokio::test(start_paused = true)]
async fn a_timeout_header_bounds_the_wait() {
    let inner = tower::service_fn(|_req: http::Request<Bytes>| async {
        tokio::time::sleep(secs(60)).await;
        Ok::<_, LlmError>(http::Response::new(http_body_util::Full::new(Bytes::new())))
    });
    let svc = ConcurrencyGateLayer::builder()
        .limit(1)
        .max_wait(secs(30))
        .build()
        .unwrap()
        .layer(inner);
    let req = |timeout: Option<&str>| {
        let mut b = http::Request::post("https://api.openai.com/v1/chat/completions");
        if let Some(t) = timeout {
            b = b.header(seawall_core::TIMEOUT_HEADER, t);
        }
        b.body(Bytes::from_static(br#"{"model":"m","messages":[]}"#))
            .unwrap()
    };
    let _busy = tokio::spawn(svc.clone().oneshot(req(None)));
    settle().await;
    let start = Instant::now();
    let err = svc.clone().oneshot(req(Some("1.5"))).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::DeadlineExceeded, "{err}");
    assert_eq!(start.elapsed(), Duration::from_millis(1500));
}
