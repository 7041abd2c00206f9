//! A small server-sent-events reader, used only when no classifier reports on the body.
//!
//! It answers three questions and nothing more: did a frame carry real content (not a
//! `: keep-alive` comment, a blank line, a ping or an OpenAI role-only delta)? did the stream
//! reach its finish marker (`data: [DONE]`, a finish reason for every choice, Anthropic
//! `message_stop`, Responses `response.completed`)? did the upstream send an error event?
//! Before the commit point every event's data is parsed (a handful of small frames); after it
//! only data that can hold a finish marker or an error is.
//!
//! Lines and events are read by [`seawall_core::SseDecoder`], the splitter the classifier uses
//! too (LF, CR or CRLF endings, a byte order mark skipped, one optional space after the colon,
//! the `data:` lines of one event joined), so an error object split over lines is still an
//! error; this module only gives the events their meaning for the stream layer.

use std::ops::ControlFlow;

use seawall_core::{ChoiceEnds, FailureClass, FinishReason, LlmError, SseDecoder, SseItem};
use serde_json::Value;
use tokio::time::Instant;

/// The longest line, or event data, kept (whether the line came in one frame or across
/// several). A longer one is dropped and counted as content.
const MAX_LINE: usize = 256 * 1024;

/// What one frame showed.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// The frame held real content.
    pub(crate) content: bool,
    /// The frame held an error event.
    pub(crate) error: Option<LlmError>,
}

/// The `event:` names the reader tells apart.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Name {
    #[default]
    Other,
    Error,
    Ping,
}

impl Name {
    fn of(name: &[u8]) -> Name {
        match name {
            b"error" => Name::Error,
            b"ping" => Name::Ping,
            _ => Name::Other,
        }
    }
}

/// The reader's state across frames.
#[derive(Debug)]
pub(crate) struct SseScan {
    /// Lines and events, as the spec reads them.
    lines: SseDecoder,
    finished: bool,
    /// OpenAI choices and their finish reasons. After the commit point only events that may
    /// end or fail the stream are read, so a choice whose first chunk comes after it is known
    /// only once it finishes.
    choices: ChoiceEnds,
    finish_reason: Option<FinishReason>,
    content_events: u64,
    first_content: Option<Instant>,
    last_content: Option<Instant>,
}

impl Default for SseScan {
    fn default() -> Self {
        SseScan {
            lines: SseDecoder::new(MAX_LINE),
            finished: false,
            choices: ChoiceEnds::default(),
            finish_reason: None,
            content_events: 0,
            first_content: None,
            last_content: None,
        }
    }
}

impl SseScan {
    /// Whether the finish marker was seen. A `data: [DONE]` that the stream's end cut off from
    /// its blank line counts: the upstream said it was done.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
            || self
                .lines
                .pending_data()
                .is_some_and(|d| d.trim_ascii() == b"[DONE]")
    }

    /// Whether the stream said it stopped at the token limit.
    pub(crate) fn hit_length_limit(&self) -> bool {
        self.finish_reason == Some(FinishReason::Length)
    }

    /// Whether the provider's content filter stopped the stream (`content_filter`, `refusal`).
    pub(crate) fn was_filtered(&self) -> bool {
        self.finish_reason == Some(FinishReason::ContentFilter)
    }

    /// The finish reason, once seen (taken, so it is handed on once).
    pub(crate) fn take_finish_reason(&mut self) -> Option<FinishReason> {
        self.finish_reason.take()
    }

    /// Mean time per content event after the first.
    pub(crate) fn time_per_event(&self) -> Option<std::time::Duration> {
        let (first, last) = (self.first_content?, self.last_content?);
        if self.content_events < 2 {
            return None;
        }
        let n = u32::try_from(self.content_events - 1).unwrap_or(u32::MAX);
        Some(last.saturating_duration_since(first) / n)
    }

    /// Reads one frame. `committed` says whether content has already begun: after that, plain
    /// deltas are only counted, not parsed.
    pub(crate) fn feed(&mut self, data: &[u8], committed: bool) -> Seen {
        let mut seen = Seen::default();
        let mut lines = std::mem::take(&mut self.lines);
        let _ = lines.feed(data, |item| {
            match item {
                // Too long to keep: not a keep-alive, whatever it is.
                SseItem::Overflow => self.content(&mut seen),
                // An oversized event was counted when it outgrew the limit.
                SseItem::Event(e) if !e.oversized => {
                    let name = Name::of(e.name);
                    self.payload(e.data.trim_ascii(), name, committed, &mut seen);
                }
                // Other fields say nothing about content.
                SseItem::Event(_) | SseItem::OtherField { .. } => {}
            }
            ControlFlow::<()>::Continue(())
        });
        self.lines = lines;
        seen
    }

    fn content(&mut self, seen: &mut Seen) {
        let now = Instant::now();
        self.first_content.get_or_insert(now);
        self.last_content = Some(now);
        self.content_events += 1;
        seen.content = true;
    }

    fn payload(&mut self, payload: &[u8], name: Name, committed: bool, seen: &mut Seen) {
        if payload == b"[DONE]" {
            self.finished = true;
            return;
        }
        if payload.is_empty() || name == Name::Ping {
            return;
        }
        let error_event = name == Name::Error;
        if committed && !error_event && !may_end_or_fail(payload) {
            self.content(seen);
            return;
        }
        let Ok(v) = serde_json::from_slice::<Value>(payload) else {
            if error_event {
                seen.error = Some(error_event_of(&Value::Null));
            } else {
                // Not JSON: whatever it is, it is not a keep-alive.
                self.content(seen);
            }
            return;
        };
        if error_event {
            let e = v.get("error").filter(|e| !e.is_null()).unwrap_or(&v);
            seen.error = Some(error_event_of(e));
            return;
        }
        self.event(&v, seen);
    }

    fn event(&mut self, v: &Value, seen: &mut Seen) {
        // vLLM's and other OpenAI-compatible servers' error event is the error object itself,
        // its `type` the error's (`BadRequestError`), not an event's.
        if v.get("object").and_then(Value::as_str) == Some("error") {
            seen.error = Some(error_event_of(v));
            return;
        }
        if let Some(kind) = v.get("type").and_then(Value::as_str) {
            return self.typed_event(kind, v, seen);
        }
        if let Some(choices) = v.get("choices").and_then(Value::as_array) {
            let mut content = false;
            for c in choices {
                let word = c.get("finish_reason").and_then(Value::as_str);
                self.choices
                    .saw(c.get("index").and_then(Value::as_u64), word);
                if let Some(r) = word {
                    if let Some(err) = FinishReason::failure(r) {
                        seen.error = Some(err);
                    }
                    // The stream ends once every choice finished (`ChoiceEnds`).
                    self.finish(r, false);
                }
                let delta = c.get("delta").unwrap_or(c);
                content |= delta_has_content(delta);
            }
            if self.choices.all_ended() {
                self.finished = true;
            }
            if content {
                self.content(seen);
            }
            return;
        }
        if let Some(e) = error_object(v) {
            seen.error = Some(error_event_of(e));
            return;
        }
        if v.get("usage").is_some() && v.as_object().is_some_and(|o| o.len() <= 4) {
            // A usage-only chunk (`stream_options.include_usage`) is not content.
            return;
        }
        self.content(seen);
    }

    fn typed_event(&mut self, kind: &str, v: &Value, seen: &mut Seen) {
        match kind {
            "message_start" | "ping" | "content_block_stop" => {}
            "content_block_start" => {
                let text = v.pointer("/content_block/text").and_then(Value::as_str);
                if text.is_some_and(|t| !t.is_empty()) {
                    self.content(seen);
                }
            }
            "message_delta" => {
                if let Some(r) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.finish(r, false);
                }
            }
            "message_stop" => self.finished = true,
            "error" | "response.failed" => {
                let e = v
                    .get("error")
                    .or_else(|| v.pointer("/response/error"))
                    .unwrap_or(v);
                seen.error = Some(error_event_of(e));
            }
            "response.completed" => self.finish("stop", true),
            "response.incomplete" => {
                let why = v
                    .pointer("/response/incomplete_details/reason")
                    .and_then(Value::as_str)
                    .unwrap_or("incomplete");
                self.finish(why, true);
            }
            k if k.ends_with(".delta") => self.content(seen),
            k if k.starts_with("response.") => {}
            _ => self.content(seen),
        }
    }

    fn finish(&mut self, reason: &str, marks_end: bool) {
        if self.finish_reason.is_none() {
            self.finish_reason = Some(FinishReason::from_provider(reason));
        }
        if marks_end {
            self.finished = true;
        }
    }
}

/// Whether an OpenAI delta (or a legacy completion choice) carries something for the caller.
fn delta_has_content(delta: &Value) -> bool {
    let non_empty = |k: &str| match delta.get(k) {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    };
    [
        "content",
        "text",
        "tool_calls",
        "function_call",
        "refusal",
        "reasoning_content",
        "reasoning",
    ]
    .iter()
    .any(|k| non_empty(k))
}

/// After the commit point, only a payload that names a finish or an error is parsed.
fn may_end_or_fail(payload: &[u8]) -> bool {
    has_value(payload, b"\"finish_reason\"")
        || has_value(payload, b"\"stop_reason\"")
        || find(payload, b"message_stop").is_some()
        || find(payload, b"\"error\"").is_some()
        || find(payload, b"\"response.").is_some()
}

/// Whether `key` occurs with a value other than `null`.
fn has_value(hay: &[u8], key: &[u8]) -> bool {
    let mut rest = hay;
    while let Some(i) = find(rest, key) {
        rest = &rest[i + key.len()..];
        let after = rest.trim_ascii_start();
        if let Some(v) = after.strip_prefix(b":") {
            if !v.trim_ascii_start().starts_with(b"null") {
                return true;
            }
        }
    }
    false
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

/// The error an untyped event without choices holds: its `error` member, or the `error` of an
/// element of an array (Google's `[{"error": ...}]`).
fn error_object(v: &Value) -> Option<&Value> {
    fn member(v: &Value) -> Option<&Value> {
        v.get("error").filter(|e| !e.is_null())
    }
    member(v).or_else(|| v.as_array()?.iter().find_map(member))
}

/// An error event (`event: error` of Anthropic, `{"error":…}` of OpenAI-compatible servers) as
/// an [`LlmError`]. A small mapping for stacks without a classifier; the classifier's is finer.
fn error_event_of(e: &Value) -> LlmError {
    let kind = e
        .get("type")
        .or_else(|| e.get("code"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let message = e
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("error event in the stream");
    let class = match kind {
        "overloaded_error" | "overloaded" => FailureClass::Overloaded,
        "rate_limit_error" | "rate_limit_exceeded" => FailureClass::RateLimited,
        "timeout_error" => FailureClass::UpstreamTimeout,
        "invalid_request_error" => FailureClass::InvalidRequest,
        "authentication_error" => FailureClass::Authentication,
        "permission_error" => FailureClass::PermissionDenied,
        "not_found_error" => FailureClass::NotFound,
        "request_too_large" => FailureClass::ContextLengthExceeded,
        _ => FailureClass::ServerError,
    };
    let err = LlmError::new(class, message);
    if kind.is_empty() {
        err
    } else {
        err.with_error_type(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scan_all(chunks: &[&[u8]]) -> (SseScan, Vec<bool>, Option<LlmError>) {
        let mut s = SseScan::default();
        let mut contents = Vec::new();
        let mut err = None;
        for c in chunks {
            let seen = s.feed(c, false);
            contents.push(seen.content);
            err = err.or(seen.error);
        }
        (s, contents, err)
    }

    #[test]
    fn keepalives_pings_and_role_only_deltas_are_not_content() {
        let (s, contents, err) = scan_all(&[
            b": keep-alive\n\n",
            b"\n\n",
            b"event: ping\ndata: {\"type\":\"ping\"}\n\n",
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
            b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"stop_reason\":null}}\n\n",
            b"data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\n",
        ]);
        assert_eq!(contents, [false; 7]);
        assert!(err.is_none());
        assert!(!s.is_finished());
    }

    #[test]
    fn deltas_are_content_and_markers_finish() {
        let (mut s, contents, _) = scan_all(&[
            b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
            b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n",
        ]);
        assert_eq!(contents, [true, false]);
        assert!(s.is_finished());
        assert_eq!(s.take_finish_reason(), Some(FinishReason::Length));

        let (mut s, contents, _) = scan_all(&[
            b"event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\r\n\r\n",
            b"data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"}}\n\n",
        ]);
        assert_eq!(contents, [true, false]);
        assert!(!s.is_finished(), "message_stop not seen yet");
        assert_eq!(s.take_finish_reason(), Some(FinishReason::Length));
        s.feed(
            b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            true,
        );
        assert!(s.is_finished());
    }

    #[test]
    fn error_events_are_classified() {
        let (_, _, err) = scan_all(&[
            b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
        ]);
        let err = err.unwrap();
        assert_eq!(err.class(), FailureClass::Overloaded);
        assert_eq!(err.error_type(), Some("overloaded_error"));
        let mut s = SseScan::default();
        let seen = s.feed(
            b"data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}\n\n",
            true,
        );
        assert_eq!(seen.error.unwrap().class(), FailureClass::ServerError);
    }

    #[test]
    fn a_stream_ends_once_every_choice_gave_its_finish_reason() {
        let chunk = |index: u64, finish: &str| {
            format!(
                "data: {{\"choices\":[{{\"index\":{index},\"delta\":{{\"content\":\"x\"}},\"finish_reason\":{finish}}}]}}\n\n"
            )
        };
        let mut s = SseScan::default();
        s.feed(chunk(0, "null").as_bytes(), false);
        s.feed(chunk(1, "null").as_bytes(), false);
        s.feed(chunk(0, "\"stop\"").as_bytes(), true);
        assert!(!s.is_finished(), "choice 1 has not finished");
        s.feed(chunk(1, "\"stop\"").as_bytes(), true);
        assert!(s.is_finished());
        // An empty finish reason is no finish.
        let mut s = SseScan::default();
        s.feed(chunk(0, "\"\"").as_bytes(), false);
        assert!(!s.is_finished());
    }

    #[test]
    fn a_finish_word_that_says_the_answer_failed_is_that_failure() {
        for (word, class) in [
            ("insufficient_system_resource", FailureClass::Overloaded),
            ("error", FailureClass::ServerError),
            ("network_error", FailureClass::ServerError),
        ] {
            let event = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"\"}},\"finish_reason\":\"{word}\"}}]}}\n\n"
            );
            for committed in [false, true] {
                let seen = SseScan::default().feed(event.as_bytes(), committed);
                assert_eq!(seen.error.map(|e| e.class()), Some(class), "{word}");
            }
        }
    }

    #[test]
    fn an_event_that_is_itself_an_error_object_is_an_error_not_content() {
        for (event, class) in [
            // vLLM: the error object is the event.
            (
                &b"data: {\"object\":\"error\",\"message\":\"too long\",\"type\":\"BadRequestError\",\"code\":400}\n\n"[..],
                FailureClass::ServerError,
            ),
            // Google's error objects in an array.
            (
                b"data: [{\"error\":{\"code\":503,\"message\":\"busy\",\"type\":\"overloaded_error\"}}]\n\n",
                FailureClass::Overloaded,
            ),
        ] {
            for committed in [false, true] {
                let seen = SseScan::default().feed(event, committed);
                assert!(!seen.content);
                assert_eq!(seen.error.map(|e| e.class()), Some(class));
            }
        }
        // A null error is none.
        let seen = SseScan::default().feed(b"data: {\"error\":null,\"id\":\"x\"}\n\n", false);
        assert!(seen.error.is_none());
    }

    #[test]
    fn committed_plain_deltas_are_counted_without_parsing_and_markers_still_found() {
        let mut s = SseScan::default();
        let seen = s.feed(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n",
            true,
        );
        assert!(seen.content);
        s.feed(
            b"data: {\"choices\":[{\"delta\":{},\"finish_reason\" : \"stop\"}]}\n\n",
            true,
        );
        assert!(s.is_finished());
        assert_eq!(s.take_finish_reason(), Some(FinishReason::Stop));
    }

    #[test]
    fn an_overlong_line_counts_as_content_and_is_not_kept() {
        let mut s = SseScan::default();
        let big = vec![b'x'; MAX_LINE + 1];
        assert!(s.feed(&big, false).content);
        assert!(s.lines.pending_line().is_empty());
    }

    #[test]
    fn the_data_lines_of_one_event_are_read_together() {
        // An error object split over two `data:` lines is one error, not two lines of content.
        let (_, contents, err) = scan_all(&[
            b"data: {\"error\":\ndata: {\"message\":\"busy\",\"type\":\"overloaded_error\"}}\n\n",
        ]);
        assert_eq!(contents, [false]);
        assert_eq!(err.unwrap().class(), FailureClass::Overloaded);
        // `event: error` names the event even when its data is not JSON.
        let (_, _, err) = scan_all(&[b"event: error\ndata: upstream went away\n\n"]);
        assert_eq!(err.unwrap().class(), FailureClass::ServerError);
        // An event is read when the blank line ends it, not before.
        let mut s = SseScan::default();
        assert!(
            !s.feed(
                b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n",
                false
            )
            .content
        );
        assert!(s.feed(b"\n", false).content);
    }

    #[test]
    fn cr_lf_and_crlf_end_lines_and_a_split_crlf_is_one_ending() {
        for sep in ["\r", "\r\n", "\n"] {
            let body = String::from_utf8(STREAM.to_vec())
                .unwrap()
                .replace('\n', sep);
            let (mut s, contents, err) = scan_all(&[body.as_bytes()]);
            assert_eq!(contents, [true], "{sep:?}");
            assert!(err.is_none());
            assert!(s.is_finished(), "{sep:?}");
            assert_eq!(s.content_events, 2, "{sep:?}");
            assert_eq!(s.take_finish_reason(), Some(FinishReason::Stop));
        }
        // CR at the end of one frame, LF at the start of the next: not a blank line between
        // the two `data:` lines of the event.
        let (_, contents, err) = scan_all(&[
            b"data: {\"choices\":\r",
            b"\ndata: [{\"delta\":{\"content\":\"a\"}}]}\r\n\r\n",
        ]);
        assert_eq!(contents, [false, true]);
        assert!(err.is_none());
    }

    #[test]
    fn a_byte_order_mark_is_skipped_and_the_space_after_the_colon_is_optional() {
        let (mut s, contents, _) = scan_all(&[
            b"\xEF\xBB",
            b"\xBFdata:{\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\n",
            b"data:[DONE]\n\n",
        ]);
        assert_eq!(contents, [false, true, false]);
        assert!(s.is_finished());
        assert_eq!(s.take_finish_reason(), Some(FinishReason::Stop));
    }

    #[test]
    fn a_done_cut_off_from_its_blank_line_still_finishes() {
        let (s, _, _) =
            scan_all(&[b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n"]);
        assert!(s.is_finished());
    }

    const STREAM: &[u8] = b": keep-alive\n\ndata: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\ndata: {\"choices\":\ndata: [{\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\ndata: [DONE]\n\n";

    /// The events one whole stream gives: content events, finish reason, finished.
    fn events_of(chunks: &[&[u8]]) -> (u64, Option<FinishReason>, bool, bool) {
        let mut s = SseScan::default();
        let mut committed = false;
        let mut error = false;
        for c in chunks {
            let seen = s.feed(c, committed);
            committed |= seen.content;
            error |= seen.error.is_some();
        }
        (
            s.content_events,
            s.take_finish_reason(),
            s.is_finished(),
            error,
        )
    }

    proptest! {
        /// However the bytes are cut into frames, whatever the line endings (LF, CR, CRLF, or
        /// a mix) and with or without a byte order mark, the reader sees the same events.
        #[test]
        fn any_split_of_a_stream_gives_the_same_events(
            chunks in seawall_test_support::reframed_sse(STREAM),
        ) {
            let chunks: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(events_of(&chunks), events_of(&[STREAM]));
            prop_assert_eq!(events_of(&[STREAM]), (2, Some(FinishReason::Stop), true, false));
        }
    }
}
