//! The classifying service and its future: a `tonic::Status` becomes an [`LlmError`] and a
//! response a [`GrpcResponse`], nothing else changes.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use seawall_core::LlmError;
use tonic::Status;
use tower_service::Service;

use crate::classify::classify_status;
use crate::response::GrpcResponse;

/// A service whose `tonic::Status` errors are classified; made by
/// [`GrpcClassifyLayer`](crate::GrpcClassifyLayer).
#[derive(Clone, Debug)]
pub struct GrpcClassify<S> {
    inner: S,
}

impl<S> GrpcClassify<S> {
    /// Wraps `inner`, as [`GrpcClassifyLayer`](crate::GrpcClassifyLayer) does.
    pub fn new(inner: S) -> Self {
        GrpcClassify { inner }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req> Service<Req> for GrpcClassify<S>
where
    S: Service<Req, Error = Status>,
{
    type Response = GrpcResponse<S::Response>;
    type Error = LlmError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(classify_status)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        ResponseFuture {
            inner: self.inner.call(req),
        }
    }
}

pin_project! {
    /// The response future of [`GrpcClassify`].
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, R> Future for ResponseFuture<F>
where
    F: Future<Output = Result<R, Status>>,
{
    type Output = Result<GrpcResponse<R>, LlmError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let result = ready!(self.project().inner.poll(cx));
        Poll::Ready(result.map(GrpcResponse::new).map_err(classify_status))
    }
}
