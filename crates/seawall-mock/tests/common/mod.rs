//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use seawall_mock::{MockBody, MockError, MockUpstream, Profile};
use serde_json::{Value, json};
use tokio::time::Instant;

/// 2023-11-14T22:13:20Z.
pub const EPOCH_SECS: u64 = 1_700_000_000;

pub fn upstream(profile: Profile) -> MockUpstream {
    MockUpstream::with_epoch(profile, UNIX_EPOCH + Duration::from_secs(EPOCH_SECS))
}

pub fn openai_body(stream: bool) -> Value {
    json!({"model": "gpt-4o-mini", "stream": stream,
           "messages": [{"role": "user", "content": "Tell me about the sea"}]})
}

pub fn anthropic_body(stream: bool) -> Value {
    json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": stream,
           "messages": [{"role": "user", "content": "Tell me about the sea"}]})
}

pub fn openai_req(body: &Value, key: &str) -> Request<Bytes> {
    Request::post("http://mock/v1/chat/completions")
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

pub fn anthropic_req(body: &Value, key: &str) -> Request<Bytes> {
    Request::post("http://mock/v1/messages")
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

pub async fn call(up: &MockUpstream, req: Request<Bytes>) -> Response<MockBody> {
    match up.respond(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

pub async fn text(resp: Response<MockBody>) -> String {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

pub async fn json_body(resp: Response<MockBody>) -> Value {
    serde_json::from_str(&text(resp).await).unwrap()
}

/// Every frame with the virtual time it arrived at (from `t0`), and the body error if any.
pub async fn frames(
    resp: Response<MockBody>,
    t0: Instant,
) -> (Vec<(Duration, String)>, Option<MockError>) {
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                let data = f.into_data().unwrap();
                out.push((t0.elapsed(), String::from_utf8(data.to_vec()).unwrap()));
            }
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

/// One SSE event: its `event:` name (if any) and `data:` payload (if any); comments and
/// blank keep-alives come out as events with neither.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub event: Option<String>,
    pub data: Option<String>,
    pub comment: bool,
}

impl Event {
    pub fn json(&self) -> Value {
        serde_json::from_str(self.data.as_deref().unwrap()).unwrap()
    }

    /// The text of an OpenAI chunk's delta.
    pub fn openai_text(&self) -> String {
        self.json()["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    pub fn is_content(&self) -> bool {
        let Some(d) = self.data.as_deref() else {
            return false;
        };
        if d == "[DONE]" {
            return false;
        }
        let v: Value = serde_json::from_str(d).unwrap();
        let openai = v["choices"][0]["delta"]["content"]
            .as_str()
            .is_some_and(|s| !s.is_empty());
        openai || v["type"] == "content_block_delta"
    }
}

/// Splits an SSE text into events (blocks separated by blank lines; a lone blank line is a
/// keep-alive of its own).
pub fn events(sse: &str) -> Vec<Event> {
    let mut out = Vec::new();
    let mut cur = Event {
        event: None,
        data: None,
        comment: false,
    };
    let mut any = false;
    for line in sse.split('\n') {
        if line.is_empty() {
            if any {
                out.push(cur.clone());
            }
            cur = Event {
                event: None,
                data: None,
                comment: false,
            };
            any = false;
        } else if let Some(c) = line.strip_prefix(':') {
            let _ = c;
            cur.comment = true;
            any = true;
        } else if let Some(e) = line.strip_prefix("event: ") {
            cur.event = Some(e.to_owned());
            any = true;
        } else if let Some(d) = line.strip_prefix("data: ") {
            cur.data = Some(d.to_owned());
            any = true;
        } else {
            panic!("not SSE: {line:?}");
        }
    }
    out
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
