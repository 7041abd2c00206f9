//! The [`Continue`] service: decides per request whether the layer may continue it, and keeps
//! what a follow-up needs (a copy of the request and a ready service) with its future.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use seawall_core::{LlmRequest, ThreadBound};
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
}

impl<S> Continue<S> {
    /// Wraps `inner` with the defaults of [`ContinueLayer::new`].
    pub fn new(inner: S) -> Self {
        Continue::from_config(inner, ContinueLayer::new().config().clone())
    }

    pub(crate) fn from_config(inner: S, config: Arc<Config>) -> Self {
        Continue {
            inner,
            config: Arc::new(ThreadBound::new(config)),
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
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Bytes>) -> Self::Future {
        req.prepare();
        ThreadBound::rebind(&mut self.config);
        let config = &self.config;
        let stream = req.is_streaming();
        let wanted = config.max_continuations > 0 && (config.on_length || stream && config.resume);
        let Some(wire) = wanted.then(|| Wire::of(&req)).flatten() else {
            return ResponseFuture::pass(self.inner.call(req));
        };
        let template = Template::of(&req, wire, config);
        let context = req.call_context().cloned();
        // The ready service makes this call and goes with the future for the follow-ups
        // (polled ready again before each); a clone takes its place, as tower's retry does.
        let clone = self.inner.clone();
        let svc = std::mem::replace(&mut self.inner, clone);
        let job = Job {
            svc,
            template,
            config: config.clone(),
            context,
            stream,
            started: tokio::time::Instant::now(),
        };
        ResponseFuture::first(job, |svc| svc.call(req))
    }
}
