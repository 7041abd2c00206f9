//! The byte scans of the hot paths: a whole JSON answer read for its [`Facts`] without serde's
//! derive (a call per token through its layers, for fields nobody reads), and each SSE event
//! laid out flat on a [`JsonTape`](seawall_core::json_scan::JsonTape) and read through a [`View`] of it instead of a `serde_json::Value` (an allocation per
//! string, array and object of every chunk).
//!
//! A scan never decides alone. It reads only what it is sure serde reads the same way (on
//! [`JsonCursor`], which refuses escaped member names, surrogate escapes, doubtful numbers and
//! deep nesting), and answers `None` on anything else: an error object, a repeated field, a
//! value of an unexpected type, damage. The serde path then reads the input and decides, as
//! it always has. The tests below hold the two to the same result on generated and damaged
//! inputs.

use std::borrow::Cow;

use serde_json::Value;

use seawall_core::ReportedUsage;
use seawall_core::json_scan::{JsonCursor, JsonKind, JsonNode, Seen};

use super::json::Facts;

use crate::error_body::ProviderError;

/// A JSON value as the SSE parser reads it: the few `serde_json::Value` accessors it uses,
/// implemented by `&Value` (the serde path) and by a [`JsonNode`] of the scan's tape, so that the reading of
/// an event is written once.
pub(super) trait View<'a>: Copy {
    /// The member `key` of an object (the last one, as `Value` keeps it); `None` for
    /// anything else.
    fn get(self, key: &str) -> Option<Self>;
    /// The members `keys`, as [`get`](Self::get) finds each (a tape reads them in one walk).
    fn pick<const N: usize>(self, keys: [&str; N]) -> [Option<Self>; N] {
        keys.map(|k| self.get(k))
    }
    /// The text of a string.
    fn as_str(self) -> Option<Cow<'a, str>>;
    /// A non-negative integer that fits a `u64`.
    fn as_u64(self) -> Option<u64>;
    fn is_object(self) -> bool;
    fn is_null(self) -> bool;
    /// Hands each element of an array to `f`; `false` when it is not an array.
    fn each(self, f: impl FnMut(Self)) -> bool;
    /// Whether it carries output: a non-empty string or array, an object, a number, `true`.
    fn has_output(self) -> bool;
    /// The provider error it describes.
    fn provider_error(self) -> ProviderError;
}

impl<'a> View<'a> for &'a Value {
    fn get(self, key: &str) -> Option<Self> {
        Value::get(self, key)
    }
    fn as_str(self) -> Option<Cow<'a, str>> {
        Value::as_str(self).map(Cow::Borrowed)
    }
    fn as_u64(self) -> Option<u64> {
        Value::as_u64(self)
    }
    fn is_object(self) -> bool {
        Value::is_object(self)
    }
    fn is_null(self) -> bool {
        Value::is_null(self)
    }
    fn each(self, f: impl FnMut(Self)) -> bool {
        match self.as_array() {
            Some(a) => {
                a.iter().for_each(f);
                true
            }
            None => false,
        }
    }
    fn has_output(self) -> bool {
        match self {
            Value::Null | Value::Bool(false) => false,
            Value::String(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            _ => true,
        }
    }
    fn provider_error(self) -> ProviderError {
        ProviderError::from_value(self)
    }
}

impl<'a> View<'a> for JsonNode<'_, 'a> {
    fn get(self, key: &str) -> Option<Self> {
        JsonNode::get(&self, key)
    }
    fn pick<const N: usize>(self, keys: [&str; N]) -> [Option<Self>; N] {
        self.get_many(keys)
    }
    fn as_str(self) -> Option<Cow<'a, str>> {
        self.str()
    }
    fn as_u64(self) -> Option<u64> {
        self.u64()
    }
    fn is_object(self) -> bool {
        self.kind() == JsonKind::Object
    }
    fn is_null(self) -> bool {
        self.kind() == JsonKind::Null
    }
    fn each(self, f: impl FnMut(Self)) -> bool {
        if self.kind() != JsonKind::Array {
            return false;
        }
        self.each_child(f);
        true
    }
    fn has_output(self) -> bool {
        match self.kind() {
            JsonKind::Null => false,
            JsonKind::Bool => self.raw() == "true",
            // An escape decodes to at least one character.
            JsonKind::String => self.raw().len() > 2,
            JsonKind::Array => !self.is_empty(),
            JsonKind::Object | JsonKind::Number => true,
        }
    }
    fn provider_error(self) -> ProviderError {
        // The rare path: built by serde, as it always was.
        let v = serde_json::from_str::<Value>(self.raw()).unwrap_or(Value::Null);
        ProviderError::from_value(&v)
    }
}

/// The facts of a whole answer that serde reads without an error object; `None` when the scan
/// is not sure (serde then decides).
pub(super) fn whole(body: &[u8]) -> Option<Facts<'_>> {
    let text = std::str::from_utf8(body).ok()?;
    let mut s = JsonCursor::new(text);
    // Filled in place: the facts are a few hundred bytes, copied at each return otherwise.
    let mut facts = Facts::default();
    top(&mut s, &mut facts)?;
    s.at_end().then_some(facts)
}

/// A string, or `None` inside for `null`; an escaped one is left to serde (it would be
/// decoded).
// The outer `None`: not sure (serde decides); the inner one: `null`.
#[allow(clippy::option_option)]
fn text<'a>(s: &mut JsonCursor<'a>) -> Option<Option<Cow<'a, str>>> {
    if s.null()? {
        return Some(None);
    }
    let span = s.string()?;
    s.plain(span).map(|t| Some(Cow::Borrowed(t)))
}

fn top<'a>(s: &mut JsonCursor<'a>, facts: &mut Facts<'a>) -> Option<()> {
    const MODEL: u32 = 0;
    const USAGE: u32 = 1;
    const RESPONSE: u32 = 2;
    const CHOICES: u32 = 3;
    const STOP: u32 = 4;
    const OBJECT: u32 = 5;
    const TYPE: u32 = 6;
    const CONTENT: u32 = 7;
    const ERROR: u32 = 8;
    const REQUEST_ID: u32 = 9;
    const STATUS: u32 = 10;
    const INCOMPLETE: u32 = 11;
    const OUTPUT: u32 = 12;
    let mut seen = Seen::default();
    // `usage`, else `response.usage`: each `Some` when present and not `null`.
    let mut usage: Option<Option<ReportedUsage>> = None;
    let mut response_usage: Option<Option<ReportedUsage>> = None;
    let mut first_finish: Option<Cow<'a, str>> = None;
    let mut stop: Option<Cow<'a, str>> = None;
    // serde's derive also reads a struct from an array: left to it.
    if s.kind()? != JsonKind::Object {
        return None;
    }
    s.object(|s, name| match name {
        b"model" => {
            seen.first(MODEL)?;
            facts.model = text(s)?;
            Some(())
        }
        b"usage" => {
            seen.first(USAGE)?;
            usage = usage_wire(s, 1)?;
            Some(())
        }
        b"response" => {
            seen.first(RESPONSE)?;
            if s.null()? {
                return Some(());
            }
            let mut inner = Seen::default();
            s.object(|s, name| match name {
                b"usage" => {
                    inner.first(0)?;
                    response_usage = usage_wire(s, 2)?;
                    Some(())
                }
                _ => s.skip(2),
            })
        }
        b"choices" => {
            seen.first(CHOICES)?;
            if s.null()? {
                return Some(());
            }
            let mut output = false;
            let mut first = true;
            s.array(|s| {
                let (finish, out) = choice(s)?;
                if first {
                    first_finish = finish;
                    first = false;
                }
                output |= out;
                Some(())
            })?;
            facts.choices = Some(output);
            Some(())
        }
        b"stop_reason" => {
            seen.first(STOP)?;
            stop = text(s)?;
            Some(())
        }
        b"object" => {
            seen.first(OBJECT)?;
            facts.object = text(s)?;
            Some(())
        }
        b"type" => {
            seen.first(TYPE)?;
            facts.kind = text(s)?;
            Some(())
        }
        b"content" => {
            seen.first(CONTENT)?;
            facts.content = output(s, 1)?;
            Some(())
        }
        b"error" => {
            seen.first(ERROR)?;
            // An error object is read by serde, which builds it.
            s.null()?.then_some(())
        }
        b"request_id" => {
            seen.first(REQUEST_ID)?;
            if !s.null()? {
                s.string()?;
            }
            Some(())
        }
        b"status" => {
            seen.first(STATUS)?;
            facts.status = text(s)?;
            Some(())
        }
        b"incomplete_details" => {
            seen.first(INCOMPLETE)?;
            if s.null()? {
                return Some(());
            }
            // serde's derive also reads a struct from an array: left to it.
            if s.kind()? != JsonKind::Object {
                return None;
            }
            let mut inner = Seen::default();
            s.object(|s, name| match name {
                b"reason" => {
                    inner.first(0)?;
                    facts.incomplete = text(s)?;
                    Some(())
                }
                _ => s.skip(2),
            })
        }
        b"output" => {
            seen.first(OUTPUT)?;
            if !s.null()? {
                facts.output = Some(output(s, 1)?);
            }
            Some(())
        }
        _ => s.skip(1),
    })?;
    facts.usage = usage.or(response_usage).flatten();
    facts.finish = first_finish.or(stop);
    Some(())
}

/// One choice: its finish reason and whether it carries output.
fn choice<'a>(s: &mut JsonCursor<'a>) -> Option<(Option<Cow<'a, str>>, bool)> {
    const FINISH: u32 = 0;
    const MESSAGE: u32 = 1;
    const TEXT: u32 = 2;
    let mut seen = Seen::default();
    let mut finish = None;
    let mut out = false;
    if s.kind()? != JsonKind::Object {
        return None;
    }
    s.object(|s, name| match name {
        b"finish_reason" => {
            seen.first(FINISH)?;
            finish = text(s)?;
            Some(())
        }
        b"text" => {
            seen.first(TEXT)?;
            out |= output(s, 3)?;
            Some(())
        }
        b"message" => {
            seen.first(MESSAGE)?;
            if s.null()? {
                return Some(());
            }
            let mut inner = Seen::default();
            s.object(|s, name| {
                let bit = match name {
                    b"content" => 0,
                    b"tool_calls" => 1,
                    b"function_call" => 2,
                    b"refusal" => 3,
                    b"audio" => 4,
                    _ => return s.skip(4),
                };
                inner.first(bit)?;
                out |= output(s, 4)?;
                Some(())
            })
        }
        _ => s.skip(3),
    })?;
    Some((finish, out))
}

/// Whether a value carries output, as the serde path's `Output` reads it: a non-empty string,
/// a number, `true`, an array with an element that carries output, an object whose (last)
/// `text` carries output, or any other object; `null` and `false` do not.
fn output(s: &mut JsonCursor<'_>, depth: u32) -> Option<bool> {
    if depth >= seawall_core::json_scan::MAX_DEPTH {
        return None;
    }
    match s.kind()? {
        JsonKind::Null => s.null().map(|_| false),
        JsonKind::Bool => s.boolean(),
        JsonKind::Number => s.number().map(|()| true),
        // An escape decodes to at least one character.
        JsonKind::String => s.string().map(|t| !t.is_empty()),
        JsonKind::Array => {
            let mut out = false;
            s.array(|s| {
                out |= output(s, depth + 1)?;
                Some(())
            })?;
            Some(out)
        }
        JsonKind::Object => {
            let mut text = None;
            s.object(|s, name| {
                if name == b"text" {
                    text = Some(output(s, depth + 1)?);
                    Some(())
                } else {
                    s.skip(depth + 1)
                }
            })?;
            Some(text.unwrap_or(true))
        }
    }
}

/// A usage object as serde's derive reads it: `None` for `null`, else `Some` of its counts
/// (`None` inside when it has none).
// The outer `None`: not sure (serde decides); the inner one: `null`.
#[allow(clippy::option_option)]
fn usage_wire(s: &mut JsonCursor<'_>, depth: u32) -> Option<Option<Option<ReportedUsage>>> {
    if s.null()? {
        return Some(None);
    }
    let u = ReportedUsage::scan(s, depth)?;
    Some(Some(Some(u).filter(ReportedUsage::has_counts)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::json::serde_facts;
    use proptest::prelude::*;

    /// The scan agrees with serde whenever it is sure: same facts, and never on a body serde
    /// refuses or reads as an error object.
    fn agree(body: &[u8]) {
        if let Some(facts) = whole(body) {
            let Some((expected, error)) = serde_facts(body) else {
                panic!(
                    "the scan read a body serde refuses: {}",
                    String::from_utf8_lossy(body)
                );
            };
            assert!(!error, "the scan read an error object");
            assert_eq!(facts, expected, "{}", String::from_utf8_lossy(body));
        }
    }

    const OPENAI: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"Hello, world!","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":27,"completion_tokens":4,"total_tokens":31,"prompt_tokens_details":{"cached_tokens":3,"audio_tokens":0}}}"#;
    const ANTHROPIC: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"cache_read_input_tokens":4,"cache_creation_input_tokens":30,"cache_creation":{"ephemeral_5m_input_tokens":10,"ephemeral_1h_input_tokens":20},"output_tokens":6}}"#;
    const RESPONSES: &str = r#"{"object":"response","response":{"usage":{"input_tokens":5,"output_tokens":7,"input_tokens_details":{"cached_tokens":1}}},"model":"gpt-4.1"}"#;
    /// A whole Responses API answer, as `POST /v1/responses` returns it.
    const RESPONSE_OBJECT: &str = r#"{"id":"resp_1","object":"response","created_at":1741476542,"status":"incomplete","error":null,"incomplete_details":{"reason":"max_output_tokens"},"model":"gpt-4.1-2025-04-14","output":[{"type":"message","id":"msg_1","status":"incomplete","role":"assistant","content":[{"type":"output_text","text":"In a","annotations":[]}]}],"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":39}}"#;

    #[test]
    fn the_usual_answers_are_scanned_with_serdes_facts() {
        for body in [OPENAI, ANTHROPIC, RESPONSES, RESPONSE_OBJECT] {
            assert!(whole(body.as_bytes()).is_some(), "{body}");
            agree(body.as_bytes());
        }
    }

    #[test]
    fn error_objects_and_repeated_fields_are_left_to_serde() {
        for body in [
            r#"{"error":{"message":"x"}}"#,
            r#"{"model":"a","model":"b"}"#,
            r#"{"usage":{"prompt_tokens":1,"prompt_tokens":2}}"#,
            r#"{"mod\u0065l":"a"}"#,
            r#"[null]"#,
            r#"{"model":"a\nb"}"#,
        ] {
            assert!(whole(body.as_bytes()).is_none(), "{body}");
        }
        assert!(whole(br#"{"error":null,"model":"a"}"#).is_some());
    }

    /// A JSON value built from pieces the answers use, nested a little.
    fn value(depth: u32) -> BoxedStrategy<String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            Just("\"\"".to_owned()),
            Just("\"x\"".to_owned()),
            Just("\"a\\u00e9\\n\"".to_owned()),
            Just("0".to_owned()),
            Just("-1.5".to_owned()),
            Just("1e3".to_owned()),
            Just("18446744073709551616".to_owned()),
            (0u64..100_000).prop_map(|n| n.to_string()),
        ];
        if depth == 0 {
            return leaf.boxed();
        }
        let key = prop_oneof![
            Just("text"),
            Just("type"),
            Just("content"),
            Just("model"),
            Just("usage"),
            Just("prompt_tokens"),
            Just("input_tokens"),
            Just("output_tokens"),
            Just("completion_tokens"),
            Just("cache_read_input_tokens"),
            Just("cache_creation_input_tokens"),
            Just("cache_creation"),
            Just("ephemeral_1h_input_tokens"),
            Just("prompt_tokens_details"),
            Just("input_tokens_details"),
            Just("prompt_cache_hit_tokens"),
            Just("total_tokens"),
            Just("cached_tokens"),
            Just("finish_reason"),
            Just("message"),
            Just("tool_calls"),
            Just("refusal"),
            Just("reason"),
            Just("x"),
        ];
        prop_oneof![
            2 => leaf,
            1 => proptest::collection::vec(value(depth - 1), 0..3)
                .prop_map(|v| format!("[{}]", v.join(","))),
            2 => proptest::collection::vec((key, value(depth - 1)), 0..4).prop_map(|m| {
                let m: Vec<_> = m.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}", m.join(","))
            }),
        ]
        .boxed()
    }

    /// A whole answer: the top-level fields both paths read, with generated values.
    fn answer() -> impl Strategy<Value = String> {
        let top = prop_oneof![
            Just("model"),
            Just("usage"),
            Just("response"),
            Just("choices"),
            Just("stop_reason"),
            Just("object"),
            Just("type"),
            Just("content"),
            Just("error"),
            Just("request_id"),
            Just("id"),
            Just("status"),
            Just("incomplete_details"),
            Just("output"),
        ];
        let word = prop_oneof![
            Just("\"stop\"".to_owned()),
            Just("\"length\"".to_owned()),
            Just("\"end_turn\"".to_owned()),
            Just("\"chat.completion\"".to_owned()),
            Just("\"message\"".to_owned()),
            Just("\"text_completion\"".to_owned()),
            Just("\"response\"".to_owned()),
            Just("\"completed\"".to_owned()),
            Just("\"incomplete\"".to_owned()),
            Just("{\"reason\":\"content_filter\"}".to_owned()),
            Just("[]".to_owned()),
            Just("null".to_owned()),
        ];
        let choice = proptest::collection::vec(
            (
                prop_oneof![
                    Just("finish_reason"),
                    Just("message"),
                    Just("text"),
                    Just("index")
                ],
                prop_oneof![word.clone(), value(2)],
            ),
            0..4,
        )
        .prop_map(|m| {
            let m: Vec<_> = m.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}", m.join(","))
        });
        let choices =
            proptest::collection::vec(choice, 0..3).prop_map(|c| format!("[{}]", c.join(",")));
        let member = (top, prop_oneof![word, value(3), choices]);
        proptest::collection::vec(member, 0..6).prop_map(|m| {
            let m: Vec<_> = m.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
            format!(" {{{}}}\n", m.join(", "))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn scan_and_serde_agree_on_generated_answers(body in answer()) {
            agree(body.as_bytes());
        }

        #[test]
        fn scan_and_serde_agree_on_damaged_answers(
            which in 0usize..3,
            cut in any::<prop::sample::Index>(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            mode in 0u8..3,
        ) {
            let mut body = [OPENAI, ANTHROPIC, RESPONSES][which].as_bytes().to_vec();
            match mode {
                0 => body.truncate(cut.index(body.len() + 1)),
                1 => { let i = at.index(body.len()); body[i] = byte; }
                _ => { let i = at.index(body.len() + 1); body.insert(i, byte); }
            }
            agree(&body);
        }
    }
}
