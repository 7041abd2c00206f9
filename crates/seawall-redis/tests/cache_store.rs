//! The cache's answers in a real Redis: one replica's answer serves another, entries carry
//! their time to live, unreadable bytes are a miss, and a Redis outage leaves the cache
//! failing open (the call goes upstream).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use seawall_cache::{Answer, CacheKey, CacheLayer, CacheStore, Wire};
use seawall_core::Usage;
use seawall_redis::{RedisCacheStore, SharedRedis};
use seawall_test_support::RedisServer;
use tower::{Layer, ServiceExt};

const ANSWER: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Salt from rocks."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}"#;

fn request() -> http::Request<Bytes> {
    http::Request::post("http://upstream/v1/chat/completions")
        .body(Bytes::from_static(
            br#"{"model":"gpt-4o-mini","temperature":0,"messages":[{"role":"user","content":"Why is the sea salty?"}]}"#,
        ))
        .unwrap()
}

/// One replica: a cache on `redis` over an upstream that counts its calls.
fn replica(
    redis: &SharedRedis,
    calls: &Arc<AtomicUsize>,
) -> impl tower::Service<
    http::Request<Bytes>,
    Response = http::Response<seawall_cache::CacheBody<Full<Bytes>>>,
    Error = Infallible,
> + Clone
+ use<> {
    let calls = calls.clone();
    let upstream = tower::service_fn(move |_req: http::Request<Bytes>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let mut resp = http::Response::new(Full::new(Bytes::from_static(ANSWER.as_bytes())));
        resp.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        std::future::ready(Ok::<_, Infallible>(resp))
    });
    CacheLayer::new(RedisCacheStore::new(redis.clone())).layer(upstream)
}

async fn ask<S>(svc: &S) -> (String, String)
where
    S: tower::Service<
            http::Request<Bytes>,
            Response = http::Response<seawall_cache::CacheBody<Full<Bytes>>>,
            Error = Infallible,
        > + Clone,
{
    let resp = svc.clone().oneshot(request()).await.unwrap();
    let status = resp.headers()[seawall_cache::CACHE_HEADER]
        .to_str()
        .unwrap()
        .to_owned();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn one_replicas_answer_serves_another() {
    let server = RedisServer::start();
    let (a_calls, b_calls) = (Arc::default(), Arc::default());
    let a = replica(&SharedRedis::new(server.url()).unwrap(), &a_calls);
    let b = replica(&SharedRedis::new(server.url()).unwrap(), &b_calls);
    assert_eq!(ask(&a).await.0, "miss");
    // The write is on its own task: wait until it lands (no credential header: no partition).
    let (key, _) = seawall_cache::KeyDeriver::new()
        .key(&request(), None)
        .unwrap();
    let store = RedisCacheStore::new(SharedRedis::new(server.url()).unwrap());
    let landed = seawall_test_support::eventually(Duration::from_secs(5), || async {
        matches!(store.get(&key).await, Ok(Some(_)))
    })
    .await;
    assert!(landed, "replica a's answer reached Redis");
    assert_eq!(
        ask(&b).await.0,
        "hit",
        "replica b is served replica a's answer"
    );
    assert_eq!(a_calls.load(Ordering::SeqCst), 1);
    assert_eq!(b_calls.load(Ordering::SeqCst), 0, "b never called upstream");
    let (_, body) = ask(&b).await;
    assert_eq!(body, ANSWER, "the JSON answer comes back byte for byte");
}

#[tokio::test]
async fn entries_carry_their_ttl_and_a_compact_encoding() {
    let server = RedisServer::start();
    let redis = SharedRedis::new(server.url()).unwrap();
    let store = RedisCacheStore::new(redis.clone());
    let key = CacheKey::from_bytes([3; 32]);
    let answer = Arc::new(Answer::new(
        Wire::OpenAiChat,
        "chatcmpl-1",
        "gpt-4o-mini",
        1_700_000_000,
        "Salt from rocks.",
        "stop",
        Usage {
            input_tokens: 9,
            output_tokens: 4,
            cached_input_tokens: 0,
            cache_write_input_tokens: 0,
            cache_write_1h_input_tokens: 0,
        },
    ));
    store
        .put(&key, answer.clone(), Duration::from_secs(90))
        .await
        .unwrap();
    assert_eq!(store.get(&key).await.unwrap().as_deref(), Some(&*answer));
    let rkey = redis.key("cache", &key.to_hex());
    let (pttl, len): (i64, usize) = redis
        .run("test", |mut conn| {
            let rkey = rkey.clone();
            async move {
                redis::pipe()
                    .cmd("PTTL")
                    .arg(&rkey)
                    .cmd("STRLEN")
                    .arg(&rkey)
                    .query_async(&mut conn)
                    .await
            }
        })
        .await
        .unwrap();
    assert!(pttl > 80_000 && pttl <= 90_000, "pttl {pttl}");
    assert!(len < 64, "a small answer is a few dozen bytes: {len}");
}

#[tokio::test]
async fn unreadable_bytes_in_redis_are_a_miss() {
    let server = RedisServer::start();
    let redis = SharedRedis::new(server.url()).unwrap();
    let store = RedisCacheStore::new(redis.clone());
    let key = CacheKey::from_bytes([4; 32]);
    let rkey = redis.key("cache", &key.to_hex());
    let _: () = redis
        .run("test", |mut conn| async move {
            redis::cmd("SET")
                .arg(rkey)
                .arg(&b"\x01\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff garbage"[..])
                .query_async(&mut conn)
                .await
        })
        .await
        .unwrap();
    assert_eq!(store.get(&key).await.unwrap(), None);
}

#[tokio::test]
async fn without_redis_the_cache_fails_open_to_the_upstream() {
    let mut server = RedisServer::start();
    let redis = SharedRedis::builder(server.url())
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let calls = Arc::default();
    let svc = replica(&redis, &calls);
    server.stop();
    for _ in 0..3 {
        let (status, body) = ask(&svc).await;
        assert_eq!(status, "miss");
        assert_eq!(body, ANSWER);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}
