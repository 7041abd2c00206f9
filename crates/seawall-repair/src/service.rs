//! The [`Repair`] service: decides, per request, whether its answer is validated (a
//! non-streamed POST to Chat Completions or Messages asking for one answer), and hands the
//! rest to the response future.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use seawall_core::{BoxError, LlmError, LlmRequest};
use tower_service::Service;

use crate::answer::{Answer, Wire};
use crate::body::RepairBody;
use crate::future::ResponseFuture;
use crate::layer::{RepairLayer, Shared};

/// Validates complete answers and, when one fails, sends repair turns through the inner
/// service. Made by [`RepairLayer`].
#[derive(Clone)]
pub struct Repair<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Repair<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repair")
            .field("inner", &self.inner)
            .field("max_repairs", &self.shared.max_repairs)
            .finish_non_exhaustive()
    }
}

impl<S> Repair<S> {
    /// Wraps `inner` with `validator` and the defaults, as [`RepairLayer::new`] does.
    pub fn new<F>(inner: S, validator: F) -> Self
    where
        F: Fn(&Answer<'_>) -> Result<(), String> + Send + Sync + 'static,
    {
        Repair::from_shared(inner, RepairLayer::new(validator).shared().clone())
    }

    pub(crate) fn from_shared(inner: S, shared: Arc<Shared>) -> Self {
        Repair { inner, shared }
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

/// The wire format of a request whose answer is validated, or `None` to pass it through.
fn plan(req: &Request<Bytes>) -> Option<Wire> {
    if req.method() != http::Method::POST || req.is_streaming() || req.choices() > 1 {
        return None;
    }
    Wire::of(req)
}

impl<S, B> Service<Request<Bytes>> for Repair<S>
where
    S: Service<Request<Bytes>, Response = Response<B>> + Clone,
    S::Error: Into<LlmError>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Response = Response<RepairBody<B>>;
    type Error = LlmError;
    type Future = ResponseFuture<S, S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<Bytes>) -> Self::Future {
        req.prepare();
        let Some(wire) = plan(&req) else {
            return ResponseFuture::pass(self.inner.call(req));
        };
        // The ready service makes this call and stays with the future for the repair turns
        // (driven ready again there); a clone takes its place, as tower's retry does.
        let clone = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, clone);
        let original = req.clone();
        let first = ready.call(req);
        ResponseFuture::validate(first, ready, original, wire, self.shared.clone())
    }
}
