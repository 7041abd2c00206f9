//! The response future: waits for the head, then for the first real content (the commit point).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http::response::Parts;
use http_body::Body;
use pin_project_lite::pin_project;
use seawall_core::{
    BodyReport, BoxError, CallContext, FailureClass, FrameQueue, LlmError, StreamTiming,
};
use tokio::time::Instant;

use crate::body::{Committed, TimedBody, Timer, llm_error};
use crate::config::{Deadline, Reason, StreamTimeouts, deadline, earliest};
use crate::sse::SseScan;
use crate::stats::{OwnReport, StreamStats};

/// What the service learned from the request.
pub(crate) struct Call {
    pub(crate) start: Instant,
    pub(crate) config: StreamTimeouts,
    pub(crate) streaming: bool,
    pub(crate) cx: Option<Arc<CallContext>>,
    /// The caller's deadline: it cuts every timeout before the commit point.
    pub(crate) caller: Option<Instant>,
}

impl Call {
    fn at(&self, d: Option<std::time::Duration>, reason: Reason) -> Deadline {
        deadline(self.start, d, reason)
    }

    fn caller(&self) -> Deadline {
        self.caller.map(|at| (at, Reason::Deadline))
    }

    fn head_deadline(&self) -> Deadline {
        let ttft = if self.streaming {
            self.at(self.config.first_token(), Reason::FirstToken)
        } else {
            None
        };
        // The caller's deadline first: on a tie it names the failure, and nothing retries it.
        earliest([
            self.caller(),
            self.at(self.config.attempt(), Reason::Attempt),
            ttft,
            self.at(self.config.total(), Reason::Total),
        ])
    }

    /// The error of a timer that fired: `Timeout` for this layer's own bounds, which a retry
    /// may try again, `DeadlineExceeded` for the caller's, which nothing retries.
    fn timeout(&self, reason: Reason) -> LlmError {
        let class = match reason {
            Reason::Deadline => FailureClass::DeadlineExceeded,
            _ => FailureClass::Timeout,
        };
        LlmError::new(class, reason.describe(&self.config))
    }
}

pin_project! {
    /// The future of [`StreamTimeout`](crate::StreamTimeout): resolves at the commit point.
    ///
    /// It resolves with the response once the first real content has arrived (or the body has
    /// ended, or, for a body that is not a server-sent-events stream, at its first bytes).
    /// Before that, a timeout or a body error resolves it with `Err`, which outer layers may
    /// retry or fall back on. Dropping it drops the upstream future or body.
    pub struct ResponseFuture<F, B> {
        #[pin]
        state: State<F, B>,
        timer: Timer,
        call: Call,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Head { #[pin] fut: F },
        Body { waiting: Option<Waiting<B>> },
        // The caller's deadline had passed before the call: the inner service was not called.
        Expired,
        Done,
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(crate) fn new(fut: F, call: Call) -> Self {
        ResponseFuture {
            state: State::Head { fut },
            timer: Timer::default(),
            call,
        }
    }

    /// A call that arrived past the caller's deadline: it fails without calling the inner
    /// service.
    pub(crate) fn expired(call: Call) -> Self {
        ResponseFuture {
            state: State::Expired,
            timer: Timer::default(),
            call,
        }
    }
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Head { .. } => "waiting for the head",
            State::Body { .. } => "waiting for the first content",
            State::Expired | State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

/// How the wait for content ended.
enum Step {
    Content,
    Overflow,
    Ended,
}

/// A response whose head has arrived, waiting for its first content.
struct Waiting<B> {
    parts: Parts,
    body: B,
    held: FrameQueue<Bytes>,
    held_bytes: usize,
    sse: bool,
    // Boxed: only a stream with no classifier inside scans for itself. Inline, its 160 bytes
    // would ride in every response's body, moved again by every layer the response passes.
    scan: Option<Box<SseScan>>,
    report: Option<Arc<BodyReport>>,
    last_frame: Instant,
    /// `last_frame` was read in this poll (when the head arrived): a frame found ready in
    /// the same poll arrived then too, and the clock (about 20 ns a read) is not read again.
    fresh: bool,
}

fn is_event_stream(parts: &Parts) -> Option<bool> {
    let ct = seawall_core::header(&parts.headers, &http::header::CONTENT_TYPE)?
        .to_str()
        .ok()?;
    Some(seawall_core::is_media_type(
        ct.as_bytes(),
        "text/event-stream",
    ))
}

impl<B> Waiting<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    fn new(resp: Response<B>, call: &Call) -> Self {
        let (parts, body) = resp.into_parts();
        let sse = is_event_stream(&parts).unwrap_or(call.streaming);
        let report = parts.extensions.get::<Arc<BodyReport>>().cloned();
        // A body in a content coding cannot be scanned: its first bytes commit it, and its end
        // is not checked for a finish marker (see `seawall_core::content_coding`).
        let scan =
            (sse && report.is_none() && seawall_core::content_coding(&parts.headers).is_none())
                .then(Box::<SseScan>::default);
        Waiting {
            parts,
            body,
            held: FrameQueue::new(),
            held_bytes: 0,
            sse,
            scan,
            report,
            last_frame: Instant::now(),
            fresh: true,
        }
    }

    fn deadline(&self, call: &Call) -> Deadline {
        let total = call.at(call.config.total(), Reason::Total);
        if self.sse || call.streaming {
            earliest([
                call.caller(),
                call.at(call.config.first_token(), Reason::FirstToken),
                total,
            ])
        } else {
            let idle = deadline(self.last_frame, call.config.idle(), Reason::Idle);
            earliest([call.caller(), idle, total])
        }
    }

    fn poll_content(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<Result<Step, LlmError>> {
        loop {
            let frame = match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => {
                    self.fresh = false;
                    return Poll::Pending;
                }
                Poll::Ready(None) => return Poll::Ready(self.ended()),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(llm_error(e))),
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            if !std::mem::take(&mut self.fresh) {
                self.last_frame = Instant::now();
            }
            let content = match frame.data_ref() {
                None => false,
                Some(data) if !self.sse => data.iter().any(|b| !b.is_ascii_whitespace()),
                Some(data) => match (&mut self.scan, &self.report) {
                    (Some(scan), _) => {
                        let seen = scan.feed(data, false);
                        if let Some(err) = seen.error {
                            return Poll::Ready(Err(err));
                        }
                        seen.content
                    }
                    (None, Some(report)) => report.has_content(),
                    (None, None) => true,
                },
            };
            self.held_bytes += frame.data_ref().map_or(0, Bytes::len);
            self.held.push_back(frame);
            if content {
                return Poll::Ready(Ok(Step::Content));
            }
            if self.held_bytes > max {
                return Poll::Ready(Ok(Step::Overflow));
            }
        }
    }

    fn ended(&self) -> Result<Step, LlmError> {
        match &self.scan {
            Some(scan) if !scan.is_finished() => Err(LlmError::new(
                FailureClass::Disconnected,
                "the stream ended before any content, without its finish marker",
            )),
            // Stopped by the content filter before any content: the same prompt would be
            // stopped again.
            Some(scan) if scan.was_filtered() => Err(LlmError::new(
                FailureClass::ContentFiltered,
                "the provider's content filter stopped the stream before any content",
            )),
            // Finished with nothing in it (a known glitch, worth a retry): nothing has reached
            // the caller, so it is still an `Err`.
            Some(scan) if !scan.hit_length_limit() => Err(LlmError::new(
                FailureClass::EmptyResponse,
                "the stream finished without any content",
            )),
            _ => Ok(Step::Ended),
        }
    }

    fn commit(self, step: Step, timer: Timer, call: &mut Call) -> Response<TimedBody<B>> {
        // The content arrived with the last frame read (in this poll): its time is known, so
        // the clock is not read again here, nor for the body's idle timer below.
        let ttft = matches!(step, Step::Content)
            .then(|| self.last_frame.saturating_duration_since(call.start));
        if let (Some(t), Some(cx)) = (ttft, &call.cx) {
            cx.update(|f| f.time_to_first_token = Some(t));
        }
        let mut parts = self.parts;
        // Into the classifier's report when there is one (nothing to allocate), else into a
        // report of this layer's own, with its start at the call's.
        let sse = self.sse;
        let timing = || StreamTiming::new(ttft, sse);
        // The classifier's report, timed here, is handed to the stats, not copied (a copy of
        // the pointer is an atomic write, its drop another): the body reads it through them.
        let (stats, apart) = match self.report.map(|r| StreamStats::record(r, timing())) {
            Some(Ok(stats)) => (stats, None),
            other => {
                let own = Arc::new(BodyReport::starting_at(call.start));
                // A report of its own has no timing yet: this one is kept.
                own.set_stream_timing(timing());
                let stats = StreamStats::over(Arc::clone(&own));
                seawall_core::reserve_extensions(&mut parts.extensions);
                parts.extensions.insert(OwnReport(own));
                (stats, other.and_then(Result::err))
            }
        };
        let inner = match step {
            Step::Ended => None,
            Step::Content | Step::Overflow => Some(self.body),
        };
        let body = TimedBody::new(Committed {
            inner,
            replay: self.held,
            timer,
            config: call.config,
            start: call.start,
            last_frame: self.last_frame,
            scan: self.scan,
            apart,
            stats,
            cx: call.cx.take(),
        });
        Response::from_parts(parts, body)
    }
}

impl<B> Waiting<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// Reads the body on to its first content: the committed response, a failure, or the
    /// state stored to wait for more (and the timer armed).
    fn advance<F>(
        mut self,
        mut state: Pin<&mut State<F, B>>,
        timer: &mut Timer,
        call: &mut Call,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<TimedBody<B>>, LlmError>> {
        match self.poll_content(cx, call.config.max_buffer()) {
            Poll::Ready(Ok(step)) => {
                state.set(State::Done);
                let timer = std::mem::take(timer);
                return Poll::Ready(Ok(self.commit(step, timer, call)));
            }
            Poll::Ready(Err(e)) => {
                state.set(State::Done);
                return Poll::Ready(Err(e));
            }
            Poll::Pending => {}
        }
        let due = self.deadline(call);
        state.set(State::Body {
            waiting: Some(self),
        });
        match timer.poll_at(due, cx) {
            Poll::Ready(reason) => {
                state.set(State::Done);
                Poll::Ready(Err(call.timeout(reason)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<LlmError>,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Output = Result<Response<TimedBody<B>>, LlmError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        match this.state.as_mut().project() {
            StateProj::Head { fut } => match fut.poll(cx) {
                // The body's first frame is usually there already (a whole answer, a stream's
                // first event): it is read before the waiting state is stored, which is then
                // moved in only when it has to wait.
                Poll::Ready(Ok(resp)) => {
                    let waiting = Waiting::new(resp, this.call);
                    waiting.advance(this.state, this.timer, this.call, cx)
                }
                Poll::Ready(Err(e)) => {
                    this.state.set(State::Done);
                    Poll::Ready(Err(e.into()))
                }
                Poll::Pending => match this.timer.poll_at(this.call.head_deadline(), cx) {
                    Poll::Ready(reason) => {
                        this.state.set(State::Done);
                        Poll::Ready(Err(this.call.timeout(reason)))
                    }
                    Poll::Pending => Poll::Pending,
                },
            },
            StateProj::Body { waiting } => {
                let Some(w) = waiting.take() else {
                    seawall_core::polled_after_completion();
                };
                w.advance(this.state, this.timer, this.call, cx)
            }
            StateProj::Expired => {
                this.state.set(State::Done);
                Poll::Ready(Err(this.call.timeout(Reason::Deadline)))
            }
            StateProj::Done => seawall_core::polled_after_completion(),
        }
    }
}
