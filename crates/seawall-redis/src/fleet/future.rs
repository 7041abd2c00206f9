//! The fleet limit's response future: waits for the fleet's admission, then runs the call
//! holding its [`FleetPermit`], which it hands to the response.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use seawall_core::{LlmError, LlmRequest, LlmResponse};
use tokio::time::Instant;
use tower_service::Service;

use super::permit::FleetPermit;

type Admission = Pin<Box<dyn Future<Output = Result<FleetPermit, LlmError>> + Send>>;

pin_project! {
    /// The response future of [`FleetLimit`](super::FleetLimit): waits for the fleet's
    /// admission, calls the inner service, and attaches the permit to the response.
    ///
    /// Dropping it at any point gives back what it holds: a wait leaves nothing behind, an
    /// admission in flight queues the cancellation of its hold, a call in flight ends its hold.
    pub struct ResponseFuture<S, Req, F> {
        #[pin]
        state: State<S, Req, F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, F> {
        Admitting {
            admission: Admission,
            service: Option<S>,
            request: Option<Req>,
            start: Instant,
        },
        Calling {
            #[pin]
            future: F,
            permit: Option<FleetPermit>,
        },
        Done,
    }
}

impl<S, Req, F> ResponseFuture<S, Req, F> {
    pub(crate) fn new(admission: Admission, service: S, request: Req) -> Self {
        ResponseFuture {
            state: State::Admitting {
                admission,
                service: Some(service),
                request: Some(request),
                start: Instant::now(),
            },
        }
    }
}

impl<S, Req, F> fmt::Debug for ResponseFuture<S, Req, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Admitting { .. } => "admitting",
            State::Calling { .. } => "calling",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
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
    type Output = Result<T::Hooked<FleetPermit>, LlmError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            match this.state.as_mut().project() {
                StateProj::Admitting {
                    admission,
                    service,
                    request,
                    start,
                } => {
                    let admitted = ready!(admission.as_mut().poll(cx));
                    let (Some(mut svc), Some(req)) = (service.take(), request.take()) else {
                        seawall_core::polled_after_completion();
                    };
                    // The fleet's wait is queue time too; its refusals are local rejections.
                    if let Some(cx) = req.call_context() {
                        let wait = start.elapsed();
                        cx.update(|f| {
                            *f.queue_wait.get_or_insert(std::time::Duration::ZERO) += wait;
                            if let Err(e) = &admitted {
                                f.rejections.push(e.class());
                            }
                        });
                    }
                    match admitted {
                        Ok(permit) => {
                            let future = svc.call(req);
                            this.state.set(State::Calling {
                                future,
                                permit: Some(permit),
                            });
                        }
                        Err(e) => {
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
                        Ok(resp) => {
                            permit.saw_head(&resp);
                            Ok(resp.on_complete(permit))
                        }
                        Err(e) => {
                            let e: LlmError = e.into();
                            permit.failed(&e);
                            Err(e)
                        }
                    });
                }
                StateProj::Done => seawall_core::polled_after_completion(),
            }
        }
    }
}
