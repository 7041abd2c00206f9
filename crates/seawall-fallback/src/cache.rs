//! The last-resort cache: the last good answer to an identical request.
//!
//! When every target has failed, an answer that was good a few minutes ago is often better
//! than an error (a summary, a classification, a canned reply). The cache keeps, per request
//! key, the last successful response of a *non-streaming* request, bounded by a TTL, a number
//! of entries and a total size, and serves it only as the last resort, clearly marked.
//!
//! Storing a response means reading its body. A response type opts in through [`Replay`]:
//! `http::Response<B>` does when its body type can be rebuilt from bytes ([`ReplayBody`]:
//! `Full<Bytes>`, `BoxBody<Bytes, E>`, `UnsyncBoxBody<Bytes, E>`); a fully-read typed response
//! does by cloning itself. A body larger than the entry cap is handed to the caller whole
//! (the bytes read so far, then the rest), and not stored.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::{BuildHasher, Hash, Hasher};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Full};
use seawall_core::{LlmRequest, ServedBy};
use tokio::time::Instant;

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Settings of the last-resort cache.
///
/// Defaults: at most 1024 entries, 32 MiB in total, 1 MiB per entry.
///
/// ```
/// use std::time::Duration;
/// use seawall_fallback::ResponseCache;
///
/// let cache = ResponseCache::new(Duration::from_secs(600))
///     .with_max_entries(256)
///     .with_max_entry_bytes(64 * 1024);
/// assert_eq!(cache.max_entries(), 256);
/// assert_eq!(cache.max_bytes(), 32 * 1024 * 1024);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseCache {
    ttl: Duration,
    max_entries: usize,
    max_bytes: usize,
    max_entry_bytes: usize,
}

impl ResponseCache {
    /// A cache whose entries are served for `ttl` after they were stored.
    pub fn new(ttl: Duration) -> Self {
        ResponseCache {
            ttl,
            max_entries: 1024,
            max_bytes: 32 * 1024 * 1024,
            max_entry_bytes: 1024 * 1024,
        }
    }

    /// Keeps at most `n` entries (the oldest go first).
    pub fn with_max_entries(mut self, n: usize) -> Self {
        self.max_entries = n;
        self
    }

    /// Keeps at most `n` bytes of snapshots in total (the oldest go first).
    pub fn with_max_bytes(mut self, n: usize) -> Self {
        self.max_bytes = n;
        self
    }

    /// Stores no response larger than `n` bytes; a larger body is passed through untouched.
    pub fn with_max_entry_bytes(mut self, n: usize) -> Self {
        self.max_entry_bytes = n;
        self
    }

    /// How long an entry is served after it was stored.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The most entries kept.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// The most bytes kept in total.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The largest entry stored.
    pub fn max_entry_bytes(&self) -> usize {
        self.max_entry_bytes
    }

    fn entry_cap(&self) -> usize {
        self.max_entry_bytes.min(self.max_bytes)
    }
}

/// How the last resort answered, in the response extensions (next to a
/// [`ServedBy`] with `degraded: true`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LastResort {
    /// A cached answer to an identical request.
    Cached {
        /// How old the answer is.
        age: Duration,
        /// Which target had served it.
        served_by: ServedBy,
    },
    /// The configured static degraded response.
    Static,
}

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

/// A response that can be stored and served again.
pub trait Replay: Sized {
    /// What the cache keeps.
    type Snapshot: Send + Sync + 'static;

    /// Reads the response into a snapshot of at most `max_bytes`, and gives back a response
    /// equivalent to the original for the caller. Returns no snapshot when the response is
    /// too large or not a success.
    fn capture(
        self,
        max_bytes: usize,
    ) -> impl Future<Output = (Self, Option<Self::Snapshot>)> + Send;

    /// A fresh response from a snapshot.
    fn replay(snapshot: &Self::Snapshot) -> Self;

    /// The size of a snapshot, for the cache's byte bound.
    fn snapshot_len(snapshot: &Self::Snapshot) -> usize;
}

/// A body type that can be rebuilt from bytes, so an `http::Response` of it can be cached.
pub trait ReplayBody: Body<Data = Bytes> + Unpin + Sized {
    /// A body that yields `data`, then `trailers`.
    fn from_bytes(data: Bytes, trailers: Option<HeaderMap>) -> Self;

    /// A body that yields `prefix` (already read from `rest`), then the rest of `rest`.
    fn resume(prefix: Bytes, rest: Self) -> Self;

    /// A body that yields `prefix`, then `error` (the error reading the original stopped at).
    fn failed(prefix: Bytes, error: Self::Error) -> Self;
}

/// The stored form of an HTTP response: status, version, headers, body and trailers
/// (extensions are not kept). Its `Debug` shows header names, never their values.
#[derive(Clone)]
pub struct HttpSnapshot {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

impl HttpSnapshot {
    /// The stored status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stored body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }
}

impl std::fmt::Debug for HttpSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSnapshot")
            .field("status", &self.status)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("body_len", &self.body.len())
            .field("trailers", &self.trailers.is_some())
            .finish()
    }
}

fn join(chunks: Vec<Bytes>, len: usize) -> Bytes {
    match <[Bytes; 1]>::try_from(chunks) {
        Ok([one]) => one,
        Err(chunks) => {
            let mut buf = BytesMut::with_capacity(len);
            for c in chunks {
                buf.extend_from_slice(&c);
            }
            buf.freeze()
        }
    }
}

impl<B> Replay for Response<B>
where
    B: ReplayBody + Send,
    B::Error: Send,
{
    type Snapshot = HttpSnapshot;

    async fn capture(self, max_bytes: usize) -> (Self, Option<HttpSnapshot>) {
        let (parts, mut body) = self.into_parts();
        if !parts.status.is_success()
            || body.size_hint().lower() > u64::try_from(max_bytes).unwrap_or(u64::MAX)
        {
            return (Response::from_parts(parts, body), None);
        }
        let mut chunks = Vec::new();
        let mut len = 0usize;
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => match frame.into_data() {
                    Ok(data) => {
                        len += data.len();
                        chunks.push(data);
                        if len > max_bytes {
                            let prefix = join(chunks, len);
                            let body = B::resume(prefix, body);
                            return (Response::from_parts(parts, body), None);
                        }
                    }
                    Err(frame) => {
                        if let Ok(t) = frame.into_trailers() {
                            trailers = Some(t);
                        }
                    }
                },
                Err(e) => {
                    let body = B::failed(join(chunks, len), e);
                    return (Response::from_parts(parts, body), None);
                }
            }
        }
        let bytes = join(chunks, len);
        let snapshot = HttpSnapshot {
            status: parts.status,
            version: parts.version,
            headers: parts.headers.clone(),
            body: bytes.clone(),
            trailers: trailers.clone(),
        };
        let body = B::from_bytes(bytes, trailers);
        (Response::from_parts(parts, body), Some(snapshot))
    }

    fn replay(s: &HttpSnapshot) -> Self {
        let mut resp = Response::new(B::from_bytes(s.body.clone(), s.trailers.clone()));
        *resp.status_mut() = s.status;
        *resp.version_mut() = s.version;
        *resp.headers_mut() = s.headers.clone();
        resp
    }

    fn snapshot_len(s: &HttpSnapshot) -> usize {
        let headers: usize = s
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len())
            .sum();
        s.body.len() + headers
    }
}

/// A `Full` body is one frame: once it was read, the bytes read are all of it.
impl ReplayBody for Full<Bytes> {
    fn from_bytes(data: Bytes, _trailers: Option<HeaderMap>) -> Self {
        Full::new(data)
    }

    fn resume(prefix: Bytes, _rest: Self) -> Self {
        Full::new(prefix)
    }

    fn failed(_prefix: Bytes, error: Self::Error) -> Self {
        match error {}
    }
}

impl<E> ReplayBody for BoxBody<Bytes, E>
where
    E: Send + Sync + 'static,
{
    fn from_bytes(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        BoxBody::new(Replayed::<Self, E>::new(data, None, trailers, None))
    }

    fn resume(prefix: Bytes, rest: Self) -> Self {
        BoxBody::new(Replayed::new(prefix, Some(rest), None, None))
    }

    fn failed(prefix: Bytes, error: E) -> Self {
        BoxBody::new(Replayed::<Self, E>::new(prefix, None, None, Some(error)))
    }
}

impl<E> ReplayBody for UnsyncBoxBody<Bytes, E>
where
    E: Send + 'static,
{
    fn from_bytes(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        UnsyncBoxBody::new(Replayed::<Self, E>::new(data, None, trailers, None))
    }

    fn resume(prefix: Bytes, rest: Self) -> Self {
        UnsyncBoxBody::new(Replayed::new(prefix, Some(rest), None, None))
    }

    fn failed(prefix: Bytes, error: E) -> Self {
        UnsyncBoxBody::new(Replayed::<Self, E>::new(prefix, None, None, Some(error)))
    }
}

/// Bytes, then optionally the rest of a body, an error, or trailers.
struct Replayed<B, E> {
    data: Option<Bytes>,
    rest: Option<B>,
    trailers: Option<HeaderMap>,
    error: Option<E>,
}

impl<B, E> Replayed<B, E> {
    fn new(data: Bytes, rest: Option<B>, trailers: Option<HeaderMap>, error: Option<E>) -> Self {
        Replayed {
            data: (!data.is_empty()).then_some(data),
            rest,
            trailers,
            error,
        }
    }
}

// No field is structurally pinned but the rest of the body, which is `Unpin` itself.
impl<B: Unpin, E> Unpin for Replayed<B, E> {}

impl<B, E> Body for Replayed<B, E>
where
    B: Body<Data = Bytes, Error = E> + Unpin,
{
    type Data = Bytes;
    type Error = E;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, E>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(rest) = &mut this.rest {
            return Pin::new(rest).poll_frame(cx);
        }
        if let Some(e) = this.error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
            && self.rest.as_ref().is_none_or(Body::is_end_stream)
            && self.error.is_none()
            && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let len = self.data.as_ref().map_or(0, |d| d.len() as u64);
        match &self.rest {
            Some(rest) => {
                let h = rest.size_hint();
                let mut out = SizeHint::new();
                out.set_lower(h.lower() + len);
                if let Some(u) = h.upper() {
                    out.set_upper(u + len);
                }
                out
            }
            None => SizeHint::with_exact(len),
        }
    }
}

/// The type-erased cache the layer holds.
pub(crate) trait CacheOps<Req, Resp>: Send + Sync {
    fn key(&self, req: &Req) -> Option<u64>;
    fn capture(&self, key: u64, served: ServedBy, resp: Resp) -> BoxFuture<Resp>;
    fn replay(&self, key: u64) -> Option<(Resp, LastResort)>;
    fn usage(&self) -> (usize, usize);
}

pub(crate) struct Cache<Snap>(Arc<Store<Snap>>);

impl<Snap> Cache<Snap> {
    pub(crate) fn new(config: ResponseCache) -> Self {
        Cache(Arc::new(Store {
            config,
            hasher: RandomState::new(),
            state: Mutex::new(CacheState::default()),
        }))
    }
}

struct Store<Snap> {
    config: ResponseCache,
    hasher: RandomState,
    state: Mutex<CacheState<Snap>>,
}

impl<Snap> Store<Snap> {
    fn lock(&self) -> MutexGuard<'_, CacheState<Snap>> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<Req, Resp> CacheOps<Req, Resp> for Cache<Resp::Snapshot>
where
    Req: RequestKey,
    Resp: Replay + Send + 'static,
{
    fn key(&self, req: &Req) -> Option<u64> {
        let mut h = self.0.hasher.build_hasher();
        req.cache_key(&mut h).then(|| h.finish())
    }

    fn capture(&self, key: u64, served: ServedBy, resp: Resp) -> BoxFuture<Resp> {
        let store = self.0.clone();
        Box::pin(async move {
            let cap = store.config.entry_cap();
            let (resp, snapshot) = resp.capture(cap).await;
            if let Some(snapshot) = snapshot {
                let size = Resp::snapshot_len(&snapshot);
                store.lock().insert(
                    &store.config,
                    key,
                    Arc::new(snapshot),
                    size,
                    served,
                    Instant::now(),
                );
            }
            resp
        })
    }

    fn replay(&self, key: u64) -> Option<(Resp, LastResort)> {
        let (snapshot, served_by, age) = self.0.lock().get(&self.0.config, key, Instant::now())?;
        Some((
            Resp::replay(&snapshot),
            LastResort::Cached { age, served_by },
        ))
    }

    fn usage(&self) -> (usize, usize) {
        let s = self.0.lock();
        (s.entries.len(), s.bytes)
    }
}

struct Entry<Snap> {
    seq: u64,
    stored: Instant,
    size: usize,
    served: ServedBy,
    snapshot: Arc<Snap>,
}

/// Entries by key, and their keys by insertion order: every entry has the same TTL, so the
/// oldest entry is also the first to expire.
pub(crate) struct CacheState<Snap> {
    entries: HashMap<u64, Entry<Snap>>,
    order: BTreeMap<u64, u64>,
    next_seq: u64,
    bytes: usize,
}

impl<Snap> Default for CacheState<Snap> {
    fn default() -> Self {
        CacheState {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            bytes: 0,
        }
    }
}

impl<Snap> CacheState<Snap> {
    fn remove(&mut self, key: u64) {
        if let Some(e) = self.entries.remove(&key) {
            self.order.remove(&e.seq);
            self.bytes -= e.size;
        }
    }

    fn pop_oldest(&mut self) -> bool {
        match self.order.pop_first() {
            Some((_, key)) => {
                if let Some(e) = self.entries.remove(&key) {
                    self.bytes -= e.size;
                }
                true
            }
            None => false,
        }
    }

    fn insert(
        &mut self,
        cfg: &ResponseCache,
        key: u64,
        snapshot: Arc<Snap>,
        size: usize,
        served: ServedBy,
        now: Instant,
    ) {
        self.remove(key);
        if size > cfg.entry_cap() || cfg.max_entries == 0 {
            return;
        }
        while let Some((_, k)) = self.order.first_key_value() {
            let expired = self
                .entries
                .get(k)
                .is_none_or(|e| now.saturating_duration_since(e.stored) >= cfg.ttl);
            if !expired {
                break;
            }
            self.pop_oldest();
        }
        while self.entries.len() >= cfg.max_entries || self.bytes + size > cfg.max_bytes {
            if !self.pop_oldest() {
                break;
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, key);
        self.bytes += size;
        self.entries.insert(
            key,
            Entry {
                seq,
                stored: now,
                size,
                served,
                snapshot,
            },
        );
    }

    fn get(
        &mut self,
        cfg: &ResponseCache,
        key: u64,
        now: Instant,
    ) -> Option<(Arc<Snap>, ServedBy, Duration)> {
        let e = self.entries.get(&key)?;
        let age = now.saturating_duration_since(e.stored);
        if age >= cfg.ttl {
            self.remove(key);
            return None;
        }
        Some((e.snapshot.clone(), e.served.clone(), age))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn served() -> ServedBy {
        ServedBy {
            target: "primary".into(),
            model: None,
            degraded: false,
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert { key: u64, size: usize },
        Get { key: u64 },
        Advance { ms: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..12, 0usize..400).prop_map(|(key, size)| Op::Insert { key, size }),
            (0u64..12).prop_map(|key| Op::Get { key }),
            (0u64..3000).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    proptest! {
        #[test]
        fn bounds_hold_and_nothing_expired_is_served(
            ops in proptest::collection::vec(op(), 1..200),
            max_entries in 0usize..6,
            max_bytes in 0usize..1200,
        ) {
            let cfg = ResponseCache::new(Duration::from_secs(5))
                .with_max_entries(max_entries)
                .with_max_bytes(max_bytes)
                .with_max_entry_bytes(300);
            let mut state = CacheState::<()>::default();
            let start = Instant::now();
            let mut now = start;
            let mut stored_at: HashMap<u64, Instant> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert { key, size } => {
                        state.insert(&cfg, key, Arc::new(()), size, served(), now);
                        if size <= cfg.entry_cap() && max_entries > 0 {
                            prop_assert!(state.entries.contains_key(&key));
                            stored_at.insert(key, now);
                        } else {
                            prop_assert!(!state.entries.contains_key(&key));
                        }
                    }
                    Op::Get { key } => {
                        if let Some((_, _, age)) = state.get(&cfg, key, now) {
                            prop_assert!(age < cfg.ttl());
                            prop_assert_eq!(now - stored_at[&key], age);
                        }
                    }
                    Op::Advance { ms } => now += Duration::from_millis(ms),
                }
                prop_assert!(state.entries.len() <= max_entries);
                prop_assert!(state.bytes <= max_bytes);
                prop_assert_eq!(state.order.len(), state.entries.len());
                prop_assert_eq!(state.bytes, state.entries.values().map(|e| e.size).sum::<usize>());
            }
        }
    }

    #[tokio::test]
    async fn oversized_body_reaches_the_caller_whole() {
        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"0123456789"))),
            Ok(Frame::data(Bytes::from_static(b"abcdefghij"))),
            Ok(Frame::data(Bytes::from_static(b"KLMNOPQRST"))),
        ];
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
        let resp = Response::new(UnsyncBoxBody::new(body));
        let (resp, snap) = resp.capture(15).await;
        assert!(snap.is_none());
        let all = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&all[..], b"0123456789abcdefghijKLMNOPQRST");
    }

    #[tokio::test]
    async fn body_error_while_capturing_reaches_the_caller() {
        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"{\"partial\""))),
            Err(std::io::Error::other("reset")),
        ];
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
        let resp = Response::new(BoxBody::new(body));
        let (resp, snap) = resp.capture(1024).await;
        assert!(snap.is_none());
        let mut body = resp.into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "{\"partial\"");
        assert!(body.frame().await.unwrap().is_err());
    }

    #[tokio::test]
    async fn snapshot_replays_status_headers_body_and_trailers() {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-done", "1".parse().unwrap());
        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"{\"ok\":"))),
            Ok(Frame::data(Bytes::from_static(b"true}"))),
            Ok(Frame::trailers(trailers)),
        ];
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
        let mut resp = Response::new(UnsyncBoxBody::new(body));
        resp.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        let (resp, snap) = resp.capture(1024).await;
        let snap = snap.unwrap();
        assert_eq!(snap.body(), "{\"ok\":true}");
        let original = resp.into_body().collect().await.unwrap();
        assert_eq!(original.trailers().unwrap()["x-done"], "1");
        let again = <Response<UnsyncBoxBody<Bytes, std::io::Error>>>::replay(&snap);
        assert_eq!(again.status(), StatusCode::OK);
        assert_eq!(again.headers()["content-type"], "application/json");
        let collected = again.into_body().collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["x-done"], "1");
        assert_eq!(collected.to_bytes(), "{\"ok\":true}");
        let full = <Response<Full<Bytes>>>::replay(&snap);
        assert_eq!(
            full.into_body().collect().await.unwrap().to_bytes(),
            "{\"ok\":true}"
        );
    }

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
