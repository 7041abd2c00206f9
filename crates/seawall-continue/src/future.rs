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
use seawall_core::{BodyReport, FinishReason, LlmResponse, SpareClone};
use serde_json::Value;
use tower_service::Service;

use crate::answer;
use crate::body::{ContinueBody, Splice};
use crate::layer::LocalConfig;
use crate::request::{Template, Wire};
use crate::scan;
use crate::trim::Trim;
use crate::usage;

/// What a continued call carries to its follow-ups.
pub(crate) struct Job<S> {
    /// The follow-ups' service, cloned from the layer's spare at the first.
    pub(crate) svc: SpareClone<S>,
    pub(crate) template: Template,
    pub(crate) config: LocalConfig,
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

    /// The first attempt, made by `call` on the ready service. The job is boxed first and the
    /// call made last, in the struct the future is kept in: the inner future (the stack's,
    /// kilobytes) is then written in place, not built apart and copied in.
    pub(crate) fn first(job: Job<S>, call: impl FnOnce() -> F) -> Self {
        let job = Box::new(job);
        ResponseFuture {
            state: FutState::First {
                fut: call(),
                job: Some(job),
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
    S: Service<Request<Bytes>, Response = Response<B>, Future = F> + Clone,
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
                // Each outcome handled where it lands: every move of a response is a copy.
                FutProj::First { fut, job } => {
                    let resp = match fut.poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(r)) if r.status().is_success() => r,
                        Poll::Ready(other) => {
                            this.state.set(FutState::Done);
                            return Poll::Ready(other.map(|r| r.map(ContinueBody::pass)));
                        }
                    };
                    let Some(job) = job.take() else {
                        seawall_core::polled_after_completion();
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
                            buf: Collected::default(),
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
    // The first attempt's report (its classifier's) gives way to the whole answer's; the
    // splice still reads its content times.
    let inner = parts.extensions.insert(report.clone());
    let splice = Splice::new(job.svc, job.template, job.config, report, inner, body);
    Response::from_parts(parts, ContinueBody::stream(splice))
}

/// The first answer, parsed, and its text, when a follow-up is made for it: it finished with
/// `length` and holds only text.
///
/// An answer that holds no word meaning `length` (nearly every answer) is settled by a marker
/// scan ([`scan::may_be_length`]); one that does (a `length` finish, or the word elsewhere)
/// has its finish reason read by a cursor; only a `length` answer, or one the cursor is unsure
/// of, is parsed, as before ([`first_answer_parsed`]). Parsing every answer into a tree was
/// most of the layer's cost (some forty allocations) on answers it has nothing to do with.
fn first_answer(wire: Wire, data: &[u8]) -> Option<(Value, String)> {
    if !scan::may_be_length(data) {
        return None;
    }
    if let Some(finish) = scan::answer_finish(wire, data) {
        if finish != Some(FinishReason::Length) {
            return None;
        }
    }
    first_answer_parsed(wire, data)
}

/// [`first_answer`] by the parsed answer alone.
fn first_answer_parsed(wire: Wire, data: &[u8]) -> Option<(Value, String)> {
    let v: Value = serde_json::from_slice(data).ok()?;
    if answer::finish(wire, &v) != Some(FinishReason::Length) {
        return None;
    }
    let text = answer::text(wire, &v)?;
    Some((v, text))
}

/// A body's bytes as they are read: a body of one frame (most answers) is kept as that frame,
/// shared, not copied; more frames are joined.
#[derive(Debug, Default)]
struct Collected {
    one: Bytes,
    more: Vec<u8>,
}

impl Collected {
    fn push(&mut self, data: Bytes) {
        if self.more.is_empty() && self.one.is_empty() {
            self.one = data;
            return;
        }
        if !self.one.is_empty() {
            let one = std::mem::take(&mut self.one);
            self.more.extend_from_slice(&one);
        }
        self.more.extend_from_slice(&data);
    }

    fn len(&self) -> usize {
        self.one.len() + self.more.len()
    }

    /// The bytes read so far, leaving it empty.
    fn take(&mut self) -> Bytes {
        if self.more.is_empty() {
            std::mem::take(&mut self.one)
        } else {
            Bytes::from(std::mem::take(&mut self.more))
        }
    }
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
    buf: Collected,
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
    S: Service<Request<Bytes>, Response = Response<B>, Future = F> + Clone,
    F: Future<Output = Result<Response<B>, S::Error>>,
    B: Body<Data = Bytes>,
{
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Response<ContinueBody<S, F, B>>> {
        loop {
            match &mut self.step {
                Step::Read(body) => match ready!(body.as_mut().poll_frame(cx)) {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            self.buf.push(data);
                        }
                        if self.buf.len() > self.job.config.max_body_bytes {
                            if self.answer.is_none() {
                                // Too large to look into: passed on as it is.
                                let head = self.buf.take();
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
                            let data = self.buf.take();
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
                Step::Ready(req) => match ready!(self.job.svc.get().poll_ready(cx)) {
                    Ok(()) => {
                        let Some(req) = req.take() else {
                            seawall_core::polled_after_completion();
                        };
                        self.step = Step::Call(Box::pin(self.job.svc.get().call(*req)));
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
        let data = self.buf.take();
        let wire = self.job.template.wire;
        let Some(answer) = self.answer.as_mut() else {
            let usable = first_answer(wire, &data);
            self.first = data;
            let Some((v, text)) = usable else {
                return Some(self.joined());
            };
            self.text = text;
            self.answer = Some(v);
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
        if let Some(cx) = self.job.template.call_context() {
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
        if let (Some(cx), Some(t)) = (self.job.template.call_context(), self.first_token) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An answer in one of the two formats, finishing with `finish` (a JSON value), with
    /// `text` (JSON string content), sometimes a tool call, extra members and a repeated
    /// finish.
    fn answer(
        anthropic: bool,
        finish: &str,
        text: &str,
        tool: bool,
        extra: &str,
        repeat: Option<&str>,
    ) -> String {
        let again = repeat.map_or(String::new(), |r| {
            if anthropic {
                format!(",\"stop_reason\":{r}")
            } else {
                format!(",\"finish_reason\":{r}")
            }
        });
        if anthropic {
            let block = if tool {
                r#"{"type":"tool_use","id":"t","name":"f","input":{}}"#.to_owned()
            } else {
                format!(r#"{{"type":"text","text":"{text}"}}"#)
            };
            format!(
                r#"{{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[{block}],"stop_reason":{finish}{again},"stop_sequence":null{extra},"usage":{{"input_tokens":12,"output_tokens":6}}}}"#
            )
        } else {
            let tools = if tool {
                r#","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]"#
            } else {
                ""
            };
            format!(
                r#"{{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o"{extra},"choices":[{{"index":0,"message":{{"role":"assistant","content":"{text}"{tools}}},"logprobs":null,"finish_reason":{finish}{again}}}],"usage":{{"prompt_tokens":12,"completion_tokens":6,"total_tokens":18}}}}"#
            )
        }
    }

    fn wire(anthropic: bool) -> Wire {
        if anthropic {
            Wire::Anthropic
        } else {
            Wire::OpenAi
        }
    }

    const FINISHES: &[&str] = &[
        "\"stop\"",
        "\"length\"",
        "\"max_output_tokens\"",
        "\"model_context_window_exceeded\"",
        "\"max_tokens\"",
        "\"end_turn\"",
        "\"tool_calls\"",
        "\"len\\u0067th\"",
        "null",
        "7",
    ];
    const TEXTS: &[&str] = &[
        "",
        "Hello",
        "caf\u{e9} \\\"quoted\\\"",
        "a\\nb\\u00e9",
        "\\ud83d\\ude00",
        "the \\\"length\\\" and max_tokens",
        "a\\\\",
    ];
    const EXTRAS: &[&str] = &[
        "",
        r#","system_fingerprint":"fp""#,
        r#","x":[1,2.5,-3,{"y":null}],"z":true"#,
        r#","big":1e400"#,
        r#","n":123456789012345678901"#,
        r#","choices":{"0":{"finish_reason":"length"}}"#,
        r#","note":"length""#,
    ];

    #[test]
    fn a_usual_answer_that_needs_nothing_is_decided_by_the_scan_alone() {
        for anthropic in [false, true] {
            for finish in ["\"stop\"", "\"end_turn\"", "\"tool_calls\"", "null"] {
                let a = answer(anthropic, finish, "Hello, world!", false, "", None);
                assert_eq!(
                    scan::answer_finish(wire(anthropic), a.as_bytes())
                        .map(|f| f == Some(FinishReason::Length)),
                    Some(false),
                    "{a}"
                );
                assert!(first_answer(wire(anthropic), a.as_bytes()).is_none());
            }
            let a = answer(anthropic, "\"length\"", "Hello", false, "", None);
            assert!(first_answer(wire(anthropic), a.as_bytes()).is_some());
        }
    }

    #[test]
    fn bodies_of_several_frames_are_joined_and_one_frame_is_kept_as_it_is() {
        let mut c = Collected::default();
        let one = Bytes::from_static(b"{\"a\":1}");
        c.push(one.clone());
        assert_eq!(c.len(), 7);
        let got = c.take();
        assert_eq!(got.as_ptr(), one.as_ptr(), "the frame itself, not a copy");
        c.push(Bytes::from_static(b"{\"a\""));
        c.push(Bytes::from_static(b":1"));
        c.push(Bytes::from_static(b"}"));
        assert_eq!(c.len(), 7);
        assert_eq!(c.take(), one);
        assert_eq!(c.len(), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The lean reading (a scan of the finish, the answer parsed only when it may be
        /// `length`) finds the same answers to continue, with the same parsed answer and the
        /// same text (so the same follow-up request), as parsing every answer did, on
        /// generated answers in both formats, whole, cut at any point or with a byte changed.
        #[test]
        fn the_lean_reading_continues_exactly_the_answers_the_full_reading_did(
            anthropic in any::<bool>(),
            finish in proptest::sample::select(FINISHES),
            text in proptest::sample::select(TEXTS),
            tool in any::<bool>(),
            extra in proptest::sample::select(EXTRAS),
            repeat in proptest::option::of(proptest::sample::select(FINISHES)),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            mode in 0u8..4,
        ) {
            let mut data = answer(anthropic, finish, text, tool, extra, repeat).into_bytes();
            match mode {
                0 => {}
                1 => data.truncate(at.index(data.len() + 1)),
                2 => { let i = at.index(data.len()); data[i] = byte; }
                _ => { let i = at.index(data.len() + 1); data.insert(i, byte); }
            }
            let w = wire(anthropic);
            prop_assert_eq!(first_answer(w, &data), first_answer_parsed(w, &data));
            // Where the scan is sure, it reads the finish as the parsed answer does.
            if let Some(finish) = scan::answer_finish(w, &data) {
                let v: Value = serde_json::from_slice(&data).expect("the scan is sure it is JSON");
                prop_assert_eq!(finish, answer::finish(w, &v));
            }
        }
    }
}
