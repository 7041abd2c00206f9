//! A miss stores a JSON answer in the in-memory store *unchecked*; the check (one choice of
//! plain text, a natural finish) and the usage's reading come at its first use. These tests
//! hold what users see to what it was with the check at the miss: an answer that would not
//! have been stored is never served, waiters are served only storable answers, the byte bound
//! holds, and any other store is handed checked answers only.

mod common;

use common::Fixed;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use seawall_cache::{Answer, CacheKey, CacheLayer, CacheStore, KeyDeriver, MemoryStore};
use seawall_core::Usage;
use tower::{Layer, Service, ServiceExt};

const TEXT: &str = r#"{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#;

/// A complete 200 answer that is not storable: a tool call.
const TOOL_CALL: &str = r#"{"id":"c2","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"t","type":"function","function":{"name":"f","arguments":"{}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#;

fn request() -> Request<Bytes> {
    Request::post("http://localhost/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        ))
        .unwrap()
}

/// The same request with `Cache-Control: no-cache` (read through, refresh the stored answer).
fn refresh() -> Request<Bytes> {
    let mut req = request();
    req.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache"),
    );
    req
}

fn key() -> CacheKey {
    KeyDeriver::new().key(&request(), None).unwrap().0
}

/// The cache header, the usage extension and the body of one call.
async fn call<S>(svc: &S) -> (String, Option<Usage>, Bytes)
where
    S: Service<Request<Bytes>, Response = Response<seawall_cache::CacheBody<Full<Bytes>>>> + Clone,
    S::Error: std::fmt::Debug,
{
    call_with(svc, request()).await
}

/// The same for `req`.
async fn call_with<S>(svc: &S, req: Request<Bytes>) -> (String, Option<Usage>, Bytes)
where
    S: Service<Request<Bytes>, Response = Response<seawall_cache::CacheBody<Full<Bytes>>>> + Clone,
    S::Error: std::fmt::Debug,
{
    let resp = svc.clone().oneshot(req).await.unwrap();
    let status = resp.headers()[seawall_cache::CACHE_HEADER]
        .to_str()
        .unwrap()
        .to_owned();
    let usage = resp.extensions().get::<Usage>().copied();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, usage, body)
}

#[tokio::test(start_paused = true)]
async fn an_answer_that_fails_its_first_use_check_is_never_served_and_leaves_the_store() {
    let memory = MemoryStore::new();
    let up = Fixed::new(TOOL_CALL);
    let svc = CacheLayer::new(memory.clone()).layer(up.clone());
    let (status, _, body) = call(&svc).await;
    assert_eq!((status.as_str(), &body[..]), ("miss", TOOL_CALL.as_bytes()));
    // Stored unchecked: the miss did not scan it.
    assert_eq!(memory.usage().0, 1);
    // Its first use checks it: never served, and out of the store.
    assert!(memory.lookup(&key()).is_none());
    assert_eq!(memory.usage(), (0, 0));
    // Through the layer too: each call is a miss, and goes upstream.
    for calls in 2..4 {
        let (status, _, body) = call(&svc).await;
        assert_eq!((status.as_str(), &body[..]), ("miss", TOOL_CALL.as_bytes()));
        assert_eq!(up.calls(), calls);
    }
}

#[tokio::test(start_paused = true)]
async fn a_storable_answer_stored_unchecked_is_served_with_its_usage() {
    let up = Fixed::new(TEXT);
    let svc = CacheLayer::new(MemoryStore::new()).layer(up.clone());
    let (status, usage, _) = call(&svc).await;
    assert_eq!((status.as_str(), usage), ("miss", None));
    let want = Usage {
        input_tokens: 7,
        output_tokens: 3,
        cached_input_tokens: 0,
        cache_write_input_tokens: 0,
        cache_write_1h_input_tokens: 0,
    };
    for _ in 0..2 {
        let (status, usage, body) = call(&svc).await;
        assert_eq!(status, "hit");
        assert_eq!(usage, Some(want));
        assert_eq!(&body[..], TEXT.as_bytes());
    }
    assert_eq!(up.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_refresh_that_brings_back_an_unstorable_answer_keeps_the_stored_one() {
    let up = Fixed::new(TEXT);
    let svc = CacheLayer::new(MemoryStore::new()).layer(up.clone());
    call(&svc).await;
    *up.body.lock().unwrap() = TOOL_CALL;
    let (status, _, body) = call_with(&svc, refresh()).await;
    assert_eq!(
        (status.as_str(), &body[..]),
        ("bypass", TOOL_CALL.as_bytes())
    );
    let (status, _, body) = call(&svc).await;
    assert_eq!((status.as_str(), &body[..]), ("hit", TEXT.as_bytes()));
    assert_eq!(up.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_only_a_storable_answer() {
    for (body, calls, hits) in [(TOOL_CALL, 5, 0), (TEXT, 1, 4)] {
        let mut up = Fixed::new(body);
        up.delay = Duration::from_millis(500);
        let svc = CacheLayer::new(MemoryStore::new()).layer(up.clone());
        let results = join_all((0..5).map(|_| call(&svc))).await;
        // A leader's answer that fails the check is a failed flight's: each waiter calls on
        // its own, as when the miss checked it.
        assert_eq!(up.calls(), calls, "{body}");
        let served = results.iter().filter(|r| r.0 == "hit").count();
        assert_eq!(served, hits, "{body}");
        for (_, _, b) in results {
            assert_eq!(&b[..], body.as_bytes());
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_unchecked_answer_counts_its_raw_body_against_the_byte_bound() {
    // As an unparsed answer always has: its body twice (room for its parts once parsed),
    // plus a fixed overhead. One byte short, it is not stored.
    let size = 96 + 2 * TEXT.len();
    for (bound, stored) in [(size - 1, 0), (size, 1)] {
        let memory = MemoryStore::with_bounds(10, bound);
        let svc = CacheLayer::new(memory.clone()).layer(Fixed::new(TEXT));
        call(&svc).await;
        assert_eq!(memory.usage(), (stored, stored * size));
    }
}

/// A store answering only through futures, recording what it is handed.
#[derive(Clone, Default)]
struct Remote {
    memory: MemoryStore,
    puts: Arc<Mutex<Vec<Arc<Answer>>>>,
}

impl CacheStore for Remote {
    fn get(&self, key: &CacheKey) -> seawall_cache::StoreFuture<Option<Arc<Answer>>> {
        let found = self.memory.lookup(key);
        Box::pin(async move { Ok(found) })
    }

    fn put(
        &self,
        key: &CacheKey,
        answer: Arc<Answer>,
        ttl: Duration,
    ) -> seawall_cache::StoreFuture<()> {
        self.puts.lock().unwrap().push(answer.clone());
        self.memory.insert(key, answer, ttl);
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test(start_paused = true)]
async fn any_other_store_is_handed_checked_answers_only() {
    let remote = Remote::default();
    let svc = CacheLayer::new(remote.clone()).layer(Fixed::new(TOOL_CALL));
    call(&svc).await;
    assert!(
        remote.puts.lock().unwrap().is_empty(),
        "not storable: not written"
    );
    let remote = Remote::default();
    let svc = CacheLayer::new(remote.clone()).layer(Fixed::new(TEXT));
    call(&svc).await;
    let puts = remote.puts.lock().unwrap();
    // Checked before the write: its usage read, its parts there to encode.
    assert_eq!(puts.len(), 1);
    assert_eq!(puts[0].usage().input_tokens, 7);
    assert_eq!(puts[0].text(), "hi");
    assert_eq!(remote.memory.usage().0, 1);
}
