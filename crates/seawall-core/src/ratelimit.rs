//! The upstream's rate-limit state, read from its response headers.
//!
//! OpenAI sends `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` with Go-style
//! durations; Anthropic sends `anthropic-ratelimit-*-{limit,remaining,reset}` with RFC 3339
//! instants. Both become one [`RateLimitSnapshot`] with resets as durations from the moment the
//! response was received, so a gate can pause admissions when `remaining` reaches zero *before*
//! the next request earns a 429.

use std::time::Duration;

/// One limit (requests or tokens) as the upstream reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimitWindow {
    /// The limit for the window.
    pub limit: Option<u64>,
    /// What is left in the window.
    pub remaining: Option<u64>,
    /// Time from receipt of the response until the window resets.
    pub reset_after: Option<Duration>,
}

impl RateLimitWindow {
    /// Whether the window reported nothing.
    pub fn is_empty(&self) -> bool {
        self.limit.is_none() && self.remaining.is_none() && self.reset_after.is_none()
    }

    /// Whether the upstream reported this window as used up.
    pub fn is_exhausted(&self) -> bool {
        self.remaining == Some(0)
    }

    /// How long until `units` are available again, or `None` if the window does not say.
    ///
    /// Both OpenAI and Anthropic give `reset` as the time until the window is *fully*
    /// replenished, and both replenish continuously; so the `limit - remaining` missing units
    /// come back evenly over `reset_after`, and a request that needs one unit may go long
    /// before the full reset (a 60 RPM window at zero frees its next request after about 1 s,
    /// not 60 s). Without a known limit the full reset is the only safe answer.
    pub fn wait_for(&self, units: u64) -> Option<Duration> {
        let remaining = self.remaining?;
        if remaining >= units {
            return Some(Duration::ZERO);
        }
        let reset = self.reset_after?;
        match self.limit {
            Some(limit) if limit > remaining => {
                let missing = limit - remaining;
                let deficit = (units - remaining).min(missing);
                // Exact, rounded up: never admit a request before its unit is back.
                let nanos = (reset.as_nanos() * u128::from(deficit)).div_ceil(u128::from(missing));
                Some(Duration::from_nanos(
                    u64::try_from(nanos).unwrap_or(u64::MAX),
                ))
            }
            _ => Some(reset),
        }
    }
}

/// The rate-limit state of one upstream response, attached to errors and, as an extension, to
/// successful responses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimitSnapshot {
    /// Requests per window.
    pub requests: RateLimitWindow,
    /// Tokens per window (OpenAI's combined figure, Anthropic's `tokens`).
    pub tokens: RateLimitWindow,
    /// Anthropic's input-token window.
    pub input_tokens: RateLimitWindow,
    /// Anthropic's output-token window.
    pub output_tokens: RateLimitWindow,
}

impl RateLimitSnapshot {
    /// Every window, for iteration.
    pub fn windows(&self) -> [&RateLimitWindow; 4] {
        [
            &self.requests,
            &self.tokens,
            &self.input_tokens,
            &self.output_tokens,
        ]
    }

    /// Whether no header was present.
    pub fn is_empty(&self) -> bool {
        self.windows().iter().all(|w| w.is_empty())
    }

    /// If some window is used up, how long until every such window has room for one more
    /// unit again (see [`RateLimitWindow::wait_for`]): the earliest moment a new request can be
    /// admitted. `None` when nothing is exhausted (or no reset was given for the exhausted
    /// windows).
    pub fn exhausted_until(&self) -> Option<Duration> {
        self.windows()
            .iter()
            .filter(|w| w.is_exhausted())
            .filter_map(|w| w.wait_for(1))
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhausted_until_takes_the_longest_exhausted_reset() {
        let mut s = RateLimitSnapshot::default();
        assert!(s.is_empty());
        assert_eq!(s.exhausted_until(), None);
        s.requests = RateLimitWindow {
            limit: Some(60),
            remaining: Some(0),
            reset_after: Some(Duration::from_secs(2)),
        };
        s.tokens = RateLimitWindow {
            limit: Some(1000),
            remaining: Some(5),
            reset_after: Some(Duration::from_secs(30)),
        };
        s.output_tokens.remaining = Some(0);
        s.output_tokens.reset_after = Some(Duration::from_secs(7));
        assert!(!s.is_empty());
        // The output window has no limit, so only its full reset is safe.
        assert_eq!(s.exhausted_until(), Some(Duration::from_secs(7)));
        // 60 requests refill over 2 s: the next one after 1/30 s.
        s.output_tokens = RateLimitWindow::default();
        assert_eq!(s.exhausted_until(), Some(Duration::from_nanos(33_333_334)));
    }

    #[test]
    fn wait_for_spreads_the_refill_over_the_reset() {
        let w = RateLimitWindow {
            limit: Some(60),
            remaining: Some(0),
            reset_after: Some(Duration::from_secs(60)),
        };
        assert_eq!(w.wait_for(1), Some(Duration::from_secs(1)));
        assert_eq!(w.wait_for(30), Some(Duration::from_secs(30)));
        assert_eq!(
            w.wait_for(1000),
            Some(Duration::from_secs(60)),
            "never past the reset"
        );
        let half = RateLimitWindow {
            remaining: Some(30),
            ..w
        };
        // 30 units missing come back over 60 s: 2 s each.
        assert_eq!(half.wait_for(31), Some(Duration::from_secs(2)));
        assert_eq!(half.wait_for(30), Some(Duration::ZERO));
        assert_eq!(RateLimitWindow::default().wait_for(1), None);
    }

    proptest::proptest! {
        #[test]
        fn wait_for_is_bounded_by_the_reset(limit in 0u64..10_000, remaining in 0u64..10_000,
                                            reset_ms in 0u64..10_000_000, units in 0u64..20_000) {
            let w = RateLimitWindow {
                limit: Some(limit),
                remaining: Some(remaining),
                reset_after: Some(Duration::from_millis(reset_ms)),
            };
            let d = w.wait_for(units).unwrap();
            proptest::prop_assert!(d <= Duration::from_millis(reset_ms));
            proptest::prop_assert_eq!(d.is_zero(), remaining >= units || reset_ms == 0);
        }
    }
}
