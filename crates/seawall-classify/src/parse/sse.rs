//! Server-sent events of both wire formats (OpenAI chat chunks and Responses events, Anthropic
//! messages events) read for the report and the verdict: model, usage, finish reason, whether
//! content came, an error event inside a `200`, and whether the stream reached its finish
//! marker. Lines and events come from [`seawall_core::SseDecoder`], shared with the stream
//! layer; only their meaning is read here.

use std::ops::ControlFlow;

use http::StatusCode;
use serde_json::Value;

use seawall_core::json_scan::JsonTape;
use seawall_core::{
    BodyReport, ChoiceEnds, FailureClass, FinishReason, LlmError, ReportedUsage, SseDecoder,
    SseEvent, SseItem,
};

use super::memo::{MEMO_SCRATCH_KEEP, Memo, Template};
use super::scan::View;
use super::usage;
use super::{broken, embedded_error, empty_answer};
use crate::error_body::ProviderError;
use crate::hints;

/// The largest SSE event (or line) kept; a longer one is skipped, counted as content, and
/// never buffered further.
const MAX_EVENT: usize = 1 << 20;

/// Whether a JSON value carries output: a non-empty string or array, an object, a number.
fn has_output<'a, V: View<'a>>(v: Option<V>) -> bool {
    v.is_some_and(V::has_output)
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum EventName {
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
    /// The OpenAI choices seen and those that gave their finish reason.
    choices: ChoiceEnds,
    /// Whether events are read by the scan first (always, but in the tests that hold it to
    /// the serde path).
    scan: bool,
    usage: Option<ReportedUsage>,
    request_id: Option<Box<str>>,
    memo: Memo,
    template: Template,
    /// When the chunk being fed arrived: read from the clock at its first content event, and
    /// shared by the others of the same chunk (a transport that read several events at once),
    /// instead of a clock read for each (about 20 ns on a virtual machine).
    chunk_at: Option<tokio::time::Instant>,
}

/// An event that is an error without an `error` member or type: vLLM's and other
/// OpenAI-compatible servers' `{"object": "error", "message": ..., "code": 400}`, or Google's
/// error objects in an array (`[{"error": ...}]`). Asked only of events with no choices.
fn is_error_object<'a, V: View<'a>>(v: V) -> bool {
    if v.get("object").and_then(V::as_str).as_deref() == Some("error") {
        return true;
    }
    let mut error = false;
    v.each(|e| error |= e.get("error").is_some_and(|x| !x.is_null()));
    error
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
            choices: ChoiceEnds::default(),
            scan: true,
            usage: None,
            request_id: request_id.map(Into::into),
            memo: Memo::default(),
            template: Template::default(),
            chunk_at: None,
        }
    }

    /// The upstream's request id, from the response head.
    pub(super) fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }

    pub(super) fn feed(&mut self, chunk: &[u8], report: &BodyReport) -> Option<LlmError> {
        self.chunk_at = None;
        let mut lines = std::mem::take(&mut self.lines);
        let flow = lines.feed(chunk, |item| self.on_item(item, report));
        self.lines = lines;
        flow.break_value()
    }

    /// Records a content event of the chunk being fed (see `chunk_at`).
    fn content(&mut self, report: &BodyReport) {
        let at = *self.chunk_at.get_or_insert_with(tokio::time::Instant::now);
        report.record_content_at(at);
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
                _ => self.content(report),
            }
            return None;
        }
        if event == EventName::Ping {
            return None;
        }
        // The usual event is read straight from its bytes; what the scan is not sure of is
        // built by serde, as it always was.
        if self.scan {
            // A content event shaped as the last one, with other text: all it does.
            if self.template.matches(event, data, report.model().is_some()) {
                self.template.tries = 0;
                self.known = true;
                self.content(report);
                return None;
            }
            if let Some(at) = self.memo.resumes(data) {
                let mut scratch = std::mem::take(&mut self.memo.scratch);
                scratch.clear();
                let mut tape = JsonTape::new();
                // The prefix ends after an ASCII `,`: the rest starts on a character.
                let read = std::str::from_utf8(&data[at..]).ok().and_then(|rest| {
                    scratch.push('{');
                    scratch.push_str(rest);
                    tape.read(&scratch)
                });
                let out = read.map(|root| {
                    let out = self.on_json(event, root, data, report);
                    let model_known = report.model().is_some();
                    // Byte `k` of `{` and the rest is byte `at + k - 1` of the event.
                    let to_event = |k: usize| (at + k).saturating_sub(1);
                    self.template
                        .learn(event, root, data, to_event, model_known);
                    out
                });
                // Kept for the next event, unless a rare large one grew it.
                if scratch.capacity() <= MEMO_SCRATCH_KEEP {
                    self.memo.scratch = scratch;
                }
                if let Some(out) = out {
                    self.memo.tries = 0;
                    return out;
                }
            }
            let mut tape = JsonTape::new();
            if let Ok(text) = std::str::from_utf8(data)
                && let Some(root) = tape.read(text)
            {
                let out = self.on_json(event, root, data, report);
                let model_known = report.model().is_some();
                self.memo.learn(text, model_known);
                self.template.learn(event, root, data, |k| k, model_known);
                return out;
            }
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
            self.content(report);
            return None;
        };
        self.on_json(event, &v, data, report)
    }

    /// Reads one event: `v` is its JSON (all of it, or what follows a remembered prefix),
    /// `data` its bytes.
    fn on_json<'a, V: View<'a>>(
        &mut self,
        event: EventName,
        v: V,
        data: &[u8],
        report: &BodyReport,
    ) -> Option<LlmError> {
        // The members every event is asked for, read in one walk.
        let [ty, error, choices, usage] = v.pick(["type", "error", "choices", "usage"]);
        let ty = ty.and_then(V::as_str);
        let ty = ty.as_deref().unwrap_or("");
        let error_field = error.is_some_and(|e| !e.is_null());
        if event == EventName::Error || ty == "error" || error_field {
            self.known = true;
            // An error is read from the whole event (the rare path; the whole event, since a
            // resumed reading does not see its prefix), by the parser of error bodies.
            return Some(self.stream_error(&ProviderError::parse(data), report));
        }
        if ty == "response.failed" {
            self.known = true;
            let e = match v.get("response") {
                Some(r) => r.provider_error(),
                None => ProviderError::parse(data),
            };
            return Some(self.stream_error(&e, report));
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
                    .any(|k| has_output(delta.and_then(|d| d.get(k))));
                if out {
                    self.content(report);
                }
            }
            "message_delta" => {
                self.known = true;
                if let Some(r) = v
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(V::as_str)
                {
                    report.set_finish_reason(FinishReason::from_provider(&r));
                }
                self.merge_usage(usage);
            }
            "message_stop" => {
                self.known = true;
                self.finish(report);
            }
            "content_block_start" => {
                self.known = true;
                // A tool use (its input may stream as empty deltas) or a block with text.
                let block = v.get("content_block");
                let kind = block.and_then(|b| b.get("type")).and_then(V::as_str);
                if !matches!(kind.as_deref(), None | Some("text" | "thinking"))
                    || has_output(block.and_then(|b| b.get("text")))
                {
                    self.content(report);
                }
            }
            "content_block_stop" | "ping" => self.known = true,
            t if t.starts_with("response.") => {
                self.known = true;
                if t.ends_with(".delta") && has_output(v.get("delta")) {
                    self.content(report);
                }
                if let Some(r) = v.get("response") {
                    Self::model(r, report);
                    if t == "response.completed" || t == "response.incomplete" {
                        self.merge_usage(r.get("usage"));
                        // A completed response stopped; an incomplete one without a
                        // reason did not (the stream layer reads it the same way).
                        let reason = r
                            .get("incomplete_details")
                            .and_then(|d| d.get("reason"))
                            .and_then(V::as_str);
                        let reason = reason.as_deref().unwrap_or(if t == "response.completed" {
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
                if let Some(choices) = choices {
                    let mut content = false;
                    let mut cut = None;
                    let mut ends = self.choices;
                    let array = choices.each(|c| {
                        let [delta, text, finish, index] =
                            c.pick(["delta", "text", "finish_reason", "index"]);
                        let word = finish.and_then(V::as_str);
                        ends.saw(index.and_then(V::as_u64), word.as_deref());
                        if let Some(d) = delta {
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
                            .any(|k| has_output(d.get(k)));
                        }
                        content |= has_output(text);
                        if let Some(r) = word {
                            if let Some(err) = super::cut_answer(&r) {
                                cut = Some(err);
                            }
                            report.set_finish_reason(FinishReason::from_provider(&r));
                        }
                    });
                    self.choices = ends;
                    if array {
                        self.known = true;
                        Self::model(v, report);
                        if content {
                            self.content(report);
                        }
                    }
                    if let Some(err) = cut {
                        return Some(self.finish_error(err, report));
                    }
                } else if is_error_object(v) {
                    self.known = true;
                    return Some(self.stream_error(&ProviderError::parse(data), report));
                }
                self.merge_usage(usage);
            }
        }
        None
    }

    fn model<'a, V: View<'a>>(v: V, report: &BodyReport) {
        if report.model().is_none() {
            if let Some(m) = v.get("model").and_then(V::as_str).filter(|m| !m.is_empty()) {
                report.set_model(&m);
            }
        }
    }

    fn merge_usage<'a, V: View<'a>>(&mut self, v: Option<V>) {
        if let Some(raw) = v.and_then(usage::from_view) {
            self.usage
                .get_or_insert_with(ReportedUsage::default)
                .merge(raw);
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
        self.finish_error(embedded_error(e, "error event inside a 200 stream"), report)
    }

    /// The stream's failure as the caller gets it: with the stream's request id and the usage
    /// so far, and `StreamInterrupted` once content was sent.
    fn finish_error(&self, mut err: LlmError, report: &BodyReport) -> LlmError {
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
        let mut err = empty_answer(report);
        if let Some(id) = &self.request_id {
            err = err.with_request_id(&**id);
        }
        Some(err)
    }

    pub(super) fn eof(&mut self, report: &BodyReport) -> Option<LlmError> {
        // An event the end completes arrived now, not with the last chunk.
        self.chunk_at = None;
        let mut lines = std::mem::take(&mut self.lines);
        let flow = lines.finish(|item| self.on_item(item, report));
        self.lines = lines;
        if let ControlFlow::Break(e) = flow {
            return Some(e);
        }
        if self.finished {
            return self.empty(report);
        }
        if self.choices.all_ended() && !self.malformed {
            // Every choice gave its finish reason: the answer is whole without `[DONE]`.
            self.finish(report);
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The content events of one chunk share the time it came at; a later chunk's, and an
    /// event the body's end completes, are timed when they come.
    #[tokio::test(start_paused = true)]
    async fn content_is_timed_by_the_chunk_it_came_in() {
        use std::time::Duration;
        use tokio::time::{Instant, advance};
        let delta = |text: &str| {
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
            )
        };
        let start = Instant::now();
        let report = BodyReport::starting_at(start);
        let mut p = SseParser::new(None, true);
        let three = [delta("a"), delta("b"), delta("c")].concat();
        assert!(p.feed(three.as_bytes(), &report).is_none());
        assert_eq!(report.content_events(), 3);
        assert_eq!(report.last_content_at(), Some(start));
        advance(Duration::from_secs(2)).await;
        assert!(p.feed(delta("d").as_bytes(), &report).is_none());
        assert_eq!(
            report.last_content_at(),
            Some(start + Duration::from_secs(2))
        );
        // A chunk of a whole event and one without its blank line, which the end completes
        // a second later.
        let last = format!("{}{}", delta("e"), delta("f").trim_end());
        assert!(p.feed(last.as_bytes(), &report).is_none());
        assert_eq!(report.content_events(), 5);
        advance(Duration::from_secs(1)).await;
        let _ = p.eof(&report);
        assert_eq!(report.content_events(), 6);
        assert_eq!(
            report.last_content_at(),
            Some(start + Duration::from_secs(3))
        );
        assert_eq!(report.time_to_first_token(), Some(Duration::ZERO));
    }

    /// What a stream left: the report's fields, the first error and the end's verdict.
    fn outcome(stream: &[u8], scan: bool) -> String {
        let report = BodyReport::new();
        let mut p = SseParser::new(Some("req_1"), false);
        p.scan = scan;
        let err = p.feed(stream, &report).or_else(|| p.eof(&report));
        let err = err.map(|e| {
            (
                e.class(),
                e.message().to_owned(),
                e.code().map(str::to_owned),
                e.error_type().map(str::to_owned),
                e.request_id().map(str::to_owned),
            )
        });
        format!(
            "{:?} {:?} {:?} {} {} {err:?}",
            report.usage(),
            report.model(),
            report.finish_reason(),
            report.is_finished(),
            report.content_events(),
        )
    }

    fn agree(stream: &[u8]) {
        assert_eq!(
            outcome(stream, true),
            outcome(stream, false),
            "{}",
            String::from_utf8_lossy(stream)
        );
    }

    const OPENAI: &str = concat!(
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\\u006co\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":1}}}\n\n",
        "data: [DONE]\n\n",
    );
    const ANTHROPIC: &str = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":2,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\ndata: {\"type\": \"ping\"}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":5}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    const RESPONSES: &str = concat!(
        "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"model\":\"gpt-4.1\",\"status\":\"in_progress\"}}\n\n",
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-4.1\",\"usage\":{\"input_tokens\":4,\"output_tokens\":2,\"input_tokens_details\":{\"cached_tokens\":0}}}}\n\n",
    );
    const ERRORS: &str = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";

    #[test]
    fn the_usual_streams_read_the_same_by_scan_and_serde() {
        for s in [OPENAI, ANTHROPIC, RESPONSES, ERRORS] {
            agree(s.as_bytes());
        }
        assert!(outcome(OPENAI.as_bytes(), true).contains("Some(Stop) true"));
    }

    #[test]
    fn the_usual_events_are_read_by_the_scan() {
        for s in [OPENAI, ANTHROPIC, RESPONSES] {
            for line in s.lines().filter_map(|l| l.strip_prefix("data: ")) {
                if line != "[DONE]" {
                    assert!(JsonTape::new().read(line).is_some(), "{line}");
                }
            }
        }
    }

    #[test]
    fn a_streams_repeated_leading_members_are_read_once() {
        let report = BodyReport::new();
        let mut p = SseParser::new(None, true);
        assert!(p.feed(OPENAI.as_bytes(), &report).is_none());
        // Learnt from the first chunk (the model known by then), resumed from in the others.
        assert_eq!(
            p.memo.prefix,
            br#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","#
        );
        assert_eq!(p.memo.tries, 0);
        // A large event read after the prefix (not a content event of the learnt shape: it
        // has a finish reason) leaves no large buffer behind.
        let large = format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}},\"finish_reason\":\"length\"}}]}}\n\n",
            "x".repeat(100_000)
        );
        assert!(p.feed(large.as_bytes(), &report).is_none());
        assert!(p.memo.scratch.capacity() <= super::super::memo::MEMO_SCRATCH_KEEP);
        // An Anthropic event starts with its type, which the reading needs: nothing to
        // remember, and after a few events the stream is no longer searched.
        let mut p = SseParser::new(None, true);
        assert!(p.feed(ANTHROPIC.as_bytes(), &report).is_none());
        assert!(p.memo.prefix.is_empty());
        assert_eq!(p.memo.tries, super::super::memo::MEMO_TRIES);
    }

    #[test]
    fn content_events_of_one_shape_are_read_without_laying_them_out() {
        let chunk = |text: &str| {
            format!(
                "data: {{\"id\":\"c1\",\"model\":\"gpt-4o\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"finish_reason\":null}}],\"obfuscation\":\"{text}{text}\"}}\n\n"
            )
        };
        let stream = [
            chunk("Hel"),
            chunk("lo"),
            chunk(""),
            chunk("w\\u00f6rld"),
            chunk("!"),
        ]
        .concat()
            + "data: {\"id\":\"c1\",\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        agree(stream.as_bytes());
        let report = BodyReport::new();
        let mut p = SseParser::new(None, true);
        assert!(p.feed(stream.as_bytes(), &report).is_none());
        assert!(p.eof(&report).is_none());
        // Four events with text: the first read in full (and its shape learnt), the others not.
        assert_eq!(report.content_events(), 4);
        assert_eq!(report.finish_reason(), Some(&FinishReason::Stop));
        assert!(p.template.tries <= 2, "{}", p.template.tries);
        let mut bare = SseParser::new(None, true);
        let one = chunk("x");
        assert!(bare.feed(one.as_bytes(), &report).is_none());
        assert!(
            bare.template.matches(
                EventName::Message,
                chunk("y")
                    .trim_start_matches("data: ")
                    .trim_end()
                    .as_bytes(),
                true
            )
        );
        // A usage before the choices, hidden in the first event by a `null` one after them:
        // an event without the later one is read in full (its usage is the earlier one).
        let hidden = concat!(
            "data: {\"usage\":{\"prompt_tokens\":5},\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n",
            "data: {\"usage\":{\"prompt_tokens\":5},\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
        );
        agree(hidden.as_bytes());
        assert!(outcome(hidden.as_bytes(), true).starts_with("Some(Usage { input_tokens: 5"));
        // A shape longer than a template keeps is not learnt (its events are read in full).
        let long = format!(
            "data: {{\"pad\":\"{}\",\"choices\":[{{\"delta\":{{\"content\":\"a\"}}}}]}}\n\n",
            "x".repeat(5000)
        );
        let mut p = SseParser::new(None, true);
        assert!(p.feed(long.repeat(2).as_bytes(), &report).is_none());
        assert!(
            !p.template
                .matches(EventName::Message, long[6..].trim_end().as_bytes(), true)
        );
        // Another member the reading asks for after the choices: read in full.
        let usage = chunk("y").replace("\"obfuscation\"", "\"usage\":{\"prompt_tokens\":1},\"o\"");
        let usage = usage.trim_start_matches("data: ").trim_end();
        assert!(
            !bare
                .template
                .matches(EventName::Message, usage.as_bytes(), true)
        );
    }

    #[test]
    fn an_error_after_a_remembered_prefix_is_read_from_the_whole_event() {
        let stream = concat!(
            "data: {\"request_id\":\"req_9\",\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
            "data: {\"request_id\":\"req_9\",\"model\":\"m\",\"error\":{\"message\":\"boom\"}}\n\n",
        );
        agree(stream.as_bytes());
        assert!(outcome(stream.as_bytes(), true).contains("Some(\"req_9\")"));
    }

    #[test]
    fn an_object_member_saying_error_is_never_left_in_a_remembered_prefix() {
        // The first event is content (its type says so); the second, with the same leading
        // bytes, has no type of its own any more, so its `"object": "error"` makes it an error.
        let stream = concat!(
            "data: {\"object\":\"error\",\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"text\":\"a\"}}\n\n",
            "data: {\"object\":\"error\",\"type\":null,\"message\":\"boom\"}\n\n",
        );
        agree(stream.as_bytes());
        let read = outcome(stream.as_bytes(), true);
        assert!(read.contains("Some((StreamInterrupted, \"boom\""), "{read}");
        let report = BodyReport::new();
        let mut p = SseParser::new(None, true);
        let _ = p.feed(stream.as_bytes(), &report);
        assert!(p.memo.prefix.is_empty());
    }

    /// Events that share their leading members, as a stream's do, some of them members the
    /// reading needs (so no prefix may pass over them).
    fn shared_prefix_stream() -> impl Strategy<Value = String> {
        let key = prop_oneof![
            Just("id"),
            Just("object"),
            Just("created"),
            Just("model"),
            Just("request_id"),
            Just("message"),
            Just("type"),
            Just("error"),
            Just("choices"),
            Just("usage"),
            Just("response"),
        ];
        let members = |n: usize| proptest::collection::vec((key.clone(), value(3)), 0..n);
        (members(4), proptest::collection::vec(members(4), 1..6)).prop_map(|(head, rests)| {
            rests
                .iter()
                .map(|rest| {
                    let m: Vec<_> = head
                        .iter()
                        .chain(rest)
                        .map(|(k, v)| format!("\"{k}\":{v}"))
                        .collect();
                    format!("data: {{{}}}\n\n", m.join(","))
                })
                .collect()
        })
    }

    /// `stream` with the byte at a place changed, if one is given.
    fn damaged(stream: String, damage: Option<(prop::sample::Index, u8)>) -> Vec<u8> {
        let mut stream = stream.into_bytes();
        if let Some((at, byte)) = damage {
            let i = at.index(stream.len());
            stream[i] = byte;
        }
        stream
    }

    /// Streams of content events of one of the three shapes, with other text in each, the
    /// same leading members and other trailing ones; some of those members ones the reading
    /// asks for.
    fn content_stream() -> impl Strategy<Value = String> {
        let text = prop_oneof![
            Just(""),
            Just("x"),
            Just("Hello"),
            Just("a\\u00e9b"),
            Just("\\\"q\\\""),
            Just("\u{e9}t\u{e9}"),
            Just("\\ud83d\\ude00"),
            Just("line\\n"),
        ];
        let key = || {
            prop_oneof![
                Just("id"),
                Just("object"),
                Just("model"),
                Just("usage"),
                Just("error"),
                Just("type"),
                Just("choices"),
                Just("obfuscation"),
                Just("text"),
                Just("partial_json"),
                Just("role"),
                Just("finish_reason"),
            ]
        };
        let members = move |n: usize| {
            proptest::collection::vec((key(), value(2)), 0..n).prop_map(|m| {
                m.iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect::<Vec<_>>()
            })
        };
        let event = (text, members(3), any::<bool>());
        (
            0u8..3,
            members(3),
            members(2),
            proptest::collection::vec(event, 1..6),
        )
            .prop_map(|(shape, head, extra, events)| {
                let extra: String = extra.iter().map(|m| format!("{m},")).collect();
                events
                    .iter()
                    .map(|(t, tail, usage)| {
                        let core = match shape {
                            0 => format!(
                                "\"choices\":[{{\"index\":0,\"delta\":{{{extra}\"content\":\"{t}\"}},\"finish_reason\":null}}]"
                            ),
                            1 => format!(
                                "\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{{extra}\"text\":\"{t}\"}}"
                            ),
                            _ => format!("\"type\":\"response.output_text.delta\",\"delta\":\"{t}\""),
                        };
                        let mut m = head.clone();
                        m.push(core);
                        m.extend(tail.iter().cloned());
                        if *usage {
                            m.push("\"usage\":null".to_owned());
                        }
                        format!("data: {{{}}}\n\n", m.join(","))
                    })
                    .collect()
            })
    }

    /// A JSON value built from the names and words the events use, nested a little.
    fn value(depth: u32) -> BoxedStrategy<String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            Just("\"\"".to_owned()),
            Just("\"x\"".to_owned()),
            Just("\"stop\"".to_owned()),
            Just("\"length\"".to_owned()),
            Just("\"end_turn\"".to_owned()),
            Just("\"error\"".to_owned()),
            Just("\"message_start\"".to_owned()),
            Just("\"message_delta\"".to_owned()),
            Just("\"message_stop\"".to_owned()),
            Just("\"content_block_delta\"".to_owned()),
            Just("\"content_block_start\"".to_owned()),
            Just("\"response.completed\"".to_owned()),
            Just("\"response.incomplete\"".to_owned()),
            Just("\"response.output_text.delta\"".to_owned()),
            Just("\"response.failed\"".to_owned()),
            Just("\"tool_use\"".to_owned()),
            Just("\"text\"".to_owned()),
            Just("\"st\\u006fp\"".to_owned()),
            Just("0".to_owned()),
            Just("-0".to_owned()),
            Just("-1".to_owned()),
            Just("2.5".to_owned()),
            Just("1e3".to_owned()),
            Just("[]".to_owned()),
            Just("{}".to_owned()),
            (0u64..1000).prop_map(|n| n.to_string()),
        ];
        if depth == 0 {
            return leaf.boxed();
        }
        let key = prop_oneof![
            Just("type"),
            Just("error"),
            Just("message"),
            Just("model"),
            Just("usage"),
            Just("delta"),
            Just("text"),
            Just("content"),
            Just("stop_reason"),
            Just("content_block"),
            Just("response"),
            Just("incomplete_details"),
            Just("reason"),
            Just("choices"),
            Just("finish_reason"),
            Just("prompt_tokens"),
            Just("completion_tokens"),
            Just("input_tokens"),
            Just("output_tokens"),
            Just("cache_read_input_tokens"),
            Just("prompt_tokens_details"),
            Just("total_tokens"),
            Just("cached_tokens"),
            Just("tool_calls"),
            Just("partial_json"),
        ];
        prop_oneof![
            3 => leaf,
            1 => proptest::collection::vec(value(depth - 1), 0..3)
                .prop_map(|v| format!("[{}]", v.join(","))),
            3 => proptest::collection::vec((key, value(depth - 1)), 0..5).prop_map(|m| {
                let m: Vec<_> = m.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
                format!("{{{}}}", m.join(","))
            }),
        ]
        .boxed()
    }

    fn event() -> impl Strategy<Value = String> {
        let name = prop_oneof![
            Just(""),
            Just("event: error\n"),
            Just("event: message_stop\n"),
            Just("event: ping\n"),
            Just("event: content_block_delta\n"),
        ];
        (name, value(4)).prop_map(|(n, v)| format!("{n}data: {v}\n\n"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(800))]

        #[test]
        fn scan_and_serde_read_generated_streams_the_same(
            events in proptest::collection::vec(event(), 1..5),
            done in any::<bool>(),
        ) {
            let mut stream = events.concat();
            if done {
                stream.push_str("data: [DONE]\n\n");
            }
            agree(stream.as_bytes());
        }

        #[test]
        fn events_read_after_a_remembered_prefix_read_as_serde_reads_them(
            stream in shared_prefix_stream(),
            damage in proptest::option::of((any::<prop::sample::Index>(), any::<u8>())),
        ) {
            agree(&damaged(stream, damage));
        }

        #[test]
        fn content_events_read_by_their_shape_read_as_serde_reads_them(
            stream in content_stream(),
            damage in proptest::option::of((any::<prop::sample::Index>(), any::<u8>())),
        ) {
            agree(&damaged(stream, damage));
        }

        #[test]
        fn scan_and_serde_read_damaged_streams_the_same(
            which in 0usize..4,
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            mode in 0u8..3,
        ) {
            let mut stream = [OPENAI, ANTHROPIC, RESPONSES, ERRORS][which].as_bytes().to_vec();
            match mode {
                0 => stream.truncate(at.index(stream.len() + 1)),
                1 => { let i = at.index(stream.len()); stream[i] = byte; }
                _ => { let i = at.index(stream.len() + 1); stream.insert(i, byte); }
            }
            agree(&stream);
        }
    }
}
