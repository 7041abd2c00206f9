//! The [`ContextGuard`] service, and the check it makes before each call.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Request;
use seawall_core::{ContextAction, FailureClass, LlmError, LlmRequest};
use tower_service::Service;

use crate::estimate::{CharEstimate, TokenEstimator};
use crate::future::ResponseFuture;
use crate::policy::ContextPolicy;
use crate::trim;
use crate::windows::{ContextWindows, ModelLimits};

/// What every clone of one layer's services shares: the table, the estimator, the policy.
pub(crate) struct Guard {
    pub(crate) windows: ContextWindows,
    pub(crate) estimator: Arc<dyn TokenEstimator>,
    pub(crate) policy: ContextPolicy,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("models", &self.windows.len())
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Guard {
    pub(crate) fn new(windows: ContextWindows) -> Self {
        Guard {
            windows,
            estimator: Arc::new(CharEstimate::new()),
            policy: ContextPolicy::Refuse,
        }
    }

    /// Checks `req` against its model's limits, and rewrites it as the policy says; an error
    /// is the refusal to send it.
    pub(crate) fn check(&self, req: &mut Request<Bytes>) -> Result<ContextAction, LlmError> {
        let asked = req.prepared().sizes.max_output_tokens;
        let Some(limits) = req.model().and_then(|m| self.windows.get(m)) else {
            return Ok(ContextAction::Skipped);
        };
        let mut out = asked;
        if let (Some(o), Some(limit)) = (asked, limits.max_output()) {
            if o > limit {
                match self.policy {
                    ContextPolicy::LowerMaxTokens { .. } => out = Some(limit),
                    _ => return Err(output_too_large(req, o, limit)),
                }
            }
        }
        let prompt = self.estimator.prompt_tokens(req);
        // Without an output bound the answer needs room for one token at least.
        let reserve = out.map_or(1, u64::from);
        if prompt <= limits.input_room(reserve) {
            return match (asked, out) {
                (Some(from), Some(to)) if to < from => lower(req, from, to, prompt, &limits),
                _ => Ok(ContextAction::Fits),
            };
        }
        match self.policy {
            ContextPolicy::Refuse => Err(too_long(req, prompt, out, &limits)),
            ContextPolicy::TrimOldest => {
                let estimator = &self.estimator;
                let fits =
                    |c: &Request<Bytes>| estimator.prompt_tokens(c) <= limits.input_room(reserve);
                match trim::trim_oldest(req, fits) {
                    Some(turns) => Ok(ContextAction::Trimmed { turns }),
                    None => Err(too_long(req, prompt, out, &limits)),
                }
            }
            ContextPolicy::LowerMaxTokens { floor } => {
                let (Some(from), Some(o)) = (asked, out) else {
                    return Err(too_long(req, prompt, out, &limits));
                };
                // The room the prompt leaves for output, if the prompt fits at all.
                let room = u64::from(limits.context()).saturating_sub(prompt);
                let prompt_fits = limits.input_room(0) >= prompt;
                let to = u32::try_from(room.min(u64::from(o))).unwrap_or(o);
                if !prompt_fits || to == 0 || to < floor.min(o) {
                    return Err(too_long(req, prompt, out, &limits));
                }
                lower(req, from, to, prompt, &limits)
            }
        }
    }
}

/// Lowers the request's output bound from `from` to `to`, or refuses it if its body cannot be
/// rewritten.
fn lower(
    req: &mut Request<Bytes>,
    from: u32,
    to: u32,
    prompt: u64,
    limits: &ModelLimits,
) -> Result<ContextAction, LlmError> {
    if trim::lower_max_tokens(req, to) {
        Ok(ContextAction::MaxTokensLowered { from, to })
    } else {
        Err(too_long(req, prompt, Some(from), limits))
    }
}

fn model(req: &Request<Bytes>) -> &str {
    req.model().unwrap_or("the model")
}

/// The refusal of a request too long for its model: `ContextLengthExceeded`, as the upstream
/// would have answered after a round trip.
fn too_long(req: &Request<Bytes>, prompt: u64, out: Option<u32>, limits: &ModelLimits) -> LlmError {
    let output = out.map_or_else(String::new, |o| format!(" plus {o} output tokens"));
    let input = match limits.max_input() {
        Some(m) => format!(" (at most {m} of them prompt)"),
        None => String::new(),
    };
    LlmError::new(
        FailureClass::ContextLengthExceeded,
        format!(
            "a prompt of about {prompt} tokens{output} does not fit {}'s context window of {} tokens{input}; refused before sending",
            model(req),
            limits.context(),
        ),
    )
    .with_code("context_length_exceeded")
}

/// The refusal of an output bound above the model's limit: `InvalidRequest`, as the upstream
/// answers it (a larger-context model would not help).
fn output_too_large(req: &Request<Bytes>, asked: u32, limit: u32) -> LlmError {
    LlmError::new(
        FailureClass::InvalidRequest,
        format!(
            "max_tokens {asked} is above {}'s output limit of {limit} tokens; refused before sending",
            model(req)
        ),
    )
    .with_code("max_tokens_too_large")
}

/// Checks each request against its model's context window before it is sent, and refuses,
/// trims or lowers its output bound as the [`ContextPolicy`] says. Made by
/// [`ContextGuardLayer`](crate::ContextGuardLayer).
#[derive(Clone, Debug)]
pub struct ContextGuard<S> {
    inner: S,
    guard: Arc<Guard>,
}

impl<S> ContextGuard<S> {
    /// Wraps `inner` with a guard over `windows` with the defaults, as
    /// [`ContextGuardLayer::new`](crate::ContextGuardLayer::new) does: refuse what does not
    /// fit, counted by the [`CharEstimate`].
    pub fn new(inner: S, windows: ContextWindows) -> Self {
        ContextGuard::from_shared(inner, Arc::new(Guard::new(windows)))
    }

    pub(crate) fn from_shared(inner: S, guard: Arc<Guard>) -> Self {
        ContextGuard { inner, guard }
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

impl<S> Service<Request<Bytes>> for ContextGuard<S>
where
    S: Service<Request<Bytes>>,
    S::Error: Into<LlmError>,
{
    type Response = S::Response;
    type Error = LlmError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<Bytes>) -> Self::Future {
        let checked = self.guard.check(&mut req);
        let action = checked.as_ref().map_or(ContextAction::Refused, |a| *a);
        if let Some(cx) = req.call_context() {
            cx.update(|f| action.note(f));
        }
        match checked {
            Ok(action) => {
                if action.acted() {
                    tracing::debug!(target: "seawall::guard", %action, "request rewritten to fit its context window");
                }
                ResponseFuture::called(self.inner.call(req))
            }
            Err(e) => {
                tracing::debug!(target: "seawall::guard", error = %e, "request refused before sending");
                ResponseFuture::refused(e)
            }
        }
    }
}
