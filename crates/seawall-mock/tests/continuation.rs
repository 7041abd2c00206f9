//! Continuations: a request that carries a partial answer as the assistant's last turn (an
//! Anthropic prefill, DeepSeek's and Mistral's `"prefix": true`, vLLM's
//! `continue_final_message`, or an instruction to continue) gets the remainder of the answer
//! the mock would have given, so prefix + continuation is the uncut answer.

mod common;

use common::*;
use seawall_mock::{Count, MockUpstream, Profile};
use serde_json::{Value, json};

fn profile() -> Profile {
    Profile::default().seed(11).output_tokens(Count::fixed(16))
}

/// The answer's text, from a complete JSON body of either format.
fn answer_text(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .or_else(|| v["content"][0]["text"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The text of a stream's content deltas, in both formats.
fn streamed_text(sse: &str) -> String {
    events(sse)
        .iter()
        .filter(|e| e.is_content())
        .map(|e| {
            let v = e.json();
            v["choices"][0]["delta"]["content"]
                .as_str()
                .or_else(|| v["delta"]["text"].as_str())
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// The uncut answer, and the same answer cut at 6 tokens, from two upstreams on one seed (the
/// first call of each draws the same walk).
async fn uncut_and_cut(anthropic: bool) -> (String, String, MockUpstream) {
    let (whole, cut) = (upstream(profile()), upstream(profile()));
    let mut body = if anthropic {
        anthropic_body(false)
    } else {
        openai_body(false)
    };
    let send = |up: &MockUpstream, body: &Value| {
        let req = if anthropic {
            anthropic_req(body, "k")
        } else {
            openai_req(body, "k")
        };
        (up.clone(), req)
    };
    let (up, req) = send(&whole, &body);
    let uncut = answer_text(&json_body(call(&up, req).await).await);
    body["max_tokens"] = json!(6);
    let (up, req) = send(&cut, &body);
    let first = json_body(call(&up, req).await).await;
    let reason = first["choices"][0]["finish_reason"]
        .as_str()
        .or_else(|| first["stop_reason"].as_str());
    assert!(matches!(reason, Some("length" | "max_tokens")), "{first}");
    (uncut, answer_text(&first), cut)
}

fn with_assistant(mut body: Value, text: &str, extra: Value) -> Value {
    let mut turn = json!({"role": "assistant", "content": text});
    if let (Some(t), Some(e)) = (turn.as_object_mut(), extra.as_object()) {
        t.extend(e.clone());
    }
    body["messages"].as_array_mut().unwrap().push(turn);
    body
}

#[tokio::test(start_paused = true)]
async fn an_anthropic_prefill_gets_the_remainder_of_the_answer() {
    let (uncut, partial, up) = uncut_and_cut(true).await;
    assert_eq!(partial.split(' ').count(), 6);
    let body = with_assistant(anthropic_body(false), &partial, json!({}));
    let rest = json_body(call(&up, anthropic_req(&body, "k")).await).await;
    assert_eq!(rest["stop_reason"], "end_turn");
    assert_eq!(rest["usage"]["output_tokens"], 10);
    let rest = answer_text(&rest);
    assert!(rest.starts_with(' '), "{rest:?} continues the prefill");
    assert_eq!(format!("{partial}{rest}"), uncut);
}

#[tokio::test(start_paused = true)]
async fn openai_prefix_and_continue_final_message_get_the_remainder() {
    let (uncut, partial, up) = uncut_and_cut(false).await;
    for (turn, top) in [
        (json!({"prefix": true}), json!({})),
        (
            json!({}),
            json!({"continue_final_message": true, "add_generation_prompt": false}),
        ),
    ] {
        let mut body = with_assistant(openai_body(false), &partial, turn);
        body.as_object_mut()
            .unwrap()
            .extend(top.as_object().unwrap().clone());
        let rest = answer_text(&json_body(call(&up, openai_req(&body, "k")).await).await);
        assert_eq!(format!("{partial}{rest}"), uncut, "{body}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_instruction_gets_the_remainder_with_the_last_word_repeated() {
    let (uncut, partial, up) = uncut_and_cut(false).await;
    let mut body = with_assistant(openai_body(false), &partial, json!({}));
    body["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "user", "content": "Continue exactly where you stopped."}));
    let rest = answer_text(&json_body(call(&up, openai_req(&body, "k")).await).await);
    let last = partial.rsplit(' ').next().unwrap();
    let after = rest.strip_prefix(last).expect("the last word is repeated");
    assert_eq!(format!("{partial}{after}"), uncut);
}

#[tokio::test(start_paused = true)]
async fn a_streamed_continuation_sends_only_the_remainder_in_both_formats() {
    for anthropic in [false, true] {
        let (uncut, partial, up) = uncut_and_cut(anthropic).await;
        let (body, req) = if anthropic {
            let b = with_assistant(anthropic_body(true), &partial, json!({}));
            let r = anthropic_req(&b, "k");
            (b, r)
        } else {
            let b = with_assistant(openai_body(true), &partial, json!({"prefix": true}));
            let r = openai_req(&b, "k");
            (b, r)
        };
        let rest = streamed_text(&text(call(&up, req).await).await);
        assert_eq!(format!("{partial}{rest}"), uncut, "{body}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_cut_stream_and_its_continuation_make_the_uncut_answer() {
    let cut = Profile::default()
        .seed(3)
        .output_tokens(Count::fixed(12))
        .cut_streams(1.0, Count::fixed(5), true);
    let whole = upstream(profile().seed(3).output_tokens(Count::fixed(12)));
    let uncut =
        answer_text(&json_body(call(&whole, openai_req(&openai_body(false), "k")).await).await);
    let up = upstream(cut);
    let resp = call(&up, openai_req(&openai_body(true), "k")).await;
    let (frames, err) = frames(resp, tokio::time::Instant::now()).await;
    assert!(err.is_some(), "the stream is cut with a reset");
    let sse: String = frames.into_iter().map(|(_, f)| f).collect();
    let partial = streamed_text(&sse);
    assert_eq!(partial.split(' ').count(), 5);
    // The clean upstream answers the continuation (the cutting one would cut it too).
    let body = with_assistant(openai_body(false), &partial, json!({"prefix": true}));
    let rest = answer_text(&json_body(call(&whole, openai_req(&body, "k")).await).await);
    assert_eq!(format!("{partial}{rest}"), uncut);
}

#[tokio::test(start_paused = true)]
async fn refused_continuations_get_the_providers_errors() {
    let up = upstream(profile());
    let body = with_assistant(anthropic_body(false), "the storm ", json!({}));
    let resp = call(&up, anthropic_req(&body, "k")).await;
    assert_eq!(resp.status(), 400);
    let v = json_body(resp).await;
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("trailing whitespace")
    );

    let mut body = with_assistant(openai_body(false), "the storm", json!({}));
    body["continue_final_message"] = json!(true);
    let resp = call(&up, openai_req(&body, "k")).await;
    assert_eq!(resp.status(), 400);
    let v = json_body(resp).await;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("add_generation_prompt")
    );
}

#[tokio::test(start_paused = true)]
async fn an_assistant_turn_without_a_continuation_option_gets_a_new_answer() {
    let up = upstream(profile());
    let body = with_assistant(openai_body(false), "the storm", json!({}));
    let answer = answer_text(&json_body(call(&up, openai_req(&body, "k")).await).await);
    assert_eq!(answer.split(' ').count(), 16);
    assert!(!answer.starts_with(' '));
}
