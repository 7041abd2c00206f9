//! The fleet-wide limits through the layer, with several replicas (each its own layer and its
//! own connection) on one real redis-server: the fleet stays under one key's limits, tokens
//! settle, a pause seen by one replica stops the others, permits are shared, leased and given
//! back, and an outage follows the layer's policy without hanging.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::Response;
use seawall_core::{
    CacheStatus, CallContext, FailureClass, LlmError, RateLimitSnapshot, RateLimitWindow, Usage,
};
use seawall_gate::{Limit, Rates, RejectReason};
use seawall_redis::fleet::{FleetLimitBuilder, FleetLimitLayer, FleetRejection, ManualClock};
use seawall_redis::{OnUnavailable, SharedRedis, redis};
use seawall_test_support::{Ask, ChanBody, RedisServer};
use tower::{Layer, ServiceExt, service_fn};

/// What the upstream does with a request, read from its extensions.
#[derive(Debug, Clone)]
enum Reply {
    /// Answers at once with this usage.
    Usage(Usage),
    /// Answers at once as a cache inside the fleet limit would: its answer's usage, marked as
    /// a hit.
    Cached(Usage),
    /// Answers a 429 with this `Retry-After`.
    RateLimited(Duration),
    /// Answers with these rate-limit headers.
    Headers(RateLimitSnapshot),
    /// Answers with a body that stays open until the caller drops it.
    Hold,
    /// Never answers.
    Hang,
}

/// Counts calls in flight at the upstream (from the call until its body is dropped).
#[derive(Debug, Default)]
struct Upstream {
    calls: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

struct InFlight(Arc<Upstream>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

type Svc = tower::util::BoxCloneSyncService<Ask, Response<ChanBody>, LlmError>;

fn upstream(up: &Arc<Upstream>) -> Svc {
    let up = up.clone();
    Svc::new(service_fn(move |req: Ask| {
        let up = up.clone();
        async move {
            up.calls.fetch_add(1, Ordering::AcqRel);
            let now = up.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
            up.max_in_flight.fetch_max(now, Ordering::AcqRel);
            let guard = InFlight(up.clone());
            let reply = req.ext.get::<Reply>().cloned().unwrap_or(Reply::Hold);
            match reply {
                Reply::Usage(u) => {
                    let mut resp = Response::new(ChanBody::empty().holding(guard));
                    resp.extensions_mut().insert(u);
                    Ok(resp)
                }
                Reply::Cached(u) => {
                    let mut resp = Response::new(ChanBody::empty().holding(guard));
                    resp.extensions_mut().insert(u);
                    resp.extensions_mut().insert(CacheStatus::Hit);
                    Ok(resp)
                }
                Reply::RateLimited(d) => {
                    drop(guard);
                    Err(LlmError::new(FailureClass::RateLimited, "429").with_retry_after(d))
                }
                Reply::Headers(s) => {
                    let mut resp = Response::new(ChanBody::empty().holding(guard));
                    resp.extensions_mut().insert(s);
                    Ok(resp)
                }
                Reply::Hold => {
                    let (_feed, body) = ChanBody::channel();
                    // The feed is dropped, but the body is not known to be over until it is
                    // polled: the hook fires when the caller drops it.
                    Ok(Response::new(body.holding(guard)))
                }
                Reply::Hang => {
                    let _guard = guard;
                    std::future::pending().await
                }
            }
        }
    }))
}

fn ask(reply: Reply) -> Ask {
    let mut a = Ask::new("m", 1, 1);
    a.ext.insert(reply);
    a
}

fn connect(server: &RedisServer, timeout: Duration) -> SharedRedis {
    SharedRedis::builder(server.url())
        .timeout(timeout)
        .build()
        .unwrap()
}

/// A replica's layer on its own connection, on the shared test clock, never waiting.
fn replica(
    server: &RedisServer,
    clock: &ManualClock,
    timeout: Duration,
    f: impl FnOnce(FleetLimitBuilder) -> FleetLimitBuilder,
) -> FleetLimitLayer {
    let b = FleetLimitLayer::builder(connect(server, timeout))
        .clock(clock.clone())
        .max_wait(Duration::ZERO);
    f(b).build().unwrap()
}

/// Calls once; `Ok(true)` admitted (the response is dropped at once), `Ok(false)` rejected by
/// the fleet, `Err` anything else.
async fn call_once(
    layer: &FleetLimitLayer,
    up: &Arc<Upstream>,
    req: Ask,
) -> Result<bool, LlmError> {
    match layer.layer(upstream(up)).oneshot(req).await {
        Ok(_) => Ok(true),
        Err(e) if e.class() == FailureClass::GateRejected => Ok(false),
        Err(e) => Err(e),
    }
}

/// Polls `check` until it holds, for at most five seconds.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check().await {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn token_level(r: &SharedRedis) -> Option<f64> {
    let v: Option<String> = r
        .run("test", |mut c| async move {
            redis::cmd("HGET")
                .arg("seawall:fleet:{m}:b")
                .arg("t")
                .query_async(&mut c)
                .await
        })
        .await
        .unwrap();
    v.map(|s| s.parse().unwrap())
}

/// Fires `per_replica` concurrent calls through each layer; returns how many each admitted.
async fn round(layers: &[FleetLimitLayer], up: &Arc<Upstream>, per_replica: usize) -> Vec<usize> {
    let mut tasks = Vec::new();
    for layer in layers {
        let svc = layer.layer(upstream(up));
        let mut calls = Vec::new();
        for _ in 0..per_replica {
            let svc = svc.clone();
            calls.push(tokio::spawn(async move {
                match svc.oneshot(ask(Reply::Usage(Usage::default()))).await {
                    Ok(_) => true,
                    Err(e) if e.class() == FailureClass::GateRejected => false,
                    Err(e) => panic!("neither admitted nor rejected by the limit: {e}"),
                }
            }));
        }
        tasks.push(calls);
    }
    let mut admitted = Vec::new();
    for calls in tasks {
        let mut n = 0;
        for c in calls {
            n += usize::from(c.await.unwrap());
        }
        admitted.push(n);
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_with_a_thousand_calls_each_admit_exactly_the_key_limit_per_window() {
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    // 120 requests a minute with a burst of 100: 100 at once, then 2 a second.
    let rates = Rates::new().with_requests(Limit::per_minute(120).with_burst(100));
    // A long timeout: 4 000 calls at once on a small machine must not fail for slowness.
    let layers: Vec<_> = (0..4)
        .map(|_| replica(&server, &clock, Duration::from_secs(5), |b| b.rates(rates)))
        .collect();
    let up = Arc::new(Upstream::default());

    let first = round(&layers, &up, 1_000).await;
    assert_eq!(first.iter().sum::<usize>(), 100, "burst window: {first:?}");
    // 30 s later: 60 requests have come back.
    clock.advance(Duration::from_secs(30));
    let second = round(&layers, &up, 1_000).await;
    assert_eq!(second.iter().sum::<usize>(), 60, "30 s window: {second:?}");
    // A long idle period refills to the burst, not beyond.
    clock.advance(Duration::from_secs(600));
    let third = round(&layers, &up, 1_000).await;
    assert_eq!(third.iter().sum::<usize>(), 100, "after idling: {third:?}");
    assert_eq!(up.calls.load(Ordering::Acquire), 260);
}

#[tokio::test]
async fn settlement_gives_back_unused_tokens_and_carries_an_overrun_as_debt_for_the_fleet() {
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    // 6 000 tokens a minute (100 a second), a burst of 1 000.
    let rates = Rates::new().with_tokens(Limit::per_minute(6_000).with_burst(1_000));
    let timeout = Duration::from_secs(2);
    let a = replica(&server, &clock, timeout, |b| b.rates(rates));
    let b = replica(&server, &clock, timeout, |b| b.rates(rates));
    let r = connect(&server, timeout);
    let up = Arc::new(Upstream::default());
    let with_usage = |input: u32, max: u32, used_out: u64| {
        let mut req = Ask::new("m", input, max);
        req.ext.insert(Reply::Usage(Usage {
            input_tokens: u64::from(input),
            output_tokens: used_out,
            cached_input_tokens: 0,
            cache_write_input_tokens: 0,
            cache_write_1h_input_tokens: 0,
        }));
        req
    };

    // 500 reserved (100 in, up to 400 out), 200 used: 300 go back.
    assert!(call_once(&a, &up, with_usage(100, 400, 100)).await.unwrap());
    eventually("the unused tokens went back", || async {
        token_level(&r).await == Some(800.0)
    })
    .await;
    // 500 reserved, 1 500 used: 1 000 of debt.
    assert!(
        call_once(&a, &up, with_usage(100, 400, 1_400))
            .await
            .unwrap()
    );
    eventually("the overrun was charged", || async {
        token_level(&r).await == Some(-700.0)
    })
    .await;
    // The other replica now waits for the debt: 702 tokens at 100 a second.
    let err = b
        .layer(upstream(&up))
        .oneshot(Ask::new("m", 1, 1))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::GateRejected);
    assert_eq!(
        FleetRejection::of(&err).unwrap().reason(),
        RejectReason::RateLimited
    );
    assert_eq!(err.retry_hint(), Some(Duration::from_millis(7_020)));
    clock.advance(Duration::from_millis(7_020));
    assert!(call_once(&b, &up, Ask::new("m", 1, 1)).await.unwrap());
}

#[tokio::test]
async fn an_answer_a_cache_served_gives_back_every_token_it_reserved() {
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    let rates = Rates::new().with_tokens(Limit::per_minute(6_000).with_burst(1_000));
    let timeout = Duration::from_secs(2);
    let layer = replica(&server, &clock, timeout, |b| b.rates(rates));
    let r = connect(&server, timeout);
    let up = Arc::new(Upstream::default());
    // 500 reserved (100 in, up to 400 out); the answer says it used 300, but a cache served it.
    let mut req = Ask::new("m", 100, 400);
    req.ext.insert(Reply::Cached(Usage {
        input_tokens: 100,
        output_tokens: 200,
        ..Usage::default()
    }));
    assert!(call_once(&layer, &up, req).await.unwrap());
    eventually("all 500 went back", || async {
        token_level(&r).await == Some(1_000.0)
    })
    .await;
}

#[tokio::test]
async fn a_429_seen_by_one_replica_pauses_every_replica_until_its_retry_after() {
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    let timeout = Duration::from_secs(2);
    let seer = replica(&server, &clock, timeout, |b| b);
    let other = replica(&server, &clock, timeout, |b| b);
    let up = Arc::new(Upstream::default());
    assert!(call_once(&other, &up, ask(Reply::Hold)).await.unwrap());

    let err = call_once(&seer, &up, ask(Reply::RateLimited(Duration::from_secs(20))))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::RateLimited);
    // The pause reaches the fleet in the background: ask until the other replica refuses.
    let deadline = Instant::now() + Duration::from_secs(5);
    let refusal = loop {
        if let Err(e) = other.layer(upstream(&up)).oneshot(ask(Reply::Hold)).await {
            break e;
        }
        assert!(
            Instant::now() < deadline,
            "the other replica was never paused"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(
        FleetRejection::of(&refusal).unwrap().reason(),
        RejectReason::KeyPaused
    );
    assert_eq!(refusal.retry_hint(), Some(Duration::from_secs(20)));
    // The refusal is a local rejection in the call's record.
    let cx = Arc::new(CallContext::new());
    let mut req = ask(Reply::Hold);
    req.context = Some(cx.clone());
    assert!(!call_once(&other, &up, req).await.unwrap());
    assert_eq!(cx.snapshot().rejections, [FailureClass::GateRejected]);
    let calls = up.calls.load(Ordering::Acquire);
    clock.advance(Duration::from_millis(19_999));
    assert!(!call_once(&other, &up, ask(Reply::Hold)).await.unwrap());
    clock.advance(Duration::from_millis(1));
    assert!(call_once(&other, &up, ask(Reply::Hold)).await.unwrap());
    // The paused calls never reached the upstream.
    assert_eq!(up.calls.load(Ordering::Acquire), calls + 1);
}

#[tokio::test]
async fn a_response_with_remaining_zero_pauses_the_fleet_until_the_window_resets() {
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    let timeout = Duration::from_secs(2);
    let seer = replica(&server, &clock, timeout, |b| b);
    let other = replica(&server, &clock, timeout, |b| b);
    let up = Arc::new(Upstream::default());
    let exhausted = RateLimitSnapshot {
        tokens: RateLimitWindow {
            limit: None,
            remaining: Some(0),
            reset_after: Some(Duration::from_secs(8)),
        },
        ..RateLimitSnapshot::default()
    };
    assert!(
        call_once(&seer, &up, ask(Reply::Headers(exhausted)))
            .await
            .unwrap()
    );
    eventually("the other replica is paused", || async {
        !call_once(&other, &up, ask(Reply::Hold)).await.unwrap()
    })
    .await;
    // The replica that saw it is paused too, without asking.
    assert!(!call_once(&seer, &up, ask(Reply::Hold)).await.unwrap());
    clock.advance(Duration::from_secs(8));
    assert!(call_once(&other, &up, ask(Reply::Hold)).await.unwrap());
    assert!(call_once(&seer, &up, ask(Reply::Hold)).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_permits_never_let_more_than_n_calls_in_flight_across_four_stacks() {
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    let layers: Vec<_> = (0..4)
        .map(|_| {
            replica(&server, &clock, Duration::from_secs(5), |b| {
                b.permits(8)
                    .max_wait(Duration::from_secs(30))
                    .permit_poll(Duration::from_millis(2))
            })
        })
        .collect();
    let up = Arc::new(Upstream::default());
    let mut tasks = Vec::new();
    for layer in &layers {
        let svc = layer.layer(upstream(&up));
        for _ in 0..100 {
            let svc = svc.clone();
            tasks.push(tokio::spawn(async move {
                let resp = svc.oneshot(ask(Reply::Hold)).await.unwrap();
                // The upstream's work: the permit is held until the body is dropped.
                tokio::time::sleep(Duration::from_millis(2)).await;
                drop(resp);
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(up.calls.load(Ordering::Acquire), 400);
    let max = up.max_in_flight.load(Ordering::Acquire);
    assert!(max <= 8, "{max} calls in flight with 8 fleet permits");
    assert!(
        max >= 2,
        "the calls never overlapped ({max}): the test shows nothing"
    );
    println!("fleet permits 8, most in flight across 4 stacks: {max}");
}

#[tokio::test]
async fn a_dropped_body_or_future_gives_its_fleet_permit_back() {
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    let timeout = Duration::from_secs(2);
    let a = replica(&server, &clock, timeout, |b| b.permits(1));
    let b = replica(&server, &clock, timeout, |b| b.permits(1));
    let up = Arc::new(Upstream::default());

    let body = a
        .layer(upstream(&up))
        .oneshot(ask(Reply::Hold))
        .await
        .unwrap();
    let err = b
        .layer(upstream(&up))
        .oneshot(ask(Reply::Hold))
        .await
        .unwrap_err();
    assert_eq!(
        FleetRejection::of(&err).unwrap().reason(),
        RejectReason::WaitTimeout
    );
    drop(body);
    eventually("the dropped body's permit came back", || async {
        call_once(&b, &up, ask(Reply::Hold)).await.unwrap()
    })
    .await;

    // A call that never answers, dropped while in flight.
    let calls = up.calls.load(Ordering::Acquire);
    let svc = a.layer(upstream(&up));
    let hung = tokio::spawn(async move { svc.oneshot(ask(Reply::Hang)).await.map(|_| ()) });
    eventually("the hanging call reached the upstream", || async {
        up.calls.load(Ordering::Acquire) > calls
    })
    .await;
    assert!(!call_once(&b, &up, ask(Reply::Hold)).await.unwrap());
    hung.abort();
    eventually("the dropped future's permit came back", || async {
        call_once(&b, &up, ask(Reply::Hold)).await.unwrap()
    })
    .await;
}

#[test]
fn a_live_replica_keeps_its_permits_past_the_lease_and_a_dead_one_frees_them_after_it() {
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    let up = Arc::new(Upstream::default());
    let lease = Duration::from_secs(30);
    let settings = |b: FleetLimitBuilder| {
        b.permits(2)
            .lease(lease)
            .renew_every(Some(Duration::from_millis(20)))
    };
    // The replica that will die runs on its own runtime: shutting it down stops its tasks
    // (the lease renewer) as a crash would.
    let doomed_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let held = doomed_rt.block_on(async {
        let doomed = replica(&server, &clock, Duration::from_secs(2), settings);
        let svc = doomed.layer(upstream(&up));
        vec![
            svc.clone().oneshot(ask(Reply::Hold)).await.unwrap(),
            svc.oneshot(ask(Reply::Hold)).await.unwrap(),
        ]
    });
    rt.block_on(async {
        let survivor = replica(&server, &clock, Duration::from_secs(2), settings);
        let r = connect(&server, Duration::from_secs(2));
        assert!(!call_once(&survivor, &up, ask(Reply::Hold)).await.unwrap());
        // Alive, the replica renews its leases: 20 s on, they run 30 s from then.
        clock.advance(Duration::from_secs(20));
        eventually("the leases were renewed", || async {
            let scores: Vec<(String, u64)> = r
                .run("test", |mut c| async move {
                    redis::cmd("ZRANGE")
                        .arg("seawall:fleet:{m}:h")
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query_async(&mut c)
                        .await
                })
                .await
                .unwrap();
            scores.len() == 2 && scores.iter().all(|(_, s)| *s == 50_000)
        })
        .await;
        clock.advance(Duration::from_secs(20));
        assert!(!call_once(&survivor, &up, ask(Reply::Hold)).await.unwrap());
    });
    // The replica dies: its responses are never dropped (a crashed process runs no
    // destructors) and its renewer stops with its runtime.
    #[allow(
        clippy::mem_forget,
        reason = "a crashed replica never releases its permits"
    )]
    std::mem::forget(held);
    doomed_rt.shutdown_timeout(Duration::from_secs(1));
    rt.block_on(async {
        let survivor = replica(&server, &clock, Duration::from_secs(2), settings);
        assert!(!call_once(&survivor, &up, ask(Reply::Hold)).await.unwrap());
        // The last renewal leased them until 70 s at most.
        clock.set(70_000);
        assert!(call_once(&survivor, &up, ask(Reply::Hold)).await.unwrap());
    });
}

#[tokio::test]
async fn fail_closed_refuses_within_the_timeout_while_redis_is_down_and_recovers_after() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new(0);
    let timeout = Duration::from_millis(100);
    let rates = Rates::new().requests_per_minute(600);
    let layer = replica(&server, &clock, timeout, |b| {
        b.rates(rates).on_unavailable(OnUnavailable::FailClosed)
    });
    let up = Arc::new(Upstream::default());
    // The first call also connects and loads the scripts, which a loaded machine may not do
    // within the 100 ms the layer allows: what is checked here is that it admits while Redis
    // is up, then refuses in time while it is down.
    eventually("the layer admits while redis is up", || async {
        matches!(call_once(&layer, &up, ask(Reply::Hold)).await, Ok(true))
    })
    .await;

    server.stop();
    let calls = up.calls.load(Ordering::Acquire);
    for _ in 0..5 {
        let started = Instant::now();
        let err = call_once(&layer, &up, ask(Reply::Hold)).await.unwrap_err();
        assert_eq!(err.class(), FailureClass::SharedStateUnavailable);
        assert!(started.elapsed() < timeout * 5, "{:?}", started.elapsed());
    }
    assert_eq!(up.calls.load(Ordering::Acquire), calls, "nothing was sent");

    server.restart();
    eventually("the layer admits again", || async {
        matches!(call_once(&layer, &up, ask(Reply::Hold)).await, Ok(true))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_replicas_admit_their_share_while_redis_is_down_mid_run_and_nothing_hangs() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new(0);
    let timeout = Duration::from_millis(200);
    // 40 at once fleet-wide: while degraded, each of the 4 replicas admits 10.
    let rates = Rates::new().with_requests(Limit::per_minute(40).with_burst(40));
    let layers: Vec<_> = (0..4)
        .map(|_| {
            replica(&server, &clock, timeout, |b| {
                b.rates(rates).on_unavailable(OnUnavailable::fail_open(4))
            })
        })
        .collect();
    let up = Arc::new(Upstream::default());
    // Before the outage the fleet's bucket counts: 20 of its 40.
    for layer in &layers {
        for _ in 0..5 {
            assert!(
                call_once(layer, &up, ask(Reply::Usage(Usage::default())))
                    .await
                    .unwrap()
            );
        }
    }

    // Redis dies in the middle of a run of calls.
    let mut tasks = Vec::new();
    for layer in &layers {
        let svc = layer.layer(upstream(&up));
        for _ in 0..100 {
            let svc = svc.clone();
            tasks.push(tokio::spawn(async move {
                let started = Instant::now();
                let out = svc.oneshot(ask(Reply::Usage(Usage::default()))).await;
                (out.map(|_| ()), started.elapsed())
            }));
        }
    }
    server.stop();
    let (mut admitted, mut slowest) = (0, Duration::ZERO);
    for t in tasks {
        let (out, took) = t.await.unwrap();
        slowest = slowest.max(took);
        match out {
            Ok(()) => admitted += 1,
            Err(e) => assert_eq!(e.class(), FailureClass::GateRejected, "{e}"),
        }
    }
    // At most the 20 the fleet had left plus each replica's local share of 10.
    assert!(admitted <= 20 + 40, "{admitted} admitted");
    assert!(slowest < Duration::from_secs(2), "a call took {slowest:?}");

    // Now wholly degraded: each replica admits exactly its share, and only one call in a
    // while asks Redis (and waits its timeout): 120 calls take far less than 120 timeouts.
    clock.advance(Duration::from_secs(600));
    let phase = Instant::now();
    let mut shares = Vec::new();
    for layer in &layers {
        let mut n = 0;
        for _ in 0..30 {
            let started = Instant::now();
            n += usize::from(
                call_once(layer, &up, ask(Reply::Usage(Usage::default())))
                    .await
                    .unwrap(),
            );
            assert!(started.elapsed() < timeout * 5, "{:?}", started.elapsed());
        }
        shares.push(n);
    }
    assert_eq!(shares, [10, 10, 10, 10]);
    let took = phase.elapsed();
    assert!(took < timeout * 20, "120 degraded calls took {took:?}");
    println!("120 calls on 4 degraded replicas took {took:?} (timeout {timeout:?})");

    // Back: the fleet's (empty, restarted) state counts again.
    server.restart();
    eventually("the fleet admits again", || async {
        matches!(
            call_once(&layers[0], &up, ask(Reply::Usage(Usage::default()))).await,
            Ok(true)
        )
    })
    .await;
}

#[tokio::test]
async fn an_acquire_that_timed_out_after_it_ran_is_cancelled_and_charges_nothing() {
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    let rates = Rates::new().with_requests(Limit::per_minute(60).with_burst(10));
    let layer = replica(&server, &clock, Duration::from_millis(50), |b| {
        b.rates(rates).permits(5)
    });
    let up = Arc::new(Upstream::default());
    let r = connect(&server, Duration::from_secs(5));
    // One call in flight: the acquire script is loaded, the settle script not yet.
    let _live = layer
        .layer(upstream(&up))
        .oneshot(ask(Reply::Hold))
        .await
        .unwrap();
    // Another client holds the server for 300 ms: the acquire waits behind it, the layer
    // gives up after 50 ms, and the script runs when the server is free again.
    let blocker = r.clone();
    let hang = tokio::spawn(async move {
        blocker
            .run("test", |mut c| async move {
                redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg(0.3)
                    .query_async::<()>(&mut c)
                    .await
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    // Half a second on: an acquire that runs refills half a request first.
    clock.set(500);
    let err = call_once(&layer, &up, ask(Reply::Hold)).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::SharedStateUnavailable);
    hang.await.unwrap().unwrap();
    // The acquire ran once the server was free, and its queued cancellation (sent again
    // after its own timeout, and after the server's NOSCRIPT) gave its request and hold back:
    // what is left is the live call's.
    eventually("the timed-out admission was cancelled", || async {
        let (level, holds): (Option<String>, u64) = r
            .run("test", |mut c| async move {
                redis::pipe()
                    .cmd("HGET")
                    .arg("seawall:fleet:{m}:b")
                    .arg("r")
                    .cmd("ZCARD")
                    .arg("seawall:fleet:{m}:h")
                    .query_async(&mut c)
                    .await
            })
            .await
            .unwrap();
        level.as_deref() == Some("9.5") && holds == 1
    })
    .await;
    assert_eq!(up.calls.load(Ordering::Acquire), 1);
}

#[tokio::test]
async fn settings_that_cannot_work_are_refused_and_the_url_is_never_printed() {
    let redis = SharedRedis::new("redis://:hunter2-secret@127.0.0.1:1/").unwrap();
    let refused = |b: FleetLimitBuilder| b.build().unwrap_err().to_string();
    assert!(refused(FleetLimitLayer::builder(redis.clone()).permits(0)).contains("permits"));
    assert!(
        refused(FleetLimitLayer::builder(redis.clone()).key_permits("k", 0)).contains("permits")
    );
    assert!(
        refused(FleetLimitLayer::builder(redis.clone()).lease(Duration::ZERO)).contains("lease")
    );
    assert!(
        refused(
            FleetLimitLayer::builder(redis.clone())
                .lease(Duration::from_secs(5))
                .renew_every(Some(Duration::from_secs(5)))
        )
        .contains("renew_every")
    );
    assert!(
        refused(FleetLimitLayer::builder(redis.clone()).permit_poll(Duration::ZERO))
            .contains("permit_poll")
    );
    let layer = FleetLimitLayer::new(redis.clone(), Rates::new().requests_per_minute(10));
    assert!(!format!("{layer:?}").contains("hunter2"));
    let svc = layer.layer(upstream(&Arc::new(Upstream::default())));
    assert!(!format!("{svc:?}").contains("hunter2"));
}

#[tokio::test]
async fn while_redis_is_down_a_fail_open_replica_holds_its_share_of_the_fleet_permits() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new(0);
    let layer = replica(&server, &clock, Duration::from_millis(100), |b| {
        b.permits(8).on_unavailable(OnUnavailable::fail_open(4))
    });
    let up = Arc::new(Upstream::default());
    server.stop();
    let svc = layer.layer(upstream(&up));
    let first = svc.clone().oneshot(ask(Reply::Hold)).await.unwrap();
    let _second = svc.clone().oneshot(ask(Reply::Hold)).await.unwrap();
    // 8 permits over 4 replicas: this one holds 2 while it cannot coordinate.
    let err = svc.clone().oneshot(ask(Reply::Hold)).await.unwrap_err();
    assert_eq!(
        FleetRejection::of(&err).unwrap().reason(),
        RejectReason::WaitTimeout
    );
    drop(first);
    assert!(call_once(&layer, &up, ask(Reply::Hold)).await.unwrap());
}

#[tokio::test]
async fn a_key_with_limits_of_its_own_is_limited_alone_and_unkeyed_calls_share_one_state() {
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    let timeout = Duration::from_secs(2);
    let layer = replica(&server, &clock, timeout, |b| {
        b.key_permits("small", 1).key_rates(
            "slow",
            Rates::new().with_requests(Limit::per_minute(60).with_burst(1)),
        )
    });
    let up = Arc::new(Upstream::default());
    let on = |model: &str| {
        let mut a = Ask::new(model, 1, 1);
        a.ext.insert(Reply::Hold);
        a
    };
    let _held = layer
        .layer(upstream(&up))
        .oneshot(on("small"))
        .await
        .unwrap();
    assert!(!call_once(&layer, &up, on("small")).await.unwrap());
    assert!(call_once(&layer, &up, on("slow")).await.unwrap());
    assert!(!call_once(&layer, &up, on("slow")).await.unwrap());
    // Keys without limits of their own go free.
    for _ in 0..5 {
        assert!(call_once(&layer, &up, on("other")).await.unwrap());
    }
    // A request without a key is limited under the default limits, in a state of its own.
    let strict = replica(&server, &clock, timeout, |b| {
        b.rates(Rates::new().with_requests(Limit::per_minute(60).with_burst(1)))
    });
    let mut unkeyed = Ask {
        model: None,
        ..Ask::default()
    };
    unkeyed.ext.insert(Reply::Hold);
    assert!(call_once(&strict, &up, unkeyed.clone()).await.unwrap());
    assert!(!call_once(&strict, &up, unkeyed).await.unwrap());
    assert!(call_once(&strict, &up, on("m")).await.unwrap());
}

#[tokio::test]
async fn inside_the_gate_the_fleet_decides_and_the_gate_holds_its_permit_until_the_body_ends() {
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    let fleet = replica(&server, &clock, Duration::from_secs(2), |b| b.permits(1));
    let gate = seawall_gate::ConcurrencyGateLayer::new(4);
    let up = Arc::new(Upstream::default());
    let stack = tower::ServiceBuilder::new()
        .layer(gate.clone())
        .layer(fleet)
        .service(upstream(&up));
    let body = stack.clone().oneshot(ask(Reply::Hold)).await.unwrap();
    assert_eq!(gate.handle().stats().in_flight, 1);
    // The fleet's refusal comes out of the gate as it went in, and frees the gate's permit.
    let err = stack.clone().oneshot(ask(Reply::Hold)).await.unwrap_err();
    assert!(FleetRejection::of(&err).is_some(), "{err}");
    assert_eq!(gate.handle().stats().in_flight, 1);
    drop(body);
    assert_eq!(gate.handle().stats().in_flight, 0);
    let stack2 = stack.clone();
    eventually("the fleet permit came back", move || {
        let stack = stack2.clone();
        async move {
            stack
                .oneshot(ask(Reply::Usage(Usage::default())))
                .await
                .is_ok()
        }
    })
    .await;
}
