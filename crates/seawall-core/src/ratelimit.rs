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

    /// If some window is used up, how long until the last such window resets: the earliest
    /// moment a new request can be admitted. `None` when nothing is exhausted (or no reset was
    /// given for the exhausted windows).
    pub fn exhausted_until(&self) -> Option<Duration> {
        self.windows()
            .iter()
            .filter(|w| w.is_exhausted())
            .filter_map(|w| w.reset_after)
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
        assert_eq!(s.exhausted_until(), Some(Duration::from_secs(7)));
    }
}
