//! [`Answer`]: the view of a complete answer that a validator judges, in either wire format,
//! and the validators most callers need ([`validate_json`], [`require_fields`]).
//!
//! A validator should not have to know whether the answer came from OpenAI's Chat Completions
//! or Anthropic's Messages: it wants the text the model wrote and, now and then, why it
//! stopped. So the response is parsed once into this view (the text, the finish reason read
//! by core's [`FinishReason::from_provider`], and the whole JSON value for anything else,
//! built only when asked for).

use std::borrow::Cow;
use std::cell::OnceCell;
use std::sync::Arc;

use seawall_core::FinishReason;
use serde_json::Value;

/// The wire formats whose answers are validated and repaired: core's
/// [`ChatWire`](seawall_core::ChatWire).
pub use seawall_core::ChatWire as Wire;

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
/// })
/// .to_string();
/// let answer = Answer::from_slice(Wire::OpenAiChat, body.as_bytes()).expect("a chat completion");
/// assert_eq!(answer.text(), r#"{"city": "Oslo"}"#);
/// assert_eq!(answer.finish_reason(), Some(&FinishReason::Stop));
/// assert_eq!(answer.text_as_json().unwrap()["city"], "Oslo");
/// assert_eq!(answer.json()["object"], "chat.completion");
/// ```
#[derive(Debug, Clone)]
pub struct Answer<'a> {
    wire: Wire,
    text: Cow<'a, str>,
    finish: Option<FinishReason>,
    tool_calls: bool,
    body: &'a [u8],
    /// The whole body as a JSON value, parsed only if a validator asks: building a value
    /// costs several times the typed read of the few fields above.
    json: OnceCell<Value>,
}

impl<'a> Answer<'a> {
    /// Reads an answer of `wire` from a response body; `None` when the body is not an answer
    /// of that format (not JSON, no `choices[0].message`, no Anthropic `content` array).
    ///
    /// The text is OpenAI's `choices[0].message.content` (a string, or the `text` of its
    /// parts), or the `text` of Anthropic's text blocks, joined.
    pub fn from_slice(wire: Wire, body: &'a [u8]) -> Option<Answer<'a>> {
        let (text, finish, tool_calls) = match wire {
            Wire::OpenAiChat => {
                let chat: shape::Chat<'a> = serde_json::from_slice(body).ok()?;
                let choice = chat.choices.into_iter().next()?;
                let m = choice.message;
                let tool_calls =
                    m.tool_calls.is_some_and(|c| !c.is_empty()) || m.function_call.is_some();
                (m.content.0, choice.finish_reason, tool_calls)
            }
            Wire::AnthropicMessages => {
                let message: shape::Message<'a> = serde_json::from_slice(body).ok()?;
                let tool_calls = message.content.iter().any(|b| b.kind == "tool_use");
                let mut texts = message
                    .content
                    .into_iter()
                    .filter(|b| b.kind == "text")
                    .filter_map(|b| b.text);
                // The usual answer is one text block: borrowed, not copied.
                let text = match (texts.next(), texts.next()) {
                    (None, _) => Cow::Borrowed(""),
                    (Some(one), None) => one,
                    (Some(a), Some(b)) => {
                        let mut joined = a.into_owned();
                        joined.push_str(&b);
                        texts.for_each(|t| joined.push_str(&t));
                        Cow::Owned(joined)
                    }
                };
                (text, message.stop_reason, tool_calls)
            }
        };
        Some(Answer {
            wire,
            text,
            finish: finish.map(|f| FinishReason::from_provider(&f)),
            tool_calls,
            body,
            json: OnceCell::new(),
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

    /// The whole response, as JSON, for anything the view does not name (parsed at the first
    /// call).
    pub fn json(&self) -> &Value {
        self.json
            .get_or_init(|| serde_json::from_slice(self.body).unwrap_or_default())
    }

    /// The response body, as the upstream sent it.
    pub fn body(&self) -> &[u8] {
        self.body
    }

    /// The text parsed as JSON, or the parser's complaint, worded for the model to read.
    pub fn text_as_json(&self) -> Result<Value, String> {
        serde_json::from_str(&self.text).map_err(|e| format!("the answer is not valid JSON: {e}"))
    }
}

/// The few fields of each format the view reads, borrowed from the body where the JSON
/// string has no escapes; everything else is skipped without being built.
mod shape {
    use std::borrow::Cow;
    use std::fmt;
    use std::marker::PhantomData;

    use serde::Deserialize;
    use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};

    #[derive(Deserialize)]
    pub(super) struct Chat<'a> {
        #[serde(borrow)]
        pub(super) choices: Vec<Choice<'a>>,
    }

    #[derive(Deserialize)]
    pub(super) struct Choice<'a> {
        #[serde(borrow)]
        pub(super) message: ChatMessage<'a>,
        #[serde(default, borrow)]
        pub(super) finish_reason: Option<Cow<'a, str>>,
    }

    #[derive(Deserialize)]
    pub(super) struct ChatMessage<'a> {
        #[serde(default, borrow)]
        pub(super) content: Content<'a>,
        #[serde(default)]
        pub(super) tool_calls: Option<Vec<IgnoredAny>>,
        #[serde(default)]
        pub(super) function_call: Option<IgnoredAny>,
    }

    /// OpenAI's `content`: a string, or an array of parts whose `text` is joined; anything
    /// else (`null`, a number, an object) is no text.
    #[derive(Default)]
    pub(super) struct Content<'a>(pub(super) Cow<'a, str>);

    impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
        fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(ContentVisitor(PhantomData))
        }
    }

    struct ContentVisitor<'a>(PhantomData<&'a ()>);

    impl<'de: 'a, 'a> Visitor<'de> for ContentVisitor<'a> {
        type Value = Content<'a>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("message content")
        }

        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Content<'a>, E> {
            Ok(Content(Cow::Borrowed(v)))
        }

        fn visit_str<E>(self, v: &str) -> Result<Content<'a>, E> {
            Ok(Content(Cow::Owned(v.to_owned())))
        }

        fn visit_string<E>(self, v: String) -> Result<Content<'a>, E> {
            Ok(Content(Cow::Owned(v)))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content<'a>, A::Error> {
            let mut out = String::new();
            while let Some(part) = seq.next_element::<Block<'de>>()? {
                if part.kind == "text" {
                    out.push_str(part.text.as_deref().unwrap_or(""));
                }
            }
            Ok(Content(Cow::Owned(out)))
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Content<'a>, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(Content::default())
        }

        fn visit_unit<E>(self) -> Result<Content<'a>, E> {
            Ok(Content::default())
        }

        fn visit_none<E>(self) -> Result<Content<'a>, E> {
            Ok(Content::default())
        }

        fn visit_bool<E>(self, _: bool) -> Result<Content<'a>, E> {
            Ok(Content::default())
        }

        fn visit_i64<E>(self, _: i64) -> Result<Content<'a>, E> {
            Ok(Content::default())
        }

        fn visit_u64<E>(self, _: u64) -> Result<Content<'a>, E> {
            Ok(Content::default())
        }

        fn visit_f64<E>(self, _: f64) -> Result<Content<'a>, E> {
            Ok(Content::default())
        }
    }

    #[derive(Deserialize)]
    pub(super) struct Message<'a> {
        #[serde(borrow)]
        pub(super) content: Vec<Block<'a>>,
        #[serde(default, borrow)]
        pub(super) stop_reason: Option<Cow<'a, str>>,
    }

    /// An Anthropic content block, or an OpenAI content part: its type, and its text.
    #[derive(Deserialize)]
    pub(super) struct Block<'a> {
        #[serde(rename = "type", borrow)]
        pub(super) kind: Cow<'a, str>,
        #[serde(default, borrow)]
        pub(super) text: Option<Cow<'a, str>>,
    }
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
/// let body = r#"{"content": [{"type": "text", "text": "Sure! {\"a\": 1}"}],
///                "stop_reason": "end_turn"}"#;
/// let answer = Answer::from_slice(Wire::AnthropicMessages, body.as_bytes()).unwrap();
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
/// let body = r#"{"choices": [{"finish_reason": "stop",
///     "message": {"role": "assistant", "content": "{\"city\": \"Oslo\"}"}}]}"#;
/// let answer = Answer::from_slice(Wire::OpenAiChat, body.as_bytes()).unwrap();
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
        let bytes = body.to_string();
        let a = Answer::from_slice(Wire::AnthropicMessages, bytes.as_bytes()).unwrap();
        assert_eq!(a.text(), r#"{"a": 1}"#);
        assert_eq!(a.finish_reason(), Some(&FinishReason::Stop));
        assert!(!a.has_tool_calls());
    }

    #[test]
    fn openai_content_may_be_parts_escaped_or_not_text() {
        let parts = json!({"choices": [{"message": {"content": [
            {"type": "text", "text": "{\"a\":"}, {"type": "image_url", "image_url": {}},
            {"type": "text", "text": " 1}"}]}}]});
        let bytes = parts.to_string();
        let a = Answer::from_slice(Wire::OpenAiChat, bytes.as_bytes()).unwrap();
        assert_eq!(a.text(), r#"{"a": 1}"#);
        assert_eq!(
            a.json()["choices"][0]["message"]["content"][1]["type"],
            "image_url"
        );
        let escaped = br#"{"choices": [{"message": {"content": "line\nnext \u00e9"}}]}"#;
        let a = Answer::from_slice(Wire::OpenAiChat, escaped).unwrap();
        assert_eq!(a.text(), "line\nnext \u{e9}");
        for content in ["42", "null", "{}", "true", "1.5"] {
            let body = format!(r#"{{"choices": [{{"message": {{"content": {content}}}}}]}}"#);
            let a = Answer::from_slice(Wire::OpenAiChat, body.as_bytes()).unwrap();
            assert_eq!(a.text(), "", "{content}");
        }
    }

    #[test]
    fn tool_calls_are_seen_in_both_formats() {
        let openai = json!({"choices": [{"finish_reason": "tool_calls", "message":
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1"}]}}]});
        assert!(
            Answer::from_slice(Wire::OpenAiChat, openai.to_string().as_bytes())
                .unwrap()
                .has_tool_calls()
        );
        let anthropic = json!({"content": [{"type": "tool_use", "id": "t", "name": "f",
            "input": {}}], "stop_reason": "tool_use"});
        assert!(
            Answer::from_slice(Wire::AnthropicMessages, anthropic.to_string().as_bytes())
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
            assert!(
                Answer::from_slice(wire, body.to_string().as_bytes()).is_none(),
                "{body}"
            );
        }
    }

    #[test]
    fn require_fields_names_every_missing_field() {
        let body = json!({"choices": [{"message": {"content": "{\"a\": null}"}}]});
        let bytes = body.to_string();
        let a = Answer::from_slice(Wire::OpenAiChat, bytes.as_bytes()).unwrap();
        assert_eq!(
            require_fields(&["a", "b", "c"])(&a).unwrap_err(),
            "the JSON object is missing the fields `b`, `c`"
        );
        assert!(require_fields(&["a"])(&a).is_ok());
        let list = json!({"choices": [{"message": {"content": "[1]"}}]});
        let bytes = list.to_string();
        let a = Answer::from_slice(Wire::OpenAiChat, bytes.as_bytes()).unwrap();
        assert_eq!(
            require_fields(&["a"])(&a).unwrap_err(),
            "the answer must be a JSON object"
        );
    }
}
