//! Rewriting a request body so that it fits: dropping the oldest conversation turns, or
//! lowering the output bound.
//!
//! What may go, in OpenAI's Chat Completions and Anthropic's Messages formats alike:
//!
//! - A **turn** starts at a user message that answers no tool call (OpenAI: any `user`
//!   message; Anthropic: a `user` message with no `tool_result` block) and runs to the next
//!   one. So an assistant's tool calls and their results (OpenAI `tool` / `function`
//!   messages; Anthropic `tool_result` blocks in the next user message) are always in the
//!   same turn, and go together; and an Anthropic conversation still starts with a user
//!   message after a trim.
//! - Messages before the first turn (an assistant's greeting, say) are one more turn, the
//!   oldest.
//! - **System prompts stay**: `system` and `developer` messages wherever they are (OpenAI),
//!   and Anthropic's top-level `system`, which is not a message at all.
//! - **The last turn stays**: the last user message that starts a turn, and everything after
//!   it (the tool calls and results of an agent loop still running).
//!
//! Turns go oldest first, as few as make the request fit: since dropping a turn never raises
//! the count, the fewest are found by bisection, each candidate counted by the guard's
//! estimator, and the answer is a candidate that was counted and fits.

use bytes::Bytes;
use http::Request;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

/// The fields that bound the output; upstreams differ in which they read, so all present are
/// rewritten.
const OUTPUT_FIELDS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];

fn role(m: &Value) -> Option<&str> {
    m.get("role").and_then(Value::as_str)
}

/// A system prompt inside `messages` (OpenAI's `system` and `developer` roles).
pub(crate) fn is_system(m: &Value) -> bool {
    matches!(role(m), Some("system" | "developer"))
}

/// A user message that starts a turn: one that carries no tool results.
pub(crate) fn starts_turn(m: &Value) -> bool {
    if role(m) != Some("user") {
        return false;
    }
    match m.get("content") {
        Some(Value::Array(blocks)) => !blocks
            .iter()
            .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result")),
        _ => true,
    }
}

/// Where each turn that may be dropped ends, oldest first: dropping the first `k` turns keeps
/// the messages from `ends[k - 1]` on, and every system message before it.
pub(crate) fn turn_ends(messages: &[Value]) -> Vec<usize> {
    let starts: Vec<usize> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| starts_turn(m))
        .map(|(i, _)| i)
        .collect();
    let Some(&first) = starts.first() else {
        // No user message: no turn to keep apart from the rest, so nothing may go.
        return Vec::new();
    };
    let mut ends = Vec::with_capacity(starts.len());
    // Messages before the first turn, unless they are all system prompts.
    if messages[..first].iter().any(|m| !is_system(m)) {
        ends.push(first);
    }
    ends.extend_from_slice(&starts[1..]);
    ends
}

/// The messages kept when everything before `from` but the system prompts is dropped.
pub(crate) fn kept(messages: &[Value], from: usize) -> impl Iterator<Item = &Value> {
    messages
        .iter()
        .enumerate()
        .filter(move |(i, m)| *i >= from || is_system(m))
        .map(|(_, m)| m)
}

/// A body with its messages cut, serialized without copying the rest.
struct Cut<'a> {
    body: &'a Map<String, Value>,
    messages: &'a [Value],
    from: usize,
}

struct Kept<'a>(&'a [Value], usize);

impl Serialize for Kept<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(kept(self.0, self.1))
    }
}

impl Serialize for Cut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.body.len()))?;
        for (k, v) in self.body {
            if k == "messages" {
                map.serialize_entry(k, &Kept(self.messages, self.from))?;
            } else {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}

/// The body as a JSON object, if it is one.
fn object(req: &Request<Bytes>) -> Option<Map<String, Value>> {
    match serde_json::from_slice(req.body()) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    }
}

/// Drops the fewest oldest turns that make `fits` true of the request, and returns how many
/// were dropped; `None` (and the request unchanged) when even dropping every turn but the last
/// is not enough, or the body has no `messages` array to trim.
///
/// `fits` is asked about candidate requests (same method, URI and headers; the new body;
/// prepared), and must not get larger answers as turns are dropped.
pub(crate) fn trim_oldest(
    req: &mut Request<Bytes>,
    mut fits: impl FnMut(&Request<Bytes>) -> bool,
) -> Option<u32> {
    let body = object(req)?;
    let Some(Value::Array(messages)) = body.get("messages") else {
        return None;
    };
    let ends = turn_ends(messages);
    let most = ends.len();
    if most == 0 {
        return None;
    }
    let candidate = |k: usize| -> Option<Request<Bytes>> {
        let from = if k == 0 { 0 } else { ends[k - 1] };
        let bytes = serde_json::to_vec(&Cut {
            body: &body,
            messages,
            from,
        })
        .ok()?;
        let mut c = Request::new(Bytes::from(bytes));
        *c.method_mut() = req.method().clone();
        *c.uri_mut() = req.uri().clone();
        *c.headers_mut() = req.headers().clone();
        seawall_core::LlmRequest::prepare(&mut c);
        Some(c)
    };
    // The most that may go; if that does not fit, nothing will.
    let mut best = candidate(most)?;
    if !fits(&best) {
        return None;
    }
    // Invariant: dropping `lo` turns does not fit (none dropped: the caller found it too
    // long), dropping `hi` does, and `best` is that candidate.
    let (mut lo, mut hi) = (0, most);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let c = candidate(mid)?;
        if fits(&c) {
            (hi, best) = (mid, c);
        } else {
            lo = mid;
        }
    }
    replace_body(req, best.into_body());
    Some(u32::try_from(hi).unwrap_or(u32::MAX))
}

/// Sets every output-bound field the body has to `to`; `false` (and the request unchanged)
/// when the body cannot be rewritten.
pub(crate) fn lower_max_tokens(req: &mut Request<Bytes>, to: u32) -> bool {
    let Some(mut body) = object(req) else {
        return false;
    };
    for field in OUTPUT_FIELDS {
        if let Some(v) = body.get_mut(field) {
            *v = Value::from(to);
        }
    }
    match serde_json::to_vec(&body) {
        Ok(bytes) => {
            replace_body(req, Bytes::from(bytes));
            true
        }
        Err(_) => false,
    }
}

/// Puts a new body in, fixes a `Content-Length`, and parses the body's facts again (the
/// cached `RequestMeta` described the old one).
fn replace_body(req: &mut Request<Bytes>, body: Bytes) {
    let len = body.len();
    *req.body_mut() = body;
    if req.headers().contains_key(http::header::CONTENT_LENGTH) {
        req.headers_mut()
            .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
    }
    req.extensions_mut().remove::<seawall_core::RequestMeta>();
    seawall_core::LlmRequest::prepare(req);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn roles(messages: &[Value], from: usize) -> Vec<&str> {
        kept(messages, from)
            .map(|m| role(m).unwrap_or("?"))
            .collect()
    }

    #[test]
    fn openai_turns_keep_tool_calls_with_their_results() {
        let m = json!([
            {"role": "system", "content": "s"},
            {"role": "user", "content": "a"},
            {"role": "assistant", "tool_calls": [{"id": "1"}]},
            {"role": "tool", "tool_call_id": "1", "content": "r"},
            {"role": "assistant", "content": "b"},
            {"role": "developer", "content": "d"},
            {"role": "user", "content": "c"},
            {"role": "assistant", "content": "e"},
            {"role": "user", "content": "f"},
            {"role": "assistant", "tool_calls": [{"id": "2"}]},
            {"role": "tool", "tool_call_id": "2", "content": "r2"},
        ]);
        let m = m.as_array().unwrap();
        let ends = turn_ends(m);
        assert_eq!(ends, vec![6, 8]);
        assert_eq!(
            roles(m, ends[0]),
            [
                "system",
                "developer",
                "user",
                "assistant",
                "user",
                "assistant",
                "tool"
            ]
        );
        assert_eq!(
            roles(m, ends[1]),
            ["system", "developer", "user", "assistant", "tool"]
        );
    }

    #[test]
    fn anthropic_tool_results_do_not_start_a_turn() {
        let m = json!([
            {"role": "assistant", "content": "hello, how can I help?"},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": [{"type": "text", "text": "c"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "u"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u"}]},
        ]);
        let m = m.as_array().unwrap();
        // The greeting, then the first user turn; the last turn (from index 5) stays.
        assert_eq!(turn_ends(m), vec![1, 5]);
    }

    #[test]
    fn without_a_user_message_or_with_only_the_last_turn_nothing_may_go() {
        let only_system =
            json!([{"role": "system", "content": "s"}, {"role": "assistant", "content": "x"}]);
        assert!(turn_ends(only_system.as_array().unwrap()).is_empty());
        let last_only =
            json!([{"role": "system", "content": "s"}, {"role": "user", "content": "x"}]);
        assert!(turn_ends(last_only.as_array().unwrap()).is_empty());
    }

    #[test]
    fn lowering_rewrites_every_output_field_present_and_refreshes_the_facts() {
        use seawall_core::LlmRequest;
        let mut r = Request::post("http://h/v1/chat/completions")
            .header("content-length", "0")
            .body(Bytes::from_static(
                br#"{"model":"m","max_tokens":"9000","max_completion_tokens":8000,"messages":[]}"#,
            ))
            .unwrap();
        r.prepare();
        assert_eq!(r.max_output_tokens(), Some(9000));
        assert!(lower_max_tokens(&mut r, 100));
        assert_eq!(r.max_output_tokens(), Some(100));
        let body: Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(
            (
                body["max_tokens"].as_u64(),
                body["max_completion_tokens"].as_u64()
            ),
            (Some(100), Some(100))
        );
        assert!(body.get("max_output_tokens").is_none());
        assert_eq!(
            r.headers()["content-length"],
            r.body().len().to_string().as_str()
        );
        let mut not_json = Request::new(Bytes::from_static(b"\xff"));
        assert!(!lower_max_tokens(&mut not_json, 1));
    }
}
