//! The axum front end over real loopback HTTP, with a hyper client.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use seawall_mock::{Count, Delay, KeepAliveStyle, Profile};
use seawall_test_support::start_mock as start;
use serde_json::{Value, json};

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn post(addr: SocketAddr, path: &str, key: &str, body: &Value) -> http::Request<Full<Bytes>> {
    http::Request::post(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

#[tokio::test]
async fn openai_answers_rate_limits_and_stats_over_http() {
    let (addr, upstream) = start(Profile::default().rpm(1)).await;
    let client = client();
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});

    let ok = client
        .request(post(addr, "/v1/chat/completions", "sk-a", &body))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers()["x-ratelimit-remaining-requests"], "0");
    assert!(ok.headers().contains_key("x-request-id"));
    let v: Value =
        serde_json::from_slice(&ok.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let limited = client
        .request(post(addr, "/v1/chat/completions", "sk-a", &body))
        .await
        .unwrap();
    assert_eq!(limited.status(), 429);
    let retry: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry));
    let v: Value =
        serde_json::from_slice(&limited.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");

    let stats = client
        .request(
            http::Request::get(format!("http://{addr}/mock/stats"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    let v: Value =
        serde_json::from_slice(&stats.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["requests"], 2);
    assert_eq!(v["rate_limited"], 1);
    assert_eq!(v["by_status"]["429"], 1);
    assert_eq!(upstream.stats().requests, 2);
}

#[tokio::test]
async fn an_anthropic_stream_with_keepalives_over_http() {
    let profile = Profile::default()
        .first_token_latency(Delay::fixed(Duration::from_millis(60)))
        .keepalives(1.0, Duration::from_millis(20), KeepAliveStyle::Comment)
        .output_tokens(Count::fixed(5));
    let (addr, _upstream) = start(profile).await;
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]});
    let resp = client()
        .request(post(addr, "/v1/messages", "sk-ant", &body))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert!(resp.headers().contains_key("request-id"));
    let sse = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let keepalive = sse.find(": keep-alive").expect("a keep-alive");
    let first_delta = sse.find("event: content_block_delta").unwrap();
    assert!(sse.starts_with("event: message_start\n"));
    assert!(keepalive < first_delta);
    assert_eq!(sse.matches("event: content_block_delta").count(), 5);
    assert!(sse.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
}

#[tokio::test]
async fn a_reset_stream_breaks_the_http_body() {
    // Paced, so the head is on the wire before the reset (with no latency at all, hyper may
    // meet the body error before it flushed the head, and the client sees no response), and
    // so the client has read the tokens before the reset arrives: a reset discards whatever
    // the receiving socket still holds, which on a loaded machine can be all of it.
    let profile = Profile::default()
        .first_token_latency(Delay::fixed(Duration::from_millis(100)))
        .per_token_latency(Delay::fixed(Duration::from_millis(50)))
        .cut_streams(1.0, Count::fixed(2), true);
    let (addr, upstream) = start(profile).await;
    let body = json!({"model": "gpt-4o-mini", "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]});
    let resp = client()
        .request(post(addr, "/v1/chat/completions", "sk-a", &body))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut received = Vec::new();
    let failed = loop {
        match body.frame().await {
            Some(Ok(f)) => received.extend_from_slice(&f.into_data().unwrap()),
            Some(Err(_)) => break true,
            None => break false,
        }
    };
    assert!(failed, "the client sees a broken body, not a clean end");
    let text = String::from_utf8(received).unwrap();
    assert_eq!(text.matches("\"content\":\"").count(), 3); // role chunk + 2 tokens
    assert!(!text.contains("[DONE]"));
    assert_eq!(upstream.stats().streams_cut, 1);
}
