//! The auto-sizing mode against an upstream that keeps a requests-per-minute bucket and
//! reports it in its rate-limit snapshot, on paused time: the permits grow to fit an upstream
//! with room, shrink when its limit or its latency drops, stay in `[min, max]`, and a burst
//! earns no 429.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Ask, Reply, Upstream};
use http_body_util::BodyExt;
use seawall_core::{FailureClass, LlmError, RateLimitSnapshot, RateLimitWindow};
use seawall_gate::{AutoSize, ConcurrencyGateLayer, GateHandle, QueueWait};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An upstream's requests-per-minute bucket (full at the start, refilled continuously, a
/// minute's worth deep, as OpenAI's and Anthropic's are) and its latency; both can change.
struct Limits {
    rpm: f64,
    level: f64,
    at: Instant,
    latency: Duration,
}

#[derive(Clone)]
struct Provider {
    limits: Arc<Mutex<Limits>>,
    rejected: Arc<AtomicUsize>,
}

impl Provider {
    fn new(rpm: u64, latency: Duration) -> Self {
        Provider {
            limits: Arc::new(Mutex::new(Limits {
                rpm: rpm as f64,
                level: rpm as f64,
                at: Instant::now(),
                latency,
            })),
            rejected: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn set(&self, rpm: u64, latency: Duration) {
        let mut l = self.limits.lock().unwrap();
        l.rpm = rpm as f64;
        l.level = l.level.min(l.rpm);
        l.latency = latency;
    }

    /// Answers after the latency with the bucket in its snapshot, or a 429 at once when the
    /// bucket is empty.
    fn upstream(&self) -> Upstream {
        let p = self.clone();
        Upstream::new(move |_| {
            let mut l = p.limits.lock().unwrap();
            let now = Instant::now();
            let refill = now.duration_since(l.at).as_secs_f64() * l.rpm / 60.0;
            l.level = (l.level + refill).min(l.rpm);
            l.at = now;
            let per_unit = 60.0 / l.rpm;
            if l.level < 1.0 {
                p.rejected.fetch_add(1, Ordering::SeqCst);
                let wait = Duration::from_secs_f64((1.0 - l.level) * per_unit);
                return Reply::err(
                    LlmError::new(FailureClass::RateLimited, "429").with_retry_after(wait),
                );
            }
            l.level -= 1.0;
            let remaining = l.level.floor() as u64;
            let limit = l.rpm as u64;
            let snapshot = RateLimitSnapshot {
                requests: RateLimitWindow {
                    limit: Some(limit),
                    remaining: Some(remaining),
                    reset_after: Some(Duration::from_secs_f64(
                        (limit - remaining) as f64 * per_unit,
                    )),
                },
                ..Default::default()
            };
            Reply::Ok {
                delay: l.latency,
                usage: None,
                snapshot: Some(Box::new(snapshot)),
                hold: false,
            }
        })
    }

    fn rejected(&self) -> usize {
        self.rejected.load(Ordering::SeqCst)
    }
}

/// What a run of clients saw.
#[derive(Debug, Default)]
struct Run {
    calls: usize,
    /// Calls admitted after waiting in the gate.
    waited: usize,
    failed: usize,
    /// The lowest and highest limit seen while it ran (sampled after every call).
    limits: (usize, usize),
}

/// `clients` callers, each calling again as soon as its answer ends, for `for_`.
async fn run(up: &Upstream, gate: &ConcurrencyGateLayer, clients: usize, for_: Duration) -> Run {
    let end = Instant::now() + for_;
    let svc = gate.layer(up.clone());
    let handle = gate.handle();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let svc = svc.clone();
            let handle = handle.clone();
            tokio::spawn(async move {
                let mut run = Run {
                    limits: (usize::MAX, 0),
                    ..Run::default()
                };
                let mut i = 0;
                while Instant::now() < end {
                    i += 1;
                    let out = svc.clone().oneshot(Ask::numbered(c * 1_000_000 + i)).await;
                    run.calls += 1;
                    match out {
                        Ok(resp) => {
                            let wait = resp.extensions().get::<QueueWait>().copied();
                            if wait.is_some_and(|w| !w.0.is_zero()) {
                                run.waited += 1;
                            }
                            resp.into_body().collect().await.unwrap();
                        }
                        Err(_) => run.failed += 1,
                    }
                    let limit = handle.stats().limit;
                    run.limits = (run.limits.0.min(limit), run.limits.1.max(limit));
                }
                run
            })
        })
        .collect();
    let mut total = Run {
        limits: (usize::MAX, 0),
        ..Run::default()
    };
    for t in tasks {
        let r = t.await.unwrap();
        total.calls += r.calls;
        total.waited += r.waited;
        total.failed += r.failed;
        total.limits = (
            total.limits.0.min(r.limits.0),
            total.limits.1.max(r.limits.1),
        );
    }
    total
}

fn autosized(start: usize, autosize: AutoSize) -> (ConcurrencyGateLayer, GateHandle) {
    let gate = ConcurrencyGateLayer::builder()
        .limit(start)
        .max_queue(10_000)
        .max_wait(Duration::from_secs(600))
        .autosize(autosize)
        .build()
        .unwrap();
    let handle = gate.handle();
    (gate, handle)
}

#[tokio::test(start_paused = true)]
async fn permits_grow_to_fit_an_upstream_with_room_and_the_queue_wait_vanishes() {
    // 60,000 requests a minute (1,000/s) of 200 ms each: 0.7 x 1,000 x 0.2 = 140 permits.
    let provider = Provider::new(60_000, ms(200));
    let up = provider.upstream();
    let (gate, handle) = autosized(16, AutoSize::new());
    // 40 clients behind the 16 permits it starts with: most calls wait at first.
    let first = run(&up, &gate, 40, Duration::from_secs(2)).await;
    assert!(first.waited > 0, "{first:?}");
    assert_eq!(handle.stats().limit, 140);
    // Once grown, nobody waits.
    let then = run(&up, &gate, 40, Duration::from_secs(5)).await;
    assert_eq!(then.waited, 0, "{then:?}");
    assert_eq!(then.failed + first.failed, 0);
    assert!(then.calls >= 40 * 24, "{then:?}");
    assert_eq!(provider.rejected(), 0);

    // A fixed gate of 16 keeps 40 clients waiting for good.
    let fixed = ConcurrencyGateLayer::builder()
        .limit(16)
        .max_queue(10_000)
        .build()
        .unwrap();
    let stuck = run(&up, &fixed, 40, Duration::from_secs(5)).await;
    assert!(stuck.waited > stuck.calls / 2, "{stuck:?}");
}

#[tokio::test(start_paused = true)]
async fn permits_shrink_when_the_limit_drops() {
    let provider = Provider::new(60_000, ms(200));
    let up = provider.upstream();
    let (gate, handle) = autosized(16, AutoSize::new());
    run(&up, &gate, 40, Duration::from_secs(3)).await;
    assert_eq!(handle.stats().limit, 140);
    // The upstream now allows 6,000 a minute: 0.7 x 100 x 0.2 = 14.
    provider.set(6_000, ms(200));
    let r = run(&up, &gate, 40, Duration::from_secs(10)).await;
    assert_eq!(handle.stats().limit, 14, "{r:?}");
    assert_eq!(provider.rejected(), 0, "{r:?}");
}

#[tokio::test(start_paused = true)]
async fn permits_shrink_when_the_latency_drops() {
    let provider = Provider::new(60_000, ms(200));
    let up = provider.upstream();
    let (gate, handle) = autosized(16, AutoSize::new());
    run(&up, &gate, 40, Duration::from_secs(3)).await;
    assert_eq!(handle.stats().limit, 140);
    // Calls of 20 ms: 0.7 x 1,000 x 0.02 = 14 permits use the same share of the limit.
    provider.set(60_000, ms(20));
    let r = run(&up, &gate, 40, Duration::from_secs(5)).await;
    assert_eq!(handle.stats().limit, 14, "{r:?}");
    assert_eq!(provider.rejected(), 0, "{r:?}");
}

#[tokio::test(start_paused = true)]
async fn permits_never_leave_the_configured_bounds() {
    let provider = Provider::new(60_000, ms(200));
    let up = provider.upstream();
    let bounds = AutoSize::new().with_min_limit(20).with_max_limit(50);
    let (gate, handle) = autosized(16, bounds);
    // Brought into the bounds from the start.
    assert_eq!(handle.stats().limit, 20);
    // 140 wanted: held at 50.
    let high = run(&up, &gate, 80, Duration::from_secs(3)).await;
    assert_eq!(high.limits, (20, 50), "{high:?}");
    assert_eq!(handle.stats().limit, 50);
    // 0.7 x 10/s x 0.2 s is 1: held at 20.
    provider.set(600, ms(200));
    let low = run(&up, &gate, 80, Duration::from_secs(60)).await;
    assert!(low.limits.0 >= 20 && low.limits.1 <= 50, "{low:?}");
    assert_eq!(handle.stats().limit, 20);
}

#[tokio::test(start_paused = true)]
async fn a_burst_earns_no_429_from_an_upstream_with_a_small_limit() {
    // 600 requests a minute (10/s) of 500 ms each: 0.7 x 10 x 0.5 = 3 permits, 6 calls a
    // second, while 400 callers arrive at once.
    let provider = Provider::new(600, ms(500));
    let (gate, handle) = autosized(16, AutoSize::new());
    let r = run(&provider.upstream(), &gate, 400, Duration::from_secs(120)).await;
    assert_eq!(provider.rejected(), 0, "{r:?}");
    assert_eq!(r.failed, 0, "{r:?}");
    assert_eq!(handle.stats().limit, 3);

    // The same burst through a fixed gate of 16 drains the bucket and earns 429s.
    let provider = Provider::new(600, ms(500));
    let fixed = ConcurrencyGateLayer::builder()
        .limit(16)
        .max_queue(10_000)
        .max_wait(Duration::from_secs(600))
        .build()
        .unwrap();
    run(&provider.upstream(), &fixed, 400, Duration::from_secs(120)).await;
    assert!(provider.rejected() > 0);
}
