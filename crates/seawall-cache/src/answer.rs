//! The answer model: what is stored of a complete answer, how it is assembled from a JSON body
//! or an SSE stream, and how it is replayed in either form.
//!
//! An answer is kept in a compact canonical form (the wire format, id, model, text, finish
//! reason and usage) plus, when it came as one JSON body, that body's raw bytes. An answer
//! that came as one JSON body is recognised by a byte scan (`scan`) and kept as its raw bytes
//! and usage alone: its other parts are parsed from them only when first needed (a streamed
//! replay, [`Answer::text`]). A
//! non-streamed request is served the raw body when there is one (byte for byte what the
//! upstream said) and a rebuilt body otherwise; a streamed request is served a rebuilt SSE
//! stream in the same wire format (the key contains the path, so an answer is only ever served
//! to a request of its own format). A rebuilt stream carries the whole text in one delta: a
//! valid stream, which clients assemble like any other.
//!
//! A miss into the in-memory store keeps a JSON answer *unchecked* (`Answer::unchecked`):
//! not even scanned when its body ends, it is checked, and its usage read, at its first use
//! (`Answer::checked`), by the same scan and serde path; see the crate docs.
//!
//! Only plain text answers with one choice are assembled: tool calls, thinking blocks and
//! reasoning text, citations, several choices, errors and unknown shapes make an answer not
//! cacheable (the call is passed through).

use std::sync::{Arc, OnceLock};

use bytes::{BufMut, Bytes, BytesMut};
use seawall_core::{FinishReason, ReportedUsage, SseDecoder, SseItem, Usage};
use serde::Deserialize;

use crate::key::{leb128, put_field};

mod scan;

/// The wire formats whose answers are cached: core's [`ChatWire`](seawall_core::ChatWire).
pub use seawall_core::ChatWire as Wire;

/// The wire's tag in a stored entry.
fn wire_byte(wire: Wire) -> u8 {
    match wire {
        Wire::OpenAiChat => 1,
        Wire::AnthropicMessages => 2,
    }
}

/// How an answer is replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// One JSON body (`application/json`).
    Json,
    /// A server-sent-events stream (`text/event-stream`); `include_usage` adds OpenAI's usage
    /// chunk (`stream_options.include_usage`), which Anthropic streams always carry.
    Sse {
        /// Whether the stream ends with a usage chunk.
        include_usage: bool,
    },
}

impl Format {
    fn slot(self) -> usize {
        match self {
            Format::Json => 0,
            Format::Sse {
                include_usage: false,
            } => 1,
            Format::Sse {
                include_usage: true,
            } => 2,
        }
    }

    /// The content type of the replayed body.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Sse { .. } => "text/event-stream",
        }
    }
}

/// A complete answer, as the cache stores it.
///
/// Its parts (id, model, text, finish reason) are kept in a compact canonical form, or, for
/// an answer that came as one JSON body, parsed from that body only when first asked for: a
/// hit in the form the answer came in replays the raw body and needs none of them, so a miss
/// does not build them (see `scan`).
#[derive(Debug)]
pub struct Answer {
    wire: Wire,
    /// The usage of an answer known to be storable, or `None` inside for one found not to be.
    /// Set at once, except for an answer a miss put in the in-memory store unchecked (see
    /// [`Answer::unchecked`]): its raw body is checked, and its usage read, on its first use.
    checked: OnceLock<Option<Usage>>,
    raw: Option<Bytes>,
    /// The parts and renderings: set at once, or (an answer from a raw body) parsed from `raw`
    /// at the first use. Boxed: an answer replayed in the form it came in (the usual case)
    /// never needs them, and a store holds thousands of answers, each evicted one touched
    /// once more when it is dropped; without them inline an answer is two cache lines, not
    /// five.
    lazy: OnceLock<Box<Lazy>>,
}

/// What an answer makes only when a replay (or a caller) first needs it.
#[derive(Debug)]
struct Lazy {
    parts: Parts,
    /// Each format rendered once, at its first replay (the JSON one is `raw` when present).
    rendered: [OnceLock<Bytes>; 3],
}

impl Lazy {
    fn new(parts: Parts) -> Box<Self> {
        Box::new(Lazy {
            parts,
            rendered: Default::default(),
        })
    }
}

/// An answer's parts other than its usage.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Parts {
    id: Box<str>,
    model: Box<str>,
    created: u64,
    text: Box<str>,
    finish: Box<str>,
}

impl Clone for Answer {
    fn clone(&self) -> Self {
        let lazy = OnceLock::new();
        if let Some(l) = self.lazy.get() {
            let _ = lazy.set(Lazy::new(l.parts.clone()));
        }
        Answer {
            wire: self.wire,
            checked: self.checked.clone(),
            raw: self.raw.clone(),
            lazy,
        }
    }
}

impl PartialEq for Answer {
    fn eq(&self, o: &Self) -> bool {
        (self.wire, self.checked(), &self.raw, self.parts())
            == (o.wire, o.checked(), &o.raw, o.parts())
    }
}

impl Answer {
    /// An answer from its parts; `finish` is the provider's own word (`stop`, `end_turn`,
    /// `length`, ...).
    pub fn new(
        wire: Wire,
        id: &str,
        model: &str,
        created: u64,
        text: &str,
        finish: &str,
        usage: Usage,
    ) -> Self {
        Answer::of_parts(
            wire,
            Parts {
                id: id.into(),
                model: model.into(),
                created,
                text: text.into(),
                finish: finish.into(),
            },
            usage,
        )
    }

    fn of_parts(wire: Wire, parts: Parts, usage: Usage) -> Self {
        Answer {
            wire,
            checked: OnceLock::from(Some(usage)),
            raw: None,
            lazy: OnceLock::from(Lazy::new(parts)),
        }
    }

    /// An answer kept as its raw JSON body alone, its parts parsed at the first use: `raw`
    /// must be a body the scan found cacheable (so the serde path accepts it too).
    fn of_raw(wire: Wire, raw: Bytes, usage: Usage) -> Self {
        Answer {
            wire,
            checked: OnceLock::from(Some(usage)),
            raw: Some(raw),
            lazy: OnceLock::new(),
        }
    }

    /// A complete JSON body kept *unchecked*: whether it is a storable answer (one choice of
    /// plain text, a natural finish) and its usage are found at its first use
    /// ([`checked`](Self::checked)), not when its miss ends. Most stored answers are never
    /// used again, and the check is the larger part of what a miss adds after the key.
    ///
    /// Only the in-memory store is handed these (by the layer, which knows it is one): its
    /// lookup checks before it gives an answer out and drops one that fails, and the flight's
    /// waiters check before they are served, so nothing is ever served that the check at the
    /// miss would have refused. Every other store (a remote one, shared by a fleet, that
    /// encodes the answer's parts) is handed checked answers only.
    pub(crate) fn unchecked(wire: Wire, raw: Bytes) -> Self {
        Answer {
            wire,
            checked: OnceLock::new(),
            raw: Some(raw),
            lazy: OnceLock::new(),
        }
    }

    /// The answer's usage if it is storable (an answer from a [`Assembler::finish`] or made
    /// from its parts always is; one kept [`unchecked`](Self::unchecked) is checked here, the
    /// first time, by the same scan and serde path), `None` if it is not and must never be
    /// served.
    pub(crate) fn checked(&self) -> Option<Usage> {
        *self.checked.get_or_init(|| self.check())
    }

    /// Whether the answer's check was made (or was not needed).
    pub(crate) fn is_checked(&self) -> bool {
        self.checked.get().is_some()
    }

    /// The check a miss would have made at its body's end (`Assembler::finish`).
    fn check(&self) -> Option<Usage> {
        let raw = self.raw.as_deref()?;
        if let Some(facts) = scan::answer(self.wire, raw) {
            return Some(facts.usage);
        }
        let (parts, usage) = json_parts(self.wire, raw).ok()?;
        if !matches!(
            FinishReason::from_provider(&parts.finish),
            FinishReason::Stop | FinishReason::Length
        ) {
            return None;
        }
        let _ = self.lazy.set(Lazy::new(parts));
        Some(usage)
    }

    fn parts(&self) -> &Parts {
        &self.lazy().parts
    }

    fn lazy(&self) -> &Lazy {
        self.lazy.get_or_init(|| {
            let raw = self.raw.as_deref().unwrap_or_default();
            Lazy::new(match json_parts(self.wire, raw) {
                Ok((parts, _)) => parts,
                // Only bodies the serde path accepts are kept without their parts (the scan
                // and serde agree; a test holds them to it): never reached.
                Err(_) => Parts {
                    id: "".into(),
                    model: "".into(),
                    created: 0,
                    text: "".into(),
                    finish: "".into(),
                },
            })
        })
    }

    /// Keeps `raw`, the JSON body as the upstream sent it, to serve non-streamed requests.
    pub fn with_raw(mut self, raw: Bytes) -> Self {
        self.raw = Some(raw);
        self
    }

    /// The wire format.
    pub fn wire(&self) -> Wire {
        self.wire
    }

    /// The model that answered.
    pub fn model(&self) -> &str {
        &self.parts().model
    }

    /// The answer's text.
    pub fn text(&self) -> &str {
        &self.parts().text
    }

    /// The finish reason, as the provider said it.
    pub fn finish_word(&self) -> &str {
        &self.parts().finish
    }

    /// The finish reason.
    pub fn finish_reason(&self) -> FinishReason {
        FinishReason::from_provider(self.finish_word())
    }

    /// The usage the answer cost when it was made.
    pub fn usage(&self) -> Usage {
        self.checked().unwrap_or_default()
    }

    /// The raw JSON body, when the answer came as one.
    pub fn raw(&self) -> Option<&Bytes> {
        self.raw.as_ref()
    }

    /// About how many bytes the answer holds (for a store's byte bound).
    pub fn size(&self) -> usize {
        let raw = self.raw.as_ref().map_or(0, Bytes::len);
        match self.lazy.get().map(|l| &l.parts) {
            Some(p) => 96 + p.id.len() + p.model.len() + p.text.len() + p.finish.len() + raw,
            // Parts not parsed yet: counted as if they were (they are never longer than the
            // body they come from), so the bound holds whatever replays come.
            None => 96 + 2 * raw,
        }
    }

    /// The answer as a body of `format`, rendered once and then shared.
    pub fn render(&self, format: Format) -> Bytes {
        if let (Format::Json, Some(raw)) = (format, &self.raw) {
            return raw.clone();
        }
        let wire = self.wire;
        let format = match (wire, format) {
            // Anthropic streams always carry usage: one rendering.
            (Wire::AnthropicMessages, Format::Sse { .. }) => Format::Sse {
                include_usage: true,
            },
            (_, f) => f,
        };
        self.lazy().rendered[format.slot()]
            .get_or_init(|| match format {
                Format::Json => self.json(),
                Format::Sse { include_usage } => self.sse(include_usage),
            })
            .clone()
    }

    fn json(&self) -> Bytes {
        let p = self.parts();
        let mut b = Writer::with_capacity(256 + p.text.len());
        let u = self.usage();
        match self.wire {
            Wire::OpenAiChat => {
                b.raw("{\"id\":").s(&p.id);
                b.raw(",\"object\":\"chat.completion\",\"created\":")
                    .n(p.created);
                b.raw(",\"model\":").s(&p.model);
                b.raw(
                    ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":",
                )
                .s(&p.text);
                b.raw(",\"refusal\":null},\"logprobs\":null,\"finish_reason\":")
                    .s(&p.finish);
                b.raw("}],\"usage\":");
                b.openai_usage(u);
                b.raw("}");
            }
            Wire::AnthropicMessages => {
                b.raw("{\"id\":").s(&p.id);
                b.raw(",\"type\":\"message\",\"role\":\"assistant\",\"model\":")
                    .s(&p.model);
                b.raw(",\"content\":[{\"type\":\"text\",\"text\":")
                    .s(&p.text);
                b.raw("}],\"stop_reason\":").s(&p.finish);
                b.raw(",\"stop_sequence\":null,\"usage\":");
                b.anthropic_usage(u, u.output_tokens);
                b.raw("}");
            }
        }
        b.done()
    }

    fn sse(&self, include_usage: bool) -> Bytes {
        let p = self.parts();
        let mut b = Writer::with_capacity(768 + p.text.len());
        let u = self.usage();
        match self.wire {
            Wire::OpenAiChat => {
                let chunk = |b: &mut Writer| {
                    b.raw("data: {\"id\":").s(&p.id);
                    b.raw(",\"object\":\"chat.completion.chunk\",\"created\":")
                        .n(p.created);
                    b.raw(",\"model\":").s(&p.model);
                };
                chunk(&mut b);
                b.raw(",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":")
                    .s(&p.text);
                b.raw("},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
                chunk(&mut b);
                b.raw(
                    ",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":",
                )
                .s(&p.finish);
                b.raw("}]}\n\n");
                if include_usage {
                    chunk(&mut b);
                    b.raw(",\"choices\":[],\"usage\":");
                    b.openai_usage(u);
                    b.raw("}\n\n");
                }
                b.raw("data: [DONE]\n\n");
            }
            Wire::AnthropicMessages => {
                b.raw(
                    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":",
                )
                .s(&p.id);
                b.raw(",\"type\":\"message\",\"role\":\"assistant\",\"model\":")
                    .s(&p.model);
                b.raw(",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":");
                b.anthropic_usage(u, 1);
                b.raw("}}\n\n");
                b.raw("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
                b.raw("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":")
                    .s(&p.text);
                b.raw("}}\n\n");
                b.raw("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n");
                b.raw("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":")
                    .s(&p.finish);
                b.raw(",\"stop_sequence\":null},\"usage\":{\"output_tokens\":")
                    .n(u.output_tokens);
                b.raw("}}\n\n");
                b.raw("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
            }
        }
        b.done()
    }
}

/// A small JSON writer for the replayed bodies.
struct Writer(BytesMut);

impl Writer {
    fn with_capacity(n: usize) -> Self {
        Writer(BytesMut::with_capacity(n))
    }

    fn raw(&mut self, s: &str) -> &mut Self {
        self.0.put_slice(s.as_bytes());
        self
    }

    /// A JSON string.
    fn s(&mut self, s: &str) -> &mut Self {
        // Writing a string into a buffer cannot fail.
        let _ = serde_json::to_writer((&mut self.0).writer(), s);
        self
    }

    fn n(&mut self, n: u64) -> &mut Self {
        self.0.put_slice(itoa::Buffer::new().format(n).as_bytes());
        self
    }

    fn openai_usage(&mut self, u: Usage) {
        self.raw("{\"prompt_tokens\":").n(u.input_tokens);
        self.raw(",\"completion_tokens\":").n(u.output_tokens);
        self.raw(",\"total_tokens\":").n(u.total());
        self.raw(",\"prompt_tokens_details\":{\"cached_tokens\":")
            .n(u.cached_input_tokens);
        self.raw("}}");
    }

    fn anthropic_usage(&mut self, u: Usage, output: u64) {
        // Anthropic's input_tokens leave out the cache reads and writes, which come on their
        // own (the writes also split by how long they are kept).
        let read = u.cached_input_tokens.min(u.input_tokens);
        let written = u.cache_write_input_tokens.min(u.input_tokens - read);
        let hour = u.cache_write_1h_input_tokens.min(written);
        self.raw("{\"input_tokens\":")
            .n(u.input_tokens - read - written);
        self.raw(",\"cache_creation_input_tokens\":").n(written);
        self.raw(",\"cache_read_input_tokens\":").n(read);
        self.raw(",\"cache_creation\":{\"ephemeral_5m_input_tokens\":")
            .n(written - hour);
        self.raw(",\"ephemeral_1h_input_tokens\":").n(hour);
        self.raw("},\"output_tokens\":").n(output);
        self.raw("}");
    }

    fn done(self) -> Bytes {
        self.0.freeze()
    }
}

/// Why an answer is not stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotCacheable {
    /// The body is larger than the largest entry.
    TooLarge,
    /// The answer has something other than text: tool calls, thinking, several choices.
    NotText,
    /// The body did not reach its finish marker, or has no finish reason.
    Incomplete,
    /// The body is not a well-formed answer of its wire format (an error object, say).
    Malformed,
    /// The answer stopped for a reason other than a natural stop or the token limit (a
    /// content filter, a paused turn).
    Reason,
}

/// Builds an [`Answer`] from the body of a response as it passes by.
///
/// Reusable by any cache that stores answers: feed it each data frame, then
/// [`finish`](Self::finish).
#[derive(Debug)]
pub struct Assembler {
    wire: Wire,
    max_bytes: usize,
    state: Assembly,
    failed: Option<NotCacheable>,
}

#[derive(Debug)]
enum Assembly {
    Json(Vec<u8>),
    Sse(Box<Streamed>),
}

#[derive(Debug)]
struct Streamed {
    decoder: SseDecoder,
    id: String,
    model: String,
    created: u64,
    text: String,
    finish: Option<String>,
    /// The usage the events reported so far, merged (Anthropic splits it over two events).
    usage: ReportedUsage,
    done: bool,
}

impl Assembler {
    /// An assembler of a `wire` answer, JSON or SSE as `streamed` says, that gives up beyond
    /// `max_bytes` of body.
    pub fn new(wire: Wire, streamed: bool, max_bytes: usize) -> Self {
        let state = if streamed {
            Assembly::Sse(Box::new(Streamed {
                decoder: SseDecoder::new(max_bytes.min(1 << 20)),
                id: String::new(),
                model: String::new(),
                created: 0,
                text: String::new(),
                finish: None,
                usage: ReportedUsage::default(),
                done: false,
            }))
        } else {
            Assembly::Json(Vec::new())
        };
        Assembler {
            wire,
            max_bytes,
            state,
            failed: None,
        }
    }

    /// Whether the answer can still be stored (nothing disqualified it yet).
    pub fn is_viable(&self) -> bool {
        self.failed.is_none()
    }

    /// Reads one frame of body.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        match &mut self.state {
            Assembly::Json(buf) => {
                if buf.len() + chunk.len() > self.max_bytes {
                    self.failed = Some(NotCacheable::TooLarge);
                    *buf = Vec::new();
                } else {
                    buf.extend_from_slice(chunk);
                }
            }
            Assembly::Sse(s) => {
                let wire = self.wire;
                let max = self.max_bytes;
                let Streamed { decoder, .. } = &mut **s;
                // The decoder borrows itself while handing out events: take it out meanwhile.
                let mut dec = std::mem::replace(decoder, SseDecoder::new(0));
                let flow = dec.feed(chunk, |item| s.event(wire, max, item));
                s.decoder = dec;
                if let std::ops::ControlFlow::Break(why) = flow {
                    self.failed = Some(why);
                }
            }
        }
    }

    /// The answer, once the body has ended.
    pub fn finish(self) -> Result<Answer, NotCacheable> {
        self.finish_as(false)
    }

    /// The answer, once the body has ended, a JSON one kept [unchecked](Answer::unchecked):
    /// only what a miss must know at once is checked here (the body complete, no error, not
    /// too large); the rest at the answer's first use.
    pub(crate) fn finish_unchecked(self) -> Result<Answer, NotCacheable> {
        self.finish_as(true)
    }

    fn finish_as(self, unchecked: bool) -> Result<Answer, NotCacheable> {
        if let Some(why) = self.failed {
            return Err(why);
        }
        let answer = match self.state {
            Assembly::Json(buf) => {
                let raw = Bytes::from(buf);
                if unchecked {
                    return Ok(Answer::unchecked(self.wire, raw));
                }
                // The common case, a complete text answer, recognised without building it.
                if let Some(facts) = scan::answer(self.wire, &raw) {
                    return Ok(Answer::of_raw(self.wire, raw, facts.usage));
                }
                json_answer(self.wire, raw)?
            }
            Assembly::Sse(mut s) => {
                let wire = self.wire;
                let max = self.max_bytes;
                let mut dec = std::mem::replace(&mut s.decoder, SseDecoder::new(0));
                if let std::ops::ControlFlow::Break(why) =
                    dec.finish(|item| s.event(wire, max, item))
                {
                    return Err(why);
                }
                if !s.done {
                    return Err(NotCacheable::Incomplete);
                }
                let finish = s.finish.ok_or(NotCacheable::Incomplete)?;
                let usage = s.usage.to_usage();
                Answer::new(wire, &s.id, &s.model, s.created, &s.text, &finish, usage)
            }
        };
        natural_end(answer)
    }
}

/// `answer` if it stopped naturally or at the token limit (the answers stored).
fn natural_end(answer: Answer) -> Result<Answer, NotCacheable> {
    match answer.finish_reason() {
        FinishReason::Stop | FinishReason::Length => Ok(answer),
        _ => Err(NotCacheable::Reason),
    }
}

type Flow = std::ops::ControlFlow<NotCacheable>;

impl Streamed {
    fn event(&mut self, wire: Wire, max: usize, item: SseItem<'_>) -> Flow {
        let SseItem::Event(event) = item else {
            return Flow::Break(NotCacheable::Malformed);
        };
        if event.oversized {
            return Flow::Break(NotCacheable::TooLarge);
        }
        if self.done {
            // Nothing may follow the finish marker.
            return Flow::Break(NotCacheable::Malformed);
        }
        let flow = match wire {
            Wire::OpenAiChat => self.openai(event.data),
            Wire::AnthropicMessages => self.anthropic(event.name, event.data),
        };
        if self.text.len() > max {
            return Flow::Break(NotCacheable::TooLarge);
        }
        flow
    }

    fn openai(&mut self, data: &[u8]) -> Flow {
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
            return Flow::Continue(());
        }
        let Ok(chunk) = serde_json::from_slice::<OpenAiChunk<'_>>(data) else {
            return Flow::Break(NotCacheable::Malformed);
        };
        if chunk.error.is_some() {
            return Flow::Break(NotCacheable::Malformed);
        }
        if let Some(id) = chunk.id {
            set_once(&mut self.id, &id);
        }
        if let Some(model) = chunk.model {
            set_once(&mut self.model, &model);
        }
        self.created = self.created.max(chunk.created.unwrap_or(0));
        if let Some(u) = chunk.usage {
            self.usage.merge(u);
        }
        for choice in chunk.choices.unwrap_or_default() {
            // Another choice, or log probabilities a replay would not carry.
            if choice.index.unwrap_or(0) != 0 || choice.logprobs.is_some() {
                return Flow::Break(NotCacheable::NotText);
            }
            if let Some(delta) = choice.delta {
                if delta.tool_calls.is_some()
                    || delta.function_call.is_some()
                    || delta.refusal.is_some()
                    || delta.audio.is_some()
                    || carries_beside([
                        &delta.annotations,
                        &delta.reasoning_content,
                        &delta.reasoning,
                    ])
                {
                    return Flow::Break(NotCacheable::NotText);
                }
                if let Some(text) = delta.content {
                    self.text.push_str(&text);
                }
            }
            if let Some(f) = choice.finish_reason {
                self.finish = Some(f.into_owned());
            }
        }
        Flow::Continue(())
    }

    fn anthropic(&mut self, name: &[u8], data: &[u8]) -> Flow {
        let Ok(event) = serde_json::from_slice::<AnthropicEvent<'_>>(data) else {
            return Flow::Break(NotCacheable::Malformed);
        };
        let kind = if name.is_empty() {
            event.kind.as_deref().unwrap_or("")
        } else {
            std::str::from_utf8(name).unwrap_or("")
        };
        match kind {
            "message_start" => {
                let Some(m) = event.message else {
                    return Flow::Break(NotCacheable::Malformed);
                };
                set_once(&mut self.id, m.id.as_deref().unwrap_or(""));
                set_once(&mut self.model, m.model.as_deref().unwrap_or(""));
                if let Some(u) = m.usage {
                    self.usage.merge(u);
                }
            }
            "content_block_start" => {
                if event.content_block.is_none_or(|b| b.kind != "text") {
                    return Flow::Break(NotCacheable::NotText);
                }
                if event.index.unwrap_or(0) != 0 {
                    // One text block: several would need their separation kept.
                    return Flow::Break(NotCacheable::NotText);
                }
            }
            "content_block_delta" => match event.delta {
                Some(d) if d.kind.as_deref() == Some("text_delta") => {
                    self.text.push_str(d.text.as_deref().unwrap_or(""));
                }
                _ => return Flow::Break(NotCacheable::NotText),
            },
            "message_delta" => {
                if let Some(reason) = event.delta.and_then(|d| d.stop_reason) {
                    self.finish = Some(reason.into_owned());
                }
                // Cumulative counts: the output, and in newer versions the input's too.
                if let Some(u) = event.usage {
                    self.usage.merge(u);
                }
            }
            "message_stop" => self.done = true,
            "content_block_stop" | "ping" => {}
            _ => return Flow::Break(NotCacheable::Malformed),
        }
        Flow::Continue(())
    }
}

fn set_once(slot: &mut String, value: &str) {
    if slot.is_empty() {
        value.clone_into(slot);
    }
}

/// The answer of a JSON body, by the serde path.
fn json_answer(wire: Wire, raw: Bytes) -> Result<Answer, NotCacheable> {
    let (parts, usage) = json_parts(wire, &raw)?;
    Ok(Answer::of_parts(wire, parts, usage).with_raw(raw))
}

/// The parts and usage of a JSON body, read with serde: the reference the scan is held to,
/// and what decides (and says why not) whenever the scan is unsure.
fn json_parts(wire: Wire, raw: &[u8]) -> Result<(Parts, Usage), NotCacheable> {
    let parts = match wire {
        Wire::OpenAiChat => {
            let body: OpenAiBody<'_> =
                serde_json::from_slice(raw).map_err(|_| NotCacheable::Malformed)?;
            let [choice] = &body.choices[..] else {
                return Err(if body.choices.is_empty() {
                    NotCacheable::Malformed
                } else {
                    NotCacheable::NotText
                });
            };
            let message = choice.message.as_ref().ok_or(NotCacheable::Malformed)?;
            if choice.logprobs.as_ref().is_some_and(|v| !v.is_null()) {
                // A replayed stream would not carry them.
                return Err(NotCacheable::NotText);
            }
            // Tool calls, a refusal, audio, citations or reasoning: not plain text.
            if [
                &message.tool_calls,
                &message.function_call,
                &message.refusal,
                &message.audio,
            ]
            .iter()
            .any(|v| v.as_ref().is_some_and(|v| !v.is_null()))
                || carries_beside([
                    &message.annotations,
                    &message.reasoning_content,
                    &message.reasoning,
                ])
            {
                return Err(NotCacheable::NotText);
            }
            let text = message.content.as_deref().ok_or(NotCacheable::NotText)?;
            let finish = choice
                .finish_reason
                .as_deref()
                .ok_or(NotCacheable::Incomplete)?;
            (
                Parts {
                    id: body.id.as_deref().unwrap_or("").into(),
                    model: body.model.as_deref().unwrap_or("").into(),
                    created: body.created.unwrap_or(0),
                    text: text.into(),
                    finish: finish.into(),
                },
                body.usage.map(ReportedUsage::to_usage).unwrap_or_default(),
            )
        }
        Wire::AnthropicMessages => {
            let body: AnthropicBody<'_> =
                serde_json::from_slice(raw).map_err(|_| NotCacheable::Malformed)?;
            if body.kind.as_deref() != Some("message") {
                return Err(NotCacheable::Malformed);
            }
            let mut text = String::new();
            match &body.content[..] {
                [] => {}
                // Citations a replay would lose: not plain text.
                [block]
                    if block.kind == "text" && !block.citations.as_ref().is_some_and(carries) =>
                {
                    text.push_str(block.text.as_deref().unwrap_or(""));
                }
                _ => return Err(NotCacheable::NotText),
            }
            let finish = body
                .stop_reason
                .as_deref()
                .ok_or(NotCacheable::Incomplete)?;
            (
                Parts {
                    id: body.id.as_deref().unwrap_or("").into(),
                    model: body.model.as_deref().unwrap_or("").into(),
                    created: 0,
                    text: text.into(),
                    finish: finish.into(),
                },
                body.usage.map(ReportedUsage::to_usage).unwrap_or_default(),
            )
        }
    };
    Ok(parts)
}

type Text<'a> = Option<std::borrow::Cow<'a, str>>;

#[derive(Deserialize)]
struct OpenAiBody<'a> {
    #[serde(borrow)]
    id: Text<'a>,
    created: Option<u64>,
    #[serde(borrow)]
    model: Text<'a>,
    #[serde(borrow, default)]
    choices: Vec<OpenAiChoice<'a>>,
    usage: Option<ReportedUsage>,
}

#[derive(Deserialize)]
struct OpenAiChoice<'a> {
    #[serde(borrow)]
    message: Option<OpenAiMessage<'a>>,
    logprobs: Option<serde_json::Value>,
    #[serde(borrow)]
    finish_reason: Text<'a>,
}

#[derive(Deserialize)]
struct OpenAiMessage<'a> {
    #[serde(borrow)]
    content: Text<'a>,
    tool_calls: Option<serde_json::Value>,
    function_call: Option<serde_json::Value>,
    refusal: Option<serde_json::Value>,
    audio: Option<serde_json::Value>,
    annotations: Option<serde_json::Value>,
    reasoning_content: Option<serde_json::Value>,
    reasoning: Option<serde_json::Value>,
}

/// Whether a message or delta carries what a replay would lose beside its text: citations
/// (`annotations`, OpenAI's search models) or reasoning (`reasoning_content`, DeepSeek's and
/// vLLM's reasoning models; `reasoning`, OpenRouter's). Such an answer is not plain text. The
/// empty forms (`null`, `[]`, `""`) carry nothing: OpenAI sends `"annotations": []` with
/// every answer.
fn carries_beside(fields: [&Option<serde_json::Value>; 3]) -> bool {
    fields.iter().any(|v| v.as_ref().is_some_and(carries))
}

/// Whether a value says something: not `null`, `[]` or `""`.
fn carries(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Null => false,
        serde_json::Value::Array(a) => !a.is_empty(),
        serde_json::Value::String(s) => !s.is_empty(),
        _ => true,
    }
}

#[derive(Deserialize)]
struct OpenAiChunk<'a> {
    #[serde(borrow)]
    id: Text<'a>,
    created: Option<u64>,
    #[serde(borrow)]
    model: Text<'a>,
    #[serde(borrow)]
    choices: Option<Vec<OpenAiChunkChoice<'a>>>,
    usage: Option<ReportedUsage>,
    error: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct OpenAiChunkChoice<'a> {
    index: Option<u64>,
    logprobs: Option<serde::de::IgnoredAny>,
    #[serde(borrow)]
    delta: Option<OpenAiDelta<'a>>,
    #[serde(borrow)]
    finish_reason: Text<'a>,
}

#[derive(Deserialize)]
struct OpenAiDelta<'a> {
    #[serde(borrow)]
    content: Text<'a>,
    tool_calls: Option<serde::de::IgnoredAny>,
    function_call: Option<serde::de::IgnoredAny>,
    #[serde(borrow)]
    refusal: Text<'a>,
    audio: Option<serde::de::IgnoredAny>,
    annotations: Option<serde_json::Value>,
    reasoning_content: Option<serde_json::Value>,
    reasoning: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct AnthropicBody<'a> {
    #[serde(borrow)]
    id: Text<'a>,
    #[serde(rename = "type", borrow)]
    kind: Text<'a>,
    #[serde(borrow)]
    model: Text<'a>,
    #[serde(borrow, default)]
    content: Vec<AnthropicBlock<'a>>,
    #[serde(borrow)]
    stop_reason: Text<'a>,
    usage: Option<ReportedUsage>,
}

#[derive(Deserialize)]
struct AnthropicBlock<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    text: Text<'a>,
    citations: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct AnthropicEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Text<'a>,
    #[serde(borrow)]
    message: Option<AnthropicStart<'a>>,
    index: Option<u64>,
    #[serde(borrow)]
    content_block: Option<AnthropicBlock<'a>>,
    #[serde(borrow)]
    delta: Option<AnthropicDelta<'a>>,
    usage: Option<ReportedUsage>,
}

#[derive(Deserialize)]
struct AnthropicStart<'a> {
    #[serde(borrow)]
    id: Text<'a>,
    #[serde(borrow)]
    model: Text<'a>,
    usage: Option<ReportedUsage>,
}

#[derive(Deserialize)]
struct AnthropicDelta<'a> {
    #[serde(rename = "type", borrow)]
    kind: Text<'a>,
    #[serde(borrow)]
    text: Text<'a>,
    #[serde(borrow)]
    stop_reason: Text<'a>,
}

/// Why stored bytes are not an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeError;

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stored cache entry is not a valid answer")
    }
}

impl std::error::Error for DecodeError {}

/// The version byte of the compact encoding: 2 added the cache writes to the usage. Entries
/// of version 1 (written before) are still read, with no cache writes.
const ENCODING: u8 = 2;

impl Answer {
    /// The answer in a compact binary form, for a store that keeps bytes (Redis).
    ///
    /// A small hand format: a version byte, the wire byte, then each field as a LEB128
    /// length or number followed by its bytes (written as the cache key's are). It needs no
    /// dependency, it is about as small as a serde binary format would make it, and
    /// [`decode`](Self::decode) checks every length, so bytes from a shared store can never
    /// make it panic or over-allocate.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size());
        out.push(ENCODING);
        out.push(wire_byte(self.wire));
        let p = self.parts();
        for s in [&p.id, &p.model, &p.text, &p.finish] {
            put_field(&mut out, s.as_bytes());
        }
        let u = self.usage();
        for n in [
            p.created,
            u.input_tokens,
            u.output_tokens,
            u.cached_input_tokens,
            u.cache_write_input_tokens,
            u.cache_write_1h_input_tokens,
        ] {
            leb128(n, |b| out.push(b));
        }
        match &self.raw {
            Some(raw) => {
                out.push(1);
                put_field(&mut out, raw);
            }
            None => out.push(0),
        }
        out
    }

    /// Reads an answer written by [`encode`](Self::encode).
    pub fn decode(bytes: &[u8]) -> Result<Answer, DecodeError> {
        let mut r = Reader(bytes);
        let version = r.byte()?;
        if !(1..=ENCODING).contains(&version) {
            return Err(DecodeError);
        }
        let wire = match r.byte()? {
            1 => Wire::OpenAiChat,
            2 => Wire::AnthropicMessages,
            _ => return Err(DecodeError),
        };
        let id = r.str()?;
        let model = r.str()?;
        let text = r.str()?;
        let finish = r.str()?;
        let created = r.varint()?;
        let mut usage = Usage {
            input_tokens: r.varint()?,
            output_tokens: r.varint()?,
            cached_input_tokens: r.varint()?,
            cache_write_input_tokens: 0,
            cache_write_1h_input_tokens: 0,
        };
        if version >= 2 {
            usage.cache_write_input_tokens = r.varint()?;
            usage.cache_write_1h_input_tokens = r.varint()?;
        }
        // Stored bytes are input: counts that disagree are made to agree.
        let usage = usage.normalized(None);
        let answer = Answer::new(wire, id, model, created, text, finish, usage);
        let answer = match r.byte()? {
            0 => answer,
            1 => answer.with_raw(Bytes::copy_from_slice(r.bytes()?)),
            _ => return Err(DecodeError),
        };
        if !r.0.is_empty() {
            return Err(DecodeError);
        }
        Ok(answer)
    }
}

/// Shared answers, as stores hand them out.
pub type SharedAnswer = Arc<Answer>;

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let (&b, rest) = self.0.split_first().ok_or(DecodeError)?;
        self.0 = rest;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            n |= u64::from(b & 0x7f).checked_shl(shift).ok_or(DecodeError)?;
            if b & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err(DecodeError)
    }

    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = usize::try_from(self.varint()?).map_err(|_| DecodeError)?;
        if len > self.0.len() {
            return Err(DecodeError);
        }
        let (b, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(b)
    }

    fn str(&mut self) -> Result<&'a str, DecodeError> {
        std::str::from_utf8(self.bytes()?).map_err(|_| DecodeError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage() -> Usage {
        Usage {
            input_tokens: 3012,
            output_tokens: 5,
            cached_input_tokens: 2,
            cache_write_input_tokens: 3000,
            cache_write_1h_input_tokens: 1000,
        }
    }

    #[test]
    fn an_answer_survives_its_compact_encoding() {
        let a = Answer::new(
            Wire::AnthropicMessages,
            "msg_1",
            "claude",
            0,
            "héllo \"x\"",
            "end_turn",
            usage(),
        )
        .with_raw(Bytes::from_static(b"{\"type\":\"message\"}"));
        let bytes = a.encode();
        assert_eq!(Answer::decode(&bytes).unwrap(), a);
        // Every truncation and a trailing byte are refused, never a panic.
        for cut in 0..bytes.len() {
            assert_eq!(Answer::decode(&bytes[..cut]), Err(DecodeError));
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(Answer::decode(&long), Err(DecodeError));
        assert_eq!(
            Answer::decode(&[
                1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f
            ]),
            Err(DecodeError)
        );
    }

    #[test]
    fn an_entry_of_the_first_encoding_is_read_without_cache_writes() {
        // Version 1 had no cache writes in the usage.
        let mut v1 = vec![1, wire_byte(Wire::OpenAiChat)];
        for s in ["c1", "gpt-4o", "hi", "stop"] {
            put_field(&mut v1, s.as_bytes());
        }
        for n in [7, 12, 5, 2] {
            leb128(n, |b| v1.push(b));
        }
        v1.push(0);
        let a = Answer::decode(&v1).unwrap();
        assert_eq!(
            (a.text(), a.finish_word(), a.model()),
            ("hi", "stop", "gpt-4o")
        );
        let want = Usage {
            input_tokens: 12,
            cache_write_input_tokens: 0,
            cache_write_1h_input_tokens: 0,
            ..usage()
        };
        assert_eq!(a.usage(), want);
        // An unknown version is refused.
        v1[0] = ENCODING + 1;
        assert_eq!(Answer::decode(&v1), Err(DecodeError));
    }

    #[test]
    fn stored_counts_that_disagree_are_made_to_agree() {
        let hostile = Usage {
            input_tokens: 10,
            output_tokens: 1,
            cached_input_tokens: 8,
            cache_write_input_tokens: u64::MAX,
            cache_write_1h_input_tokens: u64::MAX,
        };
        let a = Answer::new(
            Wire::AnthropicMessages,
            "m",
            "c",
            0,
            "hi",
            "end_turn",
            hostile,
        );
        let u = Answer::decode(&a.encode()).unwrap().usage();
        assert_eq!(
            (
                u.cached_input_tokens,
                u.cache_write_input_tokens,
                u.cache_write_1h_input_tokens
            ),
            (8, 2, 2)
        );
        // And its replay adds up to the input.
        let json: serde_json::Value =
            serde_json::from_slice(&Answer::decode(&a.encode()).unwrap().render(Format::Json))
                .unwrap();
        let n = |k: &str| json["usage"][k].as_u64().unwrap();
        assert_eq!(
            n("input_tokens") + n("cache_read_input_tokens") + n("cache_creation_input_tokens"),
            10
        );
    }

    fn assemble(wire: Wire, streamed: bool, body: &str) -> Result<Answer, NotCacheable> {
        let mut a = Assembler::new(wire, streamed, 1 << 20);
        // Split mid-event: frames do not follow event boundaries.
        let (x, y) = body.split_at(body.len() / 2);
        a.feed(x.as_bytes());
        a.feed(y.as_bytes());
        a.finish()
    }

    const CHUNK: &str = r#"data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}

"#;

    #[test]
    fn answers_with_citations_or_reasoning_are_not_assembled_and_their_empty_forms_are() {
        let openai = |message: &str| {
            format!(
                r#"{{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"{message}}},"logprobs":null,"finish_reason":"stop"}}],"usage":{{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}}}"#
            )
        };
        let anthropic = |block: &str| {
            format!(
                r#"{{"id":"m","type":"message","role":"assistant","model":"c","content":[{{"type":"text","text":"hi"{block}}}],"stop_reason":"end_turn","usage":{{"input_tokens":3,"output_tokens":1}}}}"#
            )
        };
        let citation = r#"[{"type":"url_citation","url_citation":{"start_index":0,"end_index":2,"url":"https://example.com","title":"e"}}]"#;
        let refused = [
            (
                Wire::OpenAiChat,
                openai(&format!(r#","annotations":{citation}"#)),
            ),
            (
                Wire::OpenAiChat,
                openai(r#","reasoning_content":"First, think.""#),
            ),
            (Wire::OpenAiChat, openai(r#","reasoning":"First, think.""#)),
            (
                Wire::AnthropicMessages,
                anthropic(
                    r#","citations":[{"type":"char_location","cited_text":"x","document_index":0,"start_char_index":0,"end_char_index":1}]"#,
                ),
            ),
        ];
        for (wire, body) in refused {
            assert_eq!(scan::answer(wire, body.as_bytes()), None, "{body}");
            assert_eq!(
                assemble(wire, false, &body).err(),
                Some(NotCacheable::NotText),
                "{body}"
            );
        }
        // What OpenAI sends with every plain answer, and the other empty forms.
        let stored = [
            (
                Wire::OpenAiChat,
                openai(r#","refusal":null,"annotations":[]"#),
            ),
            (
                Wire::OpenAiChat,
                openai(r#","reasoning_content":null,"reasoning":"""#),
            ),
            (
                Wire::OpenAiChat,
                openai(r#","reasoning":[],"annotations":"""#),
            ),
            (Wire::AnthropicMessages, anthropic(r#","citations":null"#)),
            (Wire::AnthropicMessages, anthropic(r#","citations":[]"#)),
        ];
        for (wire, body) in stored {
            assert!(scan::answer(wire, body.as_bytes()).is_some(), "{body}");
            assert_eq!(assemble(wire, false, &body).unwrap().text(), "hi", "{body}");
        }

        let done = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        let delta = |d: &str| {
            format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{d}}}]}}\n\n{CHUNK}{done}")
        };
        for d in [
            r#"{"reasoning_content":"First, think.","content":null}"#,
            r#"{"reasoning":"First, think."}"#,
            &format!(r#"{{"annotations":{citation}}}"#),
        ] {
            assert_eq!(
                assemble(Wire::OpenAiChat, true, &delta(d)).err(),
                Some(NotCacheable::NotText),
                "{d}"
            );
        }
        let plain = delta(r#"{"role":"assistant","content":"","reasoning_content":null}"#);
        assert_eq!(
            assemble(Wire::OpenAiChat, true, &plain).unwrap().text(),
            "hi"
        );
    }

    #[test]
    fn only_complete_plain_text_answers_are_assembled() {
        let done = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        let ok = format!("{CHUNK}{done}");
        assert_eq!(assemble(Wire::OpenAiChat, true, &ok).unwrap().text(), "hi");
        let cases = [
            // No finish marker.
            (CHUNK.to_owned(), NotCacheable::Incomplete),
            // A tool call, a refusal, a second choice, log probabilities.
            (
                format!(
                    "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[]}}}}]}}\n\n{done}"
                ),
                NotCacheable::NotText,
            ),
            (
                format!(
                    "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"refusal\":\"no\"}}}}]}}\n\n{done}"
                ),
                NotCacheable::NotText,
            ),
            (
                format!("{}{done}", CHUNK.replace("\"index\":0", "\"index\":1")),
                NotCacheable::NotText,
            ),
            (
                format!(
                    "data: {{\"choices\":[{{\"index\":0,\"logprobs\":{{}},\"delta\":{{}}}}]}}\n\n{done}"
                ),
                NotCacheable::NotText,
            ),
            // An error chunk, events after the end, not JSON.
            (
                format!("data: {{\"error\":{{\"message\":\"x\"}}}}\n\n{done}"),
                NotCacheable::Malformed,
            ),
            (format!("{ok}{CHUNK}"), NotCacheable::Malformed),
            ("data: nope\n\n".to_owned(), NotCacheable::Malformed),
        ];
        for (body, why) in cases {
            assert_eq!(
                assemble(Wire::OpenAiChat, true, &body).err(),
                Some(why),
                "{body}"
            );
        }
        let filtered = format!("{CHUNK}{}", done.replace("stop", "content_filter"));
        assert_eq!(
            assemble(Wire::OpenAiChat, true, &filtered).err(),
            Some(NotCacheable::Reason)
        );
        let tool_use = r#"{"id":"m","type":"message","model":"c","content":[{"type":"tool_use","id":"t","name":"f","input":{}}],"stop_reason":"tool_use","usage":{"input_tokens":1,"output_tokens":1}}"#;
        assert_eq!(
            assemble(Wire::AnthropicMessages, false, tool_use).err(),
            Some(NotCacheable::NotText)
        );
        let text = tool_use
            .replace(
                r#"{"type":"tool_use","id":"t","name":"f","input":{}}"#,
                r#"{"type":"text","text":"hey"}"#,
            )
            .replace("\"tool_use\"", "\"end_turn\"");
        assert_eq!(
            assemble(Wire::AnthropicMessages, false, &text)
                .unwrap()
                .text(),
            "hey"
        );
        let too_big = Assembler::new(Wire::AnthropicMessages, false, 10);
        let mut too_big = too_big;
        too_big.feed(text.as_bytes());
        assert_eq!(too_big.finish().err(), Some(NotCacheable::TooLarge));
    }
}
