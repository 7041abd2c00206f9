//! The caller's deadline in the fallback chain, on paused time: it combines with the layer's
//! own deadline (the earlier wins), cancels the target running at it, and no target, the
//! primary included, starts past it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use seawall_core::{Deadline, FailureClass, LlmError, TIMEOUT_HEADER};
use seawall_fallback::{FallbackError, FallbackLayer, Target};
use tokio::time::{Instant, sleep};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

type Req = Request<Bytes>;
type Resp = Response<UnsyncBoxBody<Bytes, LlmError>>;

fn request(timeout: Option<&str>) -> Req {
    let mut req = Request::post("https://api.example.com/v1/chat/completions");
    if let Some(t) = timeout {
        req = req.header(TIMEOUT_HEADER, t);
    }
    req.body(Bytes::from_static(
        br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
    ))
    .unwrap()
}

/// An upstream that answers after `delay` (`None`: never) with `outcome`, and counts its calls.
fn upstream(
    delay: Option<Duration>,
    outcome: Result<&'static str, FailureClass>,
) -> (BoxCloneSyncService<Req, Resp, LlmError>, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let svc = tower::service_fn(move |_req: Req| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            match delay {
                Some(d) => sleep(d).await,
                None => std::future::pending::<()>().await,
            }
            match outcome {
                Ok(text) => Ok(Response::new(
                    Full::new(Bytes::from_static(text.as_bytes()))
                        .map_err(|e| match e {})
                        .boxed_unsync(),
                )),
                Err(class) => Err(LlmError::new(class, "scripted")),
            }
        }
    });
    (BoxCloneSyncService::new(svc), calls)
}

#[tokio::test(start_paused = true)]
async fn the_callers_deadline_before_the_layers_own_cancels_the_primary_and_starts_no_fallback() {
    let (primary, _) = upstream(None, Ok("never"));
    let (backup, backup_calls) = upstream(Some(Duration::ZERO), Ok("backup"));
    let layer = FallbackLayer::builder()
        .target(Target::service("backup", backup))
        .deadline(Duration::from_secs(60))
        .build()
        .unwrap();
    let start = Instant::now();
    let err = layer
        .layer(primary)
        .oneshot(request(Some("3")))
        .await
        .unwrap_err();
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(3),
        "the caller's 3 s, not 60 s"
    );
    assert_eq!(err.class(), FailureClass::DeadlineExceeded, "{err}");
    assert!(FallbackError::of(&err).unwrap().deadline_passed());
    assert_eq!(backup_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn the_layers_own_deadline_still_wins_when_it_is_earlier() {
    let (primary, _) = upstream(None, Ok("never"));
    let layer = FallbackLayer::builder()
        .deadline(Duration::from_secs(2))
        .build()
        .unwrap();
    let start = Instant::now();
    let err = layer
        .layer(primary)
        .oneshot(request(Some("10")))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(err.class(), FailureClass::DeadlineExceeded);
}

#[tokio::test(start_paused = true)]
async fn no_fallback_target_starts_once_the_callers_deadline_has_passed() {
    // The primary's failure arrives exactly at the caller's deadline.
    let (primary, _) = upstream(Some(Duration::from_secs(3)), Err(FailureClass::Overloaded));
    let (backup, backup_calls) = upstream(Some(Duration::ZERO), Ok("backup"));
    let layer = FallbackLayer::new([Target::service("backup", backup)]);
    let err = layer
        .layer(primary)
        .oneshot(request(Some("3")))
        .await
        .unwrap_err();
    assert_eq!(backup_calls.load(Ordering::SeqCst), 0);
    assert_eq!(err.class(), FailureClass::DeadlineExceeded, "{err}");
}

#[tokio::test(start_paused = true)]
async fn with_time_left_the_chain_falls_back_as_usual() {
    let (primary, _) = upstream(Some(Duration::from_secs(1)), Err(FailureClass::Overloaded));
    let (backup, backup_calls) = upstream(Some(Duration::ZERO), Ok("backup"));
    let layer = FallbackLayer::new([Target::service("backup", backup)]);
    let resp = layer
        .layer(primary)
        .oneshot(request(Some("3")))
        .await
        .expect("the backup answers within the deadline");
    assert_eq!(backup_calls.load(Ordering::SeqCst), 1);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"backup");
}

#[tokio::test(start_paused = true)]
async fn a_call_past_its_deadline_fails_before_the_primary_starts() {
    let (primary, primary_calls) = upstream(Some(Duration::ZERO), Ok("primary"));
    let layer = FallbackLayer::<Req, Resp>::new([]);
    let mut req = request(None);
    req.extensions_mut().insert(Deadline::at(Instant::now()));
    let err = layer.layer(primary).oneshot(req).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::DeadlineExceeded);
    assert_eq!(primary_calls.load(Ordering::SeqCst), 0);
}
