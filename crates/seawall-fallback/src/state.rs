//! What every service made by one [`FallbackLayer`](crate::FallbackLayer) shares: the
//! fallback lists, the limits, the cache and the degraded response.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use seawall_core::{Dispositions, FailureClass, Fallback, LlmError};

use crate::cache::CacheOps;
use crate::target::Target;

/// The layer's state as one thread's services and calls hold it.
///
/// Every call's future keeps the layer's state until the call ends, and every answer names
/// who served it. Cloned from the layer's one `Arc`, and the primary's one name, for each
/// call, that would write two counts, cache lines every thread calling through the layer
/// writes, on every call. The services of one thread share a handle of their own instead,
/// made once per thread, with the thread's own copy of the primary's name.
pub(crate) struct Local<Req, Resp> {
    shared: seawall_core::ThreadBound<Shared<Req, Resp>>,
    /// The primary's name: the same text as the layer's, this thread's own count.
    pub(crate) primary_name: Arc<str>,
}

impl<Req, Resp> Local<Req, Resp> {
    /// A handle on `shared` for the running thread.
    pub(crate) fn new(shared: Arc<Shared<Req, Resp>>) -> Arc<Self> {
        Arc::new(Local {
            primary_name: Arc::from(&*shared.primary_name),
            shared: seawall_core::ThreadBound::new(shared),
        })
    }

    /// This handle, or a new one when the service has moved to another thread.
    pub(crate) fn here(self: &mut Arc<Self>) {
        if !self.shared.is_local() {
            *self = Local::new(self.shared.shared().clone());
        }
    }
}

impl<Req, Resp> std::ops::Deref for Local<Req, Resp> {
    type Target = Shared<Req, Resp>;

    fn deref(&self) -> &Shared<Req, Resp> {
        &self.shared
    }
}

type Degraded<Req, Resp> = Box<dyn Fn(&Req, &LlmError) -> Resp + Send + Sync>;

/// The configuration every service made by one [`FallbackLayer`] shares.
pub(crate) struct Shared<Req, Resp> {
    /// `"primary"`: the name [`ServedBy`](seawall_core::ServedBy) gives the primary path.
    pub(crate) primary_name: Arc<str>,
    pub(crate) regular: Vec<Target<Req, Resp>>,
    pub(crate) larger_context: Vec<Target<Req, Resp>>,
    pub(crate) content_policy: Vec<Target<Req, Resp>>,
    pub(crate) dispositions: Dispositions,
    pub(crate) max_fallbacks: usize,
    pub(crate) deadline: Option<Duration>,
    pub(crate) cache: Option<Box<dyn CacheOps<Req, Resp>>>,
    pub(crate) degraded: Option<Degraded<Req, Resp>>,
    /// Some target sends to the wrapped service: each call keeps a clone of it.
    pub(crate) uses_primary: bool,
    /// Some target or the degraded response needs the caller's request: each call keeps a
    /// copy of it ([`LlmRequest::keep`](seawall_core::LlmRequest::keep)).
    pub(crate) keeps_request: bool,
    /// A gate's refusal has a target to go to: the primary's request is marked
    /// [`Standby`](seawall_core::Standby).
    pub(crate) standby: bool,
}

impl<Req, Resp> Shared<Req, Resp> {
    pub(crate) fn list(&self, which: Fallback) -> &[Target<Req, Resp>] {
        match which {
            Fallback::Yes => &self.regular,
            Fallback::LargerContext => &self.larger_context,
            Fallback::ContentPolicy => &self.content_policy,
            Fallback::No => &[],
        }
    }
}

impl<Req, Resp> Shared<Req, Resp> {
    /// The defaults: no targets, at most 3 fallbacks per call, no deadline, no cache, no
    /// degraded response, the lists chosen by [`Dispositions::default`].
    pub(crate) fn new() -> Self {
        Shared {
            primary_name: Arc::from("primary"),
            regular: Vec::new(),
            larger_context: Vec::new(),
            content_policy: Vec::new(),
            dispositions: Dispositions::new(),
            max_fallbacks: 3,
            deadline: None,
            cache: None,
            degraded: None,
            uses_primary: false,
            keeps_request: false,
            standby: false,
        }
    }

    /// The defaults with a regular chain of `targets`, ready to serve.
    pub(crate) fn with_targets(targets: impl IntoIterator<Item = Target<Req, Resp>>) -> Self {
        let mut shared = Shared::new();
        shared.regular.extend(targets);
        shared.finish();
        shared
    }

    /// Works out what each call must keep, once the lists are final.
    pub(crate) fn finish(&mut self) {
        let all = || {
            self.regular
                .iter()
                .chain(&self.larger_context)
                .chain(&self.content_policy)
        };
        let uses_primary = all().any(Target::uses_primary);
        let keeps_request = all().next().is_some() || self.degraded.is_some();
        self.uses_primary = uses_primary;
        self.keeps_request = keeps_request;
        let refused = self.dispositions.get(FailureClass::GateRejected).fallback;
        self.standby = self.max_fallbacks > 0 && !self.list(refused).is_empty();
    }
}

pub(crate) fn debug_shared<Req, Resp>(
    s: &Shared<Req, Resp>,
    mut d: fmt::DebugStruct<'_, '_>,
) -> fmt::Result {
    d.field("targets", &s.regular)
        .field("larger_context", &s.larger_context)
        .field("content_policy", &s.content_policy)
        .field("max_fallbacks", &s.max_fallbacks)
        .field("deadline", &s.deadline)
        .field("cache", &s.cache.is_some())
        .field("degraded", &s.degraded.is_some())
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_is_kept_on_its_thread_and_made_again_on_another_for_the_same_state() {
        let shared = Arc::new(Shared::<u8, u8>::with_targets([]));
        let mut here = Local::new(shared.clone());
        let first = here.clone();
        here.here();
        assert!(Arc::ptr_eq(&here, &first), "a local handle is kept");
        let moved = std::thread::spawn(move || {
            let mut h = first;
            h.here();
            h
        })
        .join()
        .unwrap();
        assert!(!Arc::ptr_eq(&moved, &here), "another thread makes its own");
        assert!(Arc::ptr_eq(moved.shared.shared(), &shared));
        assert_eq!(&*moved.primary_name, &*shared.primary_name);
        assert!(!Arc::ptr_eq(&moved.primary_name, &here.primary_name));
    }
}
