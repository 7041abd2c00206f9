//! A small server-sent-events reader, used only when no classifier reports on the body.
//!
//! It answers three questions and nothing more: did a frame carry real content (not a
//! `: keep-alive` comment, a blank line, a ping or an OpenAI role-only delta)? did the stream
//! reach its finish marker (`data: [DONE]`, a `finish_reason`, Anthropic `message_stop`,
//! Responses `response.completed`)? did the upstream send an error event? Before the commit point
//! every `data:` payload is parsed (a handful of small frames); after it only payloads that can
//! hold a finish marker or an error are.

use seawall_core::{FailureClass, FinishReason, LlmError};
use serde_json::Value;
use tokio::time::Instant;

/// The longest partial line kept across frames. A longer one is dropped and counted as content.
const MAX_LINE: usize = 256 * 1024;

/// What one frame showed.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// The frame held real content.
    pub(crate) content: bool,
    /// The frame held an error event.
    pub(crate) error: Option<LlmError>,
}

/// The reader's state across frames.
#[derive(Debug, Default)]
pub(crate) struct SseScan {
    partial: Vec<u8>,
    finished: bool,
    finish_reason: Option<FinishReason>,
    content_events: u64,
    first_content: Option<Instant>,
    last_content: Option<Instant>,
}

impl SseScan {
    /// Whether the finish marker was seen.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
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
    pub(crate) fn feed(&mut self, mut data: &[u8], committed: bool) -> Seen {
        let mut seen = Seen::default();
        if !self.partial.is_empty() {
            match memchr_nl(data) {
                Some(i) => {
                    let mut line = std::mem::take(&mut self.partial);
                    line.extend_from_slice(&data[..i]);
                    self.line(&line, committed, &mut seen);
                    data = &data[i + 1..];
                }
                None => {
                    self.keep_partial(data, &mut seen);
                    return seen;
                }
            }
        }
        while let Some(i) = memchr_nl(data) {
            self.line(&data[..i], committed, &mut seen);
            data = &data[i + 1..];
        }
        if !data.is_empty() {
            self.keep_partial(data, &mut seen);
        }
        seen
    }

    fn keep_partial(&mut self, data: &[u8], seen: &mut Seen) {
        if self.partial.len() + data.len() > MAX_LINE {
            // A line this long is not a keep-alive: count it and stop holding it.
            self.partial = Vec::new();
            self.content(seen);
        } else {
            self.partial.extend_from_slice(data);
        }
    }

    fn content(&mut self, seen: &mut Seen) {
        let now = Instant::now();
        self.first_content.get_or_insert(now);
        self.last_content = Some(now);
        self.content_events += 1;
        seen.content = true;
    }

    fn line(&mut self, line: &[u8], committed: bool, seen: &mut Seen) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(payload) = line.strip_prefix(b"data:") else {
            // Comments (`: keep-alive`), blank lines, `event:`, `id:`, `retry:`.
            return;
        };
        let payload = payload.strip_prefix(b" ").unwrap_or(payload);
        if payload.trim_ascii() == b"[DONE]" {
            self.finished = true;
            return;
        }
        if payload.trim_ascii().is_empty() {
            return;
        }
        if committed && !may_end_or_fail(payload) {
            self.content(seen);
            return;
        }
        let Ok(v) = serde_json::from_slice::<Value>(payload) else {
            // Not JSON: whatever it is, it is not a keep-alive.
            self.content(seen);
            return;
        };
        self.event(&v, seen);
    }

    fn event(&mut self, v: &Value, seen: &mut Seen) {
        if let Some(kind) = v.get("type").and_then(Value::as_str) {
            return self.typed_event(kind, v, seen);
        }
        if let Some(choices) = v.get("choices").and_then(Value::as_array) {
            let mut content = false;
            for c in choices {
                if let Some(r) = c.get("finish_reason").and_then(Value::as_str) {
                    self.finish(r, true);
                }
                let delta = c.get("delta").unwrap_or(c);
                content |= delta_has_content(delta);
            }
            if content {
                self.content(seen);
            }
            return;
        }
        if let Some(e) = v.get("error") {
            seen.error = Some(error_event(e));
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
                seen.error = Some(error_event(e));
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
            self.finish_reason = Some(finish_reason(reason));
        }
        if marks_end {
            self.finished = true;
        }
    }
}

fn memchr_nl(data: &[u8]) -> Option<usize> {
    data.iter().position(|b| *b == b'\n')
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
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The upstream's words for why a stream finished.
pub(crate) fn finish_reason(r: &str) -> FinishReason {
    match r {
        "stop" | "end_turn" | "stop_sequence" => FinishReason::Stop,
        "length" | "max_tokens" | "max_output_tokens" => FinishReason::Length,
        "tool_calls" | "function_call" | "tool_use" => FinishReason::ToolCalls,
        "content_filter" | "refusal" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.into()),
    }
}

/// An error event (`event: error` of Anthropic, `{"error":…}` of OpenAI-compatible servers) as
/// an [`LlmError`]. A small mapping for stacks without a classifier; the classifier's is finer.
fn error_event(e: &Value) -> LlmError {
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
            b"data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}\n",
            true,
        );
        assert_eq!(seen.error.unwrap().class(), FailureClass::ServerError);
    }

    #[test]
    fn committed_plain_deltas_are_counted_without_parsing_and_markers_still_found() {
        let mut s = SseScan::default();
        let seen = s.feed(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n",
            true,
        );
        assert!(seen.content);
        s.feed(
            b"data: {\"choices\":[{\"delta\":{},\"finish_reason\" : \"stop\"}]}\n",
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
        assert!(s.partial.is_empty());
    }

    const STREAM: &[u8] = b": keep-alive\n\ndata: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

    proptest! {
        /// However the bytes are cut into frames, the reader sees the same stream.
        #[test]
        fn frame_boundaries_do_not_matter(cuts in proptest::collection::vec(0..STREAM.len(), 0..8)) {
            let mut cuts = cuts;
            cuts.sort_unstable();
            cuts.dedup();
            let mut s = SseScan::default();
            let mut first_content_at = None;
            let mut last = 0;
            for (i, &c) in cuts.iter().chain(std::iter::once(&STREAM.len())).enumerate() {
                if s.feed(&STREAM[last..c], first_content_at.is_some()).content && first_content_at.is_none() {
                    first_content_at = Some(i);
                }
                last = c;
            }
            prop_assert!(first_content_at.is_some());
            prop_assert!(s.is_finished());
            prop_assert_eq!(s.content_events, 2);
            prop_assert_eq!(s.take_finish_reason(), Some(FinishReason::Stop));
        }
    }
}
