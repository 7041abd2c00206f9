//! An in-memory summary: latency percentiles, retry rate, error rate by class, cost.
//!
//! Latencies go into HDR histograms rather than a list: memory stays bounded however many calls
//! are recorded, recording is a counter increment, and a report reads percentiles from bucket
//! counts instead of sorting every latency while the recorders wait on the lock. The price is
//! precision: a reported percentile is within 0.1 % of the exact one (three significant
//! figures), which is far below the noise of an LLM call's latency.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use seawall_core::FailureClass;

use crate::record::{CallOutcome, CallRecord, Recorder};

/// Significant figures kept by the latency histograms: 0.1 % relative precision.
const SIGNIFICANT_FIGURES: u8 = 3;

/// A latency histogram in microseconds. It grows to the largest value seen, so its size
/// depends on the range of latencies, never on the number of calls.
fn histogram() -> Histogram<u64> {
    Histogram::new(SIGNIFICANT_FIGURES).expect("3 significant figures is a valid histogram")
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    if h.record(micros).is_err() {
        // Beyond what an auto-resizing histogram can track (about 146,000 years): clamp.
        h.saturating_record(micros);
    }
}

#[derive(Debug)]
struct Acc {
    latencies: Histogram<u64>,
    ttfts: Histogram<u64>,
    calls: u64,
    attempts: u64,
    failures: BTreeMap<FailureClass, u64>,
    interrupted: u64,
    cancelled: u64,
    fallbacks: u64,
    cost_usd: f64,
}

impl Default for Acc {
    fn default() -> Self {
        Self {
            latencies: histogram(),
            ttfts: histogram(),
            calls: 0,
            attempts: 0,
            failures: BTreeMap::new(),
            interrupted: 0,
            cancelled: 0,
            fallbacks: 0,
            cost_usd: 0.0,
        }
    }
}

/// Collects records and summarises them on demand, in memory bounded by the range of the
/// latencies (not by the number of calls), with percentiles precise to 0.1 %. For a
/// production stream that is scraped and aggregated elsewhere, use
/// [`MetricsRecorder`](crate::MetricsRecorder).
#[derive(Debug, Default)]
pub struct Summary {
    acc: Mutex<Acc>,
}

/// A summary of the calls recorded so far.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryReport {
    /// Logical calls.
    pub calls: u64,
    /// Calls answered in full.
    pub successes: u64,
    /// Latency percentiles (P50, P95, P99) over all calls.
    pub latency: [Duration; 3],
    /// Time-to-first-token percentiles (P50, P95, P99) over calls that had one.
    pub ttft: Option<[Duration; 3]>,
    /// Retries per call.
    pub retry_rate: f64,
    /// Upstream attempts per logical call.
    pub attempts_per_call: f64,
    /// Failed calls per class, as a share of all calls.
    pub error_rate_by_class: Vec<(FailureClass, f64)>,
    /// Share of calls whose stream broke after it began.
    pub interrupted_rate: f64,
    /// Calls answered by a fallback.
    pub fallbacks: u64,
    /// Total cost in US dollars.
    pub cost_usd: f64,
}

/// The `q` quantile (0..=1) of sorted values, nearest-rank.
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// P50, P95 and P99, nearest-rank like [`percentile`], each the low end of its histogram
/// bucket: never above the exact value, and at most 0.1 % (or, below a millisecond, 1 µs)
/// below it.
fn p3(h: &Histogram<u64>) -> [Duration; 3] {
    if h.is_empty() {
        return [Duration::ZERO; 3];
    }
    [0.50, 0.95, 0.99].map(|q| Duration::from_micros(h.lowest_equivalent(h.value_at_quantile(q))))
}

impl Summary {
    /// An empty summary.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Acc> {
        self.acc.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The summary of everything recorded so far.
    pub fn report(&self) -> SummaryReport {
        let a = self.lock();
        let calls = a.calls.max(1) as f64;
        let failed: u64 = a.failures.values().sum();
        SummaryReport {
            calls: a.calls,
            successes: a.calls - failed - a.interrupted - a.cancelled,
            latency: p3(&a.latencies),
            ttft: (!a.ttfts.is_empty()).then(|| p3(&a.ttfts)),
            retry_rate: a.attempts.saturating_sub(a.calls) as f64 / calls,
            attempts_per_call: a.attempts as f64 / calls,
            error_rate_by_class: a
                .failures
                .iter()
                .map(|(c, n)| (*c, *n as f64 / calls))
                .collect(),
            interrupted_rate: a.interrupted as f64 / calls,
            fallbacks: a.fallbacks,
            cost_usd: a.cost_usd,
        }
    }
}

impl Recorder for Summary {
    fn record(&self, r: &CallRecord) {
        let mut a = self.lock();
        a.calls += 1;
        a.attempts += u64::from(r.attempts);
        record(&mut a.latencies, r.latency);
        if let Some(t) = r.time_to_first_token {
            record(&mut a.ttfts, t);
        }
        match (r.outcome, r.class) {
            (CallOutcome::Failed, Some(c)) => *a.failures.entry(c).or_default() += 1,
            (CallOutcome::Interrupted, _) => a.interrupted += 1,
            (CallOutcome::Cancelled, _) => a.cancelled += 1,
            _ => {}
        }
        a.fallbacks += u64::from(r.fallback);
        a.cost_usd += r.cost_usd.unwrap_or(0.0);
    }
}

impl fmt::Display for SummaryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        writeln!(
            f,
            "calls {}  success {:.2}%  retries/call {:.3}  attempts/call {:.3}  fallbacks {}  cost ${:.4}",
            self.calls,
            100.0 * self.successes as f64 / self.calls.max(1) as f64,
            self.retry_rate,
            self.attempts_per_call,
            self.fallbacks,
            self.cost_usd
        )?;
        writeln!(
            f,
            "latency ms  p50 {:.1}  p95 {:.1}  p99 {:.1}",
            ms(self.latency[0]),
            ms(self.latency[1]),
            ms(self.latency[2])
        )?;
        if let Some(t) = self.ttft {
            writeln!(
                f,
                "ttft ms     p50 {:.1}  p95 {:.1}  p99 {:.1}",
                ms(t[0]),
                ms(t[1]),
                ms(t[2])
            )?;
        }
        if self.interrupted_rate > 0.0 {
            writeln!(
                f,
                "interrupted streams {:.2}%",
                100.0 * self.interrupted_rate
            )?;
        }
        for (c, r) in &self.error_rate_by_class {
            writeln!(f, "errors {c:<24} {:.2}%", 100.0 * r)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn call(latency: Duration, ttft: Option<Duration>) -> CallRecord {
        CallRecord {
            latency,
            time_to_first_token: ttft,
            ..crate::record::success()
        }
    }

    /// `reported` is the exact value rounded down by at most the histogram's precision.
    fn within_precision(reported: Duration, exact: Duration) -> bool {
        reported <= exact && exact - reported <= exact / 1000 + Duration::from_micros(1)
    }

    proptest! {
        #[test]
        fn percentiles_are_within_the_histograms_precision(
            nanos in proptest::collection::vec(0u64..3_600_000_000_000, 1..400),
            ttft_every in 1usize..5,
        ) {
            let summary = Summary::new();
            let mut latencies = Vec::new();
            let mut ttfts = Vec::new();
            for (i, n) in nanos.iter().enumerate() {
                let latency = Duration::from_nanos(*n);
                let ttft = (i % ttft_every == 0).then_some(latency / 2);
                summary.record(&call(latency, ttft));
                latencies.push(latency);
                ttfts.extend(ttft);
            }
            latencies.sort_unstable();
            ttfts.sort_unstable();
            let report = summary.report();
            let ttft = report.ttft.expect("the first call has a time to first token");
            for (i, q) in [0.50, 0.95, 0.99].into_iter().enumerate() {
                let exact = percentile(&latencies, q);
                prop_assert!(within_precision(report.latency[i], exact), "latency p{q}: {:?} vs {exact:?}", report.latency[i]);
                let exact = percentile(&ttfts, q);
                prop_assert!(within_precision(ttft[i], exact), "ttft p{q}: {:?} vs {exact:?}", ttft[i]);
            }
        }
    }

    #[test]
    fn memory_does_not_grow_with_the_number_of_calls() {
        let summary = Summary::new();
        let mut size_after = Vec::new();
        for round in 0..3 {
            for i in 0..10_000u64 {
                summary.record(&call(Duration::from_micros(1 + i * 997 % 5_000_000), None));
            }
            size_after.push((round, summary.lock().latencies.distinct_values()));
        }
        assert_eq!(summary.report().calls, 30_000);
        // The same range of latencies occupies the same buckets however many calls fall in them.
        assert_eq!(size_after[1].1, size_after[2].1);
    }

    #[test]
    fn an_empty_summary_reports_zeros() {
        let report = Summary::new().report();
        assert_eq!(report.calls, 0);
        assert_eq!(report.latency, [Duration::ZERO; 3]);
        assert_eq!(report.ttft, None);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.5), Duration::from_millis(50));
        assert_eq!(percentile(&v, 0.95), Duration::from_millis(95));
        assert_eq!(percentile(&v, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&v, 1.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }
}
