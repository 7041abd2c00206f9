//! An in-memory summary: latency percentiles, retry rate, error rate by class, cost.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use seawall_core::FailureClass;

use crate::record::{CallOutcome, CallRecord, Recorder};

#[derive(Debug, Default)]
struct Acc {
    latencies: Vec<Duration>,
    ttfts: Vec<Duration>,
    calls: u64,
    attempts: u64,
    failures: BTreeMap<FailureClass, u64>,
    interrupted: u64,
    cancelled: u64,
    fallbacks: u64,
    cost_usd: f64,
}

/// Collects records and summarises them on demand. Keeps one latency per call: meant for
/// demos, tests and batch jobs, not for an unbounded production stream (use
/// [`MetricsRecorder`](crate::MetricsRecorder) there).
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

fn p3(mut v: Vec<Duration>) -> [Duration; 3] {
    v.sort_unstable();
    [
        percentile(&v, 0.50),
        percentile(&v, 0.95),
        percentile(&v, 0.99),
    ]
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
            latency: p3(a.latencies.clone()),
            ttft: (!a.ttfts.is_empty()).then(|| p3(a.ttfts.clone())),
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
        a.latencies.push(r.latency);
        if let Some(t) = r.time_to_first_token {
            a.ttfts.push(t);
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
