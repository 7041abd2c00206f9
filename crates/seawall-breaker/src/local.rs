//! Per-thread handles on the state a layer's services share, so that a call writes no
//! reference count another thread writes.
//!
//! Every call holds its key's breaker until its body ends, and the retry layer above clones
//! this service on every call. Done with the layer's `Arc`s directly, each call would write
//! the count of the key's `Arc<Breaker>` and of the layer's `Arc<Shared>`: cache lines that
//! every thread calling through the layer writes, so two threads take turns owning them. The
//! services of one thread share handles of their own instead, made once per thread (and per
//! key the service switches to), whose counts only that thread writes.

use std::ops::Deref;
use std::sync::Arc;

use crate::breaker::Breaker;
use crate::registry::Shared;

/// A key's breaker as one thread's calls hold it.
pub(crate) type ThreadBreaker = seawall_core::ThreadBound<Breaker>;

/// A key's breaker as a call holds it: through the running thread's handle once a service
/// has served the key twice in a row, else the shared `Arc` itself (a service that is cloned
/// for every call and never called twice, as under some outer layers, would otherwise make a
/// handle per call: an allocation instead of a count).
#[derive(Clone)]
pub(crate) enum Held {
    Shared(Arc<Breaker>),
    Local(Arc<ThreadBreaker>),
}

impl Held {
    /// The same breaker through a handle of the running thread, if it is not already.
    pub(crate) fn localize(&mut self) {
        if matches!(self, Held::Local(t) if t.is_local()) {
            return;
        }
        *self = Held::Local(Arc::new(ThreadBreaker::new(self.shared().clone())));
    }

    /// The breaker itself, as the layer shares it.
    pub(crate) fn shared(&self) -> &Arc<Breaker> {
        match self {
            Held::Shared(b) => b,
            Held::Local(t) => t.shared(),
        }
    }
}

impl Deref for Held {
    type Target = Breaker;

    fn deref(&self) -> &Breaker {
        match self {
            Held::Shared(b) => b,
            Held::Local(t) => t,
        }
    }
}

/// The layer's shared state as one thread's services hold it.
pub(crate) type ThreadShared = seawall_core::ThreadBound<Shared>;
