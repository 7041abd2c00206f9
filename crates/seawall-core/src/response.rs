//! What the layers read from a response, and how they learn when its body ends.
//!
//! For an LLM the response head is not the end of the call: a stream runs for seconds or
//! minutes after it, and its usage arrives in the last chunk. Permits, budget reservations and
//! half-open probe slots must be held until the body ends or is dropped. So every layer that
//! holds something attaches an [`OnComplete`] hook with [`LlmResponse::on_complete`]; for HTTP
//! responses this wraps the body in a [`HookedBody`] that fires the hook exactly once.
//!
//! # When the hook fires, and with which [`Outcome`]
//!
//! - [`Outcome::Complete`] as soon as the inner body has nothing more to give: an empty body
//!   when the hook is attached; after a frame, if the inner body then reports
//!   [`is_end_stream`](Body::is_end_stream); after a trailers frame, which finalizes the
//!   exchange; or when `poll_frame` returns `None`. The early checks matter because hyper
//!   stops polling (and drops the body) once `is_end_stream` is true after a frame or
//!   trailers were sent, so a hook that waited for `None` would see a finished call as a
//!   dropped one: a healthy half-open probe would count as a cancellation, an adaptive limit
//!   would never grow, and a completed call would be released as abandoned.
//! - [`Outcome::Failed`] at the first error the body yields.
//! - [`Outcome::Dropped`] when the body is dropped before any of these.
//!
//! The remaining length of [`size_hint`](Body::size_hint) is not taken as the end: a body
//! that has delivered all its bytes may still fail at its end (a stream without its finish
//! marker), so only `is_end_stream`, trailers and `None` count. A body that knows it is done
//! should say so through `is_end_stream` (the classifying body does as soon as its own inner
//! body does and the end checks out); otherwise hyper, which sends a `content-length` from an
//! exact size hint, stops after the last byte and the hook sees a drop. This body passes both
//! hints through unchanged.
//!
//! Hooks nest: each layer wraps the body the layer below returned, so the innermost hook
//! belongs to the layer nearest the transport. They fire inner first, also when the body is
//! dropped: the inner body is dropped before the outer hook runs, so an outer hook (the
//! observe layer's record) sees what the inner ones wrote into the shared call context (the
//! cost the budget layer charged).
//!
//! Usage and stream facts are parsed once, by the classifying body next to the transport, into
//! a shared [`BodyReport`] in the response extensions; the hooks of the outer layers read it.

use std::any::Any;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Extensions, Response};
use http_body::{Body, Frame, SizeHint};
use once_cell::sync::OnceCell;

use crate::error::{BoxError, LlmError};
use crate::ratelimit::RateLimitSnapshot;

/// The content coding of a response's body (`gzip`, `br`, `deflate`, `zstd`, ...), when it
/// has one: `None` without a `content-encoding` header or with `identity`; `Some("unknown")`
/// for a value that is not visible ASCII.
///
/// The layers that read a body read it as the API wrote it. A transport that asked for
/// compression and did not undo it hands them bytes they cannot read: the classifier and the
/// stream timeouts pass such a body on untouched, claiming nothing about its end, rather than
/// take a whole, valid stream for a cut one (and the cache, the continuation and the repair
/// turns, finding no answer in it, pass it on too). Decompress below them: `reqwest` with its
/// `gzip` feature does, and so does tower-http's `DecompressionLayer`.
///
/// ```
/// use http::header::{CONTENT_ENCODING, HeaderMap, HeaderValue};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(seawall_core::content_coding(&headers), None);
/// headers.insert(CONTENT_ENCODING, HeaderValue::from_static("identity"));
/// assert_eq!(seawall_core::content_coding(&headers), None);
/// headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
/// assert_eq!(seawall_core::content_coding(&headers), Some("gzip"));
/// ```
pub fn content_coding(headers: &http::HeaderMap) -> Option<&str> {
    let value = header(headers, &http::header::CONTENT_ENCODING)?;
    let coding = value.to_str().map_or("unknown", str::trim_ascii);
    (!coding.is_empty() && !coding.eq_ignore_ascii_case("identity")).then_some(coding)
}

/// Whether a `Content-Type` value is of `media_type` (given in lowercase), parameters aside:
/// `text/event-stream; charset=utf-8` is `text/event-stream`, `text/htmlx` is not `text/html`.
/// Compared in place, without a lowercase copy: it runs on every response.
///
/// ```
/// assert!(seawall_core::is_media_type(b" Text/HTML ; charset=UTF-8", "text/html"));
/// assert!(!seawall_core::is_media_type(b"application/json", "text/html"));
/// assert!(!seawall_core::is_media_type(b"text/htmlx", "text/html"));
/// ```
pub fn is_media_type(value: &[u8], media_type: &str) -> bool {
    let value = value.trim_ascii_start();
    let n = media_type.len();
    value
        .get(..n)
        .is_some_and(|p| p.eq_ignore_ascii_case(media_type.as_bytes()))
        && matches!(value.get(n), None | Some(b';' | b' ' | b'\t'))
}

/// How many values [`reserve_extensions`] makes room for.
const EXTENSIONS_ROOM: usize = 7;

/// Up to this many header values, a pass over them finds a name sooner than a lookup, which
/// hashes the name ([`header`], [`request_id`]).
const SCAN_AT_MOST: usize = 8;

/// The first value of header `name`, as [`HeaderMap::get`](http::HeaderMap::get) finds it.
///
/// A lookup hashes the name; a request or response has a handful of headers, and comparing
/// each name costs less than that hash (a known name is compared as a tag). A map with more
/// than a few values is looked up as usual.
///
/// ```
/// use http::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
///
/// let mut headers = HeaderMap::new();
/// headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
/// assert_eq!(seawall_core::header(&headers, &CONTENT_TYPE), headers.get(CONTENT_TYPE));
/// ```
pub fn header<'a>(
    headers: &'a http::HeaderMap,
    name: &http::HeaderName,
) -> Option<&'a http::HeaderValue> {
    if headers.len() <= SCAN_AT_MOST {
        headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    } else {
        headers.get(name)
    }
}

/// The headers that carry the upstream's id of a response, in the order they are read:
/// OpenAI's `x-request-id`, Anthropic's `request-id`, Azure's `apim-request-id`, Amazon
/// Bedrock's `x-amzn-requestid`.
pub const REQUEST_ID_HEADERS: [http::HeaderName; 4] = [
    http::HeaderName::from_static("x-request-id"),
    http::HeaderName::from_static("request-id"),
    http::HeaderName::from_static("apim-request-id"),
    http::HeaderName::from_static("x-amzn-requestid"),
];

/// The upstream's id of a response (the first of [`REQUEST_ID_HEADERS`] it has), trimmed, as
/// sent. It is the upstream's input: a record or an error shows it through
/// [`shown_id`](crate::shown_id), as [`LlmError::with_request_id`] does.
///
/// ```
/// use http::{HeaderMap, HeaderValue};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("request-id", HeaderValue::from_static(" req_011 "));
/// assert_eq!(seawall_core::request_id(&headers), Some("req_011"));
/// ```
pub fn request_id(headers: &http::HeaderMap) -> Option<&str> {
    fn id(v: &http::HeaderValue) -> Option<&str> {
        let id = v.to_str().ok()?.trim();
        (!id.is_empty()).then_some(id)
    }
    if headers.len() > SCAN_AT_MOST {
        return REQUEST_ID_HEADERS
            .iter()
            .find_map(|name| headers.get(name).and_then(id));
    }
    // A response has a few headers: one pass over them, keeping each name's first value,
    // costs less than a pass per name.
    let mut best: Option<(usize, &str)> = None;
    let mut last = None;
    for (name, value) in headers {
        // A name's values come together, the first first: only the first counts.
        if last == Some(name) {
            continue;
        }
        last = Some(name);
        let Some(rank) = REQUEST_ID_HEADERS.iter().position(|n| n == name) else {
            continue;
        };
        if best.is_none_or(|(b, _)| rank < b) {
            if let Some(v) = id(value) {
                best = Some((rank, v));
            }
        }
    }
    best.map(|(_, v)| v)
}

/// Gives an empty `Extensions` room for a handful of values in one table, so that the layers
/// of a stack which each insert one (the classifier's report, the stream layer's own report, the
/// gate's queue time, the fallback's served-by) fill it without the table growing on the way.
///
/// An `Extensions` starts with room for three values; the fourth insert reallocates its table.
/// Every seawall layer that inserts into a response calls this first: the first of them (the
/// one nearest the transport) sizes the table once, and for the others it is a length check.
/// A map that already holds something is left as it is. It changes no value: only the
/// capacity.
///
/// ```
/// let mut ext = http::Extensions::new();
/// seawall_core::reserve_extensions(&mut ext);
/// assert!(ext.is_empty());
/// ext.insert(1u8);
/// seawall_core::reserve_extensions(&mut ext); // not empty: untouched
/// assert_eq!(ext.get::<u8>(), Some(&1));
/// ```
pub fn reserve_extensions(ext: &mut Extensions) {
    /// Zero-sized markers: inserting them allocates no box, only the table.
    #[derive(Clone, Copy)]
    struct Room<const N: usize>;
    thread_local! {
        /// An empty map whose table has room for [`EXTENSIONS_ROOM`] values: cloning it is
        /// one allocation for the map and one for the table, as a first insert would be.
        static ROOMY: Extensions = {
            let mut e = Extensions::new();
            e.insert(Room::<0>);
            e.insert(Room::<1>);
            e.insert(Room::<2>);
            e.insert(Room::<3>);
            e.insert(Room::<4>);
            e.insert(Room::<5>);
            e.insert(Room::<6>);
            debug_assert_eq!(e.len(), EXTENSIONS_ROOM);
            e.clear();
            e
        };
    }
    if ext.is_empty() {
        // `try_with` fails only while the thread is being torn down: then the map just grows
        // as it would have.
        let _ = ROOMY.try_with(|r| *ext = r.clone());
    }
}

/// The size hint of a body that holds `held` bytes read ahead of its inner body (replayed
/// before the rest): the inner body's hint raised by them, saturating.
///
/// Every seawall body that reads ahead reports its hint through this one function. Raising
/// the bounds in place is a trap: `SizeHint` panics when its lower bound is set above its
/// upper one, which an exact inner hint does the moment the lower bound goes up first, and
/// a hostile `content-length` near `u64::MAX` would overflow a plain sum.
///
/// ```
/// use http_body::SizeHint;
///
/// let hint = seawall_core::size_hint_plus(SizeHint::with_exact(10), 5);
/// assert_eq!(hint.exact(), Some(15));
/// let hint = seawall_core::size_hint_plus(SizeHint::with_exact(u64::MAX - 1), 5);
/// assert_eq!(hint.exact(), Some(u64::MAX));
/// ```
pub fn size_hint_plus(inner: SizeHint, held: u64) -> SizeHint {
    let mut hint = SizeHint::new();
    if let Some(upper) = inner.upper() {
        hint.set_upper(upper.saturating_add(held));
    }
    hint.set_lower(inner.lower().saturating_add(held));
    hint
}

/// Token usage reported by the upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Usage {
    /// Prompt tokens, cached ones included.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache (billed at the cached price).
    pub cached_input_tokens: u64,
    /// Prompt tokens written to the provider's cache (Anthropic's
    /// `cache_creation_input_tokens`, billed above the input price); part of `input_tokens`,
    /// as the cached ones are.
    pub cache_write_input_tokens: u64,
    /// Of the cache writes, those kept for an hour (Anthropic's
    /// `cache_creation.ephemeral_1h_input_tokens`, billed at twice the input price where its
    /// five-minute writes cost 1.25 times); part of `cache_write_input_tokens`.
    pub cache_write_1h_input_tokens: u64,
}

impl Usage {
    /// Input plus output tokens.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// These counts, as a provider reported them, made to agree: cached input and cache
    /// writes no more than the input they are part of, hour-long writes no more than the
    /// writes, and whatever the provider's `total_tokens` holds beyond the input counted as
    /// output. A thinking model's thought tokens are billed as output; OpenAI counts them in
    /// `completion_tokens`, but some OpenAI-compatible servers (Gemini's, proxies that
    /// translate its counts) leave them out of it and not out of the total.
    pub fn normalized(self, total_tokens: Option<u64>) -> Usage {
        let input = self.input_tokens;
        let cached = self.cached_input_tokens.min(input);
        let written = self.cache_write_input_tokens.min(input - cached);
        Usage {
            input_tokens: input,
            output_tokens: total_tokens.map_or(self.output_tokens, |total| {
                self.output_tokens.max(total.saturating_sub(input))
            }),
            cached_input_tokens: cached,
            cache_write_input_tokens: written,
            cache_write_1h_input_tokens: self.cache_write_1h_input_tokens.min(written),
        }
    }
}

/// Why a stream finished, as the upstream said.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// A natural stop (`stop`, `end_turn`, `stop_sequence`).
    Stop,
    /// The output hit `max_tokens` (`length`, `max_tokens`): ask for a continuation.
    Length,
    /// Tool or function call (`tool_calls`, `tool_use`).
    ToolCalls,
    /// The provider's content filter stopped it.
    ContentFilter,
    /// Anything else, verbatim up to [`FinishReason::MAX_OTHER_CHARS`] characters.
    Other(Box<str>),
}

/// How a timed body ended (what the stream-timeout layer writes into [`StreamTiming`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StreamEnd {
    /// The body ended normally (for a stream: with its finish marker).
    Complete,
    /// The body failed after the commit point: an upstream error, a broken connection, or the
    /// end of a stream without its finish marker.
    Interrupted,
    /// The idle timeout or the total deadline cut the body.
    TimedOut,
}

/// What a stream-timeout layer measured about one response: its time to first content when
/// the body was committed to, and how and at what pace the body ended.
///
/// It lives in the response's [`BodyReport`] rather than in an extension of its own: the
/// classifier already allocates the report, so a stack that times its streams pays no second
/// allocation (and no second extension entry) per call for it. `seawall-stream`'s
/// `StreamStats` is the handle users read it through.
///
/// Its values are atomics rather than once-locks, and the report keeps it inline behind a
/// flag rather than in a once-lock: the first `set` of a once-lock takes the standard
/// library's slow path (two atomic instructions and about 80 others), and these are small
/// values written once per call.
#[derive(Default)]
pub struct StreamTiming {
    /// Nanoseconds to the first content, plus one; 0 when the body ended before any.
    ttft: AtomicU64,
    streamed: AtomicBool,
    /// 0 before the end; else the [`StreamEnd`]'s code (see `StreamEnd::code`).
    end: AtomicU8,
    /// Nanoseconds per output token, plus one; 0 before it is known.
    tpot: AtomicU64,
}

impl std::fmt::Debug for StreamTiming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamTiming")
            .field("ttft", &self.time_to_first_token())
            .field("streamed", &self.is_streamed())
            .field("end", &self.end())
            .field("tpot", &self.time_per_output_token())
            .finish()
    }
}

impl StreamEnd {
    /// Its code in [`StreamTiming`]'s atomic (0 is "not ended").
    fn code(self) -> u8 {
        match self {
            StreamEnd::Complete => 1,
            StreamEnd::Interrupted => 2,
            StreamEnd::TimedOut => 3,
        }
    }

    fn from_code(code: u8) -> Option<StreamEnd> {
        match code {
            1 => Some(StreamEnd::Complete),
            2 => Some(StreamEnd::Interrupted),
            3 => Some(StreamEnd::TimedOut),
            _ => None,
        }
    }
}

impl StreamTiming {
    /// Timings of a body committed to `ttft` after the call (`None`: it ended before any
    /// content), a server-sent-events stream or not.
    pub fn new(ttft: Option<Duration>, streamed: bool) -> Self {
        StreamTiming {
            ttft: AtomicU64::new(ttft.map_or(0, nanos_plus_one)),
            streamed: AtomicBool::new(streamed),
            ..StreamTiming::default()
        }
    }

    /// Time from the call to the first real content.
    pub fn time_to_first_token(&self) -> Option<Duration> {
        match self.ttft.load(Ordering::Acquire) {
            0 => None,
            n => Some(Duration::from_nanos(n - 1)),
        }
    }

    /// Whether the body was a server-sent-events stream.
    pub fn is_streamed(&self) -> bool {
        self.streamed.load(Ordering::Acquire)
    }

    /// Takes `other`'s values (the report's copy, written once, before it is published).
    fn copy_from(&self, other: &StreamTiming) {
        for (to, from) in [(&self.ttft, &other.ttft), (&self.tpot, &other.tpot)] {
            to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        let streamed = other.streamed.load(Ordering::Relaxed);
        self.streamed.store(streamed, Ordering::Relaxed);
        self.end
            .store(other.end.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Records how the body ended (first write wins); `false` if it was already recorded.
    pub fn set_end(&self, end: StreamEnd) -> bool {
        self.end
            .compare_exchange(0, end.code(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// How the body ended, once it has.
    pub fn end(&self) -> Option<StreamEnd> {
        StreamEnd::from_code(self.end.load(Ordering::Acquire))
    }

    /// Records the mean time per output token (first write wins). A pace beyond `u64::MAX`
    /// nanoseconds (five centuries) is kept as that.
    pub fn set_time_per_output_token(&self, tpot: Duration) {
        let _ = self.tpot.compare_exchange(
            0,
            nanos_plus_one(tpot),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// The mean time per output token after the first, once the body has ended.
    pub fn time_per_output_token(&self) -> Option<Duration> {
        match self.tpot.load(Ordering::Acquire) {
            0 => None,
            n => Some(Duration::from_nanos(n - 1)),
        }
    }
}

/// A duration as nanoseconds plus one (0 stands for "none"); one beyond `u64::MAX - 1`
/// nanoseconds (five centuries) is kept as that.
fn nanos_plus_one(d: Duration) -> u64 {
    u64::try_from(d.as_nanos())
        .unwrap_or(u64::MAX - 1)
        .min(u64::MAX - 1)
        + 1
}

/// Facts about a response body, written once by the body parser next to the transport and
/// read by every outer layer. Shared through an `Arc` in the response extensions.
///
/// Its times are kept as nanoseconds since its start in atomics, not in once-locks: the first
/// `set` of a once-lock takes its slow path (a few dozen instructions), and a report is built
/// and written once per call.
#[derive(Debug)]
pub struct BodyReport {
    // `once_cell`'s cells, not the standard library's once-locks, for the three values a
    // whole answer records at once: a cell can be made already holding its value
    // (`with_value`), where a once-lock is always filled through its first `set`'s slow path
    // (about 80 instructions each, three per call).
    usage: OnceCell<Usage>,
    /// Shared per thread ([`shared_name`](crate::shared_name)): a served model's name costs
    /// no allocation once the thread has seen it.
    model: OnceCell<Arc<str>>,
    finish_reason: OnceCell<FinishReason>,
    // A flag, not a once-lock: the first `set` of a once-lock takes its slow path, and a
    // flag needs no first-write rule.
    finished: AtomicBool,
    /// Nanoseconds from the start to the first content, plus one; 0 before any.
    first_content: AtomicU64,
    last_content: AtomicU64,
    content_events: AtomicU64,
    started: tokio::time::Instant,
    /// What a stream layer measured, valid once `stream_set` is [`TIMED`].
    stream: StreamTiming,
    stream_set: AtomicU8,
}

/// `BodyReport::stream_set`: not timed, being written, timed.
const UNTIMED: u8 = 0;
const TIMING: u8 = 1;
const TIMED: u8 = 2;

impl Default for BodyReport {
    /// The same as [`BodyReport::new`]: its clock starts now.
    fn default() -> Self {
        Self::new()
    }
}

impl BodyReport {
    /// A new, empty report whose clock starts now (the attempt's start, ideally).
    pub fn new() -> Self {
        Self::starting_at(tokio::time::Instant::now())
    }

    /// A new report whose clock started at `start`.
    pub fn starting_at(start: tokio::time::Instant) -> Self {
        BodyReport {
            usage: OnceCell::new(),
            model: OnceCell::new(),
            finish_reason: OnceCell::new(),
            finished: AtomicBool::new(false),
            first_content: AtomicU64::new(0),
            last_content: AtomicU64::new(0),
            content_events: AtomicU64::new(0),
            started: start,
            stream: StreamTiming::default(),
            stream_set: AtomicU8::new(UNTIMED),
        }
    }

    /// Records the final usage (first write wins).
    pub fn set_usage(&self, usage: Usage) {
        let _ = self.usage.set(usage);
    }

    /// Records the model that served (first write wins).
    pub fn set_model(&self, model: &str) {
        if self.model.get().is_none() {
            let _ = self.model.set(crate::inline::shared_name(model));
        }
    }

    /// Records the finish reason (first write wins).
    pub fn set_finish_reason(&self, reason: FinishReason) {
        let _ = self.finish_reason.set(reason);
    }

    /// Records the model, usage and finish reason of an answer read whole before its report
    /// is shared, first write wins as with the setters. Through `&mut self` each value is
    /// stored as it is, without the synchronisation of a shared first write.
    pub fn record_answer(
        &mut self,
        model: Option<&str>,
        usage: Option<Usage>,
        finish: Option<FinishReason>,
    ) {
        if let Some(m) = model.filter(|_| self.model.get_mut().is_none()) {
            self.model = OnceCell::with_value(crate::inline::shared_name(m));
        }
        if let Some(u) = usage.filter(|_| self.usage.get_mut().is_none()) {
            self.usage = OnceCell::with_value(u);
        }
        if let Some(f) = finish.filter(|_| self.finish_reason.get_mut().is_none()) {
            self.finish_reason = OnceCell::with_value(f);
        }
    }

    /// Records that the finish marker (`[DONE]`, `message_stop`, or the end of a complete JSON
    /// body) was seen.
    pub fn set_finished(&self) {
        self.finished.store(true, Ordering::Release);
    }

    /// Records one event of real content (a token delta, not a keep-alive).
    ///
    /// For the parser of the body, its one writer: the count, and which content was first, are
    /// not kept exact under calls from two threads at once.
    pub fn record_content(&self) {
        self.record_content_at(tokio::time::Instant::now());
    }

    /// As [`record_content`](Self::record_content), for content that arrived at `at` (as
    /// another report recorded it: see [`content_since`](Self::content_since)), without
    /// reading the clock again.
    pub fn record_content_at(&self, at: tokio::time::Instant) {
        let since = at.saturating_duration_since(self.started);
        let plus_one = nanos_plus_one(since);
        // Only the first content's time is kept; a later one finds it set. A load and a
        // store, not a compare-and-swap (an atomic instruction per call): the one writer.
        if self.first_content.load(Ordering::Relaxed) == 0 {
            self.first_content.store(plus_one, Ordering::Release);
        }
        // Counted by a load and a store, not an atomic add (an atomic instruction per chunk of
        // a stream): the one writer is the parser of this body, which one task polls at a
        // time, and readers only look once the body has ended or for an estimate.
        let events = self.content_events.load(Ordering::Relaxed);
        self.content_events.store(events + 1, Ordering::Relaxed);
        self.last_content.store(plus_one - 1, Ordering::Relaxed);
    }

    /// Records what a stream-timeout layer measured (first write wins); `false` if another
    /// layer already did, and `timing` was not kept.
    pub fn set_stream_timing(&self, timing: StreamTiming) -> bool {
        // Claimed by one atomic instruction, written, then published by a release store.
        if self
            .stream_set
            .compare_exchange(UNTIMED, TIMING, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        self.stream.copy_from(&timing);
        self.stream_set.store(TIMED, Ordering::Release);
        true
    }

    /// What a stream-timeout layer measured, when one timed this body.
    pub fn stream_timing(&self) -> Option<&StreamTiming> {
        (self.stream_set.load(Ordering::Acquire) == TIMED).then_some(&self.stream)
    }

    /// The usage, once known.
    pub fn usage(&self) -> Option<Usage> {
        self.usage.get().copied()
    }

    /// The model that served, once known.
    pub fn model(&self) -> Option<&str> {
        self.model.get().map(|m| &**m)
    }

    /// The finish reason, once known.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.finish_reason.get()
    }

    /// Whether the finish marker was seen.
    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Whether any real content has arrived.
    pub fn has_content(&self) -> bool {
        self.first_content.load(Ordering::Acquire) != 0
    }

    /// When the last real content arrived, on tokio's clock, once any has.
    pub fn last_content_at(&self) -> Option<tokio::time::Instant> {
        if !self.has_content() {
            return None;
        }
        let since = Duration::from_nanos(self.last_content.load(Ordering::Relaxed));
        self.started.checked_add(since)
    }

    /// The number of content events so far.
    pub fn content_events(&self) -> u64 {
        self.content_events.load(Ordering::Relaxed)
    }

    /// When the last content arrived, if any was recorded since the count was `counted` (a
    /// [`content_events`](Self::content_events) read before polling the body this report
    /// is the parser's of). A layer outside the parser takes a content frame's time from here
    /// instead of reading the clock again for the same frame: a clock read is about 20 ns on
    /// a virtual machine, a tenth of what reading and timing a streamed chunk costs.
    pub fn content_since(&self, counted: u64) -> Option<tokio::time::Instant> {
        if self.content_events() > counted {
            self.last_content_at()
        } else {
            None
        }
    }

    /// Time from the report's start to the first content.
    pub fn time_to_first_token(&self) -> Option<std::time::Duration> {
        match self.first_content.load(Ordering::Acquire) {
            0 => None,
            n => Some(std::time::Duration::from_nanos(n - 1)),
        }
    }

    /// Mean time per output token after the first: the span from first to last content divided
    /// by the output tokens after the first (usage if known, else content events).
    pub fn time_per_output_token(&self) -> Option<std::time::Duration> {
        let ttft = self.time_to_first_token()?;
        let last = std::time::Duration::from_nanos(self.last_content.load(Ordering::Relaxed));
        let tokens = self
            .usage()
            .map(|u| u.output_tokens)
            .unwrap_or_else(|| self.content_events());
        if tokens < 2 {
            return None;
        }
        let span = last.saturating_sub(ttft);
        Some(span / u32::try_from(tokens - 1).unwrap_or(u32::MAX))
    }
}

/// How a response body ended.
#[derive(Debug, Clone, Copy)]
pub enum Outcome<'a> {
    /// The body ended normally.
    Complete,
    /// The body yielded an error (`None` when it is not an [`LlmError`]).
    Failed(Option<&'a LlmError>),
    /// The body was dropped before its end: the caller went away.
    Dropped,
}

/// What a hook learns when the body ends.
#[derive(Debug, Clone, Copy)]
pub struct Completion<'a> {
    /// How it ended.
    pub outcome: Outcome<'a>,
    /// The body report, if the response had one.
    pub report: Option<&'a BodyReport>,
    /// The usage, if known (from the report, or from the response itself).
    pub usage: Option<Usage>,
}

/// Something that runs once when a response is done: releases a permit, settles a budget
/// reservation, records a breaker outcome.
pub trait OnComplete: Send + 'static {
    /// Called exactly once.
    fn on_complete(self, completion: Completion<'_>);
}

impl<F> OnComplete for F
where
    F: FnOnce(Completion<'_>) + Send + 'static,
{
    fn on_complete(self, completion: Completion<'_>) {
        self(completion)
    }
}

/// What the layers read from a response, and how they hook its end.
///
/// Implemented for `http::Response<B>`. A user's own, fully-read response type implements it in
/// a few lines; its hook fires at once:
///
/// ```
/// use seawall_core::{Completion, LlmResponse, OnComplete, Outcome, Usage};
///
/// struct Answer { text: String, usage: Usage }
///
/// impl LlmResponse for Answer {
///     type Hooked<G: OnComplete> = Answer;
///     fn usage(&self) -> Option<Usage> { Some(self.usage) }
///     fn on_complete<G: OnComplete>(self, hook: G) -> Answer {
///         hook.on_complete(Completion { outcome: Outcome::Complete, report: None, usage: Some(self.usage) });
///         self
///     }
/// }
/// let a = Answer { text: "hi".into(), usage: Usage { input_tokens: 3, output_tokens: 1, ..Usage::default() } };
/// let a = a.on_complete(|c: Completion<'_>| assert_eq!(c.usage.unwrap().total(), 4));
/// assert_eq!(a.text, "hi");
/// ```
pub trait LlmResponse: Sized {
    /// The response type once a hook is attached.
    type Hooked<G: OnComplete>: LlmResponse;

    /// Usage, if known at the head (a fully-read response), else from a finished body report.
    fn usage(&self) -> Option<Usage>;

    /// The model that served, if known.
    fn served_model(&self) -> Option<&str> {
        None
    }

    /// The upstream's rate-limit snapshot, if it sent one.
    fn rate_limit(&self) -> Option<&RateLimitSnapshot> {
        self.extensions()?.get()
    }

    /// The shared body report, if a body parser attached one.
    fn body_report(&self) -> Option<&Arc<BodyReport>> {
        self.extensions()?.get()
    }

    /// The response's extensions, if it has any.
    fn extensions(&self) -> Option<&Extensions> {
        None
    }

    /// The response's headers, if it has any (for the upstream request id, say).
    fn headers(&self) -> Option<&http::HeaderMap> {
        None
    }

    /// The HTTP status, if the response has one.
    fn status(&self) -> Option<http::StatusCode> {
        None
    }

    /// The response's extensions, mutably.
    fn extensions_mut(&mut self) -> Option<&mut Extensions> {
        None
    }

    /// Arranges for `hook` to run once when the response is done.
    fn on_complete<G: OnComplete>(self, hook: G) -> Self::Hooked<G>;
}

impl<B> LlmResponse for Response<B>
where
    B: Body,
    B::Error: 'static,
{
    type Hooked<G: OnComplete> = Response<HookedBody<B, G>>;

    fn usage(&self) -> Option<Usage> {
        self.extensions()
            .get::<Usage>()
            .copied()
            .or_else(|| self.body_report()?.usage())
    }

    fn served_model(&self) -> Option<&str> {
        self.body_report()?.model()
    }

    fn extensions(&self) -> Option<&Extensions> {
        Some(Response::extensions(self))
    }

    fn headers(&self) -> Option<&http::HeaderMap> {
        Some(Response::headers(self))
    }

    fn status(&self) -> Option<http::StatusCode> {
        Some(Response::status(self))
    }

    fn extensions_mut(&mut self) -> Option<&mut Extensions> {
        Some(Response::extensions_mut(self))
    }

    #[inline]
    fn on_complete<G: OnComplete>(self, hook: G) -> Self::Hooked<G> {
        let report = self.body_report().cloned();
        let usage = KeptUsage::new(self.extensions().get::<Usage>().copied());
        let mut hook = Hook {
            hook: Some(hook),
            report,
            usage,
        };
        // An empty body may never be polled (hyper checks `is_end_stream` first): it is done.
        if self.body().is_end_stream() {
            hook.fire(Outcome::Complete);
        }
        self.map(|inner| HookedBody { inner, hook })
    }
}

/// Finds an [`LlmError`] in a body error, whether it is one or a boxed one.
pub fn as_llm_error<'a>(err: &'a (dyn Any + 'static)) -> Option<&'a LlmError> {
    err.downcast_ref::<LlmError>().or_else(|| {
        err.downcast_ref::<BoxError>()
            .and_then(|b| b.downcast_ref::<LlmError>())
    })
}

pin_project_lite::pin_project! {
    /// A body that runs its hook once, when the inner body ends, fails, or is dropped.
    ///
    /// See the [module docs](self) for when each [`Outcome`] fires. The hook bound sits on the
    /// struct because the hook runs from `Drop`.
    pub struct HookedBody<B, G: OnComplete> {
        // Fields drop in declaration order: the inner body (and the hooks inside it) goes
        // first, then `hook` fires `Dropped` if nothing else fired it.
        #[pin]
        inner: B,
        hook: Hook<G>,
    }
}

/// The pending hook and what it will be told; fires `Dropped` if dropped unfired.
struct Hook<G: OnComplete> {
    hook: Option<G>,
    report: Option<Arc<BodyReport>>,
    usage: KeptUsage,
}

impl<G: OnComplete> Hook<G> {
    fn fire(&mut self, outcome: Outcome<'_>) {
        if let Some(hook) = self.hook.take() {
            fire(hook, outcome, self.report.as_deref(), self.usage.get());
        }
    }
}

/// A response's [`Usage`] extension, as a hook keeps it: in 16 bytes rather than 32. Each
/// layer with a hook keeps one in the body that every layer above moves; counts beyond `u32`
/// (no real answer's) are boxed.
enum KeptUsage {
    None,
    Small([u32; 3]),
    Large(Box<Usage>),
}

impl KeptUsage {
    fn new(usage: Option<Usage>) -> KeptUsage {
        let Some(u) = usage else {
            return KeptUsage::None;
        };
        let small = |n: u64| u32::try_from(n).ok();
        match (
            small(u.input_tokens),
            small(u.output_tokens),
            small(u.cached_input_tokens),
        ) {
            // Cache writes are rare (a prompt cache is written once and read after): kept
            // boxed, so the usual usage stays in 16 bytes.
            (Some(i), Some(o), Some(c))
                if u.cache_write_input_tokens == 0 && u.cache_write_1h_input_tokens == 0 =>
            {
                KeptUsage::Small([i, o, c])
            }
            _ => KeptUsage::Large(Box::new(u)),
        }
    }

    fn get(&self) -> Option<Usage> {
        match self {
            KeptUsage::None => None,
            KeptUsage::Small([i, o, c]) => Some(Usage {
                input_tokens: (*i).into(),
                output_tokens: (*o).into(),
                cached_input_tokens: (*c).into(),
                cache_write_input_tokens: 0,
                cache_write_1h_input_tokens: 0,
            }),
            KeptUsage::Large(u) => Some(**u),
        }
    }
}

impl<G: OnComplete> Drop for Hook<G> {
    // `fire` takes the hook, so a hook that already heard the body end or fail is not told
    // again. A body dropped before its end (the caller stopped reading) reports `Dropped` here,
    // with whatever usage the body saw, so every hook hears exactly one outcome.
    fn drop(&mut self) {
        self.fire(Outcome::Dropped);
    }
}

fn fire<G: OnComplete>(
    hook: G,
    outcome: Outcome<'_>,
    report: Option<&BodyReport>,
    usage: Option<Usage>,
) {
    let usage = usage.or_else(|| report?.usage());
    hook.on_complete(Completion {
        outcome,
        report,
        usage,
    });
}

impl<B, G: OnComplete> HookedBody<B, G> {
    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<B, G: OnComplete> std::fmt::Debug for HookedBody<B, G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookedBody")
            .field("pending", &self.hook.hook.is_some())
            .finish_non_exhaustive()
    }
}

impl<B, G> Body for HookedBody<B, G>
where
    B: Body,
    B::Error: 'static,
    G: OnComplete,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let polled = ready!(this.inner.as_mut().poll_frame(cx));
        match &polled {
            Some(Ok(frame)) => {
                if frame.is_trailers() || this.inner.is_end_stream() {
                    this.hook.fire(Outcome::Complete);
                }
            }
            Some(Err(e)) => {
                let e: &(dyn Any + 'static) = e;
                this.hook.fire(Outcome::Failed(as_llm_error(e)));
            }
            None => this.hook.fire(Outcome::Complete),
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full, StreamBody};
    use std::sync::Mutex;

    type Log = Arc<Mutex<Vec<String>>>;

    fn hook(log: &Log) -> impl OnComplete {
        let log = log.clone();
        move |c: Completion<'_>| {
            let what = match c.outcome {
                Outcome::Complete => "complete".to_owned(),
                Outcome::Failed(e) => format!("failed:{}", e.map_or("?", |e| e.class().as_str())),
                Outcome::Dropped => "dropped".to_owned(),
            };
            log.lock()
                .unwrap()
                .push(format!("{what}:{:?}", c.usage.map(|u| u.total())));
        }
    }

    #[tokio::test]
    async fn fires_once_on_end_with_report_usage() {
        let log = Log::default();
        let report = Arc::new(BodyReport::new());
        let mut resp = Response::new(Full::new(Bytes::from_static(b"hello")));
        resp.extensions_mut().insert(report.clone());
        let resp = resp.on_complete(hook(&log));
        report.set_usage(Usage {
            input_tokens: 2,
            output_tokens: 3,
            cached_input_tokens: 0,
            cache_write_input_tokens: 0,
            cache_write_1h_input_tokens: 0,
        });
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hello");
        assert_eq!(*log.lock().unwrap(), ["complete:Some(5)"]);
    }

    proptest::proptest! {
        /// A hook keeps a response's `Usage` extension in a compact form: whatever the counts,
        /// it hears them exactly.
        #[test]
        fn a_hook_hears_the_usage_extension_exactly(
            input in proptest::prop_oneof![0..=u64::from(u32::MAX), proptest::num::u64::ANY],
            output in proptest::prop_oneof![0..=u64::from(u32::MAX), proptest::num::u64::ANY],
            cached in proptest::prop_oneof![0..=u64::from(u32::MAX), proptest::num::u64::ANY],
        ) {
            let usage = Usage { input_tokens: input, output_tokens: output, cached_input_tokens: cached, cache_write_input_tokens: 0, cache_write_1h_input_tokens: 0 };
            let heard = Arc::new(Mutex::new(None));
            let sink = heard.clone();
            let mut resp = Response::new(http_body_util::Empty::<Bytes>::new());
            resp.extensions_mut().insert(usage);
            // An empty body is done at once: the hook fires here.
            let _resp = resp.on_complete(move |c: Completion<'_>| *sink.lock().unwrap() = c.usage);
            proptest::prop_assert_eq!(*heard.lock().unwrap(), Some(usage));
        }

        /// One pass over a response's headers finds the id a lookup per name, in
        /// `REQUEST_ID_HEADERS`' order, finds: the first value of the first name whose first
        /// value is not blank; whatever the headers, their order, repeats and number.
        #[test]
        fn one_pass_finds_the_request_id_a_lookup_per_name_finds(
            entries in proptest::collection::vec((0usize..7, 0u8..4), 0..14),
        ) {
            const NAMES: [&str; 7] = [
                "x-request-id", "request-id", "apim-request-id", "x-amzn-requestid",
                "content-type", "x-pad", "openai-processing-ms",
            ];
            const VALUES: [&str; 4] = ["a", " b ", "  ", ""];
            let mut headers = http::HeaderMap::new();
            for (name, value) in entries {
                headers.append(NAMES[name], http::HeaderValue::from_static(VALUES[usize::from(value)]));
            }
            let by_name = REQUEST_ID_HEADERS.iter().find_map(|name| {
                let id = headers.get(name)?.to_str().ok()?.trim();
                (!id.is_empty()).then_some(id)
            });
            proptest::prop_assert_eq!(request_id(&headers), by_name);
        }
    }

    #[tokio::test]
    async fn fires_dropped_when_abandoned_and_complete_when_empty() {
        let log = Log::default();
        let chunks = futures_like(vec![Ok(Frame::data(Bytes::from_static(b"a")))]);
        let resp = Response::new(chunks).on_complete(hook(&log));
        drop(resp);
        let resp = Response::new(http_body_util::Empty::<Bytes>::new()).on_complete(hook(&log));
        drop(resp);
        assert_eq!(*log.lock().unwrap(), ["dropped:None", "complete:None"]);
    }

    #[tokio::test]
    async fn fires_failed_with_the_llm_error() {
        let log = Log::default();
        let err = LlmError::new(crate::FailureClass::StreamInterrupted, "cut");
        let body = futures_like(vec![Ok(Frame::data(Bytes::from_static(b"a"))), Err(err)]);
        let mut body = Response::new(body).on_complete(hook(&log)).into_body();
        assert!(body.frame().await.unwrap().is_ok());
        assert!(body.frame().await.unwrap().is_err());
        drop(body);
        assert_eq!(*log.lock().unwrap(), ["failed:stream_interrupted:None"]);
    }

    #[tokio::test]
    async fn fires_complete_when_inner_reports_end_after_its_last_frame() {
        let log = Log::default();
        // `Full` reports `is_end_stream` as soon as its one frame is out; hyper then stops.
        let resp = Response::new(Full::new(Bytes::from_static(b"hello"))).on_complete(hook(&log));
        let mut body = resp.into_body();
        assert!(body.frame().await.unwrap().unwrap().is_data());
        assert!(body.is_end_stream());
        assert_eq!(*log.lock().unwrap(), ["complete:None"]);
        drop(body);
        assert_eq!(*log.lock().unwrap(), ["complete:None"]);
    }

    #[tokio::test]
    async fn fires_complete_after_trailers_and_not_after_a_middle_frame() {
        let log = Log::default();
        let body = futures_like(vec![
            Ok(Frame::data(Bytes::from_static(b"a"))),
            Ok(Frame::trailers(http::HeaderMap::new())),
        ]);
        let mut body = Response::new(body).on_complete(hook(&log)).into_body();
        assert!(body.frame().await.unwrap().is_ok());
        assert!(log.lock().unwrap().is_empty());
        assert!(body.frame().await.unwrap().unwrap().is_trailers());
        drop(body);
        assert_eq!(*log.lock().unwrap(), ["complete:None"]);
    }

    #[tokio::test]
    async fn dropping_drops_the_inner_body_before_firing_the_hook() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let (inner_order, outer_order) = (order.clone(), order.clone());
        let body = futures_like(vec![Ok(Frame::data(Bytes::from_static(b"a")))]);
        let inner = Response::new(body)
            .on_complete(move |_: Completion<'_>| inner_order.lock().unwrap().push("inner"));
        let outer =
            inner.on_complete(move |_: Completion<'_>| outer_order.lock().unwrap().push("outer"));
        drop(outer);
        assert_eq!(*order.lock().unwrap(), ["inner", "outer"]);
    }

    /// Scripted frames that, like hyper's own bodies, may report their end as soon as the last
    /// one is out.
    struct Script {
        frames: std::collections::VecDeque<Result<Frame<Bytes>, LlmError>>,
        reports_end: bool,
    }

    impl Body for Script {
        type Data = Bytes;
        type Error = LlmError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, LlmError>>> {
            Poll::Ready(self.frames.pop_front())
        }

        fn is_end_stream(&self) -> bool {
            self.reports_end && self.frames.is_empty()
        }
    }

    #[derive(Debug, Clone, Copy)]
    enum Step {
        Data,
        Trailers,
        Error,
    }

    proptest::proptest! {
        /// Whatever the inner hint (exact, open, or near `u64::MAX`, as a hostile
        /// `content-length` makes it) and however much is held, the hint is the inner one
        /// raised by what is held, saturating: never a panic, never a lower bound above the
        /// upper one.
        #[test]
        fn a_hint_raised_by_held_bytes_keeps_its_bounds_in_order(
            lower in proptest::prop_oneof![0u64..1_000, (u64::MAX - 1_000)..=u64::MAX],
            extra in proptest::option::of(proptest::prop_oneof![0u64..1_000, (u64::MAX - 1_000)..=u64::MAX]),
            held in proptest::prop_oneof![0u64..1_000, (u64::MAX - 1_000)..=u64::MAX],
        ) {
            let mut inner = SizeHint::new();
            if let Some(extra) = extra {
                inner.set_upper(lower.saturating_add(extra));
            }
            inner.set_lower(lower);
            let hint = size_hint_plus(inner, held);
            proptest::prop_assert_eq!(hint.lower(), lower.saturating_add(held));
            proptest::prop_assert_eq!(
                hint.upper(),
                extra.map(|e| lower.saturating_add(e).saturating_add(held))
            );
        }
    }

    proptest::proptest! {
        /// However far a consumer reads before it drops the body, the hook fires exactly once,
        /// with the first end it could have seen: an error, trailers, a frame after which the
        /// body reported its end, `None`, or else the drop.
        #[test]
        fn the_hook_fires_once_with_the_first_end_the_consumer_could_see(
            steps in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just(Step::Data),
                    proptest::strategy::Just(Step::Trailers),
                    proptest::strategy::Just(Step::Error),
                ],
                0..6,
            ),
            reports_end in proptest::bool::ANY,
            polls in 0usize..8,
        ) {
            let log = Log::default();
            let frames = steps
                .iter()
                .map(|s| match s {
                    Step::Data => Ok(Frame::data(Bytes::from_static(b"x"))),
                    Step::Trailers => Ok(Frame::trailers(http::HeaderMap::new())),
                    Step::Error => Err(LlmError::new(crate::FailureClass::StreamInterrupted, "cut")),
                })
                .collect();
            let body = Response::new(Script { frames, reports_end })
                .on_complete(hook(&log))
                .into_body();
            let mut body = Box::pin(body);
            let mut cx = Context::from_waker(std::task::Waker::noop());
            let mut expected = if reports_end && steps.is_empty() { "complete" } else { "dropped" };
            for i in 0..polls {
                let Poll::Ready(frame) = body.as_mut().poll_frame(&mut cx) else {
                    proptest::prop_assert!(false, "a scripted body is always ready");
                    return Ok(());
                };
                if expected == "dropped" {
                    expected = match frame {
                        None => "complete",
                        Some(Err(_)) => "failed",
                        Some(Ok(f)) if f.is_trailers() => "complete",
                        Some(Ok(_)) if reports_end && i + 1 == steps.len() => "complete",
                        Some(Ok(_)) => "dropped",
                    };
                }
            }
            proptest::prop_assert!(log.lock().unwrap().len() <= 1);
            drop(body);
            let log = log.lock().unwrap();
            proptest::prop_assert_eq!(log.len(), 1, "{:?}", *log);
            proptest::prop_assert!(log[0].starts_with(expected), "{:?} != {}", *log, expected);
        }
    }

    fn futures_like(
        items: Vec<Result<Frame<Bytes>, LlmError>>,
    ) -> StreamBody<futures_iter::Iter<Result<Frame<Bytes>, LlmError>>> {
        StreamBody::new(futures_iter::Iter(items.into_iter()))
    }

    mod futures_iter {
        use std::pin::Pin;
        use std::task::{Context, Poll};
        pub(super) struct Iter<T>(pub(super) std::vec::IntoIter<T>);
        impl<T: Unpin> futures_core::Stream for Iter<T> {
            type Item = T;
            fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<T>> {
                Poll::Ready(self.0.next())
            }
        }
    }

    #[test]
    fn a_report_says_when_its_last_content_arrived() {
        tokio_test_paused(|| async {
            let r = BodyReport::new();
            let start = tokio::time::Instant::now();
            assert_eq!(r.last_content_at(), None, "no content yet");
            tokio::time::advance(std::time::Duration::from_millis(300)).await;
            r.record_content();
            tokio::time::advance(std::time::Duration::from_millis(900)).await;
            r.record_content();
            tokio::time::advance(std::time::Duration::from_secs(5)).await;
            // The last content's time, not the first's, nor the time it is asked.
            assert_eq!(
                r.last_content_at(),
                Some(start + std::time::Duration::from_millis(1_200))
            );
        });
    }

    #[test]
    fn tpot_from_usage() {
        tokio_test_paused(|| async {
            let r = BodyReport::new();
            assert_eq!(r.time_to_first_token(), None);
            tokio::time::advance(std::time::Duration::from_millis(300)).await;
            r.record_content();
            tokio::time::advance(std::time::Duration::from_millis(900)).await;
            r.record_content();
            r.set_usage(Usage {
                input_tokens: 1,
                output_tokens: 10,
                cached_input_tokens: 0,
                cache_write_input_tokens: 0,
                cache_write_1h_input_tokens: 0,
            });
            assert_eq!(
                r.time_to_first_token(),
                Some(std::time::Duration::from_millis(300))
            );
            assert_eq!(
                r.time_per_output_token(),
                Some(std::time::Duration::from_millis(100))
            );
        });
    }

    #[test]
    fn content_at_the_reports_start_is_content_with_a_zero_first_token_time() {
        tokio_test_paused(|| async {
            let r = BodyReport::default();
            assert!(!r.has_content());
            r.record_content();
            assert!(r.has_content());
            assert_eq!(r.time_to_first_token(), Some(std::time::Duration::ZERO));
            assert_eq!(r.content_events(), 1);
        });
    }

    #[test]
    fn a_report_keeps_the_first_stream_timing_set_and_shows_none_before() {
        let r = BodyReport::new();
        assert!(r.stream_timing().is_none());
        let first = StreamTiming::new(Some(Duration::from_millis(40)), true);
        first.set_time_per_output_token(Duration::from_millis(3));
        assert!(r.set_stream_timing(first));
        assert!(!r.set_stream_timing(StreamTiming::new(None, false)));
        let t = r.stream_timing().expect("timed");
        assert_eq!(t.time_to_first_token(), Some(Duration::from_millis(40)));
        assert!(t.is_streamed());
        assert_eq!(t.time_per_output_token(), Some(Duration::from_millis(3)));
        assert_eq!(t.end(), None);
        // Written through the report afterwards, as the stream layer's body does.
        assert!(t.set_end(StreamEnd::Complete));
        assert_eq!(
            r.stream_timing().and_then(StreamTiming::end),
            Some(StreamEnd::Complete)
        );
        // A body that ended before any content has no first token.
        let none = BodyReport::new();
        assert!(none.set_stream_timing(StreamTiming::new(None, false)));
        assert_eq!(none.stream_timing().unwrap().time_to_first_token(), None);
    }

    #[test]
    fn a_stream_timing_keeps_the_first_end_and_pace_written() {
        let t = StreamTiming::new(Some(Duration::from_millis(40)), true);
        assert_eq!((t.end(), t.time_per_output_token()), (None, None));
        for end in [
            StreamEnd::Complete,
            StreamEnd::Interrupted,
            StreamEnd::TimedOut,
        ] {
            let fresh = StreamTiming::default();
            assert!(fresh.set_end(end));
            assert_eq!(fresh.end(), Some(end));
        }
        assert!(t.set_end(StreamEnd::Interrupted));
        assert!(!t.set_end(StreamEnd::Complete));
        assert_eq!(t.end(), Some(StreamEnd::Interrupted));
        t.set_time_per_output_token(Duration::from_micros(12_345));
        t.set_time_per_output_token(Duration::from_secs(1));
        assert_eq!(
            t.time_per_output_token(),
            Some(Duration::from_micros(12_345))
        );
        // A zero pace is a pace, not "unknown"; one past u64 nanoseconds is kept as the most.
        let zero = StreamTiming::default();
        zero.set_time_per_output_token(Duration::ZERO);
        assert_eq!(zero.time_per_output_token(), Some(Duration::ZERO));
        let huge = StreamTiming::default();
        huge.set_time_per_output_token(Duration::MAX);
        assert_eq!(
            huge.time_per_output_token(),
            Some(Duration::from_nanos(u64::MAX - 1))
        );
        let shown = format!("{t:?}");
        assert!(
            shown.contains("Some(Interrupted)") && shown.contains("12.345ms"),
            "{shown}"
        );
    }

    #[test]
    fn an_answer_recorded_before_sharing_keeps_the_first_write_of_each_field() {
        tokio_test_paused(|| async {
            let mut r = BodyReport::new();
            r.set_model("first");
            let usage = Usage {
                input_tokens: 3,
                output_tokens: 4,
                cached_input_tokens: 1,
                cache_write_input_tokens: 0,
                cache_write_1h_input_tokens: 0,
            };
            r.record_answer(Some("second"), Some(usage), Some(FinishReason::Length));
            assert_eq!(r.model(), Some("first"));
            assert_eq!(r.usage(), Some(usage));
            assert_eq!(r.finish_reason(), Some(&FinishReason::Length));
            // Written once, by either path: later writes change nothing.
            r.record_answer(None, Some(Usage::default()), Some(FinishReason::Stop));
            r.set_finish_reason(FinishReason::ToolCalls);
            assert_eq!(r.usage(), Some(usage));
            assert_eq!(r.finish_reason(), Some(&FinishReason::Length));
            let mut empty = BodyReport::new();
            empty.record_answer(None, None, None);
            assert_eq!(
                (empty.model(), empty.usage(), empty.finish_reason()),
                (None, None, None)
            );
        });
    }

    fn tokio_test_paused<F: std::future::Future<Output = ()>>(f: impl FnOnce() -> F) {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(f());
    }

    proptest::proptest! {
        /// Whatever a provider reported, the parts fit in what they are part of, and output
        /// is what it said or what the total holds beyond the input, whichever is more.
        #[test]
        fn normalized_usage_parts_fit_and_output_is_the_larger_reading(
            counts in proptest::array::uniform5(0u64..1_000_000),
            total in proptest::option::of(0u64..2_000_000),
        ) {
            let [input, output, cached, written, hour] = counts;
            let u = Usage {
                input_tokens: input,
                output_tokens: output,
                cached_input_tokens: cached,
                cache_write_input_tokens: written,
                cache_write_1h_input_tokens: hour,
            }
            .normalized(total);
            proptest::prop_assert_eq!(u.input_tokens, input);
            proptest::prop_assert_eq!(u.cached_input_tokens, cached.min(input));
            proptest::prop_assert!(u.cached_input_tokens + u.cache_write_input_tokens <= input);
            proptest::prop_assert_eq!(
                u.cache_write_input_tokens,
                written.min(input - u.cached_input_tokens)
            );
            proptest::prop_assert_eq!(u.cache_write_1h_input_tokens, hour.min(u.cache_write_input_tokens));
            let beyond = total.map_or(0, |t| t.saturating_sub(input));
            proptest::prop_assert_eq!(u.output_tokens, output.max(beyond));
        }
    }
}
