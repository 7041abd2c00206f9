//! The observe service: opens the call's `gen_ai.call` span and hands the layers inside a
//! fresh call context to report into, so one record per logical call can be assembled.

use std::sync::Arc;
use std::task::{Context, Poll};

use seawall_core::{CallContext, LlmError, LlmRequest, LlmResponse};
use tower_service::Service;

use crate::future::{Finish, Pending, ResponseFuture};
use crate::record::{NoopRecorder, Recorder};

/// Produces one [`CallRecord`](crate::CallRecord) per logical call and fills a `tracing` span
/// named `gen_ai.call` with OpenTelemetry GenAI field names.
///
/// It puts an `Arc<`[`CallContext`]`>` into the request's extensions before calling the inner
/// service, so the layers inside (gate, retry, budget, stream, fallback) can report what they
/// know. The record is emitted when the response body ends or is dropped, when the call fails,
/// or when the caller drops the future.
#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    recorder: Arc<dyn Recorder>,
    config_version: Option<Arc<str>>,
}

impl<S> Observe<S> {
    /// Wraps `inner` with the defaults, as [`ObserveLayer::new`](crate::ObserveLayer::new)
    /// does: the `tracing` span only, no recorder.
    pub fn new(inner: S) -> Self {
        Self::from_parts(inner, Arc::new(NoopRecorder), None)
    }

    pub(crate) fn from_parts(
        inner: S,
        recorder: Arc<dyn Recorder>,
        config_version: Option<Arc<str>>,
    ) -> Self {
        Observe {
            inner,
            recorder,
            config_version,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Observe<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observe")
            .field("inner", &self.inner)
            .field("config_version", &self.config_version)
            .finish_non_exhaustive()
    }
}

impl<S, Req> Service<Req> for Observe<S>
where
    S: Service<Req>,
    S::Response: LlmResponse,
    S::Error: Into<LlmError>,
    Req: LlmRequest,
{
    type Response = <S::Response as LlmResponse>::Hooked<Finish>;
    type Error = LlmError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        req.prepare();
        // Reuses a finished call's context on this thread when there is one.
        let context = CallContext::shared();
        if let Some(ext) = req.extensions_mut() {
            ext.insert(context.clone());
        }
        let model: Option<Arc<str>> = req.model_shared();
        let span = tracing::info_span!(
            target: "seawall::observe",
            "gen_ai.call",
            "gen_ai.operation.name" = "chat",
            "gen_ai.request.model" = model.as_deref(),
            "gen_ai.response.model" = tracing::field::Empty,
            "gen_ai.response.id" = tracing::field::Empty,
            "gen_ai.usage.input_tokens" = tracing::field::Empty,
            "gen_ai.usage.output_tokens" = tracing::field::Empty,
            "http.response.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
            "seawall.outcome" = tracing::field::Empty,
            "seawall.attempts" = tracing::field::Empty,
            "seawall.queue_wait_ms" = tracing::field::Empty,
            "seawall.ttft_ms" = tracing::field::Empty,
            "seawall.tpot_ms" = tracing::field::Empty,
            "seawall.latency_ms" = tracing::field::Empty,
            "seawall.cost_usd" = tracing::field::Empty,
            "seawall.target" = tracing::field::Empty,
        );
        let pending = Pending {
            context,
            start: tokio::time::Instant::now(),
            recorder: self.recorder.clone(),
            model,
            config_version: self.config_version.clone(),
            span,
        };
        let inner = &mut self.inner;
        ResponseFuture::calling(pending, || inner.call(req))
    }
}
