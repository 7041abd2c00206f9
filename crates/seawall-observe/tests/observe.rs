//! ObserveLayer: one record per logical call, each field from the layer that knows it.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use seawall_core::{
    BodyReport, CallContext, FailureClass, LlmError, LlmRequest, LlmResponse, OnComplete, ServedBy,
    Usage,
};
use seawall_observe::{CallOutcome, CallRecord, MetricsRecorder, ObserveLayer, Summary};
use tower::{Layer, Service, ServiceExt, service_fn};

type Records = Arc<Mutex<Vec<CallRecord>>>;

fn layer(records: &Records) -> ObserveLayer {
    let records = records.clone();
    ObserveLayer::builder()
        .config_version("cfg-7")
        .recorder(move |r: &CallRecord| records.lock().unwrap().push(r.clone()))
        .build()
        .unwrap()
}

fn request(stream: bool) -> http::Request<Bytes> {
    let body = format!(
        r#"{{"model":"gpt-4o-mini","max_tokens":32,"stream":{stream},"messages":[{{"role":"user","content":"hello"}}]}}"#
    );
    http::Request::post("http://upstream.test/v1/chat/completions")
        .body(Bytes::from(body))
        .unwrap()
}

fn context(req: &http::Request<Bytes>) -> Arc<CallContext> {
    req.call_context()
        .expect("observe puts a context in")
        .clone()
}

#[tokio::test(start_paused = true)]
async fn each_field_comes_from_the_layer_that_knows_it() {
    let records = Records::default();
    // Stands in for the inner layers: each writes the fact it owns into the context.
    let inner = service_fn(|req: http::Request<Bytes>| async move {
        let cx = context(&req);
        cx.update(|f| f.queue_wait = Some(Duration::from_millis(40))); // gate
        tokio::time::sleep(Duration::from_millis(100)).await;
        cx.update(|f| {
            f.attempts = 3; // retry
            f.cost_usd = Some(0.0125); // budget
            f.fallbacks = 1; // fallback
            f.served_by = Some(ServedBy {
                target: "anthropic".into(),
                model: Some("claude-haiku-4-5".into()),
                degraded: false,
            });
        });
        let mut resp = http::Response::new(Full::new(Bytes::from_static(b"{}")));
        resp.headers_mut()
            .insert("x-request-id", "req_123".parse().unwrap());
        resp.extensions_mut().insert(Usage {
            input_tokens: 12,
            output_tokens: 34,
            cached_input_tokens: 2,
            cache_write_input_tokens: 0,
            cache_write_1h_input_tokens: 0,
        });
        Ok::<_, Infallible>(resp)
    });
    let mut svc = layer(&records).layer(inner);
    let resp = send(&mut svc, false).await;
    assert!(
        records.lock().unwrap().is_empty(),
        "not before the body ends"
    );
    let _ = resp.into_body().collect().await.unwrap();
    let r = records.lock().unwrap().pop().unwrap();
    assert_eq!(r.outcome, CallOutcome::Success);
    assert_eq!(r.request_id.as_deref(), Some("req_123"));
    assert_eq!(r.model.as_deref(), Some("gpt-4o-mini"));
    assert_eq!(r.served_model.as_deref(), Some("claude-haiku-4-5"));
    assert_eq!(r.target.as_deref(), Some("anthropic"));
    assert!(r.fallback);
    assert_eq!(r.status, Some(200));
    assert_eq!(r.attempts, 3);
    assert_eq!(r.retries(), 2);
    assert_eq!(r.queue_wait, Some(Duration::from_millis(40)));
    assert_eq!(r.cost_usd, Some(0.0125));
    assert_eq!(r.usage.unwrap().total(), 46);
    assert_eq!(r.latency, Duration::from_millis(100));
    assert_eq!(r.config_version.as_deref(), Some("cfg-7"));
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(json["queue_wait"], 40.0);
    assert_eq!(json["usage"]["cached_input_tokens"], 2);
}

#[tokio::test(start_paused = true)]
async fn without_a_gate_there_is_no_queue_time_and_one_attempt() {
    let records = Records::default();
    let inner = service_fn(|_req: http::Request<Bytes>| async {
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"{}"))))
    });
    let mut svc = layer(&records).layer(inner);
    let resp = send(&mut svc, false).await;
    drop(resp.into_body().collect().await.unwrap());
    let r = records.lock().unwrap().pop().unwrap();
    assert_eq!(r.queue_wait, None);
    assert_eq!(r.cost_usd, None);
    assert_eq!(r.target, None);
    assert!(!r.fallback);
    assert_eq!(r.attempts, 1);
    assert_eq!(r.time_to_first_token, None);
}

/// Which target served, when only the response says it (a fallback layer that does not write
/// the context), and when both do: the context's is the one the record takes.
#[tokio::test(start_paused = true)]
async fn the_target_comes_from_the_context_first_else_from_the_response() {
    fn served(target: &str) -> ServedBy {
        ServedBy {
            target: target.into(),
            model: Some(format!("{target}-model").into()),
            degraded: false,
        }
    }
    for context_says in [None, Some("backup")] {
        let records = Records::default();
        let inner = service_fn(move |req: http::Request<Bytes>| async move {
            if let Some(t) = context_says {
                context(&req).update(|f| f.served_by = Some(served(t)));
            }
            let mut resp = http::Response::new(Full::new(Bytes::from_static(b"{}")));
            resp.extensions_mut().insert(served("primary"));
            Ok::<_, Infallible>(resp)
        });
        let mut svc = layer(&records).layer(inner);
        let resp = send(&mut svc, false).await;
        drop(resp.into_body().collect().await.unwrap());
        let r = records.lock().unwrap().pop().unwrap();
        let want = context_says.unwrap_or("primary");
        assert_eq!(r.target.as_deref(), Some(want));
        assert_eq!(
            r.served_model.as_deref(),
            Some(format!("{want}-model").as_str())
        );
        assert_eq!(r.fallback, context_says.is_some());
    }
}

/// A streamed body that records content in its report as the classifier's body would.
struct Stream {
    report: Arc<BodyReport>,
    steps: Vec<(Duration, &'static str)>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    fail_at_end: bool,
}

impl http_body::Body for Stream {
    type Data = Bytes;
    type Error = LlmError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, LlmError>>> {
        if self.steps.is_empty() {
            if self.fail_at_end {
                self.fail_at_end = false;
                return Poll::Ready(Some(Err(LlmError::new(
                    FailureClass::StreamInterrupted,
                    "cut",
                )
                .with_code("stream_cut"))));
            }
            return Poll::Ready(None);
        }
        let (wait, text) = self.steps[0];
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(wait)));
        std::task::ready!(sleep.as_mut().poll(cx));
        self.sleep = None;
        self.steps.remove(0);
        self.report.record_content();
        if self.steps.is_empty() && !self.fail_at_end {
            self.report.set_usage(Usage {
                input_tokens: 5,
                output_tokens: 5,
                cached_input_tokens: 0,
                cache_write_input_tokens: 0,
                cache_write_1h_input_tokens: 0,
            });
            self.report.set_model("gpt-4o-mini-2024-07-18");
        }
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(text.as_bytes())))))
    }
}

fn streaming_service(
    fail_at_end: bool,
) -> impl Service<
    http::Request<Bytes>,
    Response = http::Response<Stream>,
    Error = Infallible,
    Future: Send,
> + Clone {
    service_fn(move |_req: http::Request<Bytes>| async move {
        let report = Arc::new(BodyReport::new());
        let steps = vec![
            (Duration::from_millis(300), "a"),
            (Duration::from_millis(50), "b"),
            (Duration::from_millis(50), "c"),
            (Duration::from_millis(50), "d"),
            (Duration::from_millis(50), "e"),
        ];
        let mut resp = http::Response::new(Stream {
            report: report.clone(),
            steps,
            sleep: None,
            fail_at_end,
        });
        resp.extensions_mut().insert(report);
        Ok::<_, Infallible>(resp)
    })
}

#[tokio::test(start_paused = true)]
async fn streaming_calls_record_ttft_and_tpot_when_the_body_ends() {
    let records = Records::default();
    let mut svc = layer(&records).layer(streaming_service(false));
    let resp = send(&mut svc, true).await;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"abcde");
    let r = records.lock().unwrap().pop().unwrap();
    assert_eq!(r.outcome, CallOutcome::Success);
    assert_eq!(r.time_to_first_token, Some(Duration::from_millis(300)));
    // 200 ms from the first to the last of 5 output tokens: 50 ms per token after the first.
    assert_eq!(r.time_per_output_token, Some(Duration::from_millis(50)));
    assert_eq!(r.latency, Duration::from_millis(500));
    assert_eq!(r.served_model.as_deref(), Some("gpt-4o-mini-2024-07-18"));
    assert_eq!(r.usage.unwrap().output_tokens, 5);
}

#[tokio::test(start_paused = true)]
async fn a_broken_stream_is_recorded_as_interrupted() {
    let records = Records::default();
    let mut svc = layer(&records).layer(streaming_service(true));
    let resp = send(&mut svc, true).await;
    assert!(resp.into_body().collect().await.is_err());
    let r = records.lock().unwrap().pop().unwrap();
    assert_eq!(r.outcome, CallOutcome::Interrupted);
    assert_eq!(r.class, Some(FailureClass::StreamInterrupted));
    assert_eq!(r.error_code.as_deref(), Some("stream_cut"));
}

#[tokio::test(start_paused = true)]
async fn abandoned_body_and_dropped_future_each_give_one_cancelled_record() {
    let records = Records::default();
    let mut svc = layer(&records).layer(streaming_service(false));
    let resp = send(&mut svc, true).await;
    let mut body = resp.into_body();
    let _first = body.frame().await;
    drop(body);
    let slow = service_fn(|_req: http::Request<Bytes>| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new())))
    });
    let mut svc = layer(&records).layer(slow);
    let fut = svc.ready().await.unwrap().call(request(false));
    let _ = tokio::time::timeout(Duration::from_secs(1), fut).await;
    let recs = records.lock().unwrap();
    assert_eq!(recs.len(), 2);
    assert!(recs.iter().all(|r| r.outcome == CallOutcome::Cancelled));
    assert_eq!(recs[1].latency, Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_request_id_header_is_recorded_bounded_and_without_a_credential() {
    // The header is the upstream's input: an Azure id is read too, a key in it is redacted,
    // and an id of kilobytes is cut.
    for (name, value, shown) in [
        (
            "apim-request-id",
            "azure-123".to_owned(),
            Some("azure-123".to_owned()),
        ),
        (
            "request-id",
            "req_sk-proj-LEAKEDkey0123456789abcdefghij".to_owned(),
            None,
        ),
        ("x-request-id", "r".repeat(5_000), Some("r".repeat(128))),
    ] {
        let records = Records::default();
        let inner = service_fn(move |_: http::Request<Bytes>| {
            let mut resp = http::Response::new(Full::new(Bytes::from_static(b"{}")));
            resp.headers_mut().insert(name, value.parse().unwrap());
            async move { Ok::<_, Infallible>(resp) }
        });
        let mut svc = layer(&records).layer(inner);
        let _ = send(&mut svc, false).await.into_body().collect().await;
        let id = records.lock().unwrap().pop().unwrap().request_id.unwrap();
        match shown {
            Some(shown) => assert_eq!(id, shown, "{name}"),
            None => assert!(!id.contains("LEAKEDkey") && id.contains("REDACTED"), "{id}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_served_model_is_recorded_without_a_credential_it_holds() {
    // The model the answer names is the upstream's input too.
    for (served, shown) in [
        ("gpt-4o-2024-08-06", Some("gpt-4o-2024-08-06")),
        ("gpt-4o?key=AIzaSyServedSecret0123456789abcdef", None),
    ] {
        let records = Records::default();
        let inner = service_fn(move |_: http::Request<Bytes>| {
            let mut resp = http::Response::new(Full::new(Bytes::from_static(b"{}")));
            let report = Arc::new(seawall_core::BodyReport::new());
            report.set_model(served);
            resp.extensions_mut().insert(report);
            async move { Ok::<_, Infallible>(resp) }
        });
        let mut svc = layer(&records).layer(inner);
        let _ = send(&mut svc, false).await.into_body().collect().await;
        let model = records.lock().unwrap().pop().unwrap().served_model.unwrap();
        match shown {
            Some(shown) => assert_eq!(&*model, shown),
            None => assert!(!model.contains("ServedSecret"), "{model}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn errors_carry_class_code_status_request_id_and_attempts() {
    let records = Records::default();
    let inner = service_fn(|_req: http::Request<Bytes>| async {
        let mut e = LlmError::new(FailureClass::QuotaExhausted, "You exceeded your quota")
            .with_status(http::StatusCode::TOO_MANY_REQUESTS)
            .with_code("insufficient_quota")
            .with_request_id("req_9");
        e.push_attempt(seawall_core::Attempt {
            class: FailureClass::Overloaded,
            status: Some(http::StatusCode::SERVICE_UNAVAILABLE),
            elapsed: Duration::ZERO,
            delay: Duration::from_secs(1),
        });
        Err::<http::Response<Full<Bytes>>, _>(e)
    });
    let mut svc = layer(&records).layer(inner);
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(request(false))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::QuotaExhausted);
    let r = records.lock().unwrap().pop().unwrap();
    assert_eq!(r.outcome, CallOutcome::Failed);
    assert_eq!(r.class, Some(FailureClass::QuotaExhausted));
    assert_eq!(r.status, Some(429));
    assert_eq!(r.error_code.as_deref(), Some("insufficient_quota"));
    assert_eq!(r.request_id.as_deref(), Some("req_9"));
    assert_eq!(r.attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_local_rejection_made_no_attempt() {
    let records = Records::default();
    let inner = service_fn(|_req: http::Request<Bytes>| async {
        Err::<http::Response<Full<Bytes>>, _>(LlmError::new(FailureClass::GateRejected, "busy"))
    });
    let mut svc = layer(&records).layer(inner);
    let _ = svc.ready().await.unwrap().call(request(false)).await;
    assert_eq!(records.lock().unwrap()[0].attempts, 0);
}

#[test]
fn summary_and_metrics_recorders() {
    let summary = Arc::new(Summary::new());
    let metrics = Arc::new(MetricsRecorder::new());
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let inner = service_fn(|req: http::Request<Bytes>| async move {
        let cx = context(&req);
        let n = cx.update(|f| {
            f.attempts = 2;
            f.attempts
        });
        tokio::time::sleep(Duration::from_millis(10 * u64::from(n))).await;
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new())))
    });
    let mut svc = ObserveLayer::builder()
        .recorder((summary.clone(), metrics.clone()))
        .build()
        .unwrap()
        .layer(inner);
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            for _ in 0..10 {
                let resp = send(&mut svc, false).await;
                drop(resp);
            }
        });
    });
    let report = summary.report();
    assert_eq!(report.calls, 10);
    assert_eq!(report.successes, 10);
    assert!((report.retry_rate - 1.0).abs() < 1e-9);
    assert_eq!(report.latency[1], Duration::from_millis(20));
    assert!(report.to_string().contains("retries/call 1.000"));
    assert!(metrics.retry_rate() > 0.0);
    let snap = snapshotter.snapshot().into_vec();
    let counter = |name: &str| {
        snap.iter()
            .filter(|(k, ..)| k.key().name() == name)
            .map(|(.., v)| match v {
                metrics_util::debugging::DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum::<u64>()
    };
    assert_eq!(counter("seawall.calls"), 10);
    assert_eq!(counter("seawall.retries"), 10);
    assert_eq!(counter("seawall.attempts"), 20);
}

/// Sends one request (streamed or not) once the service is ready; panics on an error.
async fn send<S>(svc: &mut S, stream: bool) -> S::Response
where
    S: Service<http::Request<Bytes>>,
    S::Error: std::fmt::Debug,
{
    svc.ready()
        .await
        .unwrap()
        .call(request(stream))
        .await
        .unwrap()
}

/// Makes `n` calls one after the other, each read to the end of its body.
async fn call_to_the_end<S, B>(mut svc: S, n: usize)
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    for _ in 0..n {
        let resp = send(&mut svc, false).await;
        resp.into_body().collect().await.unwrap();
    }
}

/// The layer reuses a finished call's context for the next call on the thread: the next call
/// must start from empty facts, and a context still held elsewhere must not be handed out.
#[tokio::test(start_paused = true)]
async fn a_reused_context_starts_empty_and_a_held_one_is_left_alone() {
    let records = Records::default();
    let kept: Arc<Mutex<Vec<Arc<CallContext>>>> = Arc::default();
    let seen = kept.clone();
    let inner = service_fn(move |req: http::Request<Bytes>| {
        let cx = context(&req);
        let seen = seen.clone();
        async move {
            let first = {
                let mut seen = seen.lock().unwrap();
                seen.push(cx.clone());
                seen.len() == 1
            };
            // Only the first call writes facts; the later ones must not inherit them.
            assert_eq!(cx.snapshot().attempts, 0, "a new call's context is empty");
            if first {
                cx.update(|f| {
                    f.attempts = 2;
                    f.cost_usd = Some(0.5);
                    f.rejections.push(FailureClass::GateRejected);
                });
            }
            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"{}"))))
        }
    });
    call_to_the_end(layer(&records).layer(inner), 3).await;
    let records = records.lock().unwrap();
    assert_eq!(records.len(), 3);
    assert_eq!((records[0].attempts, records[0].cost_usd), (2, Some(0.5)));
    for r in &records[1..] {
        assert_eq!((r.attempts, r.cost_usd), (1, None));
    }
    // The test kept every context, so none could be reused: three distinct ones, the first
    // still with its facts.
    let kept = kept.lock().unwrap();
    assert!(!Arc::ptr_eq(&kept[0], &kept[1]) && !Arc::ptr_eq(&kept[1], &kept[2]));
    assert_eq!(kept[0].snapshot().attempts, 2);
}

/// Without anything else holding it, the next call gets the previous call's context back,
/// emptied.
#[tokio::test(start_paused = true)]
async fn a_released_context_is_reused_empty() {
    let records = Records::default();
    let addrs: Arc<Mutex<Vec<usize>>> = Arc::default();
    let seen = addrs.clone();
    let inner = service_fn(move |req: http::Request<Bytes>| {
        let cx = context(&req);
        let seen = seen.clone();
        async move {
            assert_eq!(cx.snapshot(), seawall_core::CallFacts::default());
            seen.lock().unwrap().push(Arc::as_ptr(&cx) as usize);
            cx.update(|f| f.cost_usd = Some(1.0));
            drop(cx);
            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"{}"))))
        }
    });
    call_to_the_end(layer(&records).layer(inner), 2).await;
    let addrs = addrs.lock().unwrap();
    assert_eq!(addrs[0], addrs[1], "the first call's context was reused");
    let records = records.lock().unwrap();
    assert!(records.iter().all(|r| r.cost_usd == Some(1.0)));
}

/// A user's own, fully-read response type: it names its model, and has no body report.
struct Answer {
    model: &'static str,
}

impl LlmResponse for Answer {
    type Hooked<G: OnComplete> = Answer;
    fn usage(&self) -> Option<Usage> {
        None
    }
    fn served_model(&self) -> Option<&str> {
        Some(self.model)
    }
    fn on_complete<G: OnComplete>(self, hook: G) -> Answer {
        seawall_test_support::complete_now(hook);
        self
    }
}

#[tokio::test]
async fn a_response_without_a_body_report_still_names_the_model_that_served() {
    let records = Records::default();
    let inner = service_fn(|_req: http::Request<Bytes>| async {
        Ok::<_, Infallible>(Answer {
            model: "gpt-4o-mini-2024-07-18",
        })
    });
    let mut svc = layer(&records).layer(inner);
    let answer = send(&mut svc, false).await;
    assert_eq!(answer.model, "gpt-4o-mini-2024-07-18");
    let r = records.lock().unwrap().pop().unwrap();
    assert_eq!(r.outcome, CallOutcome::Success);
    assert_eq!(r.served_model.as_deref(), Some("gpt-4o-mini-2024-07-18"));
    assert_eq!(r.model.as_deref(), Some("gpt-4o-mini"));
}
