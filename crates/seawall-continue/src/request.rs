//! The follow-up request: the original request with the partial answer as the assistant's
//! last turn, in the style the upstream understands.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request};
use seawall_core::{CallContext, KeptRequest, LlmRequest, RequestMeta, RequestSizes};
use serde_json::{Map, Value};

use crate::layer::{Config, ContinuationStyle};
use crate::trim::Trim;

/// Which API a request speaks (only these two are continued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    OpenAi,
    Anthropic,
}

impl Wire {
    /// The wire of a request the layer may continue: a `POST` to Chat Completions or to
    /// Messages asking for one answer (`sizes`: the request's, as `prepared` read them).
    pub(crate) fn of(req: &Request<Bytes>, sizes: &RequestSizes) -> Option<Wire> {
        if req.method() != Method::POST || sizes.choices > 1 {
            return None;
        }
        let path = req.uri().path();
        if path.ends_with("/chat/completions") {
            Some(Wire::OpenAi)
        } else if path.ends_with("/messages") {
            Some(Wire::Anthropic)
        } else {
            None
        }
    }
}

/// What a follow-up request is built from: a copy of the original request.
///
/// Kept as core's [`KeptRequest`], which holds the parts without allocating and rebuilds the
/// request only when a follow-up is made: nearly every answer needs none, and a clone of the
/// header and extension maps was a handful of allocations on every call.
pub(crate) struct Template {
    kept: KeptRequest<Request<Bytes>>,
    pub(crate) wire: Wire,
    pub(crate) style: ContinuationStyle,
    /// The prompt's estimated tokens, for the usage of an attempt cut before its usage.
    pub(crate) estimated_input: u64,
}

impl std::fmt::Debug for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Headers carry credentials: never printed.
        f.debug_struct("Template")
            .field("wire", &self.wire)
            .field("style", &self.style)
            .finish_non_exhaustive()
    }
}

impl Template {
    pub(crate) fn of(
        req: &Request<Bytes>,
        sizes: &RequestSizes,
        wire: Wire,
        config: &Config,
    ) -> Template {
        let style = match wire {
            Wire::Anthropic => ContinuationStyle::Prefill,
            Wire::OpenAi => config.openai_style,
        };
        Template {
            kept: req.keep(),
            wire,
            style,
            estimated_input: u64::from(sizes.estimated_input_tokens),
        }
    }

    /// The call's context, which the kept request holds (the layer keeps no copy of its own:
    /// a copy is an atomic write, and its drop another).
    pub(crate) fn call_context(&self) -> Option<&Arc<CallContext>> {
        self.kept.call_context()
    }

    /// The original request again, for a restart.
    pub(crate) fn original(&self) -> Request<Bytes> {
        self.kept.get()
    }

    /// The follow-up request for `partial` (the answer's text so far), and how to trim the
    /// start of its answer; `None` when the original body cannot carry one (not a JSON
    /// object with `messages`, or nothing left to prefill).
    pub(crate) fn follow_up(
        &self,
        partial: &str,
        instruction: &str,
    ) -> Option<(Request<Bytes>, Trim)> {
        let original = self.kept.get();
        let mut body: Value = serde_json::from_slice(original.body()).ok()?;
        let map = body.as_object_mut()?;
        let messages = map.get_mut("messages")?.as_array_mut()?;
        let trim = match self.style {
            ContinuationStyle::Instruction => {
                messages.push(text_turn("assistant", partial));
                messages.push(text_turn("user", instruction));
                Trim::overlap(partial)
            }
            style => {
                let last_is_ours = messages
                    .last()
                    .and_then(|m| m.get("role"))
                    .and_then(Value::as_str)
                    == Some("assistant");
                if !last_is_ours {
                    messages.push(text_turn("assistant", ""));
                }
                let turn = messages.last_mut()?.as_object_mut()?;
                // The caller's own prefill, if any, comes first: the answer continued it.
                let mut text = existing_text(turn)?;
                text.push_str(partial);
                let mut trim = Trim::None;
                if self.wire == Wire::Anthropic {
                    let kept = text.trim_end().len();
                    if kept == 0 {
                        return None;
                    }
                    trim = Trim::exact(&text[kept..]);
                    text.truncate(kept);
                }
                turn.insert("content".into(), Value::from(text));
                match style {
                    ContinuationStyle::Prefix => {
                        turn.insert("prefix".into(), Value::Bool(true));
                    }
                    ContinuationStyle::ContinueFinalMessage => {
                        map.insert("continue_final_message".into(), Value::Bool(true));
                        map.insert("add_generation_prompt".into(), Value::Bool(false));
                    }
                    _ => {}
                }
                trim
            }
        };
        let bytes = Bytes::from(serde_json::to_vec(&body).ok()?);
        let (parts, _) = original.into_parts();
        let mut req = Request::from_parts(parts, bytes);
        if req.headers().contains_key(http::header::CONTENT_LENGTH) {
            let len = http::HeaderValue::from(req.body().len());
            req.headers_mut().insert(http::header::CONTENT_LENGTH, len);
        }
        // The body changed: what was parsed from the old one is parsed again.
        req.extensions_mut().remove::<RequestMeta>();
        req.prepare();
        Some((req, trim))
    }
}

fn text_turn(role: &str, text: &str) -> Value {
    let mut m = Map::new();
    m.insert("role".into(), Value::from(role));
    m.insert("content".into(), Value::from(text));
    Value::Object(m)
}

/// The text of an assistant turn: its `content` string, or its text blocks joined; `None`
/// when it holds anything else (an image, a tool call), which a prefill cannot extend.
fn existing_text(turn: &Map<String, Value>) -> Option<String> {
    match turn.get("content") {
        None | Some(Value::Null) => Some(String::new()),
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(blocks)) => blocks.iter().try_fold(String::new(), |mut acc, b| {
            (b.get("type").and_then(Value::as_str) == Some("text")).then_some(())?;
            acc.push_str(b.get("text")?.as_str()?);
            Some(acc)
        }),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::ContinueLayer;
    use serde_json::json;

    fn template(uri: &str, body: Value) -> Template {
        let mut req = Request::post(uri)
            .header("content-length", "1")
            .body(Bytes::from(body.to_string()))
            .unwrap();
        let sizes = req.prepared().sizes;
        let wire = Wire::of(&req, &sizes).unwrap();
        Template::of(&req, &sizes, wire, ContinueLayer::new().config())
    }

    fn body(req: &Request<Bytes>) -> Value {
        serde_json::from_slice(req.body()).unwrap()
    }

    #[test]
    fn an_anthropic_prefill_never_ends_in_whitespace() {
        let t = template(
            "http://x/v1/messages",
            json!({"model": "c", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}),
        );
        let (req, trim) = t.follow_up("the storm \n", "go on").unwrap();
        let b = body(&req);
        assert_eq!(
            b["messages"][1],
            json!({"role": "assistant", "content": "the storm"})
        );
        assert_eq!(trim, Trim::Exact(" \n".into()));
        assert_eq!(
            req.headers()["content-length"],
            req.body().len().to_string().as_str()
        );
        // Nothing but whitespace: no prefill is possible.
        assert!(t.follow_up("  ", "go on").is_none());
    }

    #[test]
    fn the_callers_own_prefill_is_extended() {
        let t = template(
            "http://x/v1/messages",
            json!({"model": "c", "max_tokens": 9, "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "Dear"}]}]}),
        );
        let (req, _) = t.follow_up(" Sir", "go on").unwrap();
        assert_eq!(body(&req)["messages"][1]["content"], "Dear Sir");
        assert_eq!(body(&req)["messages"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn the_default_follow_up_adds_about_forty_tokens_beside_the_text_so_far() {
        // Every resumed stream pays for what a follow-up adds to the prompt, as input: the
        // text so far, and around it the two turns with their roles and the instruction.
        let t = template(
            "http://x/v1/chat/completions",
            json!({"model": "m", "max_tokens": 9, "messages": [
                {"role": "user", "content": "Tell me about the harbor."}]}),
        );
        let partial = "the storm passes over a quiet harbor and every wave ";
        let (req, _) = t
            .follow_up(partial, crate::layer::DEFAULT_INSTRUCTION)
            .unwrap();
        let added = u64::from(req.estimated_input_tokens()) - t.estimated_input;
        let text = partial.len().div_ceil(4) as u64;
        assert!((text + 36..=text + 40).contains(&added), "{added}");
    }

    #[test]
    fn a_body_without_messages_cannot_be_continued() {
        let t = template(
            "http://x/v1/chat/completions",
            json!({"model": "m", "prompt": "x"}),
        );
        assert!(t.follow_up("abc", "go on").is_none());
    }
}
