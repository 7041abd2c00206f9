//! The gate's behaviour, on paused tokio time.

mod common;

use std::time::Duration;

use common::{Ask, Gate, Reply, Upstream, call, gate, rejection, settle};
use seawall_core::{
    FailureClass, LlmError, MediaParts, PartEstimate, RateLimitSnapshot, RateLimitWindow,
};
use seawall_gate::{
    Adaptive, ConcurrencyGateBuilder, ConcurrencyGateLayer, Limit, QueueWait, Rates, RejectReason,
};
use tokio::time::{Instant, advance};
use tower::{Layer, Service, ServiceExt};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn spawn_call(svc: &Gate, req: Ask) -> tokio::task::JoinHandle<Result<common::Resp2, LlmError>> {
    tokio::spawn(svc.clone().oneshot(req))
}

/// Reads a body to its end (a completed call, for the adaptive mode).
async fn finish(resp: common::Resp2) {
    use http_body_util::BodyExt;
    resp.into_body().collect().await.unwrap();
}

/// Spawns a call whose response is dropped as soon as it arrives.
fn spawn_and_drop(svc: &Gate, req: Ask) -> tokio::task::JoinHandle<Result<(), LlmError>> {
    let svc = svc.clone();
    tokio::spawn(async move { svc.oneshot(req).await.map(drop) })
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_callers_never_exceed_the_limit() {
    let up = Upstream::new(|_| Reply::after(Duration::from_millis(10)));
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(8)
            .max_queue(20_000)
            .max_wait(secs(3600)),
        &up,
    );
    let tasks: Vec<_> = (0..10_000)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let resp = svc.oneshot(Ask::numbered(i)).await?;
                // Hold the body a little: the permit is held until it is dropped.
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(resp);
                Ok::<_, LlmError>(())
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(up.calls(), 10_000);
    assert_eq!(
        up.max_live(),
        8,
        "never more than 8 calls (bodies included) at once"
    );
    let s = svc.handle().stats();
    assert_eq!((s.in_flight, s.queued, s.available), (0, 0, 8));
    assert_eq!((s.admitted, s.rejected), (10_000, 0));
}

#[tokio::test(start_paused = true)]
async fn permits_are_shared_by_every_service_of_the_layer() {
    let up = Upstream::new(|_| Reply::stream());
    let layer = ConcurrencyGateLayer::builder()
        .limit(2)
        .max_queue(0)
        .build()
        .unwrap();
    let a = layer.layer(up.clone());
    let b = layer.layer(up.clone());
    let _r1 = call(&a, Ask::numbered(1)).await.unwrap();
    let _r2 = call(&b, Ask::numbered(2)).await.unwrap();
    let e = call(&a.clone(), Ask::numbered(3)).await.unwrap_err();
    assert_eq!(rejection(&e).reason(), RejectReason::QueueFull);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_rejects_at_once_with_the_depth_and_the_queue_is_fifo() {
    let up = Upstream::new(|_| Reply::stream());
    let svc = gate(ConcurrencyGateLayer::builder().limit(1).max_queue(3), &up);
    let first = call(&svc, Ask::numbered(0)).await.unwrap();
    let waiters: Vec<_> = (1..=3)
        .map(|i| spawn_call(&svc, Ask::numbered(i)))
        .collect();
    settle().await;
    assert_eq!(svc.handle().stats().queued, 3);

    let t0 = Instant::now();
    let e = call(&svc, Ask::numbered(99)).await.unwrap_err();
    assert_eq!(t0.elapsed(), Duration::ZERO, "rejected at once");
    let r = rejection(&e);
    assert_eq!(r.reason(), RejectReason::QueueFull);
    assert_eq!(r.queue_depth(), 3);
    assert!(e.to_string().contains("3 waiting"), "{e}");

    // The waiters go in arrival order as permits come back.
    drop(first);
    let mut order = Vec::new();
    for w in waiters {
        let resp = w.await.unwrap().unwrap();
        order.push(up.seen().last().unwrap().id);
        drop(resp);
    }
    assert_eq!(order, [1, 2, 3]);
    assert_eq!(svc.handle().stats().queued, 0);
}

#[tokio::test(start_paused = true)]
async fn max_wait_rejects_at_the_deadline() {
    let up = Upstream::new(|_| Reply::stream());
    let svc = gate(
        ConcurrencyGateLayer::builder().limit(1).max_wait(secs(5)),
        &up,
    );
    let _first = call(&svc, Ask::numbered(0)).await.unwrap();
    let t0 = Instant::now();
    let e = call(&svc, Ask::numbered(1)).await.unwrap_err();
    assert_eq!(t0.elapsed(), secs(5));
    let r = rejection(&e);
    assert_eq!(r.reason(), RejectReason::WaitTimeout);
    assert_eq!(r.waited(), secs(5));
    assert_eq!(r.queue_depth(), 0, "the rejected call left the queue");
    assert_eq!(svc.handle().stats().queued, 0);
    assert_eq!(up.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn poll_ready_never_rejects_the_call_does() {
    let up = Upstream::new(|_| Reply::ok());
    let mut svc = gate(ConcurrencyGateLayer::builder().limit(0).max_queue(0), &up);
    for _ in 0..3 {
        std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    }
    let e = svc.call(Ask::numbered(0)).await.unwrap_err();
    assert_eq!(rejection(&e).reason(), RejectReason::QueueFull);
}

#[tokio::test(start_paused = true)]
async fn dropped_waiters_leave_no_trace() {
    let up = Upstream::new(|_| Reply::stream());
    // A rate with room for exactly two requests, so a stolen reservation would show.
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(1)
            .max_wait(secs(3600))
            .rates(Rates::new().with_requests(Limit::per_minute(1).with_burst(2))),
        &up,
    );
    let first = call(&svc, Ask::numbered(0)).await.unwrap();
    // Waiters under the rated key (in its line) and unkeyed ones (at the permit queue).
    let mut waiters = Vec::new();
    for i in 1..=100 {
        let req = if i % 2 == 0 {
            Ask::numbered(i)
        } else {
            Ask {
                model: None,
                ..Ask::numbered(i)
            }
        };
        waiters.push(spawn_call(&svc, req));
    }
    settle().await;
    assert_eq!(svc.handle().stats().queued, 100);
    advance(secs(1)).await;
    for w in &waiters {
        w.abort();
    }
    for w in waiters {
        assert!(w.await.unwrap_err().is_cancelled());
    }
    let s = svc.handle().stats();
    assert_eq!((s.queued, s.in_flight, s.available), (0, 1, 0));
    drop(first);
    let s = svc.handle().stats();
    assert_eq!((s.in_flight, s.available), (0, 1));

    // The second request of the burst is still there: admitted at once.
    let resp = call(&svc, Ask::numbered(200)).await.unwrap();
    assert_eq!(
        resp.extensions().get::<QueueWait>(),
        Some(&QueueWait(Duration::ZERO))
    );
    drop(resp);
    // And the third waits for the refill (60 s a request, 1 s already passed).
    let t0 = Instant::now();
    drop(call(&svc, Ask::numbered(201)).await.unwrap());
    assert_eq!(t0.elapsed(), secs(59));
    assert_eq!(up.calls(), 3, "no dropped waiter reached the upstream");
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_in_flight_gives_its_permit_back() {
    let up = Upstream::new(|_| Reply::after(secs(10)));
    let svc = gate(ConcurrencyGateLayer::builder().limit(1), &up);
    let inflight = spawn_call(&svc, Ask::numbered(0));
    settle().await;
    advance(secs(1)).await;
    let s = svc.handle().stats();
    assert_eq!((s.in_flight, s.available, up.live()), (1, 0, 1));
    inflight.abort();
    assert!(inflight.await.unwrap_err().is_cancelled());
    let s = svc.handle().stats();
    assert_eq!((s.in_flight, s.available, up.live()), (0, 1, 0));
    let t0 = Instant::now();
    drop(call(&svc, Ask::numbered(1)).await.unwrap());
    assert_eq!(
        t0.elapsed(),
        secs(10),
        "admitted at once, then the upstream's 10 s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_holds_its_permit_until_its_body_is_dropped() {
    use http_body_util::BodyExt;
    let up = Upstream::new(|_| Reply::stream());
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(1)
            .max_wait(secs(3600)),
        &up,
    );
    let resp = call(&svc, Ask::numbered(0)).await.unwrap();
    let mut body = resp.into_body();
    up.send(0, "data: hello\n\n");
    assert!(body.frame().await.unwrap().is_ok());

    let second = spawn_call(&svc, Ask::numbered(1));
    settle().await;
    advance(secs(10)).await;
    settle().await;
    assert!(
        !second.is_finished(),
        "the open stream still holds the only permit"
    );
    assert_eq!(up.calls(), 1);

    drop(body);
    let resp = second.await.unwrap().unwrap();
    assert_eq!(
        resp.extensions().get::<QueueWait>(),
        Some(&QueueWait(secs(10)))
    );

    // A body read to its end gives the permit back too.
    let mut body = resp.into_body();
    let third = spawn_call(&svc, Ask::numbered(2));
    settle().await;
    assert!(!third.is_finished());
    up.end(1);
    assert!(body.frame().await.is_none());
    assert_eq!(svc.handle().stats().in_flight, 0);
    drop(third.await.unwrap().unwrap());
}

#[tokio::test(start_paused = true)]
async fn rpm_limit_holds_over_simulated_minutes() {
    let up = Upstream::new(|_| Reply::ok());
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(1000)
            .max_queue(10_000)
            .max_wait(secs(3600))
            .rates(Rates::new().with_requests(Limit::per_minute(60).with_burst(10))),
        &up,
    );
    let tasks: Vec<_> = (0..250)
        .map(|i| spawn_call(&svc, Ask::numbered(i)))
        .collect();
    for t in tasks {
        drop(t.await.unwrap().unwrap());
    }
    let at: Vec<Instant> = up.seen().iter().map(|s| s.at).collect();
    let t0 = at[0];
    // Any window of W seconds holds at most burst + W requests (60 a minute).
    for (i, from) in at.iter().enumerate() {
        let in_minute = at[i..]
            .iter()
            .take_while(|t| t.duration_since(*from) < secs(60))
            .count();
        assert!(
            in_minute <= 10 + 60,
            "{in_minute} in the minute after {:?}",
            *from - t0
        );
    }
    // Each whole minute after the first burst: 60.
    for m in 1..3 {
        let n = at
            .iter()
            .filter(|t| {
                let d = t.duration_since(t0);
                d > secs(60 * m) && d <= secs(60 * (m + 1))
            })
            .count();
        assert_eq!(n, 60, "minute {m}");
    }
    // And the limiter does not starve: 250 requests take burst + 240 s.
    assert_eq!(at.last().unwrap().duration_since(t0), secs(240));
}

#[tokio::test(start_paused = true)]
async fn tpm_limit_settles_with_real_usage() {
    async fn run(used_out: u64) -> (usize, Vec<(Instant, u64)>) {
        // Each request reserves 100 + 400 tokens; the upstream reports 100 in + `used_out` out.
        let up = Upstream::new(move |_| Reply::used(100, used_out));
        let svc = gate(
            ConcurrencyGateLayer::builder()
                .limit(1000)
                .max_queue(10_000)
                .max_wait(secs(3600))
                .rates(Rates::new().with_tokens(Limit::per_minute(6000).with_burst(1000))),
            &up,
        );
        let start = Instant::now();
        let tasks: Vec<_> = (0..200)
            .map(|i| spawn_and_drop(&svc, Ask::numbered(i).tokens(100, 400)))
            .collect();
        // Let three simulated minutes pass, then stop.
        tokio::time::sleep(secs(180)).await;
        for t in &tasks {
            t.abort();
        }
        let seen: Vec<(Instant, u64)> = up
            .seen()
            .iter()
            .filter(|s| s.at.duration_since(start) <= secs(180))
            .map(|s| (s.at, 100 + used_out))
            .collect();
        (seen.len(), seen)
    }
    fn check_windows(seen: &[(Instant, u64)], slack: u64) {
        for (i, (from, _)) in seen.iter().enumerate() {
            let used: u64 = seen[i..]
                .iter()
                .take_while(|(t, _)| t.duration_since(*from) < secs(60))
                .map(|(_, u)| u)
                .sum();
            assert!(used <= 1000 + 6000 + slack, "{used} tokens in a minute");
        }
    }
    // Using less than reserved: the unused tokens go back, so about (1000 + 18000) / 200 go
    // through, not (1000 + 18000) / 500 = 38.
    let (n, seen) = run(100).await;
    assert!((90..=96).contains(&n), "{n} admitted");
    check_windows(&seen, 500);
    // Using more than reserved: the overrun is charged, (1000 + 18000) / 1100 ≈ 17.
    let (n, seen) = run(1000).await;
    assert!((16..=19).contains(&n), "{n} admitted");
    check_windows(&seen, 1100);
}

fn exhausted(reset: Duration) -> RateLimitSnapshot {
    RateLimitSnapshot {
        requests: RateLimitWindow {
            limit: Some(100),
            remaining: Some(0),
            reset_after: Some(reset),
        },
        ..RateLimitSnapshot::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_remaining_zero_snapshot_pauses_admissions_until_a_request_is_free_again() {
    // 100 requests refill over the 5 s reset: the next one is free after 50 ms (the reset
    // headers of OpenAI and Anthropic give the time to a *full* window).
    let pause = secs(5) / 100;
    let up = Upstream::new(|r| {
        if r.id == 0 {
            Reply::with_snapshot(exhausted(secs(5)))
        } else {
            Reply::ok()
        }
    });
    let svc = gate(ConcurrencyGateLayer::builder().limit(10), &up);
    let t0 = Instant::now();
    drop(call(&svc, Ask::numbered(0)).await.unwrap());
    let queued: Vec<_> = (1..=3)
        .map(|i| spawn_call(&svc, Ask::numbered(i)))
        .collect();
    // Another key is not paused.
    drop(call(&svc, Ask::numbered(50).key("other")).await.unwrap());
    assert_eq!(t0.elapsed(), Duration::ZERO);
    for q in queued {
        let resp = q.await.unwrap().unwrap();
        assert_eq!(
            resp.extensions().get::<QueueWait>(),
            Some(&QueueWait(pause))
        );
    }
    for s in up.seen().iter().filter(|s| s.id >= 1 && s.id <= 3) {
        assert_eq!(
            s.at - t0,
            pause,
            "call {} went before the pause ended",
            s.id
        );
    }
    // After the reset the key admits at once again.
    let t1 = Instant::now();
    drop(call(&svc, Ask::numbered(9)).await.unwrap());
    assert_eq!(t1.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_429_with_a_hint_pauses_the_key_and_a_long_pause_rejects_at_once() {
    let up = Upstream::new(|r| match r.id {
        0 => Reply::err(
            LlmError::new(FailureClass::RateLimited, "slow down")
                .with_retry_after(Duration::from_millis(3500)),
        ),
        1 => Reply::err(
            LlmError::new(FailureClass::RateLimited, "slow down a lot").with_retry_after(secs(90)),
        ),
        _ => Reply::ok(),
    });
    let svc = gate(
        ConcurrencyGateLayer::builder().limit(10).max_wait(secs(60)),
        &up,
    );
    let t0 = Instant::now();
    let e = call(&svc, Ask::numbered(0)).await.unwrap_err();
    assert_eq!(e.class(), FailureClass::RateLimited);
    let waiting: Vec<_> = (2..5).map(|i| spawn_call(&svc, Ask::numbered(i))).collect();
    for w in waiting {
        drop(w.await.unwrap().unwrap());
    }
    for s in up.seen().iter().filter(|s| s.id >= 2) {
        assert_eq!(s.at - t0, Duration::from_millis(3500));
    }
    assert_eq!(svc.handle().stats().in_flight, 0);

    // A pause longer than the max wait rejects at once, with the time left as the hint.
    let e = call(&svc, Ask::numbered(1)).await.unwrap_err();
    assert_eq!(e.class(), FailureClass::RateLimited);
    let t1 = Instant::now();
    let e = call(&svc, Ask::numbered(7)).await.unwrap_err();
    assert_eq!(t1.elapsed(), Duration::ZERO);
    assert_eq!(rejection(&e).reason(), RejectReason::KeyPaused);
    assert_eq!(e.retry_after(), Some(secs(90)));
}

#[tokio::test(start_paused = true)]
async fn upstream_pauses_are_capped_by_max_pause() {
    let up = Upstream::new(|r| {
        if r.id == 0 {
            Reply::with_snapshot(exhausted(secs(3600)))
        } else {
            Reply::ok()
        }
    });
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(4)
            .max_wait(secs(60))
            .max_pause(secs(20)),
        &up,
    );
    drop(call(&svc, Ask::numbered(0)).await.unwrap());
    let t0 = Instant::now();
    drop(call(&svc, Ask::numbered(1)).await.unwrap());
    assert_eq!(t0.elapsed(), secs(20));
}

#[tokio::test(start_paused = true)]
async fn adaptive_mode_lowers_on_pushback_once_per_round_trip_and_recovers() {
    let up = Upstream::new(|r| match r.id {
        100..=199 => Reply::Err {
            delay: secs(1),
            error: LlmError::new(FailureClass::RateLimited, "429"),
        },
        200..=299 => Reply::Err {
            delay: secs(2),
            error: LlmError::new(FailureClass::Overloaded, "529"),
        },
        _ => Reply::ok(),
    });
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(10)
            .adaptive(Adaptive::new()),
        &up,
    );
    let h = svc.handle();
    // Two calls of the same wave get pushed back: one decrease, 10 -> 7.
    let a = spawn_call(&svc, Ask::numbered(100));
    let b = spawn_call(&svc, Ask::numbered(200));
    assert!(a.await.unwrap().is_err());
    assert_eq!(h.limit(), 7);
    assert!(b.await.unwrap().is_err());
    assert_eq!(h.limit(), 7, "a signal from before the decrease is ignored");
    // A call admitted after the decrease is pushed back too: 7 -> 4.
    assert!(call(&svc, Ask::numbered(201)).await.is_err());
    assert_eq!(h.limit(), 4);
    let s = h.stats();
    assert_eq!((s.limit, s.max_limit, s.available), (4, 10, 4));

    // +1 after as many successes as the limit: 4 + 5 + 6 + 7 + 8 + 9 = 39 to get back to 10.
    let mut limits = Vec::new();
    for i in 0..45 {
        finish(call(&svc, Ask::numbered(i)).await.unwrap()).await;
        limits.push(h.limit());
    }
    assert_eq!(limits[3], 5);
    assert_eq!(limits[37], 9);
    assert_eq!(limits[38], 10);
    assert_eq!(limits[44], 10, "never above the configured limit");
    assert_eq!(h.stats().available, 10);

    // Turning it off restores the configured limit.
    assert!(call(&svc, Ask::numbered(150)).await.is_err());
    assert_eq!(h.limit(), 7);
    h.set_adaptive(None).unwrap();
    assert_eq!(h.limit(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_body_that_fails_overloaded_counts_as_pushback() {
    use http_body_util::BodyExt;
    let up = Upstream::new(|_| Reply::stream());
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(10)
            .adaptive(Adaptive::new()),
        &up,
    );
    let mut body = call(&svc, Ask::numbered(0)).await.unwrap().into_body();
    up.fail(
        0,
        LlmError::new(FailureClass::Overloaded, "overloaded_error"),
    );
    assert!(body.frame().await.unwrap().is_err());
    assert_eq!(svc.handle().limit(), 7);
    assert_eq!(
        svc.handle().stats().in_flight,
        0,
        "the error ended the body's hold"
    );
}

#[tokio::test(start_paused = true)]
async fn runtime_resize_shrinks_as_calls_finish_and_grows_at_once() {
    let up = Upstream::new(|_| Reply::stream());
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(4)
            .max_wait(secs(3600)),
        &up,
    );
    let h = svc.handle();
    let mut held: Vec<_> = Vec::new();
    for i in 0..4 {
        held.push(call(&svc, Ask::numbered(i)).await.unwrap());
    }
    h.set_limit(2);
    let s = h.stats();
    assert_eq!((s.limit, s.in_flight, s.owed), (2, 4, 2));
    let waiter = spawn_call(&svc, Ask::numbered(10));
    settle().await;
    held.truncate(2);
    settle().await;
    assert!(!waiter.is_finished(), "2 in flight under a limit of 2");
    held.truncate(1);
    let w = waiter.await.unwrap().unwrap();
    assert_eq!(up.max_live(), 4);
    held.push(w);
    // Grow: admitted at once.
    h.set_limit(6);
    for i in 20..24 {
        let t0 = Instant::now();
        held.push(call(&svc, Ask::numbered(i)).await.unwrap());
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }
    assert_eq!(up.live(), 6);
    held.clear();
    let s = h.stats();
    assert_eq!((s.in_flight, s.available, s.owed, s.limit), (0, 6, 0, 6));

    // Queue bound and max wait change at run time too.
    h.set_max_queue(0);
    h.set_limit(0);
    let e = call(&svc, Ask::numbered(30)).await.unwrap_err();
    assert_eq!(rejection(&e).reason(), RejectReason::QueueFull);
    h.set_max_queue(5);
    h.set_max_wait(secs(2));
    let t0 = Instant::now();
    let e = call(&svc, Ask::numbered(31)).await.unwrap_err();
    assert_eq!(rejection(&e).reason(), RejectReason::WaitTimeout);
    assert_eq!(t0.elapsed(), secs(2));
}

#[tokio::test(start_paused = true)]
async fn runtime_rates_per_key() {
    let up = Upstream::new(|_| Reply::ok());
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(100)
            .max_wait(secs(3600))
            .key_rates(
                "slow",
                Rates::new().with_requests(Limit::per_minute(6).with_burst(1)),
            ),
        &up,
    );
    let h = svc.handle();
    assert!(h.rates().is_unlimited());
    assert_eq!(
        h.rates_for("slow").requests().unwrap().units_per_minute(),
        6
    );
    let t0 = Instant::now();
    for i in 0..3 {
        drop(call(&svc, Ask::numbered(i).key("fast")).await.unwrap());
    }
    assert_eq!(t0.elapsed(), Duration::ZERO);
    drop(call(&svc, Ask::numbered(10).key("slow")).await.unwrap());
    drop(call(&svc, Ask::numbered(11).key("slow")).await.unwrap());
    assert_eq!(t0.elapsed(), secs(10));
    // Limit every key at run time; lift the slow key's own limit.
    h.set_rates(Rates::new().with_requests(Limit::per_minute(60).with_burst(1)));
    h.set_key_rates("slow", None);
    let t1 = Instant::now();
    drop(call(&svc, Ask::numbered(20).key("fast")).await.unwrap());
    drop(call(&svc, Ask::numbered(21).key("fast")).await.unwrap());
    assert_eq!(t1.elapsed(), secs(1));
    // A zero rate rejects at once.
    h.set_key_rates("none", Some(Rates::new().requests_per_minute(0)));
    let e = call(&svc, Ask::numbered(30).key("none")).await.unwrap_err();
    assert_eq!(rejection(&e).reason(), RejectReason::ZeroRate);
}

#[tokio::test(start_paused = true)]
async fn a_rate_wait_beyond_max_wait_rejects_at_once_with_a_hint() {
    let up = Upstream::new(|_| Reply::ok());
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .max_wait(secs(5))
            .rates(Rates::new().with_requests(Limit::per_minute(6).with_burst(1))),
        &up,
    );
    drop(call(&svc, Ask::numbered(0)).await.unwrap());
    let t0 = Instant::now();
    let e = call(&svc, Ask::numbered(1)).await.unwrap_err();
    assert_eq!(t0.elapsed(), Duration::ZERO);
    assert_eq!(rejection(&e).reason(), RejectReason::RateLimited);
    assert_eq!(e.retry_after(), Some(secs(10)));
}

#[tokio::test(start_paused = true)]
async fn inner_errors_release_the_permit_and_give_back_output_tokens() {
    let up = Upstream::new(|r| {
        if r.id == 0 {
            Reply::err(LlmError::new(FailureClass::ServerError, "500"))
        } else {
            Reply::ok()
        }
    });
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(1)
            .rates(Rates::new().with_tokens(Limit::per_minute(60).with_burst(1000))),
        &up,
    );
    assert!(call(&svc, Ask::numbered(0).tokens(100, 900)).await.is_err());
    assert_eq!(svc.handle().stats().in_flight, 0);
    // 100 input tokens stay charged; the 900 never generated came back.
    let t0 = Instant::now();
    drop(call(&svc, Ask::numbered(1).tokens(0, 900)).await.unwrap());
    assert_eq!(t0.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn key_fn_and_the_key_table_bound() {
    let up = Upstream::new(|_| Reply::ok());
    let layer = ConcurrencyGateLayer::builder()
        .max_keys(4)
        .max_wait(secs(3600))
        .rates(Rates::new().with_requests(Limit::per_minute(1).with_burst(1)))
        .key_fn(|r: &Ask| Some(format!("tenant-{}", r.id % 10)))
        .build()
        .unwrap();
    let h = layer.handle();
    let svc = layer.layer(up.clone());
    // Ten tenants, four slots: tenants 0-3 get their own state; 4 and 5 share the unkeyed
    // one (5 waits a minute for its refill); by then 0-3 are idle and make room for 6-9.
    let t0 = Instant::now();
    for i in 0..10 {
        drop(svc.clone().oneshot(Ask::numbered(i)).await.unwrap());
        assert!(h.keys() <= 4);
    }
    assert_eq!(t0.elapsed(), secs(60));
    assert_eq!(h.keys(), 4);
    assert_eq!(up.calls(), 10);
}

/// A gate of 1,000 tokens, refilled at 100 a second.
fn tpm_gate(b: ConcurrencyGateBuilder, up: &Upstream) -> Gate {
    let rates = Rates::new().with_tokens(Limit::per_minute(6_000).with_burst(1_000));
    gate(b.limit(100).max_wait(secs(5)).rates(rates), up)
}

/// When a call of `tokens(0, 100)` is admitted after `first` holds its stream open.
async fn wait_behind(b: ConcurrencyGateBuilder, first: Ask) -> Result<Duration, LlmError> {
    let up = Upstream::new(|r| {
        if r.id == 0 {
            Reply::stream()
        } else {
            Reply::ok()
        }
    });
    let svc = tpm_gate(b, &up);
    let _held = call(&svc, first).await.unwrap();
    let t0 = Instant::now();
    call(&svc, Ask::numbered(1).tokens(0, 100)).await?;
    Ok(t0.elapsed())
}

#[tokio::test(start_paused = true)]
async fn every_one_of_n_answers_is_charged_to_the_token_rate() {
    // 5 answers of up to 200 tokens take the whole bucket: the next 100 wait a second.
    let mut five = Ask::numbered(0).tokens(0, 200);
    five.choices = 5;
    let waited = wait_behind(ConcurrencyGateLayer::builder(), five).await;
    assert_eq!(waited.unwrap(), secs(1));
    let one = Ask::numbered(0).tokens(0, 200);
    let waited = wait_behind(ConcurrencyGateLayer::builder(), one).await;
    assert_eq!(waited.unwrap(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn media_parts_are_charged_at_the_part_estimate() {
    let mut two_images = Ask::numbered(0).tokens(0, 0);
    two_images.media = MediaParts {
        images: 2,
        ..MediaParts::default()
    };
    let per_image =
        |n| ConcurrencyGateLayer::builder().part_estimate(PartEstimate::DEFAULT.per_image(n));
    // 2 × 500 fill the bucket.
    let waited = wait_behind(per_image(500), two_images.clone()).await;
    assert_eq!(waited.unwrap(), secs(1));
    // 2 × 85 leave room.
    let waited = wait_behind(per_image(85), two_images).await;
    assert_eq!(waited.unwrap(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn output_without_a_maximum_is_never_free() {
    let mut unbounded = Ask::numbered(0).tokens(10, 0);
    unbounded.max = None;
    // While it runs, the key's bucket is in debt: nothing else fits within the max wait.
    let err = wait_behind(ConcurrencyGateLayer::builder(), unbounded)
        .await
        .unwrap_err();
    assert_eq!(rejection(&err).reason(), RejectReason::RateLimited);
}

/// The first call asks for `max_tokens: 4e9` and ends as `end` says; the second, of
/// `tokens(0, 100)`, should then be admitted at once.
async fn admitted_after(end: fn(&Gate, Ask) -> tokio::task::JoinHandle<()>) -> Duration {
    let up = Upstream::new(|r| match r.id {
        0 => Reply::after(secs(10)),
        2 => Reply::stream(),
        _ => Reply::ok(),
    });
    let svc = tpm_gate(ConcurrencyGateLayer::builder(), &up);
    end(&svc, Ask::numbered(0).tokens(10, u32::MAX))
        .await
        .unwrap();
    let t0 = Instant::now();
    call(&svc, Ask::numbered(1).tokens(0, 100)).await.unwrap();
    t0.elapsed()
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_before_its_head_gives_back_its_output_estimate() {
    let waited = admitted_after(|svc, req| {
        let svc = svc.clone();
        tokio::spawn(async move {
            let call = tokio::spawn(svc.oneshot(req));
            settle().await;
            advance(secs(1)).await;
            call.abort();
            assert!(call.await.unwrap_err().is_cancelled());
        })
    })
    .await;
    assert_eq!(waited, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_call_ended_without_usage_gives_back_its_output_estimate() {
    // The answer comes (after 10 s) with no usage, and its body is read to the end.
    let waited = admitted_after(|svc, req| {
        let svc = svc.clone();
        tokio::spawn(async move { finish(svc.oneshot(req).await.unwrap()).await })
    })
    .await;
    assert_eq!(waited, Duration::ZERO);
    // A stream whose body is dropped before its end, without usage.
    let waited = admitted_after(|svc, mut req| {
        req.id = 2;
        let svc = svc.clone();
        tokio::spawn(async move { drop(svc.oneshot(req).await.unwrap()) })
    })
    .await;
    assert_eq!(waited, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_service_calling_again_under_its_last_key_sees_that_keys_new_rates_and_pauses() {
    // One service reused, as a pool or a Buffer reuses it: it remembers its last key's state
    // and takes it again without the table, so changes made through the handle must reach it.
    let up = Upstream::new(|_| Reply::ok());
    let mut svc = gate(ConcurrencyGateLayer::builder().max_wait(secs(5)), &up);
    let h = svc.handle();
    for i in 0..3 {
        let resp = svc.ready().await.unwrap().call(Ask::numbered(i).key("a"));
        drop(resp.await.unwrap());
    }
    h.set_key_rates("a", Some(Rates::new().requests_per_minute(0)));
    let e = svc.ready().await.unwrap().call(Ask::numbered(3).key("a"));
    assert_eq!(
        rejection(&e.await.unwrap_err()).reason(),
        RejectReason::ZeroRate
    );
    // Another key, then back: each call under its own key's state.
    let resp = svc.ready().await.unwrap().call(Ask::numbered(4).key("b"));
    drop(resp.await.unwrap());
    h.pause_key(Some("b"), secs(3600));
    let e = svc.ready().await.unwrap().call(Ask::numbered(5).key("b"));
    assert_eq!(
        rejection(&e.await.unwrap_err()).reason(),
        RejectReason::KeyPaused
    );
    h.set_key_rates("a", None);
    let resp = svc.ready().await.unwrap().call(Ask::numbered(6).key("a"));
    drop(resp.await.unwrap());
    assert_eq!(up.calls(), 5);
    assert_eq!(h.keys(), 2);
}
