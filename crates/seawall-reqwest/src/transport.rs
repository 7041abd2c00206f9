//! The transport service: a user's `reqwest::Client` as the innermost hop of a seawall stack.
//!
//! An application that already has a tuned `reqwest::Client` (its TLS backend, proxy, DNS
//! resolver, pool settings, root certificates) should not need a second HTTP stack to get
//! seawall's policies. This service sends each attempt with that client, answers at the
//! response head with the body still streaming, and classifies what went wrong before the head
//! ([`classify_reqwest_error`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use seawall_core::LlmError;
use seawall_core::upstream::{Upstream, route};
use tower_service::Service;

use crate::convert::http_to_request;
use crate::error::classify_reqwest_error;

/// reqwest's own future for a sent request (its type is not exported by name).
type Pending = <reqwest::Client as Service<reqwest::Request>>::Future;

/// A `reqwest::Client` as a seawall transport: `Service<http::Request<Bytes>>` answering
/// `http::Response<reqwest::Body>` at the response head, the body streaming as it arrives.
///
/// - with an [`Upstream`], relative request URIs (`/chat/completions`) are resolved against
///   its base URL and its headers (credentials, API version) are added unless the request has
///   them, exactly as seawall's hyper transport does; credentials go only to the upstream's
///   own origin. Without one, requests must carry absolute URIs (as async-openai's do);
/// - errors are [`LlmError`]s, classified from reqwest's flags by [`classify_reqwest_error`]
///   with the URL stripped (`Connect`, `Timeout`, `Disconnected`, `InvalidRequest`). A
///   `ClassifyLayer` above passes them through unchanged;
/// - no retries and no redirects of its own, **if the client is built that way**: seawall's
///   retry layer must be the only retry loop. Build the client from
///   [`client_builder`](Self::client_builder), or see there what a client of your own must
///   have.
///
/// Clones share the client (and so its connection pool).
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use seawall_core::upstream::{ApiKey, OpenAiConfig};
/// use seawall_reqwest::ReqwestTransport;
///
/// // Your TLS backend, proxy and pool settings go on the builder.
/// let client = ReqwestTransport::client_builder().pool_max_idle_per_host(16).build()?;
/// let upstream = OpenAiConfig::new(ApiKey::new("sk-...")?).upstream()?;
/// let transport = ReqwestTransport::new(client).with_upstream(upstream);
/// # let _ = transport; Ok(()) }
/// ```
#[derive(Clone)]
pub struct ReqwestTransport {
    client: reqwest::Client,
    upstream: Option<Arc<Upstream>>,
}

impl ReqwestTransport {
    /// A transport sending with `client`, to the absolute URIs requests carry.
    pub fn new(client: reqwest::Client) -> Self {
        ReqwestTransport {
            client,
            upstream: None,
        }
    }

    /// A `reqwest::ClientBuilder` set up for seawall: add your TLS, proxy and pool settings,
    /// then `build()` it and hand the client to [`new`](Self::new).
    ///
    /// What it sets, and what a client you build yourself must have too:
    ///
    /// - **no redirects** (`redirect(Policy::none())`; reqwest follows up to 10 by default): a
    ///   redirect on an LLM API means a wrong base URL, and following it resends the prompt
    ///   (and, to another origin, reqwest drops the credentials). Unfollowed, a 3xx reaches
    ///   the classifier as `InvalidRequest`;
    /// - **no retries** (`retry(reqwest::retry::never())`): reqwest 0.13 retries by default,
    ///   up to 2 more times, requests that an HTTP/2 server refused unprocessed (`GOAWAY` with
    ///   `NO_ERROR`, `REFUSED_STREAM`). Those are harmless to billing, but they are attempts
    ///   that seawall's breaker, gate and budget never see; seawall's retry layer retries them
    ///   itself. Any other retry policy on the client multiplies seawall's attempts;
    /// - a **10 s connect timeout** (reqwest has none): a timed-out connect is `Connect`,
    ///   safe to retry;
    /// - **TCP keep-alive** every 60 s.
    ///
    /// What it does not set, and should not be set: a total `timeout(..)`. reqwest applies it
    /// to the whole exchange including the body, so it cuts long streamed answers; seawall's
    /// `StreamTimeoutLayer` bounds the time to the first token and the gaps between tokens
    /// instead. A `read_timeout` (between reads) is harmless but redundant with its idle
    /// timeout.
    pub fn client_builder() -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .connect_timeout(Duration::from_secs(10))
            .tcp_keepalive(Duration::from_secs(60))
    }

    /// This transport, sending to `upstream` (with the same client).
    pub fn with_upstream(mut self, upstream: Upstream) -> Self {
        self.upstream = Some(Arc::new(upstream));
        self
    }

    /// The upstream, if set.
    pub fn upstream(&self) -> Option<&Upstream> {
        self.upstream.as_deref()
    }

    /// The client.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    fn prepare(&self, req: Request<Bytes>) -> Result<reqwest::Request, LlmError> {
        let (mut parts, body) = req.into_parts();
        route(self.upstream.as_deref(), &mut parts, &body)?;
        http_to_request(Request::from_parts(parts, body))
    }
}

impl fmt::Debug for ReqwestTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReqwestTransport")
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

impl Service<Request<Bytes>> for ReqwestTransport {
    type Response = Response<reqwest::Body>;
    type Error = LlmError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        // The pooled client is always ready; concurrency is the gate's job.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> ResponseFuture {
        let state = match self.prepare(req) {
            Ok(req) => State::Sent {
                pending: Service::call(&mut self.client, req),
            },
            Err(e) => State::Refused { error: Some(e) },
        };
        ResponseFuture { state }
    }
}

pin_project! {
    /// The future of [`ReqwestTransport`]: resolves at the response head.
    pub struct ResponseFuture {
        #[pin]
        state: State,
    }
}

pin_project! {
    #[project = StateProj]
    enum State {
        Sent { #[pin] pending: Pending },
        Refused { error: Option<LlmError> },
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<reqwest::Body>, LlmError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        match state.as_mut().project() {
            StateProj::Sent { pending } => {
                let Poll::Ready(result) = pending.poll(cx) else {
                    return Poll::Pending;
                };
                // Finished: a further poll panics like a refusal already returned.
                state.set(State::Refused { error: None });
                Poll::Ready(result.map(Response::from).map_err(classify_reqwest_error))
            }
            StateProj::Refused { error } => match error.take() {
                Some(e) => Poll::Ready(Err(e)),
                None => seawall_core::polled_after_completion(),
            },
        }
    }
}
