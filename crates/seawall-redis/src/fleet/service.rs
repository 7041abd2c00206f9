//! The fleet limit's service: prices a request as the gate does and hands the admission to
//! its response future, so `poll_ready` never waits on Redis.

use std::sync::Arc;
use std::task::{Context, Poll};

use seawall_core::{KeyFn, LlmError, LlmRequest, LlmResponse, StateKey};
use seawall_gate::{Cost, Rates};
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::FleetLimitLayer;
use super::permit::FleetPermit;
use super::state::Fleet;
use crate::SharedRedis;

/// A service behind fleet-wide limits: made by [`FleetLimitLayer`]; every clone shares the
/// layer's state.
///
/// Readiness is the inner service's; the admission (one script call, and the waits the fleet
/// asks for) happens in the response future.
#[derive(Clone, Debug)]
pub struct FleetLimit<S, K = StateKey> {
    inner: S,
    fleet: Arc<Fleet>,
    key: K,
}

impl<S> FleetLimit<S> {
    /// Wraps `inner` in fleet-wide `rates` on `redis` with the defaults, as
    /// [`FleetLimitLayer::new`] does (inside a tokio runtime). The state is this service's and
    /// its clones'; build a layer to share it or change the settings.
    pub fn new(inner: S, redis: SharedRedis, rates: Rates) -> Self {
        use tower_layer::Layer;
        FleetLimitLayer::new(redis, rates).layer(inner)
    }
}

impl<S, K> FleetLimit<S, K> {
    pub(crate) fn from_parts(inner: S, fleet: Arc<Fleet>, key: K) -> Self {
        FleetLimit { inner, fleet, key }
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
}

impl<S, K, Req> Service<Req> for FleetLimit<S, K>
where
    S: Service<Req> + Clone,
    S::Response: LlmResponse,
    S::Error: Into<LlmError>,
    K: KeyFn<Req>,
    Req: LlmRequest,
{
    type Response = <S::Response as LlmResponse>::Hooked<FleetPermit>;
    type Error = LlmError;
    type Future = ResponseFuture<S, Req, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        req.prepare();
        let cost = Cost::of(&req, &self.fleet.settings.parts);
        let target = Arc::new(self.fleet.target(self.key.key(&req).as_deref()));
        let admission = Box::pin(self.fleet.clone().admit(target, cost));
        // The ready service goes with the future; this one gets a fresh clone.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(admission, inner, req)
    }
}
