//! Reading a stream event by event: where each event's bytes end (so an event can be passed
//! on whole, held back or dropped, and a cut never leaves half an event with the caller),
//! what each event means in both wire formats, and rendering the events of a continuation as
//! if the first attempt had sent them.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

/// Cuts SSE bytes into whole events: each piece ends with the blank line that ends an event
/// (LF, CR or CRLF line endings, across chunk boundaries). The bytes after the last blank
/// line are kept until it comes.
#[derive(Debug)]
pub(crate) struct Framer {
    partial: BytesMut,
    at_line_start: bool,
    after_cr: bool,
    /// The last event ended with a CR at the end of a chunk: the LF that may follow is its.
    cr_ended_event: bool,
}

impl Default for Framer {
    fn default() -> Self {
        Framer {
            partial: BytesMut::new(),
            at_line_start: true,
            after_cr: false,
            cr_ended_event: false,
        }
    }
}

impl Framer {
    /// Hands each whole event of `data` (with the bytes held before it) to `on_event`.
    pub(crate) fn push(&mut self, data: &Bytes, mut on_event: impl FnMut(Bytes)) {
        let mut start = 0;
        let mut pos = 0;
        while let Some(off) = memchr::memchr2(b'\n', b'\r', &data[pos..]) {
            let i = pos + off;
            if i > pos {
                self.at_line_start = false;
                self.after_cr = false;
            }
            pos = i + 1;
            let b = data[i];
            if b == b'\n' && self.after_cr {
                // The LF of a CRLF. When the CR ended an event at the end of the last chunk,
                // the LF is passed on alone, so no event after it starts with it.
                self.after_cr = false;
                if std::mem::take(&mut self.cr_ended_event) && i == start {
                    on_event(data.slice(i..i + 1));
                    start = i + 1;
                }
                continue;
            }
            self.cr_ended_event = false;
            if self.at_line_start {
                let mut end = i + 1;
                if b == b'\r' && data.get(end) == Some(&b'\n') {
                    end += 1;
                    pos = end;
                    self.after_cr = false;
                } else {
                    self.after_cr = b == b'\r';
                    self.cr_ended_event = self.after_cr;
                }
                on_event(self.take(data, start, end));
                start = end;
                self.at_line_start = true;
                continue;
            }
            self.at_line_start = true;
            self.after_cr = b == b'\r';
        }
        if pos < data.len() {
            self.at_line_start = false;
            self.after_cr = false;
            self.cr_ended_event = false;
        }
        if start < data.len() {
            self.partial.extend_from_slice(&data[start..]);
        }
    }

    /// The bytes after the last whole event (an event the stream never ended).
    pub(crate) fn rest(&mut self) -> Option<Bytes> {
        (!self.partial.is_empty()).then(|| self.partial.split().freeze())
    }

    fn take(&mut self, data: &Bytes, start: usize, end: usize) -> Bytes {
        if self.partial.is_empty() {
            data.slice(start..end)
        } else {
            self.partial.extend_from_slice(&data[start..end]);
            self.partial.split().freeze()
        }
    }
}

/// What one event means to the layer.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Seen<'a> {
    pub(crate) kind: Kind,
    /// Text of a content delta.
    pub(crate) text: Option<Cow<'a, str>>,
    /// The finish reason word (`finish_reason`, `stop_reason`).
    pub(crate) finish: Option<Cow<'a, str>>,
    /// Anthropic's `stop_sequence`.
    pub(crate) stop_sequence: Option<Value>,
    /// Usage the event reports.
    pub(crate) usage: Option<Value>,
    /// Anthropic's content block index.
    pub(crate) index: Option<u64>,
    /// OpenAI's chunk id and model, Anthropic's model.
    pub(crate) id: Option<Cow<'a, str>>,
    pub(crate) model: Option<Cow<'a, str>>,
    pub(crate) created: Option<u64>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Opening events: OpenAI's role-only delta, Anthropic's `message_start`, a text
    /// `content_block_start`.
    Head,
    /// A text delta (with or without a finish reason after it, for OpenAI).
    Content,
    /// OpenAI's chunk with a finish reason, Anthropic's `message_delta`.
    Finish,
    /// OpenAI's usage chunk (no choices).
    Usage,
    /// Anthropic's `content_block_stop`.
    BlockStop,
    /// The finish marker: `[DONE]`, `message_stop`.
    Done,
    /// An error event.
    Error,
    /// Output a prefill cannot continue: a tool call, a thinking block or reasoning text, a
    /// second choice.
    Unsupported,
    /// Anything else (pings, unknown events): passed on.
    #[default]
    Other,
}

#[derive(Deserialize)]
struct OaChunk<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(default)]
    created: Option<u64>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    choices: Option<Vec<OaChoice<'a>>>,
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    error: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct OaChoice<'a> {
    #[serde(default)]
    index: u64,
    #[serde(borrow, default)]
    delta: Option<OaDelta<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct OaDelta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<IgnoredAny>,
    #[serde(default)]
    function_call: Option<IgnoredAny>,
    #[serde(default)]
    reasoning_content: Option<Value>,
    #[serde(default)]
    reasoning: Option<Value>,
}

impl OaDelta<'_> {
    /// A tool call, or reasoning text (DeepSeek's and vLLM's `reasoning_content`, OpenRouter's
    /// `reasoning`): what a follow-up could not carry on from. A reasoning model asked to go
    /// on reasons again, and the caller would read a second reasoning in the middle of the
    /// answer; as with Anthropic's thinking blocks, such a stream is not continued.
    fn unsupported(&self) -> bool {
        self.tool_calls.is_some()
            || self.function_call.is_some()
            || [&self.reasoning_content, &self.reasoning]
                .iter()
                .any(|r| r.as_ref().is_some_and(says_something))
    }
}

/// Whether a reasoning member says something: reasoning of any other shape than a string
/// counts too, unless it is empty (`null`, `""`, `[]`, `{}`).
pub(crate) fn says_something(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => true,
    }
}

/// Reads an OpenAI chunk (`data` of one event): by the scan, else by serde.
pub(crate) fn openai<'a>(data: &'a [u8], memo: &mut crate::scan::Memo) -> Seen<'a> {
    if data.trim_ascii() == b"[DONE]" {
        return Seen {
            kind: Kind::Done,
            ..Seen::default()
        };
    }
    if let Some(seen) = memo.template.read(data, false) {
        return seen;
    }
    if let Some(seen) = crate::scan::openai(data, memo) {
        if seen.kind == Kind::Content {
            memo.template.learn(data, false);
        }
        return seen;
    }
    openai_serde(data)
}

/// Reads an OpenAI chunk with serde's derive.
pub(crate) fn openai_serde(data: &[u8]) -> Seen<'_> {
    let Ok(chunk) = serde_json::from_slice::<OaChunk<'_>>(data) else {
        return Seen::default();
    };
    let mut seen = Seen {
        id: chunk.id,
        model: chunk.model,
        created: chunk.created,
        usage: chunk.usage.filter(|u| !u.is_null()),
        ..Seen::default()
    };
    if chunk.error.is_some() {
        seen.kind = Kind::Error;
        return seen;
    }
    let choices = chunk.choices.unwrap_or_default();
    let Some(choice) = choices.into_iter().next() else {
        if seen.usage.is_some() {
            seen.kind = Kind::Usage;
        }
        return seen;
    };
    if choice.index != 0 {
        seen.kind = Kind::Unsupported;
        return seen;
    }
    if let Some(delta) = choice.delta {
        if delta.unsupported() {
            seen.kind = Kind::Unsupported;
            return seen;
        }
        seen.text = delta.content.filter(|c| !c.is_empty());
    }
    seen.finish = choice.finish_reason;
    seen.kind = if seen.finish.is_some() {
        Kind::Finish
    } else if seen.text.is_some() {
        Kind::Content
    } else {
        Kind::Head
    };
    seen
}

#[derive(Deserialize)]
struct AnEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<AnDelta<'a>>,
    #[serde(borrow, default)]
    content_block: Option<AnBlock<'a>>,
    #[serde(borrow, default)]
    message: Option<AnMessage<'a>>,
    #[serde(default)]
    usage: Option<Value>,
}

#[derive(Deserialize)]
struct AnDelta<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    stop_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    stop_sequence: Option<Value>,
}

#[derive(Deserialize)]
struct AnBlock<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

#[derive(Deserialize)]
struct AnMessage<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<Value>,
}

/// Reads an Anthropic event (its name and `data`): by the scan, else by serde.
pub(crate) fn anthropic<'a>(name: &[u8], data: &'a [u8], memo: &mut crate::scan::Memo) -> Seen<'a> {
    if name == b"error" {
        return Seen {
            kind: Kind::Error,
            ..Seen::default()
        };
    }
    if let Some(seen) = memo.template.read(data, true) {
        return seen;
    }
    if let Some(seen) = crate::scan::anthropic(data, memo) {
        if seen.kind == Kind::Content {
            memo.template.learn(data, true);
        }
        return seen;
    }
    anthropic_serde(data)
}

/// Reads an Anthropic event's `data` with serde's derive.
pub(crate) fn anthropic_serde<'a>(data: &'a [u8]) -> Seen<'a> {
    let Ok(ev) = serde_json::from_slice::<AnEvent<'a>>(data) else {
        return Seen::default();
    };
    let mut seen = Seen {
        index: ev.index,
        ..Seen::default()
    };
    seen.kind = match &*ev.kind {
        "message_start" => {
            if let Some(m) = ev.message {
                seen.model = m.model;
                seen.usage = m.usage;
            }
            Kind::Head
        }
        "content_block_start" => match ev.content_block.as_ref().map(|b| &*b.kind) {
            Some("text") => Kind::Head,
            _ => Kind::Unsupported,
        },
        "content_block_delta" => match ev.delta {
            Some(AnDelta {
                kind: Some(k),
                text: Some(t),
                ..
            }) if k == "text_delta" => {
                seen.text = Some(t);
                Kind::Content
            }
            _ => Kind::Unsupported,
        },
        "content_block_stop" => Kind::BlockStop,
        "message_delta" => {
            if let Some(d) = ev.delta {
                seen.finish = d.stop_reason;
                seen.stop_sequence = d.stop_sequence;
            }
            seen.usage = ev.usage;
            Kind::Finish
        }
        "message_stop" => Kind::Done,
        "error" => Kind::Error,
        _ => Kind::Other,
    };
    seen
}

/// The fields every rendered OpenAI chunk starts with, taken from the first attempt's chunks.
#[derive(Debug, Default, Clone)]
pub(crate) struct OpenAiHead {
    /// `"id":...,"object":"chat.completion.chunk","created":...,"model":...,` (JSON).
    prefix: String,
}

impl OpenAiHead {
    pub(crate) fn learn(&mut self, seen: &Seen<'_>) {
        if !self.prefix.is_empty() {
            return;
        }
        let mut p = String::new();
        if let Some(id) = &seen.id {
            p.push_str("\"id\":");
            p.push_str(&json_str(id));
            p.push(',');
        }
        p.push_str("\"object\":\"chat.completion.chunk\",");
        if let Some(c) = seen.created {
            p.push_str(&format!("\"created\":{c},"));
        }
        if let Some(m) = &seen.model {
            p.push_str("\"model\":");
            p.push_str(&json_str(m));
            p.push(',');
        }
        self.prefix = p;
    }

    /// A content chunk.
    pub(crate) fn content(&self, text: &str) -> Bytes {
        self.chunk(&format!(
            "\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{}}},\"finish_reason\":null}}]",
            json_str(text)
        ))
    }

    /// The finish chunk, with the summed usage when the upstream put usage in it.
    pub(crate) fn finish(&self, word: &str, usage: Option<&Value>) -> Bytes {
        let mut rest = format!(
            "\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":{}}}]",
            json_str(word)
        );
        if let Some(u) = usage {
            rest.push_str(",\"usage\":");
            rest.push_str(&u.to_string());
        }
        self.chunk(&rest)
    }

    /// The usage chunk.
    pub(crate) fn usage(&self, usage: &Value) -> Bytes {
        self.chunk(&format!("\"choices\":[],\"usage\":{usage}"))
    }

    fn chunk(&self, rest: &str) -> Bytes {
        Bytes::from(format!("data: {{{}{rest}}}\n\n", self.prefix))
    }
}

/// An Anthropic text delta.
pub(crate) fn anthropic_delta(index: u64, text: &str) -> Bytes {
    Bytes::from(format!(
        "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":{index},\"delta\":{{\"type\":\"text_delta\",\"text\":{}}}}}\n\n",
        json_str(text)
    ))
}

/// An Anthropic `content_block_stop`.
pub(crate) fn anthropic_block_stop(index: u64) -> Bytes {
    Bytes::from(format!(
        "event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":{index}}}\n\n"
    ))
}

/// An Anthropic `message_delta` with the summed usage.
pub(crate) fn anthropic_message_delta(word: &str, stop_sequence: &Value, usage: &Value) -> Bytes {
    Bytes::from(format!(
        "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":{},\"stop_sequence\":{stop_sequence}}},\"usage\":{usage}}}\n\n",
        json_str(word)
    ))
}

fn json_str(s: &str) -> String {
    Value::from(s).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oa(data: &[u8]) -> Seen<'_> {
        openai(data, &mut crate::scan::Memo::default())
    }

    fn an<'a>(name: &[u8], data: &'a [u8]) -> Seen<'a> {
        anthropic(name, data, &mut crate::scan::Memo::default())
    }

    fn pieces(chunks: &[&[u8]]) -> (Vec<String>, usize) {
        let mut f = Framer::default();
        let mut out = Vec::new();
        for c in chunks {
            f.push(&Bytes::copy_from_slice(c), |e| {
                out.push(String::from_utf8_lossy(&e).into_owned())
            });
        }
        (out, f.partial.len())
    }

    #[test]
    fn events_are_cut_at_blank_lines_across_chunks_and_line_endings() {
        let (out, left) = pieces(&[b"data: a\n\nda", b"ta: b\r\n\r", b"\ndata: c\r\rdata: d\n"]);
        assert_eq!(out, ["data: a\n\n", "data: b\r\n\r", "\n", "data: c\r\r"]);
        assert_eq!(left, "data: d\n".len());
        let (out, _) = pieces(&[b"event: x\ndata: 1\n", b"\n"]);
        assert_eq!(out, ["event: x\ndata: 1\n\n"]);
    }

    #[test]
    fn both_formats_are_read() {
        let s = oa(
            br#"{"id":"c1","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}"#,
        );
        assert_eq!((s.kind, s.text.as_deref()), (Kind::Content, Some("hi")));
        let s = oa(br#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#);
        assert_eq!(
            (s.kind, s.finish.as_deref()),
            (Kind::Finish, Some("length"))
        );
        assert_eq!(oa(b"[DONE]").kind, Kind::Done);
        assert_eq!(oa(br#"{"error":{"message":"x"}}"#).kind, Kind::Error);
        assert_eq!(
            oa(br#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}"#).kind,
            Kind::Unsupported
        );
        for reasoning in [
            br#"{"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"Hm"}}]}"#
                .as_slice(),
            br#"{"choices":[{"index":0,"delta":{"reasoning":"Hm"}}]}"#,
            br#"{"choices":[{"index":0,"delta":{"content":"hi","reasoning":{"text":"Hm"}}}]}"#,
        ] {
            assert_eq!(oa(reasoning).kind, Kind::Unsupported);
            assert_eq!(openai_serde(reasoning).kind, Kind::Unsupported);
        }
        for empty in [
            br#"{"choices":[{"index":0,"delta":{"content":"hi","reasoning_content":null,"reasoning":""}}]}"#
                .as_slice(),
            br#"{"choices":[{"index":0,"delta":{"content":"hi","reasoning":[]}}]}"#,
        ] {
            let s = oa(empty);
            assert_eq!((s.kind, s.text.as_deref()), (Kind::Content, Some("hi")));
        }
        let s = an(b"content_block_delta", br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"yo"}}"#);
        assert_eq!((s.kind, s.text.as_deref()), (Kind::Content, Some("yo")));
        let s = an(b"message_delta", br#"{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":3}}"#);
        assert_eq!(
            (s.kind, s.finish.as_deref()),
            (Kind::Finish, Some("max_tokens"))
        );
        assert_eq!(an(b"x", b"not json").kind, Kind::Other);
    }

    const OPENAI: &[&str] = &[
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"Hel\u006co"},"finish_reason":null}]}"#,
        r#"{"id":"c1","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
        r#"{"id":"c1","created":1,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}"#,
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}"#,
        r#"{"error":{"message":"x"}}"#,
    ];
    const ANTHROPIC: &[&str] = &[
        r#"{"type":"message_start","message":{"id":"m","model":"claude-sonnet-4","content":[],"usage":{"input_tokens":10,"output_tokens":1}}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":5}}"#,
        r#"{"type":"message_stop"}"#,
    ];

    /// The scan reads an event only as serde's derive does.
    fn agree(data: &[u8]) {
        if let Some(s) = crate::scan::openai(data, &mut Default::default()) {
            assert_eq!(s, openai_serde(data), "{}", String::from_utf8_lossy(data));
        }
        if let Some(s) = crate::scan::anthropic(data, &mut Default::default()) {
            assert_eq!(
                s,
                anthropic_serde(data),
                "{}",
                String::from_utf8_lossy(data)
            );
        }
    }

    #[test]
    fn the_usual_events_are_read_by_the_scan_as_serde_reads_them() {
        for e in OPENAI {
            assert!(
                crate::scan::openai(e.as_bytes(), &mut Default::default()).is_some(),
                "{e}"
            );
            agree(e.as_bytes());
        }
        for e in ANTHROPIC {
            assert!(
                crate::scan::anthropic(e.as_bytes(), &mut Default::default()).is_some(),
                "{e}"
            );
            agree(e.as_bytes());
        }
        // A repeated field is left to serde (which refuses it).
        assert!(
            crate::scan::openai(br#"{"model":"a","model":"b"}"#, &mut Default::default()).is_none()
        );
    }

    fn value(depth: u32) -> BoxedStrategy<String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("\"\"".to_owned()),
            Just("\"x\"".to_owned()),
            Just("\"text\"".to_owned()),
            Just("\"text_delta\"".to_owned()),
            Just("\"message_start\"".to_owned()),
            Just("\"message_delta\"".to_owned()),
            Just("\"content_block_start\"".to_owned()),
            Just("\"content_block_delta\"".to_owned()),
            Just("\"length\"".to_owned()),
            Just("\"a\\u00e9\"".to_owned()),
            Just("0".to_owned()),
            Just("1".to_owned()),
            Just("-1".to_owned()),
            Just("1.5".to_owned()),
            Just("[]".to_owned()),
        ];
        if depth == 0 {
            return leaf.boxed();
        }
        let key = prop_oneof![
            Just("id"),
            Just("created"),
            Just("model"),
            Just("choices"),
            Just("usage"),
            Just("error"),
            Just("index"),
            Just("delta"),
            Just("content"),
            Just("tool_calls"),
            Just("function_call"),
            Just("reasoning_content"),
            Just("reasoning"),
            Just("finish_reason"),
            Just("type"),
            Just("text"),
            Just("stop_reason"),
            Just("stop_sequence"),
            Just("content_block"),
            Just("message"),
            Just("x"),
        ];
        prop_oneof![
            2 => leaf,
            1 => proptest::collection::vec(value(depth - 1), 0..3)
                .prop_map(|v| format!("[{}]", v.join(","))),
            3 => proptest::collection::vec((key, value(depth - 1)), 0..5).prop_map(|m| {
                let m: Vec<_> = m.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}", m.join(","))
            }),
        ]
        .boxed()
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn scan_and_serde_read_generated_events_the_same(data in value(4)) {
            agree(data.as_bytes());
        }

        #[test]
        fn scan_and_serde_read_damaged_events_the_same(
            which in 0usize..12,
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            mode in 0u8..3,
        ) {
            let mut data = OPENAI.iter().chain(ANTHROPIC).nth(which).unwrap().as_bytes().to_vec();
            match mode {
                0 => data.truncate(at.index(data.len() + 1)),
                1 => { let i = at.index(data.len()); data[i] = byte; }
                _ => { let i = at.index(data.len() + 1); data.insert(i, byte); }
            }
            agree(&data);
        }
    }
}
