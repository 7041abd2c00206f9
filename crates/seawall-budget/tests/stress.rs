//! 1,000 concurrent attempts with random usage and outcomes against shared limits, on two
//! worker threads: at every admission, settled spend plus reservations stays within every
//! limit, and at the end the spend equals the sum of the per-attempt records.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::*;
use http_body::Frame;
use http_body_util::BodyExt;
use seawall_budget::*;
use seawall_core::{FailureClass, LlmError, Random, SeededRandom};
use seawall_test_support::AuditStore;
use tower::{Layer, ServiceExt};

const TENANTS: [&str; 4] = ["acme", "globex", "initech", "umbrella"];
const CALLS: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_attempts_never_overspend_and_records_add_up() {
    let store = Arc::new(AuditStore {
        inner: MemoryStore::new(),
        lock: Mutex::new(()),
        admissions: AtomicUsize::new(0),
        violations: AtomicUsize::new(0),
        most_committed: AtomicU64::new(0),
    });
    let sink = Arc::new(MemorySink::new());
    let total_limit = Usd::from_cents(150);
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("total", total_limit))
        .budget(Budget::daily("tenant-daily", Usd::from_cents(45)).per_key("tenant"))
        .budget(
            Budget::rolling(
                "model-hourly",
                Usd::from_dollars(1),
                Duration::from_secs(3600),
            )
            .per_model(),
        )
        .keys(tenant_keys())
        .store(store.clone())
        .sink(sink.clone())
        // Midday: no calendar boundary during the test.
        .wall_clock_origin(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000 / 86_400 * 86_400 + 43_200),
        )
        .build()
        .unwrap();

    // The upstream: random outcome and usage within the request's bounds, decided by the
    // request's own seed so the run does not depend on scheduling.
    let inner = tower::service_fn(|req: Ask| async move {
        let seed = req.ext.get::<u64>().copied().unwrap_or(0);
        let rng = SeededRandom::new(seed);
        tokio::task::yield_now().await;
        let used = usage(
            (rng.next_f64() * f64::from(req.input)) as u64,
            (rng.next_f64() * f64::from(req.max.unwrap_or(0))) as u64,
            0,
        );
        let roll = rng.next_f64();
        if roll < 0.10 {
            return Err(LlmError::new(FailureClass::Overloaded, "529"));
        }
        if roll < 0.18 {
            return Err(LlmError::new(FailureClass::Timeout, "attempt timeout"));
        }
        if roll < 0.25 {
            return Ok(done_without_usage());
        }
        if roll < 0.55 {
            return Ok(done(used));
        }
        // Streamed: the usage lands in the report just before the end (or the caller drops
        // the body part-way).
        let (resp, tx, report) = stream();
        tokio::spawn(async move {
            for _ in 0..3 {
                tokio::task::yield_now().await;
                if tx
                    .send(Ok(Frame::data(Bytes::from_static(b"data: x\n\n"))))
                    .is_err()
                {
                    return;
                }
            }
            report.set_usage(used);
        });
        Ok(resp)
    });
    let svc = layer.layer(inner);

    let mut tasks = Vec::new();
    for i in 0..CALLS {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let rng = SeededRandom::new(i ^ 0x5eed);
            let model = if rng.next_f64() < 0.5 {
                "gpt-4o"
            } else {
                "claude-haiku-4-5"
            };
            let input = 100 + (rng.next_f64() * 2_000.0) as u32;
            let max = 50 + (rng.next_f64() * 500.0) as u32;
            let tenant = TENANTS[(rng.next_f64() * 4.0) as usize];
            let mut ask = Ask::new(model, input, max).tenant(tenant);
            ask.ext.insert(i);
            let drop_early = rng.next_f64() < 0.1;
            match svc.oneshot(ask).await {
                Ok(resp) => {
                    let mut body = resp.into_body();
                    if drop_early {
                        let _ = body.frame().await;
                    } else {
                        while let Some(f) = body.frame().await {
                            if f.is_err() {
                                break;
                            }
                        }
                    }
                }
                Err(e) => {
                    assert!(
                        matches!(
                            e.class(),
                            FailureClass::BudgetExceeded
                                | FailureClass::Overloaded
                                | FailureClass::Timeout
                        ),
                        "{e}"
                    );
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }

    let records = sink.records();
    assert_eq!(records.len() as u64, CALLS, "one record per attempt");
    let refused = records
        .iter()
        .filter(|r| r.outcome == AttemptOutcome::Failed(FailureClass::BudgetExceeded))
        .count();
    let admitted = store.admissions.load(Ordering::Relaxed);
    assert_eq!(refused + admitted, CALLS as usize);
    assert!(
        refused > 100 && admitted > 100,
        "the limits must bind: {refused} refused, {admitted} admitted"
    );
    assert_eq!(store.violations.load(Ordering::Relaxed), 0);
    assert!(store.most_committed.load(Ordering::Relaxed) <= total_limit.as_nanos());

    let total = layer.spend("total", None).unwrap();
    assert_eq!(total.reserved, Usd::ZERO, "every reservation settled");
    let recorded: u64 = records.iter().map(|r| r.cost_nanos).sum();
    assert_eq!(total.spent.as_nanos(), recorded);
    assert!(total.spent <= total_limit);

    let mut per_tenant: HashMap<Arc<str>, u64> = HashMap::new();
    for r in &records {
        let tenant = r
            .keys
            .iter()
            .find(|(s, _)| &**s == "tenant")
            .unwrap()
            .1
            .clone();
        *per_tenant.entry(tenant).or_default() += r.cost_nanos;
    }
    for t in TENANTS {
        let s = layer.spend("tenant-daily", Some(t)).unwrap();
        assert_eq!(
            (s.spent.as_nanos(), s.reserved),
            (per_tenant[t], Usd::ZERO),
            "{t}"
        );
        assert!(s.spent <= s.limit);
    }
    for m in ["gpt-4o", "claude-haiku-4-5"] {
        assert_eq!(
            layer.spend("model-hourly", Some(m)).unwrap().reserved,
            Usd::ZERO
        );
    }
}
