//! What happens after `call`: wait for the answer's head, read its body whole, judge it, and
//! either hand it back or send a repair turn through the inner service and start again.
//!
//! The states, for a request whose answer is validated:
//!
//! ```text
//! Call ──head──▶ Read ──valid, not an answer, tool calls──▶ done: the bytes re-emitted
//!  ▲               │ └──too large──▶ done: what was read, then the rest, unvalidated
//!  │               └──invalid──▶ Ready ──inner ready──▶ Call (the repair turn)
//!  └───────────────────────────────┘
//! ```
//!
//! An error from the inner service (a turn that failed for good inside retry, a refusal of
//! the budget or the gate) ends the call with that error, as it would without this layer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, Response};
use http_body::Body;
use seawall_core::{BoxError, FailureClass, LlmError, LlmRequest};
use tower_service::Service;

use crate::answer::{Answer, Wire};
use crate::body::RepairBody;
use crate::error::{ContentInvalid, cut};
use crate::layer::Shared;
use crate::turn::repair_request;

pin_project_lite::pin_project! {
    /// The response future of [`Repair`](crate::Repair).
    pub struct ResponseFuture<S, F, B> {
        #[pin]
        state: State<F>,
        // `None` for a request passed through; boxed, so a passed-through call carries one
        // pointer of it.
        turn: Option<Box<Turn<S, B>>>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F> {
        // Waiting for a turn's response head (or the passed-through call's).
        Call { #[pin] fut: F },
        // Reading the answer's body.
        Read,
        // Waiting for the inner service to take the repair turn.
        Ready,
        Done,
    }
}

/// Everything a validated call carries between its turns.
struct Turn<S, B> {
    service: S,
    shared: Arc<Shared>,
    wire: Wire,
    /// The request as the caller sent it: every repair turn is built from it.
    original: Request<Bytes>,
    /// The repair turn waiting for the inner service to be ready.
    next: Option<Request<Bytes>>,
    /// The head of the answer being read.
    head: Option<http::response::Parts>,
    body: Option<Pin<Box<B>>>,
    read: Collected,
    trailers: Option<HeaderMap>,
    errors: ContentInvalid,
    repairs: u32,
}

impl<S, F, B> ResponseFuture<S, F, B> {
    pub(crate) fn pass(fut: F) -> Self {
        ResponseFuture {
            state: State::Call { fut },
            turn: None,
        }
    }

    pub(crate) fn validate(
        fut: F,
        service: S,
        original: Request<Bytes>,
        wire: Wire,
        shared: Arc<Shared>,
    ) -> Self {
        ResponseFuture {
            state: State::Call { fut },
            turn: Some(Box::new(Turn {
                service,
                shared,
                wire,
                original,
                next: None,
                head: None,
                body: None,
                read: Collected::default(),
                trailers: None,
                errors: ContentInvalid::new(),
                repairs: 0,
            })),
        }
    }
}

impl<S, F, B> std::fmt::Debug for ResponseFuture<S, F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Call { .. } => "call",
            State::Read => "read",
            State::Ready => "ready",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("validating", &self.turn.is_some())
            .field("repairs", &self.turn.as_ref().map_or(0, |t| t.repairs))
            .finish()
    }
}

impl<S, F, B> Future for ResponseFuture<S, F, B>
where
    S: Service<Request<Bytes>, Response = Response<B>, Future = F>,
    S::Error: Into<LlmError>,
    F: Future<Output = Result<Response<B>, S::Error>>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Output = Result<Response<RepairBody<B>>, LlmError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Call { fut } => {
                    let result = ready!(fut.poll(cx));
                    let resp = match result {
                        Ok(resp) => resp,
                        Err(e) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(e.into()));
                        }
                    };
                    let Some(turn) = this.turn.as_deref_mut() else {
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(resp.map(RepairBody::pass)));
                    };
                    // An error status (without a classifier below to turn it into an `Err`)
                    // is no answer; an answer announced larger than the limit is not read.
                    if !resp.status().is_success() || too_large(&resp, turn.shared.max_body_bytes) {
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(resp.map(RepairBody::pass)));
                    }
                    let (head, body) = resp.into_parts();
                    turn.head = Some(head);
                    turn.body = Some(Box::pin(body));
                    turn.trailers = None;
                    this.state.set(State::Read);
                }
                StateProj::Read => {
                    let turn = turn_of(this.turn);
                    let read = ready!(turn.poll_read(cx));
                    let outcome = match read {
                        Ok(outcome) => outcome,
                        Err(e) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(e));
                        }
                    };
                    match outcome {
                        Some(resp) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(resp));
                        }
                        None => match turn.judge() {
                            Ok(resp) => {
                                this.state.set(State::Done);
                                return Poll::Ready(Ok(resp));
                            }
                            Err(Some(e)) => {
                                this.state.set(State::Done);
                                return Poll::Ready(Err(e));
                            }
                            Err(None) => this.state.set(State::Ready),
                        },
                    }
                }
                StateProj::Ready => {
                    let turn = turn_of(this.turn);
                    if let Err(e) = ready!(turn.service.poll_ready(cx)) {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(e.into()));
                    }
                    let Some(req) = turn.next.take() else {
                        seawall_core::polled_after_completion();
                    };
                    let fut = turn.service.call(req);
                    this.state.set(State::Call { fut });
                }
                StateProj::Done => seawall_core::polled_after_completion(),
            }
        }
    }
}

fn turn_of<S, B>(turn: &mut Option<Box<Turn<S, B>>>) -> &mut Turn<S, B> {
    turn.as_deref_mut()
        .expect("a validated call keeps its turn until it is done")
}

/// Whether the response says, before a byte is read, that its body is over `max`.
fn too_large<B: Body>(resp: &Response<B>, max: usize) -> bool {
    let announced = resp
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let lower = resp.body().size_hint().lower();
    announced.unwrap_or(0).max(lower) > max as u64
}

impl<S, B> Turn<S, B>
where
    S: Service<Request<Bytes>, Response = Response<B>>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    /// Reads the body to its end: `Ok(None)` when it is all in `read`, `Ok(Some(response))`
    /// when it turned out larger than the limit (what was read, then the rest, unvalidated).
    #[allow(clippy::type_complexity)]
    fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Response<RepairBody<B>>>, LlmError>> {
        let max = self.shared.max_body_bytes;
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(Ok(None));
        };
        let over = loop {
            // A body that says it is done is not polled again (hyper's rule too).
            if body.is_end_stream() {
                break None;
            }
            match ready!(body.as_mut().poll_frame(cx)) {
                None => break None,
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if self.read.len().saturating_add(data.len()) > max => {
                        break Some(data);
                    }
                    Ok(data) => self.read.push(data),
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            self.trailers = Some(trailers);
                            break None;
                        }
                    }
                },
                Some(Err(e)) => {
                    self.body = None;
                    return Poll::Ready(Err(body_error(e.into())));
                }
            }
        };
        let Some(data) = over else {
            // Done with it: its hooks (a gate permit, a budget settlement) have fired.
            self.body = None;
            return Poll::Ready(Ok(None));
        };
        tracing::debug!(
            limit = max,
            "answer larger than the repair layer's body limit; passed through unvalidated"
        );
        self.read.push(data);
        let read = self.read.take();
        let (Some(rest), Some(head)) = (self.body.take(), self.head.take()) else {
            seawall_core::polled_after_completion();
        };
        Poll::Ready(Ok(Some(Response::from_parts(
            head,
            RepairBody::resume(read, rest),
        ))))
    }
}

impl<S, B> Turn<S, B> {
    /// Judges the answer read: `Ok` to hand it back, `Err(None)` when a repair turn is
    /// ready to go, `Err(Some(error))` to give up.
    #[allow(clippy::result_large_err)]
    fn judge(&mut self) -> Result<Response<RepairBody<B>>, Option<LlmError>> {
        let bytes = self.read.take();
        let verdict = verdict(&self.shared, self.wire, &bytes);
        let Some((text, complaint)) = verdict else {
            let Some(head) = self.head.take() else {
                seawall_core::polled_after_completion();
            };
            return Ok(Response::from_parts(
                head,
                RepairBody::read(bytes, self.trailers.take()),
            ));
        };
        self.errors.push(&complaint);
        // The error's request id is redacted and bounded where it is set.
        let head = self.head.take();
        let request_id = head
            .as_ref()
            .and_then(|h| seawall_core::request_id(&h.headers));
        if self.repairs >= self.shared.max_repairs
            || self.original.deadline().is_some_and(|d| d.has_passed())
        {
            return Err(Some(self.give_up(request_id)));
        }
        // The complaint goes to the model verbatim (it is the model's own answer that is
        // discussed), but bounded like the one kept for the error.
        let complaint = cut(&complaint, crate::error::MAX_ERROR_LEN);
        match repair_request(&self.original, &text, &complaint, &self.shared.template) {
            Ok(req) => {
                self.repairs += 1;
                if let Some(cx) = self.original.call_context() {
                    cx.update(|f| f.repairs += 1);
                }
                self.next = Some(req);
                Err(None)
            }
            Err(why) => {
                tracing::debug!(why, "cannot build a repair turn; giving up");
                Err(Some(self.give_up(request_id)))
            }
        }
    }

    fn give_up(&mut self, request_id: Option<&str>) -> LlmError {
        std::mem::replace(&mut self.errors, ContentInvalid::new()).into_error(request_id)
    }
}

/// What is wrong with an answer: `None` when it passes (or is not an answer the layer
/// judges: not JSON, another shape, tool calls), else its text and the validator's complaint.
fn verdict(shared: &Shared, wire: Wire, bytes: &[u8]) -> Option<(String, String)> {
    // Not JSON, or not the wire format's answer: the envelope is the classifier's business
    // (it reports an empty or broken answer as an error); there is no text to show the model.
    let answer = Answer::from_slice(wire, bytes)?;
    if answer.has_tool_calls() {
        return None;
    }
    match (shared.validator)(&answer) {
        Ok(()) => None,
        Err(complaint) => Some((answer.text().to_owned(), complaint)),
    }
}

/// An error of the body while it was read: an `LlmError` (from the classifier) as it is,
/// anything else a broken answer.
fn body_error(e: BoxError) -> LlmError {
    match e.downcast::<LlmError>() {
        Ok(e) => *e,
        Err(other) => LlmError::new(
            FailureClass::StreamInterrupted,
            format!("the answer's body failed: {other}"),
        )
        .with_source(other),
    }
}

/// The bytes of a body read so far: the first frame kept as it came (most answers are one
/// frame, so most are never copied), later ones appended to one buffer.
#[derive(Default)]
struct Collected {
    first: Option<Bytes>,
    more: BytesMut,
}

impl Collected {
    fn len(&self) -> usize {
        self.first.as_ref().map_or(0, Bytes::len) + self.more.len()
    }

    fn push(&mut self, data: Bytes) {
        if self.first.is_none() && self.more.is_empty() {
            self.first = Some(data);
            return;
        }
        if let Some(first) = self.first.take() {
            self.more.reserve(first.len() + data.len());
            self.more.extend_from_slice(&first);
        }
        self.more.extend_from_slice(&data);
    }

    fn take(&mut self) -> Bytes {
        match self.first.take() {
            Some(first) => first,
            None => self.more.split().freeze(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collected_keeps_one_frame_and_joins_many() {
        let mut c = Collected::default();
        c.push(Bytes::from_static(b"ab"));
        assert_eq!(c.len(), 2);
        assert_eq!(c.take(), "ab");
        c.push(Bytes::from_static(b"ab"));
        c.push(Bytes::from_static(b"cd"));
        c.push(Bytes::from_static(b"e"));
        assert_eq!(c.len(), 5);
        assert_eq!(c.take(), "abcde");
        assert_eq!(c.len(), 0);
    }
}
