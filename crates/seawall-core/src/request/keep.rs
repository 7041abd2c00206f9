//! A copy of a request kept by a layer that may have to send it again: the retry layer for
//! its next attempt, the fallback layer for its targets.
//!
//! Both keep one for every call, and nearly every call succeeds at once, so the copy is almost
//! always dropped unused. A clone of an `http::Request<Bytes>` costs two allocations for its
//! header map and two more for its extensions map, plus one for each value in it (the
//! request's [`RequestMeta`], the observer's call context). So an HTTP request is not cloned
//! whole: its parts are kept in a form that clones without allocating (its few headers in a
//! small inline array, the values seawall puts into the extensions by value), and the request
//! is rebuilt from them, exactly, only when it is sent again. A request with more headers, or
//! with extensions seawall does not know, keeps those maps cloned whole, as before; any other
//! request type is cloned whole.
//!
//! The request's parse ([`RequestMeta`]) is not copied: it is made from the request's own
//! parts, so a rebuilt request is parsed again, to the same value. That costs a parse per
//! request sent again, where copying it cost two atomic writes to its shared names for every
//! call (a few nanoseconds each, even uncontended) and two more to drop them, in each of the
//! three layers that keep requests.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version};

use super::{IDEMPOTENCY_KEY, Idempotent, LlmRequest, RequestMeta, Standby};
use crate::context::CallContext;
use crate::deadline::Deadline;

/// A request kept to be sent again, made by [`LlmRequest::keep`]: [`get`](Self::get) gives
/// a request equal to the one kept, as many times as needed.
pub struct KeptRequest<R> {
    kept: Kept<R>,
}

// The parts are kept inline on purpose: boxing them would be the allocation this saves.
#[allow(clippy::large_enum_variant)]
enum Kept<R> {
    Whole(R),
    // The rebuild function is the only way to turn the parts into `R`: the parts are made only
    // where `R` is `http::Request<Bytes>`, together with it.
    Parts(HttpParts, fn(&HttpParts) -> R),
}

impl<R> KeptRequest<R> {
    /// Keeps `request` as it is (a clone is made by [`get`](Self::get) each time).
    pub fn whole(request: R) -> Self {
        KeptRequest {
            kept: Kept::Whole(request),
        }
    }
}

impl<R: Clone> KeptRequest<R> {
    /// A request equal to the one kept.
    pub fn get(&self) -> R {
        match &self.kept {
            Kept::Whole(r) => r.clone(),
            Kept::Parts(parts, rebuild) => rebuild(parts),
        }
    }
}

impl<R: LlmRequest + Clone> KeptRequest<R> {
    /// Whether the kept request carries the [`Standby`] marker (a fallback stands by for it),
    /// read without rebuilding the request.
    pub fn has_standby(&self) -> bool {
        match &self.kept {
            Kept::Whole(r) => Standby::is_on(r),
            Kept::Parts(parts, _) => match &parts.extensions {
                Ext::Known { standby, .. } => standby.is_some(),
                Ext::Map(map) => map.get::<Standby>().is_some(),
            },
        }
    }

    /// The kept request's [call context](LlmRequest::call_context), read without rebuilding
    /// the request.
    pub fn call_context(&self) -> Option<&Arc<CallContext>> {
        match &self.kept {
            Kept::Whole(r) => r.call_context(),
            Kept::Parts(parts, _) => match &parts.extensions {
                Ext::Known { context, .. } => context.as_ref(),
                Ext::Map(map) => map.get::<Arc<CallContext>>(),
            },
        }
    }

    /// Whether the kept request [is idempotent](LlmRequest::is_idempotent), read without
    /// rebuilding (and parsing) the request.
    pub fn is_idempotent(&self) -> bool {
        match &self.kept {
            Kept::Whole(r) => r.is_idempotent(),
            Kept::Parts(parts, _) => {
                let marked = match &parts.extensions {
                    Ext::Known { idempotent, .. } => idempotent.is_some(),
                    Ext::Map(map) => map.get::<Idempotent>().is_some(),
                };
                marked || parts.headers.contains(&IDEMPOTENCY_KEY)
            }
        }
    }
}

impl<R> fmt::Debug for KeptRequest<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the headers: they may carry credentials.
        let how = match &self.kept {
            Kept::Whole(_) => "whole",
            Kept::Parts(..) => "parts",
        };
        f.debug_struct("KeptRequest")
            .field("kept", &how)
            .finish_non_exhaustive()
    }
}

/// Headers kept inline: more than this many values and the map is cloned whole.
const INLINE_HEADERS: usize = 4;

/// The parts of an `http::Request<Bytes>`.
struct HttpParts {
    method: Method,
    uri: Uri,
    version: Version,
    headers: Headers,
    body: Bytes,
    extensions: Ext,
}

enum Headers {
    /// Up to [`INLINE_HEADERS`] values, in the map's order (`len` of them are `Some`).
    Few([Option<(HeaderName, HeaderValue)>; INLINE_HEADERS]),
    Map(HeaderMap),
}

enum Ext {
    /// The extensions held only values of these types, so they are these values.
    Known {
        /// The request's parse was there (it is made again).
        parsed: bool,
        context: Option<Arc<CallContext>>,
        deadline: Option<Deadline>,
        idempotent: Option<Idempotent>,
        standby: Option<Standby>,
    },
    /// Values of other types too: the map, cloned.
    Map(Extensions),
}

impl HttpParts {
    fn of(req: &Request<Bytes>) -> HttpParts {
        HttpParts {
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            headers: Headers::of(req.headers()),
            body: req.body().clone(),
            extensions: Ext::of(req.extensions()),
        }
    }

    fn rebuild(&self) -> Request<Bytes> {
        let mut req = Request::new(self.body.clone());
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers.rebuild();
        *req.extensions_mut() = self.extensions.rebuild();
        if let Ext::Known { parsed: true, .. } = self.extensions {
            req.prepare();
        }
        req
    }
}

impl Headers {
    fn contains(&self, name: &HeaderName) -> bool {
        match self {
            Headers::Few(few) => few.iter().flatten().any(|(n, _)| n == name),
            Headers::Map(map) => map.contains_key(name),
        }
    }

    fn of(map: &HeaderMap) -> Headers {
        if map.len() > INLINE_HEADERS {
            return Headers::Map(map.clone());
        }
        let mut few: [Option<(HeaderName, HeaderValue)>; INLINE_HEADERS] = Default::default();
        // `iter` gives every value, each name's in order, the names in the map's order:
        // appending them in that order rebuilds the same map.
        for (slot, (name, value)) in few.iter_mut().zip(map) {
            *slot = Some((name.clone(), value.clone()));
        }
        Headers::Few(few)
    }

    fn rebuild(&self) -> HeaderMap {
        match self {
            Headers::Few(few) => {
                let len = few.iter().flatten().count();
                let mut map = HeaderMap::with_capacity(len);
                for (name, value) in few.iter().flatten() {
                    map.append(name.clone(), value.clone());
                }
                map
            }
            Headers::Map(map) => map.clone(),
        }
    }
}

impl Ext {
    fn of(ext: &Extensions) -> Ext {
        // Each type is looked up only while some value is still unaccounted for, in the order
        // they are most often there: a prepared request with a call context, behind a fallback
        // that stands by for it, holds those three, and the last two lookups are skipped.
        let parsed = ext.get::<RequestMeta>().is_some();
        let mut known = usize::from(parsed);
        let context = next_known::<Arc<CallContext>>(ext, &mut known);
        let standby = next_known::<Standby>(ext, &mut known);
        let deadline = next_known::<Deadline>(ext, &mut known);
        let idempotent = next_known::<Idempotent>(ext, &mut known);
        if known == ext.len() {
            Ext::Known {
                parsed,
                context,
                deadline,
                idempotent,
                standby,
            }
        } else {
            Ext::Map(ext.clone())
        }
    }

    fn rebuild(&self) -> Extensions {
        match self {
            Ext::Known {
                parsed: _,
                context,
                deadline,
                idempotent,
                standby,
            } => {
                let mut ext = Extensions::new();
                if let Some(c) = context {
                    ext.insert(c.clone());
                }
                if let Some(d) = deadline {
                    ext.insert(*d);
                }
                if let Some(i) = idempotent {
                    ext.insert(*i);
                }
                if let Some(s) = standby {
                    ext.insert(*s);
                }
                ext
            }
            Ext::Map(ext) => ext.clone(),
        }
    }
}

/// `T`'s value in `ext`, looked up only while fewer than all of the map's values were found
/// (`known` counts them, this one included).
fn next_known<T: Clone + Send + Sync + 'static>(ext: &Extensions, known: &mut usize) -> Option<T> {
    let value = (*known < ext.len()).then(|| ext.get::<T>().cloned())?;
    *known += usize::from(value.is_some());
    value
}

/// How an `http::Request<Bytes>` is kept: in parts.
pub(super) fn keep_http(req: &Request<Bytes>) -> KeptRequest<Request<Bytes>> {
    KeptRequest {
        kept: Kept::Parts(HttpParts::of(req), HttpParts::rebuild),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: usize) -> Request<Bytes> {
        let mut req = Request::post("https://api.openai.com/v1/chat/completions?x=1")
            .version(Version::HTTP_2)
            .body(Bytes::from_static(
                br#"{"model":"gpt-4o","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}"#,
            ))
            .unwrap();
        for i in 0..headers {
            // Two values under one name, to check their order survives.
            req.headers_mut()
                .append("x-multi", HeaderValue::from(i as u64));
        }
        req
    }

    /// Everything of a request that can be compared, extensions by the types seawall knows.
    fn assert_same(a: &Request<Bytes>, b: &Request<Bytes>) {
        assert_eq!(a.method(), b.method());
        assert_eq!(a.uri(), b.uri());
        assert_eq!(a.version(), b.version());
        assert_eq!(a.body(), b.body());
        let ha: Vec<_> = a.headers().iter().collect();
        let hb: Vec<_> = b.headers().iter().collect();
        assert_eq!(ha, hb);
        assert_eq!(a.extensions().len(), b.extensions().len());
        let (ea, eb) = (a.extensions(), b.extensions());
        assert_eq!(ea.get::<RequestMeta>(), eb.get::<RequestMeta>());
        assert_eq!(ea.get::<Deadline>(), eb.get::<Deadline>());
        assert_eq!(ea.get::<Idempotent>(), eb.get::<Idempotent>());
        assert_eq!(ea.get::<Standby>(), eb.get::<Standby>());
        match (ea.get::<Arc<CallContext>>(), eb.get::<Arc<CallContext>>()) {
            (Some(x), Some(y)) => assert!(Arc::ptr_eq(x, y)),
            (x, y) => assert_eq!(x.is_none(), y.is_none()),
        }
    }

    #[test]
    fn a_prepared_request_comes_back_the_same_with_its_known_extensions() {
        let mut req = request(2);
        req.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
        req.prepare();
        req.extensions_mut().insert(Arc::new(CallContext::new()));
        req.extensions_mut().insert(Idempotent);
        req.extensions_mut()
            .insert(Deadline::after(std::time::Duration::from_secs(5)));
        let kept = req.keep();
        assert!(matches!(
            &kept.kept,
            Kept::Parts(
                HttpParts {
                    headers: Headers::Few(_),
                    extensions: Ext::Known { .. },
                    ..
                },
                _
            )
        ));
        assert_same(&kept.get(), &req);
        assert_same(&kept.get(), &req);
        assert!(kept.is_idempotent());
        assert_eq!(kept.get().model(), Some("gpt-4o"));
    }

    #[test]
    fn many_headers_and_unknown_extensions_are_kept_whole() {
        #[derive(Clone, Debug, PartialEq)]
        struct Mine(u32);
        let mut req = request(INLINE_HEADERS + 1);
        req.prepare();
        req.extensions_mut().insert(Mine(7));
        let kept = req.keep();
        assert!(matches!(
            &kept.kept,
            Kept::Parts(
                HttpParts {
                    headers: Headers::Map(_),
                    extensions: Ext::Map(_),
                    ..
                },
                _
            )
        ));
        let again = kept.get();
        assert_same(&again, &req);
        assert_eq!(again.extensions().get::<Mine>(), Some(&Mine(7)));
        assert!(!kept.is_idempotent());
    }

    #[test]
    fn a_request_without_headers_or_extensions_comes_back_empty() {
        let req = request(0);
        let again = req.keep().get();
        assert_same(&again, &req);
        assert!(again.headers().is_empty() && again.extensions().is_empty());
    }

    #[test]
    fn every_mix_of_known_extensions_comes_back_and_an_unknown_one_keeps_the_map() {
        #[derive(Clone, Debug, PartialEq)]
        struct Mine(u32);
        // The known types are looked up only until every value is accounted for: each subset
        // of them, in the map alone or beside a value of another type, must still come back.
        for mask in 0u8..64 {
            let mut req = request(1);
            if mask & 1 != 0 {
                req.prepare();
            }
            let ext = req.extensions_mut();
            if mask & 2 != 0 {
                ext.insert(Arc::new(CallContext::new()));
            }
            if mask & 4 != 0 {
                ext.insert(Deadline::after(std::time::Duration::from_secs(5)));
            }
            if mask & 8 != 0 {
                ext.insert(Idempotent);
            }
            if mask & 32 != 0 {
                ext.insert(Standby);
            }
            if mask & 16 != 0 {
                ext.insert(Mine(u32::from(mask)));
            }
            let kept = req.keep();
            let Kept::Parts(parts, _) = &kept.kept else {
                panic!("an HTTP request is kept in parts");
            };
            assert_eq!(
                matches!(parts.extensions, Ext::Map(_)),
                mask & 16 != 0,
                "mask {mask:06b}"
            );
            let again = kept.get();
            assert_same(&again, &req);
            assert_eq!(
                again.extensions().get::<Mine>(),
                req.extensions().get::<Mine>()
            );
        }
    }

    #[test]
    fn an_idempotency_key_header_is_seen_in_the_kept_request() {
        // Among few headers (kept inline) and among many (the map kept whole).
        for headers in [0, INLINE_HEADERS + 1] {
            let mut req = request(headers);
            assert!(!req.keep().is_idempotent());
            req.headers_mut()
                .insert("idempotency-key", HeaderValue::from_static("k"));
            assert!(req.keep().is_idempotent(), "{headers} headers");
        }
    }

    #[test]
    fn other_request_types_are_kept_whole() {
        let kept = KeptRequest::whole(vec![1, 2, 3]);
        assert_eq!(kept.get(), vec![1, 2, 3]);
        assert_eq!(format!("{kept:?}"), "KeptRequest { kept: \"whole\", .. }");
    }
}
