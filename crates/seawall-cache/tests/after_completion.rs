//! Polling a finished call again is the caller's bug: every kind of call the cache makes (a
//! miss, a hit, a bypass, a `no-cache` refresh) panics with the shared message instead of
//! calling upstream again or answering twice.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use seawall_cache::CACHE_HEADER;
use seawall_cache::{CacheLayer, MemoryStore};
use seawall_test_support::poll_again_after;
use tower::{Layer, Service, ServiceExt};

const ANSWER: &str = r#"{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

fn request(method: http::Method, control: Option<&'static str>) -> http::Request<Bytes> {
    let mut req = http::Request::builder()
        .method(method)
        .uri("http://localhost/v1/chat/completions")
        .header("content-type", "application/json");
    if let Some(c) = control {
        req = req.header("cache-control", c);
    }
    req.body(Bytes::from_static(
        br#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#,
    ))
    .unwrap()
}

/// The cache over an upstream that answers at once, after `warm` calls made to the end (so
/// their answer is stored).
async fn cache(
    warm: usize,
) -> impl Service<
    http::Request<Bytes>,
    Response = http::Response<seawall_cache::CacheBody<Full<Bytes>>>,
    Error = Infallible,
> {
    let upstream = tower::service_fn(|_: http::Request<Bytes>| async {
        let mut resp = http::Response::new(Full::new(Bytes::from_static(ANSWER.as_bytes())));
        resp.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        Ok::<_, Infallible>(resp)
    });
    let mut svc = CacheLayer::new(MemoryStore::new()).layer(upstream);
    for _ in 0..warm {
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(request(http::Method::POST, None))
            .await
            .unwrap();
        resp.into_body().collect().await.unwrap();
    }
    svc
}

/// Makes one call to the cache after `warm` calls, polls it once (it must finish, as
/// `status`), then again.
async fn finish_then_poll_again(warm: usize, req: http::Request<Bytes>, status: &'static str) {
    let mut svc = cache(warm).await;
    let call = svc.ready().await.unwrap().call(req);
    poll_again_after(call, |out| {
        let resp = out.unwrap();
        assert_eq!(resp.headers()[CACHE_HEADER], status);
    });
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_finished_miss_again_panics() {
    finish_then_poll_again(0, request(http::Method::POST, None), "miss").await;
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_finished_hit_again_panics() {
    finish_then_poll_again(1, request(http::Method::POST, None), "hit").await;
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_finished_bypass_again_panics() {
    finish_then_poll_again(0, request(http::Method::GET, None), "bypass").await;
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_finished_refresh_again_panics() {
    let refresh = request(http::Method::POST, Some("no-cache"));
    finish_then_poll_again(1, refresh, "bypass").await;
}
