//! Stress: many tasks on a multi-threaded runtime, dropped at random points (queued, in the
//! key's line, in flight, holding a body), while the limit is resized, with and without
//! priority lanes. Afterwards the books must balance: every permit back, none created, nobody
//! left queued.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{Ask, Name, Reply, Upstream};
use seawall_core::{Random, SeededRandom};
use seawall_gate::{ConcurrencyGate, ConcurrencyGateLayer, LaneShare, Limit, Priority, Rates};
use tower::{Layer, ServiceExt};

async fn yields(n: u64) {
    for _ in 0..n {
        tokio::task::yield_now().await;
    }
}

async fn run(tasks: usize, resize: bool, lanes: bool, seed: u64) {
    const LIMIT: usize = 6;
    let up = Upstream::new(|_| Reply::ok());
    let mut builder = ConcurrencyGateLayer::builder();
    if lanes {
        builder = builder
            .lane(
                Priority::Batch,
                LaneShare {
                    permits: 0.3,
                    rate: 0.5,
                },
            )
            .lane_linger(Duration::from_micros(50));
    }
    let layer = builder
        .limit(LIMIT)
        .max_queue(tasks)
        .max_wait(Duration::from_secs(3600))
        // Key "a" is rated (so its calls go through the key's line); it never runs dry.
        .key_rates(
            "a",
            Rates::new().with_requests(Limit::per_minute(u64::MAX / 2).with_burst(u64::MAX / 4)),
        )
        .build()
        .unwrap();
    let h = layer.handle();
    let svc: ConcurrencyGate<Upstream> = layer.layer(up.clone());
    let rng = Arc::new(SeededRandom::new(seed));

    let done = Arc::new(AtomicBool::new(false));
    let over = Arc::new(AtomicUsize::new(0));
    let monitor = {
        let (h, done, over) = (h.clone(), done.clone(), over.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let s = h.stats();
                // A permit is counted in flight only while held.
                if s.in_flight > s.limit + s.owed {
                    over.fetch_add(1, Ordering::SeqCst);
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let resizer = resize.then(|| {
        let (h, done, rng) = (h.clone(), done.clone(), rng.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                h.set_limit(1 + (rng.next_f64() * 10.0) as usize);
                yields(1 + (rng.next_f64() * 20.0) as u64).await;
            }
        })
    });

    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let svc = svc.clone();
            let rng = rng.clone();
            let h = h.clone();
            tokio::spawn(async move {
                let key = match i % 3 {
                    0 => Some("a"),
                    1 => Some("b"),
                    _ => None,
                };
                if i % 97 == 0 {
                    // Now and then the upstream pauses key "b" briefly.
                    h.pause_key(Some("b"), Duration::from_micros(200));
                }
                let mut req = Ask {
                    model: key.map(Name::from),
                    ..Ask::numbered(i)
                }
                .tokens(10, 10);
                if i % 2 == 0 {
                    req.ext.insert(Priority::Batch);
                }
                let give_up = (rng.next_f64() * 8.0) as u64;
                let hold = (rng.next_f64() * 4.0) as u64;
                tokio::select! {
                    r = svc.oneshot(req) => {
                        let resp = r.expect("no rejection with this queue and wait");
                        yields(hold).await;
                        drop(resp);
                    }
                    _ = yields(give_up) => {}
                }
            })
        })
        .collect();
    for t in handles {
        t.await.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    monitor.await.unwrap();
    if let Some(r) = resizer {
        r.await.unwrap();
    }
    h.set_limit(LIMIT);

    let s = h.stats();
    assert_eq!(
        over.load(Ordering::SeqCst),
        0,
        "more in flight than permits"
    );
    assert_eq!(s.queued, 0, "queue places leaked");
    assert_eq!(s.in_flight, 0, "permits leaked");
    assert_eq!(s.owed, 0);
    assert_eq!(s.available, LIMIT, "permits leaked or released twice");
    for p in Priority::ALL {
        let lane = h.lane_stats(p);
        assert_eq!((lane.in_flight, lane.queued), (0, 0), "{p:?}");
    }
    assert_eq!(
        s.admitted as usize,
        up.calls(),
        "every admission reached the upstream once"
    );
    assert_eq!(up.live(), 0);
    assert!(
        s.admitted > 0 && (s.admitted as usize) < tasks,
        "some tasks gave up, some got in"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_drops_never_leak_or_double_release_permits() {
    run(4000, false, false, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_drops_with_resizes_keep_the_books_balanced() {
    run(4000, true, false, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_drops_in_priority_lanes_with_resizes_keep_the_books_balanced() {
    run(4000, true, true, 3).await;
}
