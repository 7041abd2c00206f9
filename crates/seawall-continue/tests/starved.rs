//! DeepSeek stops an answer its inference system has no resources to finish with `finish_reason:
//! "insufficient_system_resource"`, and a router ends one a provider failed mid-way with
//! `finish_reason: "error"`: cut, not finished. Streamed, the caller still gets one whole
//! answer.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use seawall_classify::ClassifyLayer;
use seawall_continue::{ContinuationStyle, ContinueLayer};
use seawall_core::LlmError;
use serde_json::{Value, json};
use tower::{Layer, Service, ServiceExt};

/// Answers each call with the next scripted stream, and keeps each request's body.
#[derive(Clone, Default)]
struct Scripted {
    answers: Arc<Mutex<VecDeque<String>>>,
    seen: Arc<Mutex<Vec<Value>>>,
}

impl Service<Request<Bytes>> for Scripted {
    type Response = Response<Full<Bytes>>;
    type Error = LlmError;
    type Future = std::future::Ready<Result<Response<Full<Bytes>>, LlmError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        let body: Value = serde_json::from_slice(req.body()).unwrap_or(Value::Null);
        self.seen.lock().unwrap().push(body);
        let answer = self.answers.lock().unwrap().pop_front().unwrap_or_default();
        std::future::ready(Ok(Response::builder()
            .header("content-type", "text/event-stream")
            .body(Full::new(Bytes::from(answer)))
            .unwrap()))
    }
}

/// A DeepSeek stream of `pieces`, ending with `finish`.
fn stream(id: &str, pieces: &[&str], finish: &str) -> String {
    let chunk = |delta: Value, finish: Value| {
        let c = json!({"id": id, "object": "chat.completion.chunk", "model": "deepseek-chat",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {c}\n\n")
    };
    let mut s = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
    for p in pieces {
        s += &chunk(json!({"content": p}), Value::Null);
    }
    s += &chunk(json!({"content": ""}), json!(finish));
    s + "data: [DONE]\n\n"
}

/// The text of an OpenAI stream's content deltas.
fn text(sse: &str) -> String {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

#[tokio::test]
async fn a_stream_cut_by_its_finish_word_or_an_error_chunk_is_resumed_into_one_answer() {
    let starved = stream("c1", &["The sea ", "is"], "insufficient_system_resource");
    // A router's error chunk and the `[DONE]` after it, in the same read: neither reaches the
    // caller once the answer is resumed.
    let error = json!({"id": "c1", "object": "chat.completion.chunk", "model": "deepseek-chat",
                       "error": {"code": 502, "message": "Provider disconnected"},
                       "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]});
    let cut = stream("c1", &["The sea ", "is"], "stop");
    let at = cut.rfind("data: {").unwrap();
    let error_chunk = format!("{}data: {error}\n\ndata: [DONE]\n\n", &cut[..at]);
    // A router's bare `error` finish.
    let failed = stream("c1", &["The sea ", "is"], "error");
    for first in [starved, error_chunk, failed] {
        resumed_into_one_answer(first).await;
    }
}

async fn resumed_into_one_answer(first: String) {
    let up = Scripted::default();
    up.answers
        .lock()
        .unwrap()
        .extend([first, stream("c2", &[" wide and deep."], "stop")]);
    let layer = ContinueLayer::builder()
        .openai_style(ContinuationStyle::Prefix)
        .build()
        .unwrap();
    let svc = layer.layer(ClassifyLayer::new().layer(up.clone()));
    let req = Request::post("https://api.deepseek.com/chat/completions")
        .body(Bytes::from(
            json!({"model": "deepseek-chat", "stream": true,
                   "messages": [{"role": "user", "content": "Tell me about the sea"}]})
            .to_string(),
        ))
        .unwrap();
    let resp = svc.oneshot(req).await.unwrap();
    let body = resp.into_body().collect().await.expect("one whole answer");
    let sse = String::from_utf8(body.to_bytes().to_vec()).unwrap();
    assert_eq!(text(&sse), "The sea is wide and deep.", "{sse}");
    assert!(!sse.contains("insufficient_system_resource"), "{sse}");
    assert!(!sse.contains("Provider disconnected"), "{sse}");
    assert_eq!(sse.matches("[DONE]").count(), 1, "{sse}");
    // The follow-up asked DeepSeek to go on from the text delivered.
    let seen = up.seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    let last = seen[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "assistant");
    assert_eq!(last["content"], "The sea is");
    assert_eq!(last["prefix"], true);
}
