//! `ReqwestTransport` over real loopback HTTP: answers, streams through the recommended
//! stack, and each transport failure in its class, without a credential in any error.

mod common;

use std::error::Error as _;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use common::{KEY, Mock, Raw, bounded, chat_body, ms, raw_server, retry, start};
use http_body_util::BodyExt;
use seawall_breaker::CircuitBreakerLayer;
use seawall_classify::ClassifyLayer;
use seawall_core::upstream::{ApiKey, OpenAiConfig};
use seawall_core::{FailureClass, LlmError};
use seawall_gate::ConcurrencyGateLayer;
use seawall_mock::{Delay, Profile};
use seawall_observe::ObserveLayer;
use seawall_reqwest::ReqwestTransport;
use seawall_stream::{StreamStats, StreamTimeoutLayer};
use seawall_test_support::{RefusedPort, drain};
use tower::{ServiceBuilder, ServiceExt};

fn transport(mock: &Mock) -> ReqwestTransport {
    let upstream = OpenAiConfig::new(ApiKey::new(KEY).unwrap())
        .with_base_url(mock.base_url())
        .upstream()
        .unwrap();
    ReqwestTransport::new(ReqwestTransport::client_builder().build().unwrap())
        .with_upstream(upstream)
}

fn chat(stream: bool) -> http::Request<Bytes> {
    http::Request::post("/chat/completions")
        .body(Bytes::from(chat_body("gpt-4o-mini", stream)))
        .unwrap()
}

/// Everything an error shows: `Display`, `Debug`, and those of every source, the reported
/// (redacted) chain and the original one kept for downcasting.
fn everything_shown(e: &LlmError) -> String {
    let mut shown = format!("{e} {e:?} {e:#}");
    let mut source = e.source();
    while let Some(s) = source {
        shown.push_str(&format!(" | {s} {s:?}"));
        source = s.source();
    }
    let mut original = e
        .source_ref()
        .map(|s| s as &(dyn std::error::Error + 'static));
    while let Some(s) = original {
        shown.push_str(&format!(" | {s} {s:?}"));
        original = s.source();
    }
    shown
}

#[tokio::test]
async fn a_complete_answer_comes_back_through_the_users_client_with_the_upstreams_credentials() {
    bounded(async {
        // A request without the upstream's key would be "anonymous", whose quota is gone.
        let mock = start(Profile::default().exhausted_key("anonymous")).await;
        let resp = transport(&mock).oneshot(chat(false)).await.unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.ok), (1, 1), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn a_streamed_answer_flows_through_the_recommended_stack() {
    bounded(async {
        let mock = start(Profile::default().per_token_latency(Delay::fixed(ms(5)))).await;
        let stack = ServiceBuilder::new()
            .layer(ObserveLayer::new())
            .layer(retry(3, ms(1)))
            .layer(CircuitBreakerLayer::new())
            .layer(ConcurrencyGateLayer::new(4))
            .layer(StreamTimeoutLayer::new())
            .layer(ClassifyLayer::new())
            .service(transport(&mock));

        let resp = stack.oneshot(chat(true)).await.unwrap();
        let stats = StreamStats::of(&resp).unwrap();
        let (text, err) = drain(resp.into_body()).await;
        assert!(err.is_none(), "{err:?}");
        assert!(text.contains(r#""content":"#), "{text}");
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
        assert!(stats.is_streamed() && stats.is_complete());
        assert!(stats.time_to_first_token().is_some());
        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.streams_completed), (1, 1), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn a_refused_connection_is_connect() {
    bounded(async {
        let refused = RefusedPort::new();
        let port = refused.port();
        let uri = format!("http://127.0.0.1:{port}/v1/chat/completions");
        let client = ReqwestTransport::client_builder().build().unwrap();
        let err = ReqwestTransport::new(client)
            .oneshot(http::Request::post(uri).body(Bytes::new()).unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.class(), FailureClass::Connect, "{err:?}");
        assert!(
            err.source_ref()
                .and_then(|s| s.downcast_ref::<reqwest::Error>())
                .is_some_and(reqwest::Error::is_connect),
            "the reqwest error is kept as the source: {err:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn no_response_head_within_the_clients_timeout_is_timeout() {
    bounded(async {
        let mock = start(Profile::default().first_token_latency(Delay::fixed(ms(3_000)))).await;
        let client = ReqwestTransport::client_builder()
            .timeout(ms(200))
            .build()
            .unwrap();
        let err = ReqwestTransport::new(client)
            .with_upstream(transport(&mock).upstream().unwrap().clone())
            .oneshot(chat(false))
            .await
            .unwrap_err();
        assert_eq!(err.class(), FailureClass::Timeout, "{err:?}");
    })
    .await;
}

#[tokio::test]
async fn a_connection_dropped_after_the_request_was_sent_is_disconnected() {
    bounded(async {
        let (addr, seen) = raw_server(Raw::Close).await;
        let uri = format!("http://{addr}/v1/chat/completions");
        let client = ReqwestTransport::client_builder().build().unwrap();
        let err = ReqwestTransport::new(client)
            .oneshot(
                http::Request::post(uri)
                    .body(Bytes::from(chat_body("gpt-4o-mini", false)))
                    .unwrap(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.class(), FailureClass::Disconnected, "{err:?}");
        assert_eq!(seen.load(Ordering::SeqCst), 1, "the request was read, once");
    })
    .await;
}

#[tokio::test]
async fn a_redirect_is_never_followed_and_is_an_invalid_request() {
    bounded(async {
        // With the recommended client: the 307 reaches the classifier.
        let (addr, seen) = raw_server(Raw::Redirect).await;
        let stack =
            ServiceBuilder::new()
                .layer(ClassifyLayer::new())
                .service(ReqwestTransport::new(
                    ReqwestTransport::client_builder().build().unwrap(),
                ));
        let request = || {
            http::Request::post(format!("http://{addr}/v1/chat/completions"))
                .body(Bytes::from(chat_body("gpt-4o-mini", false)))
                .unwrap()
        };
        let err = stack.oneshot(request()).await.unwrap_err();
        assert_eq!(err.class(), FailureClass::InvalidRequest, "{err:?}");
        assert_eq!(err.status().map(|s| s.as_u16()), Some(307));
        assert_eq!(seen.load(Ordering::SeqCst), 1);

        // With a client that follows redirects and gives up: reqwest's redirect error.
        let (addr, seen) = raw_server(Raw::Redirect).await;
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::limited(1))
            .build()
            .unwrap();
        let err = ReqwestTransport::new(client)
            .oneshot(
                http::Request::get(format!("http://{addr}/v1/models"))
                    .body(Bytes::new())
                    .unwrap(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.class(), FailureClass::InvalidRequest, "{err:?}");
        assert!(err.message().contains("redirect"), "{err}");
        assert!(seen.load(Ordering::SeqCst) >= 2, "that client did follow");
    })
    .await;
}

#[tokio::test]
async fn no_credential_from_the_url_or_the_headers_appears_in_an_error() {
    bounded(async {
        const URL_KEY: &str = "AIzaSyTOPSECRET0123456789abcdefghijk";
        const HEADER_KEY: &str = "sk-proj-HEADERSECRET0123456789";
        let refused = RefusedPort::new();
        let port = refused.port();
        let uri = format!(
            "http://127.0.0.1:{port}/v1beta/models/gemini-2.0-flash:generateContent?key={URL_KEY}"
        );
        let client = ReqwestTransport::client_builder().build().unwrap();
        let request = http::Request::post(&uri)
            .header("authorization", format!("Bearer {HEADER_KEY}"))
            .header("x-goog-api-key", URL_KEY)
            .body(Bytes::from_static(b"{}"))
            .unwrap();
        let err = ReqwestTransport::new(client)
            .oneshot(request)
            .await
            .unwrap_err();
        assert_eq!(err.class(), FailureClass::Connect);
        let shown = everything_shown(&err);
        assert!(
            shown.contains("onnect"),
            "the error says what happened: {shown}"
        );
        for secret in [URL_KEY, HEADER_KEY, "TOPSECRET", "HEADERSECRET"] {
            assert!(!shown.contains(secret), "{secret} leaked: {shown}");
        }
        // Where the key was: reqwest's own error would have shown it.
        let reqwest_err = reqwest::Client::new().post(&uri).send().await.unwrap_err();
        assert!(format!("{reqwest_err}").contains(URL_KEY));
    })
    .await;
}
