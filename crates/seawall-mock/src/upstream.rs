//! The fault model and its in-process `Service` front end.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, DATE, HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use seawall_core::{ChatWire, SeededRandom};
use tokio::time::Instant;

use crate::body::MockBody;
use crate::future::{Billed, ResponseFuture};
use crate::profile::{Draws, KeyBy, MalformedKind, Profile};
use crate::rng::Rng;
use crate::stats::{Counters, Outcome, Stats};
use crate::wire::{self, Answer, ChatRequest, Failure, RateLimited, RequestKey, Wire};

/// The chaos upstream: one seeded fault model behind two front ends.
///
/// - In process, it is a `tower::Service<http::Request<Bytes>>` answering
///   `http::Response<`[`MockBody`]`>`, with no sockets and all timing on `tokio::time`, so a
///   simulation on a paused clock pushes thousands of requests through it in virtual time.
/// - Over HTTP, [`crate::router`] and [`crate::serve`] put the same model behind axum.
///
/// It answers `POST .../chat/completions` (OpenAI) and `POST .../messages` (Anthropic),
/// complete or streamed (`"stream": true`), and injects the faults of its [`Profile`]. It also
/// answers `POST .../embeddings` with deterministic vectors (a hash of each input, the same
/// text always getting the same vector), subject to the profile's server errors only. Clones
/// share one state: limits, quota, clock and [`Stats`]. Times (outage windows, rate-limit
/// buckets) count from [`MockUpstream::new`].
///
/// A fixed seed gives a fixed run for a fixed order of calls: each call takes one draw from the
/// shared seeded sequence and makes all its own choices (latencies, faults, ids) from it.
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::BodyExt;
/// use seawall_mock::{MockUpstream, Profile};
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let upstream = MockUpstream::new(Profile::default().rpm(1));
/// let ask = || {
///     http::Request::post("http://mock/v1/chat/completions")
///         .header("authorization", "Bearer sk-test")
///         .body(Bytes::from(r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#))
///         .unwrap()
/// };
/// let ok = upstream.clone().oneshot(ask()).await.unwrap();
/// assert_eq!(ok.status(), 200);
/// assert_eq!(ok.headers()["x-ratelimit-remaining-requests"], "0");
/// let body = ok.into_body().collect().await.unwrap().to_bytes();
/// assert!(body.starts_with(br#"{"id":"chatcmpl-"#));
///
/// let limited = upstream.clone().oneshot(ask()).await.unwrap();
/// assert_eq!(limited.status(), 429);
/// assert_eq!(limited.headers()["retry-after"], "60");
/// assert_eq!(upstream.stats().rate_limited, 1);
/// # }
/// ```
#[derive(Clone)]
pub struct MockUpstream {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) profile: Profile,
    start: Instant,
    epoch: Duration,
    rng: SeededRandom,
    keys: Mutex<HashMap<Box<str>, KeyState>>,
    /// With [`Draws::Request`]: how many times each request (prompt and model) arrived, and
    /// how many streams each prompt was answered with.
    seen: Mutex<HashMap<u64, u32>>,
    streamed: Mutex<HashMap<u64, u32>>,
    pub(crate) counters: Counters,
}

struct KeyState {
    requests: Bucket,
    tokens: Bucket,
    billed: Arc<AtomicU64>,
}

/// A token bucket refilled continuously at `cap / 60 s`.
#[derive(Clone, Copy)]
struct Bucket {
    level: f64,
    at: Duration,
}

const EPSILON: f64 = 1e-6;

impl Bucket {
    fn full(cap: u32, at: Duration) -> Self {
        Bucket {
            level: f64::from(cap),
            at,
        }
    }

    fn refill(&mut self, cap: u32, t: Duration) {
        let rate = f64::from(cap) / 60.0;
        let dt = t.saturating_sub(self.at).as_secs_f64();
        self.level = (self.level + dt * rate).min(f64::from(cap));
        self.at = self.at.max(t);
    }

    fn has(&self, need: f64) -> bool {
        self.level + EPSILON >= need
    }

    fn wait_for(&self, cap: u32, need: f64) -> Duration {
        let rate = f64::from(cap) / 60.0;
        Duration::try_from_secs_f64(((need - self.level).max(0.0)) / rate).unwrap_or(Duration::MAX)
    }

    fn remaining(&self) -> u64 {
        (self.level + EPSILON).floor().max(0.0) as u64
    }

    fn used(&self, cap: u32) -> u64 {
        u64::from(cap).saturating_sub(self.remaining())
    }

    /// Time until the bucket is full again.
    fn reset(&self, cap: u32) -> Duration {
        self.wait_for(cap, f64::from(cap))
    }
}

/// One window for the rate-limit headers.
#[derive(Clone, Copy)]
struct Window {
    limit: u32,
    remaining: u64,
    reset: Duration,
}

#[derive(Clone, Copy, Default)]
struct Snapshot {
    requests: Option<Window>,
    tokens: Option<Window>,
}

impl fmt::Debug for MockUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockUpstream")
            .field("profile", &self.inner.profile)
            .field("elapsed", &self.elapsed())
            .finish_non_exhaustive()
    }
}

impl MockUpstream {
    /// A new upstream whose clock starts now; its wall-clock times (`created`, `date`,
    /// Anthropic's RFC 3339 resets) start from the system time now.
    pub fn new(profile: Profile) -> Self {
        Self::with_epoch(profile, SystemTime::now())
    }

    /// A new upstream whose wall-clock times start at `epoch` (for byte-identical runs).
    pub fn with_epoch(profile: Profile, epoch: SystemTime) -> Self {
        let rng = SeededRandom::new(profile.seed);
        MockUpstream {
            inner: Arc::new(Inner {
                profile,
                start: Instant::now(),
                epoch: epoch.duration_since(UNIX_EPOCH).unwrap_or_default(),
                rng,
                keys: Mutex::new(HashMap::new()),
                seen: Mutex::new(HashMap::new()),
                streamed: Mutex::new(HashMap::new()),
                counters: Counters::default(),
            }),
        }
    }

    /// The profile.
    pub fn profile(&self) -> &Profile {
        &self.inner.profile
    }

    /// Time since the upstream started (the clock of outage windows).
    pub fn elapsed(&self) -> Duration {
        self.inner.start.elapsed()
    }

    /// What the upstream has done so far.
    pub fn stats(&self) -> Stats {
        self.inner.counters.snapshot(self.elapsed())
    }

    /// Answers one request. The same as `Service::call`.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime with the time driver enabled, like `tokio::time::sleep`.
    pub fn respond(&self, req: Request<Bytes>) -> ResponseFuture {
        self.inner.respond(&self.inner, req)
    }
}

impl tower_service::Service<Request<Bytes>> for MockUpstream {
    type Response = Response<MockBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> ResponseFuture {
        self.respond(req)
    }
}

/// A response under construction.
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: MockBody,
    delay: Duration,
    billed: Option<Billed>,
}

/// How many times `key` came up before; counts this time.
fn nth(counts: &Mutex<HashMap<u64, u32>>, key: u64) -> u32 {
    counts.lock().map_or(0, |mut counts| {
        let n = counts.entry(key).or_insert(0);
        let before = *n;
        *n = n.saturating_add(1);
        before
    })
}

/// One call on its way through the fault model: what every step reads, and the headers the
/// steps add to.
struct Call {
    arrived: Instant,
    /// Time since the upstream started.
    t: Duration,
    /// The call's own random stream, drawn from the upstream's seed.
    rng: Rng,
    request_id: String,
    /// The drawn time to the response head.
    head: Duration,
    /// With [`Draws::Request`]: the prompt's fingerprint, which the stream faults draw from.
    prompt: Option<u64>,
    wire: Wire,
    headers: HeaderMap,
}

impl Call {
    /// Routes the call and parses its body; answers a wrong path, a wrong method or a body
    /// that is not a chat request.
    fn parse(&mut self, req: &Request<Bytes>, keyed: bool) -> ControlFlow<Answered, ChatRequest> {
        let path = req.uri().path();
        let routed = path.ends_with("/chat/completions") || path.ends_with("/messages");
        let failure = if !routed {
            Some(Failure::NotFound)
        } else if req.method() != Method::POST {
            Some(Failure::MethodNotAllowed)
        } else {
            None
        };
        match failure.map_or_else(|| wire::parse_request(self.wire, req.body(), keyed), Err) {
            Ok(chat) => ControlFlow::Continue(chat),
            Err(f) => ControlFlow::Break((self.fail(f, ""), Outcome::Rejected)),
        }
    }

    /// An error reply with the headers gathered so far.
    fn fail(&mut self, failure: Failure, model: &str) -> Reply {
        let headers = std::mem::take(&mut self.headers);
        fail(
            self.wire,
            failure,
            model,
            &self.request_id,
            headers,
            self.head,
        )
    }
}

/// A call answered before its last step: the reply, and how the stats count it.
type Answered = (Reply, Outcome);

/// The answer planned before anything is charged.
struct Plan {
    /// The key (per `key_by`) the call is limited and billed under.
    key: String,
    /// Tokens to generate.
    output: u32,
    /// The request's `max_tokens` cut the answer short.
    truncated: bool,
}

fn api_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get(http::header::AUTHORIZATION) {
        let v = v.to_str().ok()?;
        return Some(v.strip_prefix("Bearer ").unwrap_or(v).trim());
    }
    headers
        .get("x-api-key")
        .or_else(|| headers.get("api-key"))
        .and_then(|v| v.to_str().ok())
}

fn hv(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

fn put(headers: &mut HeaderMap, name: &'static str, value: impl fmt::Display) {
    headers.insert(HeaderName::from_static(name), hv(&value.to_string()));
}

impl Inner {
    fn unix(&self, t: Duration) -> Duration {
        self.epoch.saturating_add(t)
    }

    /// Answers one call, one step after another; a step that fails the call answers it at
    /// once.
    fn respond(&self, this: &Arc<Inner>, req: Request<Bytes>) -> ResponseFuture {
        let call = self.begin(&req);
        let arrived = call.arrived;
        let (reply, outcome) = match self.run(this, call, &req) {
            ControlFlow::Continue(reply) => (reply, Outcome::Ok),
            ControlFlow::Break(answered) => answered,
        };
        self.finish(this, reply, outcome, arrived)
    }

    /// The steps of a call, in the order they draw from its random stream (that order is
    /// part of what a seed reproduces).
    fn run(
        &self,
        this: &Arc<Inner>,
        mut call: Call,
        req: &Request<Bytes>,
    ) -> ControlFlow<Answered, Reply> {
        if req.uri().path().ends_with("/embeddings") {
            return self.embeddings(&mut call, req);
        }
        let mut chat = call.parse(req, self.profile.draws == Draws::Request)?;
        if let Some(key) = chat.key {
            self.redraw(&mut call, key);
        }
        let key = api_key(req.headers());
        let precheck = self.precheck(key, &chat);
        let plan = self.plan(&mut call, key, &chat);
        let billed_key = self.charge(&mut call, &chat, &plan, precheck)?;
        self.server_error(&mut call, &chat.model)?;
        let answer = self.answer(&mut call, &mut chat, &plan);
        let first_token = call.rng.delay(&self.profile.latency.first_token);
        if let Some(kind) = self.draw_malformed(&mut call.rng) {
            let headers = std::mem::take(&mut call.headers);
            let reply = self.malformed(
                kind,
                &answer,
                &chat,
                headers,
                call.head,
                first_token,
                billed_key,
            );
            return ControlFlow::Break((reply, Outcome::Malformed));
        }
        ControlFlow::Continue(self.body(this, call, answer, &chat, first_token, billed_key))
    }

    /// An embeddings call: the profile's server errors, else the vectors at once.
    fn embeddings(&self, call: &mut Call, req: &Request<Bytes>) -> ControlFlow<Answered, Reply> {
        let parsed = if req.method() == Method::POST {
            crate::embeddings::parse(req.body())
        } else {
            Err(Failure::MethodNotAllowed)
        };
        let embeddings = match parsed {
            Ok(e) => e,
            Err(f) => return ControlFlow::Break((call.fail(f, ""), Outcome::Rejected)),
        };
        self.server_error(call, &embeddings.model)?;
        let mut headers = std::mem::take(&mut call.headers);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        ControlFlow::Continue(Reply {
            status: StatusCode::OK,
            headers,
            body: MockBody::full(embeddings.render()),
            delay: call.head,
            billed: None,
        })
    }

    /// Stamps a call on arrival: its time, its random stream, its id, its time to the head,
    /// its wire format and the headers every answer carries.
    fn begin(&self, req: &Request<Bytes>) -> Call {
        let arrived = Instant::now();
        let t = arrived.saturating_duration_since(self.start);
        let mut rng = Rng::new(self.rng.next_u64());
        let request_id = format!("req_{:016x}{:08x}", rng.next_u64(), rng.next_u64() as u32);
        let head = rng.delay(&self.profile.latency.head);

        // The path decides, as it does at a real provider; the `anthropic-version` header only
        // for a path of neither API's shape.
        let wire = match ChatWire::of(req) {
            Some(ChatWire::AnthropicMessages) => Wire::Anthropic,
            Some(ChatWire::OpenAiChat) => Wire::OpenAi,
            None if req.headers().contains_key("anthropic-version") => Wire::Anthropic,
            None => Wire::OpenAi,
        };
        let headers = self.base_headers(wire, &request_id, t);
        Call {
            arrived,
            t,
            rng,
            request_id,
            head,
            prompt: None,
            wire,
            headers,
        }
    }

    /// Gives a call the random stream of its request ([`Draws::Request`]): from the seed, the
    /// request's fingerprint and how many times it arrived before; and its time to the head
    /// from that stream.
    fn redraw(&self, call: &mut Call, key: RequestKey) {
        call.rng = self.keyed(key.call, nth(&self.seen, key.call));
        call.head = call.rng.delay(&self.profile.latency.head);
        call.prompt = Some(key.prompt);
    }

    /// A random stream for the `n`th time something with fingerprint `key` comes up.
    fn keyed(&self, key: u64, n: u32) -> Rng {
        // Each step through SplitMix mixes its input, so nearby keys and counts give unrelated
        // streams.
        let key = Rng::new(self.profile.seed ^ key).next_u64();
        Rng::new(Rng::new(key ^ u64::from(n)).next_u64())
    }

    /// Where a stream of this prompt is cut and where an error event ends it, by
    /// [`Draws::Request`]: from the prompt and how many streams answered it before, not from
    /// the model or the call's other draws, and the same four draws whatever the rates. Two
    /// upstreams with the same seed then fault a prompt's first stream alike (where their rates
    /// overlap), whichever of them a client sent it to and after however many server errors.
    fn stream_luck(&self, prompt: u64, last: u32) -> (Option<u32>, Option<u32>) {
        let faults = &self.profile.stream;
        let mut rng = self.keyed(prompt ^ 0x5743_5245_414d, nth(&self.streamed, prompt));
        let (cut, cut_at) = (rng.next_f64(), rng.count(faults.cut.after_tokens));
        let (error, error_at) = (rng.next_f64(), rng.count(faults.error.after_tokens));
        (
            (cut < faults.cut.probability).then_some(cut_at.min(last)),
            (error < faults.error.probability).then_some(error_at.min(last)),
        )
    }

    /// What fails a call before any limit is charged: a revoked key, or a prompt longer than
    /// the model's context window.
    fn precheck(&self, key: Option<&str>, chat: &ChatRequest) -> Option<(Failure, Outcome)> {
        let invalid = key.is_some_and(|k| self.profile.auth.invalid_keys.iter().any(|i| i == k));
        let window = self
            .profile
            .context
            .models
            .get(&chat.model)
            .copied()
            .or(self.profile.context.window);
        let too_long = window.filter(|w| chat.input_tokens > *w);
        if invalid {
            Some((Failure::InvalidKey, Outcome::Rejected))
        } else {
            too_long.map(|window| {
                (
                    Failure::ContextLength {
                        window,
                        tokens: chat.input_tokens,
                    },
                    Outcome::ContextLength,
                )
            })
        }
    }

    /// Plans the answer first: its length is part of the token charge.
    fn plan(&self, call: &mut Call, key: Option<&str>, chat: &ChatRequest) -> Plan {
        let key = self.state_key(key, &chat.model);
        let mut output = call.rng.count(self.profile.output.tokens);
        if let Some(c) = &chat.continuation {
            // The remainder of the answer it would have given (at least one more word: a
            // model asked to go on says something).
            output = output.max(c.words.saturating_add(1)) - c.start();
        }
        let truncated = chat.max_tokens.is_some_and(|m| output > m);
        if let Some(m) = chat.max_tokens {
            output = output.min(m);
        }
        Plan {
            key,
            output,
            truncated,
        }
    }

    /// The rate limits and the quota: charges the key (unless the precheck failed the call)
    /// and writes its rate-limit headers. Gives the counter the call's tokens are billed to,
    /// or answers a call that failed the precheck, is out of quota or over a limit.
    fn charge(
        &self,
        call: &mut Call,
        chat: &ChatRequest,
        plan: &Plan,
        precheck: Option<(Failure, Outcome)>,
    ) -> ControlFlow<Answered, Arc<AtomicU64>> {
        let cost = u64::from(chat.input_tokens)
            + u64::from(chat.max_tokens.unwrap_or(plan.output)) * u64::from(chat.choices);
        // OpenAI refuses a request larger than the key's whole tokens per minute ("Request too
        // large"); on the Anthropic wire it waits for a full bucket, as before.
        let too_large = self
            .limits_for(&plan.key)
            .1
            .filter(|cap| call.wire == Wire::OpenAi && cost > u64::from(*cap));
        let charge = precheck.is_none() && too_large.is_none();
        let admission = self.admit(&plan.key, call.t, cost, charge);
        self.rate_headers(call.wire, &mut call.headers, &admission.snapshot, call.t);
        if let Some((f, outcome)) = precheck {
            return ControlFlow::Break((call.fail(f, &chat.model), outcome));
        }
        match (admission.verdict, too_large) {
            (Verdict::Quota, _) => {
                let reply = call.fail(Failure::Quota, &chat.model);
                ControlFlow::Break((reply, Outcome::QuotaExhausted))
            }
            (_, Some(limit)) => {
                let reply = call.fail(
                    Failure::TooLarge {
                        limit,
                        requested: cost,
                    },
                    &chat.model,
                );
                ControlFlow::Break((reply, Outcome::RateLimited))
            }
            (Verdict::Admitted(b), None) => ControlFlow::Continue(b),
            (Verdict::Limited(r), None) => {
                let secs = r
                    .wait
                    .as_secs()
                    .saturating_add(u64::from(r.wait.subsec_nanos() > 0));
                call.headers
                    .insert(RETRY_AFTER, hv(&secs.max(1).to_string()));
                if call.wire == Wire::OpenAi {
                    let ms = r.wait.as_nanos().div_ceil(1_000_000);
                    put(&mut call.headers, "retry-after-ms", ms);
                }
                let reply = call.fail(Failure::RateLimited(r), &chat.model);
                ControlFlow::Break((reply, Outcome::RateLimited))
            }
        }
    }

    /// The fault draw for server errors: bursts and outage windows, first matching rule wins.
    fn server_error(&self, call: &mut Call, model: &str) -> ControlFlow<Answered> {
        for rule in &self.profile.errors {
            if rule.applies_to(model) && rule.active_at(call.t) && call.rng.chance(rule.probability)
            {
                let status = rule.status[call.rng.below(rule.status.len())];
                if let Some(d) = rule.retry_after {
                    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
                    call.headers.insert(RETRY_AFTER, hv(&secs.to_string()));
                }
                if let Some(s) = rule.should_retry {
                    put(&mut call.headers, "x-should-retry", s);
                }
                let reply = call.fail(Failure::Server(status), model);
                return ControlFlow::Break((reply, Outcome::ServerError));
            }
        }
        ControlFlow::Continue(())
    }

    /// The answer a call gets when no fault took it.
    fn answer(&self, call: &mut Call, chat: &mut ChatRequest, plan: &Plan) -> Answer {
        let wire = call.wire;
        let rng = &mut call.rng;
        Answer {
            wire,
            id: match wire {
                Wire::OpenAi => format!(
                    "chatcmpl-{:016x}{:08x}",
                    rng.next_u64(),
                    rng.next_u64() as u32
                ),
                Wire::Anthropic => {
                    format!("msg_{:016x}{:08x}", rng.next_u64(), rng.next_u64() as u32)
                }
            },
            created: self.unix(call.t).as_secs(),
            model: std::mem::take(&mut chat.model),
            input_tokens: chat.input_tokens,
            output_tokens: plan.output,
            choices: chat.choices,
            truncated: plan.truncated,
            word_offset: match chat.continuation.and_then(|c| c.offset) {
                // The draw is made anyway: the order of draws is what a seed reproduces.
                Some(offset) => {
                    let _ = rng.next_u64();
                    offset
                }
                None => (rng.next_u64() % 32) as u32,
            },
            first_word: chat.continuation.map_or(0, |c| c.start()),
            lead_first: chat.continuation.is_some_and(|c| !c.overlap),
        }
    }

    /// The fault draw for a malformed answer, and its kind.
    fn draw_malformed(&self, rng: &mut Rng) -> Option<MalformedKind> {
        let malformed = &self.profile.malformed;
        if !malformed.kinds.is_empty() && rng.chance(malformed.probability) {
            Some(malformed.kinds[rng.below(malformed.kinds.len())])
        } else {
            None
        }
    }

    /// The body of a good answer: a stream, or the whole JSON once all its tokens would have
    /// been generated.
    fn body(
        &self,
        this: &Arc<Inner>,
        call: Call,
        answer: Answer,
        chat: &ChatRequest,
        first_token: Duration,
        billed_key: Arc<AtomicU64>,
    ) -> Reply {
        let Call {
            arrived,
            mut rng,
            head,
            prompt,
            mut headers,
            ..
        } = call;
        if chat.stream {
            return self.stream(
                this,
                answer,
                chat,
                headers,
                head,
                first_token,
                arrived,
                billed_key,
                rng,
                prompt,
            );
        }
        let mut total = first_token;
        for _ in 1..answer.output_tokens {
            total = total.saturating_add(rng.delay(&self.profile.latency.per_token));
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let billed = Billed::new(
            u64::from(answer.input_tokens),
            answer.billed_output(answer.output_tokens),
            billed_key,
        );
        billed.charge(&self.counters);
        Reply {
            status: StatusCode::OK,
            headers,
            body: MockBody::full(answer.complete_json()),
            delay: total.max(head),
            billed: Some(billed),
        }
    }

    fn finish(
        &self,
        this: &Arc<Inner>,
        reply: Reply,
        outcome: Outcome,
        arrived: Instant,
    ) -> ResponseFuture {
        self.counters.record(outcome, reply.status.as_u16());
        let mut response = Response::new(reply.body);
        *response.status_mut() = reply.status;
        *response.headers_mut() = reply.headers;
        ResponseFuture::new(
            response,
            seawall_core::instant_after(arrived, reply.delay),
            reply.delay.is_zero(),
            reply.billed.map(|b| (this.clone(), b)),
        )
    }

    fn base_headers(&self, wire: Wire, request_id: &str, t: Duration) -> HeaderMap {
        let mut h = HeaderMap::with_capacity(16);
        let id = match wire {
            Wire::OpenAi => "x-request-id",
            Wire::Anthropic => "request-id",
        };
        h.insert(HeaderName::from_static(id), hv(request_id));
        h.insert(
            DATE,
            hv(&httpdate::fmt_http_date(UNIX_EPOCH + self.unix(t))),
        );
        h
    }

    #[allow(clippy::too_many_arguments)]
    fn malformed(
        &self,
        kind: MalformedKind,
        answer: &Answer,
        chat: &ChatRequest,
        mut headers: HeaderMap,
        head: Duration,
        first_token: Duration,
        billed_key: Arc<AtomicU64>,
    ) -> Reply {
        match kind {
            MalformedKind::Html502 => {
                headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/html"));
                Reply {
                    status: StatusCode::BAD_GATEWAY,
                    headers,
                    body: MockBody::full(Bytes::from_static(wire::HTML_502.as_bytes())),
                    delay: head,
                    billed: None,
                }
            }
            MalformedKind::TruncatedJson => {
                // The upstream did the work (and bills it); the body stops halfway.
                let (whole, content_type, output) = match (chat.stream, answer.wire) {
                    (true, Wire::OpenAi) => (answer.openai_chunk_prefix(), "text/event-stream", 0),
                    (true, Wire::Anthropic) => {
                        (answer.anthropic_message_start(), "text/event-stream", 0)
                    }
                    (false, _) => (
                        answer.complete_json(),
                        "application/json",
                        answer.output_tokens,
                    ),
                };
                headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
                let billed = Billed::new(
                    u64::from(answer.input_tokens),
                    answer.billed_output(output),
                    billed_key,
                );
                billed.charge(&self.counters);
                billed.waste(&self.counters);
                Reply {
                    status: StatusCode::OK,
                    headers,
                    body: MockBody::full(whole.slice(..whole.len() / 2)),
                    delay: first_token.max(head),
                    billed: None,
                }
            }
            MalformedKind::Error200 | MalformedKind::Empty => {
                let content_type = if chat.stream {
                    "text/event-stream"
                } else {
                    "application/json"
                };
                headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
                let body = match (kind, chat.stream) {
                    (MalformedKind::Empty, true) => answer.empty_stream(),
                    (MalformedKind::Empty, false) => answer.empty_json(),
                    (_, stream) => answer.error_200(stream),
                };
                if kind == MalformedKind::Empty {
                    // The prompt was read (and billed); nothing came out.
                    let billed = Billed::new(u64::from(answer.input_tokens), 0, billed_key);
                    billed.charge(&self.counters);
                    billed.waste(&self.counters);
                }
                Reply {
                    status: StatusCode::OK,
                    headers,
                    body: MockBody::full(body),
                    delay: first_token.max(head),
                    billed: None,
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn stream(
        &self,
        this: &Arc<Inner>,
        answer: Answer,
        chat: &ChatRequest,
        mut headers: HeaderMap,
        head: Duration,
        first_token: Duration,
        arrived: Instant,
        billed_key: Arc<AtomicU64>,
        mut rng: Rng,
        prompt: Option<u64>,
    ) -> Reply {
        let faults = &self.profile.stream;
        let keepalive = rng
            .chance(faults.keepalive.probability)
            .then_some((faults.keepalive.interval, faults.keepalive.style));
        let last = answer.output_tokens.saturating_sub(1);
        let (cut, error) = match prompt {
            Some(prompt) => self.stream_luck(prompt, last),
            None => {
                let cut = rng
                    .chance(faults.cut.probability)
                    .then(|| rng.count(faults.cut.after_tokens).min(last));
                let error = rng
                    .chance(faults.error.probability)
                    .then(|| rng.count(faults.error.after_tokens).min(last));
                (cut, error)
            }
        };
        let end = match (cut, error) {
            (Some(c), Some(e)) if e <= c => crate::body::End::Error(e),
            (Some(c), _) => crate::body::End::Cut(c, faults.cut.abort),
            (None, Some(e)) => crate::body::End::Error(e),
            (None, None) => crate::body::End::Complete,
        };
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-cache"),
        );
        let billed = Billed::new(u64::from(answer.input_tokens), 0, billed_key);
        billed.charge(&self.counters);
        self.counters.streams_started.fetch_add(1, Relaxed);
        let include_usage = chat.include_usage || self.profile.output.always_include_usage;
        let body = MockBody::stream(crate::body::StreamPlan {
            inner: this.clone(),
            billed_key: billed.key.clone(),
            answer,
            include_usage,
            usage_null: chat.include_usage,
            head_at: seawall_core::instant_after(arrived, head),
            first_token_at: seawall_core::instant_after(arrived, first_token.max(head)),
            keepalive,
            end,
            rng: Rng::new(rng.next_u64()),
        });
        Reply {
            status: StatusCode::OK,
            headers,
            body,
            delay: head,
            billed: Some(billed),
        }
    }

    fn state_key(&self, api_key: Option<&str>, model: &str) -> String {
        let key = api_key.unwrap_or("anonymous");
        match self.profile.limits.key_by {
            KeyBy::ApiKey => key.to_owned(),
            KeyBy::Model => model.to_owned(),
            KeyBy::ApiKeyAndModel => format!("{key}/{model}"),
        }
    }

    fn limits_for(&self, key: &str) -> (Option<u32>, Option<u32>) {
        let l = &self.profile.limits;
        let o = l.keys.get(key);
        (
            o.and_then(|o| o.rpm).or(l.rpm),
            o.and_then(|o| o.tpm).or(l.tpm),
        )
    }

    /// Checks quota and rate limits for `key` and, when `charge` and both pass, charges one
    /// request and `cost` tokens.
    fn admit(&self, key: &str, t: Duration, cost: u64, charge: bool) -> Admission {
        let (rpm, tpm) = self.limits_for(key);
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let state = match keys.get_mut(key) {
            Some(s) => s,
            None => keys.entry(key.into()).or_insert_with(|| KeyState {
                requests: Bucket::full(rpm.unwrap_or(0), t),
                tokens: Bucket::full(tpm.unwrap_or(0), t),
                billed: Arc::new(AtomicU64::new(0)),
            }),
        };
        if let Some(cap) = rpm {
            state.requests.refill(cap, t);
        }
        if let Some(cap) = tpm {
            state.tokens.refill(cap, t);
        }
        let cost = tpm.map_or(cost, |cap| cost.min(u64::from(cap))) as f64;
        let snapshot = |s: &KeyState| Snapshot {
            requests: rpm.map(|cap| Window {
                limit: cap,
                remaining: s.requests.remaining(),
                reset: s.requests.reset(cap),
            }),
            tokens: tpm.map(|cap| Window {
                limit: cap,
                remaining: s.tokens.remaining(),
                reset: s.tokens.reset(cap),
            }),
        };
        let quota = &self.profile.quota;
        let exhausted = quota
            .tokens
            .is_some_and(|q| state.billed.load(Relaxed) >= q)
            || quota.exhausted_keys.iter().any(|k| k == key);
        let verdict = if exhausted {
            Verdict::Quota
        } else if let Some(cap) = rpm.filter(|_| !state.requests.has(1.0)) {
            Verdict::Limited(RateLimited {
                tokens: false,
                limit: cap,
                used: state.requests.used(cap),
                requested: 1,
                wait: state.requests.wait_for(cap, 1.0),
            })
        } else if let Some(cap) = tpm.filter(|_| !state.tokens.has(cost)) {
            Verdict::Limited(RateLimited {
                tokens: true,
                limit: cap,
                used: state.tokens.used(cap),
                requested: cost as u64,
                wait: state.tokens.wait_for(cap, cost),
            })
        } else {
            if charge {
                if rpm.is_some() {
                    state.requests.level -= 1.0;
                }
                if tpm.is_some() {
                    state.tokens.level -= cost;
                }
            }
            Verdict::Admitted(state.billed.clone())
        };
        Admission {
            snapshot: snapshot(state),
            verdict,
        }
    }

    fn rate_headers(&self, wire: Wire, h: &mut HeaderMap, s: &Snapshot, t: Duration) {
        use seawall_core::{
            ANTHROPIC_RATE_LIMIT_HEADERS as ANTHROPIC, OPENAI_RATE_LIMIT_HEADERS as OPENAI,
        };
        for (i, w) in [s.requests, s.tokens].into_iter().enumerate() {
            let Some(w) = w else { continue };
            let (names, reset) = match wire {
                Wire::OpenAi => (OPENAI[i], wire::go_duration(w.reset)),
                Wire::Anthropic => {
                    let at = self.unix(t).saturating_add(w.reset);
                    let secs = at
                        .as_secs()
                        .saturating_add(u64::from(at.subsec_nanos() > 0));
                    (ANTHROPIC[i], wire::rfc3339(secs))
                }
            };
            put(h, names[0], w.limit);
            put(h, names[1], w.remaining);
            h.insert(HeaderName::from_static(names[2]), hv(&reset));
        }
    }
}

fn fail(
    wire: Wire,
    failure: Failure,
    model: &str,
    request_id: &str,
    mut headers: HeaderMap,
    delay: Duration,
) -> Reply {
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Reply {
        status: failure.status(wire),
        body: MockBody::full(failure.render(wire, model, request_id)),
        headers,
        delay,
        billed: None,
    }
}

struct Admission {
    snapshot: Snapshot,
    verdict: Verdict,
}

enum Verdict {
    Admitted(Arc<AtomicU64>),
    Quota,
    Limited(RateLimited),
}
