//! Plain JSON answers: read whole when the body is small enough to hold (the fields the report
//! and the verdict need, nothing else built), or streamed through a head window (the model is
//! near the start) and a rolling tail window (usage and finish reason are near the end).

use serde_json::Value;
use std::borrow::Cow;

use http::StatusCode;
use seawall_core::{BodyReport, FinishReason, LlmError, ReportedUsage, Usage};

use super::broken;
use super::usage;
use crate::error_body::{self, ProviderError};

/// The first bytes of a JSON body kept (the model is near the start).
const JSON_HEAD: usize = 4 << 10;
/// The last bytes of a JSON body kept (usage and finish reason are near the end).
const JSON_TAIL: usize = 16 << 10;

/// The fields of a whole (non-streamed) JSON answer that the report and the verdict need; serde
/// skips the rest without building it.
#[derive(serde::Deserialize)]
struct WholeBody<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<ReportedUsage>,
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
    /// The Responses API's `status`, `incomplete_details` and `output` items.
    #[serde(borrow, default)]
    status: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    incomplete_details: Option<IncompleteWire<'a>>,
    #[serde(default)]
    output: Option<Output>,
    /// An error object in a `200` (`null` reads as `None`).
    #[serde(default)]
    error: Option<Value>,
    #[serde(borrow, default)]
    request_id: Option<Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
struct IncompleteWire<'a> {
    #[serde(borrow, default)]
    reason: Option<Cow<'a, str>>,
}

#[derive(serde::Deserialize, Clone, Copy)]
struct ResponseWire {
    #[serde(default)]
    usage: Option<ReportedUsage>,
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
    Error(Box<ProviderError>),
    /// An answer whose finish word says it failed: its error.
    Cut(Box<LlmError>),
    /// A finished answer without any content.
    Empty,
}

/// What the report and the verdict read of a whole answer, by either path: the byte scan
/// ([`scan::whole`](super::scan::whole)) or serde ([`WholeBody::facts`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Facts<'a> {
    pub(super) model: Option<Cow<'a, str>>,
    /// The usage (`usage`, else the Responses API's `response.usage`), if it has counts.
    pub(super) usage: Option<ReportedUsage>,
    /// The first choice's `finish_reason`, else `stop_reason`.
    pub(super) finish: Option<Cow<'a, str>>,
    /// `Some(any choice has output)` when there is a `choices` array.
    pub(super) choices: Option<bool>,
    pub(super) object: Option<Cow<'a, str>>,
    pub(super) kind: Option<Cow<'a, str>>,
    /// Whether Anthropic's `content` carries output.
    pub(super) content: bool,
    /// The Responses API's `status` (`completed`, `incomplete`, `in_progress`, ...).
    pub(super) status: Option<Cow<'a, str>>,
    /// The Responses API's `incomplete_details.reason`.
    pub(super) incomplete: Option<Cow<'a, str>>,
    /// `Some(any item carries output)` when there is a Responses API `output` array.
    pub(super) output: Option<bool>,
}

impl WholeBody<'_> {
    fn facts(&self) -> Facts<'_> {
        let usage = self.usage.or(self.response.and_then(|r| r.usage));
        let finish = self
            .choices
            .as_ref()
            .and_then(|c| c.first())
            .and_then(|c| c.finish_reason.as_deref())
            .or(self.stop_reason.as_deref());
        Facts {
            model: self.model.as_deref().map(Cow::Borrowed),
            usage: usage.filter(ReportedUsage::has_counts),
            finish: finish.map(Cow::Borrowed),
            choices: self
                .choices
                .as_ref()
                .map(|c| c.iter().any(ChoiceWire::has_output)),
            object: self.object.as_deref().map(Cow::Borrowed),
            kind: self.kind.as_deref().map(Cow::Borrowed),
            content: self.content.is_some_and(|c| c.0),
            status: self.status.as_deref().map(Cow::Borrowed),
            incomplete: self
                .incomplete_details
                .as_ref()
                .and_then(|d| d.reason.as_deref())
                .map(Cow::Borrowed),
            output: self.output.map(|o| o.0),
        }
    }

    /// The error object of a `200`, if the answer is one.
    fn error(self) -> Option<ProviderError> {
        let error = self.error?;
        // The shape [`ProviderError::from_value`] reads, with Anthropic's outer fields.
        let mut top = serde_json::Map::new();
        if let Some(kind) = self.kind {
            top.insert("type".into(), Value::String(kind.into_owned()));
        }
        if let Some(id) = self.request_id {
            top.insert("request_id".into(), Value::String(id.into_owned()));
        }
        top.insert("error".into(), error);
        Some(ProviderError::from_value(&Value::Object(top)))
    }
}

impl Facts<'_> {
    /// Whether this is a Responses API answer that finished (`completed` or `incomplete`; a
    /// background one is `queued` or `in_progress`, with nothing in it yet).
    fn finished_response(&self) -> bool {
        self.object.as_deref() == Some("response")
            && matches!(self.status.as_deref(), Some("completed" | "incomplete"))
    }

    /// The finish word: the first choice's, else `stop_reason`, else a finished Responses API
    /// answer's (its `incomplete_details.reason`, or a natural stop when `completed`), as the
    /// stream parser reads `response.completed` and `response.incomplete`.
    fn finish_word(&self) -> Option<&str> {
        self.finish.as_deref().or_else(|| {
            match (self.object.as_deref()?, self.status.as_deref()?) {
                ("response", "completed") => Some("stop"),
                ("response", "incomplete") => self.incomplete.as_deref(),
                _ => None,
            }
        })
    }

    /// What the report records: the model, the usage, the finish reason.
    fn recorded(&self) -> (Option<&str>, Option<Usage>, Option<FinishReason>) {
        (
            self.model.as_deref(),
            self.usage.map(|u| u.to_usage()),
            self.finish_word().map(FinishReason::from_provider),
        )
    }

    /// Writes them into a report nothing shares yet.
    fn report(&self, report: &mut BodyReport) {
        let (model, usage, finish) = self.recorded();
        report.record_answer(model, usage, finish);
    }

    /// Writes them into a shared report.
    fn report_shared(&self, report: &BodyReport) {
        let (model, usage, finish) = self.recorded();
        if let Some(m) = model {
            report.set_model(m);
        }
        if let Some(u) = usage {
            report.set_usage(u);
        }
        if let Some(f) = finish {
            report.set_finish_reason(f);
        }
    }

    /// The error of an answer that is not one: a body that is itself an error object, with no
    /// `error` member (vLLM's and other OpenAI-compatible servers' `{"object": "error",
    /// "message": ..., "code": 400}`), or an answer whose finish word says it failed
    /// (DeepSeek's lack of resources, a router's `error`).
    fn failure(&self, body: &[u8]) -> Option<Verdict> {
        if self.object.as_deref() == Some("error") {
            return Some(Verdict::Error(Box::new(ProviderError::parse(body))));
        }
        let err = super::cut_answer(self.finish_word()?)?;
        Some(Verdict::Cut(Box::new(err)))
    }

    /// The verdict on an answer without an error object.
    fn verdict(&self, report: &BodyReport) -> Verdict {
        // Stopped at the token limit: nothing to retry, the caller may ask for more.
        if report.finish_reason() == Some(&FinishReason::Length) {
            return Verdict::Answer;
        }
        let empty = match (self.choices, self.object.as_deref(), self.kind.as_deref()) {
            (Some(output), _, _) => !output,
            (None, Some("chat.completion" | "text_completion"), _) => true,
            // A finished Responses API answer with no output items.
            (None, Some("response"), _) => self.finished_response() && self.output != Some(true),
            (None, _, Some("message")) => !self.content,
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
///
/// The byte scan reads the usual answer; whatever it is not sure of (an error object, odd
/// spellings, damage) is read by serde, which decides.
pub(crate) fn read_whole(body: &[u8], report: &mut BodyReport) -> Option<Verdict> {
    // Nothing but blank lines (or nothing): DeepSeek keeps a slow request alive with empty
    // lines and may close the connection without an answer. A JSON answer with no document
    // is no answer.
    if body.iter().all(u8::is_ascii_whitespace) {
        return Some(Verdict::Empty);
    }
    let verdict = if let Some(facts) = super::scan::whole(body) {
        facts.report(report);
        facts.failure(body).unwrap_or_else(|| facts.verdict(report))
    } else {
        let whole = serde_json::from_slice::<WholeBody<'_>>(body).ok()?;
        let facts = whole.facts();
        facts.report(report);
        let verdict = facts.failure(body).unwrap_or_else(|| facts.verdict(report));
        match whole.error() {
            Some(e) => Verdict::Error(Box::new(e)),
            None => verdict,
        }
    };
    if matches!(verdict, Verdict::Answer) {
        // Not blank (checked above): there is content.
        report.record_content();
        report.set_finished();
    }
    Some(verdict)
}

/// The facts serde reads of a whole answer (`None`: not a document it reads), and whether it
/// holds an error object: what the scan must agree with.
#[cfg(test)]
pub(super) fn serde_facts(body: &[u8]) -> Option<(Facts<'static>, bool)> {
    let whole = serde_json::from_slice::<WholeBody<'_>>(body).ok()?;
    let f = whole.facts();
    let owned = |c: Option<Cow<'_, str>>| c.map(|c| Cow::Owned(c.into_owned()));
    let facts = Facts {
        model: owned(f.model),
        usage: f.usage,
        finish: owned(f.finish),
        choices: f.choices,
        object: owned(f.object),
        kind: owned(f.kind),
        content: f.content,
        status: owned(f.status),
        incomplete: owned(f.incomplete),
        output: f.output,
    };
    Some((facts, whole.error.is_some()))
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
    pub(super) fn feed(&mut self, chunk: &[u8], report: &BodyReport) {
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

    pub(super) fn eof(&mut self, report: &BodyReport) -> Option<LlmError> {
        if !self.content {
            // Only blank lines, past the read-ahead limit: no document, no answer.
            self.head = Vec::new();
            self.tail = Vec::new();
            return Some(super::empty_answer(report));
        }
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
                body.facts().report_shared(report);
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
                    .and_then(usage::from_view)
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
                report.set_finish_reason(FinishReason::from_provider(&r));
            }
        }
        self.head = Vec::new();
        self.tail = Vec::new();
        report.set_finished();
        None
    }
}
