//! End to end over real loopback HTTP: one test per fault of the chaos upstream.
//!
//! Each test starts `seawall_mock::serve` on `127.0.0.1:0` with a profile built in code for one
//! fault, sends requests through the `seawall-http` transport, `ClassifyLayer` and the layers
//! that fault needs, and asserts what the caller sees: an answer, a classified error, an
//! incomplete stream, or a fallback (plus the mock's own counters where they prove a point,
//! such as "exactly one upstream call").
//!
//! Real sockets mean real time: latencies in the profiles are milliseconds, no test asserts an
//! elapsed time, and every test runs under a generous timeout so that a hang fails instead of
//! blocking CI.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use seawall::FailureClass;
use seawall::classify::ClassifyLayer;
use seawall::core::{BodyReport, GiveUp, ServedBy};
use seawall::fallback::{FallbackLayer, Target, box_response};
use seawall::http::{AnthropicConfig, ApiKey, HttpTransport, OpenAiConfig};
use seawall::mock::{
    Count, Delay, ErrorRule, KeepAliveStyle, KeyBy, KeyLimits, MalformedKind, MockUpstream, Profile,
};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::{StreamEnd, StreamStats, StreamTimeoutLayer};
use seawall_test_support::{drain, start_mock};
use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};

const KEY: &str = "sk-e2e-0123456789abcdef";

/// Far longer than any test needs: reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(30);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("the test hung: no outcome within its time limit")
}

/// A chaos upstream on loopback.
struct Mock {
    addr: SocketAddr,
    upstream: MockUpstream,
}

async fn start(profile: Profile) -> Mock {
    profile.validate().expect("a valid profile");
    let (addr, upstream) = start_mock(profile).await;
    Mock { addr, upstream }
}

impl Mock {
    /// An OpenAI-compatible transport pointed at this mock, with `key`.
    fn openai_with_key(&self, key: &str) -> HttpTransport {
        let upstream = OpenAiConfig::new(ApiKey::new(key).unwrap())
            .with_base_url(format!("http://{}/v1", self.addr))
            .upstream()
            .unwrap();
        HttpTransport::builder().upstream(upstream).build().unwrap()
    }

    fn openai(&self) -> HttpTransport {
        self.openai_with_key(KEY)
    }

    /// An Anthropic transport pointed at this mock.
    fn anthropic(&self) -> HttpTransport {
        let upstream = AnthropicConfig::new(ApiKey::new(KEY).unwrap())
            .with_base_url(format!("http://{}", self.addr))
            .upstream()
            .unwrap();
        HttpTransport::builder().upstream(upstream).build().unwrap()
    }
}

/// An OpenAI chat completion request (relative URI: the transport adds the base URL and key).
fn chat(model: &str, stream: bool, max_tokens: u32) -> http::Request<Bytes> {
    let body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": "Say hello"}],
    });
    http::Request::post("/chat/completions")
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

/// An Anthropic messages request.
fn messages(model: &str, stream: bool) -> http::Request<Bytes> {
    let body = json!({
        "model": model,
        "max_tokens": 64,
        "stream": stream,
        "messages": [{"role": "user", "content": "Say hello"}],
    });
    http::Request::post("/v1/messages")
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

/// A retry layer with real-time-friendly delays: milliseconds instead of seconds.
fn retry(max_attempts: u32) -> BackoffRetryLayer {
    BackoffRetryLayer::builder()
        .max_attempts(max_attempts)
        .base_delay(ms(1))
        .max_delay(ms(20))
        .overload_min_delay(ms(1))
        .seed(7)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_healthy_upstream_answers_complete_and_streamed_in_both_wire_formats() {
    bounded(async {
        let mock = start(Profile::default().seed(1)).await;
        let openai = ServiceBuilder::new()
            .layer(StreamTimeoutLayer::new())
            .layer(ClassifyLayer::default())
            .service(mock.openai());

        let resp = openai
            .clone()
            .oneshot(chat("gpt-4o-mini", false, 64))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let (text, err) = drain(resp.into_body()).await;
        assert!(err.is_none(), "{err:?}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");

        let resp = openai.oneshot(chat("gpt-4o-mini", true, 64)).await.unwrap();
        let stats = StreamStats::of(&resp).unwrap();
        let (text, err) = drain(resp.into_body()).await;
        assert!(err.is_none(), "{err:?}");
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
        assert!(stats.is_streamed() && stats.is_complete());
        assert!(stats.time_to_first_token().is_some());

        let anthropic = ServiceBuilder::new()
            .layer(StreamTimeoutLayer::new())
            .layer(ClassifyLayer::default())
            .service(mock.anthropic());
        let resp = anthropic
            .oneshot(messages("claude-haiku-4-5", true))
            .await
            .unwrap();
        let report = resp.extensions().get::<Arc<BodyReport>>().cloned().unwrap();
        let (text, err) = drain(resp.into_body()).await;
        assert!(err.is_none(), "{err:?}");
        assert!(text.contains("event: message_stop"), "{text}");
        assert!(report.is_finished());
        assert_eq!(report.usage().map(|u| u.output_tokens), Some(16));

        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.ok, s.streams_completed), (3, 3, 2));
    })
    .await;
}

#[tokio::test]
async fn a_rate_limit_is_retried_after_the_servers_hint_then_answered() {
    bounded(async {
        // 6,000 tokens per minute refill at 100 tokens/s. The first call takes the whole bucket
        // (12 tokens of prompt and 5,988 of output; more would be refused as too large); the
        // second (about 100 tokens) gets a 429 whose `retry-after-ms` says ~1 s, and the retry
        // layer waits that long rather than its own 1-20 ms backoff.
        let mock = start(Profile::default().tpm(6_000)).await;
        let svc = ServiceBuilder::new()
            .layer(retry(3))
            .layer(ClassifyLayer::default())
            .service(mock.openai());

        let first = svc
            .clone()
            .oneshot(chat("gpt-4o-mini", false, 5_988))
            .await
            .unwrap();
        drop(first);
        let resp = svc.oneshot(chat("gpt-4o-mini", false, 90)).await.unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(body.starts_with(br#"{"id":"chatcmpl-"#));

        let s = mock.upstream.stats();
        assert_eq!(s.rate_limited, 1, "the second call was limited once: {s:?}");
        // Had the retry come before the hint, the bucket would still be short: a second 429.
        assert_eq!((s.requests, s.ok), (3, 2), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn insufficient_quota_is_final_after_exactly_one_upstream_call() {
    bounded(async {
        let mock = start(Profile::default().exhausted_key(KEY)).await;
        let svc = ServiceBuilder::new()
            .layer(retry(4))
            .layer(ClassifyLayer::default())
            .service(mock.openai());

        let err = svc
            .oneshot(chat("gpt-4o-mini", false, 64))
            .await
            .unwrap_err();
        assert_eq!(err.class(), FailureClass::QuotaExhausted);
        assert_eq!(err.status().map(|s| s.as_u16()), Some(429));
        assert_eq!(err.code(), Some("insufficient_quota"));
        assert_eq!(err.give_up(), Some(GiveUp::NotRetryable));
        assert!(err.attempts().is_empty());

        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.quota_exhausted), (1, 1), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn a_prompt_over_the_context_window_is_context_length_exceeded_and_not_retried() {
    bounded(async {
        let mock = start(Profile::default().context_window(50)).await;
        let svc = ServiceBuilder::new()
            .layer(retry(4))
            .layer(ClassifyLayer::default())
            .service(mock.openai());

        let long = "lorem ipsum ".repeat(100);
        let body = json!({"model": "small-model", "max_tokens": 16,
                          "messages": [{"role": "user", "content": long}]});
        let req = http::Request::post("/chat/completions")
            .body(Bytes::from(body.to_string()))
            .unwrap();
        let err = svc.oneshot(req).await.unwrap_err();
        assert_eq!(err.class(), FailureClass::ContextLengthExceeded);
        assert_eq!(err.status().map(|s| s.as_u16()), Some(400));
        assert_eq!(err.code(), Some("context_length_exceeded"));
        assert!(
            err.message().contains("maximum context length is 50"),
            "{err}"
        );

        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.context_length), (1, 1), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn a_request_over_the_tokens_per_minute_is_not_retried_and_a_model_with_room_serves_it() {
    bounded(async {
        // Per model: 1,000 tokens a minute for the small model, 100,000 for the larger one.
        let mut roomy = KeyLimits::default();
        roomy.tpm = Some(100_000);
        let profile = Profile::default()
            .key_by(KeyBy::Model)
            .tpm(1_000)
            .key_limits("big-model", roomy);
        let mock = start(profile).await;
        let fallback = FallbackLayer::builder()
            .larger_context(Target::model("big-model"))
            .build()
            .unwrap();
        let svc = ServiceBuilder::new()
            .layer(fallback)
            .layer(retry(4))
            .layer(ClassifyLayer::default())
            .service(mock.openai());

        // 2,000 tokens of output asked for: more than the small model's whole minute.
        let resp = svc
            .oneshot(chat("small-model", false, 2_000))
            .await
            .unwrap();
        let served = resp.extensions().get::<ServedBy>().cloned().unwrap();
        assert_eq!(served.model.as_deref(), Some("big-model"));
        let (text, err) = drain(resp.into_body()).await;
        assert!(err.is_none(), "{err:?}");
        assert!(text.contains(r#""model":"big-model""#), "{text}");

        // One refusal, no retry of it, then the larger model's answer.
        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.status(429), s.ok), (2, 1, 1), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn an_outage_of_529s_and_503s_is_overloaded_retried_to_the_attempt_cap() {
    bounded(async {
        let mock =
            start(Profile::default().error(ErrorRule::random(529, 1.0).statuses(&[529, 503])))
                .await;
        let svc = ServiceBuilder::new()
            .layer(retry(3))
            .layer(ClassifyLayer::default())
            .service(mock.openai());

        let err = svc
            .oneshot(chat("gpt-4o-mini", false, 64))
            .await
            .unwrap_err();
        assert_eq!(err.class(), FailureClass::Overloaded);
        assert!(matches!(err.status().map(|s| s.as_u16()), Some(529 | 503)));
        assert_eq!(err.give_up(), Some(GiveUp::AttemptsExhausted));
        let earlier: Vec<_> = err.attempts().iter().map(|a| a.class).collect();
        assert_eq!(earlier, [FailureClass::Overloaded; 2]);

        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.server_errors), (3, 3), "{s:?}");
        assert_eq!(s.status(529) + s.status(503), 3);
    })
    .await;
}

#[tokio::test]
async fn an_html_502_from_a_proxy_is_a_retried_server_error() {
    bounded(async {
        let mock = start(Profile::default().malformed(1.0, &[MalformedKind::Html502])).await;
        let svc = ServiceBuilder::new()
            .layer(retry(2))
            .layer(ClassifyLayer::default())
            .service(mock.openai());

        let err = svc
            .oneshot(chat("gpt-4o-mini", false, 64))
            .await
            .unwrap_err();
        assert_eq!(err.class(), FailureClass::ServerError);
        assert_eq!(err.status().map(|s| s.as_u16()), Some(502));
        assert_eq!(err.code(), None, "an HTML page has no provider code");
        assert_eq!(err.attempts().len(), 1);

        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.malformed, s.status(502)), (2, 2, 2), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn an_error_body_cut_short_is_still_classified_from_what_arrived() {
    bounded(async {
        // The classifier reads at most 24 bytes of the error body: the JSON is cut mid-way, so
        // the status and headers must carry the classification on their own.
        let mock = start(Profile::default().error(ErrorRule::random(529, 1.0))).await;
        let svc = ServiceBuilder::new()
            .layer(
                ClassifyLayer::builder()
                    .error_body_limit(24)
                    .build()
                    .unwrap(),
            )
            .service(mock.openai());

        let err = svc
            .oneshot(chat("gpt-4o-mini", false, 64))
            .await
            .unwrap_err();
        assert_eq!(err.class(), FailureClass::Overloaded);
        assert_eq!(err.status().map(|s| s.as_u16()), Some(529));
        assert!(err.request_id().is_some_and(|id| id.starts_with("req_")));
    })
    .await;
}

#[tokio::test]
async fn a_revoked_key_is_an_authentication_error_that_never_shows_the_key() {
    bounded(async {
        const REVOKED: &str = "sk-revoked-0123456789";
        let mock = start(Profile::default().invalid_key(REVOKED)).await;
        let svc = ServiceBuilder::new()
            .layer(retry(4))
            .layer(ClassifyLayer::default())
            .service(mock.openai_with_key(REVOKED));

        let err = svc
            .oneshot(chat("gpt-4o-mini", false, 64))
            .await
            .unwrap_err();
        assert_eq!(err.class(), FailureClass::Authentication);
        assert_eq!(err.status().map(|s| s.as_u16()), Some(401));
        assert_eq!(err.code(), Some("invalid_api_key"));
        for shown in [err.to_string(), format!("{err:?}")] {
            assert!(!shown.contains(REVOKED), "{shown}");
        }

        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.status(401)), (1, 1), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn a_stream_cut_after_content_ends_with_stream_interrupted_and_is_not_retried() {
    bounded(async {
        let mock = start(
            Profile::default()
                .per_token_latency(Delay::fixed(ms(1)))
                .cut_streams(1.0, Count::fixed(4), false),
        )
        .await;
        let svc = ServiceBuilder::new()
            .layer(retry(3))
            .layer(StreamTimeoutLayer::new())
            .layer(ClassifyLayer::default())
            .service(mock.openai());

        // The head and the first tokens arrive: the caller has an answer in hand...
        let resp = svc.oneshot(chat("gpt-4o-mini", true, 64)).await.unwrap();
        let stats = StreamStats::of(&resp).unwrap();
        // ...which ends in an error, never as a silently truncated answer.
        let (text, err) = drain(resp.into_body()).await;
        assert!(text.contains(r#""content":"#), "content came first: {text}");
        assert!(!text.contains("[DONE]"));
        let err = err.expect("the body ends in an error");
        assert_eq!(err.class(), FailureClass::StreamInterrupted);
        assert_eq!(stats.end(), Some(StreamEnd::Interrupted));

        let s = mock.upstream.stats();
        assert_eq!(
            (s.requests, s.streams_cut),
            (1, 1),
            "past the commit point: {s:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_stream_reset_after_content_ends_with_stream_interrupted() {
    bounded(async {
        // Paced so the client has read the first tokens before the reset arrives: a reset
        // discards whatever the receiving socket still holds, which on a loaded machine can
        // be everything, and the cut would then look like one before any content.
        let mock = start(
            Profile::default()
                .first_token_latency(Delay::fixed(ms(50)))
                .per_token_latency(Delay::fixed(ms(50)))
                .cut_streams(1.0, Count::fixed(3), true),
        )
        .await;
        let svc = ServiceBuilder::new()
            .layer(retry(3))
            .layer(StreamTimeoutLayer::new())
            .layer(ClassifyLayer::default())
            .service(mock.anthropic());

        let resp = svc
            .oneshot(messages("claude-haiku-4-5", true))
            .await
            .unwrap();
        let (text, err) = drain(resp.into_body()).await;
        assert!(text.contains("content_block_delta"), "{text}");
        assert!(!text.contains("message_stop"));
        assert_eq!(
            err.map(|e| e.class()),
            Some(FailureClass::StreamInterrupted)
        );
        assert_eq!(mock.upstream.stats().requests, 1);
    })
    .await;
}

#[tokio::test]
async fn keepalives_before_the_first_token_are_passed_on_but_do_not_commit_the_stream() {
    bounded(async {
        let mock = start(
            Profile::default()
                .first_token_latency(Delay::fixed(ms(120)))
                .keepalives(1.0, ms(10), KeepAliveStyle::Comment),
        )
        .await;
        let svc = ServiceBuilder::new()
            .layer(StreamTimeoutLayer::new())
            .layer(ClassifyLayer::default())
            .service(mock.openai());

        let resp = svc.oneshot(chat("gpt-4o-mini", true, 64)).await.unwrap();
        // The future resolved at the commit point: real content had already arrived, although
        // keep-alives came well before it.
        let report = resp.extensions().get::<Arc<BodyReport>>().cloned().unwrap();
        assert!(report.has_content());
        let (text, err) = drain(resp.into_body()).await;
        assert!(err.is_none(), "{err:?}");
        // The held keep-alives are replayed to the caller, in order, before the content.
        assert!(text.starts_with(": keep-alive"), "{text}");
        assert!(text.find(": keep-alive") < text.find(r#""content":"#));
        assert!(text.trim_end().ends_with("data: [DONE]"));
    })
    .await;
}

#[tokio::test]
async fn keepalives_do_not_satisfy_the_time_to_first_token_timeout() {
    bounded(async {
        // Keep-alives every 10 ms, the first token only after 5 s: a 200 ms time-to-first-token
        // timeout fires although bytes keep arriving.
        let mock = start(
            Profile::default()
                .first_token_latency(Delay::fixed(Duration::from_secs(5)))
                .keepalives(1.0, ms(10), KeepAliveStyle::Comment),
        )
        .await;
        let svc = ServiceBuilder::new()
            .layer(
                StreamTimeoutLayer::builder()
                    .first_token(ms(200))
                    .build()
                    .unwrap(),
            )
            .layer(ClassifyLayer::default())
            .service(mock.openai());

        let err = svc
            .oneshot(chat("gpt-4o-mini", true, 64))
            .await
            .unwrap_err();
        assert_eq!(err.class(), FailureClass::Timeout);
        // The head had arrived: it was the missing content, not the head, that timed out.
        assert_eq!(mock.upstream.stats().streams_started, 1);
    })
    .await;
}

#[tokio::test]
async fn an_overload_event_before_any_content_is_retried() {
    bounded(async {
        // Anthropic's `event: error` / `overloaded_error` right after a 200 head, before any
        // content: still before the commit point, so it is an `Err` the retry layer acts on.
        let mock = start(Profile::default().mid_stream_errors(1.0, Count::fixed(0))).await;
        let svc = ServiceBuilder::new()
            .layer(retry(3))
            .layer(StreamTimeoutLayer::new())
            .layer(ClassifyLayer::default())
            .service(mock.anthropic());

        let err = svc
            .oneshot(messages("claude-haiku-4-5", true))
            .await
            .unwrap_err();
        assert_eq!(err.class(), FailureClass::Overloaded);
        assert_eq!(err.error_type(), Some("overloaded_error"));
        assert_eq!(err.give_up(), Some(GiveUp::AttemptsExhausted));
        assert_eq!(err.attempts().len(), 2);

        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.streams_errored), (3, 3), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn an_overloaded_model_falls_back_to_another_model_before_the_first_byte() {
    bounded(async {
        let mock =
            start(Profile::default().error(ErrorRule::random(529, 1.0).model("big-model"))).await;
        let svc = ServiceBuilder::new()
            .layer(FallbackLayer::new([Target::model("small-model")]))
            .layer(retry(2))
            .layer(StreamTimeoutLayer::new())
            .layer(ClassifyLayer::default())
            .service(mock.openai());

        let resp = svc.oneshot(chat("big-model", true, 64)).await.unwrap();
        let served = resp.extensions().get::<ServedBy>().cloned().unwrap();
        assert_eq!(&*served.target, "small-model");
        assert_eq!(served.model.as_deref(), Some("small-model"));
        assert!(!served.degraded);
        let (text, err) = drain(resp.into_body()).await;
        assert!(err.is_none(), "{err:?}");
        assert!(text.contains(r#""model":"small-model""#), "{text}");

        let s = mock.upstream.stats();
        // The primary's two attempts, then the fallback's one.
        assert_eq!((s.requests, s.status(529), s.ok), (3, 2, 1), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn a_provider_down_falls_back_to_another_provider() {
    bounded(async {
        let down = start(Profile::default().error(ErrorRule::random(503, 1.0))).await;
        let healthy = start(Profile::default()).await;
        let stack = |transport: HttpTransport| {
            ServiceBuilder::new()
                .map_response(box_response)
                .layer(retry(2))
                .layer(StreamTimeoutLayer::new())
                .layer(ClassifyLayer::default())
                .service(transport)
        };
        let svc = ServiceBuilder::new()
            .layer(FallbackLayer::new([Target::service(
                "backup",
                stack(healthy.openai()),
            )]))
            .service(stack(down.openai()));

        let resp = svc.oneshot(chat("gpt-4o-mini", true, 64)).await.unwrap();
        let served = resp.extensions().get::<ServedBy>().cloned().unwrap();
        assert_eq!(&*served.target, "backup");
        let (text, err) = drain(resp.into_body()).await;
        assert!(err.is_none(), "{err:?}");
        assert!(text.trim_end().ends_with("data: [DONE]"));
        assert_eq!(down.upstream.stats().requests, 2);
        assert_eq!(healthy.upstream.stats().ok, 1);
    })
    .await;
}

#[tokio::test]
async fn a_200_holding_an_error_or_nothing_is_retried_before_the_commit_point() {
    bounded(async {
        for (kind, class) in [
            (MalformedKind::Error200, FailureClass::Overloaded),
            (MalformedKind::Empty, FailureClass::EmptyResponse),
        ] {
            let mock = start(Profile::default().malformed(1.0, &[kind])).await;
            let openai = ServiceBuilder::new()
                .layer(retry(3))
                .layer(StreamTimeoutLayer::new())
                .layer(ClassifyLayer::default())
                .service(mock.openai());
            let anthropic = ServiceBuilder::new()
                .layer(retry(3))
                .layer(StreamTimeoutLayer::new())
                .layer(ClassifyLayer::default())
                .service(mock.anthropic());
            for stream in [false, true] {
                // Nothing reached the caller: an `Err` that the retry layer retried.
                let err = openai
                    .clone()
                    .oneshot(chat("gpt-4o-mini", stream, 64))
                    .await
                    .unwrap_err();
                assert_eq!(err.class(), class, "{kind:?} stream={stream}");
                assert_eq!(err.status().map(|s| s.as_u16()), Some(200));
                assert_eq!(err.attempts().len(), 2, "{kind:?} stream={stream}");
                let err = anthropic
                    .clone()
                    .oneshot(messages("claude-haiku-4-5", stream))
                    .await
                    .unwrap_err();
                assert_eq!(err.class(), class, "{kind:?} stream={stream}");
                assert_eq!(err.attempts().len(), 2, "{kind:?} stream={stream}");
            }
            let s = mock.upstream.stats();
            assert_eq!((s.requests, s.malformed), (12, 12), "{kind:?}: {s:?}");
        }
    })
    .await;
}
