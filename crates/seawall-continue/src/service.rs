//! The [`Continue`] service: decides per request whether the layer may continue it, and keeps
//! what a follow-up needs (a copy of the request and a claim on a service) with its future.
//!
//! The ready service makes the first attempt and stays for the caller's next call. A
//! follow-up's service is cloned only when one is made, from the one spare the service keeps
//! (`seawall_core::Spare`, whose docs say what that changes), not for every call.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use seawall_core::{LlmRequest, Spare, ThreadBound};
use tower_service::Service;

use crate::body::ContinueBody;
use crate::future::{Job, ResponseFuture};
use crate::layer::{Config, ContinueLayer, LocalConfig};
use crate::request::{Template, Wire};

/// Continues answers cut by `max_tokens` and resumes streams cut after their first token.
/// Made by [`ContinueLayer`].
///
/// Requests it leaves alone (passed through, their body untouched): anything but a `POST`
/// to Chat Completions (`…/chat/completions`) or Messages (`…/messages`), requests for
/// several choices (`n`, `best_of`), and everything when both continuation and resumption
/// are off.
#[derive(Clone, Debug)]
pub struct Continue<S> {
    inner: S,
    /// The settings as this thread's services share them.
    config: LocalConfig,
    /// A clone of `inner` for the follow-ups, when the settings allow any (see the module
    /// docs).
    spare: Spare<S>,
}

impl<S: Clone> Continue<S> {
    /// Wraps `inner` with the defaults of [`ContinueLayer::new`].
    pub fn new(inner: S) -> Self {
        Continue::from_config(inner, ContinueLayer::new().config().clone())
    }

    pub(crate) fn from_config(inner: S, config: Arc<Config>) -> Self {
        let spare = if config.continues() {
            Spare::of(&inner)
        } else {
            Spare::none()
        };
        Continue {
            inner,
            config: Arc::new(ThreadBound::new(config)),
            spare,
        }
    }
}

impl<S> Continue<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably. The spare the follow-ups are cloned from is made again from
    /// it at the next `poll_ready`.
    pub fn get_mut(&mut self) -> &mut S {
        self.spare.forget();
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<Request<Bytes>> for Continue<S>
where
    S: Service<Request<Bytes>, Response = Response<B>> + Clone,
    B: Body<Data = Bytes>,
    B::Error: 'static,
{
    type Response = Response<ContinueBody<S, S::Future, B>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if self.config.continues() {
            self.spare.ready(&self.inner);
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Bytes>) -> Self::Future {
        let prepared = req.prepared();
        ThreadBound::rebind(&mut self.config);
        let config = &self.config;
        let stream = prepared.streaming;
        let wanted = config.max_continuations > 0 && (config.on_length || stream && config.resume);
        let sizes = &prepared.sizes;
        let Some(wire) = wanted.then(|| Wire::of(&req, sizes)).flatten() else {
            return ResponseFuture::pass(self.inner.call(req));
        };
        let template = Template::of(&req, sizes, wire, config);
        // The ready service makes this call and stays; the follow-ups clone the spare (and
        // poll their clone ready before each).
        let job = Job {
            svc: self.spare.claim(&self.inner),
            template,
            config: config.clone(),
            stream,
            started: tokio::time::Instant::now(),
        };
        let inner = &mut self.inner;
        ResponseFuture::first(job, || inner.call(req))
    }
}
