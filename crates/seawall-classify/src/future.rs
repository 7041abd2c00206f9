//! The response future of [`Classify`](crate::Classify): turns the transport's outcome into one
//! class, reading a small JSON answer ahead when a `200` may carry an error inside it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::SystemTime;

use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body::{Body, Frame};
use seawall_core::{BodyReport, BoxError, FrameQueue, LlmError};
use tokio::time::Instant;

use crate::body::ClassifiedBody;
use crate::classifier::{Classifier, ErrorResponse};
use crate::hints;
use crate::parse::{self, Parser, Verdict};

pin_project_lite::pin_project! {
    /// The future of [`Classify`](crate::Classify): waits for the response head; on success
    /// wraps the body in a [`ClassifiedBody`], on failure reads at most the error-body limit of
    /// the body, drops the rest, and returns the classified [`LlmError`].
    ///
    /// A successful JSON answer (not a stream) is read ahead up to the same limit before the
    /// future resolves, so that a `200` holding an error object, or an answer without any
    /// content, is an `Err` while nothing has reached the caller; the frames read are replayed
    /// by the body. A larger answer passes through without being held.
    pub struct ResponseFuture<F, B, C> {
        #[pin]
        state: State<F, B>,
        classifier: C,
        limit: usize,
        streaming: bool,
        known_api: bool,
        started: Instant,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Calling {
            #[pin]
            future: F,
        },
        Reading {
            head: Option<http::response::Parts>,
            #[pin]
            body: B,
            buf: Vec<u8>,
            truncated: bool,
        },
        ReadingAnswer {
            head: Option<http::response::Parts>,
            body: Option<B>,
            frames: FrameQueue<Bytes>,
            len: usize,
        },
        Done,
    }
}

impl<F, B, C> ResponseFuture<F, B, C> {
    pub(crate) fn new(
        future: F,
        classifier: C,
        limit: usize,
        streaming: bool,
        known_api: bool,
        started: Instant,
    ) -> Self {
        ResponseFuture {
            state: State::Calling { future },
            classifier,
            limit,
            streaming,
            known_api,
            started,
        }
    }
}

impl<F, B, C> std::fmt::Debug for ResponseFuture<F, B, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Calling { .. } => "calling",
            State::Reading { .. } => "reading error body",
            State::ReadingAnswer { .. } => "reading answer",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("error_body_limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// The response's content type, when it has a readable one (looked up once per response).
fn content_type(headers: &HeaderMap) -> Option<&str> {
    seawall_core::header(headers, &http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok())
}

/// Whether a successful body is an SSE stream: by its content type, or, without one, by the
/// request's `stream` flag.
fn is_sse(content_type: Option<&str>, streaming: bool) -> bool {
    match content_type {
        Some(ct) => seawall_core::is_media_type(ct.as_bytes(), "text/event-stream"),
        None => streaming,
    }
}

/// Whether a successful body is a JSON answer worth reading ahead: a JSON content type (or
/// none) that the body's size hint does not already put over the limit.
fn is_small_json<B: Body>(content_type: Option<&str>, body: &B, limit: usize) -> bool {
    let json = match content_type {
        Some(ct) => {
            // A byte search and an ASCII trim: the value is visible ASCII, and a few bytes
            // long (a character search's set-up costs more than the search).
            let essence = match ct.bytes().position(|b| b == b';') {
                Some(at) => &ct[..at],
                None => ct,
            };
            let essence = essence.trim_ascii();
            // `+json` compared in place: no lowercase copy of the header per call.
            essence.eq_ignore_ascii_case("application/json")
                || essence
                    .len()
                    .checked_sub(5)
                    .and_then(|at| essence.get(at..))
                    .is_some_and(|tail| tail.eq_ignore_ascii_case("+json"))
        }
        None => true,
    };
    json && body.size_hint().lower() <= limit as u64
}

/// Reads a JSON answer's frames into `frames` until its end or past `limit` bytes: whether it
/// ended whole within the limit, and the error it broke with.
fn read_ahead<B>(
    body: &mut B,
    cx: &mut Context<'_>,
    frames: &mut FrameQueue<Bytes>,
    len: &mut usize,
    limit: usize,
) -> Poll<(bool, Option<BoxError>)>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    loop {
        if *len > limit {
            return Poll::Ready((false, None));
        }
        match ready!(Pin::new(&mut *body).poll_frame(cx)) {
            Some(Ok(frame)) => {
                *len += frame.data_ref().map_or(0, Bytes::len);
                frames.push_back(frame);
            }
            Some(Err(e)) => return Poll::Ready((false, Some(e.into()))),
            None => return Poll::Ready((true, None)),
        }
    }
}

/// Joins the data of frames read ahead (one frame, the usual case, is not copied).
fn joined(frames: &FrameQueue<Bytes>) -> Bytes {
    let mut data = frames.data();
    match (data.next(), data.next()) {
        (None, _) => Bytes::new(),
        (Some(one), None) => one.clone(),
        _ => {
            let mut all = Vec::new();
            for d in frames.data() {
                all.extend_from_slice(d);
            }
            all.into()
        }
    }
}

impl<F, B, E, C> Future for ResponseFuture<F, B, C>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
    C: Classifier,
{
    type Output = Result<Response<ClassifiedBody<B>>, LlmError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Calling { future } => {
                    let response = match ready!(future.poll(cx)) {
                        Ok(r) => r,
                        Err(e) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(this
                                .classifier
                                .classify_transport_error(e.into())));
                        }
                    };
                    let (mut parts, body) = response.into_parts();
                    if this.classifier.is_failure(parts.status, &parts.headers) {
                        this.state.set(State::Reading {
                            head: Some(parts),
                            body,
                            buf: Vec::new(),
                            truncated: false,
                        });
                        continue;
                    }
                    // The layers above add their own values: one table for them all.
                    seawall_core::reserve_extensions(&mut parts.extensions);
                    if let Some(snap) = hints::rate_limits_lazily(&parts.headers, SystemTime::now) {
                        parts.extensions.insert(snap);
                    }
                    let ct = content_type(&parts.headers);
                    let coded = seawall_core::content_coding(&parts.headers).is_some();
                    let sse = !coded && is_sse(ct, *this.streaming);
                    let started = *this.started;
                    if !sse && !coded && is_small_json(ct, &body, *this.limit) {
                        // Usually the whole answer is in hand: read here, the head not moved
                        // into the state and out again.
                        let (mut body, mut frames, mut len) = (body, FrameQueue::new(), 0);
                        if let Poll::Ready((whole, failed)) =
                            read_ahead(&mut body, cx, &mut frames, &mut len, *this.limit)
                        {
                            this.state.set(State::Done);
                            return Poll::Ready(answer(
                                parts, body, started, frames, whole, failed,
                            ));
                        }
                        this.state.set(State::ReadingAnswer {
                            head: Some(parts),
                            body: Some(body),
                            frames,
                            len,
                        });
                        continue;
                    }
                    let report = Arc::new(BodyReport::starting_at(started));
                    parts.extensions.insert(report.clone());
                    let parser = if coded {
                        Parser::Opaque
                    } else if sse {
                        Parser::sse(hints::request_id(&parts.headers), *this.known_api)
                    } else {
                        Parser::json()
                    };
                    this.state.set(State::Done);
                    let body = ClassifiedBody::new(body, report, parser);
                    return Poll::Ready(Ok(Response::from_parts(parts, body)));
                }
                StateProj::Reading {
                    head,
                    mut body,
                    buf,
                    truncated,
                } => {
                    let limit = *this.limit;
                    while buf.len() < limit {
                        match ready!(body.as_mut().poll_frame(cx)) {
                            Some(Ok(frame)) => {
                                if let Ok(data) = frame.into_data() {
                                    let take = (limit - buf.len()).min(data.len());
                                    buf.extend_from_slice(&data[..take]);
                                    *truncated |= take < data.len();
                                }
                            }
                            // A body that fails half-way is classified from what arrived.
                            Some(Err(_)) | None => break,
                        }
                    }
                    if buf.len() >= limit && !body.is_end_stream() {
                        *truncated = true;
                    }
                    let Some(head) = head.take() else {
                        continue;
                    };
                    let response = ErrorResponse::new(head.status, &head.headers, buf)
                        .with_truncated(*truncated);
                    let err = this.classifier.classify_response(&response);
                    // Dropping the state drops the unread rest of the body.
                    this.state.set(State::Done);
                    return Poll::Ready(Err(err));
                }
                StateProj::ReadingAnswer {
                    head,
                    body,
                    frames,
                    len,
                } => {
                    let Some(inner) = body.as_mut() else {
                        seawall_core::polled_after_completion();
                    };
                    let (whole, failed) = ready!(read_ahead(inner, cx, frames, len, *this.limit));
                    let (Some(parts), Some(inner)) = (head.take(), body.take()) else {
                        seawall_core::polled_after_completion();
                    };
                    let frames = std::mem::take(frames);
                    this.state.set(State::Done);
                    let started = *this.started;
                    return Poll::Ready(answer(parts, inner, started, frames, whole, failed));
                }
                StateProj::Done => seawall_core::polled_after_completion(),
            }
        }
    }
}

/// The outcome of a JSON answer read ahead: `whole` when the body ended within the limit,
/// `failed` when it broke while being read. The report is made here, once the answer is in
/// hand, and written before anything shares it.
fn answer<B>(
    mut parts: http::response::Parts,
    inner: B,
    started: Instant,
    mut frames: FrameQueue<Bytes>,
    whole: bool,
    failed: Option<BoxError>,
) -> Result<Response<ClassifiedBody<B>>, LlmError> {
    let mut report = BodyReport::starting_at(started);
    // A whole answer is read into the report before the report is shared.
    let read = whole.then(|| {
        let data = joined(&frames);
        let verdict = parse::read_whole(&data, &mut report);
        (data, verdict)
    });
    let report = Arc::new(report);
    parts.extensions.insert(report.clone());
    if let Some((data, verdict)) = read {
        let err = match verdict {
            Some(Verdict::Answer) => {
                // Read and reported: replay it as one frame, with any trailers after it.
                frames.retain_non_data();
                if !data.is_empty() {
                    frames.push_front(Frame::data(data));
                }
                let body = ClassifiedBody::read_ahead(inner, report, Parser::read(), frames, true);
                return Ok(Response::from_parts(parts, body));
            }
            Some(Verdict::Error(e)) => parse::embedded_error(&e, "error object in a 200 answer"),
            Some(Verdict::Cut(e)) => *e,
            Some(Verdict::Empty) => parse::empty_answer(&report),
            None => {
                // Not JSON, or JSON cut short: the scanner reports it as it always has.
                let mut parser = Parser::json();
                parser.feed(&data, &report);
                let body = ClassifiedBody::read_ahead(inner, report, parser, frames, true);
                return Ok(Response::from_parts(parts, body));
            }
        };
        let response = ErrorResponse::new(parts.status, &parts.headers, &data);
        return Err(response.decorate(err));
    }
    let mut parser = Parser::json();
    for data in frames.data() {
        parser.feed(data, &report);
    }
    let mut body = ClassifiedBody::read_ahead(inner, report, parser, frames, false);
    if let Some(e) = failed {
        body.fail(e);
    }
    Ok(Response::from_parts(parts, body))
}
