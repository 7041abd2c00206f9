//! Failure classes and their default dispositions.
//!
//! Every seawall layer decides from one classification of an outcome. The class says *what*
//! went wrong; the [`Disposition`] says what the layers do about it by default: retry or not,
//! count it against a circuit breaker or not, and whether a fallback is worth trying. The
//! dispositions are plain data in a [`Dispositions`] table so a user can override one class
//! without touching the layers.

use std::fmt;

/// What went wrong with one attempt, as every seawall layer sees it.
///
/// The first group comes from the upstream (HTTP status, error body, transport); the last group
/// (`CircuitOpen` and after) is raised by seawall's own layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FailureClass {
    /// 429 rate limit (`rate_limit_exceeded`, `rate_limit_error`): back-pressure, retry after
    /// the server's hint.
    RateLimited,
    /// 429 `insufficient_quota` / `enforced_spend_limit_reached`, 402 billing or insufficient
    /// balance: retrying cannot help.
    QuotaExhausted,
    /// 503, 529 `overloaded_error`, or an overload event inside a stream.
    Overloaded,
    /// 500, 502 and other 5xx without a more specific meaning.
    ServerError,
    /// 504 or `timeout_error`: the upstream gave up, but may still bill for the work.
    UpstreamTimeout,
    /// 408 request timeout.
    RequestTimeout,
    /// 409 conflict.
    Conflict,
    /// seawall's own attempt timeout fired before the first byte of the response.
    Timeout,
    /// The connection could not be made (refused, reset, DNS) before the request was sent.
    Connect,
    /// The connection failed after the request was sent and before a response head arrived:
    /// the upstream may have processed (and billed) the request. seawall's addition to the
    /// design table; it behaves like `UpstreamTimeout`.
    Disconnected,
    /// An error or end of stream after the first body byte, without the finish marker.
    StreamInterrupted,
    /// A completed answer that holds nothing: no choices, a choice without content, tool calls
    /// or refusal, an empty Anthropic content array, or a stream that reached its finish marker
    /// without any content. A known provider glitch that a second try usually fixes; it is
    /// found before anything reaches the caller, so it can still be retried or sent to a
    /// fallback.
    EmptyResponse,
    /// 400 `context_length_exceeded`, "prompt is too long", 413 `request_too_large`; a 429
    /// "Request too large" (one request over the key's whole tokens per minute).
    ContextLengthExceeded,
    /// 400 content policy / content filter.
    ContentFiltered,
    /// Any other 400 / 422 (and unknown 4xx).
    InvalidRequest,
    /// 401.
    Authentication,
    /// 403.
    PermissionDenied,
    /// 404 (unknown model or deployment).
    NotFound,
    /// Local: a circuit breaker is open for this key.
    CircuitOpen,
    /// Local: the concurrency gate's queue is full or the wait was too long.
    GateRejected,
    /// Local: the cost budget would be crossed.
    BudgetExceeded,
    /// Local: the shared retry budget is spent.
    RetryBudgetExhausted,
    /// Local: the caller's total time budget is spent.
    DeadlineExceeded,
    /// Local: state shared by a fleet of replicas (a budget, a rate limit, permits held in
    /// Redis) could not be reached in time, and the layer is set to fail closed. Not the
    /// upstream's fault: neither retried nor counted by a breaker, and a fallback would meet
    /// the same store.
    SharedStateUnavailable,
    /// Answers that failed the caller's validation (not valid JSON, missing fields) on every
    /// turn the repair layer was allowed: the upstream answered, healthily, just not what the
    /// caller can use. Not retried (the repair turns already were the better retry: they show
    /// the model its mistake, where a plain retry asks the same question again at the same
    /// cost and the same odds), not counted by a breaker (the upstream is not sick), and no
    /// fallback by default (the repair layer sits outside the fallback, whose targets already
    /// answered the turns).
    ContentInvalid,
}

impl FailureClass {
    /// How many classes there are: the length of [`ALL`](Self::ALL) and the size of a table
    /// indexed by [`index`](Self::index).
    pub const COUNT: usize = 25;

    /// Every class, in declaration order: `ALL[c.index()] == c` for every class `c`.
    pub const ALL: [FailureClass; Self::COUNT] = [
        FailureClass::RateLimited,
        FailureClass::QuotaExhausted,
        FailureClass::Overloaded,
        FailureClass::ServerError,
        FailureClass::UpstreamTimeout,
        FailureClass::RequestTimeout,
        FailureClass::Conflict,
        FailureClass::Timeout,
        FailureClass::Connect,
        FailureClass::Disconnected,
        FailureClass::StreamInterrupted,
        FailureClass::EmptyResponse,
        FailureClass::ContextLengthExceeded,
        FailureClass::ContentFiltered,
        FailureClass::InvalidRequest,
        FailureClass::Authentication,
        FailureClass::PermissionDenied,
        FailureClass::NotFound,
        FailureClass::CircuitOpen,
        FailureClass::GateRejected,
        FailureClass::BudgetExceeded,
        FailureClass::RetryBudgetExhausted,
        FailureClass::DeadlineExceeded,
        FailureClass::SharedStateUnavailable,
        FailureClass::ContentInvalid,
    ];

    /// A stable snake_case name, for logs, metrics labels and JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailureClass::RateLimited => "rate_limited",
            FailureClass::QuotaExhausted => "quota_exhausted",
            FailureClass::Overloaded => "overloaded",
            FailureClass::ServerError => "server_error",
            FailureClass::UpstreamTimeout => "upstream_timeout",
            FailureClass::RequestTimeout => "request_timeout",
            FailureClass::Conflict => "conflict",
            FailureClass::Timeout => "timeout",
            FailureClass::Connect => "connect",
            FailureClass::Disconnected => "disconnected",
            FailureClass::StreamInterrupted => "stream_interrupted",
            FailureClass::EmptyResponse => "empty_response",
            FailureClass::ContextLengthExceeded => "context_length_exceeded",
            FailureClass::ContentFiltered => "content_filtered",
            FailureClass::InvalidRequest => "invalid_request",
            FailureClass::Authentication => "authentication",
            FailureClass::PermissionDenied => "permission_denied",
            FailureClass::NotFound => "not_found",
            FailureClass::CircuitOpen => "circuit_open",
            FailureClass::GateRejected => "gate_rejected",
            FailureClass::BudgetExceeded => "budget_exceeded",
            FailureClass::RetryBudgetExhausted => "retry_budget_exhausted",
            FailureClass::DeadlineExceeded => "deadline_exceeded",
            FailureClass::SharedStateUnavailable => "shared_state_unavailable",
            FailureClass::ContentInvalid => "content_invalid",
        }
    }

    /// Whether seawall's own layers raised this class (no upstream call produced it).
    pub const fn is_local(self) -> bool {
        matches!(
            self,
            FailureClass::CircuitOpen
                | FailureClass::GateRejected
                | FailureClass::BudgetExceeded
                | FailureClass::RetryBudgetExhausted
                | FailureClass::DeadlineExceeded
                | FailureClass::SharedStateUnavailable
        )
    }

    /// The position of this class in [`ALL`](Self::ALL), below [`COUNT`](Self::COUNT): the
    /// slot of the class in a per-class table, found without a search.
    ///
    /// ```
    /// use seawall_core::FailureClass;
    ///
    /// let mut seen = [0u32; FailureClass::COUNT];
    /// seen[FailureClass::Overloaded.index()] += 1;
    /// assert_eq!(FailureClass::ALL[FailureClass::Overloaded.index()], FailureClass::Overloaded);
    /// ```
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The default disposition of this class (the failure-class table of the README).
    pub const fn default_disposition(self) -> Disposition {
        use FailureClass::*;
        use Fallback as F;
        use RetryPolicy as R;
        let (retry, breaker, fallback) = match self {
            RateLimited => (R::Retry, false, F::Yes),
            QuotaExhausted => (R::Never, false, F::Yes),
            Overloaded | ServerError | Timeout | Connect | EmptyResponse => {
                (R::Retry, true, F::Yes)
            }
            UpstreamTimeout | Disconnected => (R::IfIdempotent, true, F::Yes),
            RequestTimeout | Conflict => (R::Retry, false, F::No),
            StreamInterrupted => (R::Never, true, F::No),
            ContextLengthExceeded => (R::Never, false, F::LargerContext),
            ContentFiltered => (R::Never, false, F::ContentPolicy),
            InvalidRequest => (R::Never, false, F::No),
            Authentication | PermissionDenied | NotFound => (R::Never, false, F::Yes),
            CircuitOpen | GateRejected => (R::Never, false, F::Yes),
            BudgetExceeded | RetryBudgetExhausted | DeadlineExceeded | SharedStateUnavailable => {
                (R::Never, false, F::No)
            }
            ContentInvalid => (R::Never, false, F::No),
        };
        Disposition {
            retry,
            counts_for_breaker: breaker,
            fallback,
        }
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a class may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryPolicy {
    /// Retry (within the retry layer's limits and budgets).
    Retry,
    /// Retry only when the request is marked idempotent: the upstream may have done (and billed)
    /// the work already.
    IfIdempotent,
    /// Never retry.
    Never,
}

/// Whether a failure of this class is worth sending to a fallback, and to which list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fallback {
    /// No fallback: the request itself is at fault.
    No,
    /// The regular fallback chain.
    Yes,
    /// Only the list of larger-context models.
    LargerContext,
    /// Only the (optional) content-policy list.
    ContentPolicy,
}

/// What the layers do by default with a failure class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Disposition {
    /// Retry, retry only if idempotent, or never.
    pub retry: RetryPolicy,
    /// Whether the failure counts against a circuit breaker.
    pub counts_for_breaker: bool,
    /// Whether, and to which list, a fallback is worth it.
    pub fallback: Fallback,
}

impl Disposition {
    /// Whether a request with the given idempotency may be retried under this disposition.
    pub const fn allows_retry(&self, idempotent: bool) -> bool {
        match self.retry {
            RetryPolicy::Retry => true,
            RetryPolicy::IfIdempotent => idempotent,
            RetryPolicy::Never => false,
        }
    }
}

/// The disposition of every class, overridable per class.
///
/// `Copy` and a few dozen bytes, so every layer holds its own copy without sharing state.
///
/// ```
/// use seawall_core::{Dispositions, FailureClass, RetryPolicy};
///
/// // Treat 409 as final in this application.
/// let mut table = Dispositions::default();
/// table.update(FailureClass::Conflict, |d| d.retry = RetryPolicy::Never);
/// assert!(!table.get(FailureClass::Conflict).allows_retry(true));
/// assert!(table.get(FailureClass::ServerError).counts_for_breaker);
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Dispositions {
    table: [Disposition; FailureClass::COUNT],
}

impl Dispositions {
    /// The defaults of the README's failure-class table.
    pub const fn new() -> Self {
        let mut table = [FailureClass::RateLimited.default_disposition(); FailureClass::COUNT];
        let mut i = 0;
        while i < table.len() {
            table[i] = FailureClass::ALL[i].default_disposition();
            i += 1;
        }
        Dispositions { table }
    }

    /// The disposition of `class`.
    pub const fn get(&self, class: FailureClass) -> Disposition {
        self.table[class.index()]
    }

    /// Replaces the disposition of `class`.
    pub fn set(&mut self, class: FailureClass, disposition: Disposition) -> &mut Self {
        self.table[class.index()] = disposition;
        self
    }

    /// Changes the disposition of `class` in place.
    pub fn update(&mut self, class: FailureClass, f: impl FnOnce(&mut Disposition)) -> &mut Self {
        f(&mut self.table[class.index()]);
        self
    }
}

impl Default for Dispositions {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Dispositions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(FailureClass::ALL.iter().map(|c| (c.as_str(), self.get(*c))))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_index_order() {
        for (i, c) in FailureClass::ALL.iter().enumerate() {
            assert_eq!(c.index(), i, "{c}");
        }
        assert_eq!(FailureClass::ALL.len(), FailureClass::COUNT);
    }

    #[test]
    fn design_table_defaults() {
        use FailureClass::*;
        let t = Dispositions::default();
        let retry = |c| t.get(c).retry;
        assert_eq!(retry(RateLimited), RetryPolicy::Retry);
        assert_eq!(retry(QuotaExhausted), RetryPolicy::Never);
        assert_eq!(retry(UpstreamTimeout), RetryPolicy::IfIdempotent);
        assert_eq!(retry(StreamInterrupted), RetryPolicy::Never);
        assert_eq!(retry(EmptyResponse), RetryPolicy::Retry);
        assert_eq!(t.get(EmptyResponse).fallback, Fallback::Yes);
        assert_eq!(retry(ContextLengthExceeded), RetryPolicy::Never);
        for c in FailureClass::ALL.into_iter().filter(|c| c.is_local()) {
            assert_eq!(retry(c), RetryPolicy::Never, "{c}");
            assert!(!t.get(c).counts_for_breaker, "{c}");
        }
        let breaker: Vec<_> = FailureClass::ALL
            .into_iter()
            .filter(|c| t.get(*c).counts_for_breaker)
            .collect();
        assert_eq!(
            breaker,
            [
                Overloaded,
                ServerError,
                UpstreamTimeout,
                Timeout,
                Connect,
                Disconnected,
                StreamInterrupted,
                EmptyResponse
            ]
        );
        assert_eq!(
            t.get(ContextLengthExceeded).fallback,
            Fallback::LargerContext
        );
        assert_eq!(t.get(InvalidRequest).fallback, Fallback::No);
        assert_eq!(t.get(CircuitOpen).fallback, Fallback::Yes);
        assert_eq!(t.get(GateRejected).fallback, Fallback::Yes);
        assert_eq!(t.get(BudgetExceeded).fallback, Fallback::No);
        assert_eq!(retry(ContentInvalid), RetryPolicy::Never);
        assert_eq!(t.get(ContentInvalid).fallback, Fallback::No);
        assert!(
            !ContentInvalid.is_local(),
            "the upstream answered every turn"
        );
        assert!(!t.get(UpstreamTimeout).allows_retry(false));
        assert!(t.get(UpstreamTimeout).allows_retry(true));
    }

    #[test]
    fn override_one_class() {
        let mut t = Dispositions::default();
        t.update(FailureClass::RateLimited, |d| d.counts_for_breaker = true);
        assert!(t.get(FailureClass::RateLimited).counts_for_breaker);
        assert_ne!(t, Dispositions::default());
        assert!(format!("{t:?}").contains("rate_limited"));
    }
}
