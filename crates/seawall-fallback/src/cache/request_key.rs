//! What makes two requests the same for the last-resort cache, and which requests are never
//! cached.

use std::hash::{Hash, Hasher};

use bytes::Bytes;
use http::Request;
use seawall_core::LlmRequest;

/// What identifies a request for the last-resort cache.
///
/// Implemented for `http::Request<Bytes>`; a typed request that derives `Hash` implements it
/// with `self.hash(state); !self.is_streaming()`.
pub trait RequestKey {
    /// Feeds what makes two requests identical into `state`; returns `false` when the request
    /// must not be cached (a streaming request, say).
    fn cache_key<H: Hasher>(&self, state: &mut H) -> bool;
}

/// Headers that change the answer or the tenant, hashed into an HTTP request's key. Their
/// values are only hashed, never stored.
const KEY_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "api-key",
    "anthropic-version",
    "anthropic-beta",
    "openai-organization",
    "openai-project",
];

/// Method, URI, body, and the credential and API-version headers (so two tenants never share
/// an entry). Streaming requests are not cached: their answer cannot be replayed as a stream.
impl RequestKey for Request<Bytes> {
    fn cache_key<H: Hasher>(&self, state: &mut H) -> bool {
        if self.is_streaming() {
            return false;
        }
        self.method().hash(state);
        self.uri().hash(state);
        for name in KEY_HEADERS {
            for value in self.headers().get_all(*name) {
                name.hash(state);
                value.as_bytes().hash(state);
            }
        }
        self.body().hash(state);
        true
    }
}

#[cfg(test)]
mod tests {
    use std::collections::hash_map::RandomState;
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn streaming_requests_have_no_key_and_tenants_differ() {
        let make = |body: &'static str, key: &'static str| {
            let mut r = Request::post("https://api.openai.com/v1/chat/completions")
                .header("authorization", key)
                .body(Bytes::from_static(body.as_bytes()))
                .unwrap();
            r.prepare();
            r
        };
        let hasher = RandomState::new();
        let key = |r: &Request<Bytes>| {
            let mut h = hasher.build_hasher();
            r.cache_key(&mut h).then(|| h.finish())
        };
        let plain = r#"{"model":"m","messages":[]}"#;
        let a = key(&make(plain, "Bearer a")).unwrap();
        assert_eq!(Some(a), key(&make(plain, "Bearer a")));
        assert_ne!(Some(a), key(&make(plain, "Bearer b")));
        assert_eq!(
            key(&make(
                r#"{"model":"m","stream":true,"messages":[]}"#,
                "Bearer a"
            )),
            None
        );
    }
}
