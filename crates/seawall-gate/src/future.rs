//! The gate's response future: waits in the queue for a permit and the key's rates, then runs
//! the call holding the permit, and records the queue time or the rejection.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use seawall_core::{FailureClass, LlmError, LlmRequest, LlmResponse};
use tokio::time::Instant;
use tower_service::Service;

use crate::error::QueueWait;
use crate::shared::GatePermit;

type Admission = Pin<Box<dyn Future<Output = Result<GatePermit, LlmError>> + Send>>;

pin_project! {
    /// The response future of [`ConcurrencyGate`](crate::ConcurrencyGate): waits in the gate's
    /// queue if it must, calls the inner service, and attaches the permit to the response.
    ///
    /// Dropping it at any point gives back whatever it holds: its queue place, its key's line,
    /// its permit.
    pub struct ResponseFuture<S, Req, F> {
        #[pin]
        state: State<S, Req, F>,
        wait: Duration,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, F> {
        Waiting {
            admission: Admission,
            service: Option<S>,
            request: Option<Req>,
            start: Instant,
        },
        Calling {
            #[pin]
            future: F,
            permit: Option<GatePermit>,
        },
        Rejected {
            error: Option<LlmError>,
        },
        Done,
    }
}

impl<S, Req, F> ResponseFuture<S, Req, F> {
    pub(crate) fn calling(future: F, permit: GatePermit) -> Self {
        ResponseFuture {
            state: State::Calling {
                future,
                permit: Some(permit),
            },
            wait: Duration::ZERO,
        }
    }

    pub(crate) fn waiting(admission: Admission, service: S, request: Req, start: Instant) -> Self {
        ResponseFuture {
            state: State::Waiting {
                admission,
                service: Some(service),
                request: Some(request),
                start,
            },
            wait: Duration::ZERO,
        }
    }

    pub(crate) fn rejected(error: LlmError) -> Self {
        ResponseFuture {
            state: State::Rejected { error: Some(error) },
            wait: Duration::ZERO,
        }
    }
}

impl<S, Req, F> fmt::Debug for ResponseFuture<S, Req, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Waiting { .. } => "waiting",
            State::Calling { .. } => "calling",
            State::Rejected { .. } => "rejected",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("wait", &self.wait)
            .finish()
    }
}

/// Records an admission's queue time in the request and the call context.
pub(crate) fn note_admitted<Req: LlmRequest>(req: &mut Req, wait: Duration) {
    if let Some(cx) = req.call_context() {
        cx.update(|f| *f.queue_wait.get_or_insert(Duration::ZERO) += wait);
    }
    if let Some(ext) = req.extensions_mut() {
        ext.insert(QueueWait(wait));
    }
    if wait.is_zero() {
        tracing::trace!(target: "seawall::gate", queue_wait_ms = 0.0, "seawall gate: admitted");
    } else {
        let ms = wait.as_secs_f64() * 1e3;
        tracing::Span::current().record("queue_wait_ms", ms);
        tracing::debug!(target: "seawall::gate", queue_wait_ms = ms, "seawall gate: admitted after waiting");
    }
}

/// Records a rejection (and the time waited before it) in the call context.
pub(crate) fn note_rejected<Req: LlmRequest>(req: &Req, wait: Duration) {
    if let Some(cx) = req.call_context() {
        cx.update(|f| {
            *f.queue_wait.get_or_insert(Duration::ZERO) += wait;
            f.rejections.push(FailureClass::GateRejected);
        });
    }
}

impl<S, Req, F, T, E> Future for ResponseFuture<S, Req, F>
where
    S: Service<Req, Future = F, Response = T, Error = E>,
    F: Future<Output = Result<T, E>>,
    T: LlmResponse,
    E: Into<LlmError>,
    Req: LlmRequest,
{
    type Output = Result<T::Hooked<GatePermit>, LlmError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::Waiting {
                    admission,
                    service,
                    request,
                    start,
                } => {
                    let admitted = ready!(admission.as_mut().poll(cx));
                    let wait = Instant::now().saturating_duration_since(*start);
                    let (Some(mut svc), Some(mut req)) = (service.take(), request.take()) else {
                        seawall_core::polled_after_completion();
                    };
                    match admitted {
                        Ok(permit) => {
                            *this.wait = wait;
                            note_admitted(&mut req, wait);
                            let future = svc.call(req);
                            this.state.set(State::Calling {
                                future,
                                permit: Some(permit),
                            });
                        }
                        Err(e) => {
                            note_rejected(&req, wait);
                            this.state.set(State::Done);
                            return Poll::Ready(Err(e));
                        }
                    }
                }
                StateProj::Calling { future, permit } => {
                    let result = ready!(future.poll(cx));
                    let permit = permit.take();
                    this.state.set(State::Done);
                    let Some(permit) = permit else {
                        seawall_core::polled_after_completion();
                    };
                    return Poll::Ready(match result {
                        Ok(mut resp) => {
                            permit.saw_head(&resp);
                            if let Some(ext) = resp.extensions_mut() {
                                ext.insert(QueueWait(*this.wait));
                            }
                            Ok(resp.on_complete(permit))
                        }
                        Err(e) => {
                            let e: LlmError = e.into();
                            permit.failed(&e);
                            Err(e)
                        }
                    });
                }
                StateProj::Rejected { error } => {
                    let Some(e) = error.take() else {
                        seawall_core::polled_after_completion();
                    };
                    this.state.set(State::Done);
                    return Poll::Ready(Err(e));
                }
                StateProj::Done => seawall_core::polled_after_completion(),
            }
        }
    }
}
