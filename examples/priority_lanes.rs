//! Priority lanes in the gate: a batch flood beside interactive calls, with and without lanes.
//!
//! ```text
//! cargo run --example priority_lanes
//! ```
//!
//! A gate of 8 permits in front of an upstream that answers every call in 100 ms. A batch job
//! sends 10,000 requests at once with `x-seawall-priority: batch`; from t = 1 s an interactive
//! service sends one request every 50 ms. Without lanes the interactive calls queue behind the
//! whole backlog (about two minutes); with the batch lane at half the permits they wait for at
//! most one batch call, and most not at all. Then a batch request with `x-seawall-timeout: 2`
//! (the caller gives up after 2 s) behind 5 s of batch work fails with `DeadlineExceeded`
//! after 2 s in the queue, instead of waiting out the gate's 10-minute maximum wait.
//!
//! The clock is tokio's paused test clock, so the two minutes of the run without lanes pass at
//! once and the figures are exact.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use seawall::LlmError;
use seawall::core::HookedBody;
use seawall::gate::{
    ConcurrencyGateLayer, GatePermit, LaneShare, PRIORITY_HEADER, Priority, QueueWait,
};
use tokio::time::{Instant, sleep, sleep_until};
use tower::{Layer, Service, ServiceExt, service_fn};

const LATENCY: Duration = Duration::from_millis(100);

fn request(priority: &str, timeout: Option<&str>) -> Request<Bytes> {
    let mut b = Request::post("https://api.openai.com/v1/chat/completions")
        .header(PRIORITY_HEADER, priority);
    if let Some(t) = timeout {
        b = b.header(seawall::core::TIMEOUT_HEADER, t);
    }
    b.body(Bytes::from_static(
        br#"{"model":"gpt-4o-mini","max_tokens":64,"messages":[]}"#,
    ))
    .expect("a valid request")
}

/// What the gate answers over this upstream.
type Answer = Response<HookedBody<Full<Bytes>, GatePermit>>;

/// The gate, with or without lanes, over an upstream of a fixed latency.
fn stack(
    lanes: bool,
) -> impl Service<Request<Bytes>, Response = Answer, Error = LlmError, Future: Send>
+ Clone
+ Send
+ 'static {
    let upstream = service_fn(|_req: Request<Bytes>| async {
        sleep(LATENCY).await;
        Ok::<_, LlmError>(Response::new(Full::new(Bytes::from_static(b"{}"))))
    });
    let mut gate = ConcurrencyGateLayer::builder()
        .limit(8)
        .max_queue(20_000)
        .max_wait(Duration::from_secs(600));
    if lanes {
        gate = gate.lane(
            Priority::Batch,
            LaneShare {
                permits: 0.5,
                rate: 0.5,
            },
        );
    }
    gate.build().expect("valid settings").layer(upstream)
}

/// Runs the flood and the interactive calls; returns the interactive queue waits, sorted.
async fn run(lanes: bool) -> Vec<Duration> {
    let svc = stack(lanes);
    // A response holds its permit until it is dropped: each task drops its own.
    let call = |req| {
        let svc = svc.clone();
        tokio::spawn(async move { svc.oneshot(req).await.map(drop) })
    };
    let batch: Vec<_> = (0..10_000).map(|_| call(request("batch", None))).collect();
    let start = Instant::now();
    let interactive: Vec<_> = (0..100u64)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                sleep_until(start + Duration::from_millis(1030 + 50 * i)).await;
                let resp = svc.oneshot(request("interactive", None)).await?;
                Ok::<_, LlmError>(resp.extensions().get::<QueueWait>().map(|w| w.0))
            })
        })
        .collect();
    let mut waits = Vec::new();
    for t in interactive {
        waits.push(
            t.await
                .expect("no panic")
                .expect("admitted")
                .unwrap_or_default(),
        );
    }
    for t in batch {
        t.await.expect("no panic").expect("admitted");
    }
    waits.sort();
    waits
}

fn show(label: &str, w: &[Duration]) {
    let q = |q: f64| w[((q * w.len() as f64).ceil() as usize).clamp(1, w.len()) - 1];
    println!(
        "{label:<28} interactive queue wait: p50 {:>9.1?}  p99 {:>9.1?}  max {:>9.1?}",
        q(0.5),
        q(0.99),
        w[w.len() - 1]
    );
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    println!(
        "8 permits, 100 ms per call, 10,000 batch calls at t = 0, an interactive call every 50 ms from t = 1 s\n"
    );
    show("one FIFO (no lanes):", &run(false).await);
    show("batch lane at half:", &run(true).await);

    // The caller's deadline cuts the gate's 10-minute wait.
    let svc = stack(true);
    let backlog: Vec<_> = (0..408)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(request("batch", None)).await.map(drop) })
        })
        .collect();
    // Let the backlog queue up first.
    sleep(Duration::from_millis(1)).await;
    let start = Instant::now();
    let err = svc
        .clone()
        .oneshot(request("batch", Some("2")))
        .await
        .expect_err("the deadline passes in the queue");
    println!(
        "\na batch call with x-seawall-timeout: 2 behind 400 waiting (5 s of work) failed after {:?}: {err}",
        start.elapsed()
    );
    for t in backlog {
        t.await.expect("no panic").expect("admitted");
    }
}
