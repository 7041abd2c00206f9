//! Counters a simulation or a test reads: requests by outcome and status, tokens billed.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// How a request was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    RateLimited,
    QuotaExhausted,
    ContextLength,
    ServerError,
    Malformed,
    Rejected,
}

#[derive(Debug)]
pub(crate) struct Counters {
    requests: AtomicU64,
    outcomes: [AtomicU64; 7],
    status: Box<[AtomicU64]>,
    pub(crate) streams_started: AtomicU64,
    pub(crate) streams_completed: AtomicU64,
    pub(crate) streams_cut: AtomicU64,
    pub(crate) streams_errored: AtomicU64,
    pub(crate) abandoned: AtomicU64,
    pub(crate) input_tokens: AtomicU64,
    pub(crate) output_tokens: AtomicU64,
    pub(crate) wasted_input_tokens: AtomicU64,
    pub(crate) wasted_output_tokens: AtomicU64,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            requests: AtomicU64::new(0),
            outcomes: Default::default(),
            status: (0..1000).map(|_| AtomicU64::new(0)).collect(),
            streams_started: AtomicU64::new(0),
            streams_completed: AtomicU64::new(0),
            streams_cut: AtomicU64::new(0),
            streams_errored: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            input_tokens: AtomicU64::new(0),
            output_tokens: AtomicU64::new(0),
            wasted_input_tokens: AtomicU64::new(0),
            wasted_output_tokens: AtomicU64::new(0),
        }
    }
}

impl Counters {
    pub(crate) fn record(&self, outcome: Outcome, status: u16) {
        self.requests.fetch_add(1, Relaxed);
        self.outcomes[outcome as usize].fetch_add(1, Relaxed);
        if let Some(c) = self.status.get(usize::from(status)) {
            c.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn snapshot(&self, elapsed: Duration) -> Stats {
        let o = |x: Outcome| self.outcomes[x as usize].load(Relaxed);
        Stats {
            elapsed,
            requests: self.requests.load(Relaxed),
            ok: o(Outcome::Ok),
            rate_limited: o(Outcome::RateLimited),
            quota_exhausted: o(Outcome::QuotaExhausted),
            context_length: o(Outcome::ContextLength),
            server_errors: o(Outcome::ServerError),
            malformed: o(Outcome::Malformed),
            rejected: o(Outcome::Rejected),
            by_status: self
                .status
                .iter()
                .enumerate()
                .filter_map(|(s, c)| {
                    let n = c.load(Relaxed);
                    (n > 0).then_some((s as u16, n))
                })
                .collect(),
            streams_started: self.streams_started.load(Relaxed),
            streams_completed: self.streams_completed.load(Relaxed),
            streams_cut: self.streams_cut.load(Relaxed),
            streams_errored: self.streams_errored.load(Relaxed),
            abandoned: self.abandoned.load(Relaxed),
            input_tokens: self.input_tokens.load(Relaxed),
            output_tokens: self.output_tokens.load(Relaxed),
            wasted_input_tokens: self.wasted_input_tokens.load(Relaxed),
            wasted_output_tokens: self.wasted_output_tokens.load(Relaxed),
        }
    }
}

/// A snapshot of what the upstream has done since it started.
///
/// Billing follows the real providers: an admitted request is billed its prompt when it is
/// accepted (a complete answer is billed in full then, even if the caller goes away before it
/// arrives); a stream is billed each output token as it is sent, so cut, failed and abandoned
/// streams are billed for what they sent. Rejections (4xx, 429, 5xx, the HTML 502) are free.
///
/// "Wasted" tokens are billed tokens of answers the caller did not get whole: streams that were
/// cut, failed mid-way or dropped, answers whose response future was dropped, truncated JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Time since the upstream started (virtual time on a paused clock).
    pub elapsed: Duration,
    /// Requests received.
    pub requests: u64,
    /// Answered with a 200 and a well-formed head (streams may still fail later).
    pub ok: u64,
    /// 429 rate limit.
    pub rate_limited: u64,
    /// Quota exhausted (OpenAI 429 `insufficient_quota`, Anthropic 400 credit balance).
    pub quota_exhausted: u64,
    /// 400 context length exceeded.
    pub context_length: u64,
    /// Server errors from the error rules (500, 502, 503, 529, ...).
    pub server_errors: u64,
    /// Malformed bodies (HTML 502, truncated JSON).
    pub malformed: u64,
    /// Other client errors: bad JSON, missing fields, unknown path, invalid key.
    pub rejected: u64,
    /// Responses by HTTP status, ascending.
    pub by_status: Vec<(u16, u64)>,
    /// Streamed responses begun.
    pub streams_started: u64,
    /// Streams that sent their finish marker.
    pub streams_completed: u64,
    /// Streams cut without a finish marker.
    pub streams_cut: u64,
    /// Streams that sent a mid-stream error event.
    pub streams_errored: u64,
    /// Admitted requests the caller dropped before the answer was complete.
    pub abandoned: u64,
    /// Prompt tokens billed.
    pub input_tokens: u64,
    /// Completion tokens billed (partial streams included).
    pub output_tokens: u64,
    /// Prompt tokens billed for answers the caller did not get whole.
    pub wasted_input_tokens: u64,
    /// Completion tokens billed for answers the caller did not get whole.
    pub wasted_output_tokens: u64,
}

impl Stats {
    /// Responses with `status`.
    pub fn status(&self, status: u16) -> u64 {
        self.by_status
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n)
    }

    /// Input plus output tokens billed.
    pub fn billed_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    /// Input plus output tokens billed for answers the caller did not get whole.
    pub fn wasted_tokens(&self) -> u64 {
        self.wasted_input_tokens + self.wasted_output_tokens
    }
}
