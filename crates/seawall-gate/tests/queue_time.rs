//! Queue time reaches the response, the call context and the log.
//!
//! Alone in its own test binary: it installs a tracing subscriber, and a subscriber installed
//! while tests on other threads register the same callsites can miss the events it looks for.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Ask, Reply, Upstream, settle};
use seawall_core::{CallContext, FailureClass};
use seawall_gate::{ConcurrencyGateLayer, QueueWait, RejectReason, Rejection};
use tokio::time::advance;
use tower::{Layer, ServiceExt};

/// A `MakeWriter` that keeps what the log wrote.
#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[tokio::test(start_paused = true)]
async fn queue_time_is_recorded_in_extensions_context_and_tracing() {
    let buf = Buf::default();
    let w = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || w.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let up = Upstream::new(|r| {
        if r.id == 0 {
            Reply::after(secs(2))
        } else {
            Reply::ok()
        }
    });
    let svc = ConcurrencyGateLayer::builder()
        .limit(1)
        .max_queue(1)
        .max_wait(secs(10))
        .build()
        .unwrap()
        .layer(up.clone());
    let cx = Arc::new(CallContext::new());
    let mut req = Ask::numbered(1);
    req.ext.insert(cx.clone());

    // The first call's response is dropped as soon as it arrives, freeing its permit.
    let first = {
        let svc = svc.clone();
        tokio::spawn(async move { svc.oneshot(Ask::numbered(0)).await.map(drop) })
    };
    settle().await;
    // Attempt 1 waits 2 s behind the first call.
    let resp = svc.clone().oneshot(req.clone()).await.unwrap();
    assert_eq!(
        resp.extensions().get::<QueueWait>(),
        Some(&QueueWait(secs(2)))
    );
    assert_eq!(
        up.seen()[1].queue_wait,
        Some(QueueWait(secs(2))),
        "the inner service sees it"
    );
    first.await.unwrap().unwrap();
    drop(resp);
    // Attempt 2 (same call context) waits 3 s behind another call's open body.
    let blocker = svc.clone().oneshot(Ask::numbered(5)).await.unwrap();
    let attempt = tokio::spawn(svc.clone().oneshot(req.clone()));
    settle().await;
    advance(secs(3)).await;
    drop(blocker);
    drop(attempt.await.unwrap().unwrap());
    let facts = cx.snapshot();
    assert_eq!(facts.queue_wait, Some(secs(5)), "summed over attempts");
    assert!(facts.rejections.is_empty());

    // A rejection is recorded as well.
    let blocker = svc.clone().oneshot(Ask::numbered(6)).await.unwrap();
    let _queued = tokio::spawn(svc.clone().oneshot(Ask::numbered(7)));
    settle().await;
    let e = svc.clone().oneshot(req.clone()).await.unwrap_err();
    assert_eq!(e.class(), FailureClass::GateRejected, "{e}");
    let rejection = Rejection::of(&e).expect("a gate rejection");
    assert_eq!(rejection.reason(), RejectReason::QueueFull);
    assert_eq!(cx.snapshot().rejections, [FailureClass::GateRejected]);
    drop(blocker);

    let logs = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("queue_wait_ms=2000"), "{logs}");
    assert!(logs.contains("reason=\"queue_full\""), "{logs}");
}
