//! The [`Cache`] service: decides, per request, whether the cache may answer it (the bypass
//! rules), derives its key, and hands the rest to the response future.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Body;
use seawall_core::Spare;
use tower_service::Service;

use crate::answer::{Answer, Format, Wire};
use crate::flight::{FlightState, Flights, Lead};
use crate::future::ResponseFuture;
use crate::key::{CacheKey, KEY_HEADERS, KeyDeriver};
use crate::layer::{BypassFn, CREDENTIAL_HEADERS, Partition};
use crate::store::{CacheStore, Looked, MemoryStore};

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
        CacheControl::read(req, true)
    }

    /// As [`of`](Self::of), the header read only when `header` (it is present).
    fn read<B>(req: &Request<B>, header: bool) -> Option<CacheControl> {
        if let Some(c) = req.extensions().get::<CacheControl>() {
            return Some(*c);
        }
        if !header {
            return None;
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

/// The request headers the cache reads, found in one pass over the request's headers.
///
/// A lookup by name hashes the name, and most names the cache looks for are absent from a
/// given request (no `Cache-Control`, no Anthropic version headers, at most one of the three
/// credential headers): one pass over the few headers a request carries, comparing names,
/// costs less than those six lookups. A request with many headers is read by lookups.
pub(crate) struct Heads<'a> {
    /// Whether a `Cache-Control` header may be present (false: it is not).
    cache_control: bool,
    /// Whether a header the key covers may be present (false: none is).
    keyed: bool,
    /// The first credential header's value, in [`CREDENTIAL_HEADERS`]' order.
    pub(crate) credential: Option<&'a HeaderValue>,
}

/// Past this many header names, the headers are read by lookups.
const SCAN_AT_MOST: usize = 16;

impl<'a> Heads<'a> {
    pub(crate) fn of(headers: &'a HeaderMap) -> Self {
        if headers.keys_len() > SCAN_AT_MOST {
            return Heads {
                cache_control: true,
                keyed: true,
                credential: CREDENTIAL_HEADERS.iter().find_map(|h| headers.get(h)),
            };
        }
        let mut heads = Heads {
            cache_control: false,
            keyed: false,
            credential: None,
        };
        let mut rank = CREDENTIAL_HEADERS.len();
        // A name's values come in order, the first first (what `get` gives).
        for (name, value) in headers {
            if name == http::header::CACHE_CONTROL {
                heads.cache_control = true;
            } else if KEY_HEADERS.contains(name) {
                heads.keyed = true;
            } else if let Some(r) = CREDENTIAL_HEADERS.iter().position(|c| c == name) {
                if r < rank {
                    rank = r;
                    heads.credential = Some(value);
                }
            }
        }
        heads
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

/// The temperature a request without one is sampled at: OpenAI's, Anthropic's, Gemini's and
/// DeepSeek's default alike.
pub(crate) const DEFAULT_TEMPERATURE: f64 = 1.0;

impl Shared {
    /// Ends `lead` as `state` in the table it came from: the in-memory store's, or the one
    /// beside a remote store.
    pub(crate) fn end_lead(&self, lead: Lead, state: FlightState) {
        match &self.memory {
            Some(memory) => lead.end(memory, state),
            None => lead.end(&self.flights, state),
        }
    }

    /// Ends `lead` with `answer`, found stored: its waiters are served it.
    pub(crate) fn serve_lead(&self, lead: Lead, answer: Arc<Answer>) {
        match &self.memory {
            Some(memory) => lead.end(memory, FlightState::Done(answer)),
            None => drop(lead.done(&self.flights, answer)),
        }
    }

    pub(crate) fn plan(&self, req: &Request<Bytes>) -> Plan {
        let heads = Heads::of(req.headers());
        let control = CacheControl::read(req, heads.cache_control);
        if control == Some(CacheControl::NoStore) || req.method() != http::Method::POST {
            return Plan::Bypass;
        }
        let Some(wire) = Wire::of(req) else {
            return Plan::Bypass;
        };
        if self.bypass.as_ref().is_some_and(|p| p(req)) {
            return Plan::Bypass;
        }
        let partition = self.partition.of(req, &heads);
        let Ok((key, facts)) = self.keys.key_of(req, partition.as_deref(), heads.keyed) else {
            return Plan::Bypass;
        };
        if facts.choices > 1 {
            return Plan::Bypass;
        }
        // A request that names no temperature is sampled at the provider's default, not
        // greedily: under a threshold below it, it is not cached.
        if let Some(max) = self.max_temperature {
            if facts.temperature.unwrap_or(DEFAULT_TEMPERATURE) > max {
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
    /// A clone of `inner` for the calls that go upstream after a wait: a store's future, an
    /// identical call in flight, a semantic search (see `seawall_core::Spare`).
    spare: Spare<S>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Cache<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("inner", &self.inner)
            .field("ttl", &self.shared.ttl)
            .finish_non_exhaustive()
    }
}

impl<S: Clone> Cache<S> {
    /// Wraps `inner` with a cache over `store` with the defaults, as
    /// [`CacheLayer::new`](crate::CacheLayer::new) does.
    pub fn new(inner: S, store: impl CacheStore) -> Self {
        let layer = crate::CacheLayer::new(store);
        Cache::from_shared(inner, layer.shared().clone())
    }

    pub(crate) fn from_shared(inner: S, shared: Arc<Shared>) -> Self {
        Cache {
            spare: Spare::of(&inner),
            inner,
            shared,
        }
    }

    /// A cache over an in-memory store with its default bounds.
    pub fn in_memory(inner: S) -> Self {
        Cache::new(inner, MemoryStore::new())
    }
}

impl<S> Cache<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably. The spare the calls that go upstream after a wait are
    /// cloned from is made again from it at the next `poll_ready`.
    pub fn get_mut(&mut self) -> &mut S {
        self.spare.forget();
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
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
        self.spare.ready(&self.inner);
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
                // What the store says at once. The in-memory store answers, and on a miss
                // joins the key's flight in the same step; a remote store may answer at once
                // (`get_now`), and a leader of its flight looks again if a flight landed
                // since `landed` was read, before the lookup (see `Pending::miss`).
                let (now, landed) = match (&self.shared.memory, refresh) {
                    (Some(memory), false) => {
                        (Some(Ok(memory.look(&key, self.shared.single_flight))), 0)
                    }
                    _ => {
                        let landed = self.shared.flights.landed();
                        let found = if refresh {
                            None
                        } else {
                            self.shared.store.get_now(&key)
                        };
                        let now = found.map(|f| f.map(|a| a.map_or(Looked::Miss, Looked::Hit)));
                        (now, landed)
                    }
                };
                // A hit is served right here: no service clone, no pending call, a future
                // that is ready; the inner service, not called, stays ready for the next call.
                if let Some(Ok(Looked::Hit(answer))) = &now {
                    let context = crate::future::context_of(&req);
                    return ResponseFuture::hit(answer, format, context);
                }
                let call = crate::future::Call {
                    shared: self.shared.clone(),
                    key,
                    wire,
                    format,
                    refresh,
                    landed,
                };
                match now {
                    // A miss known at once may go upstream from here (see `missed`).
                    Some(Ok(looked)) => {
                        ResponseFuture::missed(&mut self.inner, &mut self.spare, req, call, looked)
                    }
                    // Not known at once (a remote store's lookup, or a refresh), or a failed
                    // lookup: the future may go upstream later, on a clone of the spare, made
                    // then; the ready service stays.
                    later => {
                        let found = later.map(|r| r.map(|_| None));
                        let svc = self.spare.claim(&self.inner);
                        ResponseFuture::cached(svc, req, call, found)
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderName, HeaderValue};
    use proptest::prelude::*;

    use super::{CREDENTIAL_HEADERS, Heads, KEY_HEADERS};

    /// What the cache would read with a lookup per name.
    fn looked_up(headers: &HeaderMap) -> (bool, bool, Option<&HeaderValue>) {
        (
            headers.contains_key(http::header::CACHE_CONTROL),
            KEY_HEADERS.iter().any(|h| headers.contains_key(h)),
            CREDENTIAL_HEADERS.iter().find_map(|h| headers.get(h)),
        )
    }

    proptest! {
        /// Whatever the headers' names, order, repeated values and number (on either side of
        /// the scan's limit), one pass finds what the lookups find.
        #[test]
        fn one_pass_over_the_headers_finds_what_lookups_find(
            entries in proptest::collection::vec((0usize..30, 0u8..4), 0..40),
        ) {
            const NAMES: [&str; 8] = [
                "cache-control", "anthropic-version", "anthropic-beta", "authorization",
                "x-api-key", "api-key", "content-type", "accept",
            ];
            let mut headers = HeaderMap::new();
            for (name, value) in entries {
                let name = match NAMES.get(name) {
                    Some(n) => HeaderName::from_static(n),
                    None => HeaderName::from_bytes(format!("x-pad-{name}").as_bytes()).unwrap(),
                };
                headers.append(name, HeaderValue::from(u16::from(value)));
            }
            let heads = Heads::of(&headers);
            let (cache_control, keyed, credential) = looked_up(&headers);
            prop_assert_eq!(heads.credential, credential);
            // Never absent when present; exactly present when the headers were scanned.
            prop_assert!(heads.cache_control >= cache_control && heads.keyed >= keyed);
            if headers.keys_len() <= super::SCAN_AT_MOST {
                prop_assert_eq!((heads.cache_control, heads.keyed), (cache_control, keyed));
            }
        }
    }
}
