//! The body handed to the caller after the commit point.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use seawall_core::{
    BodyReport, BoxError, CallContext, FailureClass, FrameQueue, LlmError, StreamEnd,
};
use tokio::time::{Instant, Sleep};

use crate::config::{Deadline, Reason, StreamTimeouts, deadline, earliest};
use crate::sse::SseScan;
use crate::stats::StreamStats;

/// One sleep, re-armed lazily: a deadline that moves later (the idle deadline after each frame)
/// is only re-set when the old one fires, so a busy stream does not touch the timer per frame.
#[derive(Default)]
pub(crate) struct Timer {
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Timer {
    /// Ready with the reason once `deadline` has passed; registers the waker otherwise.
    pub(crate) fn poll_at(&mut self, deadline: Deadline, cx: &mut Context<'_>) -> Poll<Reason> {
        let Some((at, reason)) = deadline else {
            return Poll::Pending;
        };
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if sleep.deadline() > at {
            sleep.as_mut().reset(at);
        }
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if sleep.deadline() >= at {
                return Poll::Ready(reason);
            }
            // It fired for an older, earlier deadline: wait for the current one.
            sleep.as_mut().reset(at);
        }
    }
}

/// Turns any body error into an [`LlmError`], keeping an `LlmError` as it is.
pub(crate) fn llm_error(e: impl Into<BoxError>) -> LlmError {
    LlmError::from_boxed(e.into())
}

/// After the commit point every failure is a broken stream: never retried.
fn interrupted(e: LlmError) -> LlmError {
    if e.class() == FailureClass::StreamInterrupted {
        e
    } else {
        e.with_class(FailureClass::StreamInterrupted)
    }
}

/// The response body after the commit point: replays the frames held before it, then passes
/// the upstream's frames through under the idle timeout and the total deadline, and turns a
/// stream that ends without its finish marker into a `StreamInterrupted` error.
///
/// Its error is always an [`LlmError`] of class `StreamInterrupted`. Dropping it drops the
/// upstream body (and with it the connection or the permit it holds); a timeout drops the
/// upstream body at once too, so the work stops.
pub struct TimedBody<B> {
    inner: Option<B>,
    replay: FrameQueue<Bytes>,
    pending_error: Option<LlmError>,
    timer: Timer,
    /// The two timeouts a body can still meet (the others end at the commit point): kept
    /// alone, not the whole configuration, since the body rides through every layer above.
    idle: Option<Duration>,
    total_after: Option<Duration>,
    total: Deadline,
    last_frame: Instant,
    // Boxed, as in the future: a stack with a classifier inside never has one.
    scan: Option<Box<SseScan>>,
    /// The classifier's report, only when another stream layer timed it first (the stats are
    /// then over a report of this layer's own). When this layer timed it, the stats hold it,
    /// and it is read through them: a second pointer to it would cost an atomic write to copy
    /// and one to drop.
    apart: Option<Arc<BodyReport>>,
    stats: StreamStats,
    cx: Option<Arc<CallContext>>,
}

/// Everything the future hands to the body at the commit point.
pub(crate) struct Committed<B> {
    pub(crate) inner: Option<B>,
    pub(crate) replay: FrameQueue<Bytes>,
    pub(crate) timer: Timer,
    pub(crate) config: StreamTimeouts,
    pub(crate) start: Instant,
    /// When the last frame before the commit point arrived: the idle timer runs from it.
    pub(crate) last_frame: Instant,
    pub(crate) scan: Option<Box<SseScan>>,
    pub(crate) apart: Option<Arc<BodyReport>>,
    pub(crate) stats: StreamStats,
    pub(crate) cx: Option<Arc<CallContext>>,
}

impl<B> TimedBody<B> {
    pub(crate) fn new(c: Committed<B>) -> Self {
        let mut body = TimedBody {
            inner: c.inner,
            replay: c.replay,
            pending_error: None,
            timer: c.timer,
            total: deadline(c.start, c.config.total(), Reason::Total),
            idle: c.config.idle(),
            total_after: c.config.total(),
            last_frame: c.last_frame,
            scan: c.scan,
            apart: c.apart,
            stats: c.stats,
            cx: c.cx,
        };
        body.pass_finish_reason();
        if body.inner.is_none() {
            // The upstream body ended before the commit point, completely.
            body.finish(StreamEnd::Complete);
        }
        body
    }

    /// The stats attached to the response.
    pub fn stats(&self) -> &StreamStats {
        &self.stats
    }

    fn pass_finish_reason(&mut self) {
        if let Some(r) = self
            .scan
            .as_deref_mut()
            .and_then(SseScan::take_finish_reason)
        {
            self.stats.report().set_finish_reason(r);
        }
    }

    fn finish(&mut self, end: StreamEnd) {
        let Some(timing) = self.stats.report().stream_timing() else {
            return;
        };
        if !timing.set_end(end) {
            return;
        }
        // The pace from the classifier's report, else from this layer's scan of the events
        // (made only without a classifier). Without either, the stats' report is this
        // layer's own, which knows no pace: `None`, as the missing scan would give.
        let tpot = match (&self.apart, self.scan.as_deref()) {
            (Some(classifier), _) => classifier.time_per_output_token(),
            (None, Some(scan)) => scan.time_per_event(),
            (None, None) => self.stats.report().time_per_output_token(),
        };
        if let Some(t) = tpot {
            timing.set_time_per_output_token(t);
            if let Some(cx) = &self.cx {
                cx.update(|f| f.time_per_output_token = Some(t));
            }
        }
    }

    fn fail(
        &mut self,
        end: StreamEnd,
        err: LlmError,
    ) -> Poll<Option<Result<Frame<Bytes>, LlmError>>> {
        self.inner = None;
        self.finish(end);
        Poll::Ready(Some(Err(interrupted(err))))
    }

    fn idle_deadline(&self) -> Deadline {
        deadline(self.last_frame, self.idle, Reason::Idle)
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = LlmError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, LlmError>>> {
        let this = self.get_mut();
        if let Some(frame) = this.replay.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(err) = this.pending_error.take() {
            return this.fail(StreamEnd::Interrupted, err);
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        // The report the parser inside writes content into (the classifier's, when there is
        // one): its count before the poll tells whether the frame that comes was content.
        let report = this.apart.as_deref().unwrap_or(this.stats.report());
        let counted = this.idle.map(|_| report.content_events());
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                // A content frame's time as the parser inside recorded it while this layer
                // polled, else a read of the clock (a keep-alive, a role or finish event, no
                // parser inside).
                if let Some(counted) = counted {
                    this.last_frame = report.content_since(counted).unwrap_or_else(Instant::now);
                }
                if let (Some(scan), Some(data)) = (this.scan.as_mut(), frame.data_ref()) {
                    if let Some(err) = scan.feed(data, true).error {
                        // Hand over what came with the error, then fail.
                        this.pending_error = Some(err);
                        this.inner = None;
                    }
                    this.pass_finish_reason();
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(Some(Err(e))) => return this.fail(StreamEnd::Interrupted, llm_error(e)),
            Poll::Ready(None) => {
                this.inner = None;
                if this.scan.as_ref().is_some_and(|s| !s.is_finished()) {
                    let err = LlmError::new(
                        FailureClass::StreamInterrupted,
                        "the stream ended without its finish marker",
                    );
                    return this.fail(StreamEnd::Interrupted, err);
                }
                this.finish(StreamEnd::Complete);
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        let due = earliest([this.total, this.idle_deadline()]);
        match this.timer.poll_at(due, cx) {
            Poll::Ready(reason) => {
                let err = LlmError::new(
                    FailureClass::StreamInterrupted,
                    reason.describe(&StreamTimeouts::body(this.idle, this.total_after)),
                );
                this.fail(StreamEnd::TimedOut, err)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.replay.is_empty()
            && self.pending_error.is_none()
            && match &self.inner {
                None => true,
                Some(b) => self.scan.is_none() && b.is_end_stream(),
            }
    }

    fn size_hint(&self) -> SizeHint {
        let held: u64 = self.replay.data().map(|d| d.remaining() as u64).sum();
        let inner = match &self.inner {
            Some(b) => b.size_hint(),
            None => SizeHint::with_exact(0),
        };
        seawall_core::size_hint_plus(inner, held)
    }
}

impl<B> fmt::Debug for TimedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimedBody")
            .field("replay", &self.replay.len())
            .field("upstream_open", &self.inner.is_some())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}
