//! What happens after `call`: the response future waits for the head, then a body-end hook
//! emits the call's one record (and fills its span), or a drop guard emits it as a
//! cancellation when the caller goes away first.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use seawall_core::{
    CacheStatus, CallContext, CallFacts, Completion, ContextAction, FailureClass, LlmError,
    LlmResponse, OnComplete, Outcome, ServedBy,
};

use crate::record::{CallOutcome, CallRecord, Recorder};

/// What a call carries from `call` to its record.
pub(crate) struct Pending {
    pub(crate) context: Arc<CallContext>,
    pub(crate) start: tokio::time::Instant,
    pub(crate) recorder: Arc<dyn Recorder>,
    pub(crate) model: Option<Arc<str>>,
    pub(crate) config_version: Option<Arc<str>>,
    pub(crate) span: tracing::Span,
}

/// What the response head told us, kept until the body ends.
#[derive(Default)]
struct Head {
    status: Option<u16>,
    request_id: Option<String>,
    served_by: Option<ServedBy>,
    /// The model the response names, kept only when it has no body report: with one, the
    /// record reads the model from the report the completion hands over, and the name does
    /// not ride in the body (every layer above moves it).
    served_model: Option<Arc<str>>,
    error_attempts: u32,
    cache: Option<CacheStatus>,
}

/// How the call failed, known only when it does: not kept in the head, which rides in the body.
struct Failure {
    class: FailureClass,
    code: Option<String>,
}

impl Failure {
    fn of(e: &LlmError) -> Failure {
        Failure {
            class: e.class(),
            code: e.code().map(str::to_owned),
        }
    }
}

impl Pending {
    fn finish(
        self,
        head: Head,
        outcome: CallOutcome,
        failure: Option<Failure>,
        completion: Option<&Completion<'_>>,
    ) {
        let class = failure.as_ref().map(|f| f.class);
        let mut facts: CallFacts = self.context.snapshot();
        let report = completion.and_then(|c| c.report);
        // Taken apart, not copied again: the snapshot is this call's own (each copy of a
        // shared name is an atomic write, and so is each drop).
        let served_by = facts.served_by.take().or(head.served_by);
        let fallback =
            facts.fallbacks > 0 || served_by.as_ref().is_some_and(|s| &*s.target != "primary");
        let degraded = served_by.as_ref().is_some_and(|s| s.degraded);
        let (target, served_model) = match served_by {
            Some(s) => (Some(s.target), s.model),
            None => (None, None),
        };
        let served_model = served_model
            .or_else(|| {
                report
                    .and_then(|r| r.model())
                    .map(seawall_core::shared_name)
            })
            .or(head.served_model)
            .or_else(|| self.model.clone())
            // The upstream named it: shown without a credential it may hold.
            .map(seawall_core::redact_shared);
        let usage = completion.and_then(|c| c.usage).or(facts.usage);
        let cache = facts.cache.or(head.cache);
        let hit = cache.is_some_and(CacheStatus::is_hit);
        let attempts = if facts.attempts > 0 {
            facts.attempts
        } else if head.error_attempts > 0 {
            head.error_attempts
        } else if hit
            || class.is_some_and(FailureClass::is_local)
            || refused_by_guard(&facts, class)
        {
            0
        } else {
            // Without a retry layer to count them, each repair turn and each follow-up of a
            // continuation layer is one more call.
            1 + facts.repairs + facts.continuations + facts.resumed + facts.restarts
        };
        let record = CallRecord {
            request_id: head.request_id,
            model: self.model,
            served_model,
            target,
            outcome,
            status: head.status,
            class,
            error_code: failure.and_then(|f| f.code),
            usage,
            cost_usd: facts.cost_usd,
            attempts,
            queue_wait: facts.queue_wait,
            time_to_first_token: facts
                .time_to_first_token
                .or_else(|| report?.time_to_first_token()),
            time_per_output_token: facts
                .time_per_output_token
                .or_else(|| report?.time_per_output_token()),
            latency: self.start.elapsed(),
            fallback,
            degraded,
            cache,
            config_version: self.config_version,
            repairs: facts.repairs,
            context_guard: facts.context_guard,
            continuations: facts.continuations,
            resumed: facts.resumed,
            restarts: facts.restarts,
        };
        fill_span(&self.span, &record);
        self.recorder.record(&record);
        // Recorded: the context goes back for the next call (if nothing else holds it).
        CallContext::recycle(self.context);
    }
}

/// A call the context guard refused: it failed with the guard's class and made no attempt.
fn refused_by_guard(facts: &CallFacts, class: Option<FailureClass>) -> bool {
    facts.context_guard == Some(ContextAction::Refused)
        && matches!(
            class,
            Some(FailureClass::ContextLengthExceeded | FailureClass::InvalidRequest)
        )
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn fill_span(span: &tracing::Span, r: &CallRecord) {
    if span.is_disabled() {
        return;
    }
    span.record("seawall.outcome", tracing::field::debug(r.outcome));
    span.record("seawall.attempts", r.attempts);
    span.record("seawall.latency_ms", ms(r.latency));
    if let Some(m) = &r.served_model {
        span.record("gen_ai.response.model", &**m);
    }
    if let Some(id) = &r.request_id {
        span.record("gen_ai.response.id", id.as_str());
    }
    if let Some(s) = r.status {
        span.record("http.response.status_code", s);
    }
    if let Some(c) = r.class {
        span.record("error.type", c.as_str());
    }
    if let Some(u) = r.usage {
        span.record("gen_ai.usage.input_tokens", u.input_tokens);
        span.record("gen_ai.usage.output_tokens", u.output_tokens);
    }
    if let Some(q) = r.queue_wait {
        span.record("seawall.queue_wait_ms", ms(q));
    }
    if let Some(t) = r.time_to_first_token {
        span.record("seawall.ttft_ms", ms(t));
    }
    if let Some(t) = r.time_per_output_token {
        span.record("seawall.tpot_ms", ms(t));
    }
    if let Some(c) = r.cost_usd {
        span.record("seawall.cost_usd", c);
    }
    if let Some(t) = &r.target {
        span.record("seawall.target", &**t);
    }
}

/// The hook that emits the record when the response body is done.
pub struct Finish {
    pending: Pending,
    head: Head,
}

impl std::fmt::Debug for Finish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Finish").finish_non_exhaustive()
    }
}

impl OnComplete for Finish {
    fn on_complete(self, completion: Completion<'_>) {
        let (outcome, failure) = match completion.outcome {
            Outcome::Complete => (CallOutcome::Success, None),
            Outcome::Failed(e) => (
                CallOutcome::Interrupted,
                Some(e.map_or(
                    Failure {
                        class: FailureClass::StreamInterrupted,
                        code: None,
                    },
                    Failure::of,
                )),
            ),
            Outcome::Dropped => (CallOutcome::Cancelled, None),
        };
        self.pending
            .finish(self.head, outcome, failure, Some(&completion));
    }
}

/// The upstream's request id, as a record shows it (bounded, credentials redacted: the
/// header is the upstream's input).
fn request_id(headers: Option<&http::HeaderMap>) -> Option<String> {
    seawall_core::request_id(headers?).map(|id| seawall_core::shown_id(id).into_string())
}

pin_project_lite::pin_project! {
    /// Response future of [`Observe`](crate::Observe).
    pub struct ResponseFuture<F> {
        // Fields drop in declaration order: the inner future (and the guards of the layers
        // inside it, which write their part of the call facts) goes before the record is made.
        #[pin]
        inner: F,
        pending: Unfinished,
    }
}

/// The call's record until the response head arrives. Dropped before that, the caller went
/// away: still one record, a cancellation.
struct Unfinished(Option<Pending>);

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            p.finish(Head::default(), CallOutcome::Cancelled, None, None);
        }
    }
}

impl<F> ResponseFuture<F> {
    /// The future of `call`, which runs inside the record's span. Called here, in the struct
    /// it is kept in, the inner future (the whole stack's, a few kilobytes) is written in place
    /// rather than built apart and copied in.
    pub(crate) fn calling(pending: Pending, call: impl FnOnce() -> F) -> Self {
        ResponseFuture {
            inner: pending.span.in_scope(call),
            pending: Unfinished(Some(pending)),
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, R, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<R, E>>,
    R: LlmResponse,
    E: Into<LlmError>,
{
    type Output = Result<R::Hooked<Finish>, LlmError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if this.pending.0.is_none() {
            seawall_core::polled_after_completion();
        }
        let polled = {
            let _enter = this.pending.0.as_ref().map(|p| p.span.enter());
            this.inner.poll(cx)
        };
        // Each outcome handled where it lands: every move of a response is a copy.
        match polled {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(resp)) => {
                let Some(pending) = this.pending.0.take() else {
                    seawall_core::polled_after_completion();
                };
                let head = Head {
                    status: resp.status().map(|s| s.as_u16()),
                    request_id: request_id(resp.headers()),
                    // Only when the context lacks one: a fallback layer writes the same into
                    // the context, which the record takes first, and a copy is two shared
                    // names (an atomic write each, and one for each drop).
                    served_by: resp
                        .extensions()
                        .and_then(|e| e.get::<ServedBy>())
                        .filter(|_| !pending.context.update(|f| f.served_by.is_some()))
                        .cloned(),
                    served_model: resp
                        .body_report()
                        .is_none()
                        .then(|| resp.served_model().map(seawall_core::shared_name))
                        .flatten(),
                    cache: resp
                        .extensions()
                        .and_then(|e| e.get::<CacheStatus>())
                        .copied(),
                    ..Head::default()
                };
                Poll::Ready(Ok(resp.on_complete(Finish { pending, head })))
            }
            Poll::Ready(Err(e)) => {
                let Some(pending) = this.pending.0.take() else {
                    seawall_core::polled_after_completion();
                };
                let e: LlmError = e.into();
                let head = Head {
                    status: e.status().map(|s| s.as_u16()),
                    request_id: e.request_id().map(str::to_owned),
                    error_attempts: if e.attempts().is_empty() {
                        0
                    } else {
                        e.attempts().len() as u32 + 1
                    },
                    ..Head::default()
                };
                pending.finish(head, CallOutcome::Failed, Some(Failure::of(&e)), None);
                Poll::Ready(Err(e))
            }
        }
    }
}
