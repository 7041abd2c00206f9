//! Breaker stacks of several replicas sharing their state through a real Redis: a trip or an
//! "open until" on one reaches the others within the stated bound, half-open probing is one
//! probe for the fleet, one bad replica does not open the fleet, a Redis outage leaves each
//! replica on its local state, and a call through a closed breaker costs no round trip.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use seawall_breaker::{
    BreakerGuard, BreakerHandle, CircuitBreakerBuilder, CircuitBreakerLayer, State,
};
use seawall_core::{FailureClass, HookedBody, LlmError};
use seawall_redis::{Clock, ManualClock, RedisBreakerState, SharedRedis, SystemClock};
use seawall_test_support::{Ask, RedisServer, eventually};
use tokio::sync::Semaphore;
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt};

const KEY: &str = "api.example/m";
const INTERVAL: Duration = Duration::from_millis(100);
/// Generous for a loaded test machine; the bound under test grows with it.
const TIMEOUT: Duration = Duration::from_millis(300);
/// How long to wait for something that should take one sync or two.
const PATIENCE: Duration = Duration::from_secs(10);

const OK: u8 = 0;
const FAIL: u8 = 1;
/// A 429 that says to come back in 30 s.
const HINT: u8 = 2;
/// Answer only once the test releases a permit.
const HANG: u8 = 3;
/// A 429 of an exhausted quota.
const QUOTA: u8 = 4;

/// The fleet's wall clock, moved by hand: it starts at the system clock's reading.
fn wall_clock() -> ManualClock {
    ManualClock::new(SystemClock.now_ms())
}

type Svc = BoxCloneService<Ask, http::Response<HookedBody<String, BreakerGuard>>, LlmError>;

/// One replica: its breaker layer over a fake upstream, its Redis handle and shared state.
struct Replica {
    svc: Svc,
    handle: BreakerHandle,
    state: RedisBreakerState,
    redis: SharedRedis,
    mode: Arc<AtomicU8>,
    upstream_calls: Arc<AtomicUsize>,
    release: Arc<Semaphore>,
}

fn replica(
    server: &RedisServer,
    name: &str,
    clock: &ManualClock,
    configure: impl FnOnce(CircuitBreakerBuilder) -> CircuitBreakerBuilder,
) -> Replica {
    replica_every(server, name, clock, INTERVAL, configure)
}

fn replica_every(
    server: &RedisServer,
    name: &str,
    clock: &ManualClock,
    interval: Duration,
    configure: impl FnOnce(CircuitBreakerBuilder) -> CircuitBreakerBuilder,
) -> Replica {
    let redis = SharedRedis::builder(server.url())
        .prefix("test")
        .replica(name)
        .timeout(TIMEOUT)
        .build()
        .unwrap();
    let state = RedisBreakerState::builder(redis.clone())
        .interval(interval)
        .clock(clock.clone())
        .build()
        .unwrap();
    // Trips on the failure rate only (10 calls, 50%), so a replica's evidence reaches the
    // fleet's minimum before its own breaker stops its calls.
    let builder = CircuitBreakerLayer::builder()
        .consecutive_failures(0)
        .minimum_calls(10)
        .open_for(Duration::from_secs(10))
        .jitter(0.0)
        .shared_state(state.clone());
    let layer = configure(builder).build().unwrap();
    let mode = Arc::new(AtomicU8::new(OK));
    let upstream_calls = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(Semaphore::new(0));
    let (m, n, r) = (mode.clone(), upstream_calls.clone(), release.clone());
    let upstream = tower::service_fn(move |_: Ask| {
        n.fetch_add(1, Ordering::SeqCst);
        let (mode, release) = (m.load(Ordering::SeqCst), r.clone());
        async move {
            match mode {
                FAIL => Err(LlmError::new(FailureClass::ServerError, "500")),
                HINT => Err(LlmError::new(FailureClass::RateLimited, "429")
                    .with_retry_after(Duration::from_secs(30))),
                QUOTA => Err(LlmError::new(FailureClass::QuotaExhausted, "429")),
                HANG => {
                    release.acquire().await.unwrap().forget();
                    Ok(http::Response::new(String::from("ok")))
                }
                _ => Ok(http::Response::new(String::from("ok"))),
            }
        }
    });
    Replica {
        svc: BoxCloneService::new(layer.layer(upstream)),
        handle: layer.handle(),
        state,
        redis,
        mode,
        upstream_calls,
        release,
    }
}

impl Replica {
    async fn call(&self) -> Result<(), LlmError> {
        call(self.svc.clone()).await
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    fn state(&self) -> Option<State> {
        self.handle.state(KEY)
    }

    /// Waits until this replica has synced `n` more times.
    async fn synced(&self, n: u64) {
        let target = self.state.syncs() + n;
        until(|| self.state.syncs() >= target).await;
    }
}

/// One call through `svc`, its body read to the end.
async fn call(mut svc: Svc) -> Result<(), LlmError> {
    let resp = svc.ready().await?.call(Ask::named(KEY)).await?;
    resp.into_body()
        .collect()
        .await
        .map(|_| ())
        .map_err(|e| match e {})
}

/// Polls `cond` until it holds, for at most `PATIENCE`; returns how long it took.
async fn until(mut cond: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    let met = eventually(PATIENCE, || std::future::ready(cond())).await;
    assert!(met, "condition not met in {PATIENCE:?}");
    started.elapsed()
}

async fn fail_until_open(r: &Replica) {
    r.set(FAIL);
    for _ in 0..10 {
        let _ = r.call().await;
    }
    assert_eq!(r.state(), Some(State::Open));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trip_on_one_replica_opens_the_key_on_the_others_within_the_bound() {
    let server = RedisServer::start();
    let clock = wall_clock();
    let [a, b, c] = ["a", "b", "c"].map(|n| replica(&server, n, &clock, |b| b));
    for r in [&a, &b, &c] {
        r.synced(1).await;
    }
    fail_until_open(&a).await;
    let tripped = Instant::now();
    until(|| b.state() == Some(State::Open) && c.state() == Some(State::Open)).await;
    let took = tripped.elapsed();
    let bound = a.state.propagation_bound();
    assert!(took <= bound, "took {took:?}, bound {bound:?}");
    // The others refuse at once, without calling their upstream.
    let err = b.call().await.unwrap_err();
    assert_eq!(err.class(), FailureClass::CircuitOpen);
    assert_eq!(b.upstream_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_open_until_reaches_the_other_replicas() {
    let server = RedisServer::start();
    let clock = wall_clock();
    let hint = |b: CircuitBreakerBuilder| b.open_on_retry_hint(Duration::from_secs(60));
    let [a, b] = ["a", "b"].map(|n| replica(&server, n, &clock, hint));
    a.synced(1).await;
    b.synced(1).await;
    a.set(HINT);
    a.call().await.unwrap_err();
    assert_eq!(a.state(), Some(State::Open), "one 429 with a hint opens it");
    let hinted = Instant::now();
    until(|| b.state() == Some(State::Open)).await;
    let took = hinted.elapsed();
    assert!(took <= a.state.propagation_bound(), "took {took:?}");
    let err = b.call().await.unwrap_err();
    let left = err.retry_after().unwrap();
    assert!(
        left > Duration::from_secs(25) && left <= Duration::from_secs(30),
        "open until the upstream said: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_quota_on_one_replica_opens_the_key_on_the_others() {
    let server = RedisServer::start();
    let clock = wall_clock();
    let [a, b] = ["a", "b"].map(|n| replica(&server, n, &clock, |b| b));
    a.synced(1).await;
    b.synced(1).await;
    a.set(QUOTA);
    let err = a.call().await.unwrap_err();
    assert_eq!(err.class(), FailureClass::QuotaExhausted);
    assert_eq!(a.state(), Some(State::Open), "one exhausted quota opens it");
    let opened = Instant::now();
    until(|| b.state() == Some(State::Open)).await;
    let took = opened.elapsed();
    assert!(took <= a.state.propagation_bound(), "took {took:?}");
    // The other replica refuses for the open period without asking its upstream.
    let err = b.call().await.unwrap_err();
    assert_eq!(err.class(), FailureClass::CircuitOpen);
    let left = err.retry_after().unwrap();
    assert!(left <= Duration::from_secs(10), "the open period: {left:?}");
    assert_eq!(b.upstream_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_sends_one_probe_for_the_whole_fleet() {
    let server = RedisServer::start();
    let clock = wall_clock();
    let fleet: Vec<Replica> = ["a", "b", "c", "d"]
        .map(|n| replica(&server, n, &clock, |b| b))
        .into_iter()
        .collect();
    for r in &fleet {
        r.synced(1).await;
    }
    fail_until_open(&fleet[0]).await;
    until(|| fleet.iter().all(|r| r.state() == Some(State::Open))).await;
    let before: usize = fleet
        .iter()
        .map(|r| r.upstream_calls.load(Ordering::SeqCst))
        .sum();
    for r in &fleet {
        r.set(HANG);
    }

    // The fleet's open period ends. Every replica has traffic: each call that finds the key
    // open past its period asks for the probe; one replica gets the lease and probes.
    clock.advance(Duration::from_secs(11));
    let probes = || -> usize {
        fleet
            .iter()
            .map(|r| r.upstream_calls.load(Ordering::SeqCst))
            .sum::<usize>()
            - before
    };
    let mut calls = Vec::new();
    let started = Instant::now();
    while probes() == 0 {
        assert!(started.elapsed() < PATIENCE, "no probe was sent");
        for r in &fleet {
            calls.push(tokio::spawn(call(r.svc.clone())));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Keep calling on every replica for three more syncs of each: still one probe.
    let targets: Vec<u64> = fleet.iter().map(|r| r.state.syncs() + 3).collect();
    while fleet
        .iter()
        .zip(&targets)
        .any(|(r, t)| r.state.syncs() < *t)
    {
        assert!(started.elapsed() < PATIENCE, "the replicas stopped syncing");
        for r in &fleet {
            // A call that is admitted hangs in the upstream: a second probe.
            let refused = tokio::time::timeout(TIMEOUT, r.call()).await;
            let err = refused.expect("a second probe went out").unwrap_err();
            assert_eq!(err.class(), FailureClass::CircuitOpen);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(probes(), 1, "one probe for the fleet");
    let prober = fleet
        .iter()
        .position(|r| r.state() == Some(State::HalfOpen))
        .expect("the lease holder is half-open");
    assert!(
        fleet
            .iter()
            .enumerate()
            .all(|(i, r)| i == prober || r.state() == Some(State::Open)),
        "the others stay open"
    );

    // The probe succeeds: the prober closes, and the fleet with it.
    for r in &fleet {
        r.set(OK);
    }
    fleet[prober].release.add_permits(1);
    until(|| fleet[prober].state() == Some(State::Closed)).await;
    let closed = Instant::now();
    until(|| fleet.iter().all(|r| r.state() == Some(State::Closed))).await;
    let took = closed.elapsed();
    assert!(took <= fleet[0].state.propagation_bound(), "took {took:?}");
    for r in &fleet {
        r.call().await.unwrap();
    }
    drop(calls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_failing_alone_does_not_open_the_others() {
    let server = RedisServer::start();
    let clock = wall_clock();
    let [a, b, c] = ["a", "b", "c"].map(|n| replica(&server, n, &clock, |b| b));
    for r in [&b, &c] {
        for _ in 0..20 {
            r.call().await.unwrap();
        }
    }
    b.synced(2).await;
    c.synced(2).await;
    // a's own network is down: it sees nothing but failures, and trips its own breaker.
    fail_until_open(&a).await;
    a.synced(2).await;
    b.synced(2).await;
    c.synced(2).await;
    assert_eq!(a.state(), Some(State::Open), "a's local trip stays");
    assert_eq!(b.state(), Some(State::Closed));
    assert_eq!(c.state(), Some(State::Closed));
    b.call().await.unwrap();
    c.call().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_each_replica_breaks_on_its_own_and_the_sync_resumes_after_a_restart() {
    let mut server = RedisServer::start();
    let clock = wall_clock();
    let [a, b, c] = ["a", "b", "c"].map(|n| replica(&server, n, &clock, |b| b));
    for r in [&a, &b, &c] {
        r.synced(1).await;
    }
    server.stop();
    until(|| [&a, &b, &c].iter().all(|r| r.redis.is_degraded())).await;

    // Local state still works: a trips on its own failures, b and c serve.
    fail_until_open(&a).await;
    let started = Instant::now();
    b.call().await.unwrap();
    assert!(started.elapsed() < TIMEOUT, "a call does not wait on Redis");
    // Every sync since the trip fails (its evidence is dropped, not kept for later).
    let failed = a.redis.failures();
    until(|| a.redis.failures() >= failed + 2).await;
    let synced = a.state.syncs();

    server.restart();
    for r in [&a, &b, &c] {
        r.synced(1).await;
    }
    assert!(a.state.syncs() > synced);
    assert_eq!(a.state(), Some(State::Open), "a kept its local state");
    c.call().await.unwrap();
    assert_eq!(c.state(), Some(State::Closed), "a's trip stayed local");

    // The fleet works again: a trip on b reaches c.
    fail_until_open(&b).await;
    let tripped = Instant::now();
    until(|| c.state() == Some(State::Open)).await;
    assert!(tripped.elapsed() <= b.state.propagation_bound());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_a_key_the_fleet_held_open_probes_on_local_state() {
    let mut server = RedisServer::start();
    let clock = wall_clock();
    let [a, b] = ["a", "b"].map(|n| replica(&server, n, &clock, |b| b));
    a.synced(1).await;
    b.synced(1).await;
    fail_until_open(&a).await;
    until(|| b.state() == Some(State::Open)).await;
    // The fleet's open period ends; b, held open, would wait for the probe lease.
    clock.advance(Duration::from_secs(11));
    b.synced(2).await;
    assert_eq!(
        b.call().await.unwrap_err().class(),
        FailureClass::CircuitOpen
    );
    assert_eq!(b.upstream_calls.load(Ordering::SeqCst), 0);

    server.stop();
    until(|| b.redis.is_degraded()).await;
    // Redis is gone: b runs on its own state, whose open period is over, and probes itself.
    let started = Instant::now();
    while let Err(e) = b.call().await {
        assert_eq!(e.class(), FailureClass::CircuitOpen);
        assert!(started.elapsed() < PATIENCE, "b never probed on its own");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(b.upstream_calls.load(Ordering::SeqCst), 1, "one probe");
    assert_eq!(b.state(), Some(State::Closed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_through_a_closed_breaker_costs_no_round_trip() {
    let server = RedisServer::start();
    let clock = wall_clock();
    let a = replica_every(&server, "a", &clock, Duration::from_secs(60), |b| {
        b.count_window(10)
    });
    a.synced(1).await;
    let round_trips = a.redis.calls();
    for _ in 0..1_000 {
        a.call().await.unwrap();
    }
    assert_eq!(a.redis.calls(), round_trips, "1000 calls, no round trip");
    // What does cost one: a local trip syncs at once (so the counter does count syncs).
    fail_until_open(&a).await;
    until(|| a.redis.calls() > round_trips).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sync_task_stops_when_the_layer_is_gone() {
    let server = RedisServer::start();
    let clock = wall_clock();
    let a = replica(&server, "a", &clock, |b| b);
    a.synced(1).await;
    assert!(a.state.is_running());
    let state = a.state.clone();
    drop(a);
    until(|| !state.is_running()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_state_shares_one_layer() {
    let server = RedisServer::start();
    let redis = SharedRedis::new(server.url()).unwrap();
    let state = RedisBreakerState::new(redis);
    let _layer = CircuitBreakerLayer::builder()
        .shared_state(state.clone())
        .build()
        .unwrap();
    let err = CircuitBreakerLayer::builder()
        .shared_state(state)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "shared_state");
}

#[test]
fn building_outside_a_runtime_is_a_clear_error() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let redis = {
        let _in = rt.enter();
        SharedRedis::new("redis://:hunter2@127.0.0.1:1/").unwrap()
    };
    let state = RedisBreakerState::new(redis);
    assert!(!format!("{state:?}").contains("hunter2"));
    let err = CircuitBreakerLayer::builder()
        .shared_state(state)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "shared_state");
    assert!(!err.to_string().contains("hunter2"));
}

#[test]
fn bad_settings_are_clear_errors() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let redis = SharedRedis::new("redis://127.0.0.1:1/").unwrap();
    let err = RedisBreakerState::builder(redis.clone())
        .interval(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "interval");
    let err = RedisBreakerState::builder(redis)
        .window(Duration::from_millis(10))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "window");
}
