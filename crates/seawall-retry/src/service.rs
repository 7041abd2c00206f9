//! The retry service: pays the call's deposit into the retry budget, writes the idempotency
//! key and attempt headers when asked to, then hands the call to the retry loop together with
//! its claim on the layer's spare service for the retries (the service that made the first
//! attempt stays behind for the next call, with whatever it remembers).
//!
//! The retries' service is a clone of the inner one, as in tower's own retry; but a call is
//! rarely retried, so it is cloned only when the call is, from the one spare the service keeps
//! (`seawall_core::Spare`, whose docs say what that changes). The spare is made when the
//! layer wraps the service, and again at the next `poll_ready` after `get_mut`.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::HeaderValue;
use seawall_core::{LlmError, LlmRequest, Spare};
use tower_service::Service;

use crate::config::Settings;
use crate::future::ResponseFuture;
use crate::local::ThreadShared;
use crate::policy::Shared;

/// Retries failed calls to the inner service as the classification allows: see the
/// [crate docs](crate).
///
/// Made by [`BackoffRetryLayer`](crate::BackoffRetryLayer); clones share the layer's budget, switch and jitter source.
#[derive(Clone)]
pub struct BackoffRetry<S> {
    inner: S,
    /// The layer's state as this thread's services share it (see `local`).
    shared: Arc<ThreadShared>,
    /// A clone of `inner` for the retries (see the module docs).
    spare: Spare<S>,
}

impl<S: Clone> BackoffRetry<S> {
    /// Wraps `inner` with the defaults, as
    /// [`BackoffRetryLayer::new`](crate::BackoffRetryLayer::new) does; use
    /// [`BackoffRetryLayer::builder`](crate::BackoffRetryLayer::builder) to change them.
    pub fn new(inner: S) -> Self {
        let shared = Settings::default()
            .into_shared()
            .expect("the default configuration is valid");
        Self::from_shared(inner, Arc::new(shared))
    }

    pub(crate) fn from_shared(inner: S, shared: Arc<Shared>) -> Self {
        BackoffRetry {
            spare: Spare::of(&inner),
            shared: Arc::new(ThreadShared::new(shared)),
            inner,
        }
    }
}

impl<S> BackoffRetry<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably. The retries' spare clone is made again from it at the next
    /// `poll_ready`.
    pub fn get_mut(&mut self) -> &mut S {
        self.spare.forget();
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The runtime switch and counters of the layer this service came from.
    pub fn handle(&self) -> crate::RetryHandle {
        crate::RetryHandle::new(self.shared.shared().clone())
    }
}

impl<S, Req> Service<Req> for BackoffRetry<S>
where
    S: Service<Req> + Clone,
    S::Error: Into<LlmError>,
    Req: LlmRequest + Clone,
{
    type Response = S::Response;
    type Error = LlmError;
    type Future = ResponseFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Made ready on another thread than before: a handle of this thread's, once.
        ThreadShared::rebind(&mut self.shared);
        // Made again here after `get_mut`, before a layer above clones this service to keep:
        // the clone then shares it (made at `call`, each such clone would make its own).
        self.spare.ready(&self.inner);
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        req.prepare();
        // One extension lookup; the clock is read only when the caller set a deadline.
        let deadline = req.deadline();
        if let Some(d) = deadline.filter(|d| d.has_passed()) {
            // Past the caller's deadline: no attempt, no deposit into the retry budget. The
            // service stays ready for the next call.
            let spare = self.spare.claim(&self.inner);
            return ResponseFuture::expired(spare, req, self.shared.clone(), d.exceeded());
        }
        if let Some(budget) = &self.shared.budget {
            budget.deposit();
        }
        if self.shared.policy.writes_headers {
            write_headers(&mut req, &self.shared);
        }
        if let Some(cx) = req.call_context() {
            cx.update(|facts| facts.attempts += 1);
        }
        // Kept in parts, not cloned: a call that is never retried allocates nothing for it.
        let retained = req.keep();
        // tower's contract: `call` only on a service that said it was ready. The one that did
        // makes this attempt and stays here (the caller's next `poll_ready` asks it again), so
        // whatever it remembers from the call (a breaker's last key, say) serves the next
        // call; the retries clone the spare and poll their clone ready first.
        let spare = self.spare.claim(&self.inner);
        let future = self.inner.call(req);
        ResponseFuture::new(future, spare, retained, self.shared.clone(), deadline)
    }
}

impl<S: fmt::Debug> fmt::Debug for BackoffRetry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackoffRetry")
            .field("inner", &self.inner)
            .field("shared", &self.shared)
            .finish()
    }
}

/// Adds the idempotency key (unless the caller set one) and the first attempt number.
#[cold]
#[inline(never)]
fn write_headers<Req: LlmRequest>(req: &mut Req, shared: &Shared) {
    let Some(headers) = req.headers_mut() else {
        return;
    };
    if let Some(name) = &shared.policy.idempotency_header {
        if !headers.contains_key(name) {
            headers.insert(name.clone(), idempotency_key(shared));
        }
    }
    if let Some(name) = &shared.policy.attempt_header {
        headers.insert(name.clone(), attempt_value(1));
    }
}

/// A v4 UUID from the layer's entropy-seeded key source.
fn idempotency_key(shared: &Shared) -> HeaderValue {
    let mut bits = (u128::from(shared.keys.next_u64()) << 64) | u128::from(shared.keys.next_u64());
    bits = (bits & !(0xF << 76)) | (0x4 << 76); // version 4
    bits = (bits & !(0x3 << 62)) | (0x2 << 62); // RFC 4122 variant
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 36];
    let mut nibble = 32;
    for (i, slot) in out.iter_mut().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            *slot = b'-';
        } else {
            nibble -= 1;
            *slot = HEX[((bits >> (nibble * 4)) & 0xF) as usize];
        }
    }
    HeaderValue::from_bytes(&out).expect("hex digits and dashes are a valid header value")
}

/// The attempt number as a header value; no allocation for the usual small numbers.
pub(crate) fn attempt_value(attempt: u32) -> HeaderValue {
    const SMALL: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match SMALL.get(attempt as usize) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(attempt),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_v4_uuids_and_differ() {
        let shared = Settings::default().into_shared().unwrap();
        let a = idempotency_key(&shared);
        let b = idempotency_key(&shared);
        assert_ne!(a, b);
        let s = a.to_str().unwrap();
        assert_eq!(s.len(), 36);
        assert_eq!(&s[14..15], "4", "{s}");
        assert!(matches!(&s[19..20], "8" | "9" | "a" | "b"), "{s}");
        assert_eq!(s.matches('-').count(), 4);
        assert_eq!(attempt_value(3), "3");
        assert_eq!(attempt_value(12), "12");
    }
}
