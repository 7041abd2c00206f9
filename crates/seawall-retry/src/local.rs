//! The layer's shared state as one thread's services hold it.
//!
//! Every call's future keeps the layer's state (policy, budget, counters) until the call ends.
//! Cloned from the layer's one `Arc` for each call, that would write its count, a cache line
//! every thread calling through the layer writes, twice per call. The services of one thread
//! share a handle of their own instead, made once per thread, whose count only that thread
//! writes.

use std::ops::Deref;
use std::sync::Arc;

use crate::policy::Shared;

/// The layer's state, bound to the thread that made it.
pub(crate) struct ThreadShared {
    shared: Arc<Shared>,
    thread: usize,
}

impl ThreadShared {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        ThreadShared {
            shared,
            thread: thread_tag(),
        }
    }

    /// The layer's state itself.
    pub(crate) fn layer(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Whether it was made on the running thread.
    #[inline]
    pub(crate) fn is_local(&self) -> bool {
        self.thread == thread_tag()
    }
}

impl Deref for ThreadShared {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl std::fmt::Debug for ThreadShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
    }
}

/// A number that tells the running thread from every other thread alive: the address of a
/// thread-local (a thread that has ended may leave it to a new one, which is harmless here:
/// the handle is then only shared, never wrong).
#[inline]
fn thread_tag() -> usize {
    thread_local! {
        static TAG: u8 = const { 0 };
    }
    TAG.with(|t| std::ptr::from_ref(t) as usize)
}
