//! Building a profile in code: chainable setters over `Profile::default()`.

use std::time::Duration;

use super::{
    Count, Cut, Delay, Draws, ErrorRule, KeepAlive, KeepAliveStyle, KeyBy, KeyLimits, Malformed,
    MalformedKind, MidStreamError, Profile,
};

impl Profile {
    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets where each call's random choices come from ([`Draws`]).
    pub fn draws(mut self, draws: Draws) -> Self {
        self.draws = draws;
        self
    }

    /// Groups rate limits and quota by `key_by`.
    pub fn key_by(mut self, key_by: KeyBy) -> Self {
        self.limits.key_by = key_by;
        self
    }

    /// Limits every key to `rpm` requests per minute.
    pub fn rpm(mut self, rpm: u32) -> Self {
        self.limits.rpm = Some(rpm);
        self
    }

    /// Limits every key to `tpm` tokens per minute.
    pub fn tpm(mut self, tpm: u32) -> Self {
        self.limits.tpm = Some(tpm);
        self
    }

    /// Overrides the limits of one key.
    pub fn key_limits(mut self, key: &str, limits: KeyLimits) -> Self {
        self.limits.keys.insert(key.to_owned(), limits);
        self
    }

    /// Exhausts a key's quota after `tokens` billed tokens.
    pub fn quota_tokens(mut self, tokens: u64) -> Self {
        self.quota.tokens = Some(tokens);
        self
    }

    /// Marks a key as out of quota from the start.
    pub fn exhausted_key(mut self, key: &str) -> Self {
        self.quota.exhausted_keys.push(key.to_owned());
        self
    }

    /// Sets the default context window.
    pub fn context_window(mut self, tokens: u32) -> Self {
        self.context.window = Some(tokens);
        self
    }

    /// Sets one model's context window.
    pub fn model_context_window(mut self, model: &str, tokens: u32) -> Self {
        self.context.models.insert(model.to_owned(), tokens);
        self
    }

    /// Sets the time to the response head.
    pub fn head_latency(mut self, d: Delay) -> Self {
        self.latency.head = d;
        self
    }

    /// Sets the time to the first token.
    pub fn first_token_latency(mut self, d: Delay) -> Self {
        self.latency.first_token = d;
        self
    }

    /// Sets the time between tokens.
    pub fn per_token_latency(mut self, d: Delay) -> Self {
        self.latency.per_token = d;
        self
    }

    /// Sets the completion length.
    pub fn output_tokens(mut self, tokens: Count) -> Self {
        self.output.tokens = tokens;
        self
    }

    /// Sends the OpenAI usage chunk on every stream.
    pub fn always_include_usage(mut self, yes: bool) -> Self {
        self.output.always_include_usage = yes;
        self
    }

    /// Sends keep-alives of `style` every `interval` before the first token of this share of
    /// streams.
    pub fn keepalives(
        mut self,
        probability: f64,
        interval: Duration,
        style: KeepAliveStyle,
    ) -> Self {
        self.stream.keepalive = KeepAlive {
            probability,
            interval,
            style,
        };
        self
    }

    /// Cuts this share of streams after `after_tokens` tokens; `abort` ends them with a body
    /// error instead of a clean end.
    pub fn cut_streams(mut self, probability: f64, after_tokens: Count, abort: bool) -> Self {
        self.stream.cut = Cut {
            probability,
            after_tokens,
            abort,
        };
        self
    }

    /// Sends an error event after `after_tokens` tokens in this share of streams.
    pub fn mid_stream_errors(mut self, probability: f64, after_tokens: Count) -> Self {
        self.stream.error = MidStreamError {
            probability,
            after_tokens,
        };
        self
    }

    /// Answers this share of requests with a malformed body of one of `kinds`.
    pub fn malformed(mut self, probability: f64, kinds: &[MalformedKind]) -> Self {
        self.malformed = Malformed {
            probability,
            kinds: kinds.to_vec(),
        };
        self
    }

    /// Rejects `key` with 401.
    pub fn invalid_key(mut self, key: &str) -> Self {
        self.auth.invalid_keys.push(key.to_owned());
        self
    }

    /// Adds an error rule (bursts, outages).
    pub fn error(mut self, rule: ErrorRule) -> Self {
        self.errors.push(rule);
        self
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Count, Delay, ErrorRule, Profile};

    #[test]
    fn the_builder_and_toml_agree() {
        let built = Profile::default()
            .seed(5)
            .rpm(100)
            .first_token_latency(
                Delay::lognormal(Duration::from_millis(300), 0.5).plus(Duration::from_millis(50)),
            )
            .cut_streams(0.1, Count::range(2, 9), true)
            .error(
                ErrorRule::outage(503, Duration::from_secs(5), Duration::from_secs(8))
                    .statuses(&[503, 529])
                    .every(Duration::from_secs(60)),
            );
        let parsed = Profile::from_toml(
            r#"
            seed = 5
            [limits]
            rpm = 100
            [latency]
            first_token = { fixed = 0.05, lognormal = { median = "300ms", sigma = 0.5 } }
            [stream.cut]
            probability = 0.1
            after_tokens = [2, 9]
            abort = true
            [[errors]]
            status = [503, 529]
            start = 5
            end = "8s"
            period = "1m"
            "#,
        )
        .unwrap();
        assert_eq!(built, parsed);
    }
}
