//! The per-call context through which layers report facts to an observer.
//!
//! An observing layer (outermost) puts an `Arc<CallContext>` into the request's extensions;
//! every inner layer that knows a fact (the gate its queue wait, the retry layer its attempts,
//! the budget the cost, the stream layer the time to first token) writes it there. When no
//! observer is stacked there is no context, and reporting is one failed extension lookup.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::class::FailureClass;
use crate::response::Usage;

/// Which fallback target answered a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedBy {
    /// The target's name (`"primary"` for the primary path).
    pub target: Arc<str>,
    /// The model that served, if known.
    pub model: Option<Arc<str>>,
    /// Whether the answer came from the last-resort cache or a static degraded response.
    pub degraded: bool,
}

/// What a cache layer did with a call: the record's `cache` field.
///
/// The cache layer puts it into the response's extensions (and into the [`CallContext`], so
/// a failed call has it too); an observer reads it without depending on the cache crate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CacheStatus {
    /// Served from the cache (or from an identical call in flight): no upstream call, no cost.
    Hit,
    /// Looked up, not found: the call went upstream (and its answer may be stored).
    Miss,
    /// Not cacheable or bypassed by policy: the call went upstream, nothing was read or stored.
    Bypass,
    /// Served from the cache for a prompt close in meaning, with the similarity score.
    Semantic(f32),
}

impl CacheStatus {
    /// The status's name: `hit`, `miss`, `bypass` or `semantic`.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "hit",
            CacheStatus::Miss => "miss",
            CacheStatus::Bypass => "bypass",
            CacheStatus::Semantic(_) => "semantic",
        }
    }

    /// Whether the answer came from the cache (exact or semantic).
    pub fn is_hit(self) -> bool {
        matches!(self, CacheStatus::Hit | CacheStatus::Semantic(_))
    }
}

impl std::fmt::Display for CacheStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CacheStatus::Semantic(score) => write!(f, "semantic({score:.3})"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// Facts about one logical call, filled by whichever layers are stacked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallFacts {
    /// Upstream attempts made (the retry layer counts; without it, 1 once a call went out).
    pub attempts: u32,
    /// Time spent waiting in a concurrency gate, summed over attempts. `None` without a gate.
    pub queue_wait: Option<Duration>,
    /// Time from the start of the final attempt to the first content.
    pub time_to_first_token: Option<Duration>,
    /// Mean time per output token after the first.
    pub time_per_output_token: Option<Duration>,
    /// Token usage reported by the upstream.
    pub usage: Option<Usage>,
    /// Cost in US dollars, as the budget layer priced it (all attempts).
    pub cost_usd: Option<f64>,
    /// Which target served the call.
    pub served_by: Option<ServedBy>,
    /// Number of fallback targets tried after the primary.
    pub fallbacks: u32,
    /// Local rejections seen on the way (gate, breaker, budget), by class.
    pub rejections: Vec<FailureClass>,
    /// What a cache layer did with the call. `None` without a cache layer.
    pub cache: Option<CacheStatus>,
    /// Follow-up requests that continued an answer cut by `max_tokens` (a continuation
    /// layer counts).
    pub continuations: u32,
    /// Follow-up requests that resumed a stream cut after its first token.
    pub resumed: u32,
}

/// The shared, per-call context. Cheap to lock: it is touched a handful of times per call.
#[derive(Debug, Default)]
pub struct CallContext {
    facts: Mutex<CallFacts>,
}

impl CallContext {
    /// A new, empty context.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` on the facts.
    pub fn update<T>(&self, f: impl FnOnce(&mut CallFacts) -> T) -> T {
        f(&mut self.lock())
    }

    /// A copy of the facts.
    pub fn snapshot(&self) -> CallFacts {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, CallFacts> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.facts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_statuses_name_themselves_and_a_semantic_hit_its_score() {
        assert_eq!(CacheStatus::Hit.to_string(), "hit");
        assert_eq!(CacheStatus::Bypass.as_str(), "bypass");
        assert_eq!(CacheStatus::Semantic(0.97).to_string(), "semantic(0.970)");
        assert!(CacheStatus::Semantic(0.97).is_hit() && !CacheStatus::Miss.is_hit());
    }

    #[test]
    fn facts_accumulate() {
        let cx = CallContext::new();
        cx.update(|f| f.attempts += 1);
        cx.update(|f| {
            *f.queue_wait.get_or_insert(Duration::ZERO) += Duration::from_millis(5);
            f.attempts += 1;
        });
        let s = cx.snapshot();
        assert_eq!(s.attempts, 2);
        assert_eq!(s.queue_wait, Some(Duration::from_millis(5)));
    }
}
