//! The fallback service: sends a call down the primary path and starts the chain that takes
//! over when that path has failed for good.
//!
//! A target routed to the primary (the same path with another model) needs a service of its
//! own: the ready one made the first attempt and stays for the caller's next call. As few
//! calls fall back, the chain clones it only when one does, from the one spare the service
//! keeps when some target uses the primary (`seawall_core::Spare`, whose docs say what that
//! changes).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use seawall_core::{Deadline, LlmError, LlmRequest, LlmResponse, Spare, Standby};
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::state::{Local, Shared, debug_shared};
use crate::target::Target;

/// The service made by [`FallbackLayer`](crate::FallbackLayer): calls the wrapped service
/// (the primary path), and on a failure worth it, the targets of the matching fallback list.
pub struct Fallback<S, Req, Resp> {
    inner: S,
    /// The layer's state as this thread's services share it.
    shared: Arc<Local<Req, Resp>>,
    /// A clone of `inner` for the targets routed to it, when some are (see the module docs).
    spare: Spare<S>,
}

impl<S: Clone, Req, Resp> Fallback<S, Req, Resp> {
    /// Wraps `inner` (the primary path) with a regular chain of `targets` and the defaults
    /// otherwise, as [`FallbackLayer::new`](crate::FallbackLayer::new) does.
    pub fn new(inner: S, targets: impl IntoIterator<Item = Target<Req, Resp>>) -> Self {
        Self::from_shared(inner, Arc::new(Shared::with_targets(targets)))
    }

    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<Req, Resp>>) -> Self {
        let spare = if shared.uses_primary {
            Spare::of(&inner)
        } else {
            Spare::none()
        };
        Fallback {
            inner,
            shared: Local::new(shared),
            spare,
        }
    }
}

impl<S, Req, Resp> Fallback<S, Req, Resp> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably. The spare the targets routed to it are cloned from is
    /// made again from it at the next `poll_ready`.
    pub fn get_mut(&mut self) -> &mut S {
        self.spare.forget();
        &mut self.inner
    }

    /// Consumes `self`, returning the wrapped service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req, Resp> Service<Req> for Fallback<S, Req, Resp>
where
    S: Service<Req, Response = Resp> + Clone,
    S::Error: Into<LlmError>,
    Req: LlmRequest + Clone,
    Resp: LlmResponse,
{
    type Response = Resp;
    type Error = LlmError;
    type Future = ResponseFuture<S::Future, S, Req, Resp>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        if self.shared.uses_primary {
            self.spare.ready(&self.inner);
        }
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        req.prepare();
        self.shared.here();
        let shared = self.shared.clone();
        // The chain's deadline: the earlier of the layer's own and the caller's.
        let caller = req.deadline();
        if let Some(expired) = caller.filter(Deadline::has_passed) {
            return ResponseFuture::expired(shared, expired.exceeded());
        }
        // A deadline too far for the clock is no deadline, as before.
        let own = shared
            .deadline
            .and_then(|d| tokio::time::Instant::now().checked_add(d))
            .map(Deadline::at);
        let deadline_at = Deadline::earliest(own, caller).map(|d| d.instant());
        // A layer below that would hold the call for long may refuse it at once instead:
        // this chain takes it. Marked before the request is kept, so a retry's copy has it;
        // a mark from a fallback layer further out is kept for the targets too.
        let outer_standby = Standby::is_on(&req);
        if shared.standby && !outer_standby {
            Standby::set(&mut req, true);
        }
        let cache_key = shared.cache.as_ref().and_then(|c| c.key(&req));
        let model = req.model_shared();
        // Kept in parts, not cloned: a call the primary answers allocates nothing for it.
        let original = shared.keeps_request.then(|| req.keep());
        // The kept request holds the context; only an unkept one needs a copy of its own.
        let context = match original {
            Some(_) => None,
            None => req.call_context().cloned(),
        };
        // `self.inner` is the service that was driven ready: it takes this call. A clone of the
        // spare (made ready again inside the future) takes any later call routed to it.
        let primary = shared.uses_primary.then(|| self.spare.claim(&self.inner));
        let inner = &mut self.inner;
        ResponseFuture::new(
            shared,
            original,
            primary,
            model,
            cache_key,
            context,
            deadline_at,
            outer_standby,
            || inner.call(req),
        )
    }
}

impl<S: Clone, Req, Resp> Clone for Fallback<S, Req, Resp> {
    fn clone(&self) -> Self {
        Fallback {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            spare: self.spare.clone(),
        }
    }
}

impl<S: fmt::Debug, Req, Resp> fmt::Debug for Fallback<S, Req, Resp> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Fallback");
        d.field("inner", &self.inner);
        debug_shared(&self.shared, d)
    }
}
