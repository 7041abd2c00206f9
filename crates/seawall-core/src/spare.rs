//! A spare clone of a layer's inner service, for the calls a layer may make after the first:
//! why and how are in [`Spare`]'s docs, which users of the layers read too.

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::ThreadBound;

/// One thread's handle on the spare: the service behind a lock, so that a spare of a service
/// that is `Send` but not `Sync` can be shared by the clones of a layer across threads.
type Handle<S> = Arc<ThreadBound<Mutex<S>>>;

/// The spare clone a layer's service keeps for its calls' later attempts.
///
/// A layer that may send a call down again, or later (a retry, a fallback to the same path
/// with another model, a continuation, a cache miss found after a wait), needs a service of
/// its own for that later call: the ready service makes the first attempt and stays with the
/// layer for the caller's next call, as tower's contract has it. tower's retry clones the
/// inner service with every call for this. But later calls are rare, and cloning a stack
/// writes a reference count per layer below (and releases it when the call ends), and carries
/// the clone in every call's future.
///
/// So such a layer keeps one spare clone, made when the layer wraps its service and shared by
/// the service's clones (the clone a layer above keeps of it, and a clone made per request
/// before it is polled, included). Each call takes this thread's handle on it as a
/// [`SpareClone`] (one count written, on a line only this thread writes; see [`ThreadBound`])
/// and clones the spare only when it calls again.
///
/// A later call's service is then a clone of the inner service as it was when the spare was
/// made, not as it is at the call: the same thing for services whose clones share their state
/// (seawall's layers, a hyper client, a tower `Buffer`). A layer's `get_mut` forgets the spare
/// ([`forget`](Self::forget)): it is made again, from the changed service, at the next
/// `poll_ready`.
pub struct Spare<S> {
    handle: Option<Handle<S>>,
}

impl<S> Spare<S> {
    /// No spare: one is made at the next [`ready`](Self::ready) or [`claim`](Self::claim).
    pub const fn none() -> Self {
        Spare { handle: None }
    }

    /// Forgets the spare, so that the next [`ready`](Self::ready) makes a new one (after the
    /// inner service was changed through `get_mut`).
    pub fn forget(&mut self) {
        self.handle = None;
    }
}

impl<S: Clone> Spare<S> {
    /// A spare cloned from `inner`.
    pub fn of(inner: &S) -> Self {
        Spare {
            handle: Some(made(inner)),
        }
    }

    /// Makes the spare from `inner` if there is none, and the handle this thread's: called
    /// from `poll_ready`, so a clone the layer above keeps of the ready service shares it.
    #[inline]
    pub fn ready(&mut self, inner: &S) {
        match &mut self.handle {
            Some(handle) => ThreadBound::rebind(handle),
            None => self.handle = Some(made(inner)),
        }
    }

    /// A call's claim on the spare, from which its later attempts' service is cloned: this
    /// thread's handle when `ready` was called here, as `poll_ready` does before `call`.
    #[inline]
    pub fn claim(&mut self, inner: &S) -> SpareClone<S> {
        let handle = self.handle.get_or_insert_with(|| made(inner));
        SpareClone {
            handle: handle.clone(),
            service: None,
        }
    }
}

/// A new spare cloned from `inner`, with a handle of the running thread's.
#[cold]
fn made<S: Clone>(inner: &S) -> Handle<S> {
    Arc::new(ThreadBound::new(Arc::new(Mutex::new(inner.clone()))))
}

impl<S> Clone for Spare<S> {
    fn clone(&self) -> Self {
        Spare {
            handle: self.handle.clone(),
        }
    }
}

impl<S> fmt::Debug for Spare<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Spare")
            .field("made", &self.handle.is_some())
            .finish()
    }
}

/// One call's service for its later attempts: cloned from the layer's [`Spare`] at the first
/// use, then kept (polled ready before each attempt, as any service).
///
/// Two pointers wide: the clone is boxed, so that the future of every call, which holds one
/// of these, is not as large as the stack below (and copied as such through each layer above)
/// for a service that few calls use.
pub struct SpareClone<S> {
    handle: Handle<S>,
    service: Option<Box<S>>,
}

impl<S: Clone> SpareClone<S> {
    /// The service, cloned from the spare if this is its first use.
    pub fn get(&mut self) -> &mut S {
        let handle = &self.handle;
        // A poisoned lock only means a clone panicked while holding it; the spare is whole.
        self.service.get_or_insert_with(|| {
            Box::new(handle.lock().unwrap_or_else(|p| p.into_inner()).clone())
        })
    }
}

impl<S> SpareClone<S> {
    /// Whether the spare has been cloned for this call.
    pub fn is_cloned(&self) -> bool {
        self.service.is_some()
    }
}

impl<S> fmt::Debug for SpareClone<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpareClone")
            .field("cloned", &self.is_cloned())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use seawall_test_support::count_clones;

    use super::*;

    #[test]
    fn calls_share_one_spare_and_clone_it_only_when_they_call_again() {
        let (inner, clones) = count_clones(());
        let mut spare = Spare::of(&inner);
        assert_eq!(clones.count(), 1, "the spare itself");
        let mut kept = spare.clone();
        let claims: Vec<_> = (0..5).map(|_| spare.claim(&inner)).collect();
        let mut from_kept = kept.claim(&inner);
        assert_eq!(clones.count(), 1, "claims clone nothing");
        assert!(claims.iter().all(|c| !c.is_cloned()));
        from_kept.get();
        from_kept.get();
        assert!(from_kept.is_cloned());
        assert_eq!(clones.count(), 2, "one clone per call that calls again");
        drop(claims);
        spare.forget();
        spare.ready(&inner);
        assert_eq!(clones.count(), 3, "a forgotten spare is made again");
        spare.ready(&inner);
        let _ = spare.claim(&inner);
        assert_eq!(clones.count(), 3, "and only once");
    }

    #[test]
    fn a_service_moved_to_another_thread_takes_a_handle_of_its_own_on_the_same_spare() {
        let (inner, clones) = count_clones(());
        let mut spare = Spare::of(&inner);
        spare.ready(&inner);
        let here = spare.handle.clone().unwrap();
        let mut moved = spare.clone();
        let (local, same) = std::thread::spawn(move || {
            moved.ready(&inner);
            let there = moved.handle.unwrap();
            (there.is_local(), Arc::ptr_eq(there.shared(), here.shared()))
        })
        .join()
        .unwrap();
        assert!(local && same);
        assert_eq!(clones.count(), 1, "no second spare");
    }

    #[test]
    fn calls_on_many_threads_clone_the_one_spare_once_each_and_only_when_they_call_again() {
        let (inner, clones) = count_clones(());
        let spare = Spare::of(&inner);
        std::thread::scope(|scope| {
            for t in 0..4 {
                let mut spare = spare.clone();
                let inner = &inner;
                scope.spawn(move || {
                    spare.ready(inner);
                    for i in 0..100 {
                        let mut claim = spare.claim(inner);
                        if (t + i) % 2 == 0 {
                            claim.get();
                            claim.get();
                        }
                    }
                });
            }
        });
        assert_eq!(clones.count(), 1 + 200);
    }
}
