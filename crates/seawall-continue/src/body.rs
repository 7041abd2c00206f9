//! [`ContinueBody`]: the caller's body. Passed through untouched when nothing is continued;
//! for a stream, read event by event so that a continuation's events can follow the ones
//! already delivered as if one attempt had sent them all.
//!
//! How a stream is spliced (the [`Splice`]):
//!
//! - every event is passed on whole: bytes after the last blank line are held until the
//!   event ends, so a cut never leaves half an event with the caller;
//! - the text of every content delta is kept (the partial answer a follow-up carries);
//! - an answer that finishes with `length` while a continuation is possible: its finish
//!   event and everything after it (`content_block_stop`, usage, `[DONE]`, `message_stop`)
//!   are not passed on, and a follow-up request is made; Anthropic's `content_block_stop` is
//!   held until the event after it says whether the answer goes on;
//! - a body error of class `StreamInterrupted` while a resumption is possible: error events
//!   just before it (a finish word that says the answer failed among them) and whatever
//!   followed them (`[DONE]`) are held, and a follow-up request is made;
//! - a follow-up's events: its opening events (role delta, `message_start`, the first
//!   `content_block_start`) are dropped, its text deltas (trimmed, see [`Trim`]) are sent in
//!   the first attempt's shape (its id and model, its block index), and its closing events
//!   carry the usage of all attempts summed;
//! - while the layer holds a stream's first tokens back (`restart_within`), the frames wait in
//!   the queue for the caller; a `StreamInterrupted` cut then drops them and sends the
//!   original request again, whose stream is read as a first attempt's;
//! - a follow-up that cannot be made or fails before its first content: the caller gets what
//!   it would have got without the layer: the held error events and the original error, or,
//!   after `length`, the finish, usage and finish marker.
//!
//! [`Trim`]: crate::trim::Trim

use std::collections::VecDeque;
use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use seawall_core::{
    BodyReport, FailureClass, FinishReason, SpareClone, SseDecoder, SseItem, as_llm_error,
};
use serde_json::Value;
use tower_service::Service;

use crate::events::{self, Framer, Kind, OpenAiHead, Seen};
use crate::layer::LocalConfig;
use crate::request::{Template, Wire};
use crate::scan::Memo;
use crate::trim::Trim;
use crate::usage;

pin_project_lite::pin_project! {
    /// The body of a response from [`Continue`](crate::Continue).
    ///
    /// Unchanged (the inner body) when the request is not one the layer continues, or its
    /// answer needed nothing; a rebuilt JSON answer after continuations of a non-streamed
    /// answer; a spliced stream for a streamed request (see the module docs). Its errors
    /// are the inner body's, unchanged.
    pub struct ContinueBody<S, F, B: Body> {
        #[pin]
        kind: BodyKind<S, F, B>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum BodyKind<S, F, B: Body> {
        Pass { #[pin] inner: B },
        Full { data: Option<Bytes>, error: Option<B::Error> },
        Replay { head: Option<Bytes>, inner: Pin<Box<B>> },
        Stream { splice: Box<Splice<S, F, B>> },
    }
}

impl<S, F, B: Body> ContinueBody<S, F, B> {
    pub(crate) fn pass(inner: B) -> Self {
        ContinueBody {
            kind: BodyKind::Pass { inner },
        }
    }

    pub(crate) fn full(data: Bytes, error: Option<B::Error>) -> Self {
        ContinueBody {
            kind: BodyKind::Full {
                data: (!data.is_empty()).then_some(data),
                error,
            },
        }
    }

    pub(crate) fn replay(head: Bytes, inner: Pin<Box<B>>) -> Self {
        ContinueBody {
            kind: BodyKind::Replay {
                head: (!head.is_empty()).then_some(head),
                inner,
            },
        }
    }

    pub(crate) fn stream(splice: Splice<S, F, B>) -> Self {
        ContinueBody {
            kind: BodyKind::Stream {
                splice: Box::new(splice),
            },
        }
    }
}

impl<S, F, B: Body> std::fmt::Debug for ContinueBody<S, F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            BodyKind::Pass { .. } => "pass",
            BodyKind::Full { .. } => "full",
            BodyKind::Replay { .. } => "replay",
            BodyKind::Stream { .. } => "stream",
        };
        f.debug_struct("ContinueBody")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl<S, F, B> Body for ContinueBody<S, F, B>
where
    S: Service<Request<Bytes>, Response = Response<B>, Future = F> + Clone,
    F: Future<Output = Result<Response<B>, S::Error>>,
    B: Body<Data = Bytes>,
    B::Error: 'static,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Pass { inner } => inner.poll_frame(cx),
            KindProj::Full { data, error } => Poll::Ready(match data.take() {
                Some(d) => Some(Ok(Frame::data(d))),
                None => error.take().map(Err),
            }),
            KindProj::Replay { head, inner } => match head.take() {
                Some(h) => Poll::Ready(Some(Ok(Frame::data(h)))),
                None => inner.as_mut().poll_frame(cx),
            },
            KindProj::Stream { splice } => splice.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            BodyKind::Pass { inner } => inner.is_end_stream(),
            BodyKind::Full { data, error } => data.is_none() && error.is_none(),
            BodyKind::Replay { head, inner } => head.is_none() && inner.is_end_stream(),
            BodyKind::Stream { splice } => splice.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Pass { inner } => inner.size_hint(),
            BodyKind::Full { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            BodyKind::Replay { head, inner } => {
                let h = head.as_ref().map_or(0, |d| d.len() as u64);
                seawall_core::size_hint_plus(inner.size_hint(), h)
            }
            BodyKind::Stream { .. } => SizeHint::default(),
        }
    }
}

/// The most a held stream's body may send before it is let through, whatever it holds: a
/// stream of keep-alives or events without text is not held without bound.
const HOLD_MAX_BYTES: usize = 64 << 10;

enum State<F, B> {
    Body(Pin<Box<B>>),
    Ready(Option<Box<Request<Bytes>>>),
    Calling(Pin<Box<F>>),
    Done,
}

/// Why a follow-up is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Length,
    Resume,
}

/// A streamed answer, spliced across its attempts.
pub(crate) struct Splice<S, F, B: Body> {
    /// The follow-ups' service, cloned from the layer's spare at the first.
    svc: SpareClone<S>,
    template: Template,
    config: LocalConfig,
    report: Arc<BodyReport>,
    /// The report the parser inside this attempt's body writes (a classifier's), if any: a
    /// content frame's time is taken from it rather than read again (see `deliver_text`).
    inner_report: Option<Arc<BodyReport>>,
    /// That time, while the events of the frame it came with are handled.
    frame_at: Option<tokio::time::Instant>,
    state: State<F, B>,
    framer: Framer,
    decoder: SseDecoder,
    /// The decoder is between events with nothing held (see [`plain_event`]).
    decoder_clean: bool,
    /// What the last events' shared leading members were read as.
    memo: Memo,
    /// Frames for the caller, in order.
    out: VecDeque<Bytes>,
    /// The error to give after `out`, ending the body.
    failed: Option<B::Error>,
    /// The text delivered so far.
    text: String,
    /// The answer holds output a follow-up cannot carry (or too much text to keep).
    unsupported: bool,
    /// 0 for the first attempt (and for a restart, which is a first attempt again).
    attempt: u32,
    continuations: u32,
    resumed: u32,
    restarts: u32,
    /// The frames in `out` are held back from the caller: nothing has reached it yet, and a
    /// cut now is restarted (see [`ContinueBuilder::restart_within`]).
    ///
    /// [`ContinueBuilder::restart_within`]: crate::ContinueBuilder::restart_within
    holding: bool,
    /// Bytes this attempt's body sent while held.
    held_bytes: usize,
    trim: Trim,
    head: OpenAiHead,
    /// Anthropic: the index of the text block the answer flows into.
    block: u64,
    /// A length finish will be continued: the rest of this attempt is not passed on.
    hold_rest: bool,
    /// Anthropic's `content_block_stop`, until the next event says whether the answer ends.
    pending_stop: Option<Bytes>,
    /// Error events, until the body says whether the stream is resumed.
    held_errors: Vec<Bytes>,
    /// This attempt sent an error event (or DeepSeek's starved finish): what follows it is
    /// held with it.
    after_error: bool,
    /// Usage of the finished attempts, and of this one so far (wire fields).
    usage_sum: Option<Value>,
    attempt_usage: Option<Value>,
    /// Content deltas of this attempt.
    attempt_deltas: u64,
    /// The stream carried a usage chunk (OpenAI's `include_usage`).
    usage_chunks: bool,
    /// The last finish word and Anthropic stop sequence.
    finish_word: Option<String>,
    stop_sequence: Value,
    model_known: bool,
    /// The cut being resumed: given back if the follow-up fails before its first content.
    error: Option<B::Error>,
    /// The caller's time to first token, which a follow-up's own must not replace.
    first_token: Option<std::time::Duration>,
}

impl<S, F, B: Body> Splice<S, F, B> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        svc: SpareClone<S>,
        template: Template,
        config: LocalConfig,
        report: Arc<BodyReport>,
        inner_report: Option<Arc<BodyReport>>,
        body: B,
    ) -> Self {
        let holding = config.restart_within > 0 && config.resume && config.max_continuations > 0;
        Splice {
            svc,
            template,
            config,
            report,
            inner_report,
            frame_at: None,
            state: State::Body(Box::pin(body)),
            framer: Framer::default(),
            decoder: SseDecoder::default(),
            decoder_clean: false,
            memo: Memo::default(),
            out: VecDeque::new(),
            failed: None,
            text: String::new(),
            unsupported: false,
            attempt: 0,
            continuations: 0,
            resumed: 0,
            restarts: 0,
            holding,
            held_bytes: 0,
            trim: Trim::None,
            head: OpenAiHead::default(),
            block: 0,
            hold_rest: false,
            pending_stop: None,
            held_errors: Vec::new(),
            after_error: false,
            usage_sum: None,
            attempt_usage: None,
            attempt_deltas: 0,
            usage_chunks: false,
            finish_word: None,
            stop_sequence: Value::Null,
            model_known: false,
            error: None,
            first_token: None,
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done) && self.out.is_empty() && self.failed.is_none()
    }

    fn wire(&self) -> Wire {
        self.template.wire
    }

    fn can_follow_up(&self, allowed: bool) -> bool {
        allowed && !self.unsupported && !self.text.is_empty() && self.below_bound()
    }

    /// Another request may be made for this call.
    fn below_bound(&self) -> bool {
        self.continuations + self.resumed + self.restarts < self.config.max_continuations
    }

    /// After this attempt's body sent `bytes` more while held: its frames are let through once
    /// its text reaches the layer's tokens (4 bytes a token), when its answer is one the layer
    /// cannot continue anyway, or past [`HOLD_MAX_BYTES`].
    fn release_if_due(&mut self, bytes: usize) {
        self.held_bytes = self.held_bytes.saturating_add(bytes);
        let tokens = self.text.len().div_ceil(4) as u64;
        self.holding = tokens < u64::from(self.config.restart_within)
            && !self.unsupported
            && self.held_bytes <= HOLD_MAX_BYTES;
    }

    /// The usage of every attempt so far, this one included.
    fn total_usage(&self) -> Value {
        let mut sum = self.usage_sum.clone().unwrap_or(Value::Null);
        if let Some(u) = &self.attempt_usage {
            usage::add(&mut sum, u);
        }
        sum
    }

    /// Reads one whole event's bytes.
    fn piece(&mut self, raw: Bytes) {
        if self.decoder_clean {
            if let Some((name, data)) = plain_event(&raw, self.decoder.max()) {
                self.event(&raw, name, data);
                return;
            }
        }
        // Whatever the piece held, the decoder is clean after a piece that ends with a blank
        // line of LFs (the first piece of an attempt always goes through it: a byte order
        // mark is dropped there).
        self.decoder_clean = raw.ends_with(b"\n\n") && raw.len() < self.decoder.max();
        let mut decoder = std::mem::take(&mut self.decoder);
        let mut any = false;
        let _ = decoder.feed(&raw, |item| {
            if let SseItem::Event(e) = item {
                any = true;
                self.event(&raw, e.name, e.data);
            }
            ControlFlow::<()>::Continue(())
        });
        self.decoder = decoder;
        if !any && !self.hold_rest {
            // A comment, a keep-alive, a lone line ending: passed on as it came, behind any
            // event held before it. A lone LF is the end of the CRLF that closed the event
            // before it (the framer splits a CRLF across two chunks that way): sent ahead of
            // a held event, it would leave that event unterminated for a parser that splits
            // on LFs and put a stray blank line before it.
            if self.after_error {
                self.held_errors.push(raw);
            } else if let Some(stop) = &mut self.pending_stop {
                let mut joined = BytesMut::with_capacity(stop.len() + raw.len());
                joined.extend_from_slice(stop);
                joined.extend_from_slice(&raw);
                *stop = joined.freeze();
            } else {
                self.out.push_back(raw);
            }
        }
    }

    fn event(&mut self, raw: &Bytes, name: &[u8], data: &[u8]) {
        let seen = match self.wire() {
            Wire::OpenAi => events::openai(data, &mut self.memo),
            Wire::Anthropic => events::anthropic(name, data, &mut self.memo),
        };
        if self.hold_rest {
            // After a length finish that will be continued: only the usage counts.
            if let Some(u) = &seen.usage {
                usage::overlay(&mut self.attempt_usage, u);
                self.usage_chunks |= seen.kind == Kind::Usage;
            }
            return;
        }
        if self.after_error {
            // After an error event: what follows it (a usage chunk, `[DONE]`) ends the broken
            // attempt, and reaches the caller only with the error, if nothing resumes it.
            if let Some(u) = &seen.usage {
                usage::overlay(&mut self.attempt_usage, u);
            }
            self.held_errors.push(raw.clone());
            return;
        }
        let first = self.attempt == 0;
        if first && self.wire() == Wire::OpenAi {
            self.head.learn(&seen);
        }
        if seen.kind != Kind::BlockStop && seen.kind != Kind::Finish {
            if let Some(stop) = self.pending_stop.take() {
                self.out.push_back(stop);
            }
        }
        match seen.kind {
            Kind::Head => self.opening(raw, &seen, first),
            Kind::Content => {
                if let Some(t) = &seen.text {
                    self.content(raw, t, first);
                }
            }
            Kind::Finish => self.finish(raw, &seen, first),
            Kind::Usage => {
                if let Some(u) = &seen.usage {
                    usage::overlay(&mut self.attempt_usage, u);
                }
                self.usage_chunks = true;
                if first {
                    self.out.push_back(raw.clone());
                } else {
                    let total = self.total_usage();
                    self.out.push_back(self.head.usage(&total));
                }
            }
            Kind::BlockStop => {
                self.pending_stop = Some(if first {
                    raw.clone()
                } else {
                    events::anthropic_block_stop(self.block)
                });
            }
            Kind::Error => self.hold_error(raw),
            Kind::Unsupported => {
                self.unsupported = true;
                self.out.push_back(raw.clone());
            }
            Kind::Done | Kind::Other => self.out.push_back(raw.clone()),
        }
    }

    fn opening(&mut self, raw: &Bytes, seen: &Seen<'_>, first: bool) {
        if let Some(u) = &seen.usage {
            usage::overlay(&mut self.attempt_usage, u);
        }
        if !self.model_known {
            if let Some(m) = &seen.model {
                self.report.set_model(m);
                self.model_known = true;
            }
        }
        if first {
            if let Some(i) = seen.index {
                self.block = i;
            }
            self.out.push_back(raw.clone());
        } else if seen.index.is_some_and(|i| i > 0) {
            // A second text block in a continuation: passed on, but not continued again.
            self.unsupported = true;
            self.out.push_back(raw.clone());
        }
    }

    fn content(&mut self, raw: &Bytes, text: &str, first: bool) {
        self.attempt_deltas += 1;
        if first {
            self.deliver_text(text);
            self.out.push_back(raw.clone());
            return;
        }
        self.healed();
        let t = self.trim.feed(text);
        self.send_text(&t);
    }

    fn hold_error(&mut self, raw: &Bytes) {
        self.held_errors.push(raw.clone());
        self.after_error = true;
    }

    /// The follow-up delivers content: the cut it resumed is healed, and the error events
    /// before it will never reach the caller.
    fn healed(&mut self) {
        self.error = None;
        self.held_errors.clear();
    }

    /// Sends continuation text in the first attempt's shape.
    fn send_text(&mut self, t: &str) {
        if t.is_empty() {
            return;
        }
        let frame = match self.wire() {
            Wire::OpenAi => self.head.content(t),
            Wire::Anthropic => events::anthropic_delta(self.block, t),
        };
        self.out.push_back(frame);
        self.deliver_text(t);
    }

    fn deliver_text(&mut self, t: &str) {
        match self.frame_at {
            Some(at) => self.report.record_content_at(at),
            None => self.report.record_content(),
        }
        if self.text.len() + t.len() > self.config.max_text_bytes {
            self.unsupported = true;
        } else {
            self.text.push_str(t);
        }
    }

    fn finish(&mut self, raw: &Bytes, seen: &Seen<'_>, first: bool) {
        if let Some(u) = &seen.usage {
            usage::overlay(&mut self.attempt_usage, u);
        }
        let mut text_in_finish = false;
        if let Some(t) = &seen.text {
            self.attempt_deltas += 1;
            if first {
                self.deliver_text(t);
                text_in_finish = true;
            } else {
                self.healed();
                let t = self.trim.feed(t);
                self.send_text(&t);
            }
        }
        if !first {
            let t = self.trim.flush();
            self.send_text(&t);
        }
        let Some(word) = seen.finish.as_deref() else {
            // A `message_delta` without a stop reason: passed on.
            if let Some(stop) = self.pending_stop.take() {
                self.out.push_back(stop);
            }
            self.out.push_back(raw.clone());
            return;
        };
        if FinishReason::failure_of(word).is_some() {
            // Not a finish: the upstream cut the answer (DeepSeek for lack of resources, a
            // router's `error`), and the body fails with it. Held like an error event.
            self.hold_error(raw);
            return;
        }
        self.finish_word = Some(word.to_owned());
        if let Some(s) = &seen.stop_sequence {
            self.stop_sequence = s.clone();
        }
        let reason = FinishReason::from_provider(word);
        if reason == FinishReason::Length && self.can_follow_up(self.config.on_length) {
            self.hold_rest = true;
            self.pending_stop = None;
            if text_in_finish {
                if let Some(t) = &seen.text {
                    let frame = self.head.content(t);
                    self.out.push_back(frame);
                }
            }
            return;
        }
        if let Some(stop) = self.pending_stop.take() {
            self.out.push_back(stop);
        }
        if first {
            self.out.push_back(raw.clone());
            return;
        }
        let total = self.total_usage();
        let frame = match self.wire() {
            Wire::OpenAi => self.head.finish(word, seen.usage.as_ref().map(|_| &total)),
            Wire::Anthropic => events::anthropic_message_delta(word, &self.stop_sequence, &total),
        };
        self.out.push_back(frame);
    }

    /// This attempt's body ended (`None`).
    fn ended(&mut self) {
        if self.hold_rest {
            self.follow_up(Why::Length);
            return;
        }
        let t = self.trim.flush();
        self.send_text(&t);
        if let Some(stop) = self.pending_stop.take() {
            self.out.push_back(stop);
        }
        self.out.extend(self.held_errors.drain(..));
        // Bytes the stream never ended an event with (or a body that is not SSE at all).
        if let Some(rest) = self.framer.rest() {
            self.out.push_back(rest);
        }
        self.done(true);
    }

    /// This attempt's body failed.
    fn failed(&mut self, err: B::Error)
    where
        B::Error: 'static,
    {
        if self.hold_rest {
            // Cut after its length finish: continued as if it had ended.
            self.follow_up(Why::Length);
            return;
        }
        let class = as_llm_error(&err).map(seawall_core::LlmError::class);
        if self.attempt > 0 && self.attempt_deltas == 0 {
            // The follow-up failed before its first content: the cut (if any) is still open.
            if self.error.is_some() && self.can_follow_up(self.config.resume) {
                self.follow_up(Why::Resume);
            } else {
                self.give_up();
            }
            return;
        }
        if class == Some(FailureClass::StreamInterrupted) && self.holding && self.below_bound() {
            self.restart(err);
            return;
        }
        if class == Some(FailureClass::StreamInterrupted) && self.can_follow_up(self.config.resume)
        {
            let t = self.trim.flush();
            self.send_text(&t);
            self.pending_stop = None;
            self.error = Some(err);
            self.follow_up(Why::Resume);
            return;
        }
        if let Some(stop) = self.pending_stop.take() {
            self.out.push_back(stop);
        }
        self.out.extend(self.held_errors.drain(..));
        if let Some(rest) = self.framer.rest() {
            self.out.push_back(rest);
        }
        self.failed = Some(err);
        self.done(false);
    }

    fn follow_up(&mut self, why: Why) {
        self.next_attempt(why == Why::Resume);
        // What this attempt sent goes to the caller now, if it was held (a length finish).
        self.holding = false;
        let Some((req, trim)) = self
            .template
            .follow_up(&self.text, &self.config.instruction)
        else {
            self.give_up();
            return;
        };
        match why {
            Why::Length => self.continuations += 1,
            Why::Resume => self.resumed += 1,
        }
        if let Some(cx) = self.template.call_context() {
            self.first_token = cx.update(|f| {
                match why {
                    Why::Length => f.continuations += 1,
                    Why::Resume => f.resumed += 1,
                }
                f.time_to_first_token
            });
        }
        tracing::debug!(
            target: "seawall::continue",
            attempt = self.attempt + 1,
            why = ?why,
            chars = self.text.len(),
            "follow-up request"
        );
        self.trim = trim;
        self.attempt += 1;
        self.state = State::Ready(Some(Box::new(req)));
    }

    /// Adds this attempt's usage to the sum (estimated from its deltas when it was `cut`
    /// before it said), and reads the next attempt's body from its start.
    fn next_attempt(&mut self, cut: bool) {
        let used = self.attempt_usage.take();
        let used = if cut {
            Some(usage::estimate(
                self.wire(),
                used,
                self.template.estimated_input,
                self.attempt_deltas,
            ))
        } else {
            used
        };
        if let Some(u) = used {
            usage::add(self.usage_sum.get_or_insert(Value::Null), &u);
        }
        self.framer = Framer::default();
        self.decoder = SseDecoder::default();
        self.decoder_clean = false;
        self.hold_rest = false;
        self.after_error = false;
        self.pending_stop = None;
        self.attempt_deltas = 0;
    }

    /// The stream was cut while nothing of it had reached the caller: what it sent is dropped
    /// and the original request is sent again, its answer read as a first attempt's.
    fn restart(&mut self, err: B::Error) {
        self.next_attempt(true);
        self.out.clear();
        self.held_errors.clear();
        self.held_bytes = 0;
        self.text.clear();
        self.unsupported = false;
        self.attempt = 0;
        self.trim = Trim::None;
        self.head = OpenAiHead::default();
        self.memo = Memo::default();
        self.block = 0;
        self.usage_chunks = false;
        self.finish_word = None;
        self.stop_sequence = Value::Null;
        // Given back if the restart fails before it sends anything.
        self.error = Some(err);
        self.restarts += 1;
        // The new attempt's own time to the first token stands.
        self.first_token = None;
        if let Some(cx) = self.template.call_context() {
            cx.update(|f| f.restarts += 1);
        }
        tracing::debug!(
            target: "seawall::continue",
            restarts = self.restarts,
            "stream cut before the caller had any of it: asked again"
        );
        self.state = State::Ready(Some(Box::new(self.template.original())));
    }

    /// A follow-up could not be made or failed before any content: the caller gets what it
    /// would have got without the layer.
    fn give_up(&mut self) {
        self.out.extend(self.held_errors.drain(..));
        if let Some(err) = self.error.take() {
            self.failed = Some(err);
            self.done(false);
            return;
        }
        // After a length finish: the finish, the usage and the finish marker.
        let word = self
            .finish_word
            .clone()
            .unwrap_or_else(|| match self.wire() {
                Wire::OpenAi => "length".to_owned(),
                Wire::Anthropic => "max_tokens".to_owned(),
            });
        let total = self.total_usage();
        match self.wire() {
            Wire::OpenAi => {
                self.out.push_back(self.head.finish(&word, None));
                if self.usage_chunks {
                    self.out.push_back(self.head.usage(&total));
                }
                self.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
            }
            Wire::Anthropic => {
                self.out.push_back(events::anthropic_block_stop(self.block));
                self.out.push_back(events::anthropic_message_delta(
                    &word,
                    &self.stop_sequence,
                    &total,
                ));
                self.out.push_back(Bytes::from_static(
                    b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
                ));
            }
        }
        self.done(true);
    }

    /// The stream is over: the report gets the whole answer's facts.
    fn done(&mut self, complete: bool) {
        self.state = State::Done;
        self.holding = false;
        let total = self.total_usage();
        if let Some(u) = usage::to_core(&total) {
            self.report.set_usage(u);
        }
        if let Some(w) = &self.finish_word {
            self.report
                .set_finish_reason(FinishReason::from_provider(w));
        }
        if complete {
            self.report.set_finished();
        }
    }
}

/// The event name and data of an event laid out the usual way, `data: ...` or
/// `event: ...\ndata: ...`, each line ending in LF and a blank line ending the event:
/// exactly what the SSE decoder would hand on for it when it holds nothing (between events,
/// after its first line), without copying the data out. `None` for any other layout (the
/// decoder reads those, and events of `max` bytes or more, which it may refuse).
fn plain_event(raw: &[u8], max: usize) -> Option<(&[u8], &[u8])> {
    if raw.len() >= max {
        return None;
    }
    let body = raw.strip_suffix(b"\n\n")?;
    let (name, data_line) = match body.strip_prefix(b"event:") {
        Some(rest) => {
            let nl = memchr::memchr(b'\n', rest)?;
            let name = &rest[..nl];
            (name.strip_prefix(b" ").unwrap_or(name), &rest[nl + 1..])
        }
        None => (&b""[..], body),
    };
    let data = data_line.strip_prefix(b"data:")?;
    let data = data.strip_prefix(b" ").unwrap_or(data);
    // One line each: no other line break, and no CR anywhere (the name's line included).
    if memchr::memchr2(b'\n', b'\r', data).is_some() || memchr::memchr(b'\r', name).is_some() {
        return None;
    }
    Some((name, data))
}

impl<S, F, B> Splice<S, F, B>
where
    S: Service<Request<Bytes>, Response = Response<B>, Future = F> + Clone,
    F: Future<Output = Result<Response<B>, S::Error>>,
    B: Body<Data = Bytes>,
    B::Error: 'static,
{
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        loop {
            if !self.holding {
                if let Some(frame) = self.out.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(frame))));
                }
            }
            if let Some(err) = self.failed.take() {
                return Poll::Ready(Some(Err(err)));
            }
            match &mut self.state {
                State::Done => return Poll::Ready(None),
                State::Body(body) => {
                    let counted = self.inner_report.as_deref().map(BodyReport::content_events);
                    match ready!(body.as_mut().poll_frame(cx)) {
                        Some(Ok(frame)) => {
                            // Trailers are not part of an SSE answer: dropped.
                            if let Ok(data) = frame.into_data() {
                                self.frame_at = counted
                                    .and_then(|n| self.inner_report.as_deref()?.content_since(n));
                                let mut framer = std::mem::take(&mut self.framer);
                                framer.push(&data, |piece| self.piece(piece));
                                self.framer = framer;
                                self.frame_at = None;
                                if self.holding {
                                    self.release_if_due(data.len());
                                }
                            }
                        }
                        Some(Err(e)) => self.failed(e),
                        None => self.ended(),
                    }
                }
                State::Ready(req) => match ready!(self.svc.get().poll_ready(cx)) {
                    Ok(()) => {
                        let Some(req) = req.take() else {
                            seawall_core::polled_after_completion();
                        };
                        self.state = State::Calling(Box::pin(self.svc.get().call(*req)));
                    }
                    Err(_) => self.give_up(),
                },
                State::Calling(fut) => match ready!(fut.as_mut().poll(cx)) {
                    Ok(resp) if resp.status().is_success() => {
                        // A stream layer inside wrote the follow-up's time to first token
                        // over the caller's.
                        if let (Some(cx), Some(t)) =
                            (self.template.call_context(), self.first_token)
                        {
                            cx.update(|f| f.time_to_first_token = Some(t));
                        }
                        self.inner_report = resp.extensions().get::<Arc<BodyReport>>().cloned();
                        self.state = State::Body(Box::pin(resp.into_body()));
                    }
                    _ => {
                        // The follow-up failed before any content (it was retried, gated and
                        // budgeted inside): nothing more to do here.
                        self.give_up();
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What a decoder between events hands on for `piece`.
    fn decoded(piece: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut d = SseDecoder::default();
        let _ = d.feed(b"data: first\n\n", |_| ControlFlow::<()>::Continue(()));
        let mut out = Vec::new();
        let _ = d.feed(piece, |item| {
            match item {
                SseItem::Event(e) => out.push((e.name.to_vec(), e.data.to_vec())),
                _ => out.push((b"?".to_vec(), Vec::new())),
            }
            ControlFlow::<()>::Continue(())
        });
        out
    }

    #[test]
    fn the_usual_layouts_are_read_without_the_decoder() {
        for piece in [
            &b"data: {\"a\":1}\n\n"[..],
            b"event: content_block_delta\ndata: {\"type\":\"x\"}\n\n",
            b"data:[DONE]\n\n",
            b"event:\ndata:\n\n",
        ] {
            let (name, data) = plain_event(piece, 1 << 20).expect("plain");
            assert_eq!(decoded(piece), vec![(name.to_vec(), data.to_vec())]);
        }
        for piece in [
            &b"data: a\r\n\r\n"[..],
            b"data: a\ndata: b\n\n",
            b": comment\n\n",
            b"id: 1\ndata: a\n\n",
            b"data: a\n",
        ] {
            assert!(plain_event(piece, 1 << 20).is_none());
        }
        assert!(plain_event(b"data: abc\n\n", 11).is_none());
    }

    fn piece() -> impl Strategy<Value = Vec<u8>> {
        let part = prop_oneof![
            Just(&b"event"[..]),
            Just(&b"data"[..]),
            Just(&b":"[..]),
            Just(&b" "[..]),
            Just(&b"\n"[..]),
            Just(&b"\r"[..]),
            Just(&b"id"[..]),
            Just(&b"{\"x\":1}"[..]),
            Just(&b"\xEF\xBB\xBF"[..]),
        ];
        proptest::collection::vec(part, 0..10).prop_map(|p| {
            let mut v = p.concat();
            v.extend_from_slice(b"\n\n");
            v
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Where the layer reads an event without the decoder, the decoder (between events)
        /// would have handed on exactly that one event.
        #[test]
        fn an_event_read_without_the_decoder_is_what_the_decoder_reads(p in piece()) {
            if let Some((name, data)) = plain_event(&p, 1 << 20) {
                prop_assert_eq!(decoded(&p), vec![(name.to_vec(), data.to_vec())]);
            }
        }
    }
}
