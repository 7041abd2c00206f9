//! The [`Classify`] service: notes what the request says about its answer (streamed or not, to a
//! known API) and when it started, so the response future can judge the outcome against it.

use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use seawall_core::Provider;
use seawall_core::{BoxError, LlmError, LlmRequest};
use tokio::time::Instant;
use tower_service::Service;

use crate::body::ClassifiedBody;
use crate::classifier::{AutoClassifier, Classifier};
use crate::future::ResponseFuture;

/// The default error-body limit: 64 KiB.
pub const DEFAULT_ERROR_BODY_LIMIT: usize = 64 * 1024;

/// Classifies the outcome of an HTTP transport: `Ok` with a [`ClassifiedBody`] for a
/// successful response, else an [`LlmError`]. Made by [`ClassifyLayer`](crate::ClassifyLayer).
#[derive(Debug, Clone)]
pub struct Classify<S, C = AutoClassifier> {
    inner: S,
    classifier: C,
    error_body_limit: usize,
}

impl<S> Classify<S> {
    /// Wraps `inner` with the defaults, as [`ClassifyLayer::new`](crate::ClassifyLayer::new)
    /// does: the [`AutoClassifier`] and a 64 KiB error-body limit.
    pub fn new(inner: S) -> Self {
        Self::from_parts(inner, AutoClassifier, DEFAULT_ERROR_BODY_LIMIT)
    }
}

impl<S, C> Classify<S, C> {
    pub(crate) fn from_parts(inner: S, classifier: C, error_body_limit: usize) -> Self {
        Classify {
            inner,
            classifier,
            error_body_limit,
        }
    }

    /// The classifier.
    pub fn classifier(&self) -> &C {
        &self.classifier
    }

    /// The error-body limit in bytes.
    pub fn error_body_limit(&self) -> usize {
        self.error_body_limit
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

impl<S, C, B> Service<Request<Bytes>> for Classify<S, C>
where
    S: Service<Request<Bytes>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
    C: Classifier + Clone,
{
    type Response = Response<ClassifiedBody<B>>;
    type Error = LlmError;
    type Future = ResponseFuture<S::Future, B, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| self.classifier.classify_transport_error(e.into()))
    }

    fn call(&mut self, mut req: Request<Bytes>) -> Self::Future {
        let prepared = req.prepared();
        let streaming = prepared.streaming;
        // A stream to a known API (OpenAI, Anthropic) must end with its finish marker.
        let known_api = prepared.provider != Provider::Unknown;
        let started = Instant::now();
        ResponseFuture::new(
            self.inner.call(req),
            self.classifier.clone(),
            self.error_body_limit,
            streaming,
            known_api,
            started,
        )
    }
}
