//! [`ResponseFuture`]: admission (if the store is remote), then the attempt.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use seawall_core::{LlmError, LlmResponse, polled_after_completion};
use tower_service::Service;

use crate::guard::BudgetGuard;
use crate::store::AdmissionFuture;

pin_project_lite::pin_project! {
    /// The future of [`CostBudget`](crate::CostBudget): it resolves to the inner response with
    /// the attempt's [`BudgetGuard`] attached to its end, or to the refusal or the inner error.
    pub struct ResponseFuture<F, S, Req> {
        #[pin]
        state: State<F, S, Req>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F, S, Req> {
        // A remote store is still deciding; the ready inner service and the request wait.
        Admitting {
            admission: AdmissionFuture,
            service: Option<S>,
            req: Option<Req>,
            guard: Option<BudgetGuard>,
        },
        // The attempt is in flight; dropping it settles the guard as dropped.
        Calling {
            #[pin]
            future: F,
            guard: Option<BudgetGuard>,
        },
        // Refused at `call`.
        Failed { error: Option<LlmError> },
    }
}

impl<F, S, Req> ResponseFuture<F, S, Req> {
    pub(crate) fn calling(future: F, guard: BudgetGuard) -> Self {
        ResponseFuture {
            state: State::Calling {
                future,
                guard: Some(guard),
            },
        }
    }

    pub(crate) fn failed(error: LlmError) -> Self {
        ResponseFuture {
            state: State::Failed { error: Some(error) },
        }
    }

    pub(crate) fn admitting(
        admission: AdmissionFuture,
        service: S,
        req: Req,
        guard: BudgetGuard,
    ) -> Self {
        ResponseFuture {
            state: State::Admitting {
                admission,
                service: Some(service),
                req: Some(req),
                guard: Some(guard),
            },
        }
    }
}

impl<F, S, Req, T, E> Future for ResponseFuture<F, S, Req>
where
    F: Future<Output = Result<T, E>>,
    S: Service<Req, Future = F, Response = T, Error = E>,
    T: LlmResponse,
    E: Into<LlmError>,
{
    type Output = Result<T::Hooked<BudgetGuard>, LlmError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Admitting {
                    admission,
                    service,
                    req,
                    guard,
                } => {
                    let decided = ready!(admission.as_mut().poll(cx));
                    let (Some(mut service), Some(req), Some(mut guard)) =
                        (service.take(), req.take(), guard.take())
                    else {
                        polled_after_completion();
                    };
                    match decided {
                        Ok(()) => {
                            guard.arm();
                            let future = service.call(req);
                            this.state.set(State::Calling {
                                future,
                                guard: Some(guard),
                            });
                        }
                        Err(refused) => {
                            let err = guard.refuse(refused);
                            this.state.set(State::Failed { error: None });
                            return Poll::Ready(Err(err));
                        }
                    }
                }
                StateProj::Calling { future, guard } => {
                    let result = ready!(future.poll(cx));
                    let guard = guard.take();
                    this.state.set(State::Failed { error: None });
                    let Some(guard) = guard else {
                        polled_after_completion();
                    };
                    return Poll::Ready(match result {
                        Ok(response) => Ok(response.on_complete(guard)),
                        Err(e) => {
                            let e: LlmError = e.into();
                            guard.fail(e.class());
                            Err(e)
                        }
                    });
                }
                StateProj::Failed { error } => {
                    let Some(error) = error.take() else {
                        polled_after_completion();
                    };
                    return Poll::Ready(Err(error));
                }
            }
        }
    }
}

impl<F, S, Req> fmt::Debug for ResponseFuture<F, S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Admitting { .. } => "admitting",
            State::Calling { .. } => "calling",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
