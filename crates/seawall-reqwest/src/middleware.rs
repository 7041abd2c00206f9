//! seawall as a `reqwest_middleware::Middleware`: any `ClientWithMiddleware`, and every
//! framework that accepts one, gets classification, retries with server hints, the breaker,
//! the gate, the budget and fallback by model.
//!
//! # Why a "next slot" service
//!
//! Two lifetimes have to meet. The seawall stack is built once and is `'static`: its breaker,
//! gate and budget state must be shared by every call, so it cannot be rebuilt per call around
//! the chain. reqwest-middleware's [`Next<'a>`](reqwest_middleware::Next) borrows the client
//! and the rest of the chain and exists only inside [`Middleware::handle`]; it cannot be moved
//! into a `'static` service.
//!
//! So the stack's innermost service is [`NextService`], a `'static` stand-in for "the rest of
//! the chain". For each call, `handle` opens a channel and puts its sending end into the
//! request's extensions (extensions travel with every attempt the retry and fallback layers
//! make). Each time the stack sends an attempt, `NextService` takes the request, converts it
//! into a `reqwest::Request` and sends it over that channel with a reply slot. `handle`
//! drives the stack's future and, concurrently, serves the channel: each attempt runs
//! `next.clone().run(..)` with its own copy of the extensions, and the reply goes back to
//! `NextService` as the attempt's response or classified error. Attempts may overlap (a
//! fallback or a hedge while another attempt is in flight): they are served side by side.
//!
//! The answer's body owns no borrow of the chain (a `reqwest::Response` is `'static`), so it
//! keeps streaming, through the stack's body guards, after `handle` has returned.
//!
//! The alternatives are worse: building the stack per call loses every piece of shared state;
//! spawning the chain on a task needs a `'static` `Next`, which does not exist; and sending
//! outside the chain (with a client of our own) would skip the middlewares after this one.
//!
//! # Requests and answers
//!
//! - A request whose body is bytes (every JSON API call) goes through the stack, which may
//!   send it several times. A request whose body is a **stream** (an upload from a file or a
//!   channel) cannot be replayed: it is passed straight down the chain, sent once, with none
//!   of seawall's policies. Such requests are not LLM calls, and failing them would break a
//!   client shared with other traffic.
//! - An answer is the final attempt's response, its body streaming, its `url()` the
//!   request's, its extensions those the stack added (`ServedBy` after a fallback, say).
//! - The call's `http::Extensions` are copied into every attempt; what the middlewares after
//!   seawall write into them stays with that attempt's copy.
//! - A final failure is `reqwest_middleware::Error::Middleware(anyhow::Error)` wrapping the
//!   [`LlmError`] (downcast it, or use [`llm_error`]): its class, the upstream's status and
//!   code, the retry hint, the attempts made and why retrying stopped. An upstream error
//!   response is not handed back as a response: with a `ClassifyLayer` in the stack (it must
//!   be, next to `NextService`) every error status is an `LlmError`.
//!
//! # Replacing reqwest-retry
//!
//! seawall's retry layer replaces `reqwest_retry::RetryTransientMiddleware`: remove it (and
//! any other retrying middleware) from the chain. Left in, retries multiply (3 × 3 = 9 sends
//! for one call), and its backoff does not wait for the server's `Retry-After`, so it retries
//! a 429 before the limit has refilled; it also retries an `insufficient_quota` 429 that no
//! wait can fix. seawall's retry layer honours `retry-after`, `retry-after-ms` and
//! `x-should-retry`, never retries a quota or an invalid request, and shares a retry budget.
//! Middlewares that only observe (tracing, logging) can stay: placed *after* seawall in the
//! chain they see every attempt, *before* it one logical call.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use http::Extensions;
use http_body::Body;
use reqwest_middleware::{Middleware, Next};
use seawall_core::{BoxError, FailureClass, LlmError};
use tokio::sync::{mpsc, oneshot};
use tower_service::Service;

use crate::convert::{Converted, http_to_request, request_to_http, response_to_reqwest};
use crate::error::classify_reqwest_error;

/// A seawall stack as a `reqwest_middleware::Middleware`.
///
/// The stack is a `Service<http::Request<Bytes>>` whose innermost service is [`NextService`]
/// (with a `ClassifyLayer` right above it). It is built once, so every call through the
/// middleware shares its breaker, gate, budget and retry budget; clones of the middleware
/// share them too. The [module docs](self) explain the design and what a caller sees; the
/// crate docs show it in use.
#[derive(Clone, Debug)]
pub struct SeawallMiddleware<S> {
    stack: S,
}

impl<S> SeawallMiddleware<S> {
    /// The middleware around `stack`.
    pub fn new(stack: S) -> Self {
        SeawallMiddleware { stack }
    }

    /// The stack.
    pub fn stack(&self) -> &S {
        &self.stack
    }
}

/// The [`LlmError`] of a call through [`SeawallMiddleware`] that failed for good, if that is
/// what `error` holds.
pub fn llm_error(error: &reqwest_middleware::Error) -> Option<&LlmError> {
    match error {
        reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<LlmError>(),
        reqwest_middleware::Error::Reqwest(_) => None,
    }
}

/// One attempt waiting to be sent down the chain.
struct Job {
    request: reqwest::Request,
    reply: oneshot::Sender<Result<reqwest::Response, LlmError>>,
}

/// The way from the stack's innermost service back to the `handle` call that owns the chain,
/// carried in the request's extensions.
#[derive(Clone)]
struct Slot(mpsc::UnboundedSender<Job>);

#[async_trait::async_trait]
impl<S, B> Middleware for SeawallMiddleware<S>
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>> + Clone + Send + Sync + 'static,
    S::Error: Into<LlmError>,
    S::Future: Send,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let url = req.url().clone();
        let mut request = match request_to_http(req) {
            Ok(Converted::Buffered(request)) => request,
            Ok(Converted::Streaming(req)) => return next.run(req, extensions).await,
            Err(e) => return Err(anyhow::Error::new(e).into()),
        };
        let (tx, mut jobs) = mpsc::unbounded_channel();
        request.extensions_mut().insert(Slot(tx));

        let mut stack = self.stack.clone();
        let mut call = pin!(async move {
            poll_fn(|cx| stack.poll_ready(cx)).await?;
            stack.call(request).await
        });
        let template: &Extensions = extensions;
        let mut attempts = FuturesUnordered::new();
        // The stack first (it may send attempts), then the attempts it sent, then the attempts
        // in flight (a finished one has replied, so the stack may move on): repeated while
        // anything moved, so every one of them has registered its waker when this returns
        // `Pending`.
        let outcome = poll_fn(|cx| {
            loop {
                if let Poll::Ready(outcome) = call.as_mut().poll(cx) {
                    return Poll::Ready(outcome);
                }
                let mut progress = false;
                while let Poll::Ready(Some(job)) = jobs.poll_recv(cx) {
                    attempts.push(attempt(next.clone(), template.clone(), job));
                    progress = true;
                }
                while let Poll::Ready(Some(())) = attempts.poll_next_unpin(cx) {
                    progress = true;
                }
                if !progress {
                    return Poll::Pending;
                }
            }
        })
        .await;
        match outcome {
            Ok(resp) => Ok(response_to_reqwest(resp, url)),
            Err(e) => Err(anyhow::Error::new(e.into()).into()),
        }
    }
}

/// Sends one attempt down the rest of the chain and replies with its outcome.
async fn attempt(next: Next<'_>, mut extensions: Extensions, job: Job) {
    let outcome = match next.run(job.request, &mut extensions).await {
        Ok(resp) => Ok(resp),
        Err(reqwest_middleware::Error::Reqwest(e)) => Err(classify_reqwest_error(e)),
        Err(reqwest_middleware::Error::Middleware(e)) => Err(match e.downcast::<LlmError>() {
            Ok(e) => e,
            Err(e) => seawall_classify::classify_transport_error(e.into()),
        }),
    };
    // The stack may have stopped waiting (a hedge that lost); nobody needs the answer then.
    let _ = job.reply.send(outcome);
}

/// The innermost service of a stack used by [`SeawallMiddleware`]: "the rest of the
/// reqwest-middleware chain". Each call sends one attempt down the chain of the
/// `SeawallMiddleware::handle` call the request belongs to, and answers with the response
/// head (`http::Response<reqwest::Body>`, the body streaming) or a classified [`LlmError`].
///
/// Outside a `SeawallMiddleware` it has no chain to send to, and answers every request with an
/// `InvalidRequest` error saying so.
#[derive(Clone, Copy, Debug, Default)]
pub struct NextService {
    _private: (),
}

impl NextService {
    /// The service.
    pub fn new() -> Self {
        NextService::default()
    }
}

impl Service<http::Request<Bytes>> for NextService {
    type Response = http::Response<reqwest::Body>;
    type Error = LlmError;
    type Future = NextFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: http::Request<Bytes>) -> NextFuture {
        let Some(Slot(slot)) = req.extensions_mut().remove::<Slot>() else {
            return NextFuture::refused(LlmError::from_static(
                FailureClass::InvalidRequest,
                "NextService sends only requests that came through a SeawallMiddleware",
            ));
        };
        let request = match http_to_request(req) {
            Ok(request) => request,
            Err(e) => return NextFuture::refused(e),
        };
        let (reply, answer) = oneshot::channel();
        if slot.send(Job { request, reply }).is_err() {
            return NextFuture::refused(ended());
        }
        NextFuture {
            state: NextState::Waiting(answer),
        }
    }
}

fn ended() -> LlmError {
    // Only a stack still running after its `handle` call ended (a task it spawned) sees this.
    LlmError::from_static(
        FailureClass::Disconnected,
        "the middleware call this attempt belongs to has ended",
    )
}

/// The future of [`NextService`].
pub struct NextFuture {
    state: NextState,
}

enum NextState {
    Waiting(oneshot::Receiver<Result<reqwest::Response, LlmError>>),
    Refused(Option<LlmError>),
}

impl NextFuture {
    fn refused(e: LlmError) -> Self {
        NextFuture {
            state: NextState::Refused(Some(e)),
        }
    }
}

impl std::fmt::Debug for NextFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NextFuture").finish_non_exhaustive()
    }
}

impl Future for NextFuture {
    type Output = Result<http::Response<reqwest::Body>, LlmError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.state {
            NextState::Waiting(answer) => {
                let Poll::Ready(outcome) = Pin::new(answer).poll(cx) else {
                    return Poll::Pending;
                };
                self.state = NextState::Refused(None);
                Poll::Ready(match outcome {
                    Ok(Ok(resp)) => Ok(http::Response::from(resp)),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(ended()),
                })
            }
            NextState::Refused(error) => match error.take() {
                Some(e) => Poll::Ready(Err(e)),
                None => seawall_core::polled_after_completion(),
            },
        }
    }
}
