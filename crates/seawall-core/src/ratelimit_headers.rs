//! The names of the providers' rate-limit headers, in one place: the classifier reads them into
//! a [`RateLimitSnapshot`](crate::RateLimitSnapshot) and the chaos upstream writes them, so
//! both always agree on the wire.

/// OpenAI's rate-limit headers, `[limit, remaining, reset]` per window: requests, then tokens.
/// Resets are Go-style durations (`6m0s`, `20ms`).
pub const OPENAI_RATE_LIMIT_HEADERS: [[&str; 3]; 2] = [
    [
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    ],
    [
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    ],
];

/// Anthropic's rate-limit headers, `[limit, remaining, reset]` per window: requests, tokens,
/// input tokens, then output tokens. Resets are RFC 3339 instants.
pub const ANTHROPIC_RATE_LIMIT_HEADERS: [[&str; 3]; 4] = [
    [
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
    ],
    [
        "anthropic-ratelimit-tokens-limit",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
    ],
    [
        "anthropic-ratelimit-input-tokens-limit",
        "anthropic-ratelimit-input-tokens-remaining",
        "anthropic-ratelimit-input-tokens-reset",
    ],
    [
        "anthropic-ratelimit-output-tokens-limit",
        "anthropic-ratelimit-output-tokens-remaining",
        "anthropic-ratelimit-output-tokens-reset",
    ],
];
