//! The Redis budget store's own promises, beyond what it shares with the in-process store:
//! ids make retries harmless, leases free what a dead replica held, a caller that goes away
//! mid-reservation leaves nothing behind, and a lease or window moves with the layer's clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use seawall_budget::{Admission, Budget, BudgetStore, Charge, Refusal, Spend, Timestamp, Usd};
use seawall_redis::{OnUnavailable, RedisBudgetStore, SharedRedis};
use seawall_test_support::conformance::{read, reserve, settle};
use seawall_test_support::{RedisServer, eventually};

const T0: u64 = 1_700_000_000;

fn at(secs: u64) -> Timestamp {
    Timestamp::from_unix_secs(secs)
}

fn store(server: &RedisServer) -> RedisBudgetStore {
    let redis = SharedRedis::builder(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    RedisBudgetStore::new(redis)
}

#[tokio::test]
async fn a_reservation_or_settlement_repeated_with_its_id_is_charged_once() {
    let server = RedisServer::start();
    let s = store(&server);
    let b = [Budget::total("total", Usd::from_nanos(100))];
    let c = Charge::new(&b, &[], Usd::from_nanos(30), at(T0));
    reserve(&s, &c).await.unwrap();
    reserve(&s, &c).await.unwrap();
    assert_eq!(
        read(&s, &b[0], None, at(T0)).await.reserved,
        Usd::from_nanos(30)
    );
    settle(&s, &c, Usd::from_nanos(25)).await;
    settle(&s, &c, Usd::from_nanos(25)).await;
    let spend = read(&s, &b[0], None, at(T0)).await;
    assert_eq!(
        (spend.spent, spend.reserved),
        (Usd::from_nanos(25), Usd::ZERO)
    );
}

#[tokio::test]
async fn two_replicas_with_the_same_local_id_do_not_collide() {
    let server = RedisServer::start();
    let (a, b) = (store(&server), store(&server));
    let budgets = [Budget::total("total", Usd::from_nanos(100))];
    let c = Charge::new(&budgets, &[], Usd::from_nanos(30), at(T0)).with_id(7);
    reserve(&a, &c).await.unwrap();
    reserve(&b, &c).await.unwrap();
    assert_eq!(
        read(&a, &budgets[0], None, at(T0)).await.reserved,
        Usd::from_nanos(60)
    );
}

#[tokio::test]
async fn a_replica_dropped_mid_call_leaves_no_reservation_after_its_lease() {
    let server = RedisServer::start();
    let b = [Budget::daily("daily", Usd::from_nanos(100)).per_key("tenant")];
    let keys: [Option<Arc<str>>; 1] = [Some("acme".into())];
    let lease = Duration::from_secs(60);
    {
        let redis = SharedRedis::builder(server.url())
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let dying = RedisBudgetStore::builder(redis)
            .lease(lease)
            .build()
            .unwrap();
        reserve(&dying, &Charge::new(&b, &keys, Usd::from_nanos(80), at(T0)))
            .await
            .unwrap();
        // The replica goes away without settling.
    }
    let other = store(&server);
    let held = read(&other, &b[0], Some("acme"), at(T0 + 59)).await;
    assert_eq!(
        held.reserved,
        Usd::from_nanos(80),
        "held until the lease ends"
    );
    let c = Charge::new(&b, &keys, Usd::from_nanos(80), at(T0 + 59));
    assert!(reserve(&other, &c).await.is_err());
    let freed = read(&other, &b[0], Some("acme"), at(T0 + 60)).await;
    assert_eq!(
        freed.reserved,
        Usd::ZERO,
        "given back once the clock passes the lease"
    );
    let c = Charge::new(&b, &keys, Usd::from_nanos(80), at(T0 + 60));
    reserve(&other, &c).await.unwrap();
}

#[tokio::test]
async fn a_caller_that_goes_away_mid_reservation_leaves_nothing_reserved() {
    let server = RedisServer::start();
    let s = store(&server);
    let b = [Budget::total("total", Usd::from_nanos(100))];
    let c = Charge::new(&b, &[], Usd::from_nanos(30), at(T0));
    let Admission::Pending(mut fut) = s.reserve(&c) else {
        panic!("a remote store decides later");
    };
    // Sent, not answered yet: then dropped.
    assert!(futures_util::poll!(&mut fut).is_pending());
    drop(fut);
    let gone = eventually(Duration::from_secs(5), || async {
        let spend = read(&s, &b[0], None, at(T0)).await;
        spend.reserved == Usd::ZERO
    })
    .await;
    assert!(gone, "the dropped reservation was not released");
    // The id is spent: the same reservation arriving again is a no-op.
    reserve(&s, &c).await.unwrap();
    assert_eq!(read(&s, &b[0], None, at(T0)).await.reserved, Usd::ZERO);
}

#[tokio::test]
async fn spend_answers_what_this_replica_last_saw_without_waiting() {
    let server = RedisServer::start();
    let (a, b) = (store(&server), store(&server));
    let budgets = [Budget::total("total", Usd::from_nanos(100))];
    reserve(&a, &Charge::new(&budgets, &[], Usd::from_nanos(30), at(T0)))
        .await
        .unwrap();
    let seen = a.spend(&budgets[0], None, at(T0));
    assert_eq!(
        seen,
        Spend {
            spent: Usd::ZERO,
            reserved: Usd::from_nanos(30),
            limit: Usd::from_nanos(100)
        }
    );
    reserve(&b, &Charge::new(&budgets, &[], Usd::from_nanos(10), at(T0)))
        .await
        .unwrap();
    assert_eq!(
        a.spend(&budgets[0], None, at(T0)).reserved,
        Usd::from_nanos(30)
    );
    assert_eq!(
        read(&a, &budgets[0], None, at(T0)).await.reserved,
        Usd::from_nanos(40)
    );
    assert_eq!(
        a.spend(&budgets[0], None, at(T0)).reserved,
        Usd::from_nanos(40)
    );
}

#[tokio::test]
async fn a_lease_outside_one_second_to_one_day_is_refused() {
    let redis = SharedRedis::new("redis://127.0.0.1:1/").unwrap();
    for lease in [Duration::from_millis(10), Duration::from_secs(2 * 86_400)] {
        let err = RedisBudgetStore::builder(redis.clone())
            .lease(lease)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("lease"), "{err}");
    }
}

#[tokio::test]
async fn fail_closed_refuses_within_the_timeout_when_redis_is_gone() {
    let mut server = RedisServer::start();
    let redis = SharedRedis::builder(server.url())
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let s = RedisBudgetStore::new(redis);
    let b = [Budget::total("total", Usd::from_nanos(100))];
    server.stop();
    let started = Instant::now();
    let answer = match s.reserve(&Charge::new(&b, &[], Usd::from_nanos(30), at(T0))) {
        Admission::Pending(f) => f.await,
        Admission::Ready(r) => r,
    };
    // The timeout and no more (the margin is for a busy machine).
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(answer, Err(Refusal::Unavailable(_))), "{answer:?}");
    let Err(Refusal::Unavailable(why)) = answer else {
        unreachable!()
    };
    assert!(!why.reason.contains("redis://"), "{why}");
    assert!(s.redis().is_degraded());
}

#[tokio::test]
async fn fail_open_enforces_this_replicas_share_while_redis_is_gone() {
    let mut server = RedisServer::start();
    let redis = SharedRedis::builder(server.url())
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let s = RedisBudgetStore::builder(redis)
        .on_unavailable(OnUnavailable::fail_open(4))
        .build()
        .unwrap();
    let b = [Budget::total("total", Usd::from_nanos(100))];
    server.stop();
    // A quarter of 100: two of 10 fit with 5 to spare, a third does not.
    let c1 = Charge::new(&b, &[], Usd::from_nanos(10), at(T0));
    reserve(&s, &c1).await.unwrap();
    let c2 = Charge::new(&b, &[], Usd::from_nanos(10), at(T0));
    reserve(&s, &c2).await.unwrap();
    let refused = reserve(&s, &Charge::new(&b, &[], Usd::from_nanos(10), at(T0)))
        .await
        .unwrap_err();
    assert_eq!(refused.spend.limit, Usd::from_nanos(25));
    // Settled where it was reserved: on the local share, at once.
    assert!(matches!(
        s.settle(&c1, Usd::from_nanos(7)),
        seawall_budget::Settled::Ready(_)
    ));
    let local = s.local().spend(&b[0].share(4), None, at(T0));
    assert_eq!(
        (local.spent, local.reserved),
        (Usd::from_nanos(7), Usd::from_nanos(10))
    );

    // Back: decisions are shared again, and the local spend is not copied there.
    server.restart();
    let back = eventually(Duration::from_secs(5), || async {
        let c = Charge::new(&b, &[], Usd::from_nanos(50), at(T0));
        match s.reserve(&c) {
            Admission::Pending(f) => f.await.is_ok() && !s.redis().is_degraded(),
            Admission::Ready(_) => false,
        }
    })
    .await;
    assert!(back, "the store did not use redis again after the restart");
    assert_eq!(read(&s, &b[0], None, at(T0)).await.spent, Usd::ZERO);
    settle(&s, &c2, Usd::from_nanos(10)).await;
    let local = s.local().spend(&b[0].share(4), None, at(T0));
    assert_eq!(
        (local.spent, local.reserved),
        (Usd::from_nanos(17), Usd::ZERO)
    );
}

#[tokio::test]
async fn a_reservation_that_times_out_but_runs_later_is_released() {
    let server = RedisServer::start();
    let s = RedisBudgetStore::new(
        SharedRedis::builder(server.url())
            .timeout(Duration::from_millis(100))
            .build()
            .unwrap(),
    );
    let b = [Budget::total("total", Usd::from_nanos(100))];
    // Redis holds every script for 400 ms: the reservation times out on our side, then runs.
    let admin = store(&server);
    admin
        .redis()
        .run("test", |mut c| async move {
            redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(400)
                .arg("WRITE")
                .query_async::<()>(&mut c)
                .await
        })
        .await
        .unwrap();
    let started = Instant::now();
    let c = Charge::new(&b, &[], Usd::from_nanos(30), at(T0));
    let answer = match s.reserve(&c) {
        Admission::Pending(f) => f.await,
        Admission::Ready(r) => r,
    };
    assert!(matches!(answer, Err(Refusal::Unavailable(_))), "{answer:?}");
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "{:?}",
        started.elapsed()
    );
    // The release queued behind it on the same connection undoes it once both have run.
    let released = eventually(Duration::from_secs(5), || async {
        let spend = read(&admin, &b[0], None, at(T0)).await;
        started.elapsed() > Duration::from_millis(400) && spend.reserved == Usd::ZERO
    })
    .await;
    assert!(released, "the late reservation was left standing");
    let leases: u64 = admin
        .redis()
        .run("test", |mut c| async move {
            redis::cmd("EXISTS")
                .arg("seawall:budget-lease:5:total:g")
                .query_async(&mut c)
                .await
        })
        .await
        .unwrap();
    assert_eq!(leases, 0, "no lease left behind");
}

#[tokio::test]
async fn a_replica_that_never_settles_through_its_layer_frees_the_budget_after_its_lease() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::SystemTime;

    use seawall_budget::{CostBudgetLayer, Price, PriceTable};
    use seawall_core::LlmError;
    use seawall_test_support::Ask;
    use tower::{Layer, ServiceExt};

    let server = RedisServer::start();
    let clock = Arc::new(AtomicU64::new(T0));
    let layer = |clock: Arc<AtomicU64>| {
        let redis = SharedRedis::builder(server.url())
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        CostBudgetLayer::builder(
            PriceTable::new().with("m", Price::per_million(Usd::from_dollars(1), Usd::ZERO)),
        )
        // Room for one attempt of 1,000 tokens ($0.001) at a time.
        .budget(Budget::total("total", Usd::from_nanos(1_500_000)))
        .store(RedisBudgetStore::new(redis))
        .wall_clock(move || {
            SystemTime::UNIX_EPOCH + Duration::from_secs(clock.load(Ordering::Relaxed))
        })
        .build()
        .unwrap()
    };
    let (dying, other) = (layer(clock.clone()), layer(clock.clone()));
    // An upstream that never answers: the call holds its reservation.
    let hang = tower::service_fn(|_: Ask| {
        std::future::pending::<Result<http::Response<http_body_util::Empty<bytes::Bytes>>, LlmError>>(
        )
    });
    let mut call = Box::pin(dying.layer(hang).oneshot(Ask::new("m", 1_000, 0)));
    // Driven until its reservation is in Redis (the upstream then never answers).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(futures_util::poll!(&mut call).is_pending());
        let spend = other.read_spend("total", None).unwrap().await.unwrap();
        if spend.reserved == Usd::from_nanos(1_000_000) {
            break;
        }
        assert!(Instant::now() < deadline, "the call never reserved");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The replica dies mid-call: nothing of it runs again, nothing settles.
    let _dead = std::mem::ManuallyDrop::new(call);
    let refused = other
        .layer(tower::service_fn(|_: Ask| async {
            Ok::<_, LlmError>(http::Response::new(
                http_body_util::Empty::<bytes::Bytes>::new(),
            ))
        }))
        .oneshot(Ask::new("m", 1_000, 0))
        .await
        .unwrap_err();
    assert_eq!(refused.class(), seawall_core::FailureClass::BudgetExceeded);
    // Past the lease, on the layers' clock.
    clock.fetch_add(seawall_redis::DEFAULT_LEASE.as_secs(), Ordering::Relaxed);
    let spend = other.read_spend("total", None).unwrap().await.unwrap();
    assert_eq!(spend.reserved, Usd::ZERO);
}

#[tokio::test]
async fn while_redis_hangs_only_one_call_a_period_pays_the_timeout() {
    let server = RedisServer::start();
    let redis = SharedRedis::builder(server.url())
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let s = RedisBudgetStore::builder(redis.clone())
        .on_unavailable(OnUnavailable::fail_open(4))
        .build()
        .unwrap();
    let b = [Budget::total("total", Usd::from_dollars(1))];
    reserve(&s, &Charge::new(&b, &[], Usd::from_nanos(1), at(T0)))
        .await
        .unwrap();
    // Another client makes the server hold every command for two seconds.
    let admin = SharedRedis::new(server.url()).unwrap();
    admin
        .run("test", |mut c| async move {
            redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(2000)
                .arg("ALL")
                .query_async::<()>(&mut c)
                .await
        })
        .await
        .unwrap();
    // The first call asks, waits out the timeout, and is decided on the local share.
    let started = Instant::now();
    reserve(&s, &Charge::new(&b, &[], Usd::from_nanos(1), at(T0)))
        .await
        .unwrap();
    let first = started.elapsed();
    assert!(first >= Duration::from_millis(100), "{first:?}");
    assert!(redis.is_degraded());
    // The next ones, within the probe period, do not ask: no timeout for them.
    let started = Instant::now();
    for _ in 0..20 {
        reserve(&s, &Charge::new(&b, &[], Usd::from_nanos(1), at(T0)))
            .await
            .unwrap();
    }
    let rest = started.elapsed();
    assert!(
        rest < seawall_redis::PROBE_EVERY,
        "20 calls took {rest:?}: they waited for the hung server"
    );
    assert_eq!(
        s.local().spend(&b[0].share(4), None, at(T0)).reserved,
        Usd::from_nanos(21)
    );
}
