//! The stream timeout service: notes when an attempt starts and whether it streams, and leaves
//! the timing to the response future (until the commit point) and the body (after it).

use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::Body;
use seawall_core::{BoxError, LlmError, LlmRequest};
use tower_service::Service;

use crate::body::TimedBody;
use crate::config::StreamTimeouts;
use crate::future::{Call, ResponseFuture};

/// Enforces [`StreamTimeouts`] on an inner service and resolves its future at the commit point.
///
/// See the [crate documentation](crate) for what counts as content and how errors are split
/// between the future (before the commit point) and the body (after it).
#[derive(Debug, Clone)]
pub struct StreamTimeout<S> {
    inner: S,
    config: StreamTimeouts,
}

impl<S> StreamTimeout<S> {
    /// Wraps `inner` with the defaults listed on [`StreamTimeouts`], as
    /// [`StreamTimeoutLayer::new`](crate::StreamTimeoutLayer::new) does.
    pub fn new(inner: S) -> Self {
        Self::from_config(inner, StreamTimeouts::new())
    }

    pub(crate) fn from_config(inner: S, config: StreamTimeouts) -> Self {
        StreamTimeout { inner, config }
    }

    /// The timeouts it enforces.
    pub fn config(&self) -> &StreamTimeouts {
        &self.config
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

impl<S, Req, B> Service<Req> for StreamTimeout<S>
where
    S: Service<Req, Response = Response<B>>,
    S::Error: Into<LlmError>,
    Req: LlmRequest,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Response = Response<TimedBody<B>>;
    type Error = LlmError;
    type Future = ResponseFuture<S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let streaming = req.prepared().streaming;
        let start = tokio::time::Instant::now();
        let caller = req.deadline().map(|d| d.instant());
        let call = Call {
            start,
            config: self.config,
            streaming,
            cx: req.call_context().cloned(),
            caller,
        };
        if caller.is_some_and(|at| at <= start) {
            // Past the caller's deadline: the attempt is not made at all.
            return ResponseFuture::expired(call);
        }
        ResponseFuture::new(self.inner.call(req), call)
    }
}
