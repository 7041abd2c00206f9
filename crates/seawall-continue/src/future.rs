//! The response future of [`Continue`](crate::Continue): passes the head on, wrapping a
//! stream in its splice, and for a non-streamed answer that finished with `length`, makes
//! the follow-ups and joins their answers into one before anything reaches the caller.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use seawall_core::{BodyReport, CallContext, FinishReason, LlmResponse};
use serde_json::Value;
use tower_service::Service;

use crate::answer;
use crate::body::{ContinueBody, Splice};
use crate::layer::Config;
use crate::request::Template;
use crate::trim::Trim;
use crate::usage;

/// What a continued call carries to its follow-ups.
pub(crate) struct Job<S> {
    pub(crate) svc: S,
    pub(crate) template: Template,
    pub(crate) config: Arc<Config>,
    pub(crate) context: Option<Arc<CallContext>>,
    pub(crate) stream: bool,
    pub(crate) started: tokio::time::Instant,
}

pin_project_lite::pin_project! {
    /// The future of [`Continue`](crate::Continue).
    pub struct ResponseFuture<S, F, B: Body> {
        #[pin]
        state: FutState<S, F, B>,
    }
}

pin_project_lite::pin_project! {
    #[project = FutProj]
    enum FutState<S, F, B: Body> {
        Pass { #[pin] fut: F },
        First { #[pin] fut: F, job: Option<Box<Job<S>>> },
        Merge { merge: Box<Merge<S, F, B>> },
        Done,
    }
}

impl<S, F, B: Body> ResponseFuture<S, F, B> {
    pub(crate) fn pass(fut: F) -> Self {
        ResponseFuture {
            state: FutState::Pass { fut },
        }
    }

    pub(crate) fn first(fut: F, job: Job<S>) -> Self {
        ResponseFuture {
            state: FutState::First {
                fut,
                job: Some(Box::new(job)),
            },
        }
    }
}

impl<S, F, B: Body> std::fmt::Debug for ResponseFuture<S, F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            FutState::Pass { .. } => "pass",
            FutState::First { .. } => "first attempt",
            FutState::Merge { .. } => "continuing",
            FutState::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

type Output<S, F, B, E> = Result<Response<ContinueBody<S, F, B>>, E>;

impl<S, F, B> Future for ResponseFuture<S, F, B>
where
    S: Service<Request<Bytes>, Response = Response<B>, Future = F>,
    F: Future<Output = Result<Response<B>, S::Error>>,
    B: Body<Data = Bytes>,
    B::Error: 'static,
{
    type Output = Output<S, F, B, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                FutProj::Pass { fut } => {
                    let resp = ready!(fut.poll(cx));
                    this.state.set(FutState::Done);
                    return Poll::Ready(resp.map(|r| r.map(ContinueBody::pass)));
                }
                FutProj::First { fut, job } => {
                    let resp = ready!(fut.poll(cx));
                    let Some(job) = job.take() else {
                        seawall_core::polled_after_completion();
                    };
                    let resp = match resp {
                        Ok(r) if r.status().is_success() => r,
                        other => {
                            this.state.set(FutState::Done);
                            return Poll::Ready(other.map(|r| r.map(ContinueBody::pass)));
                        }
                    };
                    if job.stream {
                        this.state.set(FutState::Done);
                        return Poll::Ready(Ok(spliced(*job, resp)));
                    }
                    // The classifier read a small answer ahead: its finish reason is known,
                    // and only `length` is worth reading the body for.
                    let known = resp.body_report().and_then(|r| r.finish_reason().cloned());
                    if known.is_some_and(|r| r != FinishReason::Length) || !job.config.on_length {
                        this.state.set(FutState::Done);
                        return Poll::Ready(Ok(resp.map(ContinueBody::pass)));
                    }
                    let (parts, body) = resp.into_parts();
                    this.state.set(FutState::Merge {
                        merge: Box::new(Merge {
                            job: *job,
                            parts: Some(parts),
                            step: Step::Read(Box::pin(body)),
                            buf: Vec::new(),
                            answer: None,
                            first: Bytes::new(),
                            text: String::new(),
                            trim: Trim::None,
                            follow_ups: 0,
                            joined_any: false,
                            first_token: None,
                        }),
                    });
                }
                FutProj::Merge { merge } => {
                    let out = ready!(merge.poll(cx));
                    this.state.set(FutState::Done);
                    return Poll::Ready(Ok(out));
                }
                FutProj::Done => seawall_core::polled_after_completion(),
            }
        }
    }
}

/// A stream's response: its body spliced, with a report of the whole answer in place of the
/// first attempt's.
fn spliced<S, F, B: Body>(job: Job<S>, resp: Response<B>) -> Response<ContinueBody<S, F, B>> {
    let (mut parts, body) = resp.into_parts();
    let report = Arc::new(BodyReport::starting_at(job.started));
    parts.extensions.insert(report.clone());
    let splice = Splice::new(job.svc, job.template, job.config, job.context, report, body);
    Response::from_parts(parts, ContinueBody::stream(splice))
}

enum Step<F, B> {
    Read(Pin<Box<B>>),
    Ready(Option<Box<Request<Bytes>>>),
    Call(Pin<Box<F>>),
}

/// A non-streamed answer being continued.
struct Merge<S, F, B> {
    job: Job<S>,
    parts: Option<http::response::Parts>,
    step: Step<F, B>,
    /// The body being read.
    buf: Vec<u8>,
    /// The answer joined so far (after the first is read).
    answer: Option<Value>,
    /// The first answer's bytes, given back unchanged when nothing is added to them.
    first: Bytes,
    text: String,
    trim: Trim,
    follow_ups: u32,
    /// A follow-up's text was joined to the answer.
    joined_any: bool,
    /// The caller's time to first token, which a follow-up's own must not replace.
    first_token: Option<std::time::Duration>,
}

impl<S, F, B> Merge<S, F, B>
where
    S: Service<Request<Bytes>, Response = Response<B>, Future = F>,
    F: Future<Output = Result<Response<B>, S::Error>>,
    B: Body<Data = Bytes>,
{
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Response<ContinueBody<S, F, B>>> {
        loop {
            match &mut self.step {
                Step::Read(body) => match ready!(body.as_mut().poll_frame(cx)) {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            self.buf.extend_from_slice(&data);
                        }
                        if self.buf.len() > self.job.config.max_body_bytes {
                            if self.answer.is_none() {
                                // Too large to look into: passed on as it is.
                                let head = Bytes::from(std::mem::take(&mut self.buf));
                                let Step::Read(body) =
                                    std::mem::replace(&mut self.step, Step::Ready(None))
                                else {
                                    unreachable!("reading")
                                };
                                let parts =
                                    self.parts.take().expect("the head is kept until the end");
                                return Poll::Ready(Response::from_parts(
                                    parts,
                                    ContinueBody::replay(head, body),
                                ));
                            }
                            return Poll::Ready(self.joined());
                        }
                    }
                    Some(Err(e)) => {
                        if self.answer.is_none() {
                            let data = Bytes::from(std::mem::take(&mut self.buf));
                            let parts = self.parts.take().expect("the head is kept until the end");
                            return Poll::Ready(Response::from_parts(
                                parts,
                                ContinueBody::full(data, Some(e)),
                            ));
                        }
                        return Poll::Ready(self.joined());
                    }
                    None => {
                        if let Some(done) = self.read() {
                            return Poll::Ready(done);
                        }
                    }
                },
                Step::Ready(req) => match ready!(self.job.svc.poll_ready(cx)) {
                    Ok(()) => {
                        let Some(req) = req.take() else {
                            seawall_core::polled_after_completion();
                        };
                        self.step = Step::Call(Box::pin(self.job.svc.call(*req)));
                    }
                    Err(_) => return Poll::Ready(self.joined()),
                },
                Step::Call(fut) => match ready!(fut.as_mut().poll(cx)) {
                    Ok(resp) if resp.status().is_success() => {
                        self.step = Step::Read(Box::pin(resp.into_body()));
                    }
                    _ => return Poll::Ready(self.joined()),
                },
            }
        }
    }

    /// A body was read whole: the first answer, or a follow-up's.
    fn read(&mut self) -> Option<Response<ContinueBody<S, F, B>>> {
        let data = std::mem::take(&mut self.buf);
        let wire = self.job.template.wire;
        let Some(answer) = self.answer.as_mut() else {
            let parsed: Option<Value> = serde_json::from_slice(&data).ok();
            let first = Bytes::from(data);
            let usable = parsed.filter(|v| {
                answer::finish(wire, v) == Some(FinishReason::Length)
                    && answer::text(wire, v).is_some()
            });
            let Some(v) = usable else {
                self.first = first;
                return Some(self.joined());
            };
            self.text = answer::text(wire, &v).unwrap_or_default();
            self.answer = Some(v);
            self.first = first;
            return self.next();
        };
        let Some(next) = serde_json::from_slice::<Value>(&data).ok() else {
            return Some(self.joined());
        };
        let Some(more) = answer::text(wire, &next) else {
            return Some(self.joined());
        };
        let mut add = self.trim.feed(&more);
        add.push_str(&self.trim.flush());
        answer::append(wire, answer, &next, &add);
        self.joined_any = true;
        self.text.push_str(&add);
        if answer::finish(wire, &next) == Some(FinishReason::Length) {
            return self.next();
        }
        Some(self.joined())
    }

    /// Makes the next follow-up, if one may be made.
    fn next(&mut self) -> Option<Response<ContinueBody<S, F, B>>> {
        let config = &self.job.config;
        let allowed = self.follow_ups < config.max_continuations
            && !self.text.is_empty()
            && self.text.len() <= config.max_text_bytes;
        let made = allowed
            .then(|| self.job.template.follow_up(&self.text, &config.instruction))
            .flatten();
        let Some((req, trim)) = made else {
            return Some(self.joined());
        };
        self.trim = trim;
        self.follow_ups += 1;
        if let Some(cx) = &self.job.context {
            self.first_token = cx.update(|f| {
                f.continuations += 1;
                f.time_to_first_token
            });
        }
        tracing::debug!(
            target: "seawall::continue",
            attempt = self.follow_ups,
            chars = self.text.len(),
            "follow-up request after length"
        );
        self.step = Step::Ready(Some(Box::new(req)));
        None
    }

    /// The answer as joined so far (the first one unchanged if nothing was added).
    fn joined(&mut self) -> Response<ContinueBody<S, F, B>> {
        let mut parts = self.parts.take().expect("the head is kept until the end");
        if let (Some(cx), Some(t)) = (&self.job.context, self.first_token) {
            cx.update(|f| f.time_to_first_token = Some(t));
        }
        let answer = self.answer.take().filter(|_| self.joined_any);
        let Some(answer) = answer else {
            return Response::from_parts(
                parts,
                ContinueBody::full(std::mem::take(&mut self.first), None),
            );
        };
        let wire = self.job.template.wire;
        let bytes = Bytes::from(serde_json::to_vec(&answer).unwrap_or_default());
        if parts.headers.contains_key(http::header::CONTENT_LENGTH) {
            parts.headers.insert(
                http::header::CONTENT_LENGTH,
                http::HeaderValue::from(bytes.len()),
            );
        }
        let report = Arc::new(BodyReport::starting_at(self.job.started));
        if let Some(u) = answer.get("usage").and_then(usage::to_core) {
            report.set_usage(u);
            parts.extensions.insert(u);
        }
        if let Some(r) = answer::finish(wire, &answer) {
            report.set_finish_reason(r);
        }
        if let Some(m) = answer.get("model").and_then(Value::as_str) {
            report.set_model(m);
        }
        report.record_content();
        report.set_finished();
        parts.extensions.insert(report);
        Response::from_parts(parts, ContinueBody::full(bytes, None))
    }
}
