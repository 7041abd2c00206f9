//! Property tests: the header and body parsers never panic, and keep their bounds.

mod common;

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use proptest::prelude::*;
use seawall_classify::hints::{self, MAX_HINT};
use seawall_classify::{
    AutoClassifier, Classifier, ErrorResponse, ProviderError, StatusClassifier,
};
use seawall_core::{FailureClass, MAX_MESSAGE_LEN};

const HEADER_NAMES: &[&str] = &[
    "retry-after",
    "retry-after-ms",
    "x-ms-retry-after-ms",
    "x-should-retry",
    "date",
    "x-request-id",
    "request-id",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-limit",
];

fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,40}",
        "-?[0-9]{1,30}(\\.[0-9]{0,10})?",
        "([0-9]{1,6}(\\.[0-9]{1,3})?(h|m|s|ms|us|ns)){1,4}",
        "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,12})?(Z|[+-][0-9]{2}:[0-9]{2})",
        "(Mon|Tue|Sun), [0-9]{2} (Jan|Feb|Dec) [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT",
        Just("NaN".to_owned()),
        Just("inf".to_owned()),
        Just("-inf".to_owned()),
    ]
}

fn headers() -> impl Strategy<Value = HeaderMap> {
    proptest::collection::vec((0..HEADER_NAMES.len(), header_value()), 0..8).prop_map(|pairs| {
        let mut h = HeaderMap::new();
        for (i, v) in pairs {
            if let Ok(v) = HeaderValue::from_str(&v) {
                h.append(HeaderName::from_static(HEADER_NAMES[i]), v);
            }
        }
        h
    })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..300),
        "\\{\"error\":\\{\"message\":\"[ -~]{0,60}\",\"type\":\"[a-z_]{0,20}\",\"code\":\"[a-z_0-9]{0,20}\"\\}\\}"
            .prop_map(String::into_bytes),
        "\\{\"type\":\"error\",\"error\":\\{\"type\":\"[a-z_]{0,20}\",\"message\":\"[ -~]{0,60}\"\\}"
            .prop_map(String::into_bytes),
        "[ -~]{0,100}".prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn header_parsers_never_panic_and_stay_bounded(v in header_value(), h in headers(), secs in 0u64..4_000_000_000) {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        for d in [
            hints::parse_go_duration(&v),
            hints::parse_retry_after(&v, now),
            hints::retry_after_from_message(&v),
            hints::retry_after_from_message(&format!("Please try again in {v}")),
            hints::retry_after_from_headers(&h, now),
        ].into_iter().flatten() {
            prop_assert!(d <= MAX_HINT);
        }
        let _ = hints::parse_rfc3339(&v);
        let _ = hints::should_retry(&h);
        let _ = hints::request_id(&h);
        if let Some(s) = hints::rate_limits(&h, now) {
            for w in s.windows() {
                prop_assert!(w.reset_after.is_none_or(|d| d <= MAX_HINT));
            }
        }
    }

    #[test]
    fn error_classification_never_panics(status in 100u16..1000, h in headers(), b in body(), cut in any::<bool>()) {
        let status = StatusCode::from_u16(status).unwrap();
        let r = ErrorResponse::new(status, &h, &b).with_truncated(cut);
        let _ = ProviderError::parse(&b);
        for err in [AutoClassifier.classify_response(&r), StatusClassifier.classify_response(&r)] {
            prop_assert!(!err.class().is_local());
            prop_assert!(err.message().len() <= MAX_MESSAGE_LEN);
            prop_assert!(!err.message().is_empty());
            prop_assert_eq!(err.status(), Some(status));
            prop_assert!(err.retry_after().is_none_or(|d| d <= MAX_HINT));
        }
    }

    #[test]
    fn go_durations_round_trip(h in 0u64..24, m in 0u64..60, s in 0u64..60, ms in 0u64..1000) {
        let text = format!("{h}h{m}m{s}.{ms:03}s");
        let want = Duration::from_millis(((h * 60 + m) * 60 + s) * 1000 + ms);
        let got = hints::parse_go_duration(&text).unwrap();
        let diff = got.abs_diff(want);
        prop_assert!(diff < Duration::from_micros(1), "{} -> {:?}", text, got);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn stream_parser_never_panics(chunks in proptest::collection::vec(
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64),
            "(event: (error|ping|message_stop)\n)?data: [ -~]{0,40}\n\n?".prop_map(String::into_bytes),
            Just(b"data: {\"error\":{\"type\":\"overloaded_error\"}}\n\n".to_vec()),
            Just(b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n".to_vec()),
            Just(b"data: [DONE]\n\n".to_vec()),
        ],
        0..12,
    ), sse in any::<bool>()) {
        let ct = if sse { "text/event-stream" } else { "application/json" };
        let total: usize = chunks.iter().map(Vec::len).sum();
        let blank = chunks.iter().flatten().all(u8::is_ascii_whitespace);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (bytes, err) = rt.block_on(async {
            match common::run(common::response(200, &[("content-type", ct)], common::Chunks::new(chunks))).await {
                Ok(resp) => common::drain(resp.into_body()).await,
                // Read ahead and refused before the head was handed on: nothing passed.
                Err(e) => (Vec::new(), Some(e)),
            }
        });
        // A JSON answer of blank lines alone is no answer; anything else is not called empty
        // for its blanks.
        if !sse && blank {
            prop_assert_eq!(err.as_ref().map(|e| e.class()), Some(FailureClass::EmptyResponse));
        }
        // Every byte before an error passes through; an error is never a local class.
        prop_assert!(bytes.len() <= total);
        if err.is_none() { prop_assert_eq!(bytes.len(), total); }
        prop_assert!(err.is_none_or(|e| !e.class().is_local()));
    }
}
