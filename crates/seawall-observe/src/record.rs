//! The per-call record and the recorders that receive it.

use std::sync::Arc;
use std::time::Duration;

use seawall_core::{CacheStatus, ContextAction, FailureClass, Usage};
use serde::Serialize;

/// How a logical call ended, from the caller's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallOutcome {
    /// An answer, delivered to its end.
    Success,
    /// An error before any answer (the record's `class` says which).
    Failed,
    /// The answer began but its body ended in an error (a broken stream).
    Interrupted,
    /// The caller dropped the future or the body first.
    Cancelled,
}

/// One record per logical call (not per attempt), filled by whichever layers are stacked.
///
/// Fields a layer did not report are `None` rather than a guess: a stack without a gate has no
/// queue time, a non-streaming call without a classifier has no time to first token.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallRecord {
    /// The upstream's request id (`x-request-id` / `request-id`), when it sent one.
    pub request_id: Option<String>,
    /// The model the caller asked for.
    pub model: Option<Arc<str>>,
    /// The model that answered (after a fallback, or as the upstream reported it).
    pub served_model: Option<Arc<str>>,
    /// The fallback target that answered (`None` without a fallback layer).
    pub target: Option<Arc<str>>,
    /// How the call ended.
    pub outcome: CallOutcome,
    /// The final HTTP status, when known.
    pub status: Option<u16>,
    /// The final failure class (`None` for a success).
    #[serde(serialize_with = "ser_class")]
    pub class: Option<FailureClass>,
    /// The provider's error code (`insufficient_quota`, ...).
    pub error_code: Option<String>,
    /// Token usage reported by the upstream.
    #[serde(serialize_with = "ser_usage")]
    pub usage: Option<Usage>,
    /// Cost in US dollars, as the budget layer priced it.
    pub cost_usd: Option<f64>,
    /// Upstream attempts (1 without retries; 0 when a local layer refused the call).
    pub attempts: u32,
    /// Time spent queued in the concurrency gate (`None` without a gate).
    #[serde(serialize_with = "ser_ms")]
    pub queue_wait: Option<Duration>,
    /// Time to the first token of the final attempt.
    #[serde(serialize_with = "ser_ms")]
    pub time_to_first_token: Option<Duration>,
    /// Mean time per output token after the first.
    #[serde(serialize_with = "ser_ms")]
    pub time_per_output_token: Option<Duration>,
    /// Total latency, from the call to the end of the body (or the error).
    #[serde(serialize_with = "ser_ms_req")]
    pub latency: Duration,
    /// Whether a fallback target (not the primary) answered.
    pub fallback: bool,
    /// Whether the answer was a cached or static degraded response.
    pub degraded: bool,
    /// What a cache layer did: `hit`, `miss`, `bypass` or `semantic(score)` (`None` without
    /// a cache layer). A hit made no upstream call: its `attempts` are 0 and its cost 0, while
    /// `usage` is the cached answer's, as its body reports it.
    #[serde(serialize_with = "ser_cache")]
    pub cache: Option<CacheStatus>,
    /// The configured `config_version` tag, to tell deployments apart.
    pub config_version: Option<Arc<str>>,
    /// Repair turns the repair layer sent after answers that failed validation (0 without
    /// it). Each turn is an upstream call of its own, counted in `attempts` too.
    pub repairs: u32,
    /// What a context guard did before sending: `skipped`, `fits`, `refused`, `trimmed(n)`
    /// or `max_tokens_lowered(from->to)` (`None` without a guard). A refusal, trim or lowering
    /// is kept over a later `fits`: a primary refused and a larger-context fallback that fit
    /// reads `refused` with `fallback: true`.
    #[serde(serialize_with = "ser_display")]
    pub context_guard: Option<ContextAction>,
    /// Follow-up requests that continued an answer cut by `max_tokens` (0 without a
    /// continuation layer).
    pub continuations: u32,
    /// Follow-up requests that resumed a stream cut after its first token.
    pub resumed: u32,
    /// Streams cut before the continuation layer let their first tokens through, asked again
    /// from the start.
    pub restarts: u32,
}

impl CallRecord {
    /// Retries made: attempts after the first, not counting the repair turns (each of which
    /// is a first attempt of its own turn).
    pub fn retries(&self) -> u32 {
        self.attempts.saturating_sub(1).saturating_sub(self.repairs)
    }

    /// The record as one line of JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain data to a String cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

fn ser_class<S: serde::Serializer>(c: &Option<FailureClass>, s: S) -> Result<S::Ok, S::Error> {
    match c {
        Some(c) => s.serialize_str(c.as_str()),
        None => s.serialize_none(),
    }
}

fn ser_cache<S: serde::Serializer>(c: &Option<CacheStatus>, s: S) -> Result<S::Ok, S::Error> {
    match c {
        Some(c @ CacheStatus::Semantic(_)) => s.collect_str(c),
        Some(c) => s.serialize_str(c.as_str()),
        None => s.serialize_none(),
    }
}

fn ser_display<S: serde::Serializer, T: std::fmt::Display>(
    v: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

fn ser_usage<S: serde::Serializer>(u: &Option<Usage>, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    match u {
        Some(u) => {
            let mut st = s.serialize_struct("Usage", 5)?;
            st.serialize_field("input_tokens", &u.input_tokens)?;
            st.serialize_field("output_tokens", &u.output_tokens)?;
            st.serialize_field("cached_input_tokens", &u.cached_input_tokens)?;
            st.serialize_field("cache_write_input_tokens", &u.cache_write_input_tokens)?;
            st.serialize_field(
                "cache_write_1h_input_tokens",
                &u.cache_write_1h_input_tokens,
            )?;
            st.end()
        }
        None => s.serialize_none(),
    }
}

fn ser_ms<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_f64(d.as_secs_f64() * 1e3),
        None => s.serialize_none(),
    }
}

fn ser_ms_req<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// Receives one [`CallRecord`] per logical call.
///
/// Called on the task that finished the call (the one that polled the body to its end); keep
/// it quick and non-blocking.
pub trait Recorder: Send + Sync + 'static {
    /// Receives a finished call.
    fn record(&self, record: &CallRecord);
}

/// Discards records (the layer still fills its `tracing` span).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopRecorder;

impl Recorder for NoopRecorder {
    fn record(&self, _: &CallRecord) {}
}

impl<F> Recorder for F
where
    F: Fn(&CallRecord) + Send + Sync + 'static,
{
    fn record(&self, record: &CallRecord) {
        self(record)
    }
}

impl<A: Recorder, B: Recorder> Recorder for (A, B) {
    fn record(&self, record: &CallRecord) {
        self.0.record(record);
        self.1.record(record);
    }
}

impl<R: Recorder + ?Sized> Recorder for Arc<R> {
    fn record(&self, record: &CallRecord) {
        (**self).record(record)
    }
}

/// Emits each record as a `tracing` event at INFO (target `seawall::call`), as JSON in the
/// `record` field plus the key figures as fields.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingRecorder;

impl Recorder for TracingRecorder {
    fn record(&self, r: &CallRecord) {
        tracing::info!(
            target: "seawall::call",
            outcome = ?r.outcome,
            class = r.class.map(FailureClass::as_str),
            attempts = r.attempts,
            latency_ms = r.latency.as_secs_f64() * 1e3,
            record = %r.to_json(),
            "llm call"
        );
    }
}

/// A successful one-attempt call of 5 ms with nothing else reported, for unit tests to adjust.
#[cfg(test)]
pub(crate) fn success() -> CallRecord {
    CallRecord {
        request_id: None,
        model: None,
        served_model: None,
        target: None,
        outcome: CallOutcome::Success,
        status: Some(200),
        class: None,
        error_code: None,
        usage: None,
        cost_usd: None,
        attempts: 1,
        queue_wait: None,
        time_to_first_token: None,
        time_per_output_token: None,
        latency: std::time::Duration::from_millis(5),
        fallback: false,
        degraded: false,
        cache: None,
        config_version: None,
        repairs: 0,
        context_guard: None,
        continuations: 0,
        resumed: 0,
        restarts: 0,
    }
}
