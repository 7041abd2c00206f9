//! The fault profile: what the mock upstream does, as plain data.
//!
//! The types live here; reading a profile (TOML, the shipped ones), validating it, building it
//! in code and its TOML form each have a submodule.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod builder;
mod load;
mod repr;
mod validate;

use repr::{dur, one_or_many, opt_dur};

/// Everything the mock upstream does, in one value.
///
/// A [`Profile`] is read from TOML ([`Profile::from_toml`], [`Profile::load`]) or built in
/// code (`Profile::default()` plus the chainable setters). The default profile is a perfectly
/// healthy, instant upstream with no limits: every fault is opt-in.
///
/// Every section and field is optional. Durations are strings (`"250ms"`, `"1s"`, `"2m 30s"`)
/// or numbers of seconds (`0.25`). Token counts are a number (`40`) or an inclusive range
/// (`[20, 80]`, drawn uniformly). Probabilities are in `[0, 1]`.
///
/// ```toml
/// seed = 42                        # every random choice; same seed + same calls = same run
/// draws = "arrival"                # "arrival" | "request" (each call's draws from its request)
///
/// [limits]                         # per-key token buckets, refilled continuously
/// key_by = "api_key"               # "api_key" | "model" | "api_key+model"
/// rpm = 60                         # requests per minute (absent: unlimited)
/// tpm = 40000                      # tokens per minute: prompt + max_tokens (or planned output)
/// keys."gpt-4o" = { rpm = 10 }     # per-key overrides
///
/// [quota]
/// tokens = 1000000                 # billed tokens per key before `insufficient_quota`
/// exhausted_keys = ["sk-broke"]    # keys that are out of credit from the start
///
/// [context]
/// window = 8192                    # prompt tokens above this: context-length error
/// models = { "gpt-4o" = 128000 }   # per-model windows
///
/// [latency]                        # each: a duration, or { fixed, uniform, lognormal, max }
/// head = "20ms"                    # to the response head (errors, stream heads)
/// first_token = { fixed = "100ms", lognormal = { median = "300ms", sigma = 0.5 }, max = "10s" }
/// per_token = { uniform = ["5ms", "25ms"] }
///
/// [output]
/// tokens = [20, 80]                # completion length, capped by the request's max_tokens
/// always_include_usage = false     # OpenAI streams: usage chunk even without include_usage
///
/// [stream.keepalive]               # keep-alives before the first token
/// probability = 0.3
/// interval = "1s"
/// style = "comment"                # "comment" (`: keep-alive`) | "blank" | "ping"
///
/// [stream.cut]                     # streams that stop without a finish marker
/// probability = 0.05
/// after_tokens = [1, 30]
/// abort = false                    # true: the body fails (connection reset) instead of EOF
///
/// [stream.error]                   # an error event after the 200 (Anthropic overloaded_error)
/// probability = 0.02
/// after_tokens = [0, 10]
///
/// [malformed]
/// probability = 0.01
/// kinds = ["html_502", "truncated_json"] # also "error_200" and "empty" (not in the default)
///
/// [auth]
/// invalid_keys = ["sk-revoked"]    # answered with 401
///
/// [[errors]]                       # error rules, first match wins
/// status = [503, 529]              # one status or a list (one is drawn per failure)
/// start = "30s"                    # window relative to the upstream's start (absent: always)
/// end = "45s"
/// period = "120s"                  # repeat the window every period
/// probability = 0.9                # share of matching requests that fail
/// models = ["gpt-4o"]              # only these models (absent: all)
/// retry_after = "5s"               # send `retry-after` with the error
/// should_retry = true              # send `x-should-retry`
/// ```
///
/// In code:
///
/// ```
/// use std::time::Duration;
/// use seawall_mock::{Count, Delay, ErrorRule, Profile};
/// let p = Profile::default()
///     .seed(42)
///     .rpm(60)
///     .tpm(40_000)
///     .first_token_latency(Delay::lognormal(Duration::from_millis(300), 0.5).plus(Duration::from_millis(100)))
///     .cut_streams(0.05, Count::range(1, 30), false)
///     .error(ErrorRule::outage(503, Duration::from_secs(30), Duration::from_secs(45)).statuses(&[503, 529]));
/// assert!(p.validate().is_ok());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Profile {
    /// Seed of every random choice (latencies, faults, ids). Default 0.
    pub seed: u64,
    /// Where each call's random choices come from: the order of arrival (default) or the
    /// request itself.
    pub draws: Draws,
    /// Per-key request and token rate limits.
    pub limits: Limits,
    /// Billing quota per key.
    pub quota: Quota,
    /// Context windows.
    pub context: ContextWindow,
    /// Latency distributions.
    pub latency: Latency,
    /// Completion lengths.
    pub output: Output,
    /// Faults inside streamed responses.
    pub stream: StreamFaults,
    /// Bodies that are not what the API promises.
    pub malformed: Malformed,
    /// Keys answered with 401.
    pub auth: Auth,
    /// Server errors: bursts (a probability) and outage windows (a time range). First match wins.
    pub errors: Vec<ErrorRule>,
}

/// Where each call's random choices (its latencies, its answer's length, its faults) come from.
///
/// By arrival, the same calls in the same order give the same run; but two clients that send
/// the same calls with different retries between them shift the sequence apart, and meet
/// different faults on the same call. By request, each call draws from its own request, so two
/// such clients meet the same latencies, lengths and faults on it: comparing them then measures
/// how they handle the faults, not which faults they happened to draw (the method of common
/// random numbers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Draws {
    /// The next draw of the upstream's seeded sequence, in order of arrival.
    #[default]
    #[serde(rename = "arrival")]
    Arrival,
    /// The seed, the request's model and prompt (every field that carries text), and how
    /// many times the same request arrived before: the second arrival of a request (a retry)
    /// draws afresh, the same for every client. The upstream keeps one counter per distinct
    /// request, so this is for runs of a bounded size (a demo, a test), not a long-lived server.
    #[serde(rename = "request")]
    Request,
}

/// How requests are grouped for rate limits and quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum KeyBy {
    /// The API key (`Authorization: Bearer`, `x-api-key` or `api-key`); `anonymous` without one.
    #[default]
    #[serde(rename = "api_key")]
    ApiKey,
    /// The request's `model`.
    #[serde(rename = "model")]
    Model,
    /// Both, as `"{key}/{model}"`.
    #[serde(rename = "api_key+model")]
    ApiKeyAndModel,
}

/// Per-key rate limits: a token bucket per key for requests and one for tokens, each refilled
/// continuously at `limit / 60 s` up to `limit`. Every response carries the bucket state as
/// rate-limit headers; a request that does not fit gets 429 with `retry-after`.
///
/// A request is charged 1 request and `prompt + max_tokens` tokens (the planned completion
/// length when `max_tokens` is absent), at most the whole limit. Rejected requests are not
/// charged.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Limits {
    /// What a key is.
    pub key_by: KeyBy,
    /// Requests per minute per key; `None` is unlimited.
    pub rpm: Option<u32>,
    /// Tokens per minute per key; `None` is unlimited. A request costing more than the whole
    /// minute's tokens gets OpenAI's 429 "Request too large" on the OpenAI wire (no wait lets
    /// it through, so no `retry-after`); on the Anthropic wire it waits for a full bucket.
    pub tpm: Option<u32>,
    /// Overrides for single keys (an API key, a model or `key/model`, as `key_by` says).
    pub keys: BTreeMap<String, KeyLimits>,
}

impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys may be API keys: never print them.
        f.debug_struct("Limits")
            .field("key_by", &self.key_by)
            .field("rpm", &self.rpm)
            .field("tpm", &self.tpm)
            .field("keys", &format_args!("[{} overrides]", self.keys.len()))
            .finish()
    }
}

/// Limits of one key, overriding the defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct KeyLimits {
    /// Requests per minute; `None` keeps the default.
    pub rpm: Option<u32>,
    /// Tokens per minute; `None` keeps the default.
    pub tpm: Option<u32>,
}

impl KeyLimits {
    /// Limits with both figures set (`None` keeps the profile's default).
    pub fn new(rpm: Option<u32>, tpm: Option<u32>) -> Self {
        KeyLimits { rpm, tpm }
    }
}

/// Billing quota. A key that has been billed `tokens` (input plus output, partial streams
/// included) gets 429 `insufficient_quota` (OpenAI) or 400 "credit balance is too low"
/// (Anthropic) from then on. Like the real providers, the request that crosses the line still
/// completes.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Quota {
    /// Billed tokens per key before the quota is exhausted; `None` is unlimited.
    pub tokens: Option<u64>,
    /// Keys (as [`Limits::key_by`] forms them) that are exhausted from the start.
    pub exhausted_keys: Vec<String>,
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quota")
            .field("tokens", &self.tokens)
            .field(
                "exhausted_keys",
                &format_args!("[{} keys]", self.exhausted_keys.len()),
            )
            .finish()
    }
}

/// Context windows: a prompt estimated above the window gets the provider's context-length
/// error (OpenAI 400 `context_length_exceeded`, Anthropic 400 "prompt is too long").
///
/// The prompt estimate is the one seawall-core makes (characters of text / 4, plus 4 per text
/// part), so simulated budgets settle exactly.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ContextWindow {
    /// The window of every model not in `models`; `None` is unlimited.
    pub window: Option<u32>,
    /// Per-model windows.
    pub models: BTreeMap<String, u32>,
}

/// Latency distributions, each measured from the request's arrival.
///
/// A streamed response's head arrives after `head`, its first token after `first_token` (but
/// not before the head), each further token `per_token` after the previous one. A complete
/// (non-streamed) answer arrives after `first_token` plus `per_token` for each further token;
/// errors arrive after `head`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Latency {
    /// Time to the response head.
    pub head: Delay,
    /// Time to the first token.
    pub first_token: Delay,
    /// Time between tokens.
    pub per_token: Delay,
}

/// A latency distribution: `fixed + uniform + lognormal`, each part optional, capped at `max`.
///
/// In TOML either a duration (`"250ms"`: fixed) or a table
/// `{ fixed = "50ms", uniform = ["0ms", "100ms"], lognormal = { median = "300ms", sigma = 0.5 }, max = "5s" }`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct Delay {
    /// Always added.
    pub fixed: Duration,
    /// A uniform draw from this inclusive range.
    pub uniform: Option<(Duration, Duration)>,
    /// A log-normal draw.
    pub lognormal: Option<LogNormal>,
    /// An upper bound of the sum.
    pub max: Option<Duration>,
}

impl Delay {
    /// Always `d`.
    pub fn fixed(d: Duration) -> Self {
        Delay {
            fixed: d,
            ..Delay::default()
        }
    }

    /// Uniform in `[lo, hi]`.
    pub fn uniform(lo: Duration, hi: Duration) -> Self {
        Delay {
            uniform: Some((lo, hi)),
            ..Delay::default()
        }
    }

    /// Log-normal with the given median and shape `sigma` (the standard deviation of its
    /// logarithm; 0.5 is a moderate tail, 1.0 a heavy one).
    pub fn lognormal(median: Duration, sigma: f64) -> Self {
        Delay {
            lognormal: Some(LogNormal { median, sigma }),
            ..Delay::default()
        }
    }

    /// The same distribution plus `d`.
    pub fn plus(mut self, d: Duration) -> Self {
        self.fixed = self.fixed.saturating_add(d);
        self
    }

    /// The same distribution, capped at `max`.
    pub fn capped(mut self, max: Duration) -> Self {
        self.max = Some(max);
        self
    }

    /// Whether it is always zero.
    pub fn is_zero(&self) -> bool {
        self.fixed.is_zero()
            && self.uniform.is_none_or(|(_, hi)| hi.is_zero())
            && self.lognormal.is_none_or(|l| l.median.is_zero())
    }
}

/// A log-normal distribution, by its median and the standard deviation of its logarithm.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogNormal {
    /// The median.
    #[serde(with = "dur")]
    pub median: Duration,
    /// The standard deviation of the logarithm.
    pub sigma: f64,
}

/// Completion lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Output {
    /// Completion tokens of an answer, capped by the request's `max_tokens` (which then
    /// finishes with `length` / `max_tokens`). Default 16.
    pub tokens: Count,
    /// OpenAI streams: send the usage chunk even when the request did not ask for it with
    /// `stream_options.include_usage`. Default false, as OpenAI does.
    pub always_include_usage: bool,
}

impl Default for Output {
    fn default() -> Self {
        Output {
            tokens: Count::fixed(16),
            always_include_usage: false,
        }
    }
}

/// A count: fixed, or drawn uniformly from an inclusive range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    /// The smallest value.
    pub min: u32,
    /// The largest value.
    pub max: u32,
}

impl Count {
    /// Always `n`.
    pub const fn fixed(n: u32) -> Self {
        Count { min: n, max: n }
    }

    /// Uniform in `[min, max]`.
    pub const fn range(min: u32, max: u32) -> Self {
        Count { min, max }
    }
}

impl Default for Count {
    fn default() -> Self {
        Count::fixed(0)
    }
}

/// Faults inside streamed (`"stream": true`) responses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct StreamFaults {
    /// Keep-alives before the first token.
    pub keepalive: KeepAlive,
    /// Streams that stop early without a finish marker.
    pub cut: Cut,
    /// Error events after the 200.
    pub error: MidStreamError,
}

/// Keep-alives before the first token: what DeepSeek sends under load, and what a
/// time-to-first-token timeout must not count as a token. A stream that gets them sends one as
/// soon as its head is out and one every `interval` until its first token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct KeepAlive {
    /// Share of streams that get keep-alives.
    pub probability: f64,
    /// Time between keep-alives. Default 1 s.
    #[serde(with = "dur")]
    pub interval: Duration,
    /// What a keep-alive looks like.
    pub style: KeepAliveStyle,
}

impl Default for KeepAlive {
    fn default() -> Self {
        KeepAlive {
            probability: 0.0,
            interval: Duration::from_secs(1),
            style: KeepAliveStyle::Comment,
        }
    }
}

/// What a keep-alive looks like on the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum KeepAliveStyle {
    /// An SSE comment, `: keep-alive`.
    #[default]
    Comment,
    /// A blank line.
    Blank,
    /// Anthropic's `event: ping` (a comment on OpenAI streams).
    Ping,
}

/// Streams cut after some tokens, with no finish marker (no `finish_reason` and `[DONE]`, no
/// `message_stop`). The real providers bill the tokens sent; so does the mock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Cut {
    /// Share of streams that are cut.
    pub probability: f64,
    /// Tokens sent before the cut (0: none, right after the head and any keep-alives).
    pub after_tokens: Count,
    /// End with a body error (like a reset connection; over HTTP the chunked body stops
    /// without its terminator) instead of a clean end of stream.
    ///
    /// Over HTTP, a reset that comes with no latency before it (no first-token latency, cut
    /// after 0 tokens) may reach hyper before it flushed the head: the client then sees the
    /// connection close with no response at all, which is also what real resets look like.
    pub abort: bool,
}

/// Error events after a 200: Anthropic's `event: error` with `overloaded_error`, OpenAI's
/// `data: {"error": {...}}` with `server_error`. The stream ends after the event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct MidStreamError {
    /// Share of streams that get one.
    pub probability: f64,
    /// Tokens sent before it (0: before any content, still before the commit point).
    pub after_tokens: Count,
}

/// Bodies that are not what the API promises.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Malformed {
    /// Share of admitted requests that get one.
    pub probability: f64,
    /// The kinds, drawn uniformly. Default: `html_502` and `truncated_json`.
    pub kinds: Vec<MalformedKind>,
}

impl Default for Malformed {
    fn default() -> Self {
        Malformed {
            probability: 0.0,
            kinds: vec![MalformedKind::Html502, MalformedKind::TruncatedJson],
        }
    }
}

/// A malformed body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum MalformedKind {
    /// A 502 with a proxy's HTML page instead of a JSON error.
    #[serde(rename = "html_502")]
    Html502,
    /// A 200 whose JSON (or, streamed, whose first event) stops halfway.
    #[serde(rename = "truncated_json")]
    TruncatedJson,
    /// A 200 whose JSON body is an error object, as some OpenAI-compatible routers send (or,
    /// streamed, whose first event is one): an overload naming status 503.
    #[serde(rename = "error_200")]
    Error200,
    /// A 200 answer with nothing in it: an empty message (OpenAI) or content array (Anthropic);
    /// streamed, only the role, the finish reason and the finish marker.
    #[serde(rename = "empty")]
    Empty,
}

/// Keys answered with 401 (OpenAI `invalid_api_key`, Anthropic `authentication_error`).
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Auth {
    /// The rejected keys.
    pub invalid_keys: Vec<String>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field(
                "invalid_keys",
                &format_args!("[{} keys]", self.invalid_keys.len()),
            )
            .finish()
    }
}

/// A rule that answers matching requests with a server error: a burst (no window, a
/// probability) or an outage (a window, relative to the upstream's start, optionally
/// repeating every `period`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ErrorRule {
    /// The statuses; one is drawn per failure. 500, 502, 503, 504 and 529 get the provider's
    /// own error bodies; other statuses a generic one.
    #[serde(deserialize_with = "one_or_many")]
    pub status: Vec<u16>,
    /// Window start (absent: from the beginning).
    #[serde(with = "opt_dur", skip_serializing_if = "Option::is_none")]
    pub start: Option<Duration>,
    /// Window end, exclusive (absent: forever).
    #[serde(with = "opt_dur", skip_serializing_if = "Option::is_none")]
    pub end: Option<Duration>,
    /// Repeat the window every `period` (needs `end`).
    #[serde(with = "opt_dur", skip_serializing_if = "Option::is_none")]
    pub period: Option<Duration>,
    /// Share of matching requests that fail. Default 1.
    pub probability: f64,
    /// Only requests for these models (empty: all).
    pub models: Vec<String>,
    /// Send `retry-after` (whole seconds, rounded up) with the error.
    #[serde(with = "opt_dur", skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<Duration>,
    /// Send `x-should-retry: true|false`.
    pub should_retry: Option<bool>,
}

impl Default for ErrorRule {
    fn default() -> Self {
        ErrorRule {
            status: vec![500],
            start: None,
            end: None,
            period: None,
            probability: 1.0,
            models: Vec::new(),
            retry_after: None,
            should_retry: None,
        }
    }
}

impl ErrorRule {
    /// Every request fails with `status`, with probability `probability` (a burst of errors
    /// spread over the whole run).
    pub fn random(status: u16, probability: f64) -> Self {
        ErrorRule {
            status: vec![status],
            probability,
            ..ErrorRule::default()
        }
    }

    /// Every request between `start` and `end` (from the upstream's start) fails with
    /// `status`: an outage.
    pub fn outage(status: u16, start: Duration, end: Duration) -> Self {
        ErrorRule {
            status: vec![status],
            start: Some(start),
            end: Some(end),
            ..ErrorRule::default()
        }
    }

    /// Draws the status from `statuses` instead.
    pub fn statuses(mut self, statuses: &[u16]) -> Self {
        self.status = statuses.to_vec();
        self
    }

    /// Fails only this share of matching requests.
    pub fn probability(mut self, p: f64) -> Self {
        self.probability = p;
        self
    }

    /// Repeats the window every `period`.
    pub fn every(mut self, period: Duration) -> Self {
        self.period = Some(period);
        self
    }

    /// Only for requests to `model` (call again to add more).
    pub fn model(mut self, model: &str) -> Self {
        self.models.push(model.to_owned());
        self
    }

    /// Sends `retry-after` with the error.
    pub fn retry_after(mut self, d: Duration) -> Self {
        self.retry_after = Some(d);
        self
    }

    /// Sends `x-should-retry: true|false` with the error.
    pub fn should_retry(mut self, retry: bool) -> Self {
        self.should_retry = Some(retry);
        self
    }

    /// Whether the rule's window is open at `t` after the upstream's start.
    pub fn active_at(&self, t: Duration) -> bool {
        let start = self.start.unwrap_or(Duration::ZERO);
        if t < start {
            return false;
        }
        let Some(end) = self.end else { return true };
        match self.period {
            Some(p) if !p.is_zero() => {
                let into = Duration::from_nanos(((t - start).as_nanos() % p.as_nanos()) as u64);
                into < end.saturating_sub(start)
            }
            _ => t < end,
        }
    }

    /// Whether the rule applies to `model`.
    pub fn applies_to(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }
}

/// Why a profile was rejected.
#[derive(Debug)]
pub struct ProfileError {
    message: String,
}

impl ProfileError {
    fn new(message: impl Into<String>) -> Self {
        ProfileError {
            message: message.into(),
        }
    }
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid fault profile: {}", self.message)
    }
}

impl std::error::Error for ProfileError {}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_prints_keys() {
        let p = Profile::default()
            .key_limits("sk-secret-1", KeyLimits::new(Some(1), None))
            .exhausted_key("sk-secret-2")
            .invalid_key("sk-secret-3");
        let shown = format!("{p:?}");
        assert!(!shown.contains("sk-secret"), "{shown}");
        assert!(shown.contains("1 overrides"));
    }

    #[test]
    fn windows_open_and_close() {
        let r = ErrorRule::outage(503, Duration::from_secs(10), Duration::from_secs(20));
        let at = |s: f64| r.active_at(Duration::from_secs_f64(s));
        assert!(!at(9.999) && at(10.0) && at(19.999) && !at(20.0) && !at(1e6));
        let r = r.every(Duration::from_secs(60));
        let at = |s: f64| r.active_at(Duration::from_secs_f64(s));
        assert!(at(70.0) && !at(80.0) && at(130.5) && !at(5.0));
        assert!(ErrorRule::random(500, 0.5).active_at(Duration::from_secs(1_000_000)));
    }
}
