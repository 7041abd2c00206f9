//! [`ClassifiedBody`]: passes a successful body through untouched while filling its
//! [`BodyReport`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use seawall_core::{BodyReport, BoxError, LlmError};

use crate::parse::Parser;

pin_project_lite::pin_project! {
    /// The body of a successful response, as [`ClassifyLayer`](crate::ClassifyLayer) returns it.
    ///
    /// Every frame passes through unchanged. On the way, the body fills the response's shared
    /// [`BodyReport`] (in the response extensions as `Arc<BodyReport>`): each event of real
    /// output (`record_content`), the model, the usage, the finish reason, and the finish
    /// marker. SSE is parsed line by line across chunk boundaries, keeping only an incomplete
    /// trailing line (at most 1 MiB); a JSON body is read through a 4 KiB head window and a
    /// 16 KiB rolling tail window. Nothing else is buffered.
    ///
    /// Its errors are [`LlmError`]s:
    /// - an error event inside the stream (Anthropic `event: error`, an OpenAI chunk holding
    ///   `{"error": ...}`) yields the event's own class (`Overloaded`, `RateLimited`, ...) when
    ///   no content has been seen yet, else `StreamInterrupted`, keeping the provider's code,
    ///   type and message; the chunk that carried it is passed through first;
    /// - an SSE stream of a known format that ends (EOF or a transport error) without its
    ///   finish marker (`data: [DONE]`, `message_stop`, `response.completed`) yields
    ///   `StreamInterrupted` after content, or `Disconnected` before any;
    /// - a transport error in a JSON body is classified the same way.
    pub struct ClassifiedBody<B> {
        #[pin]
        inner: B,
        report: Arc<BodyReport>,
        parser: Parser,
        pending: Option<LlmError>,
        done: bool,
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
        }
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
        if let Some(err) = this.pending.take() {
            *this.done = true;
            return Poll::Ready(Some(Err(err)));
        }
        if *this.done {
            return Poll::Ready(None);
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
        // Only once the end was observed (a `None`, or the inner body's own end after a frame):
        // the parser must see it to check the finish marker.
        self.done && self.pending.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
