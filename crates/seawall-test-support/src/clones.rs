//! A service wrapper that counts its clones: what the layers that keep a service for later
//! attempts (retry, fallback, continuation) and the cache's misses must not do on every call.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tower_service::Service;

/// `inner`, passed through, counting how often it or a clone of it is cloned.
#[derive(Debug)]
pub struct CountClones<S> {
    inner: S,
    clones: Arc<AtomicUsize>,
}

/// The count of a [`CountClones`] and of all its clones.
#[derive(Clone, Debug)]
pub struct Clones(Arc<AtomicUsize>);

impl Clones {
    /// The clones made so far.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Wraps `inner`, and the count of its clones.
pub fn count_clones<S>(inner: S) -> (CountClones<S>, Clones) {
    let clones = Arc::new(AtomicUsize::new(0));
    let svc = CountClones {
        inner,
        clones: clones.clone(),
    };
    (svc, Clones(clones))
}

impl<S: Clone> Clone for CountClones<S> {
    fn clone(&self) -> Self {
        self.clones.fetch_add(1, Ordering::SeqCst);
        CountClones {
            inner: self.inner.clone(),
            clones: self.clones.clone(),
        }
    }
}

impl<S: Service<R>, R> Service<R> for CountClones<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> S::Future {
        self.inner.call(req)
    }
}
