//! The retry decision: from one classified error to "retry after this delay" or "give up,
//! because ...". Pure apart from the random draw and the retry budget.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use http::HeaderName;
use seawall_core::{Dispositions, FailureClass, GiveUp, LlmError, Random, SeededRandom};

use crate::backoff::{Backoff, clamp_secs, unit};
use crate::budget::RetryBudget;

/// Number of failure classes (the size of per-class tables, indexed by
/// [`FailureClass::index`]).
pub(crate) const CLASSES: usize = FailureClass::COUNT;

/// Default per-class retry maximums (retries, not attempts).
pub(crate) fn default_max_retries() -> [u32; CLASSES] {
    let mut table = [0; CLASSES];
    for (i, class) in FailureClass::ALL.into_iter().enumerate() {
        table[i] = match class {
            FailureClass::RateLimited => 2,
            FailureClass::Overloaded => 3,
            FailureClass::ServerError => 2,
            FailureClass::UpstreamTimeout | FailureClass::Disconnected => 1,
            FailureClass::Connect => 3,
            // Never retried after the commit point; local classes are never retried here.
            FailureClass::StreamInterrupted => 0,
            c if c.is_local() => 0,
            // Everything else: the cap that applies when the class allows a retry, or when the
            // server says `x-should-retry: true` about a class that would not be retried.
            _ => 2,
        };
    }
    table
}

/// Why a retry waits as long as it does (the `reason` of the retry event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DelaySource {
    /// The exponential backoff.
    Backoff,
    /// The server's Retry-After or rate-limit reset.
    ServerHint,
    /// The minimum wait after an overload.
    OverloadMinimum,
}

impl DelaySource {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            DelaySource::Backoff => "backoff",
            DelaySource::ServerHint => "server_hint",
            DelaySource::OverloadMinimum => "overload_minimum",
        }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Retry {
        delay: Duration,
        source: DelaySource,
    },
    GiveUp(GiveUp),
}

/// The immutable part of the configuration.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    pub(crate) dispositions: Dispositions,
    pub(crate) max_retries: [u32; CLASSES],
    pub(crate) backoff: Backoff,
    pub(crate) max_hint: Duration,
    pub(crate) hint_jitter: f64,
    pub(crate) overload_min: Duration,
    /// The longest wait before a retry of a request a fallback stands by for.
    pub(crate) standby_wait: Duration,
    pub(crate) time_budget: Option<Duration>,
    pub(crate) idempotency_header: Option<HeaderName>,
    pub(crate) attempt_header: Option<HeaderName>,
    /// Whether either header is set (one branch on the hot path).
    pub(crate) writes_headers: bool,
}

/// Everything the services of one layer share.
pub(crate) struct Shared {
    pub(crate) policy: Policy,
    pub(crate) enabled: AtomicBool,
    pub(crate) max_attempts: AtomicU32,
    pub(crate) budget: Option<Arc<RetryBudget>>,
    pub(crate) random: Arc<dyn Random>,
    /// Idempotency keys come from their own entropy-seeded source: a fixed jitter seed must
    /// never make two processes send the same key.
    pub(crate) keys: SeededRandom,
    pub(crate) retries: AtomicU64,
    pub(crate) budget_refusals: AtomicU64,
}

/// The facts about one failed attempt that the decision reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Failure {
    /// Attempts made so far, the failed one included (1 after the first call).
    pub(crate) attempts: u32,
    /// Retries already made after failures of this attempt's class.
    pub(crate) class_retries: u32,
    /// The delay before the previous retry (zero before the first).
    pub(crate) previous_delay: Duration,
    /// Time left in the total time budget, if there is one.
    pub(crate) remaining: Option<Duration>,
    /// A fallback stands by for the request ([`seawall_core::Standby`]).
    pub(crate) standby: bool,
}

impl Shared {
    /// Decides about `err`. Spends from the retry budget only when everything else says yes.
    pub(crate) fn decide(&self, err: &LlmError, idempotent: bool, f: Failure) -> Decision {
        let class = err.class();
        // Local rejections and failures past the commit point are never retried here,
        // whatever a disposition override or a header says.
        if class.is_local() || class == FailureClass::StreamInterrupted {
            return Decision::GiveUp(GiveUp::NotRetryable);
        }
        let allowed = match err.should_retry() {
            Some(directive) => directive,
            None => self.policy.dispositions.get(class).allows_retry(idempotent),
        };
        if !allowed {
            return Decision::GiveUp(GiveUp::NotRetryable);
        }
        // The switch, the cap and the counters are Relaxed: each is a value of its own that
        // publishes nothing else, and a call that reads a handle's change one failure late is
        // within what the handle promises ("at their next failure").
        if !self.enabled.load(Ordering::Relaxed) {
            return Decision::GiveUp(GiveUp::Disabled);
        }
        let class_cap = self.policy.max_retries[class.index()];
        if f.attempts >= self.max_attempts.load(Ordering::Relaxed) || f.class_retries >= class_cap {
            return Decision::GiveUp(GiveUp::AttemptsExhausted);
        }
        let (delay, source) = match err.retry_hint().filter(|h| !h.is_zero()) {
            Some(hint) if hint > self.policy.max_hint => {
                return Decision::GiveUp(GiveUp::HintTooLong);
            }
            Some(hint) => (self.hint_delay(hint), DelaySource::ServerHint),
            None => self.computed_delay(class, f),
        };
        // The fallback answers sooner than this wait would end (and no retry is spent).
        if f.standby && delay > self.policy.standby_wait {
            return Decision::GiveUp(GiveUp::Standby);
        }
        if f.remaining.is_some_and(|left| delay >= left) {
            return Decision::GiveUp(GiveUp::DeadlineTooClose);
        }
        if let Some(budget) = &self.budget {
            if !budget.withdraw() {
                self.budget_refusals.fetch_add(1, Ordering::Relaxed);
                return Decision::GiveUp(GiveUp::RetryBudget);
            }
        }
        self.retries.fetch_add(1, Ordering::Relaxed);
        Decision::Retry { delay, source }
    }

    /// The server's hint plus up to `hint_jitter` of it, never less than the hint and never
    /// above the hint cap (unless the hint itself is the cap).
    pub(crate) fn hint_delay(&self, hint: Duration) -> Duration {
        let extra = hint.as_secs_f64() * self.policy.hint_jitter * unit(&*self.random);
        let ceiling = self.policy.max_hint.max(hint);
        clamp_secs(hint.as_secs_f64() + extra, ceiling).max(hint)
    }

    fn computed_delay(&self, class: FailureClass, f: Failure) -> (Duration, DelaySource) {
        let retry = f.attempts.saturating_sub(1);
        let delay = self
            .policy
            .backoff
            .delay(retry, f.previous_delay, &*self.random);
        if class == FailureClass::Overloaded && delay < self.policy.overload_min {
            let min = self.policy.overload_min;
            let extra = min.as_secs_f64() * self.policy.hint_jitter * unit(&*self.random);
            let ceiling = min.saturating_mul(2);
            let wait = clamp_secs(min.as_secs_f64() + extra, ceiling).max(min);
            return (wait, DelaySource::OverloadMinimum);
        }
        (delay, DelaySource::Backoff)
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("policy", &self.policy)
            .field("enabled", &self.enabled.load(Ordering::Relaxed))
            .field("max_attempts", &self.max_attempts.load(Ordering::Relaxed))
            .field("retry_budget", &self.budget)
            .field("retries", &self.retries.load(Ordering::Relaxed))
            .field(
                "budget_refusals",
                &self.budget_refusals.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::BackoffRetryLayer;
    use proptest::prelude::*;

    fn failure(remaining: Option<Duration>) -> Failure {
        Failure {
            attempts: 1,
            class_retries: 0,
            previous_delay: Duration::ZERO,
            remaining,
            standby: false,
        }
    }

    proptest! {
        #[test]
        fn hint_delays_are_never_early_and_within_jitter_and_cap(
            hint_ms in 1u64..120_000,
            cap_ms in 0u64..120_000,
            jitter in 0.0f64..=1.0,
            seed in any::<u64>(),
        ) {
            let (hint, cap) = (Duration::from_millis(hint_ms), Duration::from_millis(cap_ms));
            let shared = BackoffRetryLayer::builder()
                .seed(seed)
                .hint_jitter(jitter)
                .max_server_hint(cap)
                .no_retry_budget()
                .build()
                .unwrap()
                .shared();
            let err = LlmError::new(FailureClass::RateLimited, "").with_retry_after(hint);
            match shared.decide(&err, false, failure(None)) {
                Decision::Retry { delay, source } => {
                    prop_assert!(hint <= cap);
                    prop_assert_eq!(source, DelaySource::ServerHint);
                    prop_assert!(delay >= hint, "{delay:?} < {hint:?}");
                    prop_assert!(delay <= cap.max(hint));
                    prop_assert!(delay.as_secs_f64() <= hint.as_secs_f64() * (1.0 + jitter) + 1e-9);
                }
                Decision::GiveUp(reason) => {
                    prop_assert!(hint > cap);
                    prop_assert_eq!(reason, GiveUp::HintTooLong);
                }
            }
        }

        #[test]
        fn overload_waits_are_at_least_the_minimum(min_ms in 0u64..30_000, seed in any::<u64>()) {
            let min = Duration::from_millis(min_ms);
            let shared = BackoffRetryLayer::builder()
                .seed(seed)
                .overload_min_delay(min)
                .no_retry_budget()
                .build()
                .unwrap()
                .shared();
            let err = LlmError::new(FailureClass::Overloaded, "");
            let Decision::Retry { delay, .. } = shared.decide(&err, false, failure(None)) else {
                panic!("an overload is retried");
            };
            prop_assert!(delay >= min);
            prop_assert!(delay.as_secs_f64() <= (min.as_secs_f64() * 1.1).max(0.5) + 1e-9);
        }

        #[test]
        fn a_granted_delay_always_fits_the_remaining_budget(
            remaining_ms in 0u64..20_000,
            hint_ms in proptest::option::of(0u64..20_000),
            seed in any::<u64>(),
        ) {
            let shared = BackoffRetryLayer::builder().seed(seed).build().unwrap().shared();
            let mut err = LlmError::new(FailureClass::Overloaded, "");
            if let Some(h) = hint_ms {
                err = err.with_retry_after(Duration::from_millis(h));
            }
            let remaining = Duration::from_millis(remaining_ms);
            match shared.decide(&err, false, failure(Some(remaining))) {
                Decision::Retry { delay, .. } => prop_assert!(delay < remaining),
                Decision::GiveUp(reason) => prop_assert_eq!(reason, GiveUp::DeadlineTooClose),
            }
        }
    }

    #[test]
    fn the_budget_is_spent_only_on_retries_that_happen() {
        let layer = BackoffRetryLayer::builder()
            .retry_budget(RetryBudget::new(0.0, 1, Duration::from_secs(3600)).unwrap())
            .build()
            .unwrap();
        let shared = layer.shared();
        // Refused for other reasons first: no budget spent.
        let final_err = LlmError::new(FailureClass::InvalidRequest, "");
        let long_hint =
            LlmError::new(FailureClass::RateLimited, "").with_retry_after(Duration::from_secs(600));
        assert_eq!(
            shared.decide(&final_err, false, failure(None)),
            Decision::GiveUp(GiveUp::NotRetryable)
        );
        assert_eq!(
            shared.decide(&long_hint, false, failure(None)),
            Decision::GiveUp(GiveUp::HintTooLong)
        );
        let e = LlmError::new(FailureClass::ServerError, "");
        assert_eq!(
            shared.decide(&e, false, failure(Some(Duration::ZERO))),
            Decision::GiveUp(GiveUp::DeadlineTooClose)
        );
        assert!(matches!(
            shared.decide(&e, false, failure(None)),
            Decision::Retry { .. }
        ));
        assert_eq!(
            shared.decide(&e, false, failure(None)),
            Decision::GiveUp(GiveUp::RetryBudget)
        );
        assert_eq!(layer.handle().budget_exhausted(), 1);
    }

    #[test]
    fn a_zero_hint_falls_back_to_the_backoff() {
        let shared = BackoffRetryLayer::builder()
            .seed(3)
            .build()
            .unwrap()
            .shared();
        let e = LlmError::new(FailureClass::RateLimited, "").with_retry_after(Duration::ZERO);
        let Decision::Retry { source, delay } = shared.decide(&e, false, failure(None)) else {
            panic!("retried");
        };
        assert_eq!(source, DelaySource::Backoff);
        assert!(delay <= Duration::from_millis(500));
    }
}
