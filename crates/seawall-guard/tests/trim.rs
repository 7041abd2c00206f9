//! Properties of trimming, over generated conversations in both wire formats: the system
//! prompt and the last user turn are never removed, a tool call never loses its results (nor
//! the reverse), whole turns go oldest first, and the result fits whenever fitting is possible.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Request;
use proptest::prelude::*;
use seawall_core::{LlmError, LlmRequest};
use seawall_guard::{
    CharEstimate, ContextGuardLayer, ContextPolicy, ContextWindows, ModelLimits, TokenEstimator,
};
use serde_json::{Value, json};
use tower::{Layer, Service};

#[derive(Debug, Clone)]
struct Turn {
    user: String,
    /// Tool calls made in the turn (each with its result).
    tools: Vec<String>,
    answer: Option<String>,
}

fn text() -> impl Strategy<Value = String> {
    (0usize..300).prop_map(|n| "ab cd ".repeat(n / 6 + 1))
}

fn turn() -> impl Strategy<Value = Turn> {
    (
        text(),
        proptest::collection::vec(text(), 0..3),
        proptest::option::of(text()),
    )
        .prop_map(|(user, tools, answer)| Turn {
            user,
            tools,
            answer,
        })
}

/// OpenAI messages: a system prompt first, a developer prompt in the middle, tool calls as
/// `tool` messages after the assistant's `tool_calls`.
fn openai(turns: &[Turn], system: &str) -> Vec<Value> {
    let mut m = vec![json!({"role": "system", "content": system})];
    for (i, t) in turns.iter().enumerate() {
        if i == turns.len() / 2 {
            m.push(json!({"role": "developer", "content": "mid-conversation instructions"}));
        }
        m.push(json!({"role": "user", "content": t.user}));
        for (j, result) in t.tools.iter().enumerate() {
            let id = format!("call_{i}_{j}");
            m.push(json!({"role": "assistant", "tool_calls": [{"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]}));
            m.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
        }
        if let Some(a) = &t.answer {
            m.push(json!({"role": "assistant", "content": a}));
        }
    }
    m
}

/// Anthropic messages: tool results are user messages of `tool_result` blocks.
fn anthropic(turns: &[Turn]) -> Vec<Value> {
    let mut m = Vec::new();
    for (i, t) in turns.iter().enumerate() {
        m.push(json!({"role": "user", "content": [{"type": "text", "text": t.user}]}));
        for (j, result) in t.tools.iter().enumerate() {
            let id = format!("toolu_{i}_{j}");
            m.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "f", "input": {}}]}));
            m.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": result}]}));
        }
        if let Some(a) = &t.answer {
            m.push(json!({"role": "assistant", "content": a}));
        }
    }
    m
}

fn request(path: &str, body: &Value) -> Request<Bytes> {
    let mut r = Request::post(format!("http://h{path}"))
        .body(Bytes::from(body.to_string()))
        .unwrap();
    r.prepare();
    r
}

fn prompt(path: &str, body: &Value) -> u64 {
    CharEstimate::new().prompt_tokens(&request(path, body))
}

/// The call ids a message makes, and the call ids it answers.
fn calls_and_results(m: &Value) -> (Vec<String>, Vec<String>) {
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for c in m["tool_calls"].as_array().into_iter().flatten() {
        calls.push(c["id"].as_str().unwrap().to_owned());
    }
    if let Some(id) = m["tool_call_id"].as_str() {
        results.push(id.to_owned());
    }
    for b in m["content"].as_array().into_iter().flatten() {
        match b["type"].as_str() {
            Some("tool_use") => calls.push(b["id"].as_str().unwrap().to_owned()),
            Some("tool_result") => results.push(b["tool_use_id"].as_str().unwrap().to_owned()),
            _ => {}
        }
    }
    (calls, results)
}

fn is_system(m: &Value) -> bool {
    matches!(m["role"].as_str(), Some("system" | "developer"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn trimming_keeps_the_system_prompt_the_last_turn_and_tool_pairs_and_fits_when_it_can(
        turns in proptest::collection::vec(turn(), 1..12),
        anthropic_format in any::<bool>(),
        window in 50u32..3_000,
        max_tokens in 1u32..200,
    ) {
        let last = turns.last().unwrap().clone();
        let (path, messages, system_field) = if anthropic_format {
            ("/v1/messages", anthropic(&turns), Some("be brief"))
        } else {
            ("/v1/chat/completions", openai(&turns, "be brief"), None)
        };
        let mut body = json!({"model": "m", "max_tokens": max_tokens, "messages": messages});
        if let Some(s) = system_field {
            body["system"] = json!(s);
        }
        // The last turn as it was sent: from its user message on.
        let last_messages: Vec<Value> = if anthropic_format {
            anthropic(&[last])
        } else {
            openai(&[last], "x").into_iter().filter(|m| !is_system(m)).collect()
        };
        let suffix = &messages[messages.len() - last_messages.len()..];
        // The least that may be sent: the system prompts and the last turn.
        let mut least = body.clone();
        least["messages"] = Value::Array(
            messages[..messages.len() - suffix.len()].iter().filter(|m| is_system(m)).chain(suffix).cloned().collect(),
        );
        let room = u64::from(window) - u64::from(max_tokens.min(window));
        let can_fit = max_tokens < window && prompt(path, &least) <= room;
        let fits_already = max_tokens < window && prompt(path, &body) <= room;

        let sent = Arc::new(Mutex::new(None));
        let seen = sent.clone();
        let inner = tower::service_fn(move |req: Request<Bytes>| {
            *seen.lock().unwrap() = Some(req.body().clone());
            async { Ok::<_, LlmError>(()) }
        });
        let layer = ContextGuardLayer::builder(ContextWindows::new().with("m", ModelLimits::new(window)))
            .policy(ContextPolicy::TrimOldest)
            .build()
            .unwrap();
        // The inner service records in `call`: no need to run the future.
        drop(layer.layer(inner).call(request(path, &body)));
        let sent = sent.lock().unwrap().take();

        let Some(sent) = sent else {
            prop_assert!(!can_fit, "refused although the system prompts and the last turn fit");
            return Ok(());
        };
        let got: Value = serde_json::from_slice(&sent).unwrap();
        if fits_already {
            prop_assert_eq!(&got, &body);
        }
        prop_assert!(prompt(path, &got) <= room, "sent a request that does not fit");
        prop_assert_eq!(&got["system"], &body["system"]);
        let kept = got["messages"].as_array().unwrap();
        // Every system prompt, in order.
        let systems = |ms: &[Value]| ms.iter().filter(|m| is_system(m)).cloned().collect::<Vec<_>>();
        prop_assert_eq!(systems(kept), systems(&messages));
        // The last turn, whole, at the end.
        prop_assert!(kept.len() >= suffix.len());
        prop_assert_eq!(&kept[kept.len() - suffix.len()..], suffix);
        // The rest is the newest part of the conversation, cut at the start of a turn.
        let rest: Vec<&Value> = kept.iter().filter(|m| !is_system(m)).collect();
        let all: Vec<&Value> = messages.iter().filter(|m| !is_system(m)).collect();
        prop_assert_eq!(&all[all.len() - rest.len()..], &rest[..]);
        let first = rest[0];
        prop_assert_eq!(first["role"].as_str(), Some("user"));
        prop_assert!(calls_and_results(first).1.is_empty(), "starts with a tool result");
        // Every call with its result, every result with its call.
        let (mut calls, mut results) = (Vec::new(), Vec::new());
        for m in kept {
            let (c, r) = calls_and_results(m);
            calls.extend(c);
            results.extend(r);
        }
        calls.sort();
        results.sort();
        prop_assert_eq!(calls, results);
    }
}
