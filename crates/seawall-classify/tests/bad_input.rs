//! Bad input never panics and always yields a clear class.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use common::{Chunks, error_of, response, run, run_with};
use seawall_classify::hints::MAX_HINT;
use seawall_classify::{ClassifyLayer, StatusClassifier};
use seawall_core::FailureClass;

#[tokio::test]
async fn invalid_utf8_body() {
    let err = run(response(
        500,
        &[],
        Chunks::one(&b"\xff\xfe\xfd oops \xc3\x28"[..]),
    ))
    .await
    .unwrap_err();
    assert_eq!(err.class(), FailureClass::ServerError);
    assert!(err.message().contains("oops"), "{}", err.message());
    // Inside JSON too.
    let err = run(response(
        429,
        &[],
        Chunks::one(
            &b"{\"error\":{\"message\":\"bad \xff byte\",\"code\":\"rate_limit_exceeded\"}}"[..],
        ),
    ))
    .await
    .unwrap_err();
    assert_eq!(err.class(), FailureClass::RateLimited);
}

#[tokio::test]
async fn html_body() {
    let page = "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body></html>";
    let err = error_of(502, &[("content-type", "text/html")], page).await;
    assert_eq!(err.class(), FailureClass::ServerError);
    assert_eq!(err.message(), "non-JSON (HTML) error body: 502 Bad Gateway");
    let err = error_of(
        429,
        &[("content-type", "text/html")],
        "<html><body>Too Many Requests</body></html>",
    )
    .await;
    assert_eq!(err.class(), FailureClass::RateLimited);
    let err = error_of(503, &[], "<html><title>Service Unavailable</title>").await;
    assert_eq!(err.class(), FailureClass::Overloaded);
}

#[tokio::test]
async fn an_error_in_an_unusual_shape_keeps_its_words() {
    // Mistral's validation error: its message is an object.
    let err = error_of(422, &[], r#"{"object":"error","message":{"detail":[{"type":"missing","loc":["body","messages"],"msg":"Field required","input":{}}]},"type":"invalid_request_error","param":null,"code":null}"#).await;
    assert_eq!(err.class(), FailureClass::InvalidRequest);
    assert!(err.message().contains("Field required"), "{err}");
    // A list of messages (NestJS-style servers), joined.
    let err = error_of(400, &[], r#"{"error":{"message":["messages must not be empty","model must be a string"],"type":"invalid_request_error"}}"#).await;
    assert_eq!(
        err.message(),
        "messages must not be empty; model must be a string"
    );
    // Cloudflare's and GraphQL-style `errors` list: its first error is read, words and code.
    let err = error_of(400, &[], r#"{"errors":[{"message":"This model's maximum context length is 8192 tokens","code":3036}],"success":false,"result":null}"#).await;
    assert_eq!(err.class(), FailureClass::ContextLengthExceeded);
    assert_eq!(err.code(), Some("3036"));
    // A message far too long is cut.
    let long = format!(
        r#"{{"error":{{"message":{{"detail":"{}"}}}}}}"#,
        "x".repeat(10_000)
    );
    assert!(error_of(400, &[], &long).await.message().chars().count() < 300);
    // A JSON body with nothing recognisable in it is not called empty.
    let err = error_of(400, &[], r#"{"unexpected":true}"#).await;
    assert_eq!(err.message(), "HTTP 400 Bad Request");
}

#[tokio::test]
async fn empty_body() {
    let err = run(response(503, &[], Chunks::empty())).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Overloaded);
    assert_eq!(
        err.message(),
        "HTTP 503 Service Unavailable with an empty body"
    );
    let err = error_of(404, &[], "   \n").await;
    assert_eq!(err.class(), FailureClass::NotFound);
    let err = error_of(400, &[], "{}").await;
    assert_eq!(err.class(), FailureClass::InvalidRequest);
    let err = error_of(400, &[], "null").await;
    assert_eq!(err.class(), FailureClass::InvalidRequest);
}

#[tokio::test]
async fn ten_megabyte_error_body_is_cut_at_the_limit_and_dropped() {
    let mut first = br#"{"error":{"message":"The server had an error","type":"server_error","code":null,"padding":""#.to_vec();
    first.resize(8 * 1024, b'x');
    let mut chunks = vec![first];
    chunks.extend(std::iter::repeat_n(vec![b'x'; 8 * 1024], 10 * 128 - 1));
    let body = Chunks::new(chunks);
    let (pulled, dropped) = (body.pulled.clone(), body.dropped.clone());
    let err = run(response(500, &[], body)).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::ServerError);
    assert_eq!(err.error_type(), Some("server_error"));
    assert_eq!(err.message(), "The server had an error");
    let read = pulled.load(Ordering::SeqCst);
    assert!(read <= 64 * 1024 + 8 * 1024, "read {read} bytes of 10 MiB");
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the rest is dropped unread"
    );
}

#[tokio::test]
async fn error_body_limit_is_configurable() {
    use tower::{Layer, ServiceExt};
    let body = Chunks::new(vec![vec![b'a'; 1024]; 64]);
    let pulled = body.pulled.clone();
    let cell = std::sync::Mutex::new(Some(response(500, &[], body)));
    let transport = tower::service_fn(move |_r: http::Request<bytes::Bytes>| {
        let r = cell.lock().unwrap().take().unwrap();
        async move { Ok::<_, std::io::Error>(r) }
    });
    let layer = ClassifyLayer::builder()
        .error_body_limit(2048)
        .build()
        .unwrap();
    assert_eq!(layer.error_body_limit(), 2048);
    let err = layer
        .layer(transport)
        .oneshot(common::chat_request(false))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::ServerError);
    assert_eq!(pulled.load(Ordering::SeqCst), 2048);
}

#[tokio::test]
async fn unknown_status_codes() {
    for (status, want) in [
        (418, FailureClass::InvalidRequest),
        (451, FailureClass::InvalidRequest),
        (499, FailureClass::InvalidRequest),
        (520, FailureClass::ServerError),
        (524, FailureClass::UpstreamTimeout),
        (599, FailureClass::ServerError),
        (600, FailureClass::ServerError),
        (999, FailureClass::ServerError),
        (302, FailureClass::InvalidRequest),
        (304, FailureClass::InvalidRequest),
        (101, FailureClass::InvalidRequest),
    ] {
        let err = error_of(status, &[], "").await;
        assert_eq!(err.class(), want, "{status}");
        assert_eq!(err.status().map(|s| s.as_u16()), Some(status));
        assert!(
            err.message().starts_with(&format!("HTTP {status}")),
            "{}",
            err.message()
        );
        let err = run_with(StatusClassifier, response(status, &[], Chunks::one("x")))
            .await
            .unwrap_err();
        assert_eq!(err.class(), want, "status-only {status}");
    }
}

#[tokio::test]
async fn absurd_retry_after_values() {
    let rate = r#"{"error":{"message":"slow down","code":"rate_limit_exceeded"}}"#;
    let past = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(3600));
    for (value, want) in [
        ("-5", None),
        ("-0.5", None),
        ("NaN", None),
        ("nan", None),
        ("inf", Some(MAX_HINT)),
        ("1e308", Some(MAX_HINT)),
        ("99999999999999999999999", Some(MAX_HINT)),
        ("31536000", Some(MAX_HINT)),
        (past.as_str(), Some(Duration::ZERO)),
        ("Mon, 99 Foo 2025 99:99:99 GMT", None),
        ("soon", None),
    ] {
        let err = error_of(429, &[("retry-after", value)], rate).await;
        assert_eq!(err.class(), FailureClass::RateLimited, "{value}");
        assert_eq!(err.retry_after(), want, "{value}");
        let err = error_of(429, &[("retry-after-ms", value)], rate).await;
        assert!(err.retry_after().is_none_or(|d| d <= MAX_HINT), "{value}");
    }
}

#[tokio::test]
async fn garbage_streams_do_not_panic() {
    for body in [
        &b"data: {not json\n\n"[..],
        b"data: \xff\xfe\n\n",
        b"event: error\ndata: \xff\n\n",
        b"\n\n\n\r\n:::\n",
        b"data: [DONE",
        b"data: {\"choices\": 5}\n\n",
        b"data: {\"choices\": [null, 1, {\"delta\": 7}]}\n\n",
        b"data: {\"type\": 5}\n\ndata: {\"usage\": \"x\"}\n\n",
        b"data: {\"type\":\"message_delta\",\"delta\":null,\"usage\":{\"output_tokens\":-1}}\n\n",
    ] {
        let resp = run(common::sse_response(Chunks::one(body))).await.unwrap();
        let (bytes, _err) = common::drain(resp.into_body()).await;
        assert_eq!(bytes, body);
    }
}

#[test]
fn a_body_of_control_bytes_still_gives_a_readable_message() {
    use seawall_classify::{AutoClassifier, Classifier, ErrorResponse};
    let headers = http::HeaderMap::new();
    for body in [&b"\0"[..], b"\0\x01\x02", b" \t\r\n", b"\x1b\x1b"] {
        let status = http::StatusCode::from_u16(100).unwrap();
        let err = AutoClassifier.classify_response(&ErrorResponse::new(status, &headers, body));
        assert!(err.message().starts_with("HTTP 100"), "{body:?}: {err}");
    }
}

#[tokio::test]
async fn a_content_coding_header_is_never_read_as_words_of_the_error() {
    // Whatever the header says, the coded body is not read and the header's text stays out of
    // the message but for a short token.
    for (coding, named) in [
        ("br", "`br`"),
        ("per day, insufficient_quota", "`unknown`"),
        ("x-very-long-coding-name-indeed", "`unknown`"),
    ] {
        let err = error_of(
            429,
            &[("content-encoding", coding)],
            r#"{"error":{"code":"insufficient_quota","message":"quota"}}"#,
        )
        .await;
        assert_eq!(err.class(), FailureClass::RateLimited, "{coding}");
        assert!(err.message().contains(named), "{coding}: {}", err.message());
        assert_eq!(err.code(), None);
    }
    // `identity` is no coding: the body is read.
    let err = error_of(
        429,
        &[("content-encoding", "identity")],
        r#"{"error":{"code":"insufficient_quota","message":"quota"}}"#,
    )
    .await;
    assert_eq!(err.class(), FailureClass::QuotaExhausted);
}
