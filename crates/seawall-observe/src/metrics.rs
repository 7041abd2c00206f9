//! Metrics through the `metrics` facade: install any exporter (Prometheus, StatsD, ...).
//!
//! Names follow the OpenTelemetry GenAI semantic conventions where they exist
//! (`gen_ai.client.operation.duration`, `gen_ai.client.token.usage`,
//! `gen_ai.server.time_to_first_token`, `gen_ai.server.time_per_output_token`); the rest are
//! seawall's own under `seawall.`. Exporters turn the dots into their own separators.
//!
//! Every distinct label value is a time series an exporter keeps for the life of the process,
//! and the model name comes from the request body: labelled verbatim, a client sending random
//! model names grows the exporter without bound. So the model label takes its value from a
//! bounded set the operator controls: an allow-list ([`MetricsRecorder::models`]), or the first
//! models seen up to a cap ([`MetricsRecorder::max_models`]); any other model is labelled
//! [`OTHER_MODEL`].

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use seawall_core::{CacheStatus, MAX_KEY_LEN};

use crate::record::{CallOutcome, CallRecord, Recorder};

/// Weight of the newest call in the retry-rate moving average (about the last 100 calls).
const RETRY_RATE_ALPHA: f64 = 0.01;

/// How many distinct models a [`MetricsRecorder`] labels by name unless told otherwise.
pub const DEFAULT_MAX_MODELS: usize = 32;

/// The model label of calls whose model is not in the recorder's set.
pub const OTHER_MODEL: &str = "other";

/// The model label of calls that name no model.
const UNKNOWN_MODEL: &str = "unknown";

/// The models a recorder labels by name.
#[derive(Debug)]
struct ModelLabels {
    known: RwLock<HashSet<Arc<str>>>,
    /// Whether models not yet known are added while there is room.
    learn: bool,
    max: usize,
}

impl ModelLabels {
    fn learning(max: usize) -> Self {
        ModelLabels {
            known: RwLock::default(),
            learn: true,
            max,
        }
    }

    /// The label of `model`: itself when it is in the set (or joins it now), else `other`.
    fn label(&self, model: Option<&str>) -> String {
        let Some(model) = model else {
            return UNKNOWN_MODEL.to_owned();
        };
        let known = self.known.read().unwrap_or_else(PoisonError::into_inner);
        if known.contains(model) {
            return model.to_owned();
        }
        let full = known.len() >= self.max;
        drop(known);
        // A long name is never learned: the label would pin it in every exporter.
        if !self.learn || full || model.len() > MAX_KEY_LEN {
            return OTHER_MODEL.to_owned();
        }
        let mut known = self.known.write().unwrap_or_else(PoisonError::into_inner);
        if known.len() < self.max {
            known.insert(Arc::from(model));
            return model.to_owned();
        }
        if known.contains(model) {
            model.to_owned()
        } else {
            OTHER_MODEL.to_owned()
        }
    }
}

/// Records counters and histograms for each call:
///
/// | metric | kind | labels |
/// |---|---|---|
/// | `seawall.calls` | counter | `gen_ai.request.model`, `outcome`, `error.type` |
/// | `seawall.attempts`, `seawall.retries` | counter | `gen_ai.request.model` |
/// | `seawall.repairs` | counter | `gen_ai.request.model` (repair turns after invalid answers) |
/// | `seawall.rejections` | counter | `error.type` (local classes only) |
/// | `seawall.retry_rate` | gauge | - (retries per call, moving average of ~100 calls) |
/// | `seawall.queue_wait` | histogram (s) | `gen_ai.request.model` |
/// | `seawall.cost` | counter (micro-USD) | `gen_ai.request.model` |
/// | `seawall.cache` | counter | `gen_ai.request.model`, `status` (`hit`, `miss`, `bypass`, `semantic`) |
/// | `gen_ai.client.operation.duration` | histogram (s) | `gen_ai.request.model`, `error.type` |
/// | `gen_ai.client.token.usage` | histogram | `gen_ai.request.model`, `gen_ai.token.type` (not for cache hits: they use no tokens) |
/// | `gen_ai.server.time_to_first_token` | histogram (s) | `gen_ai.request.model` (not for cache hits) |
/// | `gen_ai.server.time_per_output_token` | histogram (s) | `gen_ai.request.model` (not for cache hits) |
///
/// The retry rate is its own figure because a rising retry rate warns before errors do. The
/// cache's hit rate is `seawall.cache{status="hit"}` (plus `semantic`) over all of
/// `seawall.cache`; calls without a cache layer are not counted there.
///
/// `gen_ai.request.model` is the requested model when it is in the recorder's bounded set, and
/// [`OTHER_MODEL`] otherwise (`unknown` when the call names none). By default the set is the
/// first [`DEFAULT_MAX_MODELS`] distinct models seen (of at most
/// [`MAX_KEY_LEN`](seawall_core::MAX_KEY_LEN) bytes); give the models you serve or price with
/// [`models`](Self::models) so a burst of junk names early on cannot take their places.
///
/// ```
/// use seawall_observe::MetricsRecorder;
///
/// // Label only these two; every other model is "other".
/// let recorder = MetricsRecorder::new().models(["gpt-4o", "gpt-4o-mini"]);
/// # let _ = recorder;
/// ```
#[derive(Debug)]
pub struct MetricsRecorder {
    retry_rate_bits: AtomicU64,
    models: ModelLabels,
}

impl Default for MetricsRecorder {
    fn default() -> Self {
        MetricsRecorder {
            retry_rate_bits: AtomicU64::new(0),
            models: ModelLabels::learning(DEFAULT_MAX_MODELS),
        }
    }
}

impl MetricsRecorder {
    /// A new recorder that labels the first [`DEFAULT_MAX_MODELS`] models seen by name.
    pub fn new() -> Self {
        Self::default()
    }

    /// Labels the first `n` distinct models seen by name, and the rest `other`.
    pub fn max_models(mut self, n: usize) -> Self {
        self.models = ModelLabels::learning(n);
        self
    }

    /// Labels exactly these models by name, and every other model `other`. Names longer than
    /// [`MAX_KEY_LEN`](seawall_core::MAX_KEY_LEN) bytes are left out.
    pub fn models<I, M>(mut self, models: I) -> Self
    where
        I: IntoIterator<Item = M>,
        M: AsRef<str>,
    {
        let known: HashSet<Arc<str>> = models
            .into_iter()
            .map(|m| Arc::from(m.as_ref()))
            .filter(|m: &Arc<str>| m.len() <= MAX_KEY_LEN)
            .collect();
        self.models = ModelLabels {
            max: known.len(),
            known: RwLock::new(known),
            learn: false,
        };
        self
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
        let model = self.models.label(r.model.as_deref());
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
        if r.repairs > 0 {
            metrics::counter!("seawall.repairs", "gen_ai.request.model" => model.clone())
                .increment(u64::from(r.repairs));
        }
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
        // A cache hit used none of the provider's tokens and no server answered it: its
        // answer's usage is in its record, not in the tokens used or the server's timings.
        let hit = r.cache.is_some_and(CacheStatus::is_hit);
        if let Some(t) = r.time_to_first_token.filter(|_| !hit) {
            metrics::histogram!("gen_ai.server.time_to_first_token", "gen_ai.request.model" => model.clone())
                .record(t.as_secs_f64());
        }
        if let Some(t) = r.time_per_output_token.filter(|_| !hit) {
            metrics::histogram!("gen_ai.server.time_per_output_token", "gen_ai.request.model" => model.clone())
                .record(t.as_secs_f64());
        }
        if let Some(u) = r.usage.filter(|_| !hit) {
            metrics::histogram!("gen_ai.client.token.usage", "gen_ai.request.model" => model.clone(), "gen_ai.token.type" => "input")
                .record(u.input_tokens as f64);
            metrics::histogram!("gen_ai.client.token.usage", "gen_ai.request.model" => model.clone(), "gen_ai.token.type" => "output")
                .record(u.output_tokens as f64);
        }
        if let Some(status) = r.cache {
            metrics::counter!("seawall.cache", "gen_ai.request.model" => model.clone(), "status" => status.as_str())
                .increment(1);
        }
        if let Some(c) = r.cost_usd {
            metrics::counter!("seawall.cost", "gen_ai.request.model" => model)
                .increment((c * 1e6).round().max(0.0) as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::CallRecord;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

    /// One series of a snapshot.
    type Entry = (
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    );

    fn record(model: &str) -> CallRecord {
        CallRecord {
            model: Some(Arc::from(model)),
            ..crate::record::success()
        }
    }

    /// The series of `metric`: each one's value of `label`, and its value, by that label.
    /// (A snapshot drains the histograms: take one, and read every series from it.)
    fn series<'a>(
        entries: &'a [Entry],
        metric: &str,
        label: &str,
    ) -> Vec<(String, &'a DebugValue)> {
        let mut out: Vec<_> = entries
            .iter()
            .filter(|(k, ..)| k.key().name() == metric)
            .map(|(k, _, _, v)| {
                let l = k.key().labels().find(|l| l.key() == label);
                (l.map(|l| l.value().to_owned()).unwrap_or_default(), v)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The counters of `metric` by `label`.
    fn counters(snapshotter: &Snapshotter, metric: &str, label: &str) -> Vec<(String, u64)> {
        let count = |v: &DebugValue| match v {
            DebugValue::Counter(n) => *n,
            _ => 0,
        };
        let entries = snapshotter.snapshot().into_vec();
        let series = series(&entries, metric, label);
        series.into_iter().map(|(l, v)| (l, count(v))).collect()
    }

    /// The model labels of `seawall.calls`, and the calls under each.
    fn calls_by_model(snapshotter: &Snapshotter) -> Vec<(String, u64)> {
        counters(snapshotter, "seawall.calls", "gen_ai.request.model")
    }

    fn run(recorder: &MetricsRecorder, models: impl IntoIterator<Item = String>) -> Snapshotter {
        let debugging = DebuggingRecorder::new();
        let snapshotter = debugging.snapshotter();
        metrics::with_local_recorder(&debugging, || {
            for m in models {
                recorder.record(&record(&m));
            }
        });
        snapshotter
    }

    #[test]
    fn a_flood_of_model_names_makes_a_bounded_number_of_series() {
        let recorder = MetricsRecorder::new().max_models(3);
        let models = (0..1000).map(|i| format!("model-{}", i % 500));
        let calls = calls_by_model(&run(&recorder, models));
        assert_eq!(
            calls,
            [
                ("model-0".to_owned(), 2),
                ("model-1".to_owned(), 2),
                ("model-2".to_owned(), 2),
                (OTHER_MODEL.to_owned(), 994),
            ]
        );
    }

    #[test]
    fn an_allow_list_labels_only_its_models() {
        let recorder = MetricsRecorder::new().models(["gpt-4o", "gpt-4o-mini"]);
        let models = ["junk", "gpt-4o", "junk2", "gpt-4o-mini", "gpt-4o"].map(String::from);
        let calls = calls_by_model(&run(&recorder, models));
        assert_eq!(
            calls,
            [
                ("gpt-4o".to_owned(), 2),
                ("gpt-4o-mini".to_owned(), 1),
                (OTHER_MODEL.to_owned(), 2),
            ]
        );
    }

    #[test]
    fn concurrent_new_models_never_exceed_the_cap() {
        let labels = Arc::new(ModelLabels::learning(8));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let labels = labels.clone();
                std::thread::spawn(move || {
                    (0..2_000)
                        .map(|i| labels.label(Some(&format!("m-{t}-{i}"))))
                        .collect::<HashSet<_>>()
                })
            })
            .collect();
        let mut seen = HashSet::new();
        for t in threads {
            seen.extend(t.join().unwrap());
        }
        assert!(seen.remove(OTHER_MODEL));
        assert_eq!(seen.len(), 8);
    }

    #[test]
    fn the_cache_status_of_each_call_gives_the_hit_rate() {
        let recorder = MetricsRecorder::new();
        let debugging = DebuggingRecorder::new();
        let snapshotter = debugging.snapshotter();
        metrics::with_local_recorder(&debugging, || {
            for cache in [
                Some(CacheStatus::Hit),
                Some(CacheStatus::Hit),
                Some(CacheStatus::Miss),
                Some(CacheStatus::Bypass),
                None,
            ] {
                recorder.record(&CallRecord {
                    cache,
                    ..record("m")
                });
            }
        });
        assert_eq!(
            counters(&snapshotter, "seawall.cache", "status"),
            [
                ("bypass".to_owned(), 1),
                ("hit".to_owned(), 2),
                ("miss".to_owned(), 1)
            ]
        );
    }

    #[test]
    fn a_cache_hit_adds_no_tokens_used_and_no_server_timings() {
        let recorder = MetricsRecorder::new();
        let debugging = DebuggingRecorder::new();
        let snapshotter = debugging.snapshotter();
        let usage = seawall_core::Usage {
            input_tokens: 100,
            output_tokens: 10,
            ..Default::default()
        };
        metrics::with_local_recorder(&debugging, || {
            for cache in [
                Some(CacheStatus::Hit),
                Some(CacheStatus::Semantic(0.97)),
                Some(CacheStatus::Miss),
                None,
            ] {
                recorder.record(&CallRecord {
                    cache,
                    usage: Some(usage),
                    time_to_first_token: Some(std::time::Duration::from_millis(300)),
                    time_per_output_token: Some(std::time::Duration::from_millis(20)),
                    ..record("m")
                });
            }
        });
        let entries = snapshotter.snapshot().into_vec();
        let samples: Vec<(String, Vec<f64>)> =
            series(&entries, "gen_ai.client.token.usage", "gen_ai.token.type")
                .into_iter()
                .map(|(kind, v)| match v {
                    DebugValue::Histogram(h) => (kind, h.iter().map(|x| f64::from(*x)).collect()),
                    _ => (kind, Vec::new()),
                })
                .collect();
        // The miss and the call without a cache: two calls' tokens, not four.
        assert_eq!(
            samples,
            [
                ("input".to_owned(), vec![100.0, 100.0]),
                ("output".to_owned(), vec![10.0, 10.0])
            ]
        );
        for timing in [
            "gen_ai.server.time_to_first_token",
            "gen_ai.server.time_per_output_token",
        ] {
            let [(_, DebugValue::Histogram(h))] = &series(&entries, timing, "")[..] else {
                panic!("one series of {timing}");
            };
            assert_eq!(h.len(), 2, "{timing}: two calls' timings, not four");
        }
    }

    #[test]
    fn long_model_names_are_never_labels() {
        let recorder = MetricsRecorder::new();
        let long = "m".repeat(MAX_KEY_LEN + 1);
        let calls = calls_by_model(&run(&recorder, [long, "gpt-4o".to_owned()]));
        assert_eq!(
            calls,
            [("gpt-4o".to_owned(), 1), (OTHER_MODEL.to_owned(), 1)]
        );
    }
}
