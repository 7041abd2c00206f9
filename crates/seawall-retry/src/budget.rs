//! A retry budget shared by every clone of a layer and every call through it.
//!
//! Per-call attempt caps do not stop a storm: when every call fails, every call retries, and
//! the upstream sees its load multiplied just when it can least take it. A retry budget caps
//! retries as a *fraction of the calls* going through the layer, plus a small floor so a quiet
//! service can still retry at all.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use seawall_core::ConfigError;

use crate::sync::{AtomicU64, Ordering};

/// Credit units per retry.
const UNIT: u64 = 1_000_000;

/// A shared, lock-free retry budget.
///
/// # Arithmetic
///
/// Credit is kept in integer units of a millionth of a retry, so the ratio is exact to six
/// decimal places and no float rounding ever grants an extra retry:
///
/// - every logical call deposits `ratio` of a retry (one atomic add; nothing once the saved
///   credit is at its cap, which makes a calm service's deposit a single read);
/// - a retry first spends one whole retry of deposited credit; when there is none, it takes
///   one from the floor, a bucket of `min_retries` that refills at `min_retries` per `per`.
///
/// So from a fresh budget, over any span of time `T`:
/// `retries <= ratio * calls + min_retries * (1 + T / per)`, and with no time passing,
/// exactly `retries <= floor(ratio * calls) + min_retries`. Unspent deposits are saved up to
/// `max_saved` retries: credit from a long calm period cannot fund an unbounded burst later.
///
/// The default allows retries of 20% of calls (the figure Finagle and Envoy use) plus a floor
/// of 10 retries per 10 seconds, and saves at most 100 retries of unspent credit.
///
/// ```
/// use std::time::Duration;
/// use seawall_retry::RetryBudget;
///
/// let budget = RetryBudget::new(0.25, 0, Duration::from_secs(10))?;
/// for _ in 0..8 {
///     budget.deposit();
/// }
/// assert!(budget.withdraw() && budget.withdraw());
/// assert!(!budget.withdraw()); // 25% of 8 calls is 2 retries
/// assert_eq!((budget.withdrawn(), budget.exhausted()), (2, 1));
/// # Ok::<(), seawall_retry::ConfigError>(())
/// ```
pub struct RetryBudget {
    deposit_units: u64,
    max_saved_units: u64,
    min_retries: u32,
    per: Duration,
    /// Nanoseconds between two floor retries.
    interval: u64,
    /// `min_retries * interval`: how far ahead of now the floor may be booked.
    burst: u64,
    base: Instant,
    balance: AtomicU64,
    /// The floor's theoretical arrival time, in nanoseconds since `base` (GCRA).
    floor_tat: AtomicU64,
    withdrawn: AtomicU64,
    exhausted: AtomicU64,
}

impl RetryBudget {
    /// A budget of `ratio` retries per call, plus at least `min_retries` retries per `per`.
    ///
    /// `ratio` must be a finite number in `[0, 100]` (0.2 allows one retry per five calls);
    /// `per` must not be zero when `min_retries` is not.
    pub fn new(ratio: f64, min_retries: u32, per: Duration) -> Result<Self, ConfigError> {
        if !ratio.is_finite() || !(0.0..=100.0).contains(&ratio) {
            return Err(ConfigError::new(
                "ratio",
                format!("the retry budget ratio must be a number in [0, 100], got {ratio}"),
            ));
        }
        if min_retries > 0 && per.is_zero() {
            return Err(ConfigError::new(
                "per",
                "the retry budget floor period must not be zero",
            ));
        }
        let per_nanos = u64::try_from(per.as_nanos()).unwrap_or(u64::MAX);
        let interval = if min_retries == 0 {
            0
        } else {
            (per_nanos / u64::from(min_retries)).max(1)
        };
        Ok(RetryBudget {
            deposit_units: (ratio * UNIT as f64).round() as u64,
            max_saved_units: 100 * UNIT,
            min_retries,
            per,
            interval,
            burst: interval.saturating_mul(u64::from(min_retries)),
            base: Instant::now(),
            balance: AtomicU64::new(0),
            floor_tat: AtomicU64::new(0),
            withdrawn: AtomicU64::new(0),
            exhausted: AtomicU64::new(0),
        })
    }

    /// Saves at most `retries` retries of unspent credit (default 100).
    pub fn max_saved(mut self, retries: u32) -> Self {
        self.max_saved_units = u64::from(retries) * UNIT;
        self
    }

    /// Records one logical call: adds `ratio` of a retry to the credit.
    #[inline]
    pub fn deposit(&self) {
        // A read first: at the cap (a calm service) the cache line stays shared.
        if self.deposit_units != 0 && self.balance.load(Ordering::Relaxed) < self.max_saved_units {
            // Concurrent depositors may overshoot the cap by a few deposits; that only delays
            // the clamp, never grants credit that was not deposited.
            self.balance
                .fetch_add(self.deposit_units, Ordering::Relaxed);
        }
    }

    /// Takes one retry from the budget; `false` (and the exhausted counter goes up) when
    /// there is none.
    pub fn withdraw(&self) -> bool {
        let ok = self.withdraw_credit() || self.withdraw_floor();
        if ok {
            self.withdrawn.fetch_add(1, Ordering::Relaxed);
        } else {
            self.exhausted.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    // Orderings: the balance and the floor's booking time are plain counters that publish no
    // other data, so what keeps grants within deposits is atomicity, not ordering: each CAS
    // succeeds only on the value it computed from, and the failed ones retry on the fresh
    // value. A Relaxed first read is enough for that. The loom models check it.
    fn withdraw_credit(&self) -> bool {
        let mut cur = self.balance.load(Ordering::Relaxed);
        loop {
            if cur < UNIT {
                return false;
            }
            let next = cur.min(self.max_saved_units.max(UNIT)) - UNIT;
            match self
                .balance
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    fn withdraw_floor(&self) -> bool {
        if self.min_retries == 0 {
            return false;
        }
        let now = u64::try_from(
            Instant::now()
                .saturating_duration_since(self.base)
                .as_nanos(),
        )
        .unwrap_or(u64::MAX);
        let mut tat = self.floor_tat.load(Ordering::Relaxed);
        loop {
            // GCRA: the grant is allowed when booking one more interval keeps the bookings
            // within one burst of now.
            let next = tat.max(now).saturating_add(self.interval);
            if next - now > self.burst {
                return false;
            }
            match self.floor_tat.compare_exchange_weak(
                tat,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => tat = actual,
            }
        }
    }

    /// Retries per call, as configured (rounded to a millionth).
    pub fn ratio(&self) -> f64 {
        self.deposit_units as f64 / UNIT as f64
    }

    /// The floor: retries allowed per [`per`](Self::per) whatever the traffic.
    pub fn min_retries(&self) -> u32 {
        self.min_retries
    }

    /// The floor's period.
    pub fn per(&self) -> Duration {
        self.per
    }

    /// The credit saved from deposits, in retries (fractional).
    pub fn saved(&self) -> f64 {
        self.balance.load(Ordering::Relaxed) as f64 / UNIT as f64
    }

    /// Retries granted so far.
    pub fn withdrawn(&self) -> u64 {
        self.withdrawn.load(Ordering::Relaxed)
    }

    /// Retries refused so far because the budget was spent.
    pub fn exhausted(&self) -> u64 {
        self.exhausted.load(Ordering::Relaxed)
    }
}

impl Default for RetryBudget {
    fn default() -> Self {
        RetryBudget::new(0.2, 10, Duration::from_secs(10)).expect("the defaults are valid")
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("ratio", &self.ratio())
            .field("min_retries", &self.min_retries)
            .field("per", &self.per)
            .field("max_saved", &(self.max_saved_units / UNIT))
            .field("saved", &self.saved())
            .field("withdrawn", &self.withdrawn())
            .field("exhausted", &self.exhausted())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn ratio_arithmetic_is_exact() {
        // 0.29 * 100 is 28.999999999999996 in f64; the budget must still grant 29.
        for (ratio, calls, expected) in [(0.29, 100, 29), (0.1, 30, 3), (0.2, 7, 1), (1.0, 3, 3)] {
            let b = RetryBudget::new(ratio, 0, Duration::from_secs(1))
                .unwrap()
                .max_saved(1000);
            for _ in 0..calls {
                b.deposit();
            }
            let mut granted = 0;
            while b.withdraw() {
                granted += 1;
            }
            assert_eq!(granted, expected, "ratio {ratio} over {calls} calls");
            assert_eq!(b.exhausted(), 1);
        }
    }

    #[test]
    fn zero_ratio_and_zero_floor_allow_nothing() {
        let b = RetryBudget::new(0.0, 0, Duration::ZERO).unwrap();
        for _ in 0..1000 {
            b.deposit();
        }
        assert!(!b.withdraw());
        assert_eq!(b.saved(), 0.0);
    }

    #[test]
    fn saved_credit_is_capped() {
        let b = RetryBudget::new(0.5, 0, Duration::from_secs(1))
            .unwrap()
            .max_saved(3);
        for _ in 0..1000 {
            b.deposit();
        }
        assert_eq!(b.saved(), 3.0);
        assert!(b.withdraw() && b.withdraw() && b.withdraw());
        assert!(!b.withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn floor_refills_over_time() {
        let b = RetryBudget::new(0.0, 4, Duration::from_secs(8)).unwrap();
        for _ in 0..4 {
            assert!(b.withdraw());
        }
        assert!(!b.withdraw());
        // One floor retry per 2 s.
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert!(!b.withdraw());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(b.withdraw());
        assert!(!b.withdraw());
        // A long calm period refills the floor to its burst, not beyond.
        tokio::time::advance(Duration::from_secs(3600)).await;
        let mut n = 0;
        while b.withdraw() {
            n += 1;
        }
        assert_eq!(n, 4);
    }

    #[test]
    fn bad_parameters_are_errors() {
        for r in [f64::NAN, -0.1, 101.0, f64::INFINITY] {
            assert!(
                RetryBudget::new(r, 1, Duration::from_secs(1)).is_err(),
                "{r}"
            );
        }
        assert!(RetryBudget::new(0.2, 1, Duration::ZERO).is_err());
        let d = format!("{:?}", RetryBudget::default());
        assert!(
            d.contains("ratio: 0.2") && d.contains("min_retries: 10"),
            "{d}"
        );
    }

    /// Many threads deposit and withdraw at once: the grants never exceed the exact bound,
    /// and, since every thread keeps asking, they reach it.
    #[test]
    fn concurrent_grants_never_exceed_ratio_plus_floor() {
        const THREADS: usize = 8;
        const CALLS: usize = 5_000;
        // A floor period of a year: no refill during the test, whatever the wall clock does.
        let b = Arc::new(
            RetryBudget::new(0.2, 7, Duration::from_secs(365 * 86_400))
                .unwrap()
                .max_saved(u32::MAX),
        );
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    let mut granted = 0u64;
                    for _ in 0..CALLS {
                        b.deposit();
                        // Every call fails and asks for up to three retries.
                        for _ in 0..3 {
                            if b.withdraw() {
                                granted += 1;
                            }
                        }
                    }
                    granted
                })
            })
            .collect();
        let granted: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        let calls = (THREADS * CALLS) as u64;
        let bound = calls / 5 + 7;
        assert!(granted <= bound, "{granted} > {bound}");
        // No credit was lost either: what is left is exactly what was not granted.
        let mut left = 0;
        while b.withdraw() {
            left += 1;
        }
        assert_eq!(granted + left, bound);
        assert_eq!(b.withdrawn(), bound);
        assert_eq!(b.exhausted(), calls * 3 - granted + 1);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    #[test]
    fn loom_grants_never_exceed_deposits() {
        loom::model(|| {
            let b = Arc::new(RetryBudget::new(0.5, 0, Duration::from_secs(1)).unwrap());
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let b = b.clone();
                    loom::thread::spawn(move || {
                        b.deposit();
                        u64::from(b.withdraw()) + u64::from(b.withdraw())
                    })
                })
                .collect();
            let granted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
            // Two calls at 0.5 each: exactly one retry of credit, however they interleave.
            assert!(granted <= 1);
            assert_eq!(b.withdrawn() + b.exhausted(), 4);
        });
    }

    #[test]
    fn loom_floor_grants_exactly_its_burst() {
        loom::model(|| {
            let year = Duration::from_secs(365 * 86_400);
            let b = Arc::new(RetryBudget::new(0.0, 1, year).unwrap());
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let b = b.clone();
                    loom::thread::spawn(move || u64::from(b.withdraw()))
                })
                .collect();
            let granted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
            assert_eq!(granted, 1);
        });
    }
}
