//! The behaviour every [`BudgetStore`] must share, written once and run against each store.
//!
//! A budget must mean the same thing whether its counters live in the process or in Redis:
//! the same admissions, the same windows, the same soft-limit reports. Each function here
//! checks one behaviour on a fresh store and panics when the store differs; the
//! [`budget_store_conformance!`](crate::budget_store_conformance) macro turns every one of
//! them into a test of the crate that invokes it. The functions are async and await every
//! answer (`Admission::Pending`, `Settled::Pending`, `read`), so a store that waits on I/O is
//! checked exactly like one that does not.

use std::sync::Arc;
use std::time::Duration;

use seawall_budget::{
    Admission, Budget, BudgetStore, Charge, Exceeded, Refusal, SoftLimitCrossed, Spend, Timestamp,
    Usd,
};

/// A time far from any window boundary, so tests place boundaries explicitly.
const T0: u64 = 1_700_000_000;

fn at(secs: u64) -> Timestamp {
    Timestamp::from_unix_secs(secs)
}

fn n(nanos: u64) -> Usd {
    Usd::from_nanos(nanos)
}

/// Waits for a reservation's answer; a store that could not decide fails the test.
pub async fn reserve(store: &impl BudgetStore, charge: &Charge<'_>) -> Result<(), Exceeded> {
    let answer = match store.reserve(charge) {
        Admission::Ready(r) => r,
        Admission::Pending(f) => f.await,
    };
    match answer {
        Ok(()) => Ok(()),
        Err(Refusal::Exceeded(e)) => Err(e),
        Err(Refusal::Unavailable(u)) => panic!("the store could not decide: {u}"),
    }
}

/// Settles and waits until the store has applied the settlement.
pub async fn settle(
    store: &impl BudgetStore,
    charge: &Charge<'_>,
    cost: Usd,
) -> Vec<SoftLimitCrossed> {
    store.settle(charge, cost).crossed().await
}

/// The counter as the store's source of truth holds it.
pub async fn read(
    store: &impl BudgetStore,
    budget: &Budget,
    key: Option<&str>,
    now: Timestamp,
) -> Spend {
    store
        .read(budget, key, now)
        .await
        .unwrap_or_else(|e| panic!("the store could not be read: {e}"))
}

/// A reservation checks every line and takes from all of them or none; a refusal names the
/// line that refused and its counter.
pub async fn all_lines_or_none(store: &impl BudgetStore) {
    let budgets = [
        Budget::total("total", n(100)),
        Budget::total("tenant", n(30)).per_key("tenant"),
    ];
    let a: [Option<Arc<str>>; 2] = [None, Some("a".into())];
    let b: [Option<Arc<str>>; 2] = [None, Some("b".into())];
    let t = at(T0);
    let first = Charge::new(&budgets, &a, n(20), t);
    reserve(store, &first).await.unwrap();
    let refused = reserve(store, &Charge::new(&budgets, &a, n(20), t))
        .await
        .unwrap_err();
    assert_eq!(&*refused.budget, "tenant");
    assert_eq!(refused.key.as_deref(), Some("a"));
    assert_eq!(refused.requested, n(20));
    assert_eq!(
        refused.spend,
        Spend {
            spent: Usd::ZERO,
            reserved: n(20),
            limit: n(30)
        }
    );
    // The refused charge left nothing behind on the line that would have admitted it.
    assert_eq!(read(store, &budgets[0], None, t).await.reserved, n(20));
    // Another tenant is unaffected, until the total runs out.
    for _ in 0..4 {
        reserve(store, &Charge::new(&budgets, &b, n(7), t))
            .await
            .unwrap();
    }
    assert_eq!(read(store, &budgets[0], None, t).await.committed(), n(48));
    settle(store, &first, n(5)).await;
    let s = read(store, &budgets[1], Some("a"), t).await;
    assert_eq!((s.spent, s.reserved), (n(5), Usd::ZERO));
    let s = read(store, &budgets[1], Some("b"), t).await;
    assert_eq!((s.spent, s.reserved), (Usd::ZERO, n(28)));
}

/// Admission is exact at the limit, and a settlement replaces the reservation by the cost,
/// whether the cost is more, less or nothing (a release).
pub async fn settle_replaces_the_reservation_by_the_cost(store: &impl BudgetStore) {
    let b = [Budget::total("total", n(100))];
    let t = at(T0);
    let over = Charge::new(&b, &[], n(40), t);
    reserve(store, &over).await.unwrap();
    settle(store, &over.at(at(T0 + 1)), n(55)).await;
    let s = read(store, &b[0], None, at(T0 + 1)).await;
    assert_eq!((s.spent, s.reserved, s.limit), (n(55), Usd::ZERO, n(100)));
    let released = Charge::new(&b, &[], n(40), t);
    reserve(store, &released).await.unwrap();
    settle(store, &released, Usd::ZERO).await;
    let s = read(store, &b[0], None, t).await;
    assert_eq!((s.spent, s.reserved), (n(55), Usd::ZERO));
    // 55 + 45 is exactly the limit: admitted; one more nano-dollar is not.
    reserve(store, &Charge::new(&b, &[], n(45), t))
        .await
        .unwrap();
    let refused = reserve(store, &Charge::new(&b, &[], n(1), t))
        .await
        .unwrap_err();
    assert_eq!(refused.spend.committed(), n(100));
    assert_eq!(refused.key, None);
}

/// A calendar window starts empty at its boundary, but a reservation made before it still
/// counts after it until it is settled, and is settled into the new window.
pub async fn a_calendar_window_resets_spend_but_keeps_reservations(store: &impl BudgetStore) {
    let hourly = [Budget::hourly("h", n(10))];
    // Ten seconds before the boundary: well within any store's lease on a reservation.
    let t0 = at(3600 * 500_001 - 10);
    let held = Charge::new(&hourly, &[], n(4), t0);
    reserve(store, &held).await.unwrap();
    let spent = Charge::new(&hourly, &[], n(6), t0);
    reserve(store, &spent).await.unwrap();
    settle(store, &spent, n(6)).await;
    assert!(
        reserve(store, &Charge::new(&hourly, &[], n(1), t0))
            .await
            .is_err()
    );
    let t1 = at(3600 * 500_001);
    let s = read(store, &hourly[0], None, t1).await;
    assert_eq!((s.spent, s.reserved), (Usd::ZERO, n(4)));
    reserve(store, &Charge::new(&hourly, &[], n(6), t1))
        .await
        .unwrap();
    settle(store, &held.at(t1), n(4)).await;
    let s = read(store, &hourly[0], None, t1).await;
    assert_eq!((s.spent, s.reserved), (n(4), n(6)));
}

/// A rolling window holds spend for its duration and lets it go within one sub-window after.
pub async fn a_rolling_window_forgets_spend_after_its_duration(store: &impl BudgetStore) {
    let b = [Budget::rolling("r", n(100), Duration::from_secs(60))];
    let c = Charge::new(&b, &[], n(80), at(T0));
    reserve(store, &c).await.unwrap();
    settle(store, &c, n(80)).await;
    let later = Charge::new(&b, &[], n(30), at(T0 + 59));
    assert!(reserve(store, &later).await.is_err(), "still in the window");
    assert_eq!(read(store, &b[0], None, at(T0 + 59)).await.spent, n(80));
    // A minute and a sub-window (one second) later, it has left.
    let gone = Charge::new(&b, &[], n(30), at(T0 + 62));
    reserve(store, &gone).await.unwrap();
    let s = read(store, &b[0], None, at(T0 + 62)).await;
    assert_eq!((s.spent, s.reserved), (Usd::ZERO, n(30)));
}

/// A soft threshold is reported once per window and key; a rolling window reports it again
/// once its spend has fallen below it, a calendar window in its next period.
pub async fn the_soft_limit_fires_once_per_window_and_rearms(store: &impl BudgetStore) {
    let rolling = [Budget::rolling("r", n(100), Duration::from_secs(60)).soft_limit_percent(50)];
    let b = &rolling;
    let spend = |secs: u64, cost: u64| async move {
        let c = Charge::new(b, &[], Usd::ZERO, at(secs));
        reserve(store, &c).await.unwrap();
        settle(store, &c, n(cost)).await
    };
    let crossed = spend(T0, 60).await;
    assert_eq!(crossed.len(), 1);
    assert_eq!(
        crossed[0],
        SoftLimitCrossed {
            budget: "r".into(),
            key: None,
            spent: n(60),
            threshold: n(50),
            limit: n(100)
        }
    );
    assert!(spend(T0 + 1, 10).await.is_empty(), "once in the window");
    assert!(spend(T0 + 62, 10).await.is_empty());
    assert_eq!(
        spend(T0 + 63, 45).await.len(),
        1,
        "again after falling below"
    );

    let d = [Budget::daily("d", n(100))
        .soft_limit_percent(50)
        .per_key("k")];
    let keys: [Option<Arc<str>>; 1] = [Some("x".into())];
    let day = |d0: u64| 86_400 * (20_000 + d0);
    for (secs, cost, fired) in [(day(0), 50, 1), (day(0) + 5, 50, 0), (day(1), 60, 1)] {
        let c = Charge::new(&d, &keys, Usd::ZERO, at(secs));
        reserve(store, &c).await.unwrap();
        let crossed = settle(store, &c, n(cost)).await;
        assert_eq!(crossed.len(), fired, "at {secs}");
        if let Some(c) = crossed.first() {
            assert_eq!(c.key.as_deref(), Some("x"));
        }
    }
}

/// Concurrent reservations never commit more than the limit: exactly as many as fit are
/// admitted.
pub async fn concurrent_reservations_never_overcommit(store: &impl BudgetStore) {
    let b = [Budget::total("total", n(100))];
    let t = at(T0);
    let charges: Vec<Charge<'_>> = (0..50).map(|_| Charge::new(&b, &[], n(7), t)).collect();
    let answers = futures_util::future::join_all(charges.iter().map(|c| reserve(store, c))).await;
    let admitted = answers.iter().filter(|r| r.is_ok()).count();
    assert_eq!(admitted, 14, "100 / 7");
    let s = read(store, &b[0], None, t).await;
    assert_eq!((s.spent, s.reserved), (Usd::ZERO, n(98)));
}

/// A counter never used reads as zero, with its budget's limit.
pub async fn an_unused_counter_reads_as_zero(store: &impl BudgetStore) {
    let b = Budget::daily("never", n(123)).per_model();
    let s = read(store, &b, Some("gpt-4o"), at(T0)).await;
    assert_eq!(
        s,
        Spend {
            spent: Usd::ZERO,
            reserved: Usd::ZERO,
            limit: n(123)
        }
    );
}

/// Turns every behaviour of [`conformance`](crate::conformance) into a `#[tokio::test]` of the
/// invoking crate, named after it. `$fixture` is an expression evaluating to a future of
/// `(store, keep)`: a fresh store, and whatever must live as long as it (a Redis server).
#[macro_export]
macro_rules! budget_store_conformance {
    ($fixture:expr) => {
        $crate::budget_store_conformance!(@tests $fixture;
            all_lines_or_none,
            settle_replaces_the_reservation_by_the_cost,
            a_calendar_window_resets_spend_but_keeps_reservations,
            a_rolling_window_forgets_spend_after_its_duration,
            the_soft_limit_fires_once_per_window_and_rearms,
            concurrent_reservations_never_overcommit,
            an_unused_counter_reads_as_zero
        );
    };
    (@tests $fixture:expr; $($name:ident),*) => {
        $(
            #[tokio::test]
            async fn $name() {
                let (store, _keep) = $fixture.await;
                $crate::conformance::$name(&store).await;
            }
        )*
    };
}
