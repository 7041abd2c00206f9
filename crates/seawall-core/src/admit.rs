//! The future of a layer that admits a call before sending it: wait for the admission, call
//! the inner service, and hand the response a guard that settles when its body ends.
//!
//! The gate (a permit and rate tokens), the budget (a reservation) and the fleet-wide limits
//! (a hold in Redis) all run the same three steps, and the same rules apply at each: a call
//! dropped while it waits must leave nothing behind (the admission future is dropped with
//! it), the ready inner service travels with the future so `call` can run once admitted, the
//! guard goes to the response (so a stream keeps what it holds until its body ends) or, on an
//! error before any response, is told why. One future does that; each layer says what its
//! guard does at each edge through [`AdmitGuard`].
//!
//! The breaker does not use it: its admission is decided at once in `call`, so its future is
//! the call and its guard, with no waiting state to carry.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tower_service::Service;

use crate::{LlmError, LlmRequest, LlmResponse, OnComplete, polled_after_completion};

/// What an admitting layer holds for a call, and what it does at each edge of the call.
///
/// The guard is attached to the response as its [`OnComplete`] hook, so what it holds is
/// given back when the body ends or is dropped; if it is dropped without either (the caller
/// dropped the call mid-flight), its `Drop` gives it back.
pub trait AdmitGuard: OnComplete + Sized {
    /// The call was admitted: called with the request just before the inner service is
    /// called (to note a queue wait in it, or arm a reservation). Does nothing by default.
    fn before_call<Req: LlmRequest>(&mut self, req: &mut Req) {
        let _ = req;
    }

    /// The response head arrived; the guard is about to be attached to its body (to read
    /// rate-limit headers, say). Does nothing by default.
    fn at_head<T: LlmResponse>(&mut self, resp: &mut T) {
        let _ = resp;
    }

    /// The inner service failed before any response: the guard settles with that error.
    fn failed(self, err: &LlmError);
}

/// An admission still being decided: the guard once admitted, or the refusal (already
/// noted wherever the layer notes refusals).
pub type PendingAdmission<G> = Pin<Box<dyn Future<Output = Result<G, LlmError>> + Send>>;

pin_project! {
    /// The response future of an admitting layer (see the [module docs](self)).
    pub struct AdmitFuture<S, Req, F, G> {
        #[pin]
        state: State<S, Req, F, G>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, F, G> {
        Admitting {
            admission: PendingAdmission<G>,
            service: Option<S>,
            request: Option<Req>,
        },
        Calling {
            #[pin]
            future: F,
            guard: Option<G>,
        },
        Refused {
            error: Option<LlmError>,
        },
        Done,
    }
}

impl<S, Req, F, G> AdmitFuture<S, Req, F, G> {
    /// Admitted at once: runs the guard's [`before_call`](AdmitGuard::before_call), then
    /// calls `service` (which must be ready).
    pub fn call(service: &mut S, mut request: Req, mut guard: G) -> Self
    where
        S: Service<Req, Future = F>,
        G: AdmitGuard,
        Req: LlmRequest,
    {
        guard.before_call(&mut request);
        AdmitFuture {
            state: State::Calling {
                future: service.call(request),
                guard: Some(guard),
            },
        }
    }

    /// To be decided by `admission`; `service` is the ready service the call will go to.
    pub fn admitting(admission: PendingAdmission<G>, service: S, request: Req) -> Self {
        AdmitFuture {
            state: State::Admitting {
                admission,
                service: Some(service),
                request: Some(request),
            },
        }
    }

    /// Refused at once with `error`.
    pub fn refused(error: LlmError) -> Self {
        AdmitFuture {
            state: State::Refused { error: Some(error) },
        }
    }
}

impl<S, Req, F, G> fmt::Debug for AdmitFuture<S, Req, F, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Admitting { .. } => "admitting",
            State::Calling { .. } => "calling",
            State::Refused { .. } => "refused",
            State::Done => "done",
        };
        f.debug_struct("AdmitFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, Req, F, G, T, E> Future for AdmitFuture<S, Req, F, G>
where
    S: Service<Req, Future = F, Response = T, Error = E>,
    F: Future<Output = Result<T, E>>,
    T: LlmResponse,
    E: Into<LlmError>,
    G: AdmitGuard,
    Req: LlmRequest,
{
    type Output = Result<T::Hooked<G>, LlmError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::Admitting {
                    admission,
                    service,
                    request,
                } => {
                    let admitted = ready!(admission.as_mut().poll(cx));
                    let (Some(mut service), Some(mut request)) = (service.take(), request.take())
                    else {
                        polled_after_completion();
                    };
                    match admitted {
                        Ok(mut guard) => {
                            guard.before_call(&mut request);
                            let future = service.call(request);
                            this.state.set(State::Calling {
                                future,
                                guard: Some(guard),
                            });
                        }
                        Err(e) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(e));
                        }
                    }
                }
                // Each outcome is handled where it lands: a response is a few hundred bytes,
                // and every move of it on the way up is a copy.
                StateProj::Calling { future, guard } => match future.poll(cx) {
                    Poll::Ready(Ok(mut resp)) => {
                        let Some(mut guard) = guard.take() else {
                            polled_after_completion();
                        };
                        this.state.set(State::Done);
                        guard.at_head(&mut resp);
                        return Poll::Ready(Ok(resp.on_complete(guard)));
                    }
                    Poll::Ready(Err(e)) => {
                        let Some(guard) = guard.take() else {
                            polled_after_completion();
                        };
                        this.state.set(State::Done);
                        let e: LlmError = e.into();
                        guard.failed(&e);
                        return Poll::Ready(Err(e));
                    }
                    Poll::Pending => return Poll::Pending,
                },
                StateProj::Refused { error } => {
                    let Some(e) = error.take() else {
                        polled_after_completion();
                    };
                    this.state.set(State::Done);
                    return Poll::Ready(Err(e));
                }
                StateProj::Done => polled_after_completion(),
            }
        }
    }
}
