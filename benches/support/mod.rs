//! What the overhead and allocation benches share: the request, the no-op inner service, one
//! measured call, and every variant (each seawall layer alone, the recommended stack, and the
//! peers: tower's own layers and tower-resilience's) built on the same inner service.
//!
//! A bench walks the variants with a [`Visit`]; every variant is handed over as a concrete
//! service type, so nothing is boxed that the user's code would not box.

use std::fmt::Debug;
use std::future::{Future, Ready, poll_fn, ready};
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::Full;
use seawall::core::{FailureClass, LlmError, LlmRequest};
use seawall::gate::ConcurrencyGateLayer;
use seawall::retry::BackoffRetryLayer;
use seawall::stream::StreamTimeoutLayer;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

mod layers;

use layers::{budget, fallback_layer, gate, observe};

/// A small chat request, OpenAI style, as an application builds it for every call.
pub(crate) const REQUEST_JSON: &[u8] = br#"{"model":"gpt-4o","max_tokens":256,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello to the whole wide world."}]}"#;

/// A small, complete, non-streamed chat completion with usage.
pub(crate) const RESPONSE_JSON: &[u8] = br#"{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"Hello, world!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":27,"completion_tokens":4,"total_tokens":31}}"#;

/// A fresh request, not yet parsed by any layer: what the caller hands to the stack.
pub(crate) fn request() -> Request<Bytes> {
    let mut req = Request::new(Bytes::from_static(REQUEST_JSON));
    *req.method_mut() = http::Method::POST;
    *req.uri_mut() = http::Uri::from_static("https://api.openai.com/v1/chat/completions");
    req.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    req
}

/// The inner service: always ready, answers with [`RESPONSE_JSON`], at once or (with
/// `pend_once`) after returning `Pending` once, as a real transport does, so that layers arm
/// their timers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Noop {
    pend_once: bool,
}

/// Answers at the first poll.
pub(crate) const NOOP: Noop = Noop { pend_once: false };
/// Answers at the second poll.
pub(crate) const NOOP_PENDING: Noop = Noop { pend_once: true };

/// What [`Noop`] answers.
pub(crate) type NoopResponse = Response<Full<Bytes>>;

impl Service<Request<Bytes>> for Noop {
    type Response = NoopResponse;
    type Error = LlmError;
    type Future = PendOnce<Result<NoopResponse, LlmError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Bytes>) -> Self::Future {
        let mut resp = Response::new(Full::new(Bytes::from_static(RESPONSE_JSON)));
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        PendOnce {
            value: Some(Ok(resp)),
            pend: self.pend_once,
        }
    }
}

/// A future that is `Pending` once (waking itself at once) when `pend` is set, then ready.
#[derive(Debug)]
pub(crate) struct PendOnce<T> {
    value: Option<T>,
    pend: bool,
}

impl<T: Unpin> Future for PendOnce<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        if std::mem::take(&mut self.pend) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(self.value.take().expect("PendOnce polled after completion"))
    }
}

/// A failing inner service, to trip breakers for real.
#[derive(Clone, Copy, Debug)]
struct Failing;

impl Service<Request<Bytes>> for Failing {
    type Response = NoopResponse;
    type Error = LlmError;
    type Future = Ready<Result<NoopResponse, LlmError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Bytes>) -> Self::Future {
        ready(Err(LlmError::new(FailureClass::ServerError, "500")))
    }
}

/// Only `req.prepare()` (the one JSON parse of the request that the first seawall layer pays)
/// in front of the inner service: a reference row, not a layer. With `CHECK_ANSWER`, also the
/// answer's bytes checked as JSON by `serde_json` (read into `IgnoredAny`: nothing kept): the
/// reference for classify, which must at least tell a whole answer from damaged JSON,
/// whatever else it reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PrepareOnly<S, const CHECK_ANSWER: bool>(S);

impl<S: Service<Request<Bytes>>, const CHECK_ANSWER: bool> Service<Request<Bytes>>
    for PrepareOnly<S, CHECK_ANSWER>
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Bytes>) -> Self::Future {
        req.prepare();
        if CHECK_ANSWER {
            let answer = std::hint::black_box(RESPONSE_JSON);
            let checked = serde_json::from_slice::<serde::de::IgnoredAny>(answer);
            assert!(checked.is_ok(), "the bench's answer is JSON");
        }
        self.0.call(req)
    }
}

/// Reads a body to its end, so that whatever a layer holds until the end of the body (a permit,
/// a reservation, a record) is released inside the measured call. Returns the bytes read.
pub(crate) async fn drain<B>(body: B) -> usize
where
    B: Body,
    B::Error: Debug,
{
    let mut body = pin!(body);
    let mut read = 0;
    while let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.expect("the body of a no-op call never fails");
        if let Some(data) = frame.data_ref() {
            read += data.remaining();
        }
    }
    read
}

/// One measured call: readiness, the call, and the whole body.
pub(crate) async fn call_ok<S, B>(svc: &mut S) -> usize
where
    S: Service<Request<Bytes>, Response = Response<B>>,
    S::Error: Debug,
    B: Body,
    B::Error: Debug,
{
    let svc = svc.ready().await.expect("always ready");
    let resp = svc.call(request()).await.expect("a no-op call succeeds");
    drain(resp.into_body()).await
}

/// One call that must be rejected (an open breaker): readiness and the call.
pub(crate) async fn call_rejected<S>(svc: &mut S) -> bool
where
    S: Service<Request<Bytes>>,
    S::Error: Debug,
{
    match svc.ready().await {
        Ok(svc) => svc.call(request()).await.is_err(),
        Err(_) => true,
    }
}

/// What a bench does with each variant.
pub(crate) trait Visit {
    /// A variant whose calls succeed.
    fn ok<S, B>(&mut self, name: &'static str, svc: S)
    where
        S: Service<Request<Bytes>, Response = Response<B>> + Clone + Send + 'static,
        S::Error: Debug,
        B: Body,
        B::Error: Debug;

    /// A variant whose calls are rejected (an open circuit).
    fn rejected<S>(&mut self, name: &'static str, svc: S)
    where
        S: Service<Request<Bytes>> + Clone + Send + 'static,
        S::Error: Debug;

    /// Two variants whose difference is the figure (`with` is `without` and something added),
    /// for a visitor that times them in alternation; others skip it (each is a row of its
    /// own too).
    fn paired<S1, B1, S2, B2>(&mut self, name: &'static str, with: S1, without: S2)
    where
        S1: Service<Request<Bytes>, Response = Response<B1>> + Clone + Send + 'static,
        S1::Error: Debug,
        B1: Body,
        B1::Error: Debug,
        S2: Service<Request<Bytes>, Response = Response<B2>> + Clone + Send + 'static,
        S2::Error: Debug,
        B2: Body,
        B2::Error: Debug,
    {
        let _ = (name, with, without);
    }
}

/// tower's retry with the least a policy can do: clone the request, never retry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NeverRetry;

impl<Res, E> tower::retry::Policy<Request<Bytes>, Res, E> for NeverRetry {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut Request<Bytes>, _: &mut Result<Res, E>) -> Option<Ready<()>> {
        None
    }

    fn clone_request(&mut self, req: &Request<Bytes>) -> Option<Request<Bytes>> {
        Some(req.clone())
    }
}

/// A fallback to a smaller model that a successful call never uses.
fn fallback<S>(svc: S) -> seawall::fallback::Fallback<S, Request<Bytes>, S::Response>
where
    S: Service<Request<Bytes>> + Clone,
{
    fallback_layer().layer(svc)
}

/// The recommended stack, outer to inner, with each layer's defaults (budget and gate as
/// above).
pub(crate) fn seawall_stack(
    inner: Noop,
) -> impl Service<Request<Bytes>, Response = Response<impl Body<Error = impl Debug>>, Error = LlmError>
+ Clone
+ Send
+ 'static {
    let inner = ServiceBuilder::new()
        .layer(BackoffRetryLayer::new())
        .layer(budget())
        .layer(seawall::breaker::CircuitBreakerLayer::new())
        .layer(gate())
        .layer(StreamTimeoutLayer::new())
        .layer(seawall::classify::ClassifyLayer::default())
        .service(inner);
    observe().layer(fallback(inner))
}

/// The context windows of the README's recommended stack.
fn windows() -> seawall::guard::ContextWindows {
    let limits = seawall::guard::ModelLimits::new(128_000).with_max_output(16_384);
    seawall::guard::ContextWindows::new()
        .with("gpt-4o", limits)
        .with("gpt-4o-mini", limits)
}

/// The README's whole recommended stack: [`seawall_stack`]'s eight layers with the same
/// settings, plus the continuation layer (under observe) and the context guard (under
/// fallback), in the README's order. The cache is left out: every bench call sends the same
/// request, so a cache would answer all but the first from memory and the row would time a
/// hit, not the stack (the `cache_*_over_recommended*` rows put the cache over it).
pub(crate) fn seawall_recommended(
    inner: Noop,
) -> impl Service<
    Request<Bytes>,
    Response = Response<impl Body<Data = Bytes, Error = impl Debug>>,
    Error = LlmError,
> + Clone
+ Send
+ 'static {
    observe().layer(recommended_under_observe(inner))
}

/// [`seawall_recommended`] below its observing layer: where the README puts the cache
/// (`observe → cache → ...`), as the `*_under_observe` row does.
pub(crate) fn recommended_under_observe(
    inner: Noop,
) -> impl Service<
    Request<Bytes>,
    Response = Response<impl Body<Data = Bytes, Error = impl Debug>>,
    Error = LlmError,
> + Clone
+ Send
+ 'static {
    let inner = ServiceBuilder::new()
        .layer(seawall::guard::ContextGuardLayer::new(windows()))
        .layer(BackoffRetryLayer::new())
        .layer(budget())
        .layer(seawall::breaker::CircuitBreakerLayer::new())
        .layer(gate())
        .layer(StreamTimeoutLayer::new())
        .layer(seawall::classify::ClassifyLayer::default())
        .service(inner);
    seawall::continuation::ContinueLayer::new().layer(fallback(inner))
}

/// Each call a question not asked before: the request's user message ends with a number this
/// service has not sent. Outermost in the two `*_new_questions` rows, which both pay for it,
/// so that their difference is what the cache adds on a miss over the recommended stack.
#[derive(Debug)]
pub(crate) struct NewQuestions<S> {
    inner: S,
    next: u64,
}

impl<S> NewQuestions<S> {
    fn new(inner: S) -> Self {
        NewQuestions {
            inner,
            next: Self::first(),
        }
    }

    /// Numbers of their own for each service and clone (each bench thread calls a clone).
    fn first() -> u64 {
        static START: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        START.fetch_add(1 << 40, std::sync::atomic::Ordering::Relaxed)
    }
}

impl<S: Clone> Clone for NewQuestions<S> {
    fn clone(&self) -> Self {
        NewQuestions {
            inner: self.inner.clone(),
            next: Self::first(),
        }
    }
}

impl<S: Service<Request<Bytes>>> Service<Request<Bytes>> for NewQuestions<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Bytes>) -> S::Future {
        use std::io::Write;
        // `REQUEST_JSON` with the number before the user message's final `."}]}`.
        let (head, tail) = REQUEST_JSON.split_at(REQUEST_JSON.len() - 5);
        let mut body = Vec::with_capacity(REQUEST_JSON.len() + 21);
        body.extend_from_slice(head);
        let _ = write!(body, " {}", self.next);
        body.extend_from_slice(tail);
        self.next += 1;
        *req.body_mut() = Bytes::from(body);
        self.inner.call(req)
    }
}

/// Each call's body a chat request whose user message is about 4 KiB of prose, the size of a
/// real prompt (the bench's usual request has a few dozen bytes of text): what a layer's
/// reading of the request costs per byte of its strings shows in these rows.
#[derive(Clone, Debug)]
pub(crate) struct LongPrompt<S>(S);

impl<S> LongPrompt<S> {
    fn body() -> Bytes {
        static BODY: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
        BODY.get_or_init(|| {
            let text = "The tide came in over the flats, grey and quick, and the gulls rose. "
                .repeat(60);
            let body = format!(
                r#"{{"model":"gpt-4o","max_tokens":256,"messages":[{{"role":"system","content":"You are terse."}},{{"role":"user","content":"{text}"}}]}}"#
            );
            Bytes::from(body)
        })
        .clone()
    }
}

impl<S: Service<Request<Bytes>>> Service<Request<Bytes>> for LongPrompt<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Bytes>) -> S::Future {
        *req.body_mut() = Self::body();
        self.0.call(req)
    }
}

/// Runs `f` to completion on a throwaway runtime (setup only, never measured).
fn setup<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// Visits every variant, in the order the tables list them.
pub(crate) fn variants<V: Visit>(v: &mut V) {
    v.ok("baseline", NOOP);
    v.ok("ref_prepare_only", PrepareOnly::<_, false>(NOOP));
    v.ok("baseline_long_prompt", LongPrompt(NOOP));
    v.ok(
        "ref_prepare_only_long_prompt",
        LongPrompt(PrepareOnly::<_, false>(NOOP)),
    );
    v.ok("ref_answer_checked", PrepareOnly::<_, true>(NOOP));

    // Each seawall layer alone, inner to outer.
    v.ok(
        "seawall_classify",
        seawall::classify::ClassifyLayer::default().layer(NOOP),
    );
    v.ok("seawall_stream", StreamTimeoutLayer::new().layer(NOOP));
    v.ok("seawall_gate", ConcurrencyGateLayer::new(64).layer(NOOP));
    v.ok("seawall_gate_rates", gate().layer(NOOP));
    v.ok(
        "seawall_breaker",
        seawall::breaker::CircuitBreakerLayer::new().layer(NOOP),
    );
    v.ok("seawall_budget", budget().layer(NOOP));
    v.ok("seawall_retry", BackoffRetryLayer::new().layer(NOOP));
    v.ok("seawall_fallback", fallback(NOOP));
    v.ok("seawall_observe", observe().layer(NOOP));
    // The opt-in layers of the recommended stack, and the gate with priority lanes.
    v.ok(
        "seawall_guard",
        seawall::guard::ContextGuardLayer::new(seawall::guard::ContextWindows::new().with(
            "gpt-4o",
            seawall::guard::ModelLimits::new(128_000).with_max_output(16_384),
        ))
        .layer(NOOP),
    );
    v.ok(
        "seawall_continue",
        seawall::continuation::ContinueLayer::new().layer(NOOP),
    );
    v.ok(
        "seawall_repair",
        seawall::repair::RepairLayer::new(|a: &seawall::repair::Answer<'_>| {
            if a.text().is_empty() {
                Err("empty".to_owned())
            } else {
                Ok(())
            }
        })
        .layer(NOOP),
    );
    v.ok(
        "seawall_gate_lanes",
        ConcurrencyGateLayer::builder()
            .limit(64)
            .lane(
                seawall::gate::Priority::Batch,
                seawall::gate::LaneShare {
                    permits: 0.5,
                    rate: 0.5,
                },
            )
            .build()
            .expect("the bench gate's settings are valid")
            .layer(NOOP),
    );
    v.ok("seawall_stack", seawall_stack(NOOP));
    v.ok("seawall_recommended", seawall_recommended(NOOP));
    v.ok(
        "seawall_recommended_long_prompt",
        LongPrompt(seawall_recommended(NOOP)),
    );
    // The cache over the recommended stack, every call the same question: every call but the
    // first a hit, answered from memory without reaching the stack.
    v.ok(
        "cache_hit_over_recommended",
        seawall::cache::CacheLayer::new(seawall::cache::MemoryStore::new())
            .layer(seawall_recommended(NOOP)),
    );
    // Every call a new question: the recommended stack, and the cache over it (every call a
    // miss, stored in the in-memory store at its default bounds, the oldest answer evicted once
    // it holds 10,000).
    v.ok(
        "recommended_new_questions",
        NewQuestions::new(seawall_recommended(NOOP)),
    );
    v.ok(
        "cache_miss_over_recommended_new_questions",
        NewQuestions::new(
            seawall::cache::CacheLayer::new(seawall::cache::MemoryStore::new())
                .layer(seawall_recommended(NOOP)),
        ),
    );
    // The same two, timed in alternation: what a miss adds, with the machine's drift
    // between two rows timed seconds apart taken out.
    v.paired(
        "cache_miss_added_paired",
        NewQuestions::new(
            seawall::cache::CacheLayer::new(seawall::cache::MemoryStore::new())
                .layer(seawall_recommended(NOOP)),
        ),
        NewQuestions::new(seawall_recommended(NOOP)),
    );
    // The same in the README's order, the cache under observe: a miss also writes its status
    // into the call's context there.
    v.paired(
        "cache_miss_added_paired_under_observe",
        NewQuestions::new(
            observe().layer(
                seawall::cache::CacheLayer::new(seawall::cache::MemoryStore::new())
                    .layer(recommended_under_observe(NOOP)),
            ),
        ),
        NewQuestions::new(seawall_recommended(NOOP)),
    );

    // tower's own layers.
    v.ok("tower_retry", tower::retry::Retry::new(NeverRetry, NOOP));
    v.ok(
        "tower_concurrency_limit",
        tower::limit::ConcurrencyLimit::new(NOOP, 64),
    );
    v.ok(
        "tower_timeout",
        tower::timeout::Timeout::new(NOOP, Duration::from_secs(300)),
    );
    v.ok("tower_stack", tower_stack(NOOP));

    // tower-resilience, configured as its documentation suggests.
    v.ok("resilience_retry", resilience_retry().layer(NOOP));
    v.ok("resilience_breaker", resilience_breaker().layer(NOOP));
    v.ok("resilience_bulkhead", resilience_bulkhead().layer(NOOP));
    v.ok("resilience_stack", resilience_stack(NOOP));

    // The inner future is `Pending` once before it answers, as a real transport's always is:
    // now the timeouts arm their timers.
    v.ok("pending_baseline", NOOP_PENDING);
    v.ok(
        "pending_seawall_stream",
        StreamTimeoutLayer::new().layer(NOOP_PENDING),
    );
    v.ok("pending_seawall_stack", seawall_stack(NOOP_PENDING));
    v.ok(
        "pending_seawall_recommended",
        seawall_recommended(NOOP_PENDING),
    );
    v.ok(
        "pending_tower_timeout",
        tower::timeout::Timeout::new(NOOP_PENDING, Duration::from_secs(300)),
    );
    v.ok("pending_tower_stack", tower_stack(NOOP_PENDING));
    v.ok("pending_resilience_stack", resilience_stack(NOOP_PENDING));

    // Open-state rejection: both breakers tripped before the measurement.
    v.rejected("seawall_breaker_open", seawall_open_breaker());
    v.rejected("resilience_breaker_open", resilience_open_breaker());
}

/// [`seawall_stack`]'s layers, outer to inner, over the no-op service.
macro_rules! stack_of {
    ($($layer:expr),+ $(,)?) => {
        ServiceBuilder::new()$(.layer($layer))+.service(NOOP)
    };
}

/// [`seawall_stack`] with one layer left out, for each: the stack's cost minus one of these
/// is that layer's own cost *inside* the stack, where it moves the larger futures and
/// responses of the layers below it (the `seawall_<layer>` rows measure each alone).
// One line per variant: the eight lists differ in one layer each, and read best aligned.
#[rustfmt::skip]
pub(crate) fn leave_one_out<V: Visit>(v: &mut V) {
    use seawall::breaker::CircuitBreakerLayer as Breaker;
    use seawall::classify::ClassifyLayer as Classify;
    let retry = BackoffRetryLayer::new;
    let stream = StreamTimeoutLayer::new;
    v.ok("stack_without_observe", stack_of![fallback_layer(), retry(), budget(), Breaker::new(), gate(), stream(), Classify::default()]);
    v.ok("stack_without_fallback", stack_of![observe(), retry(), budget(), Breaker::new(), gate(), stream(), Classify::default()]);
    v.ok("stack_without_retry", stack_of![observe(), fallback_layer(), budget(), Breaker::new(), gate(), stream(), Classify::default()]);
    v.ok("stack_without_budget", stack_of![observe(), fallback_layer(), retry(), Breaker::new(), gate(), stream(), Classify::default()]);
    v.ok("stack_without_breaker", stack_of![observe(), fallback_layer(), retry(), budget(), gate(), stream(), Classify::default()]);
    v.ok("stack_without_gate", stack_of![observe(), fallback_layer(), retry(), budget(), Breaker::new(), stream(), Classify::default()]);
    v.ok("stack_without_stream", stack_of![observe(), fallback_layer(), retry(), budget(), Breaker::new(), gate(), Classify::default()]);
    v.ok("stack_without_classify", stack_of![observe(), fallback_layer(), retry(), budget(), Breaker::new(), gate(), stream()]);
}

/// tower's retry (never retrying), concurrency limit and timeout.
fn tower_stack(
    inner: Noop,
) -> impl Service<Request<Bytes>, Response = NoopResponse, Error = impl Debug> + Clone + Send + 'static
{
    ServiceBuilder::new()
        .layer(tower::retry::RetryLayer::new(NeverRetry))
        .concurrency_limit(64)
        .timeout(Duration::from_secs(300))
        .service(inner)
}

fn resilience_retry<Res, E>() -> tower_resilience::retry::RetryLayer<Request<Bytes>, Res, E> {
    tower_resilience::retry::RetryLayer::builder()
        .max_attempts(3)
        .exponential_backoff(Duration::from_millis(100))
        .build()
}

fn resilience_breaker() -> tower_resilience::circuitbreaker::CircuitBreakerLayer {
    tower_resilience::circuitbreaker::CircuitBreakerLayer::builder()
        .failure_rate_threshold(0.5)
        .sliding_window_size(100)
        .wait_duration_in_open(Duration::from_secs(3600))
        .build()
        .expect("circuit breaker")
}

fn resilience_bulkhead() -> tower_resilience::bulkhead::BulkheadLayer {
    tower_resilience::bulkhead::BulkheadLayer::builder()
        .max_concurrent_calls(64)
        .build()
        .expect("bulkhead")
}

/// What a tower-resilience user would stack: retry, circuit breaker, bulkhead, and tower's
/// timeout (tower-resilience's own is not among the enabled features).
fn resilience_stack(
    inner: Noop,
) -> impl Service<Request<Bytes>, Response = NoopResponse, Error = impl Debug> + Clone + Send + 'static
{
    let inner = ServiceBuilder::new()
        .layer(resilience_breaker())
        .layer(resilience_bulkhead())
        .timeout(Duration::from_secs(300))
        .service(inner);
    resilience_retry().layer(inner)
}

/// seawall's breaker, opened for an hour by five server errors on the request's key.
fn seawall_open_breaker() -> impl Service<Request<Bytes>, Error = LlmError> + Clone + Send + 'static
{
    let layer = seawall::breaker::CircuitBreakerLayer::builder()
        .open_for(Duration::from_secs(3600))
        .jitter(0.0)
        .build()
        .expect("breaker");
    let mut failing = layer.layer(Failing);
    setup(async {
        for _ in 0..5 {
            let svc = failing.ready().await.expect("ready");
            let _ = svc.call(request()).await;
        }
    });
    let svc = layer.layer(NOOP);
    assert!(
        setup(async {
            let mut svc = svc.clone();
            call_rejected(&mut svc).await
        }),
        "the breaker did not open"
    );
    svc
}

/// tower-resilience's breaker, forced open (it shares its circuit between clones only).
fn resilience_open_breaker()
-> impl Service<Request<Bytes>, Error = impl Debug> + Clone + Send + 'static {
    let svc = resilience_breaker().layer(NOOP);
    setup(svc.force_open());
    svc
}
