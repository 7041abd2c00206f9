//! Priority lanes on paused tokio time: interactive calls beside a batch flood, borrowing,
//! the starvation bound, and the lanes' shares of a key's rate.

mod common;

use std::time::Duration;

use common::{Ask, Gate, Reply, Upstream, gate, settle};
use seawall_core::LlmError;
use seawall_gate::{
    ConcurrencyGateLayer, LANE_FAIRNESS, LaneShare, Limit, Priority, QueueWait, Rates,
};
use tokio::time::{Instant, advance, sleep, sleep_until};
use tower::ServiceExt;

const HALF: LaneShare = LaneShare {
    permits: 0.5,
    rate: 0.5,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn ask(id: usize, p: Priority) -> Ask {
    let mut a = Ask::numbered(id);
    a.ext.insert(p);
    a
}

/// Spawns a call whose response is dropped on arrival; resolves to its queue wait.
fn spawn_call(svc: &Gate, req: Ask) -> tokio::task::JoinHandle<Result<Duration, LlmError>> {
    let svc = svc.clone();
    tokio::spawn(async move {
        let resp = svc.oneshot(req).await?;
        Ok(resp.extensions().get::<QueueWait>().unwrap().0)
    })
}

/// The `q`-quantile of sorted `waits` (nearest rank).
fn quantile(waits: &[Duration], q: f64) -> Duration {
    let i = ((q * waits.len() as f64).ceil() as usize).clamp(1, waits.len()) - 1;
    waits[i]
}

/// Runs 100 interactive calls, one every 50 ms from t = 1.03 s, against an upstream of a
/// fixed 100 ms latency and a gate of 8 permits, beside `batch` batch calls all sent at
/// t = 0; returns the interactive calls' queue waits, sorted.
async fn interactive_waits(lanes: bool, batch: usize) -> Vec<Duration> {
    let up = Upstream::new(|_| Reply::after(ms(100)));
    let mut b = ConcurrencyGateLayer::builder()
        .limit(8)
        .max_queue(20_000)
        .max_wait(Duration::from_secs(3600));
    if lanes {
        b = b.lane(Priority::Batch, HALF);
    }
    let svc = gate(b, &up);
    let flood: Vec<_> = (0..batch)
        .map(|i| spawn_call(&svc, ask(100_000 + i, Priority::Batch)))
        .collect();
    let start = Instant::now();
    let interactive: Vec<_> = (0..100)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                sleep_until(start + ms(1030 + 50 * i as u64)).await;
                spawn_call(&svc, ask(i, Priority::Interactive))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut waits = Vec::new();
    for t in interactive {
        waits.push(t.await.unwrap().unwrap());
    }
    for t in flood {
        t.await.unwrap().unwrap();
    }
    waits.sort();
    waits
}

/// A batch flood of 10,000 calls beside 100 interactive ones (8 permits, 100 ms per call, an
/// interactive call every 50 ms from t = 1.03 s): the interactive queue wait stays at the
/// no-batch figure, except for the calls that arrive while the batch lane, alone until then,
/// has borrowed every permit: they wait for batch calls to end, never longer than one call.
///
/// Measured (paused time, so exact; `cargo test -p seawall-gate --test lanes -- --nocapture`):
/// - interactive alone: p50 0 ms, p99 0 ms, max 0 ms;
/// - beside the flood, batch lane at half the permits: p50 0 ms, p99 20 ms, max 70 ms (the
///   two calls at t = 1.03 s and 1.08 s wait for the batch calls that end at t = 1.1 s; from
///   then on the batch lane keeps to its 4 permits and no interactive call waits);
/// - beside the flood in a gate without lanes (one FIFO): p50 122 s, p99 124 s: every
///   interactive call waits behind the whole backlog.
#[tokio::test(start_paused = true)]
async fn interactive_wait_stays_near_the_no_batch_figure_beside_a_batch_flood() {
    let alone = interactive_waits(true, 0).await;
    let flood = interactive_waits(true, 10_000).await;
    let fifo = interactive_waits(false, 10_000).await;
    let show = |w: &[Duration]| {
        format!(
            "p50 {:?}, p99 {:?}, max {:?}",
            quantile(w, 0.5),
            quantile(w, 0.99),
            w[w.len() - 1]
        )
    };
    eprintln!("interactive alone:       {}", show(&alone));
    eprintln!("beside the batch flood:  {}", show(&flood));
    eprintln!("same flood, no lanes:    {}", show(&fifo));
    assert_eq!(quantile(&alone, 0.99), Duration::ZERO);
    assert_eq!(quantile(&flood, 0.5), quantile(&alone, 0.5));
    assert_eq!(
        flood.iter().filter(|w| !w.is_zero()).count(),
        2,
        "only the calls before the first batch call ended waited: {}",
        show(&flood)
    );
    assert!(
        flood[flood.len() - 1] <= ms(100),
        "never more than one batch call's latency: {}",
        show(&flood)
    );
    assert!(
        quantile(&fifo, 0.5) > Duration::from_secs(60),
        "without lanes the flood delays them: {}",
        show(&fifo)
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_lane_alone_borrows_every_permit() {
    let up = Upstream::new(|_| Reply::stream());
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(8)
            .lane(Priority::Batch, HALF),
        &up,
    );
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(svc.oneshot(ask(i, Priority::Batch)))
        })
        .collect();
    settle().await;
    assert_eq!(
        up.live(),
        8,
        "the batch lane holds all 8 permits, not its 4"
    );
    let h = svc.handle();
    assert_eq!(h.lane_stats(Priority::Batch).in_flight, 8);
    assert_eq!(h.lane_stats(Priority::Batch).queued, 12);
    assert_eq!(h.lane_stats(Priority::Interactive).in_flight, 0);
    for i in 0..20 {
        up.end(i);
    }
    for c in calls {
        drop(c.await.unwrap().unwrap());
        settle().await;
        for i in 0..20 {
            up.end(i);
        }
    }
    assert_eq!(h.stats().available, 8);
}

/// Four batch streams hold all four permits. The first freed permit goes to the waiting
/// interactive call, not to the next batch call; after that the batch lane holds no more than
/// its share of two while interactive calls are about, so the next interactive call finds a
/// free permit at once.
#[tokio::test(start_paused = true)]
async fn the_batch_lane_waits_first_and_leaves_the_rest_to_interactive_calls() {
    let up = Upstream::new(|_| Reply::stream());
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(4)
            .lane(Priority::Batch, HALF),
        &up,
    );
    let h = svc.handle();
    let batch: Vec<_> = (0..6)
        .map(|i| tokio::spawn(svc.clone().oneshot(ask(i, Priority::Batch))))
        .collect();
    settle().await;
    assert_eq!(up.calls(), 4);
    let first = tokio::spawn(svc.clone().oneshot(ask(10, Priority::Interactive)));
    settle().await;
    assert_eq!(h.lane_stats(Priority::Interactive).queued, 1);
    up.end(0);
    let mut batch = batch.into_iter();
    drop(batch.next().unwrap().await.unwrap().unwrap());
    settle().await;
    let seen: Vec<_> = up.seen().iter().map(|s| s.id).collect();
    assert_eq!(seen, [0, 1, 2, 3, 10], "the interactive call went first");
    // A second batch call ends: the batch lane is down to its share, 2, and takes no more.
    up.end(1);
    drop(batch.next().unwrap().await.unwrap().unwrap());
    settle().await;
    assert_eq!(h.lane_stats(Priority::Batch).in_flight, 2);
    assert_eq!(h.lane_stats(Priority::Batch).queued, 2);
    assert_eq!(h.stats().available, 1);
    let second = svc
        .clone()
        .oneshot(ask(11, Priority::Interactive))
        .await
        .unwrap();
    assert_eq!(
        second.extensions().get::<QueueWait>(),
        Some(&QueueWait(Duration::ZERO))
    );
    // Once the interactive lane is idle for the linger, the batch lane borrows again.
    up.end(10);
    drop(first.await.unwrap().unwrap());
    drop(second);
    up.end(11);
    settle().await;
    assert_eq!(
        h.lane_stats(Priority::Batch).in_flight,
        2,
        "within the linger"
    );
    advance(seawall_gate::DEFAULT_LANE_LINGER).await;
    up.end(2);
    drop(batch.next().unwrap().await.unwrap().unwrap());
    settle().await;
    assert_eq!(
        h.lane_stats(Priority::Batch).in_flight,
        3,
        "both waiting batch calls went once the interactive lane was idle"
    );
    assert_eq!(h.lane_stats(Priority::Batch).queued, 0);
}

/// Under constant interactive load a waiting batch call is passed over at most
/// `LANE_FAIRNESS` (8) times: the ninth permit is its.
#[tokio::test(start_paused = true)]
async fn a_waiting_batch_call_is_served_within_the_fairness_bound() {
    let up = Upstream::new(|r| {
        if r.id == 0 {
            Reply::stream()
        } else {
            Reply::after(ms(10))
        }
    });
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(1)
            .lane(Priority::Batch, HALF),
        &up,
    );
    let blocker = svc
        .clone()
        .oneshot(ask(0, Priority::Interactive))
        .await
        .unwrap();
    let interactive: Vec<_> = (1..=30)
        .map(|i| spawn_call(&svc, ask(i, Priority::Interactive)))
        .collect();
    settle().await;
    let batch = spawn_call(&svc, ask(100, Priority::Batch));
    settle().await;
    drop(blocker);
    let waited = batch.await.unwrap().unwrap();
    for t in interactive {
        t.await.unwrap().unwrap();
    }
    let seen: Vec<_> = up.seen().iter().map(|s| s.id).collect();
    let at = seen.iter().position(|&id| id == 100).unwrap();
    assert_eq!(
        at,
        1 + LANE_FAIRNESS as usize,
        "after the blocker, {LANE_FAIRNESS} interactive calls, then the batch call: {seen:?}"
    );
    assert_eq!(
        waited,
        ms(10) * LANE_FAIRNESS,
        "eight 10 ms calls ahead of it"
    );
}

/// A key of 60 RPM with a burst of 10, the batch lane at half of it: a batch flood takes 5
/// at once and leaves 5 for interactive calls, which go at once; over time the batch lane
/// alone gets the key's whole rate.
#[tokio::test(start_paused = true)]
async fn lane_shares_of_the_rate_are_respected() {
    let up = Upstream::new(|_| Reply::ok());
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(100)
            .max_wait(Duration::from_secs(3600))
            .rates(Rates::new().with_requests(Limit::per_minute(60).with_burst(10)))
            .lane(Priority::Batch, HALF),
        &up,
    );
    let batch: Vec<_> = (0..40)
        .map(|i| spawn_call(&svc, ask(1000 + i, Priority::Batch)))
        .collect();
    settle().await;
    assert_eq!(up.calls(), 5, "the batch lane takes half the burst");
    let interactive: Vec<_> = (0..6)
        .map(|i| spawn_call(&svc, ask(i, Priority::Interactive)))
        .collect();
    settle().await;
    assert_eq!(up.calls(), 10, "five interactive calls go at once");
    let mut waits = Vec::new();
    for t in interactive {
        waits.push(t.await.unwrap().unwrap());
    }
    assert_eq!(waits[..5], [Duration::ZERO; 5]);
    assert_eq!(
        waits[5],
        Duration::from_secs(1),
        "the sixth waits for a refill"
    );
    // From t = 10 s to t = 20 s the batch lane alone is admitted at the key's full rate.
    let start = Instant::now();
    sleep_until(start + Duration::from_secs(9)).await;
    let before = up.calls();
    sleep(Duration::from_secs(10)).await;
    assert_eq!(up.calls() - before, 10, "one a second: the whole rate");
    for t in batch {
        t.await.unwrap().unwrap();
    }
}

/// The same share on a token rate: 6,000 TPM with a burst of 1,000, calls of 100 tokens; the
/// batch lane takes 500 and leaves 500 to interactive calls.
#[tokio::test(start_paused = true)]
async fn lane_shares_of_the_token_rate_are_respected() {
    let up = Upstream::new(|_| Reply::used(50, 50));
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(100)
            .max_wait(Duration::from_secs(3600))
            .rates(Rates::new().with_tokens(Limit::per_minute(6_000).with_burst(1_000)))
            .lane(Priority::Batch, HALF),
        &up,
    );
    let _batch: Vec<_> = (0..20)
        .map(|i| spawn_call(&svc, ask(1000 + i, Priority::Batch).tokens(50, 50)))
        .collect();
    settle().await;
    assert_eq!(up.calls(), 5, "500 of the 1,000-token burst");
    let interactive: Vec<_> = (0..5)
        .map(|i| spawn_call(&svc, ask(i, Priority::Interactive).tokens(50, 50)))
        .collect();
    for t in interactive {
        assert_eq!(t.await.unwrap().unwrap(), Duration::ZERO);
    }
    assert_eq!(up.calls(), 10);
}

#[tokio::test(start_paused = true)]
async fn each_lane_has_its_own_queue_places() {
    let up = Upstream::new(|_| Reply::stream());
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(1)
            .max_queue(3)
            .lane(Priority::Batch, HALF),
        &up,
    );
    let _batch: Vec<_> = (0..4)
        .map(|i| tokio::spawn(svc.clone().oneshot(ask(i, Priority::Batch))))
        .collect();
    settle().await;
    let refused = svc.clone().oneshot(ask(9, Priority::Batch)).await;
    assert!(refused.is_err(), "the batch lane's queue is full");
    let interactive = tokio::spawn(svc.clone().oneshot(ask(10, Priority::Interactive)));
    settle().await;
    assert!(!interactive.is_finished(), "queued, not refused");
    assert_eq!(svc.handle().lane_stats(Priority::Interactive).queued, 1);
    assert_eq!(svc.handle().stats().queued, 4);
}
