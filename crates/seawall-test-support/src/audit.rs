//! A budget store that audits every admission, for the stress tests of the budget's promise:
//! at every admission settled spend plus reservations stays within each limit.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use seawall_budget::{
    Admission, Budget, BudgetStore, Charge, MemoryStore, Settled, Spend, Timestamp, Usd,
};

/// A [`MemoryStore`] that checks every line of every admission, under its own lock so the
/// check sees exactly the state the admission left.
#[derive(Debug, Default)]
pub struct AuditStore {
    /// The store that decides.
    pub inner: MemoryStore,
    /// Held through an admission and its check, and through a settlement.
    pub lock: Mutex<()>,
    /// The admissions granted.
    pub admissions: AtomicUsize,
    /// The lines found committed past their limit right after an admission.
    pub violations: AtomicUsize,
    /// The most the budget named `total` had committed after an admission, in nano-dollars.
    pub most_committed: AtomicU64,
}

impl BudgetStore for AuditStore {
    fn reserve(&self, charge: &Charge<'_>) -> Admission {
        let _g = self.lock.lock().unwrap();
        let result = self.inner.reserve(charge);
        if let Admission::Ready(Ok(())) = &result {
            self.admissions.fetch_add(1, Ordering::Relaxed);
            for (budget, key) in charge.lines() {
                let s = self.inner.spend(budget, key.map(|k| &**k), charge.now());
                if s.committed() > s.limit {
                    self.violations.fetch_add(1, Ordering::Relaxed);
                }
                if budget.name() == "total" {
                    self.most_committed
                        .fetch_max(s.committed().as_nanos(), Ordering::Relaxed);
                }
            }
        }
        result
    }

    fn settle(&self, charge: &Charge<'_>, cost: Usd) -> Settled {
        let _g = self.lock.lock().unwrap();
        self.inner.settle(charge, cost)
    }

    fn spend(&self, budget: &Budget, key: Option<&str>, now: Timestamp) -> Spend {
        self.inner.spend(budget, key, now)
    }
}
