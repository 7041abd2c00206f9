//! The [`Cache`] service: decides, per request, whether the cache may answer it (the bypass
//! rules), derives its key, and hands the rest to the response future.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use crate::answer::{Format, Wire};
use crate::flight::Flights;
use crate::future::ResponseFuture;
use crate::key::{CacheKey, KeyDeriver};
use crate::layer::{BypassFn, Partition};
use crate::store::{CacheStore, MemoryStore};

/// The state every clone of one layer's services shares.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn CacheStore>,
    /// The same store when it is the in-memory one (see `Answer::unchecked`).
    pub(crate) memory: Option<MemoryStore>,
    pub(crate) flights: Arc<Flights>,
    pub(crate) keys: KeyDeriver,
    pub(crate) partition: Partition,
    pub(crate) ttl: Duration,
    pub(crate) max_temperature: Option<f64>,
    pub(crate) bypass: Option<BypassFn>,
    pub(crate) allow_fallback: bool,
    pub(crate) max_entry_bytes: usize,
    pub(crate) single_flight: bool,
    /// The semantic cache, when it is on.
    pub(crate) semantic: Option<crate::semantic::Semantic>,
}

/// A request's cache control, as a request extension (or read from its `Cache-Control`
/// header: `no-store` wins over `no-cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheControl {
    /// Do not read the cache; call upstream and store the fresh answer.
    NoCache,
    /// Neither read nor write the cache.
    NoStore,
}

impl CacheControl {
    /// The request's cache control: its extension, else its `Cache-Control` header.
    pub fn of<B>(req: &Request<B>) -> Option<CacheControl> {
        if let Some(c) = req.extensions().get::<CacheControl>() {
            return Some(*c);
        }
        let mut found = None;
        for value in req.headers().get_all(http::header::CACHE_CONTROL) {
            for directive in value.as_bytes().split(|&b| b == b',') {
                let d = directive.trim_ascii();
                if d.eq_ignore_ascii_case(b"no-store") {
                    return Some(CacheControl::NoStore);
                }
                if d.eq_ignore_ascii_case(b"no-cache") {
                    found = Some(CacheControl::NoCache);
                }
            }
        }
        found
    }
}

/// What the cache does with one request.
pub(crate) enum Plan {
    /// Pass it through: neither read nor written.
    Bypass,
    /// Look it up (unless `refresh`), and store a complete answer.
    Cache {
        key: CacheKey,
        wire: Wire,
        format: Format,
        refresh: bool,
    },
}

impl Shared {
    pub(crate) fn plan(&self, req: &Request<Bytes>) -> Plan {
        let control = CacheControl::of(req);
        if control == Some(CacheControl::NoStore) || req.method() != http::Method::POST {
            return Plan::Bypass;
        }
        let Some(wire) = Wire::of(req) else {
            return Plan::Bypass;
        };
        if self.bypass.as_ref().is_some_and(|p| p(req)) {
            return Plan::Bypass;
        }
        let partition = self.partition.of(req);
        let Ok((key, facts)) = self.keys.key(req, partition.as_deref()) else {
            return Plan::Bypass;
        };
        if facts.choices > 1 {
            return Plan::Bypass;
        }
        if let (Some(max), Some(t)) = (self.max_temperature, facts.temperature) {
            if t > max {
                return Plan::Bypass;
            }
        }
        let format = if facts.stream {
            Format::Sse {
                include_usage: facts.include_usage,
            }
        } else {
            Format::Json
        };
        Plan::Cache {
            key,
            wire,
            format,
            refresh: control == Some(CacheControl::NoCache),
        }
    }
}

/// Answers identical requests from stored answers, and shares one upstream call among
/// identical requests in flight. Made by [`CacheLayer`](crate::CacheLayer).
#[derive(Clone)]
pub struct Cache<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Cache<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("inner", &self.inner)
            .field("ttl", &self.shared.ttl)
            .finish_non_exhaustive()
    }
}

impl<S> Cache<S> {
    /// Wraps `inner` with a cache over `store` with the defaults, as
    /// [`CacheLayer::new`](crate::CacheLayer::new) does.
    pub fn new(inner: S, store: impl CacheStore) -> Self {
        let layer = crate::CacheLayer::new(store);
        Cache::from_shared(inner, layer.shared().clone())
    }

    pub(crate) fn from_shared(inner: S, shared: Arc<Shared>) -> Self {
        Cache { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> Cache<S> {
    /// A cache over an in-memory store with its default bounds.
    pub fn in_memory(inner: S) -> Self {
        Cache::new(inner, MemoryStore::new())
    }
}

impl<S, B> Service<Request<Bytes>> for Cache<S>
where
    S: Service<Request<Bytes>, Response = Response<B>> + Clone,
    B: Body<Data = Bytes>,
{
    type Response = Response<crate::CacheBody<B>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        match self.shared.plan(&req) {
            Plan::Bypass => {
                let context = crate::future::context_of(&req);
                ResponseFuture::bypass(self.inner.call(req), context)
            }
            Plan::Cache {
                key,
                wire,
                format,
                refresh,
            } => {
                // Read before the lookup: see `Pending::miss`.
                let landed = self.shared.flights.landed();
                // A store that answers at once (the in-memory one) serves a hit right here:
                // no service clone, no pending call, a future that is ready. The inner
                // service, not called, stays ready for the next call.
                let found = if refresh {
                    None
                } else {
                    self.shared.store.get_now(&key)
                };
                if let Some(Ok(Some(answer))) = &found {
                    let context = crate::future::context_of(&req);
                    return ResponseFuture::hit(answer, format, context);
                }
                // The ready service goes with the future, which may call it later (after a
                // store lookup or a wait); a clone takes its place, as tower's retry does.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                let call = crate::future::Call {
                    shared: self.shared.clone(),
                    key,
                    wire,
                    format,
                    refresh,
                    landed,
                };
                ResponseFuture::cached(ready, req, call, found)
            }
        }
    }
}
