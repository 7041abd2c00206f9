//! A fleet of replicas sharing one budget through Redis, each with its own connection and its
//! own `CostBudgetLayer`, as separate processes would: the budget holds for the fleet at every
//! admission, the spend in Redis is exactly what the replicas' records say, and an outage is
//! survived under either policy without hanging a call, losing a settlement or counting one
//! twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use seawall_budget::{
    Admission, Budget, BudgetStore, Charge, CostBudgetLayer, MemorySink, Price, PriceTable,
    ScopeKeys, Settled, Spend, SpendRecord, Timestamp, Usd,
};
use seawall_core::{FailureClass, LlmError, Usage};
use seawall_redis::{OnUnavailable, RedisBudgetStore, SharedRedis};
use seawall_test_support::{Ask, RedisServer, eventually, tenant_key};
use tower::{Layer, ServiceExt};

type Resp = http::Response<Empty<Bytes>>;

/// $1 per million tokens in and out: 1,000 nano-dollars a token.
fn prices() -> PriceTable {
    let p = Price::per_million(Usd::from_dollars(1), Usd::from_dollars(1));
    PriceTable::new().with("m", p).with("slow", p)
}

/// What one request of 1,000 tokens in and at most 1,000 out reserves.
const EST: u64 = 2_000_000;

fn answer(output: u64) -> Resp {
    let mut r = http::Response::new(Empty::new());
    r.extensions_mut().insert(Usage {
        input_tokens: 1_000,
        output_tokens: output,
        cached_input_tokens: 0,
        cache_write_input_tokens: 0,
        cache_write_1h_input_tokens: 0,
    });
    r
}

fn shared(server: &RedisServer, timeout: Duration) -> SharedRedis {
    SharedRedis::builder(server.url())
        .timeout(timeout)
        .build()
        .unwrap()
}

/// A store that checks, at every admission, the counters the reserve script read inside the
/// admission itself: settled plus reserved within each limit, over the whole fleet.
struct Audited {
    inner: RedisBudgetStore,
    admissions: Arc<AtomicUsize>,
    violations: Arc<AtomicUsize>,
}

impl BudgetStore for Audited {
    fn reserve(&self, charge: &Charge<'_>) -> Admission {
        let decided = self.inner.reserve_counted(charge);
        let (admissions, violations) = (self.admissions.clone(), self.violations.clone());
        Admission::Pending(Box::pin(async move {
            let lines = decided.await?;
            admissions.fetch_add(1, Ordering::Relaxed);
            if lines.iter().any(|s: &Spend| s.committed() > s.limit) {
                violations.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }))
    }

    fn settle(&self, charge: &Charge<'_>, cost: Usd) -> Settled {
        self.inner.settle(charge, cost)
    }

    fn spend(&self, budget: &Budget, key: Option<&str>, now: Timestamp) -> Spend {
        self.inner.spend(budget, key, now)
    }

    fn read(
        &self,
        budget: &Budget,
        key: Option<&str>,
        now: Timestamp,
    ) -> seawall_budget::SpendFuture {
        self.inner.read(budget, key, now)
    }
}

fn charged(records: &[SpendRecord]) -> u64 {
    records.iter().map(|r| r.cost_nanos).sum()
}

/// Waits until every settlement has landed (nothing reserved), and answers the counter.
async fn settled_all<K>(layer: &CostBudgetLayer<K>, budget: &str) -> Spend {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let last = layer.read_spend(budget, None).unwrap().await;
        if let Ok(s) = last {
            if s.reserved == Usd::ZERO {
                return s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "reservations still outstanding: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_share_one_budget_exactly() {
    const REPLICAS: usize = 4;
    const CALLS: usize = 1_000;
    let server = RedisServer::start();
    // About 1,500 estimates for the fleet; the tenants' daily limits bind as well.
    let total = Usd::from_nanos(1_500 * EST);
    let per_tenant = Usd::from_nanos(420 * EST);
    let (admissions, violations) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        // Generous: 4,000 concurrent calls on a small shared machine; a timeout is not what
        // this test is about (and would only refuse, never overspend).
        let store = RedisBudgetStore::new(shared(&server, Duration::from_secs(5)));
        let sink = Arc::new(MemorySink::new());
        let layer = CostBudgetLayer::builder(prices())
            .budget(Budget::total("fleet", total))
            .budget(Budget::daily("tenant", per_tenant).per_key("tenant"))
            .keys(ScopeKeys::new().scope("tenant", tenant_key))
            .store(Audited {
                inner: store,
                admissions: admissions.clone(),
                violations: violations.clone(),
            })
            .sink(sink.clone())
            .build()
            .unwrap();
        replicas.push((layer, sink));
    }
    let mut tasks = Vec::new();
    for (r, (layer, _)) in replicas.iter().enumerate() {
        let n = Arc::new(AtomicUsize::new(0));
        let inner = tower::service_fn(move |_: Ask| {
            let i = n.fetch_add(1, Ordering::Relaxed) as u64;
            async move {
                tokio::task::yield_now().await;
                Ok::<_, LlmError>(answer((i * 7 + r as u64) % 1_001))
            }
        });
        let svc = layer.layer(inner);
        for i in 0..CALLS {
            let svc = svc.clone();
            let tenant = format!("t{}", (i + r) % 4);
            tasks.push(tokio::spawn(async move {
                svc.oneshot(Ask::new("m", 1_000, 1_000).tenant(&tenant))
                    .await
                    .map(drop)
            }));
        }
    }
    let mut refused = 0;
    for t in tasks {
        if let Err(e) = t.await.unwrap() {
            assert_eq!(e.class(), FailureClass::BudgetExceeded, "{e}");
            refused += 1;
        }
    }
    let admitted = admissions.load(Ordering::Relaxed);
    assert_eq!(admitted + refused, REPLICAS * CALLS);
    assert!(refused > 0 && admitted > 1_000, "{admitted} admitted");
    assert_eq!(
        violations.load(Ordering::Relaxed),
        0,
        "over the limit at an admission"
    );

    let layer = &replicas[0].0;
    let fleet = settled_all(layer, "fleet").await;
    let records: Vec<SpendRecord> = replicas.iter().flat_map(|(_, s)| s.records()).collect();
    assert_eq!(records.len(), REPLICAS * CALLS, "one record per attempt");
    assert_eq!(
        fleet.spent.as_nanos(),
        charged(&records),
        "redis equals the ledgers"
    );
    assert!(fleet.spent <= total);
    for t in 0..4 {
        let tenant = format!("t{t}");
        let spend = layer
            .read_spend("tenant", Some(&tenant))
            .unwrap()
            .await
            .unwrap();
        let mine: Vec<SpendRecord> = records
            .iter()
            .filter(|r| r.keys.iter().any(|(_, k)| **k == *tenant))
            .cloned()
            .collect();
        assert_eq!(spend.spent.as_nanos(), charged(&mine), "{tenant}");
        assert_eq!(spend.reserved, Usd::ZERO);
        assert!(spend.spent <= per_tenant);
    }
}

/// One replica's stack with a transport that answers at once (or, for model `slow`, when
/// told to), a record sink, and its store.
struct Replica {
    layer: CostBudgetLayer,
    sink: Arc<MemorySink>,
    store: RedisBudgetStore,
    release: Arc<tokio::sync::Notify>,
    reached: Arc<tokio::sync::Notify>,
}

impl Replica {
    fn new(server: &RedisServer, policy: OnUnavailable, limit: Usd) -> Replica {
        let store = RedisBudgetStore::builder(shared(server, Duration::from_millis(200)))
            .on_unavailable(policy)
            .build()
            .unwrap();
        let sink = Arc::new(MemorySink::new());
        let layer = CostBudgetLayer::builder(prices())
            .budget(Budget::total("all", limit))
            .store(store.clone())
            .sink(sink.clone())
            .build()
            .unwrap();
        Replica {
            layer,
            sink,
            store,
            release: Arc::default(),
            reached: Arc::default(),
        }
    }

    /// One call, answered with its whole estimate as usage; how long it took.
    async fn call(&self, model: &str) -> (Result<(), LlmError>, Duration) {
        let (release, reached) = (self.release.clone(), self.reached.clone());
        let inner = tower::service_fn(move |req: Ask| {
            let (release, reached) = (release.clone(), reached.clone());
            async move {
                if req.model.as_deref() == Some("slow") {
                    reached.notify_one();
                    release.notified().await;
                }
                Ok::<_, LlmError>(answer(1_000))
            }
        });
        let started = Instant::now();
        let out = self
            .layer
            .layer(inner)
            .oneshot(Ask::new(model, 1_000, 1_000))
            .await
            .map(drop);
        (out, started.elapsed())
    }
}

/// No call may wait much past the store's 200 ms timeout (the margin is for a busy machine).
const NO_HANG: Duration = Duration::from_millis(1_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_refuses_while_redis_is_down_and_loses_no_settlement() {
    let mut server = RedisServer::start();
    let replica = Arc::new(Replica::new(
        &server,
        OnUnavailable::FailClosed,
        Usd::from_dollars(1),
    ));
    for _ in 0..10 {
        let (out, took) = replica.call("m").await;
        out.unwrap();
        assert!(took < NO_HANG, "{took:?}");
    }
    let before = settled_all(&replica.layer, "all").await;
    assert_eq!(before.spent.as_nanos(), charged(&replica.sink.records()));
    let recorded_before = replica.sink.records().len();

    // A call in flight when the server dies: reserved before, settled after.
    let in_flight = {
        let r = replica.clone();
        tokio::spawn(async move { r.call("slow").await })
    };
    replica.reached.notified().await;
    server.stop();
    replica.release.notify_one();
    let (out, _) = in_flight.await.unwrap();
    out.unwrap();

    for _ in 0..5 {
        let (out, took) = replica.call("m").await;
        let err = out.unwrap_err();
        assert_eq!(err.class(), FailureClass::SharedStateUnavailable, "{err}");
        assert!(took < NO_HANG, "{took:?}");
    }
    assert!(replica.store.redis().is_degraded());

    // Back, empty: it reconnects on its own, the queued settlement lands, calls pass again.
    server.restart();
    let back = eventually(Duration::from_secs(10), || async {
        replica.call("m").await.0.is_ok()
    })
    .await;
    assert!(back, "calls were not admitted again after the restart");
    for _ in 0..5 {
        let (out, took) = replica.call("m").await;
        out.unwrap();
        assert!(took < NO_HANG, "{took:?}");
    }
    // The restarted server lost what it held before; everything charged since is there
    // exactly once, the call in flight during the outage included: its settlement was retried
    // until the server came back (nothing in the new server says it is still to come, so wait
    // for the sum itself).
    let since: Vec<SpendRecord> = replica.sink.records().split_off(recorded_before);
    assert!(
        since.iter().any(|r| r.cost_nanos == EST),
        "the call in flight is recorded"
    );
    let want = charged(&since);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut spent = 0;
    while spent != want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let read = replica.layer.read_spend("all", None).unwrap().await;
        spent = read.map_or(0, |s| s.spent.as_nanos());
    }
    let landed = spent == want;
    assert!(landed, "redis has {spent}, the records {want}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_admits_within_the_local_share_while_redis_is_down() {
    let mut server = RedisServer::start();
    // 40 estimates for the fleet of 4: 10 for this replica while it is on its own.
    let replica = Replica::new(
        &server,
        OnUnavailable::fail_open(4),
        Usd::from_nanos(40 * EST),
    );
    for _ in 0..3 {
        replica.call("m").await.0.unwrap();
    }
    let before = settled_all(&replica.layer, "all").await;
    assert_eq!(before.spent, Usd::from_nanos(3 * EST));

    server.stop();
    for i in 0..12 {
        let (out, took) = replica.call("m").await;
        assert!(took < NO_HANG, "{took:?}");
        match i {
            0..10 => out.unwrap(),
            _ => {
                let err = out.unwrap_err();
                assert_eq!(err.class(), FailureClass::BudgetExceeded, "{err}");
            }
        }
    }
    let share = Budget::total("all", Usd::from_nanos(40 * EST)).share(4);
    let local = replica
        .store
        .local()
        .spend(&share, None, replica.layer.now());
    assert_eq!(
        (local.spent, local.reserved),
        (Usd::from_nanos(10 * EST), Usd::ZERO)
    );

    server.restart();
    let back = eventually(Duration::from_secs(10), || async {
        replica.call("m").await.0.is_ok() && !replica.store.redis().is_degraded()
    })
    .await;
    assert!(back, "the store did not go back to redis after the restart");
    let after = settled_all(&replica.layer, "all").await;
    // Each attempt counted in exactly one place: redis before the outage, the local share
    // during it, the restarted redis after it.
    assert_eq!(
        before.spent.as_nanos() + local.spent.as_nanos() + after.spent.as_nanos(),
        charged(&replica.sink.records())
    );
}
