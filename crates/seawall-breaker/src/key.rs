//! Which breaker a request belongs to.

use std::borrow::Cow;

use seawall_core::LlmRequest;

/// Picks the breaker key of a request.
///
/// The default, [`StateKey`], uses [`LlmRequest::state_key`] (`host/model` for HTTP requests).
/// Any `Fn(&Req) -> Cow<'_, str>` is a key function too, e.g. to key by provider only:
///
/// ```
/// use std::borrow::Cow;
/// use bytes::Bytes;
/// use seawall_breaker::CircuitBreakerLayer;
///
/// fn by_host(req: &http::Request<Bytes>) -> Cow<'_, str> {
///     Cow::Borrowed(req.uri().host().unwrap_or("upstream"))
/// }
/// let layer = CircuitBreakerLayer::builder().key_fn(by_host).build().unwrap();
/// # let _ = layer;
/// ```
pub trait KeyFn<Req> {
    /// The key of `req`. Requests without a key share the breaker of the empty key.
    fn key<'a>(&self, req: &'a Req) -> Cow<'a, str>;
}

/// Keys requests by [`LlmRequest::state_key`]: provider host and model for HTTP requests,
/// the model for typed requests; requests without one share the empty key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateKey;

impl<Req: LlmRequest> KeyFn<Req> for StateKey {
    #[inline]
    fn key<'a>(&self, req: &'a Req) -> Cow<'a, str> {
        Cow::Borrowed(req.state_key().unwrap_or(""))
    }
}

impl<Req, F> KeyFn<Req> for F
where
    F: for<'a> Fn(&'a Req) -> Cow<'a, str>,
{
    #[inline]
    fn key<'a>(&self, req: &'a Req) -> Cow<'a, str> {
        self(req)
    }
}
