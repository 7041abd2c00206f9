//! Every server hint format, through the layer: retry delays, x-should-retry, rate limits.

mod common;

use std::time::{Duration, SystemTime};

use common::{Chunks, error_of, response, run};
use seawall_classify::hints::MAX_HINT;
use seawall_core::{FailureClass, LlmResponse, RateLimitSnapshot};

const RATE: &str = r#"{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;

fn rate_with(message: &str) -> String {
    serde_json::json!({"error": {"message": message, "type": "tokens", "code": "rate_limit_exceeded"}})
        .to_string()
}

/// (headers, body, expected delay)
type Row<'a> = (Vec<(&'a str, &'a str)>, String, Option<Duration>);

#[tokio::test]
async fn every_retry_delay_format() {
    let ms = Duration::from_millis;
    let now = SystemTime::now();
    let date = httpdate::fmt_http_date(now);
    let in_90s = httpdate::fmt_http_date(now + Duration::from_secs(90));
    let rows: Vec<Row<'_>> = vec![
        (vec![("retry-after-ms", "250")], RATE.into(), Some(ms(250))),
        (
            vec![("retry-after-ms", "12.5")],
            RATE.into(),
            Some(Duration::from_micros(12_500)),
        ),
        (
            vec![("x-ms-retry-after-ms", "900")],
            RATE.into(),
            Some(ms(900)),
        ),
        (vec![("retry-after", "7")], RATE.into(), Some(ms(7000))),
        (vec![("retry-after", "1.5")], RATE.into(), Some(ms(1500))),
        (
            vec![("date", &date), ("retry-after", &in_90s)],
            RATE.into(),
            Some(ms(90_000)),
        ),
        (
            vec![("retry-after", "7"), ("retry-after-ms", "250")],
            RATE.into(),
            Some(ms(250)),
        ),
        (
            vec![],
            rate_with("Rate limit reached. Please try again in 120ms. Visit ..."),
            Some(ms(120)),
        ),
        (
            vec![],
            rate_with("Rate limit reached. Please try again in 1.4s."),
            Some(ms(1400)),
        ),
        (
            vec![],
            rate_with("Rate limit reached. Please try again in 6m0s."),
            Some(ms(360_000)),
        ),
        (
            vec![],
            rate_with("Please try again in 1h2m3.5s"),
            Some(ms(3_723_500)),
        ),
        (
            vec![],
            rate_with(
                "Requests to the ChatCompletions_Create Operation have exceeded token rate limit. Please retry after 6 seconds.",
            ),
            Some(ms(6000)),
        ),
        // A header beats the message.
        (
            vec![("retry-after", "3")],
            rate_with("Please try again in 1.4s"),
            Some(ms(3000)),
        ),
        (vec![], RATE.into(), None),
    ];
    for (headers, body, want) in rows {
        let err = error_of(429, &headers, &body).await;
        assert_eq!(err.class(), FailureClass::RateLimited);
        assert_eq!(err.retry_after(), want, "{headers:?} {body}");
    }
}

#[tokio::test]
async fn anthropic_reads_retry_after_not_message() {
    use seawall_classify::{AnthropicClassifier, Classifier, ErrorResponse};
    let body = r#"{"type":"error","error":{"type":"rate_limit_error","message":"Please try again in 5s"}}"#;
    let mut headers = http::HeaderMap::new();
    let e = AnthropicClassifier.classify_response(&ErrorResponse::new(
        http::StatusCode::TOO_MANY_REQUESTS,
        &headers,
        body.as_bytes(),
    ));
    assert_eq!(e.retry_after(), None);
    headers.insert("retry-after", "12".parse().unwrap());
    let e = AnthropicClassifier.classify_response(&ErrorResponse::new(
        http::StatusCode::TOO_MANY_REQUESTS,
        &headers,
        body.as_bytes(),
    ));
    assert_eq!(e.retry_after(), Some(Duration::from_secs(12)));
}

#[tokio::test]
async fn should_retry_directive_either_way() {
    let err = error_of(400, &[("x-should-retry", "true")], RATE).await;
    assert_eq!(err.class(), FailureClass::InvalidRequest);
    assert_eq!(err.should_retry(), Some(true));
    let err = error_of(503, &[("x-should-retry", "false")], "").await;
    assert_eq!(err.class(), FailureClass::Overloaded);
    assert_eq!(err.should_retry(), Some(false));
    let err = error_of(503, &[("x-should-retry", "perhaps")], "").await;
    assert_eq!(err.should_retry(), None);
}

const OPENAI_LIMITS: &[(&str, &str)] = &[
    ("x-ratelimit-limit-requests", "500"),
    ("x-ratelimit-remaining-requests", "0"),
    ("x-ratelimit-reset-requests", "120ms"),
    ("x-ratelimit-limit-tokens", "30000"),
    ("x-ratelimit-remaining-tokens", "29000"),
    ("x-ratelimit-reset-tokens", "1h2m3.5s"),
];

fn anthropic_limits(date: &str) -> Vec<(&'static str, String)> {
    vec![
        ("date", date.to_owned()),
        ("anthropic-ratelimit-requests-limit", "50".into()),
        ("anthropic-ratelimit-requests-remaining", "0".into()),
        (
            "anthropic-ratelimit-requests-reset",
            "2025-03-01T10:00:05Z".into(),
        ),
        ("anthropic-ratelimit-tokens-limit", "90000".into()),
        ("anthropic-ratelimit-tokens-remaining", "80000".into()),
        (
            "anthropic-ratelimit-tokens-reset",
            "2025-03-01T10:00:30Z".into(),
        ),
        ("anthropic-ratelimit-input-tokens-limit", "40000".into()),
        ("anthropic-ratelimit-input-tokens-remaining", "1000".into()),
        (
            "anthropic-ratelimit-input-tokens-reset",
            "2025-03-01T10:00:01.5Z".into(),
        ),
        ("anthropic-ratelimit-output-tokens-limit", "8000".into()),
        ("anthropic-ratelimit-output-tokens-remaining", "0".into()),
        (
            "anthropic-ratelimit-output-tokens-reset",
            "2025-03-01T10:01:00Z".into(),
        ),
    ]
}

fn check_openai(s: &RateLimitSnapshot) {
    assert_eq!(s.requests.limit, Some(500));
    assert_eq!(s.requests.remaining, Some(0));
    assert_eq!(s.requests.reset_after, Some(Duration::from_millis(120)));
    assert_eq!(s.tokens.limit, Some(30_000));
    assert_eq!(s.tokens.remaining, Some(29_000));
    assert_eq!(s.tokens.reset_after, Some(Duration::from_millis(3_723_500)));
}

fn check_anthropic(s: &RateLimitSnapshot) {
    assert_eq!(s.requests.remaining, Some(0));
    assert_eq!(s.requests.reset_after, Some(Duration::from_secs(5)));
    assert_eq!(s.tokens.reset_after, Some(Duration::from_secs(30)));
    assert_eq!(s.input_tokens.remaining, Some(1000));
    assert_eq!(
        s.input_tokens.reset_after,
        Some(Duration::from_millis(1500))
    );
    assert_eq!(s.output_tokens.limit, Some(8000));
    assert_eq!(s.output_tokens.reset_after, Some(Duration::from_secs(60)));
    // Requests: 50 come back over 5 s, so the next one may go after 100 ms; output tokens:
    // one of 8,000 back over 60 s after 7.5 ms. The later of the two wins.
    assert_eq!(s.exhausted_until(), Some(Duration::from_millis(100)));
}

#[tokio::test]
async fn rate_limits_on_errors() {
    let err = error_of(429, OPENAI_LIMITS, RATE).await;
    check_openai(err.rate_limit().unwrap());
    // With no explicit hint, the retry hint comes from the exhausted window.
    assert_eq!(err.retry_after(), None);
    // 500 requests come back over 120 ms: one after 240 µs.
    assert_eq!(err.retry_hint(), Some(Duration::from_micros(240)));

    let date = "Sat, 01 Mar 2025 10:00:00 GMT";
    let owned = anthropic_limits(date);
    let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let body = r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#;
    let err = error_of(429, &headers, body).await;
    check_anthropic(err.rate_limit().unwrap());
}

#[tokio::test]
async fn a_gateways_rate_limit_headers_say_when_to_come_back() {
    // Envoy's and many gateways' unsuffixed names, and the IETF draft's, with a reset in
    // seconds; some send the reset as a Unix time instead, measured from the `Date` header.
    let date = "Sat, 01 Mar 2025 10:00:00 GMT";
    let at = httpdate::parse_http_date(date).unwrap() + Duration::from_secs(40);
    let unix = at.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    let (secs, millis) = (unix.as_secs().to_string(), unix.as_millis().to_string());
    for (remaining, reset, value, want) in [
        ("x-ratelimit-remaining", "x-ratelimit-reset", "12", 12),
        ("ratelimit-remaining", "ratelimit-reset", "5", 5),
        (
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            secs.as_str(),
            40,
        ),
        (
            "ratelimit-remaining",
            "ratelimit-reset",
            millis.as_str(),
            40,
        ),
    ] {
        let headers = [(remaining, "0"), (reset, value), ("date", date)];
        let err = error_of(429, &headers, RATE).await;
        assert_eq!(err.class(), FailureClass::RateLimited);
        assert_eq!(
            err.retry_hint(),
            Some(Duration::from_secs(want)),
            "{remaining}: {value}"
        );
        // They name no window length: no limit is read from them.
        assert_eq!(err.rate_limit().unwrap().requests.limit, None);
    }
    // Room left: no wait. OpenAI's own names win over the generic ones.
    let err = error_of(
        429,
        &[("x-ratelimit-remaining", "3"), ("x-ratelimit-reset", "30")],
        RATE,
    )
    .await;
    assert_eq!(err.retry_hint(), None);
    let mut both = OPENAI_LIMITS.to_vec();
    both.extend([("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "30")]);
    check_openai(error_of(429, &both, RATE).await.rate_limit().unwrap());
}

#[tokio::test]
async fn rate_limits_on_successes_as_an_extension() {
    let resp = run(response(
        200,
        OPENAI_LIMITS,
        Chunks::one(r#"{"choices":[{"message":{"content":"Hi"}}]}"#),
    ))
    .await
    .unwrap();
    check_openai(resp.extensions().get::<RateLimitSnapshot>().unwrap());
    check_openai(LlmResponse::rate_limit(&resp).unwrap());

    let owned = anthropic_limits("Sat, 01 Mar 2025 10:00:00 GMT");
    let headers: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let resp = run(response(200, &headers, Chunks::one("{}")))
        .await
        .unwrap();
    check_anthropic(LlmResponse::rate_limit(&resp).unwrap());

    let resp = run(response(200, &[], Chunks::one("{}"))).await.unwrap();
    assert!(LlmResponse::rate_limit(&resp).is_none());
}

#[tokio::test]
async fn absurd_hints_are_clamped() {
    let err = error_of(429, &[("retry-after", "31536000")], RATE).await;
    assert_eq!(err.retry_after(), Some(MAX_HINT));
    let err = error_of(
        429,
        &[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "99999h"),
        ],
        RATE,
    )
    .await;
    assert_eq!(err.retry_hint(), Some(MAX_HINT));
}
