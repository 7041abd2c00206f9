//! The gate's service: prices a request (one request and its estimated tokens), admits it at
//! once when a permit and the key's rates allow, and otherwise queues it in the response future
//! or rejects it, so `poll_ready` never waits on the gate.

use std::sync::Arc;
use std::task::{Context, Poll};

use seawall_core::{Deadline, KeyFn, LlmError, LlmRequest, LlmResponse, Standby, StateKey};
use tokio::time::Instant;
use tower_service::Service;

use crate::config::{check, default_settings};
use crate::error::RejectReason;
use crate::future::{ResponseFuture, note_rejected};
use crate::handle::GateHandle;
use crate::key::{Cost, KeyState};
use crate::shared::{GatePermit, LocalShared, Shared};

/// A service behind a concurrency gate: made by
/// [`ConcurrencyGateLayer`](crate::ConcurrencyGateLayer); every clone shares the same gate.
///
/// Readiness is the inner service's; the gate's own decisions (wait, admit, reject) happen in
/// the response future, so a full gate never makes `poll_ready` fail.
#[derive(Clone, Debug)]
pub struct ConcurrencyGate<S, K = StateKey> {
    inner: S,
    /// The gate's state as this thread's services share it.
    shared: Arc<LocalShared>,
    key: K,
    /// The state of the last key this service called under (see `Keys::get_remembered`).
    last_key: Option<Arc<KeyState>>,
}

impl<S> ConcurrencyGate<S> {
    /// Wraps `inner` in a gate of `limit` permits with the default queue bound, wait and no
    /// rates, keyed by [`LlmRequest::state_key`], as
    /// [`ConcurrencyGateLayer::new`](crate::ConcurrencyGateLayer::new) does. The gate is this
    /// service's and its clones'; build a layer to share it or change the settings.
    ///
    /// # Panics
    ///
    /// If `limit` is more than the gate can count (`tokio`'s semaphore maximum, about 2^61).
    pub fn new(inner: S, limit: usize) -> Self {
        let settings = default_settings(limit);
        if let Err(e) = check(&settings) {
            panic!("{e}");
        }
        Self::from_parts(inner, Arc::new(Shared::new(settings)), StateKey)
    }
}

impl<S, K> ConcurrencyGate<S, K> {
    pub(crate) fn from_parts(inner: S, shared: Arc<Shared>, key: K) -> Self {
        ConcurrencyGate {
            inner,
            shared: Arc::new(LocalShared::new(shared)),
            key,
            last_key: None,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// A handle on the gate, shared with every other service of the same layer.
    pub fn handle(&self) -> GateHandle {
        GateHandle::new(self.shared.shared().clone())
    }
}

impl<S, K, Req> Service<Req> for ConcurrencyGate<S, K>
where
    S: Service<Req> + Clone,
    S::Response: LlmResponse,
    S::Error: Into<LlmError>,
    K: KeyFn<Req>,
    Req: LlmRequest,
{
    type Response = <S::Response as LlmResponse>::Hooked<GatePermit>;
    type Error = LlmError;
    type Future = ResponseFuture<S, Req, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let sizes = req.prepared().sizes;
        LocalShared::rebind(&mut self.shared);
        let deadline = req.deadline();
        // A call already past its caller's deadline spends nothing, not even a permit.
        if let Some(d) = deadline.filter(Deadline::has_passed) {
            return ResponseFuture::refused(self.shared.expired(&d));
        }
        let lane = self.shared.lane_of(&mut req);
        let cost = Cost::of_sizes(&sizes, &self.shared.parts);
        let start = Instant::now();
        let key = self
            .shared
            .key_state(self.key.key(&req).as_deref(), &mut self.last_key, start);
        let key = match Shared::try_admit(&self.shared, key, cost, lane, start) {
            Ok(permit) => return ResponseFuture::call(&mut self.inner, req, permit),
            Err(key) => key,
        };
        match self.shared.shared().enter_queue(lane) {
            Ok(ticket) => {
                let cx = req.call_context().cloned();
                let standby = Standby::is_on(&req);
                let admission = Box::pin(
                    self.shared
                        .shared()
                        .clone()
                        .wait(key, cost, lane, start, deadline, ticket, cx, standby),
                );
                // The ready service goes with the future; this one gets a fresh clone.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::admitting(admission, inner, req)
            }
            Err(_depth) => {
                let err =
                    self.shared
                        .reject(RejectReason::QueueFull, &key, Default::default(), None);
                note_rejected(req.call_context().map(|c| &**c), Default::default());
                ResponseFuture::refused(err)
            }
        }
    }
}
