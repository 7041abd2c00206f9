//! Which requests the fallback layer marks [`Standby`]: the primary's, when the chain has a
//! target for a gate's refusal; each target's but the last one the chain may call; and every
//! one when a fallback layer further out stands by.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use seawall_core::{FailureClass, LlmError, LlmRequest, Standby};
use seawall_fallback::{FallbackBuilder, FallbackLayer, Target};
use tower::{Layer, ServiceExt};

type Req = Request<Bytes>;
type Resp = Response<Full<Bytes>>;

fn request() -> Req {
    Request::post("https://api.example.com/v1/chat/completions")
        .body(Bytes::from_static(
            br#"{"model":"primary","messages":[{"role":"user","content":"hi"}]}"#,
        ))
        .unwrap()
}

/// Sends one request through `layer` over an upstream that refuses every call as a gate
/// would, and returns each call's model and whether it was marked, in order.
async fn marks(layer: FallbackBuilder<Req, Resp>, req: Req) -> Vec<(String, bool)> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let upstream = tower::service_fn(move |req: Req| {
        let model = req.model().unwrap_or("").to_owned();
        log.lock().unwrap().push((model, Standby::is_on(&req)));
        async { Err::<Resp, _>(LlmError::new(FailureClass::GateRejected, "busy")) }
    });
    let svc = layer.build().unwrap().layer(upstream);
    svc.oneshot(req).await.unwrap_err();
    seen.lock().unwrap().clone()
}

fn seen(calls: &[(&str, bool)]) -> Vec<(String, bool)> {
    calls.iter().map(|&(m, on)| (m.to_owned(), on)).collect()
}

#[tokio::test]
async fn every_call_but_the_chains_last_is_marked() {
    let layer = FallbackLayer::builder()
        .target(Target::model("backup"))
        .target(Target::model("last"));
    assert_eq!(
        marks(layer, request()).await,
        seen(&[("primary", true), ("backup", true), ("last", false)])
    );
}

#[tokio::test]
async fn the_last_target_is_the_last_the_chain_may_call() {
    let layer = FallbackLayer::builder()
        .target(Target::model("backup"))
        .target(Target::model("never"))
        .max_fallbacks(1);
    assert_eq!(
        marks(layer, request()).await,
        seen(&[("primary", true), ("backup", false)])
    );
}

#[tokio::test]
async fn a_chain_without_a_target_for_a_refusal_marks_nothing() {
    // A gate's refusal goes down the regular chain; this one has only a larger-context list.
    let layer = FallbackLayer::builder().larger_context(Target::model("large"));
    assert_eq!(marks(layer, request()).await, seen(&[("primary", false)]));
    let none = FallbackLayer::builder()
        .max_fallbacks(0)
        .target(Target::model("backup"));
    assert_eq!(marks(none, request()).await, seen(&[("primary", false)]));
}

#[tokio::test]
async fn a_mark_from_further_out_stays_on_every_call() {
    let mut req = request();
    Standby::set(&mut req, true);
    let layer = FallbackLayer::builder().target(Target::model("backup"));
    assert_eq!(
        marks(layer, req).await,
        seen(&[("primary", true), ("backup", true)])
    );
}
