//! The breaker's service: finds the request's key, asks that key's breaker for a verdict, and
//! either refuses at once or calls the inner service with a guard that reports the outcome.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use seawall_core::{FailureClass, KeyFn, LlmError, LlmRequest, LlmResponse, StateKey};
use tower_service::Service;

use crate::breaker::Refusal;
use crate::config::Config;
use crate::future::{BreakerGuard, Permit, ResponseFuture};
use crate::local::{Held, ThreadShared};
use crate::registry::{BreakerHandle, Shared};

/// A service behind a keyed circuit breaker; made by
/// [`CircuitBreakerLayer`](crate::CircuitBreakerLayer).
///
/// Each service remembers the breaker of the last key it served, so a service that is called
/// again and again (behind tower's `Buffer`, or owned by one task, or cloned for every call
/// by an outer layer) skips the shared map. What a call holds and a clone copies are handles
/// of the running thread (see `local`), so a call writes no count that another thread writes;
/// a memory made on another thread is not used.
pub struct CircuitBreaker<S, K = StateKey> {
    inner: S,
    shared: Arc<ThreadShared>,
    key: K,
    last: Option<Held>,
}

impl<S> CircuitBreaker<S> {
    /// Wraps `inner` in breakers with the default settings, keyed by
    /// [`LlmRequest::state_key`], as
    /// [`CircuitBreakerLayer::new`](crate::CircuitBreakerLayer::new) does. The breakers are
    /// this service's and its clones'; build a layer to share them or change the settings.
    pub fn new(inner: S) -> Self {
        Self::from_parts(inner, Arc::new(Shared::new(Config::default())), StateKey)
    }
}

impl<S, K> CircuitBreaker<S, K> {
    pub(crate) fn from_parts(inner: S, shared: Arc<Shared>, key: K) -> Self {
        CircuitBreaker {
            inner,
            shared: Arc::new(ThreadShared::new(shared)),
            key,
            last: None,
        }
    }

    /// A handle on the breakers this service shares with its layer.
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle::new(self.shared.shared().clone())
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K: Clone> Clone for CircuitBreaker<S, K> {
    fn clone(&self) -> Self {
        CircuitBreaker {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            key: self.key.clone(),
            last: self.last.clone(),
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for CircuitBreaker<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

pub(crate) fn refusal_error(refusal: Refusal) -> LlmError {
    match refusal {
        Refusal::Open {
            retry_after,
            quota: false,
        } => LlmError::from_static(FailureClass::CircuitOpen, "circuit breaker is open")
            .with_retry_after(retry_after),
        // The cause rides along as the source, so a caller can tell "out of quota" from
        // "the upstream is sick" without reading the message.
        Refusal::Open {
            retry_after,
            quota: true,
        } => LlmError::from_static(
            FailureClass::CircuitOpen,
            "circuit breaker is open: the upstream said the quota is exhausted",
        )
        .with_retry_after(retry_after)
        .with_source(LlmError::from_static(
            FailureClass::QuotaExhausted,
            "the upstream said the quota is exhausted",
        )),
        Refusal::ProbesBusy { retry_after } => LlmError::from_static(
            FailureClass::CircuitOpen,
            "circuit breaker is half-open and its probes are busy",
        )
        .with_retry_after(retry_after),
        Refusal::ForcedOpen => {
            LlmError::from_static(FailureClass::CircuitOpen, "circuit breaker is forced open")
        }
    }
}

impl<S, K, Req> Service<Req> for CircuitBreaker<S, K>
where
    S: Service<Req>,
    S::Error: Into<LlmError>,
    S::Response: LlmResponse,
    Req: LlmRequest,
    K: KeyFn<Req>,
{
    type Response = <S::Response as LlmResponse>::Hooked<BreakerGuard>;
    type Error = LlmError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Made ready on another thread than before: a handle of this thread's, once.
        ThreadShared::rebind(&mut self.shared);
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        req.prepare();
        // Past the caller's deadline the attempt is not made: it takes no half-open probe slot
        // and counts neither way. One extension lookup; the clock only with a deadline.
        if let Some(Err(e)) = req.deadline().map(|d| d.check()) {
            return ResponseFuture::rejected(e);
        }
        let breaker = {
            let key = self.key.key(&req);
            let key = key.as_deref().unwrap_or("");
            match &mut self.last {
                Some(b) if b.is_current() && **b.key() == *key => {
                    b.touch();
                    // Served twice in a row: from now on through this thread's handle.
                    b.localize();
                    b.clone()
                }
                _ => {
                    let b = Held::Shared(self.shared.breaker(key));
                    self.last = Some(b.clone());
                    b
                }
            }
        };
        let cfg = &self.shared.cfg;
        let start = if cfg.slow_threshold.is_some() {
            cfg.now()
        } else {
            0
        };
        let permit = match breaker.acquire(|| cfg.now()) {
            Ok(admission) => Permit::new(breaker, admission, start),
            Err(refusal) => {
                if let Some(cx) = req.call_context() {
                    cx.update(|f| f.rejections.push(FailureClass::CircuitOpen));
                }
                return ResponseFuture::rejected(refusal_error(refusal));
            }
        };
        ResponseFuture::new(self.inner.call(req), permit)
    }
}
