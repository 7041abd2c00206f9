//! Server-sent events of both wire formats (OpenAI chat chunks and Responses events, Anthropic
//! messages events) read for the report and the verdict: model, usage, finish reason, whether
//! content came, an error event inside a `200`, and whether the stream reached its finish
//! marker. Lines and events come from [`seawall_core::SseDecoder`], shared with the stream
//! layer; only their meaning is read here.

use std::ops::ControlFlow;

use http::StatusCode;
use serde_json::Value;

use seawall_core::{
    BodyReport, FailureClass, FinishReason, LlmError, SseDecoder, SseEvent, SseItem,
};

use super::usage::RawUsage;
use super::{broken, embedded_error, empty_answer};
use crate::error_body::ProviderError;
use crate::hints;

/// The largest SSE event (or incomplete line) kept; a longer one is skipped, counted as
/// content, and never buffered further.
const MAX_EVENT: usize = 1 << 20;

/// Whether a JSON value carries output: a non-empty string or array, an object, a number.
fn has_output(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null | Value::Bool(false)) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
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

impl EventName {
    fn of(name: &[u8]) -> EventName {
        match name {
            b"error" => EventName::Error,
            b"ping" => EventName::Ping,
            b"message_stop" | b"response.completed" | b"response.incomplete" => EventName::Finish,
            b"" | b"message" => EventName::Message,
            _ => EventName::Other,
        }
    }
}

/// Gives the events of an SSE stream their meaning for the report and the verdict; the lines
/// and events themselves come from the shared [`SseDecoder`].
#[derive(Debug)]
pub(crate) struct SseParser {
    lines: SseDecoder,
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
    usage: Option<RawUsage>,
    request_id: Option<Box<str>>,
}

impl SseParser {
    /// `known_api`: the request went to OpenAI or Anthropic, so the finish marker is expected
    /// even before an event of theirs was recognised.
    pub(super) fn new(request_id: Option<&str>, known_api: bool) -> SseParser {
        SseParser {
            lines: SseDecoder::new(MAX_EVENT),
            events: false,
            foreign: false,
            known: known_api,
            malformed: false,
            finished: false,
            usage: None,
            request_id: request_id.map(Into::into),
        }
    }

    /// The upstream's request id, from the response head.
    pub(super) fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }

    pub(super) fn feed(&mut self, chunk: &[u8], report: &BodyReport) -> Option<LlmError> {
        let mut lines = std::mem::take(&mut self.lines);
        let flow = lines.feed(chunk, |item| self.on_item(item, report));
        self.lines = lines;
        flow.break_value()
    }

    fn on_item(&mut self, item: SseItem<'_>, report: &BodyReport) -> ControlFlow<LlmError> {
        match item {
            SseItem::Event(e) => self.dispatch(e, report),
            // Not SSE at all (say, JSON without a content type on a `stream: true` request).
            SseItem::OtherField { .. } => {
                self.foreign = true;
                ControlFlow::Continue(())
            }
            // Counted as content when its event ends.
            SseItem::Overflow => ControlFlow::Continue(()),
        }
    }

    fn dispatch(&mut self, e: SseEvent<'_>, report: &BodyReport) -> ControlFlow<LlmError> {
        if e.data.is_empty() && !e.oversized {
            return ControlFlow::Continue(()); // an event with empty data
        }
        self.events = true;
        match self.on_event(
            EventName::of(e.name),
            e.oversized,
            e.data.trim_ascii(),
            report,
        ) {
            Some(err) => ControlFlow::Break(err),
            None => ControlFlow::Continue(()),
        }
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
                    report.set_finish_reason(FinishReason::from_provider(r));
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
                        // A completed response stopped; an incomplete one without a
                        // reason did not (the stream layer reads it the same way).
                        let reason = r
                            .pointer("/incomplete_details/reason")
                            .and_then(Value::as_str)
                            .unwrap_or(if t == "response.completed" {
                                "stop"
                            } else {
                                "incomplete"
                            });
                        report.set_finish_reason(FinishReason::from_provider(reason));
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
                            report.set_finish_reason(FinishReason::from_provider(r));
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

    pub(super) fn flush_usage(&self, report: &BodyReport) {
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

    pub(super) fn eof(&mut self, report: &BodyReport) -> Option<LlmError> {
        let mut lines = std::mem::take(&mut self.lines);
        let flow = lines.finish(|item| self.on_item(item, report));
        self.lines = lines;
        if let ControlFlow::Break(e) = flow {
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
