//! [`ClassifiedBody`]: passes a successful body through untouched while filling its
//! [`BodyReport`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use seawall_core::{BodyReport, BoxError, FrameQueue, LlmError};

use crate::parse::Parser;

pin_project_lite::pin_project! {
    /// The body of a successful response, as [`ClassifyLayer`](crate::ClassifyLayer) returns it.
    ///
    /// Every frame passes through unchanged. On the way, the body fills the response's shared
    /// [`BodyReport`] (in the response extensions as `Arc<BodyReport>`): each event of real
    /// output (`record_content`), the model, the usage, the finish reason, and the finish
    /// marker. SSE is parsed event by event as the spec reads it (LF, CR and CRLF line
    /// endings, `data:` lines joined with `\n`, a leading byte order mark skipped), keeping
    /// only an incomplete trailing line (at most 1 MiB). A JSON answer within the error-body
    /// limit was read whole and parsed once before the response was handed on, and its frames
    /// are replayed; a larger one is read through a 4 KiB head window and a 16 KiB rolling tail
    /// window. Nothing else is buffered.
    ///
    /// Its errors are [`LlmError`]s:
    /// - an error event inside the stream (Anthropic `event: error`, an OpenAI chunk holding
    ///   `{"error": ...}`) yields the event's own class (`Overloaded`, `RateLimited`, ...) when
    ///   no content has been seen yet, else `StreamInterrupted`, keeping the provider's code,
    ///   type and message; the chunk that carried it is passed through first;
    /// - an SSE stream of a known format that ends (EOF or a transport error) without its
    ///   finish marker (`data: [DONE]`, `message_stop`, `response.completed`) yields
    ///   `StreamInterrupted` after content, or `Disconnected` before any; an OpenAI stream
    ///   whose every choice gave its finish reason has its answer, `[DONE]` or not;
    /// - such a stream that reaches its finish marker without any content (and not at the
    ///   token limit) yields `EmptyResponse` when it ends;
    /// - a transport error in a JSON body is classified the same way.
    pub struct ClassifiedBody<B> {
        #[pin]
        inner: B,
        report: Arc<BodyReport>,
        parser: Parser,
        pending: Option<LlmError>,
        done: bool,
        // Frames read (and parsed) before the response was handed on, passed on first.
        replay: FrameQueue<Bytes>,
        // The inner body ended while it was read ahead: it is not polled again.
        inner_ended: bool,
    }
}

impl<B> ClassifiedBody<B> {
    pub(crate) fn new(inner: B, report: Arc<BodyReport>, parser: Parser) -> Self {
        ClassifiedBody {
            inner,
            report,
            parser,
            pending: None,
            done: false,
            replay: FrameQueue::new(),
            inner_ended: false,
        }
    }

    /// A body whose first frames were read ahead (and fed to `parser`): they are passed on
    /// first, then the rest of `inner` unless it had already ended.
    pub(crate) fn read_ahead(
        inner: B,
        report: Arc<BodyReport>,
        parser: Parser,
        replay: FrameQueue<Bytes>,
        inner_ended: bool,
    ) -> Self {
        ClassifiedBody {
            replay,
            inner_ended,
            ..ClassifiedBody::new(inner, report, parser)
        }
    }

    /// Ends the body, after its replayed frames, with the error of a transport failure.
    pub(crate) fn fail(&mut self, error: BoxError) {
        self.pending = Some(self.parser.failed(error, &self.report));
    }

    /// The report this body fills (also in the response extensions).
    pub fn report(&self) -> &Arc<BodyReport> {
        &self.report
    }

    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<B> std::fmt::Debug for ClassifiedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClassifiedBody")
            .field("report", &self.report)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<B> Body for ClassifiedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = LlmError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, LlmError>>> {
        let mut this = self.project();
        if let Some(frame) = this.replay.pop_front() {
            // The last replayed frame of a body that already ended: check the end now, so
            // `is_end_stream` is true for a consumer that stops polling after this frame.
            if this.replay.is_empty() && *this.inner_ended && this.pending.is_none() {
                *this.done = true;
                *this.pending = this.parser.eof(this.report);
            }
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(err) = this.pending.take() {
            *this.done = true;
            return Poll::Ready(Some(Err(err)));
        }
        if *this.done {
            return Poll::Ready(None);
        }
        if *this.inner_ended {
            *this.done = true;
            return Poll::Ready(this.parser.eof(this.report).map(Err));
        }
        match ready!(this.inner.as_mut().poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    *this.pending = this.parser.feed(data, this.report);
                }
                // The inner body says it has ended: check the end now, since a consumer
                // such as hyper stops polling once `is_end_stream` is true.
                if this.pending.is_none() && this.inner.is_end_stream() {
                    *this.done = true;
                    *this.pending = this.parser.eof(this.report);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(err)) => {
                *this.done = true;
                Poll::Ready(Some(Err(this.parser.failed(err.into(), this.report))))
            }
            None => {
                *this.done = true;
                Poll::Ready(this.parser.eof(this.report).map(Err))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Only once the end was observed (a `None`, or the inner body's own end after a frame)
        // and every read-ahead frame was passed on: the parser must see the end to check the
        // finish marker.
        self.done && self.pending.is_none() && self.replay.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        let held: u64 = self.replay.data().map(|d| d.len() as u64).sum();
        if self.inner_ended {
            return SizeHint::with_exact(held);
        }
        seawall_core::size_hint_plus(self.inner.size_hint(), held)
    }
}
