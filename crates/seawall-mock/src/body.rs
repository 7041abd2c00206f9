//! Response bodies: complete ones, and SSE streams paced on `tokio::time`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::profile::KeepAliveStyle;
use crate::rng::Rng;
use crate::upstream::Inner;
use crate::wire::{self, Answer, Wire};

/// The body of every mock response: a complete JSON (or HTML) body, or an SSE stream whose
/// events are paced by the profile's latencies on `tokio::time`.
///
/// Dropping a stream before its end stops it; the tokens it sent stay billed (see
/// [`Stats`](crate::Stats)).
pub struct MockBody {
    kind: Kind,
}

enum Kind {
    Full(Option<Bytes>),
    Stream(Box<StreamBody>),
}

impl fmt::Debug for MockBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Full(b) => f
                .debug_struct("MockBody")
                .field("len", &b.as_ref().map_or(0, Bytes::len))
                .finish(),
            Kind::Stream(s) => f
                .debug_struct("MockBody")
                .field("stream", &s.plan.answer.id)
                .field("sent_tokens", &s.sent)
                .finish(),
        }
    }
}

/// A stream body's failure: the upstream cut the stream with a reset instead of ending it
/// (the profile's `stream.cut.abort`). Over HTTP the chunked body stops without its terminator.
#[derive(Debug)]
pub struct MockError {
    sent_tokens: u32,
}

impl MockError {
    /// Content tokens sent before the reset.
    pub fn sent_tokens(&self) -> u32 {
        self.sent_tokens
    }
}

impl fmt::Display for MockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "connection reset by the mock upstream after {} tokens",
            self.sent_tokens
        )
    }
}

impl std::error::Error for MockError {}

impl MockBody {
    pub(crate) fn full(bytes: Bytes) -> Self {
        MockBody {
            kind: Kind::Full((!bytes.is_empty()).then_some(bytes)),
        }
    }

    /// Marks an undelivered body as accounted for, so dropping it counts nothing.
    pub(crate) fn disarm(&mut self) {
        if let Kind::Stream(s) = &mut self.kind {
            s.step = Step::Done;
        }
    }
}

/// How a stream ends.
#[derive(Debug, Clone, Copy)]
pub(crate) enum End {
    Complete,
    /// Cut after this many tokens; `true` ends with a body error.
    Cut(u32, bool),
    /// An error event after this many tokens.
    Error(u32),
}

pub(crate) struct StreamPlan {
    pub(crate) inner: Arc<Inner>,
    pub(crate) billed_key: Arc<AtomicU64>,
    pub(crate) answer: Answer,
    pub(crate) include_usage: bool,
    pub(crate) usage_null: bool,
    pub(crate) head_at: Instant,
    pub(crate) first_token_at: Instant,
    pub(crate) keepalive: Option<(Duration, KeepAliveStyle)>,
    pub(crate) end: End,
    pub(crate) rng: Rng,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Start,
    KeepAlive,
    Token,
    Finish,
    Cut,
    Error,
    Done,
}

pub(crate) struct StreamBody {
    plan: StreamPlan,
    prefix: Bytes,
    step: Step,
    due: Option<Instant>,
    clock: Instant,
    sleep: Option<Pin<Box<Sleep>>>,
    sent: u32,
    buf: BytesMut,
}

impl MockBody {
    pub(crate) fn stream(plan: StreamPlan) -> MockBody {
        let prefix = match plan.answer.wire {
            Wire::OpenAi => plan.answer.openai_chunk_prefix(),
            Wire::Anthropic => Bytes::new(),
        };
        let clock = plan.head_at;
        MockBody {
            kind: Kind::Stream(Box::new(StreamBody {
                plan,
                prefix,
                step: Step::Start,
                due: None,
                clock,
                sleep: None,
                sent: 0,
                buf: BytesMut::new(),
            })),
        }
    }
}

impl StreamBody {
    fn frame(&mut self) -> Poll<Option<Result<Frame<Bytes>, MockError>>> {
        Poll::Ready(Some(Ok(Frame::data(self.buf.split().freeze()))))
    }

    fn frame_static(bytes: &'static [u8]) -> Poll<Option<Result<Frame<Bytes>, MockError>>> {
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(bytes)))))
    }

    /// Bills a stream that ended without its finish marker as waste.
    fn waste(&self) {
        let c = &self.plan.inner.counters;
        c.wasted_input_tokens
            .fetch_add(u64::from(self.plan.answer.input_tokens), Relaxed);
        c.wasted_output_tokens
            .fetch_add(self.plan.answer.billed_output(self.sent), Relaxed);
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, MockError>>> {
        loop {
            if let Some(due) = self.due {
                if due > Instant::now() {
                    let sleep = self
                        .sleep
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
                    if sleep.deadline() != due {
                        sleep.as_mut().reset(due);
                    }
                    ready!(sleep.as_mut().poll(cx));
                }
                self.due = None;
                self.clock = due;
            }
            match self.step {
                Step::Start => {
                    self.step = Step::Token;
                    match self.plan.keepalive {
                        Some(_) => self.step = Step::KeepAlive,
                        None => self.due = Some(self.plan.first_token_at),
                    }
                    if self.plan.answer.wire == Wire::Anthropic {
                        let start = self.plan.answer.anthropic_message_start();
                        return Poll::Ready(Some(Ok(Frame::data(start))));
                    }
                }
                Step::KeepAlive => {
                    let (interval, style) = self.plan.keepalive.unwrap_or_default();
                    let next = seawall_core::instant_after(self.clock, interval);
                    if next < self.plan.first_token_at {
                        self.due = Some(next);
                    } else {
                        self.step = Step::Token;
                        self.due = Some(self.plan.first_token_at);
                    }
                    return Self::frame_static(match (style, self.plan.answer.wire) {
                        (KeepAliveStyle::Blank, _) => wire::BLANK_KEEPALIVE,
                        (KeepAliveStyle::Ping, Wire::Anthropic) => wire::ANTHROPIC_PING,
                        _ => wire::COMMENT_KEEPALIVE,
                    });
                }
                Step::Token => {
                    match self.plan.end {
                        End::Cut(at, _) if at == self.sent => {
                            self.step = Step::Cut;
                            continue;
                        }
                        End::Error(at) if at == self.sent => {
                            self.step = Step::Error;
                            continue;
                        }
                        _ => {}
                    }
                    if self.sent >= self.plan.answer.output_tokens {
                        self.step = Step::Finish;
                        continue;
                    }
                    let (lead, text) = self.plan.answer.token(self.sent);
                    match self.plan.answer.wire {
                        Wire::OpenAi => {
                            if self.sent == 0 {
                                wire::put_openai_choice(
                                    &mut self.buf,
                                    &self.prefix,
                                    r#"{"role":"assistant","content":"","refusal":null}"#,
                                    "null",
                                    self.plan.usage_null,
                                );
                            }
                            wire::put_openai_content(
                                &mut self.buf,
                                &self.prefix,
                                lead,
                                text,
                                self.plan.usage_null,
                            );
                        }
                        Wire::Anthropic => {
                            if self.sent == 0 {
                                self.buf.extend_from_slice(wire::ANTHROPIC_BLOCK_START);
                            }
                            wire::put_anthropic_delta(&mut self.buf, lead, text);
                        }
                    }
                    self.sent += 1;
                    let c = &self.plan.inner.counters;
                    let billed = self.plan.answer.billed_output(1);
                    c.output_tokens.fetch_add(billed, Relaxed);
                    self.plan.billed_key.fetch_add(billed, Relaxed);
                    if self.sent < self.plan.answer.output_tokens {
                        let gap = self
                            .plan
                            .rng
                            .delay(&self.plan.inner.profile.latency.per_token);
                        self.due = Some(seawall_core::instant_after(self.clock, gap));
                    }
                    return self.frame();
                }
                Step::Finish => {
                    self.step = Step::Done;
                    let reason =
                        wire::finish_reason(self.plan.answer.wire, self.plan.answer.truncated);
                    let output = self.plan.answer.billed_output(self.sent);
                    match self.plan.answer.wire {
                        Wire::OpenAi => {
                            let finish = if self.plan.answer.truncated {
                                "\"length\""
                            } else {
                                "\"stop\""
                            };
                            wire::put_openai_choice(
                                &mut self.buf,
                                &self.prefix,
                                "{}",
                                finish,
                                self.plan.usage_null,
                            );
                            if self.plan.include_usage {
                                wire::put_openai_usage(
                                    &mut self.buf,
                                    &self.prefix,
                                    self.plan.answer.input_tokens,
                                    output,
                                );
                            }
                            self.buf.extend_from_slice(wire::OPENAI_DONE);
                        }
                        Wire::Anthropic => wire::put_anthropic_end(&mut self.buf, reason, output),
                    }
                    let c = &self.plan.inner.counters;
                    c.streams_completed.fetch_add(1, Relaxed);
                    return self.frame();
                }
                Step::Cut => {
                    self.step = Step::Done;
                    self.plan.inner.counters.streams_cut.fetch_add(1, Relaxed);
                    self.waste();
                    if let End::Cut(_, true) = self.plan.end {
                        return Poll::Ready(Some(Err(MockError {
                            sent_tokens: self.sent,
                        })));
                    }
                    return Poll::Ready(None);
                }
                Step::Error => {
                    self.step = Step::Done;
                    self.plan
                        .inner
                        .counters
                        .streams_errored
                        .fetch_add(1, Relaxed);
                    self.waste();
                    return Self::frame_static(match self.plan.answer.wire {
                        Wire::OpenAi => wire::OPENAI_STREAM_ERROR,
                        Wire::Anthropic => wire::ANTHROPIC_STREAM_ERROR,
                    });
                }
                Step::Done => return Poll::Ready(None),
            }
        }
    }
}

impl Drop for StreamBody {
    fn drop(&mut self) {
        if self.step != Step::Done {
            self.plan.inner.counters.abandoned.fetch_add(1, Relaxed);
            self.waste();
        }
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = MockError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, MockError>>> {
        match &mut self.get_mut().kind {
            Kind::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Kind::Stream(s) => s.poll_next(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(b) => b.is_none(),
            Kind::Stream(s) => s.step == Step::Done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Stream(_) => SizeHint::default(),
        }
    }
}
