//! `SeawallMiddleware` in a real `reqwest_middleware::ClientWithMiddleware`, against the chaos
//! upstream over loopback: server hints, quota, overloads, fallback, streams, streamed request
//! bodies, state shared by every call, and a cache partitioned by the caller's key.

mod common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{KEY, Mock, Raw, bounded, chat_body, ms, raw_server, retry, start};
use seawall_cache::{CACHE_HEADER, CacheLayer, MemoryStore};
use seawall_classify::ClassifyLayer;
use seawall_core::{FailureClass, GiveUp, LlmError, ServedBy};
use seawall_fallback::{FallbackLayer, Target};
use seawall_gate::ConcurrencyGateLayer;
use seawall_mock::{Delay, ErrorRule, Profile};
use seawall_observe::{CallRecord, ObserveLayer, Recorder};
use seawall_reqwest::{NextService, ReqwestTransport, SeawallMiddleware, llm_error};
use seawall_stream::StreamTimeoutLayer;
use tower::{ServiceBuilder, ServiceExt};

/// A `ClientWithMiddleware` whose only middleware is seawall around `stack`.
fn client<S>(stack: S) -> reqwest_middleware::ClientWithMiddleware
where
    SeawallMiddleware<S>: reqwest_middleware::Middleware,
{
    reqwest_middleware::ClientBuilder::new(ReqwestTransport::client_builder().build().unwrap())
        .with(SeawallMiddleware::new(stack))
        .build()
}

fn post(
    client: &reqwest_middleware::ClientWithMiddleware,
    mock: &Mock,
    model: &str,
    stream: bool,
) -> reqwest_middleware::RequestBuilder {
    client
        .post(mock.chat_url())
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(chat_body(model, stream))
}

/// Keeps every call record.
#[derive(Clone, Default)]
struct Records(Arc<Mutex<Vec<CallRecord>>>);

impl Recorder for Records {
    fn record(&self, record: &CallRecord) {
        self.0.lock().unwrap().push(record.clone());
    }
}

impl Records {
    fn take(&self) -> Vec<CallRecord> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

#[tokio::test]
async fn a_rate_limit_is_retried_after_the_servers_retry_after_then_answered() {
    bounded(async {
        // 429 with `retry-after: 1` for the first 800 ms of the upstream's life.
        let hint = Duration::from_secs(1);
        let mock = start(
            Profile::default()
                .error(ErrorRule::outage(429, Duration::ZERO, ms(800)).retry_after(hint)),
        )
        .await;
        let records = Records::default();
        let stack = ServiceBuilder::new()
            .layer(
                ObserveLayer::builder()
                    .recorder(records.clone())
                    .build()
                    .unwrap(),
            )
            .layer(retry(4, ms(1)))
            .layer(ClassifyLayer::new())
            .service(NextService::new());
        let client = client(stack);

        let started = Instant::now();
        let resp = post(&client, &mock, "gpt-4o-mini", false)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.url().as_str(), mock.chat_url());
        let v: serde_json::Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
        assert_eq!(v["object"], "chat.completion");
        let elapsed = started.elapsed();

        let s = mock.upstream.stats();
        let limited = s.status(429);
        assert!(limited >= 1, "the first attempt was limited: {s:?}");
        assert_eq!(s.requests, limited + 1, "then one answer: {s:?}");
        // The retry layer's own backoff is 1-20 ms: only the hint explains this wait.
        assert!(
            elapsed >= hint * limited as u32,
            "each retry waited the hint: {elapsed:?}"
        );
        let records = records.take();
        assert_eq!(records.len(), 1, "one logical call");
        assert_eq!(u64::from(records[0].attempts), limited + 1);
    })
    .await;
}

#[tokio::test]
async fn an_exhausted_quota_is_final_after_exactly_one_upstream_call() {
    bounded(async {
        let mock = start(Profile::default().exhausted_key(KEY)).await;
        let stack = ServiceBuilder::new()
            .layer(retry(4, ms(1)))
            .layer(ClassifyLayer::new())
            .service(NextService::new());
        let client = client(stack);

        let err = post(&client, &mock, "gpt-4o-mini", false)
            .send()
            .await
            .unwrap_err();
        let e = llm_error(&err).expect("the LlmError, downcastable");
        assert_eq!(e.class(), FailureClass::QuotaExhausted);
        assert_eq!(e.code(), Some("insufficient_quota"));
        assert_eq!(e.status().map(|s| s.as_u16()), Some(429));
        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.quota_exhausted), (1, 1), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn a_burst_of_529s_is_retried_until_the_upstream_answers() {
    bounded(async {
        let mock =
            start(Profile::default().error(ErrorRule::outage(529, Duration::ZERO, ms(700)))).await;
        let stack = ServiceBuilder::new()
            .layer(retry(10, ms(250)))
            .layer(ClassifyLayer::new())
            .service(NextService::new());
        let client = client(stack);

        let resp = post(&client, &mock, "gpt-4o-mini", false)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
        let s = mock.upstream.stats();
        let overloaded = s.status(529);
        assert!(overloaded >= 1, "{s:?}");
        assert_eq!(s.requests, overloaded + 1, "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn an_overloaded_model_falls_back_to_another_model() {
    bounded(async {
        let mock =
            start(Profile::default().error(ErrorRule::random(529, 1.0).model("big-model"))).await;
        let stack = ServiceBuilder::new()
            .layer(FallbackLayer::new([Target::model("small-model")]))
            .layer(retry(2, ms(1)))
            .layer(ClassifyLayer::new())
            .service(NextService::new());
        let client = client(stack);

        let resp = post(&client, &mock, "big-model", false)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let served = resp.extensions().get::<ServedBy>().cloned().unwrap();
        assert_eq!(served.model.as_deref(), Some("small-model"));
        let v: serde_json::Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
        assert_eq!(v["model"], "small-model");
        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.status(529), s.ok), (3, 2, 1), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn a_streamed_answer_streams_on_after_the_middleware_returned() {
    bounded(async {
        let mock = start(Profile::default().per_token_latency(Delay::fixed(ms(20)))).await;
        let stack = ServiceBuilder::new()
            .layer(retry(3, ms(1)))
            .layer(StreamTimeoutLayer::new())
            .layer(ClassifyLayer::new())
            .service(NextService::new());
        let client = client(stack);

        let mut resp = post(&client, &mock, "gpt-4o-mini", true)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut chunks = 0;
        let mut text = Vec::new();
        while let Some(chunk) = resp.chunk().await.unwrap() {
            chunks += 1;
            text.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains(r#""content":"#), "{text}");
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
        assert!(chunks > 1, "tokens arrived as they were sent, not at once");
        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.streams_completed), (1, 1), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn the_stacks_state_is_shared_by_every_call_through_the_middleware() {
    bounded(async {
        let mock = start(Profile::default().per_token_latency(Delay::fixed(ms(50)))).await;
        // One permit and no queue: a second call while the first one's body is open is refused.
        let gate = ConcurrencyGateLayer::builder()
            .limit(1)
            .max_queue(0)
            .build()
            .unwrap();
        let stack = ServiceBuilder::new()
            .layer(gate)
            .layer(ClassifyLayer::new())
            .service(NextService::new());
        let client = client(stack);

        let first = post(&client, &mock, "gpt-4o-mini", true)
            .send()
            .await
            .unwrap();
        let err = post(&client, &mock, "gpt-4o-mini", true)
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            llm_error(&err).map(LlmError::class),
            Some(FailureClass::GateRejected)
        );
        // The permit went with the first answer's body, and comes back when it ends.
        let text = first.text().await.unwrap();
        assert!(text.contains("[DONE]"));
        let third = post(&client, &mock, "gpt-4o-mini", false)
            .send()
            .await
            .unwrap();
        assert_eq!(third.status(), 200);
        assert_eq!(mock.upstream.stats().requests, 2);
    })
    .await;
}

#[tokio::test]
async fn a_cache_in_the_middleware_answers_repeats_and_keeps_each_key_to_its_own_answers() {
    bounded(async {
        let mock = start(Profile::default()).await;
        let stack = ServiceBuilder::new()
            .layer(CacheLayer::new(MemoryStore::new()))
            .layer(retry(3, ms(1)))
            .layer(ClassifyLayer::new())
            .service(NextService::new());
        let client = client(stack);
        let ask = |key: &'static str| {
            client
                .post(mock.chat_url())
                .bearer_auth(key)
                .header("content-type", "application/json")
                .body(chat_body("gpt-4o-mini", false))
                .send()
        };
        let cache = |resp: &reqwest::Response| {
            resp.headers()
                .get(CACHE_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };

        let first = ask(KEY).await.unwrap();
        assert_eq!(cache(&first).as_deref(), Some("miss"));
        let first = first.text().await.unwrap();
        let again = ask(KEY).await.unwrap();
        assert_eq!(cache(&again).as_deref(), Some("hit"));
        assert_eq!(again.text().await.unwrap(), first);
        assert_eq!(mock.upstream.stats().requests, 1);

        // Another credential is another tenant: its question goes upstream.
        let other = ask("sk-e2e-another-tenant-0123").await.unwrap();
        assert_eq!(cache(&other).as_deref(), Some("miss"));
        assert_eq!(other.status(), 200);
        assert_eq!(mock.upstream.stats().requests, 2);
    })
    .await;
}

#[tokio::test]
async fn a_request_with_a_streamed_body_bypasses_the_stack_and_is_sent_once() {
    bounded(async {
        let mock = start(Profile::default()).await;
        // A stack that refuses everything: only a request that bypasses it gets through.
        let refuse = tower::service_fn(|_req: http::Request<Bytes>| async {
            Err::<http::Response<http_body_util::Empty<Bytes>>, _>(LlmError::new(
                FailureClass::CircuitOpen,
                "refused by the test's stack",
            ))
        });
        let client = client(refuse);

        let err = post(&client, &mock, "gpt-4o-mini", false)
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            llm_error(&err).map(LlmError::class),
            Some(FailureClass::CircuitOpen)
        );
        assert_eq!(mock.upstream.stats().requests, 0);

        let chunks = [Ok::<_, std::io::Error>(Bytes::from(chat_body(
            "gpt-4o-mini",
            false,
        )))];
        let resp = client
            .post(mock.chat_url())
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                chunks,
            )))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(mock.upstream.stats().requests, 1);
    })
    .await;
}

#[tokio::test]
async fn overlapping_attempts_of_one_call_are_sent_side_by_side() {
    bounded(async {
        // The server answers only once both attempts are in: served one after the other, the
        // first would wait forever.
        let (addr, seen) = raw_server(Raw::OkWhenTwo).await;
        // A stack that sends two attempts of each call at once and answers with the first.
        let hedge = tower::service_fn(|req: http::Request<Bytes>| async move {
            let (parts, body) = req.into_parts();
            let copy = || http::Request::from_parts(parts.clone(), body.clone());
            let (a, b) = futures_util::join!(
                NextService::new().oneshot(copy()),
                NextService::new().oneshot(copy())
            );
            b?;
            a
        });
        let client = client(hedge);

        let resp = client
            .post(format!("http://{addr}/v1/chat/completions"))
            .body(chat_body("gpt-4o-mini", false))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.unwrap(), "{}");
        assert_eq!(seen.load(Ordering::SeqCst), 2);
    })
    .await;
}

#[tokio::test]
async fn a_refused_connection_down_the_chain_is_connect_and_retried() {
    bounded(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = listener.local_addr().unwrap();
        drop(listener);
        let stack = ServiceBuilder::new()
            .layer(retry(3, ms(1)))
            .layer(ClassifyLayer::new())
            .service(NextService::new());
        let client = client(stack);

        let err = client
            .post(format!(
                "http://{closed}/v1/chat/completions?key=AIzaSyCHAINSECRET"
            ))
            .body(chat_body("gpt-4o-mini", false))
            .send()
            .await
            .unwrap_err();
        let e = llm_error(&err).expect("the LlmError");
        assert_eq!(e.class(), FailureClass::Connect, "{e:?}");
        assert_eq!(
            e.give_up(),
            Some(GiveUp::AttemptsExhausted),
            "retried to the cap"
        );
        assert!(!format!("{err} {err:?}").contains("CHAINSECRET"));
    })
    .await;
}

#[tokio::test]
async fn next_service_outside_the_middleware_is_a_clear_error() {
    let request = http::Request::post("http://127.0.0.1:9/v1/chat/completions")
        .body(Bytes::new())
        .unwrap();
    let err = NextService::new().oneshot(request).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::InvalidRequest);
    assert!(err.message().contains("SeawallMiddleware"), "{err}");
}
