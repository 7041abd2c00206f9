//! Shared state held through a handle of one thread.
//!
//! A layer's services share its state through an `Arc`. Cloning that `Arc` for every call
//! writes its reference count, a cache line that every thread calling through the layer
//! writes, so two threads calling at once take turns owning it. A layer can instead give the
//! services of each thread a [`ThreadBound`] of its own, made once per thread and shared by
//! count only there: the calls of one thread then write a count no other thread writes.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// An `Arc<T>` bound to the thread that made it: the handle a thread's services share.
///
/// Clone it behind an `Arc<ThreadBound<T>>` on the thread that made it; a service moved to
/// another thread checks [`is_local`](Self::is_local) and makes a new handle there.
pub struct ThreadBound<T> {
    shared: Arc<T>,
    thread: usize,
}

impl<T> ThreadBound<T> {
    /// A handle on `shared`, bound to the running thread.
    pub fn new(shared: Arc<T>) -> Self {
        ThreadBound {
            shared,
            thread: thread_tag(),
        }
    }

    /// The state every thread shares.
    pub fn shared(&self) -> &Arc<T> {
        &self.shared
    }

    /// Whether this handle was made on the running thread.
    #[inline]
    pub fn is_local(&self) -> bool {
        self.thread == thread_tag()
    }

    /// Makes `handle` the running thread's: a service that has moved to another thread gets
    /// a new handle there, on the same state; on its own thread this does nothing.
    #[inline]
    pub fn rebind(handle: &mut Arc<Self>) {
        if !handle.is_local() {
            *handle = Arc::new(ThreadBound::new(handle.shared.clone()));
        }
    }
}

impl<T> Deref for ThreadBound<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.shared
    }
}

impl<T: fmt::Debug> fmt::Debug for ThreadBound<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.fmt(f)
    }
}

/// A number that tells the running thread from every other thread alive: the address of a
/// thread-local. A thread that has ended may leave its number to a new one, which is harmless
/// for a handle: it is then shared by count with that thread too, never wrong.
#[inline]
pub fn thread_tag() -> usize {
    thread_local! {
        static TAG: u8 = const { 0 };
    }
    TAG.with(|t| std::ptr::from_ref(t) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_is_local_only_on_the_thread_that_made_it() {
        let handle = Arc::new(ThreadBound::new(Arc::new(7)));
        assert!(handle.is_local());
        assert_eq!(**handle, 7);
        let moved = handle.clone();
        let elsewhere = std::thread::spawn(move || moved.is_local()).join().unwrap();
        assert!(!elsewhere);
        assert_ne!(std::thread::spawn(thread_tag).join().unwrap(), thread_tag());
    }

    #[test]
    fn rebinding_keeps_a_local_handle_and_remakes_a_moved_one_on_the_same_state() {
        let state = Arc::new(7);
        let mut handle = Arc::new(ThreadBound::new(state.clone()));
        let before = handle.clone();
        ThreadBound::rebind(&mut handle);
        assert!(Arc::ptr_eq(&handle, &before));
        let moved = std::thread::spawn(move || {
            let mut h = before;
            ThreadBound::rebind(&mut h);
            (h.is_local(), Arc::ptr_eq(h.shared(), &state), h)
        })
        .join()
        .unwrap();
        assert!(moved.0 && moved.1);
        assert!(!Arc::ptr_eq(&moved.2, &handle));
    }
}
