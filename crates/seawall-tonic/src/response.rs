//! [`GrpcResponse`]: a gRPC answer as seawall's layers see it.
//!
//! The breaker and the observe layer attach a hook to every response and learn from it when
//! the call is done ([`LlmResponse`]). `tonic::Response` is not seawall's type and
//! `LlmResponse` is not tonic's, so neither crate can join them here; the classifying layer
//! wraps each answer in this type instead.
//!
//! A gRPC response is taken as done at its head: the hooks run at once, with a complete
//! outcome. That is exact for a unary call. For a server-streaming call the head is the commit
//! point: a status that ends the stream later is the caller's to handle
//! ([`classify_status`](crate::classify_status) classifies it), and the breaker has already
//! counted the call as a success.

use seawall_core::{Completion, LlmResponse, OnComplete, Outcome, Usage};

/// A response of the inner gRPC service (usually a `tonic::Response<T>`), done at its head.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrpcResponse<R> {
    inner: R,
}

impl<R> GrpcResponse<R> {
    /// Wraps a response.
    pub fn new(inner: R) -> Self {
        GrpcResponse { inner }
    }

    /// The response itself.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The response itself, mutably.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The response, unwrapped.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

impl<R> LlmResponse for GrpcResponse<R> {
    type Hooked<G: OnComplete> = GrpcResponse<R>;

    /// A gRPC message has no standard usage field: none.
    fn usage(&self) -> Option<Usage> {
        None
    }

    fn on_complete<G: OnComplete>(self, hook: G) -> Self::Hooked<G> {
        hook.on_complete(Completion {
            outcome: Outcome::Complete,
            report: None,
            usage: None,
        });
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn hooks_run_at_once_with_a_complete_outcome() {
        let ran = Arc::new(AtomicBool::new(false));
        let seen = ran.clone();
        let resp = GrpcResponse::new(7).on_complete(move |c: Completion<'_>| {
            assert!(matches!(c.outcome, Outcome::Complete));
            seen.store(true, Ordering::SeqCst);
        });
        assert!(ran.load(Ordering::SeqCst));
        assert_eq!(resp.into_inner(), 7);
    }
}
