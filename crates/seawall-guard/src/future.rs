//! The guard's response future: the inner call, or the refusal, ready at once.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use seawall_core::LlmError;

pin_project! {
    /// The response future of a [`ContextGuard`](crate::ContextGuard): the inner service's
    /// future, or the refusal of a request that does not fit.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<F> {
        Called { #[pin] future: F },
        // Taken when polled.
        Refused { error: Option<LlmError> },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn called(future: F) -> Self {
        ResponseFuture {
            kind: Kind::Called { future },
        }
    }

    pub(crate) fn refused(error: LlmError) -> Self {
        ResponseFuture {
            kind: Kind::Refused { error: Some(error) },
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<LlmError>,
{
    type Output = Result<T, LlmError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called { future } => future.poll(cx).map_err(Into::into),
            KindProj::Refused { error } => match error.take() {
                Some(e) => Poll::Ready(Err(e)),
                None => seawall_core::polled_after_completion(),
            },
        }
    }
}
