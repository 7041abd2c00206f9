//! The per-call context through which layers report facts to an observer.
//!
//! An observing layer (outermost) puts an `Arc<CallContext>` into the request's extensions;
//! every inner layer that knows a fact (the gate its queue wait, the retry layer its attempts,
//! the budget the cost, the stream layer the time to first token) writes it there. When no
//! observer is stacked there is no context, and reporting is one failed extension lookup.
//!
//! The facts sit behind a spin lock (the `spin` crate's, yielding the thread while it waits),
//! not the standard library's mutex. A call's context is locked about ten times per call, by
//! the layers of that one call, which run one after another: two of them practically never
//! hold it at once (a user reading a snapshot from another thread while the call runs is the
//! exception, and waits a few nanoseconds). The standard mutex lets go with an atomic swap, to
//! learn whether anyone sleeps on it; a spin lock lets go with a plain store. So each update
//! costs one atomic instruction instead of two, and an atomic instruction (about 7 ns where
//! these benches run) is most of what an uncontended lock costs. The layers do nothing while
//! they hold it but read or write the facts (a snapshot copies them), and
//! [`update`](CallContext::update) asks the same of a user's closure.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use spin::mutex::{SpinMutex, SpinMutexGuard};
use spin::relax::Yield;

use crate::class::FailureClass;
use crate::response::{LlmResponse, Usage};

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

    /// Whether a cache served `resp` (as it marks its responses): an answer no provider
    /// billed. A budget, a gate or a breaker stacked outside a cache counts it for nothing.
    pub fn served<T: LlmResponse>(resp: &T) -> bool {
        resp.extensions()
            .and_then(|e| e.get::<CacheStatus>())
            .is_some_and(|s| s.is_hit())
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

/// What a context guard did with a call before sending it: the record's `context_guard`
/// field.
///
/// The guard puts it into the [`CallContext`]; an observer reads it without depending on the
/// guard's crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContextAction {
    /// Not checked: the model is not in the guard's table, or the request names no model
    /// (or its body is not JSON). It went on unchanged.
    Skipped,
    /// The prompt and its maximum output fit the model's window: sent unchanged.
    Fits,
    /// Refused locally (`ContextLengthExceeded`, or `InvalidRequest` for an output bound
    /// above the model's limit): no upstream call.
    Refused,
    /// The oldest conversation turns were dropped until the request fit.
    Trimmed {
        /// Turns dropped.
        turns: u32,
    },
    /// The maximum output tokens were lowered to what fits.
    MaxTokensLowered {
        /// The bound asked for.
        from: u32,
        /// The bound sent.
        to: u32,
    },
}

impl ContextAction {
    /// The action's name: `skipped`, `fits`, `refused`, `trimmed` or `max_tokens_lowered`.
    pub fn as_str(self) -> &'static str {
        match self {
            ContextAction::Skipped => "skipped",
            ContextAction::Fits => "fits",
            ContextAction::Refused => "refused",
            ContextAction::Trimmed { .. } => "trimmed",
            ContextAction::MaxTokensLowered { .. } => "max_tokens_lowered",
        }
    }

    /// Whether the guard changed or stopped the request.
    pub fn acted(self) -> bool {
        !matches!(self, ContextAction::Skipped | ContextAction::Fits)
    }

    /// Notes `self` in a call's facts: an action that changed or stopped the request replaces
    /// what is there; `fits` and `skipped` only fill an empty field.
    pub fn note(self, facts: &mut CallFacts) {
        if self.acted() || facts.context_guard.is_none() {
            facts.context_guard = Some(self);
        }
    }
}

impl std::fmt::Display for ContextAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ContextAction::Trimmed { turns } => write!(f, "trimmed({turns})"),
            ContextAction::MaxTokensLowered { from, to } => {
                write!(f, "max_tokens_lowered({from}->{to})")
            }
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
    /// Repair turns sent after answers that failed validation (the repair layer counts; 0
    /// without it).
    pub repairs: u32,
    /// What a context guard did with the call. `None` without a guard. A guard runs once per
    /// fallback target, so [`ContextAction::note`] keeps the telling decision: a refusal, a
    /// trim or a lowering is kept over a later `fits` (the primary was refused, the
    /// larger-context fallback fit: the record says `refused` and `fallback`).
    pub context_guard: Option<ContextAction>,
    /// Follow-up requests that continued an answer cut by `max_tokens` (a continuation
    /// layer counts).
    pub continuations: u32,
    /// Follow-up requests that resumed a stream cut after its first token.
    pub resumed: u32,
    /// Streams cut while a continuation layer still held their first tokens back, asked again
    /// from the start (nothing of them had reached the caller).
    pub restarts: u32,
}

/// Contexts each thread keeps for reuse (a few: the calls finishing on it between two new ones).
const RECYCLED_PER_THREAD: usize = 4;

thread_local! {
    /// Contexts of finished calls, which [`CallContext::shared`] reuses once no one else holds them.
    static RECYCLED: RefCell<Vec<Arc<CallContext>>> = const { RefCell::new(Vec::new()) };
}

/// The shared, per-call context. Cheap to lock: it is touched a handful of times per call.
#[derive(Debug, Default)]
pub struct CallContext {
    facts: SpinMutex<CallFacts, Yield>,
}

impl CallContext {
    /// A new, empty context.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` on the facts, under the context's spin lock: keep `f` to reading and writing
    /// them (another thread that wants the lock meanwhile spins and yields until `f` returns).
    pub fn update<T>(&self, f: impl FnOnce(&mut CallFacts) -> T) -> T {
        f(&mut self.lock())
    }

    /// A copy of the facts.
    pub fn snapshot(&self) -> CallFacts {
        self.lock().clone()
    }

    /// A new, empty context behind an `Arc`, for an observing layer to put into a request.
    ///
    /// It reuses the allocation of a context a finished call on this thread gave back with
    /// [`recycle`](Self::recycle) once nothing else holds it, so a steady stream of calls
    /// allocates none. The context is as empty as [`new`](Self::new)'s.
    pub fn shared() -> Arc<CallContext> {
        RECYCLED
            .try_with(|r| {
                let mut r = r.borrow_mut();
                // Only a context no one else holds: the layers' bodies and hooks that shared
                // it are gone, so no one can see it being emptied and handed out again. It is
                // emptied where it is found: each check that no one else holds it is an
                // atomic instruction.
                let i = r.iter_mut().position(|cx| {
                    match Arc::get_mut(cx).map(|c| c.facts.get_mut()) {
                        Some(facts) => {
                            *facts = CallFacts::default();
                            true
                        }
                        None => false,
                    }
                })?;
                Some(r.swap_remove(i))
            })
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    /// Gives a finished call's context back for [`shared`](Self::shared) to reuse once nothing
    /// else holds it (the inner layers' bodies and hooks may still hold it while the call's
    /// record is written; a user's clone keeps it alive and unchanged). Each thread keeps the
    /// last few; an older one is dropped for a newer one.
    pub fn recycle(this: Arc<CallContext>) {
        let _ = RECYCLED.try_with(|r| {
            let mut r = r.borrow_mut();
            if r.len() >= RECYCLED_PER_THREAD {
                r.remove(0);
            }
            r.push(this);
        });
    }

    fn lock(&self) -> SpinMutexGuard<'_, CallFacts> {
        self.facts.lock()
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
    fn a_guard_action_names_itself_and_fits_never_hides_a_refusal() {
        assert_eq!(
            ContextAction::Trimmed { turns: 3 }.to_string(),
            "trimmed(3)"
        );
        let lowered = ContextAction::MaxTokensLowered { from: 9, to: 4 };
        assert_eq!(lowered.to_string(), "max_tokens_lowered(9->4)");
        let mut f = CallFacts::default();
        ContextAction::Refused.note(&mut f);
        ContextAction::Fits.note(&mut f);
        assert_eq!(f.context_guard, Some(ContextAction::Refused));
        lowered.note(&mut f);
        assert_eq!(f.context_guard, Some(lowered));
        let mut f = CallFacts::default();
        ContextAction::Skipped.note(&mut f);
        ContextAction::Fits.note(&mut f);
        assert_eq!(f.context_guard, Some(ContextAction::Skipped));
    }

    #[test]
    fn a_recycled_context_comes_back_empty_and_a_held_one_is_not_reused() {
        let cx = CallContext::shared();
        cx.update(|f| {
            f.attempts = 3;
            f.rejections.push(FailureClass::GateRejected);
        });
        let ptr = Arc::as_ptr(&cx);
        // Given back while an inner body still holds it: not reused until that is gone.
        let inner = Arc::clone(&cx);
        CallContext::recycle(cx);
        let other = CallContext::shared();
        assert_ne!(Arc::as_ptr(&other), ptr);
        assert_eq!(inner.snapshot().attempts, 3);
        drop(inner);
        let again = CallContext::shared();
        assert_eq!(Arc::as_ptr(&again), ptr);
        assert_eq!(again.snapshot(), CallFacts::default());
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

    /// Threads updating and reading one context at once: no update is lost, and a snapshot
    /// never sees a half-made one (the two fields move together under the lock).
    #[test]
    fn updates_from_several_threads_at_once_are_all_kept() {
        const THREADS: u32 = 4;
        const EACH: u32 = 5_000;
        let cx = Arc::new(CallContext::new());
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                let cx = &cx;
                s.spawn(move || {
                    for _ in 0..EACH {
                        cx.update(|f| {
                            f.attempts += 1;
                            f.repairs += 1;
                        });
                        let seen = cx.snapshot();
                        assert_eq!(seen.attempts, seen.repairs);
                    }
                });
            }
        });
        let s = cx.snapshot();
        assert_eq!((s.attempts, s.repairs), (THREADS * EACH, THREADS * EACH));
    }
}
