//! The guard in a stack, against the chaos upstream on paused time: refused calls never reach
//! the upstream, a refusal reaches the fallback's larger-context list and the larger model is
//! checked too, trims and lowered bounds are what the upstream receives, and the call record
//! says what happened.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Request;
use seawall_classify::ClassifyLayer;
use seawall_core::{ContextAction, FailureClass, LlmError, LlmRequest, ServedBy};
use seawall_fallback::{FallbackLayer, Target};
use seawall_guard::{ContextGuardLayer, ContextPolicy, ContextWindows, ModelLimits};
use seawall_mock::{MockUpstream, Profile};
use seawall_observe::{CallRecord, ObserveLayer};
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt};

const SMALL: u32 = 1_000;
const LARGE: u32 = 100_000;

/// The upstream's windows: `small` takes 1,000 tokens, `large` 100,000.
fn upstream() -> MockUpstream {
    MockUpstream::new(
        Profile::default()
            .seed(3)
            .model_context_window("small", SMALL)
            .model_context_window("large", LARGE),
    )
}

/// The guard's table, agreeing with the upstream.
fn windows() -> ContextWindows {
    ContextWindows::new()
        .with("small", ModelLimits::new(SMALL).with_max_output(500))
        .with("large", ModelLimits::new(LARGE))
}

/// About `n` × 1.25 tokens of text (5 characters a word, 4 characters a token).
fn words(n: usize) -> String {
    "word ".repeat(n)
}

fn chat(body: Value) -> Request<Bytes> {
    Request::post("http://mock/v1/chat/completions")
        .header("content-type", "application/json")
        .header("content-length", "0")
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

fn too_long_for_small() -> Request<Bytes> {
    // 2,000 words: about 2,500 tokens, more than `small` takes, far less than `large`.
    chat(json!({"model": "small", "max_tokens": 100,
                "messages": [{"role": "user", "content": words(2_000)}]}))
}

type Records = Arc<Mutex<Vec<CallRecord>>>;

fn observe(records: &Records) -> ObserveLayer {
    let records = records.clone();
    ObserveLayer::builder()
        .recorder(move |r: &CallRecord| records.lock().unwrap().push(r.clone()))
        .build()
        .unwrap()
}

/// The upstream behind a recorder of the bodies it is sent.
type Recording = tower::util::BoxCloneService<
    Request<Bytes>,
    http::Response<seawall_mock::MockBody>,
    std::convert::Infallible,
>;

fn recording(upstream: MockUpstream) -> (Arc<Mutex<Vec<Request<Bytes>>>>, Recording) {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let seen = sent.clone();
    let svc = tower::service_fn(move |req: Request<Bytes>| {
        let mut copy = Request::new(req.body().clone());
        *copy.uri_mut() = req.uri().clone();
        copy.prepare();
        seen.lock().unwrap().push(copy);
        upstream.clone().oneshot(req)
    });
    (sent, Recording::new(svc))
}

#[tokio::test(start_paused = true)]
async fn a_refused_call_never_reaches_the_upstream_which_would_have_answered_400() {
    // Without the guard: a round trip, and the upstream's context-length 400.
    let bare = upstream();
    let err = ServiceBuilder::new()
        .layer(ClassifyLayer::new())
        .service(bare.clone())
        .oneshot(too_long_for_small())
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::ContextLengthExceeded);
    assert_eq!((bare.stats().requests, bare.stats().context_length), (1, 1));

    // With it: the same class, at once, and the upstream sees nothing.
    let up = upstream();
    let records = Records::default();
    let err = ServiceBuilder::new()
        .layer(observe(&records))
        .layer(ContextGuardLayer::new(windows()))
        .layer(ClassifyLayer::new())
        .service(up.clone())
        .oneshot(too_long_for_small())
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::ContextLengthExceeded);
    assert_eq!(err.code(), Some("context_length_exceeded"));
    assert!(
        err.message()
            .contains("small's context window of 1000 tokens"),
        "{err}"
    );
    assert_eq!(up.stats().requests, 0);
    let r = records.lock().unwrap().pop().unwrap();
    assert_eq!(r.context_guard, Some(ContextAction::Refused));
    assert_eq!(r.attempts, 0);
    assert!(
        r.to_json().contains(r#""context_guard":"refused""#),
        "{}",
        r.to_json()
    );
}

#[tokio::test(start_paused = true)]
async fn a_refusal_goes_to_the_larger_context_fallback_which_the_guard_checks_again() {
    let up = upstream();
    let records = Records::default();
    let client = ServiceBuilder::new()
        .layer(observe(&records))
        .layer(
            FallbackLayer::builder()
                .larger_context(Target::model("large"))
                .build()
                .unwrap(),
        )
        .layer(ContextGuardLayer::new(windows()))
        .layer(ClassifyLayer::new())
        .service(up.clone());
    let resp = client.clone().oneshot(too_long_for_small()).await.unwrap();
    assert_eq!(
        &*resp.extensions().get::<ServedBy>().unwrap().target,
        "large"
    );
    http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap();
    // One upstream call, to the larger model; none wasted on the small one.
    let stats = up.stats();
    assert_eq!((stats.requests, stats.ok, stats.context_length), (1, 1, 0));
    let r = records.lock().unwrap().pop().unwrap();
    assert_eq!(r.context_guard, Some(ContextAction::Refused));
    assert!(r.fallback);

    // Too long for the larger model too: the guard refuses it as well, still no call.
    let huge = chat(json!({"model": "small", "max_tokens": 100,
                           "messages": [{"role": "user", "content": words(100_000)}]}));
    let err = client.oneshot(huge).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::ContextLengthExceeded);
    assert_eq!(up.stats().requests, 1);
}

#[tokio::test(start_paused = true)]
async fn trimming_sends_the_newest_turns_that_fit_and_the_upstream_accepts_them() {
    let up = upstream();
    let (sent, upstream) = recording(up.clone());
    let records = Records::default();
    let client = ServiceBuilder::new()
        .layer(observe(&records))
        .layer(
            ContextGuardLayer::builder(windows())
                .policy(ContextPolicy::TrimOldest)
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::new())
        .service(upstream);
    // Anthropic's format: the system prompt is a field, a tool call's result is the next
    // user message. Each old turn is about 130 tokens; ten of them do not fit in 1,000.
    let mut messages = Vec::new();
    for i in 0..10 {
        messages.push(json!({"role": "user", "content": format!("question {i}: {}", words(80))}));
        messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": format!("t{i}"), "name": "f", "input": {}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("t{i}"), "content": "ok"}]}));
        messages.push(json!({"role": "assistant", "content": "done"}));
    }
    messages.push(json!({"role": "user", "content": "and now?"}));
    let body =
        json!({"model": "small", "max_tokens": 100, "system": "Be brief.", "messages": messages});
    let req = Request::post("http://mock/v1/messages")
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .body(Bytes::from(body.to_string()))
        .unwrap();
    let resp = client.oneshot(req).await.unwrap();
    http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap();

    let sent = sent.lock().unwrap().pop().unwrap();
    let got: Value = serde_json::from_slice(sent.body()).unwrap();
    let kept = got["messages"].as_array().unwrap();
    assert_eq!(got["system"], "Be brief.");
    assert_eq!(kept.last().unwrap()["content"], "and now?");
    // Whole turns went: what is left starts with a question, never with a tool result.
    assert!(
        kept[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("question "),
        "{}",
        kept[0]
    );
    let dropped = (messages.len() - kept.len()) / 4;
    assert_eq!(kept.len(), messages.len() - 4 * dropped);
    assert!(sent.estimated_input_tokens() + 100 <= SMALL);
    let r = records.lock().unwrap().pop().unwrap();
    assert_eq!(
        r.context_guard,
        Some(ContextAction::Trimmed {
            turns: dropped as u32
        })
    );
    // As few turns as fit: with one turn fewer dropped, it would not have fit.
    assert!((1..10).contains(&dropped), "{dropped}");
    let mut one_fewer = body.clone();
    one_fewer["messages"] = Value::Array(messages[4 * (dropped - 1)..].to_vec());
    let mut one_fewer = Request::post("http://mock/v1/messages")
        .body(Bytes::from(one_fewer.to_string()))
        .unwrap();
    one_fewer.prepare();
    assert!(one_fewer.estimated_input_tokens() + 100 > SMALL);
    let stats = up.stats();
    assert_eq!((stats.requests, stats.ok, stats.context_length), (1, 1, 0));
}

#[tokio::test(start_paused = true)]
async fn lowering_max_tokens_sends_the_room_left_and_refuses_below_the_floor() {
    let (sent, upstream) = recording(upstream());
    let records = Records::default();
    let client = ServiceBuilder::new()
        .layer(observe(&records))
        .layer(
            ContextGuardLayer::builder(windows())
                .policy(ContextPolicy::lower_max_tokens(50))
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::new())
        .service(upstream);
    // 600 words and "user": 3,004 characters, 751 tokens, + 4 per piece × 2 = 759.
    let ask = |max: u32| {
        chat(json!({"model": "small", "max_completion_tokens": max,
                    "messages": [{"role": "user", "content": words(600)}]}))
    };
    let resp = client.clone().oneshot(ask(400)).await.unwrap();
    http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap();
    let body: Value = serde_json::from_slice(sent.lock().unwrap()[0].body()).unwrap();
    assert_eq!(body["max_completion_tokens"], 1_000 - 759);
    assert!(body.get("max_tokens").is_none());
    assert_eq!(
        records.lock().unwrap().pop().unwrap().context_guard,
        Some(ContextAction::MaxTokensLowered { from: 400, to: 241 })
    );

    // Above the model's output limit (500): lowered to the limit even though it would fit.
    let short = chat(json!({"model": "small", "max_tokens": 900,
                            "messages": [{"role": "user", "content": "hi"}]}));
    client.clone().oneshot(short).await.unwrap();
    let body: Value = serde_json::from_slice(sent.lock().unwrap()[1].body()).unwrap();
    assert_eq!(body["max_tokens"], 500);

    // 760 words: 951 + 8 tokens leave 41, below the floor of 50: refused, nothing sent.
    let tight = chat(json!({"model": "small", "max_tokens": 400,
                            "messages": [{"role": "user", "content": words(760)}]}));
    let err = client.oneshot(tight).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::ContextLengthExceeded);
    assert_eq!(sent.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_output_bound_above_the_models_limit_is_refused_as_invalid() {
    let up = upstream();
    let client = ServiceBuilder::new()
        .layer(ContextGuardLayer::new(windows()))
        .layer(ClassifyLayer::new())
        .service(up.clone());
    let req = chat(json!({"model": "small", "max_tokens": 600,
                          "messages": [{"role": "user", "content": "hi"}]}));
    let err = client.oneshot(req).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::InvalidRequest);
    assert!(err.message().contains("output limit of 500"), "{err}");
    assert_eq!(up.stats().requests, 0);
}

/// The inner layers see the request that is sent: its facts are parsed again after a rewrite.
#[tokio::test(start_paused = true)]
async fn the_layers_inside_see_the_rewritten_request() {
    let seen = Arc::new(Mutex::new(None));
    let probe = seen.clone();
    let inner = tower::service_fn(move |req: Request<Bytes>| {
        *probe.lock().unwrap() = Some((req.max_output_tokens(), req.estimated_input_tokens()));
        async { Ok::<_, LlmError>(http::Response::new(())) }
    });
    let client = ServiceBuilder::new()
        .layer(
            ContextGuardLayer::builder(windows())
                .policy(ContextPolicy::TrimOldest)
                .build()
                .unwrap(),
        )
        .service(inner);
    let mut req = chat(json!({"model": "small", "max_tokens": 100, "messages": [
        {"role": "user", "content": words(700)},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "short"},
    ]}));
    req.prepare(); // an outer layer parsed it before the guard
    client.oneshot(req).await.unwrap();
    let (max, input) = seen.lock().unwrap().unwrap();
    assert_eq!(max, Some(100));
    assert!(
        input < 20,
        "the inner layer saw the old prompt: {input} tokens"
    );
}

#[tokio::test(start_paused = true)]
async fn unknown_models_and_hostile_bodies_pass_or_fail_clearly_never_panic() {
    let up = upstream();
    let records = Records::default();
    let client = ServiceBuilder::new()
        .layer(observe(&records))
        .layer(
            ContextGuardLayer::builder(windows())
                .policy(ContextPolicy::TrimOldest)
                .build()
                .unwrap(),
        )
        .layer(ClassifyLayer::new())
        .service(up.clone());
    // Passed through unchecked: an unknown model, no model, a body that is not JSON.
    for body in [
        json!({"model": "mystery", "max_tokens": 100, "messages": [{"role": "user", "content": words(2_000)}]}).to_string(),
        json!({"messages": [{"role": "user", "content": "hi"}]}).to_string(),
        "\u{0}not json".to_owned(),
        "[1, 2, 3]".to_owned(),
    ] {
        let req = Request::post("http://mock/v1/chat/completions").body(Bytes::from(body)).unwrap();
        let _ = client.clone().oneshot(req).await;
        let r = records.lock().unwrap().pop().unwrap();
        assert_eq!(r.context_guard, Some(ContextAction::Skipped));
    }
    assert_eq!(up.stats().requests, 4);

    // Known model, nothing to trim or absurd numbers: a clear refusal, no call.
    for body in [
        // No `messages` (a legacy completion): nothing to trim.
        json!({"model": "small", "max_tokens": 10, "prompt": words(2_000)}),
        // Only the last turn, and it is too long.
        json!({"model": "small", "max_tokens": 10, "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": words(2_000)}]}),
        // Messages that are not a list.
        json!({"model": "small", "max_tokens": 10, "messages": {"role": "user", "content": words(2_000)}}),
        // An output bound beyond any window.
        json!({"model": "large", "max_tokens": 1e300, "messages": [{"role": "user", "content": "hi"}]}),
        json!({"model": "large", "max_tokens": "99999999999", "messages": [{"role": "user", "content": "hi"}]}),
    ] {
        let err = client
            .clone()
            .oneshot(chat(body.clone()))
            .await
            .unwrap_err();
        assert_eq!(err.class(), FailureClass::ContextLengthExceeded, "{body}");
    }
    assert_eq!(up.stats().requests, 4);
}

#[test]
fn a_zero_floor_is_refused_at_build() {
    let err = ContextGuardLayer::builder(windows())
        .policy(ContextPolicy::lower_max_tokens(0))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "policy");
}

/// Gemini bounds the prompt apart from the window: a prompt over that bound is refused even
/// where prompt plus output would fit the window, and lowering the output cannot help it.
#[tokio::test(start_paused = true)]
async fn a_separate_input_bound_is_checked_too() {
    let windows = ContextWindows::new().with(
        "gemini-x",
        ModelLimits::new(2_000)
            .with_max_input(500)
            .with_max_output(1_000),
    );
    let inner = tower::service_fn(|_req: Request<Bytes>| async {
        Ok::<_, LlmError>(http::Response::new(()))
    });
    // 600 words: 759 tokens, over the 500 the prompt may have.
    let ask = |words_n: usize| {
        chat(json!({"model": "gemini-x", "max_tokens": 10,
                    "messages": [{"role": "user", "content": words(words_n)}]}))
    };
    for policy in [ContextPolicy::Refuse, ContextPolicy::lower_max_tokens(1)] {
        let client = ServiceBuilder::new()
            .layer(
                ContextGuardLayer::builder(windows.clone())
                    .policy(policy)
                    .build()
                    .unwrap(),
            )
            .service(inner);
        let err = client.clone().oneshot(ask(600)).await.unwrap_err();
        assert_eq!(
            err.class(),
            FailureClass::ContextLengthExceeded,
            "{policy:?}"
        );
        assert!(
            err.message().contains("at most 500 of them prompt"),
            "{err}"
        );
        // 300 words: 384 tokens, within both bounds.
        client.oneshot(ask(300)).await.unwrap();
    }
}
