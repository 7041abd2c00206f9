//! [`Answer`]: the view of a complete answer that a validator judges, in either wire format,
//! and the validators most callers need ([`validate_json`], [`require_fields`]).
//!
//! A validator should not have to know whether the answer came from OpenAI's Chat Completions
//! or Anthropic's Messages: it wants the text the model wrote and, now and then, why it
//! stopped. So the response is parsed once into this view (the text, the finish reason read
//! by core's [`FinishReason::from_provider`], and the whole JSON value for anything else).

use std::borrow::Cow;
use std::sync::Arc;

use http::Request;
use seawall_core::{FinishReason, Provider};
use serde_json::Value;

/// The wire formats whose answers are validated and repaired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wire {
    /// OpenAI Chat Completions (`.../chat/completions`; Azure and compatible servers too).
    OpenAiChat,
    /// Anthropic Messages (`.../messages`).
    AnthropicMessages,
}

impl Wire {
    /// The wire format of a request, from its path and headers (core's
    /// [`Provider::detect`]); `None` for any other API (Responses, embeddings, ...).
    pub fn of<B>(req: &Request<B>) -> Option<Wire> {
        let path = req.uri().path().trim_end_matches('/');
        match Provider::detect(req.uri(), req.headers()) {
            Provider::OpenAi if path.ends_with("/chat/completions") => Some(Wire::OpenAiChat),
            Provider::Anthropic if path.ends_with("/messages") => Some(Wire::AnthropicMessages),
            _ => None,
        }
    }
}

/// A complete, non-streamed answer, as a validator sees it.
///
/// ```
/// use seawall_repair::{Answer, Wire};
/// use seawall_core::FinishReason;
///
/// let body = serde_json::json!({
///     "id": "chatcmpl-1", "object": "chat.completion",
///     "choices": [{"index": 0, "finish_reason": "stop",
///                  "message": {"role": "assistant", "content": "{\"city\": \"Oslo\"}"}}]
/// });
/// let answer = Answer::new(Wire::OpenAiChat, &body).expect("a chat completion");
/// assert_eq!(answer.text(), r#"{"city": "Oslo"}"#);
/// assert_eq!(answer.finish_reason(), Some(&FinishReason::Stop));
/// assert_eq!(answer.text_as_json().unwrap()["city"], "Oslo");
/// ```
#[derive(Debug, Clone)]
pub struct Answer<'a> {
    wire: Wire,
    text: Cow<'a, str>,
    finish: Option<FinishReason>,
    tool_calls: bool,
    json: &'a Value,
}

impl<'a> Answer<'a> {
    /// Reads an answer of `wire` from the response's JSON; `None` when the value is not an
    /// answer of that format (no `choices[0].message`, no Anthropic `content` array).
    ///
    /// The text is OpenAI's `choices[0].message.content` (a string, or the `text` of its
    /// parts), or the `text` of Anthropic's text blocks, joined.
    pub fn new(wire: Wire, json: &'a Value) -> Option<Answer<'a>> {
        let (text, finish, tool_calls) = match wire {
            Wire::OpenAiChat => {
                let choice = json.get("choices")?.get(0)?;
                let message = choice.get("message")?.as_object()?;
                let text = match message.get("content") {
                    Some(Value::String(s)) => Cow::Borrowed(s.as_str()),
                    Some(Value::Array(parts)) => Cow::Owned(join_text(parts, "text")),
                    _ => Cow::Borrowed(""),
                };
                let tool_calls = message
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .is_some_and(|c| !c.is_empty())
                    || message.get("function_call").is_some_and(Value::is_object);
                (text, choice.get("finish_reason"), tool_calls)
            }
            Wire::AnthropicMessages => {
                let blocks = json.get("content")?.as_array()?;
                let text = match blocks.as_slice() {
                    // The usual answer: one text block, borrowed.
                    [one] if one["type"] == "text" => {
                        Cow::Borrowed(one["text"].as_str().unwrap_or(""))
                    }
                    _ => Cow::Owned(join_text(blocks, "text")),
                };
                let tool_calls = blocks.iter().any(|b| b["type"] == "tool_use");
                (text, json.get("stop_reason"), tool_calls)
            }
        };
        Some(Answer {
            wire,
            text,
            finish: finish
                .and_then(Value::as_str)
                .map(FinishReason::from_provider),
            tool_calls,
            json,
        })
    }

    /// The wire format the answer came in.
    pub fn wire(&self) -> Wire {
        self.wire
    }

    /// The text the model wrote (empty when it wrote none).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Why the answer stopped, if the upstream said.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.finish.as_ref()
    }

    /// Whether the answer calls tools (OpenAI `tool_calls`, Anthropic `tool_use` blocks).
    /// Such answers are passed through without validation: a turn after a tool call must
    /// carry the tool's result, which only the caller has.
    pub fn has_tool_calls(&self) -> bool {
        self.tool_calls || self.finish == Some(FinishReason::ToolCalls)
    }

    /// The whole response, as JSON, for anything the view does not name.
    pub fn json(&self) -> &Value {
        self.json
    }

    /// The text parsed as JSON, or the parser's complaint, worded for the model to read.
    pub fn text_as_json(&self) -> Result<Value, String> {
        serde_json::from_str(&self.text).map_err(|e| format!("the answer is not valid JSON: {e}"))
    }
}

fn join_text(parts: &[Value], kind: &str) -> String {
    let mut out = String::new();
    for part in parts {
        if part["type"] == kind {
            if let Some(t) = part["text"].as_str() {
                out.push_str(t);
            }
        }
    }
    out
}

/// What a validator is: it reads an [`Answer`] and says what is wrong with it, in words the
/// model will read in the repair turn.
pub(crate) type Validator = Arc<dyn Fn(&Answer<'_>) -> Result<(), String> + Send + Sync>;

/// A validator that accepts an answer whose text parses as JSON (whole: no prose or Markdown
/// fence around it).
///
/// ```
/// use seawall_repair::{Answer, Wire, validate_json};
///
/// let check = validate_json();
/// let body = serde_json::json!({"content": [{"type": "text", "text": "Sure! {\"a\": 1}"}],
///                               "stop_reason": "end_turn"});
/// let answer = Answer::new(Wire::AnthropicMessages, &body).unwrap();
/// assert!(check(&answer).unwrap_err().starts_with("the answer is not valid JSON"));
/// ```
pub fn validate_json() -> impl Fn(&Answer<'_>) -> Result<(), String> + Clone + Send + Sync + 'static
{
    |answer: &Answer<'_>| answer.text_as_json().map(drop)
}

/// A validator that accepts an answer whose text is a JSON object with every one of `fields`
/// (at its top level; `null` counts as present).
///
/// ```
/// use seawall_repair::{Answer, Wire, require_fields};
///
/// let check = require_fields(&["city", "country"]);
/// let body = serde_json::json!({"choices": [{"finish_reason": "stop",
///     "message": {"role": "assistant", "content": "{\"city\": \"Oslo\"}"}}]});
/// let answer = Answer::new(Wire::OpenAiChat, &body).unwrap();
/// assert_eq!(
///     check(&answer).unwrap_err(),
///     "the JSON object is missing the field `country`"
/// );
/// ```
pub fn require_fields(
    fields: &[&str],
) -> impl Fn(&Answer<'_>) -> Result<(), String> + Clone + Send + Sync + 'static {
    let fields: Arc<[Box<str>]> = fields.iter().map(|f| Box::from(*f)).collect();
    move |answer: &Answer<'_>| {
        let value = answer.text_as_json()?;
        let Some(object) = value.as_object() else {
            return Err("the answer must be a JSON object".to_owned());
        };
        let missing: Vec<&str> = fields
            .iter()
            .map(|f| &**f)
            .filter(|f| !object.contains_key(*f))
            .collect();
        match missing.as_slice() {
            [] => Ok(()),
            [one] => Err(format!("the JSON object is missing the field `{one}`")),
            many => Err(format!(
                "the JSON object is missing the fields {}",
                many.iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn anthropic_text_blocks_are_joined_and_thinking_is_left_out() {
        let body = json!({"content": [
            {"type": "thinking", "thinking": "hmm", "signature": "x"},
            {"type": "text", "text": "{\"a\""},
            {"type": "text", "text": ": 1}"}
        ], "stop_reason": "end_turn"});
        let a = Answer::new(Wire::AnthropicMessages, &body).unwrap();
        assert_eq!(a.text(), r#"{"a": 1}"#);
        assert_eq!(a.finish_reason(), Some(&FinishReason::Stop));
        assert!(!a.has_tool_calls());
    }

    #[test]
    fn tool_calls_are_seen_in_both_formats() {
        let openai = json!({"choices": [{"finish_reason": "tool_calls", "message":
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1"}]}}]});
        assert!(
            Answer::new(Wire::OpenAiChat, &openai)
                .unwrap()
                .has_tool_calls()
        );
        let anthropic = json!({"content": [{"type": "tool_use", "id": "t", "name": "f",
            "input": {}}], "stop_reason": "tool_use"});
        assert!(
            Answer::new(Wire::AnthropicMessages, &anthropic)
                .unwrap()
                .has_tool_calls()
        );
    }

    #[test]
    fn other_shapes_are_not_answers() {
        for (wire, body) in [
            (Wire::OpenAiChat, json!({"choices": []})),
            (Wire::OpenAiChat, json!({"error": {"message": "x"}})),
            (Wire::OpenAiChat, json!([1, 2])),
            (Wire::AnthropicMessages, json!({"type": "error"})),
            (Wire::AnthropicMessages, json!("text")),
        ] {
            assert!(Answer::new(wire, &body).is_none(), "{body}");
        }
    }

    #[test]
    fn require_fields_names_every_missing_field() {
        let body = json!({"choices": [{"message": {"content": "{\"a\": null}"}}]});
        let a = Answer::new(Wire::OpenAiChat, &body).unwrap();
        assert_eq!(
            require_fields(&["a", "b", "c"])(&a).unwrap_err(),
            "the JSON object is missing the fields `b`, `c`"
        );
        assert!(require_fields(&["a"])(&a).is_ok());
        let list = json!({"choices": [{"message": {"content": "[1]"}}]});
        let a = Answer::new(Wire::OpenAiChat, &list).unwrap();
        assert_eq!(
            require_fields(&["a"])(&a).unwrap_err(),
            "the answer must be a JSON object"
        );
    }
}
