//! Metrics through the `metrics` facade: install any exporter (Prometheus, StatsD, ...).
//!
//! Names follow the OpenTelemetry GenAI semantic conventions where they exist
//! (`gen_ai.client.operation.duration`, `gen_ai.client.token.usage`,
//! `gen_ai.server.time_to_first_token`, `gen_ai.server.time_per_output_token`); the rest are
//! seawall's own under `seawall.`. Exporters turn the dots into their own separators.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::record::{CallOutcome, CallRecord, Recorder};

/// Weight of the newest call in the retry-rate moving average (about the last 100 calls).
const RETRY_RATE_ALPHA: f64 = 0.01;

/// Records counters and histograms for each call:
///
/// | metric | kind | labels |
/// |---|---|---|
/// | `seawall.calls` | counter | `gen_ai.request.model`, `outcome`, `error.type` |
/// | `seawall.attempts`, `seawall.retries` | counter | `gen_ai.request.model` |
/// | `seawall.rejections` | counter | `error.type` (local classes only) |
/// | `seawall.retry_rate` | gauge | - (retries per call, moving average of ~100 calls) |
/// | `seawall.queue_wait` | histogram (s) | `gen_ai.request.model` |
/// | `seawall.cost` | counter (micro-USD) | `gen_ai.request.model` |
/// | `gen_ai.client.operation.duration` | histogram (s) | `gen_ai.request.model`, `error.type` |
/// | `gen_ai.client.token.usage` | histogram | `gen_ai.request.model`, `gen_ai.token.type` |
/// | `gen_ai.server.time_to_first_token` | histogram (s) | `gen_ai.request.model` |
/// | `gen_ai.server.time_per_output_token` | histogram (s) | `gen_ai.request.model` |
///
/// The retry rate is its own figure because a rising retry rate warns before errors do.
#[derive(Debug, Default)]
pub struct MetricsRecorder {
    retry_rate_bits: AtomicU64,
}

impl MetricsRecorder {
    /// A new recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current moving average of retries per call.
    pub fn retry_rate(&self) -> f64 {
        f64::from_bits(self.retry_rate_bits.load(Ordering::Relaxed))
    }

    fn update_retry_rate(&self, retries: u32) -> f64 {
        let sample = f64::from(retries);
        let mut cur = self.retry_rate_bits.load(Ordering::Relaxed);
        loop {
            let next = f64::from_bits(cur) * (1.0 - RETRY_RATE_ALPHA) + sample * RETRY_RATE_ALPHA;
            match self.retry_rate_bits.compare_exchange_weak(
                cur,
                next.to_bits(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return next,
                Err(actual) => cur = actual,
            }
        }
    }
}

impl Recorder for MetricsRecorder {
    fn record(&self, r: &CallRecord) {
        let model = r.model.as_deref().unwrap_or("unknown").to_owned();
        let class = r.class.map_or("none", |c| c.as_str());
        let outcome = match r.outcome {
            CallOutcome::Success => "success",
            CallOutcome::Failed => "failed",
            CallOutcome::Interrupted => "interrupted",
            CallOutcome::Cancelled => "cancelled",
        };
        metrics::counter!("seawall.calls", "gen_ai.request.model" => model.clone(), "outcome" => outcome, "error.type" => class)
            .increment(1);
        metrics::counter!("seawall.attempts", "gen_ai.request.model" => model.clone())
            .increment(u64::from(r.attempts));
        metrics::counter!("seawall.retries", "gen_ai.request.model" => model.clone())
            .increment(u64::from(r.retries()));
        if let Some(c) = r.class.filter(|c| c.is_local()) {
            metrics::counter!("seawall.rejections", "error.type" => c.as_str()).increment(1);
        }
        let rate = self.update_retry_rate(r.retries());
        metrics::gauge!("seawall.retry_rate").set(rate);
        metrics::histogram!("gen_ai.client.operation.duration", "gen_ai.request.model" => model.clone(), "error.type" => class)
            .record(r.latency.as_secs_f64());
        if let Some(q) = r.queue_wait {
            metrics::histogram!("seawall.queue_wait", "gen_ai.request.model" => model.clone())
                .record(q.as_secs_f64());
        }
        if let Some(t) = r.time_to_first_token {
            metrics::histogram!("gen_ai.server.time_to_first_token", "gen_ai.request.model" => model.clone())
                .record(t.as_secs_f64());
        }
        if let Some(t) = r.time_per_output_token {
            metrics::histogram!("gen_ai.server.time_per_output_token", "gen_ai.request.model" => model.clone())
                .record(t.as_secs_f64());
        }
        if let Some(u) = r.usage {
            metrics::histogram!("gen_ai.client.token.usage", "gen_ai.request.model" => model.clone(), "gen_ai.token.type" => "input")
                .record(u.input_tokens as f64);
            metrics::histogram!("gen_ai.client.token.usage", "gen_ai.request.model" => model.clone(), "gen_ai.token.type" => "output")
                .record(u.output_tokens as f64);
        }
        if let Some(c) = r.cost_usd {
            metrics::counter!("seawall.cost", "gen_ai.request.model" => model)
                .increment((c * 1e6).round().max(0.0) as u64);
        }
    }
}
