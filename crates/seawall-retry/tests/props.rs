//! Property tests: computed delays stay inside their mode's bounds and the cap, and no call
//! ever sleeps past (or runs past) its time budget.

mod common;

use std::time::Duration;

use common::{Ask, Mock, err};
use proptest::prelude::*;
use seawall_core::{FailureClass, LlmError, SeededRandom};
use seawall_retry::{Backoff, BackoffRetryLayer, Jitter};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const MODES: [Jitter; 4] = [
    Jitter::None,
    Jitter::Full,
    Jitter::Equal,
    Jitter::Decorrelated,
];
/// Float rounding allowance when comparing with bounds computed another way.
const EPS: Duration = Duration::from_micros(1);

proptest! {
    #[test]
    fn every_delay_is_within_its_modes_bounds_and_the_cap(
        base_ms in 0u64..5_000,
        multiplier in 1.0f64..4.0,
        extra_ms in 0u64..120_000,
        retry in 0u32..100,
        previous_ms in 0u64..300_000,
        seed in any::<u64>(),
        mode in 0usize..4,
    ) {
        let (base, max, previous) = (ms(base_ms), ms(base_ms + extra_ms), ms(previous_ms));
        let jitter = MODES[mode];
        let b = Backoff::new(base, multiplier, max, jitter).unwrap();
        let rng = SeededRandom::new(seed);
        let ceiling = b.ceiling(retry);
        let expected = (base.as_secs_f64() * multiplier.powi(retry as i32)).min(max.as_secs_f64());
        prop_assert!((ceiling.as_secs_f64() - expected).abs() < 1e-6, "{ceiling:?} vs {expected}");
        prop_assert!(ceiling <= max);
        for _ in 0..8 {
            let d = b.delay(retry, previous, &rng);
            prop_assert!(d <= max, "{d:?} above the cap {max:?}");
            match jitter {
                Jitter::None => prop_assert_eq!(d, ceiling),
                Jitter::Full => prop_assert!(d <= ceiling),
                Jitter::Equal => prop_assert!(d + EPS >= ceiling / 2 && d <= ceiling),
                _ => {
                    let lo = base.min(max);
                    let hi = previous.max(base).mul_f64(multiplier).min(max).max(lo);
                    prop_assert!(d >= lo && d <= hi + EPS, "{d:?} not in [{lo:?}, {hi:?}]");
                }
            }
        }
    }
}

/// One scripted failure: a class and an optional server hint.
fn failure(kind: u8, hint_ms: Option<u64>) -> LlmError {
    let e = match kind % 5 {
        0 => err(FailureClass::RateLimited, 429),
        1 => err(FailureClass::Overloaded, 529),
        2 => err(FailureClass::ServerError, 500),
        3 => err(FailureClass::Connect, 502),
        _ => err(FailureClass::Timeout, 504),
    };
    match hint_ms {
        Some(h) => e.with_retry_after(ms(h)),
        None => e,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn total_time_never_exceeds_the_budget(
        budget_ms in 1u64..60_000,
        latency_ms in 0u64..15_000,
        script in proptest::collection::vec((any::<u8>(), proptest::option::of(0u64..90_000)), 1..10),
        ok_at in proptest::option::of(0usize..10),
        max_attempts in 1u32..10,
        seed in any::<u64>(),
        mode in 0usize..4,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let (history_total, elapsed, calls) = rt.block_on(async {
            let script = script.clone();
            let mock = Mock::new(move |n| {
                if Some(n) == ok_at {
                    return Ok("ok");
                }
                let (kind, hint) = script[n % script.len()];
                Err(failure(kind, hint))
            })
            .latency(ms(latency_ms));
            let mut svc = BackoffRetryLayer::builder()
                .seed(seed)
                .jitter(MODES[mode])
                .max_attempts(max_attempts)
                .time_budget(ms(budget_ms))
                .no_retry_budget()
                .build()
                .unwrap()
                .layer(mock.clone());
            let start = Instant::now();
            let result = ServiceExt::<Ask>::ready(&mut svc)
                .await
                .unwrap()
                .call(Ask::default())
                .await;
            let elapsed = start.elapsed();
            let slept: Duration = match &result {
                Ok(_) => mock.gaps().iter().sum(),
                Err(e) => e.attempts().iter().map(|a| a.delay).sum(),
            };
            (slept, elapsed, mock.calls())
        });
        let budget = ms(budget_ms);
        prop_assert!(history_total < budget, "slept {history_total:?} of {budget:?}");
        // The timer wheel rounds a wake-up up to the next millisecond.
        prop_assert!(elapsed <= budget + ms(1), "took {elapsed:?} of {budget:?}");
        prop_assert!(calls as u32 <= max_attempts);
    }
}
