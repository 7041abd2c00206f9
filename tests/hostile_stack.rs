//! The whole recommended stack (observe → cache → continue → repair → fallback → guard → retry
//! → budget → breaker → gate → stream → classify) fed hostile input: requests and answers of
//! the OpenAI and Anthropic wire formats and providers' error bodies, each mutated byte by
//! byte (JSON's own characters, broken UTF-8, escapes, splices of other bodies), odd values
//! in the request headers (timeouts, priority, cache control) and response headers (rate
//! limits, retry hints, ids) the layers read, answers cut into frames at random places and
//! late, bodies whose size hint lies or whose end comes early or never, and one to four
//! callers at once (often with the same request, so they share a flight) that stop reading,
//! read as hyper does (stopping at `is_end_stream`) or drop the call midway. The gate has one
//! or two permits, and rates, sizing from the upstream's headers or priority lanes, or none.
//! For every such case:
//!
//! - nothing panics, and every call and body ends (on paused time: within an hour);
//! - every body's size hint keeps its lower bound at or below its upper one, as `http-body`
//!   asserts;
//! - no error, error source or call record shows a credential, even a key the upstream's
//!   message glued to the text before it, or one in a header or a model name;
//! - nothing is lost: each call leaves exactly one record, however it ended; no budget
//!   reservation outlives its call; and once the upstream is healthy again a plain call
//!   succeeds (no gate permit, breaker probe or cache flight was left held).
//!
//! Users stack only what they need, in their own order, so the same cases also run through
//! four other orders (the budget outside retry, the gate and breaker outermost, retry
//! outermost, the gate, breaker and budget outside the cache) with the same checks but the
//! record's (observe inside retry records attempts).
//!
//! Each proptest case is one set of calls from a seed; a failure names the seed that makes
//! it again.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use proptest::prelude::*;
use seawall::LlmError;
use seawall::breaker::CircuitBreakerLayer;
use seawall::budget::{Budget, CostBudgetLayer, MissingMaxOutput, Price, PriceTable, Usd};
use seawall::cache::{CacheLayer, MemoryStore};
use seawall::classify::ClassifyLayer;
use seawall::continuation::ContinueLayer;
use seawall::fallback::{FallbackLayer, Target, box_response};
use seawall::gate::{AutoSize, ConcurrencyGateLayer, LaneShare, Priority, Rates};
use seawall::guard::{ContextGuardLayer, ContextWindows, ModelLimits};
use seawall::observe::{CallRecord, ObserveLayer};
use seawall::repair::{Answer, RepairLayer};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::StreamTimeoutLayer;
use seawall_test_support::Draws;
use tower::{ServiceBuilder, ServiceExt};

/// The caller's key, sent in its `Authorization` header.
const CALLER_KEY: &str = "sk-proj-CALLERkey0123456789abcdefghij";

const REQUESTS: &[&str] = &[
    r#"{"model":"gpt-4o","max_tokens":64,"temperature":0,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"How long is a piece of string? \u00e9\ud83d\ude00"}]}"#,
    r#"{"model":"gpt-4o","max_tokens":64,"n":2,"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}"#,
    r#"{"model":"claude-3-5-sonnet","max_tokens":100,"system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":"hello"},{"role":"assistant","content":"Hi"}],"stream":true}"#,
    r#"{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},"seed":1,"top_p":0.5}"#,
];

/// Answers of both wire formats, streamed and not, and error bodies carrying a key.
const ANSWERS: &[(&str, &str)] = &[
    (
        "application/json",
        r#"{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Hello, world!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":27,"completion_tokens":4,"total_tokens":31,"prompt_tokens_details":{"cached_tokens":3}}}"#,
    ),
    (
        "text/event-stream",
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"He\"},\"finish_reason\":null}]}\n\n: keep-alive\n\ndata: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"llo\"},\"finish_reason\":\"stop\"}]}\n\ndata: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\ndata: [DONE]\n\n",
    ),
    (
        "text/event-stream",
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\nevent: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    ),
    (
        "application/json",
        r#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-x on tokens per min. Please try again in 1.5s. Key sk-proj-UPSTREAMkey0123456789abcdefghij","type":"tokens","code":"rate_limit_exceeded"}}"#,
    ),
    (
        "application/json",
        r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
    ),
    (
        "application/json",
        r#"[{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"33s"}]}}]"#,
    ),
    ("text/html", "<html><body>502 Bad Gateway</body></html>"),
    (
        "application/json",
        r#"{"id":"m","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"t","name":"f","input":{}}],"stop_reason":"tool_use","usage":{"input_tokens":3,"output_tokens":4}}"#,
    ),
];

/// Response headers the layers read, and values for them: odd numbers, durations and dates,
/// empty ones, and a key where an id belongs.
const HEADER_NAMES: &[&str] = &[
    "retry-after",
    "retry-after-ms",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-limit-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-tokens-reset",
    "x-request-id",
    "request-id",
    "apim-request-id",
    "content-encoding",
    "x-should-retry",
];
const HEADER_VALUES: &[&str] = &[
    "1",
    "0",
    "-1",
    "1.5",
    "NaN",
    "inf",
    "1e308",
    "18446744073709551616",
    "6m0.5s",
    "1h2m3.5s",
    "-5s",
    "Wed, 21 Oct 2015 07:28:00 GMT",
    "Fri, 31 Dec 9999 23:59:59 GMT",
    "2026-12-04T14:00:00Z",
    "",
    "true",
    "gzip",
    "req_sk-proj-HEADERkey0123456789abcdefghij",
];

/// Single bytes a mutation writes: JSON's own characters, digits, a NUL and a DEL.
const BYTES: &[u8] = b"{}[]\":,\\ \n\r0123456789e-+.ntfu\x00\x7f";

/// Pieces a mutation inserts: multi-byte and broken UTF-8, escapes, SSE framing, markers.
const PIECES: &[&[u8]] = &[
    b"\xc3\xa9",
    b"\xf0\x9f\x98\x80",
    b"\\ud83d",
    b"\\u0000",
    b"\xff",
    b"\xe2\x80",
    b"data: ",
    b"\n\n",
    b"[DONE]",
    b"\"error\"",
    b"\"finish_reason\":\"length\"",
    b"99999999999999999999999",
];

/// `base` with one to six mutations; `other` is spliced from.
fn mutate(r: &mut Draws, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + r.below(6) {
        let len = v.len();
        let at = r.below(len + 1);
        match r.below(8) {
            0 if len > 0 => v[at.min(len - 1)] = *r.pick(BYTES),
            1 => v.insert(at, *r.pick(BYTES)),
            2 => {
                let end = (at + r.below(20)).min(len);
                v.drain(at..end);
            }
            3 => {
                let end = (at + r.below(40)).min(len);
                let copy = v[at..end].to_vec();
                let to = r.below(len + 1);
                v.splice(to..to, copy);
            }
            4 => v.truncate(at),
            5 => {
                let from = r.below(other.len());
                let end = (from + r.below(60)).min(other.len());
                v.splice(at..at, other[from..end].iter().copied());
            }
            6 => {
                let piece = *r.pick(PIECES);
                v.splice(at..at, piece.iter().copied());
            }
            _ => v.insert(at, r.next_u64() as u8),
        }
    }
    v
}

/// An upstream body: its frames, and how it describes itself.
struct Hostile {
    frames: VecDeque<Result<Frame<Bytes>, LlmError>>,
    /// 0 no hint, 1 exact and true, 2 exact and too small, 3 exact near `u64::MAX`, 4 a
    /// lower bound only.
    hint: u8,
    /// 0 says it ended when it has, 1 says so after its first frame, otherwise never.
    end: u8,
    /// Answers `Pending` (waking itself) before every frame.
    pend: bool,
    pended: bool,
    polled: usize,
}

impl Hostile {
    fn new(r: &mut Draws, body: &[u8]) -> Self {
        let mut frames = VecDeque::new();
        let mut at = 0;
        while at < body.len() {
            let n = 1 + r.below(80).min(body.len() - at - 1);
            frames.push_back(Ok(Frame::data(Bytes::copy_from_slice(&body[at..at + n]))));
            at += n;
        }
        if r.below(10) == 0 {
            frames.push_back(Err(LlmError::from_static(
                seawall::FailureClass::StreamInterrupted,
                "connection reset",
            )));
        }
        Hostile {
            frames,
            hint: r.below(5) as u8,
            end: r.below(4) as u8,
            pend: r.below(3) == 0,
            pended: false,
            polled: 0,
        }
    }

    /// `body` in one frame, ending as it says, of the size it says.
    fn clean(body: &'static [u8]) -> Self {
        Hostile {
            frames: VecDeque::from([Ok(Frame::data(Bytes::from_static(body)))]),
            hint: 1,
            end: 0,
            pend: false,
            pended: false,
            polled: 0,
        }
    }
}

impl Body for Hostile {
    type Data = Bytes;
    type Error = LlmError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, LlmError>>> {
        if self.pend && !self.pended {
            self.pended = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.pended = false;
        self.polled += 1;
        Poll::Ready(self.frames.pop_front())
    }

    fn is_end_stream(&self) -> bool {
        match self.end {
            0 => self.frames.is_empty(),
            1 => self.polled >= 1,
            _ => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        let left: u64 = self
            .frames
            .iter()
            .filter_map(|f| f.as_ref().ok()?.data_ref().map(|d| d.len() as u64))
            .sum();
        match self.hint {
            0 => SizeHint::default(),
            1 => SizeHint::with_exact(left),
            2 => SizeHint::with_exact(left / 2),
            3 => SizeHint::with_exact(u64::MAX - 2),
            _ => {
                let mut hint = SizeHint::new();
                hint.set_lower(left);
                hint
            }
        }
    }
}

/// Whether `text` shows a key: `sk-` and a random-looking run of 16 or more characters (as
/// the redactor recognises one glued to the text before it), or the caller's key.
fn shows_a_key(text: &str) -> bool {
    let b = text.as_bytes();
    let key_char = |c: &u8| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_';
    let mut from = 0;
    while let Some(found) = text[from..].find("sk-") {
        let start = from + found + 3;
        let n = b[start..].iter().take_while(|c| key_char(c)).count();
        let run = b[start..start + n]
            .split(|c| *c == b'-')
            .map(<[u8]>::len)
            .max()
            .unwrap_or(0);
        if n >= 20 && run >= 16 {
            return true;
        }
        from = start;
    }
    text.contains("CALLERkey")
}

fn assert_shows_no_key(e: &LlmError) {
    let mut shown = vec![e.to_string(), format!("{e:?}")];
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        shown.push(format!("{s} {s:?}"));
        source = s.source();
    }
    for text in shown {
        assert!(!shows_a_key(&text), "a key shown: {text}");
    }
}

/// Request headers the layers read (a caller's timeout, priority, cache control, credentials),
/// and values for them: durations of every form, odd numbers, a key.
const REQUEST_HEADER_NAMES: &[&str] = &[
    "x-seawall-timeout",
    "x-stainless-timeout",
    "grpc-timeout",
    "x-seawall-priority",
    "cache-control",
    "idempotency-key",
    "x-api-key",
    "api-key",
    "anthropic-beta",
    "x-request-id",
];
const REQUEST_HEADER_VALUES: &[&str] = &[
    "interactive",
    "batch",
    "no-cache",
    "no-store",
    "max-age=0, no-cache",
    "1S",
    "99999999H",
    "0.001",
    "1e9",
    "30",
    "2.5",
    "-3",
    "NaN",
    "18446744073709551616",
    "",
    "sk-proj-REQHEADERkey0123456789abcdefghij",
];

/// Up to four headers of `names`, each with one of `values`, mutated or not.
fn drawn_headers(
    r: &mut Draws,
    names: &[&'static str],
    values: &[&str],
) -> Vec<(&'static str, Vec<u8>)> {
    (0..r.below(5))
        .map(|_| {
            let value = r.pick(values).as_bytes();
            let value = if r.below(3) == 0 {
                let other = r.pick(values).as_bytes();
                mutate(r, value, other)
            } else {
                value.to_vec()
            };
            (*r.pick(names), value)
        })
        .collect()
}

/// One caller's call: its request, when it starts, and how it reads the answer.
struct Plan {
    headers: Vec<(&'static str, Vec<u8>)>,
    body: Vec<u8>,
    anthropic: bool,
    /// The caller gives up after this many ms, if at all: the call is dropped wherever it is.
    patience: Option<u64>,
    /// Started this many ms after the first.
    start: u64,
    /// Frames read before the caller stops reading and drops the body.
    stop_after: usize,
    /// Reads as hyper does, stopping at `is_end_stream`.
    as_hyper: bool,
}

/// What a case is drawn to be: its callers, the upstream's answers (hostile, then healthy),
/// and the layers whose settings vary.
struct Case {
    plans: Vec<Plan>,
    upstream: Upstream,
    budget: CostBudgetLayer,
    gate: ConcurrencyGateLayer,
    records: Records,
    observe: ObserveLayer,
}

type Records = Arc<Mutex<Vec<CallRecord>>>;

/// One answer of the upstream, sent `delay` ms after the request.
struct Reply {
    status: u16,
    content_type: &'static str,
    headers: Vec<(&'static str, Vec<u8>)>,
    body: Hostile,
    delay: u64,
}

/// The upstream: its next answers, drawn, then clean ones.
#[derive(Clone)]
struct Upstream(Arc<Mutex<VecDeque<Reply>>>);

impl tower::Service<http::Request<Bytes>> for Upstream {
    type Response = http::Response<Hostile>;
    type Error = LlmError;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Hostile>, LlmError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<Bytes>) -> Self::Future {
        let next = self.0.lock().unwrap().pop_front();
        Box::pin(async move {
            let reply = next.unwrap_or_else(|| Reply {
                status: 200,
                content_type: ANSWERS[0].0,
                headers: Vec::new(),
                body: Hostile::clean(ANSWERS[0].1.as_bytes()),
                delay: 0,
            });
            tokio::time::sleep(Duration::from_millis(reply.delay)).await;
            let mut resp = http::Response::builder().status(reply.status);
            for (name, value) in reply.headers {
                // A value no header may hold (a control byte) is not sent.
                if let Ok(value) = http::HeaderValue::from_bytes(&value) {
                    resp = resp.header(name, value);
                }
            }
            if !reply.content_type.is_empty() {
                resp = resp.header("content-type", reply.content_type);
            }
            Ok(resp.body(reply.body).unwrap())
        })
    }
}

impl Case {
    fn draw(r: &mut Draws) -> Self {
        let mut plans = Vec::new();
        let shared_body = r.pick(REQUESTS).as_bytes().to_vec();
        for _ in 0..1 + r.below(4) {
            let body = match r.below(4) {
                0 => {
                    let template = r.pick(REQUESTS).as_bytes();
                    let other = r.pick(REQUESTS).as_bytes();
                    mutate(r, template, other)
                }
                1 => r.pick(REQUESTS).as_bytes().to_vec(),
                _ => shared_body.clone(),
            };
            plans.push(Plan {
                headers: drawn_headers(r, REQUEST_HEADER_NAMES, REQUEST_HEADER_VALUES),
                body,
                anthropic: r.below(3) == 0,
                patience: (r.below(4) == 0).then(|| r.below(5000) as u64),
                start: r.below(3) as u64 * r.below(2000) as u64,
                stop_after: if r.below(8) == 0 {
                    r.below(4)
                } else {
                    usize::MAX
                },
                as_hyper: r.below(2) == 0,
            });
        }

        let mut answers = VecDeque::new();
        for _ in 0..1 + r.below(12) {
            let (content_type, answer) = *r.pick(ANSWERS);
            let answer = if r.below(3) == 0 {
                answer.as_bytes().to_vec()
            } else {
                let other = r.pick(ANSWERS).1.as_bytes();
                mutate(r, answer.as_bytes(), other)
            };
            let status = *r.pick(&[200u16, 200, 200, 429, 400, 500, 529, 503, 413, 401]);
            let content_type = if r.below(20) == 0 { "" } else { content_type };
            let headers = drawn_headers(r, HEADER_NAMES, HEADER_VALUES);
            let delay = r.below(3) as u64 * r.below(3000) as u64;
            answers.push_back(Reply {
                status,
                content_type,
                headers,
                body: Hostile::new(r, &answer),
                delay,
            });
        }

        let budget = CostBudgetLayer::builder(
            PriceTable::new().with_default(Price::per_million_f64(2.5, 10.0).unwrap()),
        )
        .budget(Budget::total("total", Usd::from_dollars(1_000)))
        .missing_max_output(MissingMaxOutput::Default(1024))
        .build()
        .unwrap();
        // One or two permits, waits longer than the checks allow: a permit never given back
        // shows as a call that does not end.
        let mut gate = ConcurrencyGateLayer::builder()
            .limit(1 + r.below(2))
            .max_wait(Duration::from_secs(10 * 3600));
        let extras = r.below(8);
        if extras & 1 != 0 {
            gate = gate.rates(
                Rates::new()
                    .requests_per_minute(60)
                    .tokens_per_minute(100_000),
            );
        }
        if extras & 2 != 0 {
            gate = gate.autosize(AutoSize::new().with_min_limit(1).with_max_limit(4));
        }
        if extras & 4 != 0 {
            gate = gate.lane(
                Priority::Batch,
                LaneShare {
                    permits: 0.5,
                    rate: 0.5,
                },
            );
        }
        let records = Records::default();
        let sink = records.clone();
        Case {
            plans,
            upstream: Upstream(Arc::new(Mutex::new(answers))),
            budget,
            gate: gate.build().unwrap(),
            observe: ObserveLayer::builder()
                .recorder(move |record: &CallRecord| sink.lock().unwrap().push(record.clone()))
                .build()
                .unwrap(),
            records,
        }
    }
}

/// A repair whose check fails answers of a length divisible by 7.
fn repair() -> RepairLayer {
    RepairLayer::new(|answer: &Answer<'_>| {
        if answer.text().len() % 7 == 0 {
            Err("a length of a multiple of 7".to_owned())
        } else {
            Ok(())
        }
    })
}

/// Runs the case's callers at once through `client`, each reading its answer as its plan says
/// (and asserting nothing panics, hangs or shows a key), then `after_calls`; then, ten minutes
/// later (an open circuit has half-opened) and with the upstream healthy once the hostile
/// answers left are spent, plain calls until one succeeds, which must happen within a few
/// tries. A permit, probe or flight left held would keep it waiting past the two hours
/// allowed.
async fn drive<S, B>(client: S, plans: Vec<Plan>, after_calls: impl FnOnce())
where
    S: tower::Service<http::Request<Bytes>, Response = http::Response<B>, Error = LlmError>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: Body<Data = Bytes, Error = LlmError> + Send + 'static,
{
    let hour = Duration::from_secs(3600);
    let mut tasks = tokio::task::JoinSet::new();
    for plan in plans {
        let client = client.clone();
        tasks.spawn(async move {
            tokio::time::sleep(Duration::from_millis(plan.start)).await;
            let uri = if plan.anthropic {
                "https://api.anthropic.com/v1/messages"
            } else {
                "https://api.openai.com/v1/chat/completions"
            };
            let mut req = http::Request::post(uri)
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {CALLER_KEY}"))
                .header("anthropic-version", "2023-06-01");
            for (name, value) in &plan.headers {
                if let Ok(value) = http::HeaderValue::from_bytes(value) {
                    req = req.header(*name, value);
                }
            }
            let req = req.body(Bytes::from(plan.body)).unwrap();
            let whole = async move {
                match tokio::time::timeout(hour, client.oneshot(req)).await {
                    Err(_) => panic!("the call did not end within an hour"),
                    Ok(Err(e)) => assert_shows_no_key(&e),
                    Ok(Ok(resp)) => {
                        let mut body = Box::pin(resp.into_body());
                        let mut read = 0;
                        loop {
                            let hint = body.size_hint();
                            assert!(
                                hint.upper().is_none_or(|upper| upper >= hint.lower()),
                                "a size hint out of order: {hint:?}"
                            );
                            if (plan.as_hyper && body.is_end_stream()) || read >= plan.stop_after {
                                break;
                            }
                            match tokio::time::timeout(hour, body.as_mut().frame()).await {
                                Err(_) => panic!("the body did not end within an hour"),
                                Ok(None) => break,
                                Ok(Some(Ok(_))) => read += 1,
                                Ok(Some(Err(e))) => {
                                    assert_shows_no_key(&e);
                                    break;
                                }
                            }
                        }
                    }
                }
            };
            match plan.patience {
                Some(ms) => {
                    let _ = tokio::time::timeout(Duration::from_millis(ms), whole).await;
                }
                None => whole.await,
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    after_calls();

    tokio::time::sleep(Duration::from_secs(600)).await;
    let mut last = String::new();
    for attempt in 0..20 {
        let req = http::Request::post("https://api.openai.com/v1/chat/completions")
            .header("content-type", "application/json")
            .body(Bytes::from(format!(
                r#"{{"model":"gpt-4o","max_tokens":8,"messages":[{{"role":"user","content":"again {attempt}"}}]}}"#
            )))
            .unwrap();
        match tokio::time::timeout(2 * hour, client.clone().oneshot(req)).await {
            Err(_) => panic!("a later call did not end: something was left held"),
            Ok(Err(e)) => last = e.to_string(),
            Ok(Ok(resp)) => {
                let status = resp.status();
                let body = tokio::time::timeout(2 * hour, resp.into_body().collect())
                    .await
                    .expect("a later body hung");
                if status.is_success() && body.is_ok() {
                    last.clear();
                    break;
                }
                last = format!(
                    "status {status}, body {:?}",
                    body.map(|b| b.to_bytes()).err()
                );
            }
        }
        tokio::time::sleep(Duration::from_secs(120)).await;
    }
    assert!(last.is_empty(), "the stack did not recover: {last}");
}

/// Each call leaves exactly one record, however it ended, and none shows a key.
fn one_record_a_call(records: &Records, calls: usize) {
    let records = std::mem::take(&mut *records.lock().unwrap());
    assert_eq!(records.len(), calls, "not one record a call");
    for record in &records {
        let shown = format!("{record:?}");
        assert!(!shows_a_key(&shown), "a key in a call record: {shown}");
    }
}

/// No budget reservation outlives its call.
fn nothing_reserved(budget: &CostBudgetLayer) {
    let spend = budget.spend("total", None).unwrap();
    assert_eq!(
        spend.reserved,
        Usd::ZERO,
        "a reservation outlived its call: {spend:?}"
    );
}

/// A case through the README's recommended stack.
async fn recommended(seed: u64) {
    let Case {
        plans,
        upstream,
        budget,
        gate,
        records,
        observe,
    } = Case::draw(&mut Draws::new(seed));
    let calls = plans.len();
    let windows =
        ContextWindows::new().with("gpt-4o", ModelLimits::new(128_000).with_max_output(16_384));
    let client = ServiceBuilder::new()
        .layer(observe)
        .layer(CacheLayer::new(MemoryStore::new()))
        .layer(ContinueLayer::new())
        .layer(repair())
        .layer(FallbackLayer::new([Target::model("gpt-4o-mini")]))
        .map_response(box_response)
        .layer(ContextGuardLayer::new(windows))
        .layer(BackoffRetryLayer::new())
        .layer(budget.clone())
        .layer(CircuitBreakerLayer::new())
        .layer(gate)
        .layer(StreamTimeoutLayer::new())
        .layer(ClassifyLayer::default())
        .service(upstream);
    drive(client, plans, || {
        one_record_a_call(&records, calls);
        nothing_reserved(&budget);
    })
    .await;
    nothing_reserved(&budget);
}

/// A case through one of four other orders a user may choose: the budget outside retry
/// (one reservation a call) with the cache outermost and no observe; the gate and breaker
/// outermost with the fallback inside retry; retry outermost over observe (a record an
/// attempt, so not one a call), continue, repair and the gate; the gate, breaker and budget
/// outside the cache (hits reserved, then charged nothing).
async fn other_order(seed: u64) {
    let mut r = Draws::new(seed);
    let order = r.below(4);
    let Case {
        plans,
        upstream,
        budget,
        gate,
        observe,
        ..
    } = Case::draw(&mut r);
    let check = || nothing_reserved(&budget);
    match order {
        0 => {
            let client = ServiceBuilder::new()
                .layer(CacheLayer::new(MemoryStore::new()))
                .layer(budget.clone())
                .layer(BackoffRetryLayer::new())
                .layer(StreamTimeoutLayer::new())
                .layer(ClassifyLayer::default())
                .service(upstream);
            drive(client, plans, check).await;
        }
        1 => {
            let client = ServiceBuilder::new()
                .layer(gate)
                .layer(CircuitBreakerLayer::new())
                .layer(budget.clone())
                .layer(BackoffRetryLayer::new())
                .layer(FallbackLayer::new([Target::model("gpt-4o-mini")]))
                .map_response(box_response)
                .layer(ClassifyLayer::default())
                .service(upstream);
            drive(client, plans, check).await;
        }
        2 => {
            let client = ServiceBuilder::new()
                .layer(BackoffRetryLayer::new())
                .layer(budget.clone())
                .layer(observe)
                .layer(ContinueLayer::new())
                .layer(repair())
                .layer(gate)
                .layer(StreamTimeoutLayer::new())
                .layer(ClassifyLayer::default())
                .service(upstream);
            drive(client, plans, check).await;
        }
        _ => {
            let client = ServiceBuilder::new()
                .layer(gate)
                .layer(CircuitBreakerLayer::new())
                .layer(budget.clone())
                .layer(CacheLayer::new(MemoryStore::new()))
                .layer(BackoffRetryLayer::new())
                .layer(StreamTimeoutLayer::new())
                .layer(ClassifyLayer::default())
                .service(upstream);
            drive(client, plans, check).await;
        }
    }
    nothing_reserved(&budget);
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn hostile_requests_answers_and_bodies_never_panic_hang_show_a_key_or_lose_anything(seed in any::<u64>()) {
        paused_runtime().block_on(recommended(seed));
    }

    #[test]
    fn other_orders_of_the_layers_lose_nothing_either(seed in any::<u64>()) {
        paused_runtime().block_on(other_order(seed));
    }
}

#[test]
fn the_checks_see_what_they_look_for() {
    // The key detector finds a glued key and the caller's key, and passes ordinary text.
    assert!(shows_a_key(
        "please try again. messsk-proj-UPSTREAMkey0123456789abcdefghij"
    ));
    assert!(shows_a_key(&format!("Bearer {CALLER_KEY}")));
    assert!(!shows_a_key(
        "sk-[REDACTED] and a desk-size-dependent-layout"
    ));
    // Mutations change bodies, and a body is cut into frames that hold all of it.
    let mut r = Draws::new(7);
    let base = REQUESTS[0].as_bytes();
    assert!((0..20).any(|_| mutate(&mut r, base, base) != base));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let whole = rt.block_on(async {
        let mut body = Hostile::new(&mut Draws::new(3), base);
        body.frames.retain(Result::is_ok);
        body.collect().await.unwrap().to_bytes()
    });
    assert_eq!(&whole[..], base);
}
