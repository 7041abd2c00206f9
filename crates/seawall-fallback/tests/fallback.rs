//! Behaviour of `FallbackLayer`, on paused tokio time with scripted upstreams.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use seawall_core::{
    BodyReport, CallContext, Dispositions, FailureClass, Fallback, LlmError, LlmRequest, ServedBy,
};
use seawall_fallback::{
    FallbackError, FallbackLayer, LastResort, ResponseCache, Target, box_response,
};
use tokio::time::{Instant, advance, sleep};
use tower::{Layer, Service, ServiceExt};

type Req = Request<Bytes>;
type Body = UnsyncBoxBody<Bytes, LlmError>;
type Resp = Response<Body>;
type BoxFut = Pin<Box<dyn Future<Output = Result<Resp, LlmError>> + Send>>;

fn request(model: &str) -> Req {
    request_with(model, "hello", false)
}

fn request_with(model: &str, prompt: &str, stream: bool) -> Req {
    let body = format!(
        r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"{prompt}"}}]}}"#
    );
    let mut req = Request::post("https://api.example.com/v1/chat/completions")
        .header("authorization", "Bearer sk-main-000000000000")
        .body(Bytes::from(body))
        .unwrap();
    req.extensions_mut().insert(Arc::new(CallContext::new()));
    req
}

fn text(s: impl Into<Bytes>) -> Resp {
    Response::new(Full::new(s.into()).map_err(|e| match e {}).boxed_unsync())
}

async fn body_of(resp: Resp) -> String {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn served(resp: &Resp) -> ServedBy {
    resp.extensions()
        .get::<ServedBy>()
        .cloned()
        .expect("ServedBy")
}

fn context(req: &Req) -> Arc<CallContext> {
    req.call_context().unwrap().clone()
}

/// What a scripted upstream does with one call.
enum Reply {
    Ok(Resp),
    Err(LlmError),
    After(Duration, Box<Reply>),
    Never,
}

fn fail(class: FailureClass) -> Reply {
    Reply::Err(LlmError::new(class, format!("scripted {class}")))
}

fn ok(s: &str) -> Reply {
    Reply::Ok(text(s.to_owned()))
}

type Script = Arc<dyn Fn(usize, &Req) -> Reply + Send + Sync>;

/// A scripted upstream: logs `name:model:key` for every call, counts the calls, and counts
/// the futures still alive (to see cancellation).
#[derive(Clone)]
struct Mock {
    name: &'static str,
    log: Arc<Mutex<Vec<String>>>,
    calls: Arc<AtomicUsize>,
    live: Arc<AtomicUsize>,
    script: Script,
}

struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Mock {
    fn new(
        name: &'static str,
        log: &Arc<Mutex<Vec<String>>>,
        script: impl Fn(usize, &Req) -> Reply + Send + Sync + 'static,
    ) -> Self {
        Mock {
            name,
            log: log.clone(),
            calls: Arc::default(),
            live: Arc::default(),
            script: Arc::new(script),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}

impl Service<Req> for Mock {
    type Response = Resp;
    type Error = LlmError;
    type Future = BoxFut;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> BoxFut {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let key = req
            .headers()
            .get("authorization")
            .map_or("-".to_owned(), |v| v.to_str().unwrap()[7..14].to_owned());
        self.log.lock().unwrap().push(format!(
            "{}:{}:{key}",
            self.name,
            req.model().unwrap_or("?")
        ));
        let mut reply = (self.script)(n, &req);
        self.live.fetch_add(1, Ordering::SeqCst);
        let live = Live(self.live.clone());
        Box::pin(async move {
            let _live = live;
            loop {
                match reply {
                    Reply::Ok(r) => return Ok(r),
                    Reply::Err(e) => return Err(e),
                    Reply::After(d, next) => {
                        sleep(d).await;
                        reply = *next;
                    }
                    Reply::Never => std::future::pending::<()>().await,
                }
            }
        })
    }
}

fn log() -> Arc<Mutex<Vec<String>>> {
    Arc::default()
}

fn taken(log: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
}

#[tokio::test]
async fn every_class_falls_back_exactly_as_its_disposition_says() {
    for class in FailureClass::ALL {
        let log = log();
        let primary = Mock::new("primary", &log, move |_, _| fail(class));
        let backup = Mock::new("backup", &log, |_, _| ok("from backup"));
        let svc = FallbackLayer::new([Target::service("backup", backup.clone())]).layer(primary);
        let result = svc.oneshot(request("gpt-4o")).await;
        if Dispositions::default().get(class).fallback == Fallback::Yes {
            let resp = result.unwrap_or_else(|e| panic!("{class}: {e}"));
            assert_eq!(&*served(&resp).target, "backup", "{class}");
            assert_eq!(body_of(resp).await, "from backup");
        } else {
            // Invalid requests, local budget rejections, 408/409, context and content
            // failures without their own list: the primary's error, unchanged.
            let err = result.err().unwrap_or_else(|| panic!("{class} fell back"));
            assert_eq!(err.class(), class);
            assert_eq!(err.message(), format!("scripted {class}"));
            assert!(FallbackError::of(&err).is_none());
            assert_eq!(backup.calls(), 0, "{class}");
        }
    }
}

#[tokio::test]
async fn regular_triggers_match_the_design_table() {
    use FailureClass::*;
    let yes: Vec<_> = FailureClass::ALL
        .into_iter()
        .filter(|c| Dispositions::default().get(*c).fallback == Fallback::Yes)
        .collect();
    assert_eq!(
        yes,
        [
            RateLimited,
            QuotaExhausted,
            Overloaded,
            ServerError,
            UpstreamTimeout,
            Timeout,
            Connect,
            Disconnected,
            EmptyResponse,
            Authentication,
            PermissionDenied,
            NotFound,
            CircuitOpen,
            GateRejected
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn local_rejections_fall_back_at_once() {
    for class in [FailureClass::CircuitOpen, FailureClass::GateRejected] {
        let log = log();
        let primary = Mock::new("primary", &log, move |_, _| fail(class));
        let backup = Mock::new("backup", &log, |_, _| ok("b"));
        let svc = FallbackLayer::new([Target::service("backup", backup)]).layer(primary);
        let start = Instant::now();
        let resp = svc.oneshot(request("gpt-4o")).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO, "{class}");
        assert_eq!(&*served(&resp).target, "backup");
    }
}

#[tokio::test]
async fn invalid_request_never_falls_back_nor_degrades() {
    let log = log();
    let primary = Mock::new("primary", &log, |_, _| fail(FailureClass::InvalidRequest));
    let layer = FallbackLayer::builder()
        .target(Target::model("other-model"))
        .degraded(|_, _| text("degraded"))
        .build()
        .unwrap();
    let err = layer
        .layer(primary.clone())
        .oneshot(request("gpt-4o"))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::InvalidRequest);
    assert_eq!(primary.calls(), 1);
    assert_eq!(taken(&log), ["primary:gpt-4o:sk-main"]);
}

#[tokio::test]
async fn context_length_goes_to_the_larger_context_list_only() {
    let log = log();
    let primary = Mock::new("upstream", &log, |_, req| match req.model() {
        Some("small") => fail(FailureClass::ContextLengthExceeded),
        _ => ok("long answer"),
    });
    let regular = Mock::new("regular", &log, |_, _| ok("regular"));
    let layer = FallbackLayer::builder()
        .target(Target::service("regular", regular.clone()))
        .larger_context(Target::model("big-context"))
        .build()
        .unwrap();
    let resp = layer
        .layer(primary.clone())
        .oneshot(request("small"))
        .await
        .unwrap();
    assert_eq!(
        served(&resp),
        ServedBy {
            target: "big-context".into(),
            model: Some("big-context".into()),
            degraded: false
        }
    );
    assert_eq!(body_of(resp).await, "long answer");
    assert_eq!(
        taken(&log),
        ["upstream:small:sk-main", "upstream:big-context:sk-main"]
    );
    assert_eq!(regular.calls(), 0);

    // Without a larger-context list the error comes back unchanged.
    let layer = FallbackLayer::new([Target::service("regular", regular.clone())]);
    let err = layer
        .layer(primary)
        .oneshot(request("small"))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::ContextLengthExceeded);
    assert_eq!(regular.calls(), 0);
}

#[tokio::test]
async fn the_last_resort_is_for_availability_failures_only() {
    let log = log();
    let primary = Mock::new("primary", &log, |_, _| {
        fail(FailureClass::ContextLengthExceeded)
    });
    let layer = FallbackLayer::builder()
        .target(Target::model("regular"))
        .degraded(|_, _| text("degraded"))
        .build()
        .unwrap();
    // A prompt too long for every model is an answer the caller must see, not a degraded one.
    let err = layer
        .layer(primary)
        .oneshot(request("small"))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::ContextLengthExceeded);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_passing_on_the_primary_leads_to_the_last_resort() {
    let log = log();
    let primary = Mock::new("primary", &log, |_, _| Reply::Never);
    let layer = FallbackLayer::builder()
        .deadline(Duration::from_secs(5))
        .degraded(|_, err: &LlmError| text(err.class().as_str()))
        .build()
        .unwrap();
    let start = Instant::now();
    let resp = layer
        .layer(primary.clone())
        .oneshot(request("m"))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert!(served(&resp).degraded);
    assert_eq!(body_of(resp).await, "deadline_exceeded");
    assert_eq!(primary.live(), 0);
}

#[tokio::test]
async fn content_policy_list_is_optional() {
    let log = log();
    let primary = Mock::new("primary", &log, |_, _| fail(FailureClass::ContentFiltered));
    let lenient = Mock::new("lenient", &log, |_, _| ok("answered"));
    let regular = Mock::new("regular", &log, |_, _| ok("regular"));

    let without = FallbackLayer::new([Target::service("regular", regular.clone())]);
    let err = without
        .layer(primary.clone())
        .oneshot(request("m"))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::ContentFiltered);

    let with = FallbackLayer::builder()
        .target(Target::service("regular", regular.clone()))
        .content_policy(Target::service("lenient", lenient.clone()).with_model("open-model"))
        .build()
        .unwrap();
    let resp = with.layer(primary).oneshot(request("m")).await.unwrap();
    assert_eq!(&*served(&resp).target, "lenient");
    assert_eq!(served(&resp).model.as_deref(), Some("open-model"));
    assert_eq!(regular.calls(), 0);
    assert_eq!(lenient.calls(), 1);
}

#[tokio::test]
async fn one_chain_mixes_model_key_and_service_targets() {
    let log = log();
    let primary = Mock::new("openai", &log, |n, _| match n {
        0 => fail(FailureClass::Overloaded),
        1 => fail(FailureClass::QuotaExhausted),
        _ => fail(FailureClass::RateLimited),
    });
    let anthropic = Mock::new("anthropic", &log, |_, _| ok("claude says hi"));
    let layer = FallbackLayer::builder()
        .target(Target::model("gpt-4o-mini"))
        .target(Target::rewrite("backup-key", |req: &mut Req| {
            let v = HeaderValue::from_static("Bearer sk-backup-11111111111");
            req.headers_mut().insert(http::header::AUTHORIZATION, v);
            Ok(())
        }))
        .target(Target::service("anthropic", anthropic.clone()).with_model("claude-haiku-4-5"))
        .build()
        .unwrap();
    let req = request("gpt-4o");
    let cx = context(&req);
    let resp = layer.layer(primary).oneshot(req).await.unwrap();
    assert_eq!(
        taken(&log),
        [
            "openai:gpt-4o:sk-main",
            "openai:gpt-4o-mini:sk-main",
            "openai:gpt-4o:sk-back",
            "anthropic:claude-haiku-4-5:sk-main",
        ]
    );
    assert_eq!(
        served(&resp),
        ServedBy {
            target: "anthropic".into(),
            model: Some("claude-haiku-4-5".into()),
            degraded: false
        }
    );
    let facts = cx.snapshot();
    assert_eq!(facts.fallbacks, 3);
    assert_eq!(facts.served_by, Some(served(&resp)));
    assert!(!format!("{layer:?}").contains("sk-backup"));
}

#[tokio::test]
async fn max_fallbacks_bounds_the_chain_and_the_error_lists_every_target() {
    let log = log();
    let primary = Mock::new("primary", &log, |_, _| fail(FailureClass::Overloaded));
    let first = Mock::new("first", &log, |_, _| fail(FailureClass::ServerError));
    let second = Mock::new("second", &log, |_, _| {
        Reply::Err(
            LlmError::new(
                FailureClass::Authentication,
                "Incorrect API key provided: sk-proj-secret123456",
            )
            .with_status(http::StatusCode::UNAUTHORIZED)
            .with_code("invalid_api_key"),
        )
    });
    let third = Mock::new("third", &log, |_, _| ok("never"));
    let layer = FallbackLayer::builder()
        .targets([
            Target::service("first", first),
            Target::service("second", second).with_model("m2"),
            Target::service("third", third.clone()),
        ])
        .max_fallbacks(2)
        .build()
        .unwrap();
    let err = layer
        .layer(primary)
        .oneshot(request("gpt-4o"))
        .await
        .unwrap_err();
    assert_eq!(third.calls(), 0);
    // The last target's class, status and code; a short message for the user.
    assert_eq!(err.class(), FailureClass::Authentication);
    assert_eq!(err.status(), Some(http::StatusCode::UNAUTHORIZED));
    assert_eq!(err.code(), Some("invalid_api_key"));
    assert_eq!(
        err.message(),
        "The AI service is temporarily unavailable. Please try again later."
    );
    let detail = FallbackError::of(&err).unwrap();
    assert_eq!(detail.user_message(), err.message());
    let tried: Vec<_> = detail
        .tried()
        .iter()
        .map(|t| {
            (
                t.target().to_owned(),
                t.model().map(str::to_owned),
                t.class(),
            )
        })
        .collect();
    assert_eq!(
        tried,
        [
            (
                "primary".into(),
                Some("gpt-4o".into()),
                FailureClass::Overloaded
            ),
            (
                "first".into(),
                Some("gpt-4o".into()),
                FailureClass::ServerError
            ),
            (
                "second".into(),
                Some("m2".into()),
                FailureClass::Authentication
            ),
        ]
    );
    let shown = format!("{err} | {err:?} | {detail} | {detail:?}");
    assert!(
        shown.contains("second [m2] -> authentication (HTTP 401"),
        "{shown}"
    );
    assert!(!shown.contains("secret123456"), "{shown}");
    assert!(!shown.contains("sk-main-0000"), "{shown}");
}

#[tokio::test]
async fn a_target_failure_at_fault_stops_the_chain() {
    let log = log();
    let primary = Mock::new("primary", &log, |_, _| fail(FailureClass::Overloaded));
    let picky = Mock::new("picky", &log, |_, _| fail(FailureClass::InvalidRequest));
    let last = Mock::new("last", &log, |_, _| ok("never"));
    let layer = FallbackLayer::new([
        Target::service("picky", picky),
        Target::service("last", last.clone()),
    ]);
    let err = layer
        .layer(primary)
        .oneshot(request("m"))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::InvalidRequest);
    assert_eq!(FallbackError::of(&err).unwrap().tried().len(), 2);
    assert_eq!(last.calls(), 0);
}

#[tokio::test]
async fn a_target_that_cannot_be_built_is_skipped_and_listed() {
    let log = log();
    let primary = Mock::new("primary", &log, |_, _| fail(FailureClass::Overloaded));
    let backup = Mock::new("backup", &log, |_, _| ok("b"));
    // A body that is not JSON: the model cannot be switched.
    let mut req = Request::post("http://h/v1/chat/completions")
        .body(Bytes::from_static(b"not json"))
        .unwrap();
    req.extensions_mut().insert(Arc::new(CallContext::new()));
    let layer = FallbackLayer::new([
        Target::model("other"),
        Target::service("backup", backup.clone()),
    ]);
    let resp = layer
        .layer(primary.clone())
        .oneshot(req.clone())
        .await
        .unwrap();
    assert_eq!(&*served(&resp).target, "backup");

    let only = FallbackLayer::new([Target::model("other")]);
    let err = only.layer(primary).oneshot(req).await.unwrap_err();
    let detail = FallbackError::of(&err).unwrap();
    assert_eq!(detail.tried()[1].class(), FailureClass::InvalidRequest);
    assert!(detail.tried()[1].error().message().contains("not JSON"));
}

/// A target whose readiness fails.
#[derive(Clone)]
struct Unready;

impl Service<Req> for Unready {
    type Response = Resp;
    type Error = LlmError;
    type Future = BoxFut;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Err(LlmError::new(FailureClass::Connect, "refused")))
    }

    fn call(&mut self, _: Req) -> BoxFut {
        unreachable!("called without readiness")
    }
}

#[tokio::test]
async fn a_target_that_fails_readiness_moves_the_chain_on() {
    let log = log();
    let primary = Mock::new("primary", &log, |_, _| fail(FailureClass::ServerError));
    let backup = Mock::new("backup", &log, |_, _| ok("b"));
    let layer = FallbackLayer::new([
        Target::service("unready", Unready),
        Target::service("backup", backup),
    ]);
    let resp = layer.layer(primary).oneshot(request("m")).await.unwrap();
    assert_eq!(&*served(&resp).target, "backup");
}

#[tokio::test(start_paused = true)]
async fn the_deadline_cancels_a_running_target_and_starts_no_other() {
    let log = log();
    let primary = Mock::new("primary", &log, |_, _| {
        Reply::After(
            Duration::from_secs(4),
            Box::new(fail(FailureClass::Overloaded)),
        )
    });
    let slow = Mock::new("slow", &log, |_, _| {
        Reply::After(Duration::from_secs(8), Box::new(ok("too late")))
    });
    let never = Mock::new("never", &log, |_, _| ok("never"));
    let layer = FallbackLayer::builder()
        .target(Target::service("slow", slow.clone()))
        .target(Target::service("never", never.clone()))
        .deadline(Duration::from_secs(10))
        .build()
        .unwrap();
    let start = Instant::now();
    let err = layer
        .layer(primary)
        .oneshot(request("m"))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    assert_eq!(err.class(), FailureClass::DeadlineExceeded);
    let detail = FallbackError::of(&err).unwrap();
    assert!(detail.deadline_passed());
    let classes: Vec<_> = detail.tried().iter().map(|t| t.class()).collect();
    assert_eq!(
        classes,
        [FailureClass::Overloaded, FailureClass::DeadlineExceeded]
    );
    assert_eq!(slow.live(), 0, "the running target was cancelled");
    assert_eq!(never.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn no_target_starts_once_the_deadline_has_passed() {
    let log = log();
    // The primary's error arrives exactly at the deadline.
    let primary = Mock::new("primary", &log, |_, _| {
        Reply::After(
            Duration::from_secs(10),
            Box::new(fail(FailureClass::Overloaded)),
        )
    });
    let backup = Mock::new("backup", &log, |_, _| ok("b"));
    let layer = FallbackLayer::builder()
        .target(Target::service("backup", backup.clone()))
        .deadline(Duration::from_secs(10))
        .build()
        .unwrap();
    let err = layer
        .layer(primary)
        .oneshot(request("m"))
        .await
        .unwrap_err();
    assert_eq!(backup.calls(), 0);
    assert_eq!(err.class(), FailureClass::DeadlineExceeded);
    assert_eq!(
        FallbackError::of(&err).unwrap().tried()[0].class(),
        FailureClass::Overloaded
    );
}

#[tokio::test(start_paused = true)]
async fn cached_answer_is_served_until_its_ttl() {
    let log = log();
    let primary = Mock::new("primary", &log, |n, req| match n {
        0 => Reply::Ok(text(format!("answer to {}", req.model().unwrap()))),
        _ => fail(FailureClass::Overloaded),
    });
    let layer = FallbackLayer::builder()
        .cache(ResponseCache::new(Duration::from_secs(60)))
        .build()
        .unwrap();
    let svc = layer.layer(primary);

    let resp = svc.clone().oneshot(request("m")).await.unwrap();
    assert!(!served(&resp).degraded);
    assert_eq!(body_of(resp).await, "answer to m");
    assert_eq!(layer.cache_usage().0, 1);

    advance(Duration::from_secs(30)).await;
    let req = request("m");
    let cx = context(&req);
    let resp = svc.clone().oneshot(req).await.unwrap();
    let by = served(&resp);
    assert!(by.degraded);
    assert_eq!(&*by.target, "cache");
    assert_eq!(by.model.as_deref(), Some("m"));
    assert_eq!(
        resp.extensions().get::<LastResort>(),
        Some(&LastResort::Cached {
            age: Duration::from_secs(30),
            served_by: ServedBy {
                target: "primary".into(),
                model: Some("m".into()),
                degraded: false
            }
        })
    );
    assert_eq!(cx.snapshot().served_by, Some(by));
    assert_eq!(body_of(resp).await, "answer to m");

    // A different request has no cached answer.
    let err = svc
        .clone()
        .oneshot(request_with("m", "other prompt", false))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Overloaded);

    // Past the TTL, the entry is gone.
    advance(Duration::from_secs(30)).await;
    let err = svc.oneshot(request("m")).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Overloaded);
    assert_eq!(layer.cache_usage().0, 0);
}

#[tokio::test]
async fn cache_is_bounded_in_entries_and_bytes_and_skips_streams() {
    let log = log();
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = failing.clone();
    let primary = Mock::new("primary", &log, move |_, req| {
        if flag.load(Ordering::SeqCst) {
            return fail(FailureClass::ServerError);
        }
        let body = String::from_utf8(req.body().to_vec()).unwrap();
        if body.contains("huge") {
            ok(&"x".repeat(5000))
        } else {
            ok("small answer")
        }
    });
    let layer = FallbackLayer::builder()
        .cache(
            ResponseCache::new(Duration::from_secs(600))
                .with_max_entries(2)
                .with_max_entry_bytes(1000),
        )
        .build()
        .unwrap();
    let svc = layer.layer(primary);
    for prompt in ["a", "b", "c"] {
        let resp = svc
            .clone()
            .oneshot(request_with("m", prompt, false))
            .await
            .unwrap();
        assert_eq!(body_of(resp).await, "small answer");
    }
    assert_eq!(layer.cache_usage().0, 2);
    // Too large to keep, and still whole for the caller.
    let resp = svc
        .clone()
        .oneshot(request_with("m", "huge", false))
        .await
        .unwrap();
    assert_eq!(body_of(resp).await.len(), 5000);
    // A streaming request is never buffered nor kept.
    let resp = svc
        .clone()
        .oneshot(request_with("m", "d", true))
        .await
        .unwrap();
    assert_eq!(body_of(resp).await, "small answer");
    assert_eq!(layer.cache_usage().0, 2);
    let (_, bytes) = layer.cache_usage();
    assert!(bytes < 1000, "{bytes}");

    failing.store(true, Ordering::SeqCst);
    let evicted = svc.clone().oneshot(request_with("m", "a", false)).await;
    assert_eq!(evicted.unwrap_err().class(), FailureClass::ServerError);
    for prompt in ["b", "c"] {
        let resp = svc
            .clone()
            .oneshot(request_with("m", prompt, false))
            .await
            .unwrap();
        assert!(served(&resp).degraded);
    }
    for prompt in ["huge", "d"] {
        let r = svc.clone().oneshot(request_with("m", prompt, true)).await;
        assert!(r.is_err(), "{prompt}");
    }
}

#[tokio::test]
async fn degraded_response_is_the_last_resort_and_marked() {
    let log = log();
    let primary = Mock::new("primary", &log, |_, _| fail(FailureClass::Overloaded));
    let backup = Mock::new("backup", &log, |_, _| fail(FailureClass::QuotaExhausted));
    let layer = FallbackLayer::builder()
        .target(Target::service("backup", backup))
        .degraded(|_req: &Req, err: &LlmError| {
            let tried = FallbackError::of(err).map_or(0, |d| d.tried().len());
            text(format!("{} ({tried} tried)", err.message()))
        })
        .build()
        .unwrap();
    let req = request("m");
    let cx = context(&req);
    let resp = layer.layer(primary).oneshot(req).await.unwrap();
    let by = served(&resp);
    assert_eq!(
        by,
        ServedBy {
            target: "degraded".into(),
            model: None,
            degraded: true
        }
    );
    assert_eq!(
        resp.extensions().get::<LastResort>(),
        Some(&LastResort::Static)
    );
    let facts = cx.snapshot();
    assert_eq!(facts.served_by, Some(by));
    assert_eq!(facts.fallbacks, 1);
    assert_eq!(
        body_of(resp).await,
        "The AI service is temporarily unavailable. Please try again later. (2 tried)"
    );
}

#[tokio::test]
async fn the_cache_comes_before_the_degraded_response() {
    let log = log();
    let primary = Mock::new("primary", &log, |n, _| match n {
        0 => ok("real"),
        _ => fail(FailureClass::Overloaded),
    });
    let layer = FallbackLayer::builder()
        .cache(ResponseCache::new(Duration::from_secs(60)))
        .degraded(|_, _| text("static"))
        .build()
        .unwrap();
    let svc = layer.layer(primary);
    assert_eq!(
        body_of(svc.clone().oneshot(request("m")).await.unwrap()).await,
        "real"
    );
    let resp = svc.clone().oneshot(request("m")).await.unwrap();
    assert!(matches!(
        resp.extensions().get::<LastResort>(),
        Some(LastResort::Cached { .. })
    ));
    assert_eq!(body_of(resp).await, "real");
    let resp = svc.oneshot(request_with("m", "new", false)).await.unwrap();
    assert_eq!(body_of(resp).await, "static");
}

fn stream_body(items: Vec<Result<&'static str, LlmError>>) -> Body {
    let frames: Vec<Result<Frame<Bytes>, LlmError>> = items
        .into_iter()
        .map(|r| r.map(|s| Frame::data(Bytes::from_static(s.as_bytes()))))
        .collect();
    StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync()
}

#[tokio::test(start_paused = true)]
async fn a_stream_failing_before_its_first_byte_falls_back() {
    let log = log();
    // What the stream layer reports when no token came within the TTFT limit.
    let primary = Mock::new("primary", &log, |_, _| {
        Reply::After(
            Duration::from_secs(5),
            Box::new(fail(FailureClass::Timeout)),
        )
    });
    let backup = Mock::new("backup", &log, |_, _| {
        Reply::Ok(Response::new(stream_body(vec![
            Ok("data: {\"delta\":\"hi\"}\n\n"),
            Ok("data: [DONE]\n\n"),
        ])))
    });
    let layer = FallbackLayer::new([Target::service("backup", backup)]);
    let resp = layer
        .layer(primary)
        .oneshot(request_with("m", "p", true))
        .await
        .unwrap();
    assert_eq!(&*served(&resp).target, "backup");
    assert!(body_of(resp).await.ends_with("[DONE]\n\n"));
}

#[tokio::test]
async fn a_stream_failing_after_its_first_byte_passes_through() {
    let log = log();
    let primary = Mock::new("primary", &log, |_, _| {
        Reply::Ok(Response::new(stream_body(vec![
            Ok("data: {\"delta\":\"hel\"}\n\n"),
            Err(LlmError::new(
                FailureClass::StreamInterrupted,
                "connection reset",
            )),
        ])))
    });
    let backup = Mock::new("backup", &log, |_, _| ok("never"));
    let layer = FallbackLayer::builder()
        .target(Target::service("backup", backup.clone()))
        .cache(ResponseCache::new(Duration::from_secs(60)))
        .build()
        .unwrap();
    let resp = layer
        .layer(primary)
        .oneshot(request_with("m", "p", true))
        .await
        .unwrap();
    assert_eq!(&*served(&resp).target, "primary");
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "data: {\"delta\":\"hel\"}\n\n");
    let err = body.frame().await.unwrap().unwrap_err();
    assert_eq!(err.class(), FailureClass::StreamInterrupted);
    assert_eq!(backup.calls(), 0);
    assert_eq!(layer.cache_usage().0, 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_call_midway_cancels_the_running_target_and_calls_no_other() {
    let log = log();
    let primary = Mock::new("primary", &log, |_, _| fail(FailureClass::Overloaded));
    let hanging = Mock::new("hanging", &log, |_, _| Reply::Never);
    let third = Mock::new("third", &log, |_, _| ok("never"));
    let layer = FallbackLayer::new([
        Target::service("hanging", hanging.clone()),
        Target::service("third", third.clone()),
    ]);
    let req = request("m");
    let cx = context(&req);
    let fut = layer.layer(primary.clone()).oneshot(req);
    let raced = tokio::time::timeout(Duration::from_secs(1), fut).await;
    assert!(raced.is_err(), "the chain should still be running");
    assert_eq!(hanging.calls(), 1);
    assert_eq!(hanging.live(), 0, "the running target's future was dropped");
    assert_eq!(primary.live(), 0);
    advance(Duration::from_secs(3600)).await;
    tokio::task::yield_now().await;
    assert_eq!(third.calls(), 0);
    assert_eq!(cx.snapshot().fallbacks, 1);
    assert_eq!(cx.snapshot().served_by, None);
    assert_eq!(Arc::strong_count(&cx), 1, "nothing holds the request");
}

/// With a target to fall back to (the request is kept, its context with it) and with none
/// (nothing kept): the context says who served either way.
#[tokio::test]
async fn served_by_names_the_primary_and_prefers_the_model_that_answered() {
    for targets in [vec![Target::model("gpt-4o-mini")], Vec::new()] {
        let log = log();
        let primary = Mock::new("primary", &log, |_, _| {
            let report = Arc::new(BodyReport::new());
            report.set_model("gpt-4o-2024-08-06");
            let mut resp = text("hi");
            resp.extensions_mut().insert(report);
            Reply::Ok(resp)
        });
        let layer = FallbackLayer::new(targets);
        let req = request("gpt-4o");
        let cx = context(&req);
        let resp = layer.layer(primary).oneshot(req).await.unwrap();
        let expect = ServedBy {
            target: "primary".into(),
            model: Some("gpt-4o-2024-08-06".into()),
            degraded: false,
        };
        assert_eq!(served(&resp), expect);
        let facts = cx.snapshot();
        assert_eq!(facts.served_by, Some(expect));
        assert_eq!(facts.fallbacks, 0);
    }
}

#[tokio::test]
async fn traffic_returns_to_the_primary_once_it_recovers() {
    let log = log();
    let primary = Mock::new("primary", &log, |n, _| {
        if n < 2 {
            fail(FailureClass::Overloaded)
        } else {
            ok("primary")
        }
    });
    let backup = Mock::new("backup", &log, |_, _| ok("backup"));
    let svc = FallbackLayer::new([Target::service("backup", backup.clone())]).layer(primary);
    let mut by = Vec::new();
    for _ in 0..5 {
        let resp = svc.clone().oneshot(request("m")).await.unwrap();
        by.push(served(&resp).target.to_string());
    }
    assert_eq!(by, ["backup", "backup", "primary", "primary", "primary"]);
    assert_eq!(backup.calls(), 2);
}

#[tokio::test]
async fn stacks_with_different_body_types_mix_through_box_response() {
    let primary = tower::service_fn(|_: Req| async {
        Err::<Response<Full<Bytes>>, _>(LlmError::new(FailureClass::ServerError, "down"))
    })
    .map_response(box_response);
    let other = tower::service_fn(|_: Req| async {
        let body = StreamBody::new(futures_util::stream::iter(vec![Ok::<_, std::io::Error>(
            Frame::data(Bytes::from_static(b"streamed")),
        )]));
        Ok::<_, LlmError>(Response::new(body))
    })
    .map_response(box_response);
    let layer = FallbackLayer::new([Target::service("other", other)]);
    let resp = layer.layer(primary).oneshot(request("m")).await.unwrap();
    assert_eq!(body_of(resp).await, "streamed");
}

#[test]
fn layer_service_and_future_are_send_and_the_layer_is_sync() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let log = log();
    let layer: FallbackLayer<Req, Resp> = FallbackLayer::builder()
        .target(Target::model("m"))
        .cache(ResponseCache::new(Duration::from_secs(1)))
        .build()
        .unwrap();
    send_sync(&layer);
    let mut svc = layer.layer(Mock::new("p", &log, |_, _| ok("x")));
    send_sync(&svc);
    let fut = svc.call(request("m"));
    send(&fut);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_keep_the_cache_bounded_and_never_mix_answers() {
    let log = Arc::new(Mutex::new(Vec::new()));
    // Every third primary call and every fifth backup call fail; answers echo the prompt.
    let echo = |req: &Req| {
        let body = String::from_utf8(req.body().to_vec()).unwrap();
        let start = body.find("\"content\":\"").unwrap() + 11;
        let end = body[start..].find('"').unwrap() + start;
        ok(&format!("echo {}", &body[start..end]))
    };
    let primary = Mock::new("primary", &log, move |n, req| {
        if n % 3 == 0 {
            fail(FailureClass::Overloaded)
        } else {
            echo(req)
        }
    });
    let backup = Mock::new("backup", &log, move |n, req| {
        if n % 5 == 0 {
            fail(FailureClass::Overloaded)
        } else {
            echo(req)
        }
    });
    let layer = FallbackLayer::builder()
        .target(Target::service("backup", backup))
        .cache(ResponseCache::new(Duration::from_secs(600)).with_max_entries(16))
        .build()
        .unwrap();
    let svc = layer.layer(primary);
    let mut tasks = Vec::new();
    for t in 0..8 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let mut ok_calls = 0;
            for i in 0..150 {
                let prompt = format!("q{}", (t * 7 + i) % 40);
                match svc.clone().oneshot(request_with("m", &prompt, false)).await {
                    Ok(resp) => {
                        assert_eq!(body_of(resp).await, format!("echo {prompt}"));
                        ok_calls += 1;
                    }
                    Err(e) => assert_eq!(e.class(), FailureClass::Overloaded),
                }
            }
            ok_calls
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert!(total > 1000, "{total}");
    let (entries, _) = layer.cache_usage();
    assert!((1..=16).contains(&entries), "{entries}");
    taken(&log);
}

#[tokio::test(start_paused = true)]
async fn a_target_gets_the_callers_request_whole_with_only_the_model_switched() {
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Mine(u32);
    let log = log();
    // Each call's method, path, headers, own extension, context, and model, as the upstream
    // saw them; the primary fails so that the target runs.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let upstream = Mock::new("up", &log, move |n, req| {
        let headers: Vec<_> = req
            .headers()
            .iter()
            .filter(|(n, _)| *n != "content-length")
            .map(|(n, v)| format!("{n}={}", v.to_str().unwrap()))
            .collect();
        record.lock().unwrap().push((
            req.method().clone(),
            req.uri().clone(),
            headers,
            req.extensions().get::<Mine>().copied(),
            req.call_context().map(|c| Arc::as_ptr(c) as usize),
            req.model().map(str::to_owned),
        ));
        // The count is shared by the clones: each call's primary attempt is an even one.
        if n % 2 == 0 {
            fail(FailureClass::ServerError)
        } else {
            ok("fallback")
        }
    });
    let mut svc = FallbackLayer::new([Target::model("small")]).layer(upstream);
    for extra in [0, 6] {
        seen.lock().unwrap().clear();
        let mut req = request("big");
        req.headers_mut()
            .append("x-two", HeaderValue::from_static("a"));
        req.headers_mut()
            .append("x-two", HeaderValue::from_static("b"));
        for i in 0..extra {
            req.headers_mut().append("x-more", HeaderValue::from(i));
        }
        if extra > 0 {
            req.extensions_mut().insert(Mine(extra));
        }
        let resp = svc.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(body_of(resp).await, "fallback");
        let seen = seen.lock().unwrap();
        let [first, target] = &seen[..] else {
            panic!("two calls: {seen:?}")
        };
        assert_eq!(first.5.as_deref(), Some("big"));
        assert_eq!(target.5.as_deref(), Some("small"));
        assert_eq!(
            (&first.0, &first.1, &first.2, first.3, first.4),
            (&target.0, &target.1, &target.2, target.3, target.4)
        );
        assert_eq!(first.3, (extra > 0).then_some(Mine(extra)));
    }
}

#[tokio::test]
async fn the_primary_is_cloned_only_for_calls_that_fall_back_to_it() {
    // A call keeps a service for targets routed to the primary: cloned from one spare when
    // one is used, not for every call (a reference count per layer below, written and
    // released).
    let log = log();
    let upstream = Mock::new("up", &log, |n, req| match (n, req.model()) {
        (5, _) => fail(FailureClass::ServerError),
        (_, Some("small")) => ok("small"),
        _ => ok("big"),
    });
    let (counted, clones) = seawall_test_support::count_clones(upstream);
    let mut svc = FallbackLayer::new([Target::model("small")]).layer(counted);
    assert_eq!(
        clones.count(),
        1,
        "the spare, made as the layer wraps the service"
    );
    for _ in 0..5 {
        let resp = svc.ready().await.unwrap().call(request("big")).await;
        assert_eq!(body_of(resp.unwrap()).await, "big");
    }
    assert_eq!(clones.count(), 1, "no clone for calls the primary answers");
    let resp = svc.ready().await.unwrap().call(request("big")).await;
    assert_eq!(body_of(resp.unwrap()).await, "small");
    assert_eq!(
        clones.count(),
        2,
        "one for the call that fell back to the primary"
    );
    assert_eq!(
        taken(&log),
        ["up:big:sk-main"; 6]
            .into_iter()
            .chain(["up:small:sk-main"])
            .collect::<Vec<_>>()
    );
    // A service changed through `get_mut` gets a new spare at its next `poll_ready`.
    let _ = svc.get_mut();
    svc.ready().await.unwrap();
    assert_eq!(clones.count(), 3);

    // Without a target routed to the primary, no spare is made.
    let (counted, clones) =
        seawall_test_support::count_clones(Mock::new("up", &log, |_, _| ok("big")));
    let backup = Mock::new("backup", &log, |_, _| ok("backup"));
    let mut svc = FallbackLayer::new([Target::service("backup", backup)]).layer(counted);
    for _ in 0..3 {
        let resp = svc.ready().await.unwrap().call(request("big")).await;
        assert_eq!(body_of(resp.unwrap()).await, "big");
    }
    assert_eq!(clones.count(), 0);
}
