//! Incremental parsers of successful bodies: SSE streams of both wire formats, and plain JSON
//! bodies read through a head window and a rolling tail window. Neither buffers the body.

use http::StatusCode;
use serde_json::Value;
use std::borrow::Cow;

use seawall_core::{BodyReport, BoxError, FailureClass, FinishReason, LlmError, Usage};

use crate::classifier::{class_of, error_from};
use crate::error_body::{self, ProviderError};
use crate::hints;

/// The largest SSE event (or incomplete line) kept; a longer one is skipped, counted as
/// content, and never buffered further.
pub(crate) const MAX_EVENT: usize = 1 << 20;
/// The first bytes of a JSON body kept (the model is near the start).
const JSON_HEAD: usize = 4 << 10;
/// The last bytes of a JSON body kept (usage and finish reason are near the end).
const JSON_TAIL: usize = 16 << 10;

/// Raw usage fields, merged as events arrive (Anthropic splits usage over `message_start` and
/// `message_delta`; vLLM may repeat cumulative usage in every chunk).
#[derive(Debug, Default, Clone, Copy)]
struct RawUsage {
    /// OpenAI `prompt_tokens` (cached tokens included).
    prompt: Option<u64>,
    /// Anthropic / Responses API `input_tokens`.
    input: Option<u64>,
    output: Option<u64>,
    /// Anthropic `cache_read_input_tokens` (not included in `input_tokens`).
    cache_read: Option<u64>,
    /// Anthropic `cache_creation_input_tokens` (not included in `input_tokens`).
    cache_creation: Option<u64>,
    /// OpenAI `prompt_tokens_details.cached_tokens`, Responses API
    /// `input_tokens_details.cached_tokens`, DeepSeek `prompt_cache_hit_tokens`.
    cached_detail: Option<u64>,
}

impl RawUsage {
    fn from_value(v: &Value) -> Option<RawUsage> {
        let obj = v.as_object()?;
        let n = |k: &str| obj.get(k).and_then(Value::as_u64);
        let detail = |k: &str| {
            obj.get(k)
                .and_then(|d| d.get("cached_tokens"))
                .and_then(Value::as_u64)
        };
        let raw = RawUsage {
            prompt: n("prompt_tokens"),
            input: n("input_tokens"),
            output: n("completion_tokens").or_else(|| n("output_tokens")),
            cache_read: n("cache_read_input_tokens"),
            cache_creation: n("cache_creation_input_tokens"),
            cached_detail: detail("prompt_tokens_details")
                .or_else(|| detail("input_tokens_details"))
                .or_else(|| n("prompt_cache_hit_tokens")),
        };
        (raw.prompt.is_some() || raw.input.is_some() || raw.output.is_some()).then_some(raw)
    }

    fn merge(&mut self, newer: RawUsage) {
        let keep = |old: &mut Option<u64>, new: Option<u64>| {
            if new.is_some() {
                *old = new;
            }
        };
        keep(&mut self.prompt, newer.prompt);
        keep(&mut self.input, newer.input);
        keep(&mut self.output, newer.output);
        keep(&mut self.cache_read, newer.cache_read);
        keep(&mut self.cache_creation, newer.cache_creation);
        keep(&mut self.cached_detail, newer.cached_detail);
    }

    fn to_usage(self) -> Usage {
        let (input, cached) = if let Some(p) = self.prompt {
            (p, self.cached_detail.unwrap_or(0))
        } else if self.cache_read.is_some() || self.cache_creation.is_some() {
            let read = self.cache_read.unwrap_or(0);
            let input = self
                .input
                .unwrap_or(0)
                .saturating_add(read)
                .saturating_add(self.cache_creation.unwrap_or(0));
            (input, read)
        } else {
            (self.input.unwrap_or(0), self.cached_detail.unwrap_or(0))
        };
        Usage {
            input_tokens: input,
            output_tokens: self.output.unwrap_or(0),
            cached_input_tokens: cached.min(input),
        }
    }
}

/// The fields of a whole (non-streamed) JSON answer that the report and the verdict need; serde
/// skips the rest without building it.
#[derive(serde::Deserialize)]
struct WholeBody<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<UsageWire>,
    #[serde(default)]
    response: Option<ResponseWire>,
    #[serde(borrow, default)]
    choices: Option<Vec<ChoiceWire<'a>>>,
    #[serde(borrow, default)]
    stop_reason: Option<Cow<'a, str>>,
    /// OpenAI `chat.completion` / `text_completion`.
    #[serde(borrow, default)]
    object: Option<Cow<'a, str>>,
    /// Anthropic `message` (or `error`).
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    /// Anthropic's content blocks.
    #[serde(default)]
    content: Option<Output>,
    /// An error object in a `200` (`null` reads as `None`).
    #[serde(default)]
    error: Option<Value>,
    #[serde(borrow, default)]
    request_id: Option<Cow<'a, str>>,
}

#[derive(serde::Deserialize, Clone, Copy)]
struct ResponseWire {
    #[serde(default)]
    usage: Option<UsageWire>,
}

#[derive(serde::Deserialize)]
struct ChoiceWire<'a> {
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    message: Option<MessageWire>,
    /// Legacy completions.
    #[serde(default)]
    text: Option<Output>,
}

#[derive(serde::Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct MessageWire {
    content: Option<Output>,
    tool_calls: Option<Output>,
    function_call: Option<Output>,
    refusal: Option<Output>,
    audio: Option<Output>,
}

impl ChoiceWire<'_> {
    fn has_output(&self) -> bool {
        let m = self.message.as_ref();
        [
            m.and_then(|m| m.content),
            m.and_then(|m| m.tool_calls),
            m.and_then(|m| m.function_call),
            m.and_then(|m| m.refusal),
            m.and_then(|m| m.audio),
            self.text,
        ]
        .iter()
        .any(|o| o.is_some_and(|o| o.0))
    }
}

/// Whether a JSON value carries output, read without building it: a non-empty string, a
/// number, `true`, an array with an element that carries output, an object whose `text` carries
/// output (a text block or part), or any other object (a tool call, an image).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Output(bool);

impl<'de> serde::Deserialize<'de> for Output {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OutputVisitor)
    }
}

struct OutputVisitor;

impl<'de> serde::de::Visitor<'de> for OutputVisitor {
    type Value = Output;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Output, E> {
        Ok(Output(v))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Output, E> {
        Ok(Output(true))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Output, E> {
        Ok(Output(true))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Output, E> {
        Ok(Output(true))
    }
    fn visit_str<E>(self, v: &str) -> Result<Output, E> {
        Ok(Output(!v.is_empty()))
    }
    fn visit_unit<E>(self) -> Result<Output, E> {
        Ok(Output(false))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Output, A::Error> {
        let mut out = false;
        while let Some(Output(o)) = seq.next_element()? {
            out |= o;
        }
        Ok(Output(out))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Output, A::Error> {
        let mut text = None;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == "text" {
                text = Some(map.next_value::<Output>()?.0);
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(Output(text.unwrap_or(true)))
    }
}

/// What a whole JSON answer turned out to be.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// An answer (its fields are in the report).
    Answer,
    /// A `200` holding an error object.
    Error(ProviderError),
    /// A finished answer without any content.
    Empty,
}

impl WholeBody<'_> {
    /// Fills the report's model, usage and finish reason.
    fn report(&self, report: &BodyReport) {
        if let Some(m) = &self.model {
            report.set_model(m);
        }
        let usage = self.usage.or(self.response.and_then(|r| r.usage));
        if let Some(u) = usage.and_then(UsageWire::raw) {
            report.set_usage(u.to_usage());
        }
        let reason = self
            .choices
            .as_ref()
            .and_then(|c| c.first())
            .and_then(|c| c.finish_reason.as_deref())
            .or(self.stop_reason.as_deref());
        if let Some(r) = reason {
            report.set_finish_reason(finish_reason(r));
        }
    }

    fn verdict(self, report: &BodyReport) -> Verdict {
        if let Some(error) = self.error {
            // The shape [`ProviderError::from_value`] reads, with Anthropic's outer fields.
            let mut top = serde_json::Map::new();
            if let Some(kind) = self.kind {
                top.insert("type".into(), Value::String(kind.into_owned()));
            }
            if let Some(id) = self.request_id {
                top.insert("request_id".into(), Value::String(id.into_owned()));
            }
            top.insert("error".into(), error);
            return Verdict::Error(ProviderError::from_value(&Value::Object(top)));
        }
        // Stopped at the token limit: nothing to retry, the caller may ask for more.
        if report.finish_reason() == Some(&FinishReason::Length) {
            return Verdict::Answer;
        }
        let empty = match (&self.choices, self.object.as_deref(), self.kind.as_deref()) {
            (Some(choices), _, _) => !choices.iter().any(ChoiceWire::has_output),
            (None, Some("chat.completion" | "text_completion"), _) => true,
            (None, _, Some("message")) => !self.content.is_some_and(|c| c.0),
            _ => false,
        };
        if empty {
            Verdict::Empty
        } else {
            Verdict::Answer
        }
    }
}

/// Reads a whole JSON answer once: fills the report (model, usage, finish reason, finished) and
/// says whether it is an answer, an error object or empty. `None`: not a JSON document (the
/// report is left alone).
pub(crate) fn read_whole(body: &[u8], report: &BodyReport) -> Option<Verdict> {
    let whole = serde_json::from_slice::<WholeBody<'_>>(body).ok()?;
    whole.report(report);
    let verdict = whole.verdict(report);
    if matches!(verdict, Verdict::Answer) {
        if body.iter().any(|b| !b.is_ascii_whitespace()) {
            report.record_content();
        }
        report.set_finished();
    }
    Some(verdict)
}

/// The error of an error object inside a successful answer (an SSE error event, or a `200`
/// whose JSON body is an error): built by the built-in rules for both wire formats.
pub(crate) fn embedded_error(e: &ProviderError, what: &str) -> LlmError {
    let class = class_of(200, e);
    let mut err = error_from(class, None, e, true).with_status(StatusCode::OK);
    if e.message().is_none() {
        err = LlmError::new(class, what).with_status(StatusCode::OK);
        if let Some(c) = e.code() {
            err = err.with_code(c);
        }
        if let Some(t) = e.error_type() {
            err = err.with_error_type(t);
        }
        if let Some(id) = e.request_id() {
            err = err.with_request_id(id);
        }
    }
    err
}

/// The error of an answer that finished without any content.
pub(crate) fn empty_answer() -> LlmError {
    LlmError::new(
        FailureClass::EmptyResponse,
        "the answer finished without any content",
    )
    .with_status(StatusCode::OK)
}

#[derive(serde::Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct UsageWire {
    prompt_tokens: Option<u64>,
    input_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    prompt_tokens_details: Option<DetailsWire>,
    input_tokens_details: Option<DetailsWire>,
    prompt_cache_hit_tokens: Option<u64>,
}

#[derive(serde::Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct DetailsWire {
    cached_tokens: Option<u64>,
}

impl UsageWire {
    /// The same reading as [`RawUsage::from_value`], from the typed fields.
    fn raw(self) -> Option<RawUsage> {
        let detail = |d: Option<DetailsWire>| d.and_then(|d| d.cached_tokens);
        let raw = RawUsage {
            prompt: self.prompt_tokens,
            input: self.input_tokens,
            output: self.completion_tokens.or(self.output_tokens),
            cache_read: self.cache_read_input_tokens,
            cache_creation: self.cache_creation_input_tokens,
            cached_detail: detail(self.prompt_tokens_details)
                .or(detail(self.input_tokens_details))
                .or(self.prompt_cache_hit_tokens),
        };
        (raw.prompt.is_some() || raw.input.is_some() || raw.output.is_some()).then_some(raw)
    }
}

fn finish_reason(s: &str) -> FinishReason {
    match s {
        "stop" | "end_turn" | "stop_sequence" => FinishReason::Stop,
        "length" | "max_tokens" | "max_output_tokens" => FinishReason::Length,
        "tool_calls" | "tool_use" | "function_call" => FinishReason::ToolCalls,
        "content_filter" | "refusal" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.chars().take(64).collect::<String>().into()),
    }
}

/// Whether a JSON value carries output: a non-empty string or array, an object, a number.
fn has_output(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null | Value::Bool(false)) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    }
}

/// A body error when the body broke or ended early: `StreamInterrupted` once content was
/// seen, else `Disconnected` (nothing reached the caller yet, and the upstream may have billed
/// the prompt).
fn broken(report: &BodyReport, what: &str) -> LlmError {
    if report.has_content() {
        LlmError::new(FailureClass::StreamInterrupted, what)
    } else {
        LlmError::new(
            FailureClass::Disconnected,
            format!("{what} (before any content)"),
        )
    }
}

/// The parser of one successful body.
#[derive(Debug)]
pub(crate) enum Parser {
    Sse(SseParser),
    Json(JsonScanner),
    /// The body was read whole and reported before the response was handed on.
    Read,
}

impl Parser {
    /// `known_api`: the request went to OpenAI or Anthropic, so the finish marker is expected
    /// even before an event of theirs was recognised.
    pub(crate) fn sse(request_id: Option<&str>, known_api: bool) -> Parser {
        Parser::Sse(SseParser {
            request_id: request_id.map(Into::into),
            known: known_api,
            ..SseParser::default()
        })
    }

    pub(crate) fn json() -> Parser {
        Parser::Json(JsonScanner::default())
    }

    /// For a body already read whole and reported ([`read_whole`]).
    pub(crate) fn read() -> Parser {
        Parser::Read
    }

    /// Feeds a chunk; returns an error the stream carried, if any.
    pub(crate) fn feed(&mut self, chunk: &[u8], report: &BodyReport) -> Option<LlmError> {
        match self {
            Parser::Sse(p) => p.feed(chunk, report),
            Parser::Json(p) => {
                p.feed(chunk, report);
                None
            }
            Parser::Read => None,
        }
    }

    /// The body ended normally; returns an error if it ended too early.
    pub(crate) fn eof(&mut self, report: &BodyReport) -> Option<LlmError> {
        match self {
            Parser::Sse(p) => p.eof(report),
            Parser::Json(p) => p.eof(report),
            Parser::Read => None,
        }
    }

    /// The body failed with a transport error.
    pub(crate) fn failed(&mut self, error: BoxError, report: &BodyReport) -> LlmError {
        let error = match error.downcast::<LlmError>() {
            Ok(e) => return *e,
            Err(e) => e,
        };
        if let Parser::Sse(p) = self {
            p.flush_usage(report);
        }
        let mut err = broken(report, &format!("response body failed: {error}"));
        if let Parser::Sse(SseParser {
            request_id: Some(id),
            ..
        }) = self
        {
            err = err.with_request_id(&**id);
        }
        err.with_status(StatusCode::OK).with_source(error)
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum EventName {
    #[default]
    Message,
    Error,
    Ping,
    /// `message_stop`, `response.completed`, `response.incomplete`.
    Finish,
    Other,
}

/// Parses an SSE stream line by line, across chunk boundaries.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// The incomplete trailing line.
    line: Vec<u8>,
    /// The current line was too long: drop bytes until the next newline.
    skipping: bool,
    event: EventName,
    data: Vec<u8>,
    /// The current event's data was too long to keep.
    oversized: bool,
    /// Whether any event was dispatched.
    events: bool,
    /// Whether a line that is not SSE was seen.
    foreign: bool,
    /// Whether an OpenAI or Anthropic event was recognised (so its finish marker is expected).
    known: bool,
    /// Whether an event looked like JSON but did not parse (cut short): the stream is broken,
    /// whatever its dialect.
    malformed: bool,
    finished: bool,
    /// The last chunk ended with a CR: an LF starting the next one belongs to it.
    after_cr: bool,
    /// The first line was read (a UTF-8 byte order mark before it is skipped).
    started: bool,
    usage: Option<RawUsage>,
    request_id: Option<Box<str>>,
}

impl SseParser {
    fn feed(&mut self, chunk: &[u8], report: &BodyReport) -> Option<LlmError> {
        let mut rest = chunk;
        // A CR that ended the previous chunk and this LF are one line ending.
        if std::mem::take(&mut self.after_cr) && rest.first() == Some(&b'\n') {
            rest = &rest[1..];
        }
        while let Some(pos) = rest.iter().position(|b| matches!(b, b'\n' | b'\r')) {
            let piece = &rest[..pos];
            let crlf = rest[pos] == b'\r' && rest.get(pos + 1) == Some(&b'\n');
            self.after_cr = rest[pos] == b'\r' && pos + 1 == rest.len();
            rest = &rest[pos + 1 + usize::from(crlf)..];
            if self.skipping {
                self.skipping = false;
                continue;
            }
            let err = if self.line.is_empty() {
                self.on_line(piece, report)
            } else if self.line.len() + piece.len() > MAX_EVENT {
                self.line.clear();
                self.oversized = true;
                None
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(piece);
                let err = self.on_line(&line, report);
                line.clear();
                self.line = line;
                err
            };
            if err.is_some() {
                return err;
            }
        }
        if !self.skipping && !rest.is_empty() {
            if self.line.len() + rest.len() > MAX_EVENT {
                self.line.clear();
                self.skipping = true;
                self.oversized = true;
            } else {
                self.line.extend_from_slice(rest);
            }
        }
        None
    }

    fn on_line(&mut self, line: &[u8], report: &BodyReport) -> Option<LlmError> {
        let line = if std::mem::replace(&mut self.started, true) {
            line
        } else {
            line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line)
        };
        if line.is_empty() {
            return self.dispatch(report);
        }
        if line[0] == b':' {
            return None; // a comment, such as `: keep-alive`
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"event" => {
                self.event = match value {
                    b"error" => EventName::Error,
                    b"ping" => EventName::Ping,
                    b"message_stop" | b"response.completed" | b"response.incomplete" => {
                        EventName::Finish
                    }
                    b"message" => EventName::Message,
                    _ => EventName::Other,
                };
            }
            b"data" => {
                if self.data.len() + value.len() + 1 > MAX_EVENT {
                    self.oversized = true;
                    self.data.clear();
                } else if !self.oversized {
                    if !self.data.is_empty() {
                        self.data.push(b'\n');
                    }
                    self.data.extend_from_slice(value);
                }
            }
            b"id" | b"retry" => {}
            // Not SSE at all (say, JSON without a content type on a `stream: true` request).
            _ => self.foreign = true,
        }
        None
    }

    fn dispatch(&mut self, report: &BodyReport) -> Option<LlmError> {
        let event = std::mem::take(&mut self.event);
        let oversized = std::mem::take(&mut self.oversized);
        if self.data.is_empty() && !oversized {
            return None; // a blank line, or an event without data
        }
        self.events = true;
        let data = std::mem::take(&mut self.data);
        let err = self.on_event(event, oversized, data.trim_ascii(), report);
        self.data = data;
        self.data.clear();
        err
    }

    fn on_event(
        &mut self,
        event: EventName,
        oversized: bool,
        data: &[u8],
        report: &BodyReport,
    ) -> Option<LlmError> {
        if data == b"[DONE]" {
            self.known = true;
            self.finish(report);
            return None;
        }
        if oversized {
            match event {
                EventName::Finish => self.finish(report),
                EventName::Error => {
                    let e = ProviderError::from_value(&Value::String(
                        "oversized error event inside the stream".into(),
                    ));
                    return Some(self.stream_error(&e, report));
                }
                _ => report.record_content(),
            }
            return None;
        }
        if event == EventName::Ping {
            return None;
        }
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            if matches!(data.first(), Some(b'{' | b'[')) {
                // JSON cut short: not output, and the stream cannot end well after it.
                self.malformed = true;
                return None;
            }
            if event == EventName::Error {
                let text = String::from_utf8_lossy(data);
                let e = ProviderError::from_value(&Value::String(text.into_owned()));
                return Some(self.stream_error(&e, report));
            }
            // Not JSON: a plain-text stream of some other API; its data is the output.
            report.record_content();
            return None;
        };
        self.on_json(event, &v, report)
    }

    fn on_json(&mut self, event: EventName, v: &Value, report: &BodyReport) -> Option<LlmError> {
        let ty = v.get("type").and_then(Value::as_str).unwrap_or("");
        let error_field = v.get("error").is_some_and(|e| !e.is_null());
        if event == EventName::Error || ty == "error" || error_field {
            self.known = true;
            return Some(self.stream_error(&ProviderError::from_value(v), report));
        }
        if ty == "response.failed" {
            self.known = true;
            let payload = v.get("response").unwrap_or(v);
            return Some(self.stream_error(&ProviderError::from_value(payload), report));
        }
        match ty {
            "message_start" => {
                self.known = true;
                if let Some(m) = v.get("message") {
                    Self::model(m, report);
                    self.merge_usage(m.get("usage"));
                }
            }
            "content_block_delta" => {
                self.known = true;
                let delta = v.get("delta");
                let out = ["text", "partial_json", "thinking", "signature"]
                    .iter()
                    .any(|k| has_output(delta.and_then(|d| d.get(*k))));
                if out {
                    report.record_content();
                }
            }
            "message_delta" => {
                self.known = true;
                if let Some(r) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    report.set_finish_reason(finish_reason(r));
                }
                self.merge_usage(v.get("usage"));
            }
            "message_stop" => {
                self.known = true;
                self.finish(report);
            }
            "content_block_start" => {
                self.known = true;
                // A tool use (its input may stream as empty deltas) or a block with text.
                let block = v.get("content_block");
                let kind = block.and_then(|b| b.get("type")).and_then(Value::as_str);
                if !matches!(kind, None | Some("text" | "thinking"))
                    || has_output(block.and_then(|b| b.get("text")))
                {
                    report.record_content();
                }
            }
            "content_block_stop" | "ping" => self.known = true,
            t if t.starts_with("response.") => {
                self.known = true;
                if t.ends_with(".delta") && has_output(v.get("delta")) {
                    report.record_content();
                }
                if let Some(r) = v.get("response") {
                    Self::model(r, report);
                    if t == "response.completed" || t == "response.incomplete" {
                        self.merge_usage(r.get("usage"));
                        let reason = r
                            .pointer("/incomplete_details/reason")
                            .and_then(Value::as_str)
                            .unwrap_or("stop");
                        report.set_finish_reason(finish_reason(reason));
                        self.finish(report);
                    }
                }
            }
            _ => {
                if let Some(choices) = v.get("choices").and_then(Value::as_array) {
                    self.known = true;
                    Self::model(v, report);
                    let mut content = false;
                    for c in choices {
                        if let Some(d) = c.get("delta") {
                            content |= [
                                "content",
                                "tool_calls",
                                "refusal",
                                "reasoning_content",
                                "reasoning",
                                "function_call",
                                "audio",
                            ]
                            .iter()
                            .any(|k| has_output(d.get(*k)));
                        }
                        content |= has_output(c.get("text"));
                        if let Some(r) = c.get("finish_reason").and_then(Value::as_str) {
                            report.set_finish_reason(finish_reason(r));
                        }
                    }
                    if content {
                        report.record_content();
                    }
                }
                self.merge_usage(v.get("usage"));
            }
        }
        None
    }

    fn model(v: &Value, report: &BodyReport) {
        if report.model().is_none() {
            if let Some(m) = v
                .get("model")
                .and_then(Value::as_str)
                .filter(|m| !m.is_empty())
            {
                report.set_model(m);
            }
        }
    }

    fn merge_usage(&mut self, v: Option<&Value>) {
        if let Some(raw) = v.and_then(RawUsage::from_value) {
            self.usage.get_or_insert_with(RawUsage::default).merge(raw);
        }
    }

    fn flush_usage(&self, report: &BodyReport) {
        if let Some(u) = self.usage {
            report.set_usage(u.to_usage());
        }
    }

    fn finish(&mut self, report: &BodyReport) {
        self.finished = true;
        self.flush_usage(report);
        report.set_finished();
    }

    fn stream_error(&self, e: &ProviderError, report: &BodyReport) -> LlmError {
        let mut err = embedded_error(e, "error event inside a 200 stream");
        if err.request_id().is_none() {
            if let Some(id) = &self.request_id {
                err = err.with_request_id(&**id);
            }
        }
        if let Some(d) = hints::retry_after_from_message(err.message()) {
            err = err.with_retry_after(d);
        }
        self.flush_usage(report);
        if report.has_content() {
            err = err.with_class(FailureClass::StreamInterrupted);
        }
        err
    }

    /// A stream that reached its finish marker without any content is an empty answer (unless
    /// it stopped at the token limit: the caller may ask for more, a retry would not help).
    fn empty(&self, report: &BodyReport) -> Option<LlmError> {
        if report.has_content() || report.finish_reason() == Some(&FinishReason::Length) {
            return None;
        }
        let mut err = empty_answer();
        if let Some(id) = &self.request_id {
            err = err.with_request_id(&**id);
        }
        Some(err)
    }

    fn eof(&mut self, report: &BodyReport) -> Option<LlmError> {
        if !self.skipping && !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            if let Some(e) = self.on_line(&line, report) {
                return Some(e);
            }
        }
        if let Some(e) = self.dispatch(report) {
            return Some(e);
        }
        if self.finished {
            return self.empty(report);
        }
        self.flush_usage(report);
        if (self.events || self.foreign) && !self.known && !self.malformed {
            // Some other dialect: its end marker is unknown, so EOF is its end.
            return None;
        }
        let mut err =
            broken(report, "stream ended without its finish marker").with_status(StatusCode::OK);
        if let Some(id) = &self.request_id {
            err = err.with_request_id(&**id);
        }
        Some(err)
    }
}

/// Reads a JSON body through a head window (for `model`) and a rolling tail window (for
/// `usage` and the finish reason), parsed at the end.
#[derive(Debug, Default)]
pub(crate) struct JsonScanner {
    head: Vec<u8>,
    tail: Vec<u8>,
    total: usize,
    content: bool,
    /// Nesting depth outside strings, to tell a complete document from one cut short.
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// A top-level object or array was closed.
    closed: bool,
}

impl JsonScanner {
    fn feed(&mut self, chunk: &[u8], report: &BodyReport) {
        if !self.content && chunk.iter().any(|b| !b.is_ascii_whitespace()) {
            self.content = true;
            report.record_content();
        }
        self.total = self.total.saturating_add(chunk.len());
        self.track_nesting(chunk);
        if self.head.len() < JSON_HEAD {
            let take = (JSON_HEAD - self.head.len()).min(chunk.len());
            self.head.extend_from_slice(&chunk[..take]);
        }
        let chunk = &chunk[chunk.len().saturating_sub(JSON_TAIL)..];
        self.tail.extend_from_slice(chunk);
        if self.tail.len() > 2 * JSON_TAIL {
            let cut = self.tail.len() - JSON_TAIL;
            self.tail.drain(..cut);
        }
    }

    fn track_nesting(&mut self, chunk: &[u8]) {
        for &b in chunk {
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth = self.depth.saturating_add(1),
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        self.closed = true;
                    }
                }
                _ => {}
            }
        }
    }

    /// A JSON document that opened an object or array and ended before closing it was cut.
    fn cut_short(&self) -> bool {
        let opened = self
            .head
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|b| matches!(b, b'{' | b'['));
        self.depth > 0 || self.in_string || (opened && !self.closed)
    }

    fn eof(&mut self, report: &BodyReport) -> Option<LlmError> {
        if self.cut_short() {
            self.head = Vec::new();
            self.tail = Vec::new();
            return Some(
                broken(report, "JSON body ended before its end").with_status(StatusCode::OK),
            );
        }
        if self.total == self.tail.len() {
            // The whole body is in the tail window: parse it properly, reading only the few
            // fields the report needs (the rest is skipped, not built).
            if let Ok(body) = serde_json::from_slice::<WholeBody<'_>>(&self.tail) {
                body.report(report);
            }
        } else {
            if let Some(m) = error_body::string_field(&self.head, "model") {
                report.set_model(&m);
            }
            if let Some(at) = error_body::last_value_start(&self.tail, "usage", b'{') {
                let mut de =
                    serde_json::Deserializer::from_slice(&self.tail[at..]).into_iter::<Value>();
                if let Some(u) = de
                    .next()
                    .and_then(Result::ok)
                    .as_ref()
                    .and_then(RawUsage::from_value)
                {
                    report.set_usage(u.to_usage());
                }
            }
            let reason = ["finish_reason", "stop_reason"].iter().find_map(|k| {
                let at = error_body::last_value_start(&self.tail, k, b'"')?;
                let mut de =
                    serde_json::Deserializer::from_slice(&self.tail[at..]).into_iter::<String>();
                de.next()?.ok()
            });
            if let Some(r) = reason {
                report.set_finish_reason(finish_reason(&r));
            }
        }
        self.head = Vec::new();
        self.tail = Vec::new();
        report.set_finished();
        None
    }
}
