//! The six client policies, each an async function from a request to an outcome: the call
//! and the reading of its streamed answer to the end.
//!
//! All six sit on the same transport behind seawall's `ClassifyLayer`, so every policy sees
//! the same upstream as the same statuses, hints and classes. Retries of policies 1-5 happen
//! before the response head, as in the SDK, the tower layers and the router they stand for (a
//! stream that breaks after its head is final), except the naive loop, which retries the whole
//! call. The three policies that have a fallback (tower-resilience's `FallbackLayer`, the
//! LiteLLM-style router and seawall's stack) are given the same targets: the backup provider
//! for a failing primary, the larger-context model for a prompt too long for the model.

use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use seawall::budget::{Budget, CostBudgetLayer, Price, PriceTable, Usd};
use seawall::cache::{CacheLayer, MemoryStore};
use seawall::classify::{Classify, ClassifyLayer};
use seawall::continuation::ContinueLayer;
use seawall::core::{
    BoxError, FailureClass, LlmError, LlmRequest, Random, RetryPolicy, SeededRandom,
};
use seawall::fallback::{FallbackLayer, Target, box_response};
use seawall::gate::{ConcurrencyGateLayer, Limit, Rates};
use seawall::guard::{ContextGuardLayer, ContextWindows, ModelLimits};
use seawall::observe::{ObserveLayer, Summary};
use seawall::redis::{RedisBreakerState, RedisBudgetStore};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::{StreamTimeout, StreamTimeoutLayer};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_resilience::bulkhead::{BulkheadLayer, BulkheadServiceError};
use tower_resilience::circuitbreaker::{CircuitBreakerError, CircuitBreakerLayer};
use tower_resilience::fallback::{FallbackError, FallbackLayer as TrFallbackLayer};
use tower_resilience::retry::RetryLayer;

use crate::scenario::{
    BACKUP_MODEL, CONTEXT_WINDOW, LARGE_MODEL, PRICE_IN, PRICE_OUT, PRIMARY_MODEL, Scenario,
};

/// How a policy's call ended: the whole answer as the caller read it, else why not.
pub(crate) type Reading = Result<Read, &'static str>;

/// A whole answer as the caller read it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Read {
    /// Its content tokens.
    pub(crate) tokens: u32,
    /// When the caller read its first content.
    pub(crate) first_token: Option<tokio::time::Instant>,
}

/// How a logical call ended: the answer delivered whole, else why not.
pub(crate) type Outcome = Result<Delivered, &'static str>;

/// A complete answer as the caller got it: its prompt's tokens and the content tokens it read.
/// What it would have cost in one clean call is what it was worth; anything billed beyond
/// that is waste, for every row alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delivered {
    pub(crate) input: u32,
    pub(crate) output: u32,
    /// From the call's start to the first content the caller read.
    pub(crate) first_token: Option<Duration>,
}

/// Content tokens in a piece of a stream: the words of the text its deltas carry (each token
/// of the mock's answers is one word; a layer may join several into one delta, as the
/// continuation does with the text it held while trimming an overlap).
pub(crate) fn content_tokens(bytes: &[u8]) -> u32 {
    const DELTA: &[u8] = br#""delta":{"content":""#;
    let mut words = 0;
    let mut rest = bytes;
    while let Some(at) = rest.windows(DELTA.len()).position(|w| w == DELTA) {
        rest = &rest[at + DELTA.len()..];
        // The text runs to the first quote not escaped (the mock's words hold none).
        let end = rest
            .iter()
            .enumerate()
            .position(|(i, b)| *b == b'"' && (i == 0 || rest[i - 1] != b'\\'))
            .unwrap_or(rest.len());
        words += rest[..end]
            .split(|b| b.is_ascii_whitespace())
            .filter(|w| !w.is_empty())
            .count() as u32;
        rest = &rest[end..];
    }
    words
}

/// The policies, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    NoRetry,
    Naive,
    OpenAi,
    TowerResilience,
    LiteLlm,
    Seawall,
}

impl Policy {
    pub(crate) const ALL: [Policy; 6] = [
        Policy::NoRetry,
        Policy::Naive,
        Policy::OpenAi,
        Policy::TowerResilience,
        Policy::LiteLlm,
        Policy::Seawall,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Policy::NoRetry => "1 no retries",
            Policy::Naive => "2 naive 3x1s",
            Policy::OpenAi => "3 openai-python",
            Policy::TowerResilience => "4 tower-resilience",
            Policy::LiteLlm => "5 litellm router",
            Policy::Seawall => "6 seawall",
        }
    }

    /// What the policy does, a few lines.
    pub(crate) fn explain(self) -> &'static [&'static str] {
        match self {
            Policy::NoRetry => &["one attempt, no timeouts"],
            Policy::Naive => &["any error, a broken stream's too: wait 1 s and ask again, 3 times"],
            Policy::OpenAi => &[
                "the SDK's rules: 2 retries of 408/409/429/5xx and connection errors before the",
                "response head; x-should-retry obeyed; retry-after(-ms) honoured up to 120 s,",
                "else min(0.5 s * 2^n, 8 s) * (1 - 0.25 * rand); no timeout short of 600 s",
            ],
            Policy::TowerResilience => &[
                "the composition guide's client stack: retry (3 attempts, 100 ms exponential,",
                "transient errors only, not its own open circuit) > circuit breaker (50% of the",
                "last 100 calls, at least 20, open 30 s, counts 5xx/timeouts/connection errors",
                "as seawall's does) > bulkhead (a call per client, 1 s wait); outermost, as its",
                "guide orders them, FallbackLayer::tower_service to the backup provider's own",
                "copy of that stack (on every error but a bad request), and inside it a second",
                "one to gpt-4.1's copy for context-length errors (its fallback cannot pick by",
                "error)",
            ],
            Policy::LiteLlm => &[
                "emulates LiteLLM's Router at its documented defaults: 2 retries with the",
                "openai-python rules above; per-deployment cooldown of 5 s, at once on a 429,",
                "else when over 50% of the deployment's calls this minute failed (at least 5;",
                "429/401/404/408/5xx/timeouts count); a 429 or a cooled-down deployment is not",
                "retried; then fallbacks=[backup] for the primary's group and",
                "context_window_fallbacks=[gpt-4.1] for both groups, nested (the backup's own",
                "context-length error goes on to gpt-4.1; max_fallbacks 5). Not emulated: its",
                "timeouts, mid-stream recovery, other deployments per group",
            ],
            Policy::Seawall => &[
                "observe > continue (resumes a stream cut after its first token) > fallback (to",
                "the backup provider; gpt-4.1 for context-length errors) > context guard (the",
                "models' windows) > retry > cost budget (the run's limit) > breaker > gate (a",
                "permit per client, the providers' RPM/TPM in buckets of a minute's worth, as",
                "theirs are) > stream timeouts (idle 10 s) > classify; every other setting at its",
                "default (first token 60 s; with --restart-within N, the continuation holds a",
                "stream's first N tokens back and asks a stream cut before them again)",
            ],
        }
    }
}

/// The transport: both providers behind one service that routes by the request's model.
#[derive(Debug, Clone)]
pub(crate) struct Providers<T> {
    pub(crate) primary: T,
    pub(crate) backup: T,
}

impl<T> Service<Request<Bytes>> for Providers<T>
where
    T: Service<Request<Bytes>>,
{
    type Response = T::Response;
    type Error = T::Error;
    type Future = T::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), T::Error>> {
        match (self.primary.poll_ready(cx)?, self.backup.poll_ready(cx)?) {
            (Poll::Ready(()), Poll::Ready(())) => Poll::Ready(Ok(())),
            _ => Poll::Pending,
        }
    }

    fn call(&mut self, mut req: Request<Bytes>) -> T::Future {
        req.prepare();
        if matches!(req.model(), Some(BACKUP_MODEL | LARGE_MODEL)) {
            self.backup.call(req)
        } else {
            self.primary.call(req)
        }
    }
}

/// Reads a body to its end, counting the content tokens; its first error is the outcome.
pub(crate) async fn read_to_end<B>(body: B) -> Reading
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = pin!(body);
    let mut read = Read {
        tokens: 0,
        first_token: None,
    };
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    let tokens = content_tokens(data);
                    if tokens > 0 && read.first_token.is_none() {
                        read.first_token = Some(tokio::time::Instant::now());
                    }
                    read.tokens += tokens;
                }
            }
            Err(e) => return Err(class_of(e.into())),
        }
    }
    Ok(read)
}

fn class_of(e: BoxError) -> &'static str {
    LlmError::from_boxed(e).class().as_str()
}

/// Sends one request through `svc` and reads the answer.
async fn once<S, B>(svc: S, req: Request<Bytes>) -> Reading
where
    S: Service<Request<Bytes>, Response = Response<B>, Error = LlmError>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    match svc.oneshot(req).await {
        Ok(resp) => read_to_end(resp.into_body()).await,
        Err(e) => Err(e.class().as_str()),
    }
}

/// Policy 1: no retries.
pub(crate) fn no_retry<S, B>(classified: S) -> impl AsyncFn(Request<Bytes>) -> Reading
where
    S: Service<Request<Bytes>, Response = Response<B>, Error = LlmError> + Clone,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    async move |req| once(classified.clone(), req).await
}

/// Policy 2, naive: retry every error (the stream's too), three times, after a fixed second.
pub(crate) fn naive<S, B>(classified: S) -> impl AsyncFn(Request<Bytes>) -> Reading
where
    S: Service<Request<Bytes>, Response = Response<B>, Error = LlmError> + Clone,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    async move |req: Request<Bytes>| {
        let mut last = once(classified.clone(), req.clone()).await;
        for _ in 1..4 {
            if last.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            last = once(classified.clone(), req.clone()).await;
        }
        last
    }
}

/// Policy 3: the openai-python SDK's retry rules (v1.x `_base_client.py`).
pub(crate) fn openai<S, B>(classified: S, seed: u64) -> impl AsyncFn(Request<Bytes>) -> Reading
where
    S: Service<Request<Bytes>, Response = Response<B>, Error = LlmError> + Clone,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let random = Arc::new(SeededRandom::new(seed));
    async move |req: Request<Bytes>| {
        let mut retries = 0;
        loop {
            let err = match classified.clone().oneshot(req.clone()).await {
                // Once the head is in, the SDK returns the stream: nothing after it is retried.
                Ok(resp) => return read_to_end(resp.into_body()).await,
                Err(e) => e,
            };
            match openai_retry(&err, retries, &random) {
                Some(delay) => tokio::time::sleep(delay).await,
                None => return Err(err.class().as_str()),
            }
            retries += 1;
        }
    }
}

type TrError = CircuitBreakerError<BulkheadServiceError<LlmError>>;

fn tr_class(e: &TrError) -> Option<FailureClass> {
    match e {
        CircuitBreakerError::Inner(BulkheadServiceError::Inner(e)) => Some(e.class()),
        _ => None,
    }
}

/// The label of a tower-resilience error: the upstream's class, or the layer's own rejection.
fn tr_label(e: &TrError) -> &'static str {
    match e {
        CircuitBreakerError::OpenCircuit => "circuit_open",
        CircuitBreakerError::Inner(BulkheadServiceError::Bulkhead(_)) => "bulkhead_full",
        CircuitBreakerError::Inner(BulkheadServiceError::Inner(e)) => e.class().as_str(),
    }
}

/// `inner` with every request's model switched to `model`: the way to another provider's
/// model for the policies that are not seawall (seawall's fallback targets do this themselves).
fn switch_model<S>(
    inner: S,
    model: &'static str,
) -> tower::util::MapRequest<S, impl FnMut(Request<Bytes>) -> Request<Bytes> + Clone> {
    tower::util::MapRequest::new(inner, move |mut req: Request<Bytes>| {
        // The mock's bodies always carry a model; a request without one stays as it is and
        // goes to the primary, which answers it the same way.
        let _ = req.set_model(model);
        req
    })
}

/// One provider's copy of the composition guide's client stack: retry outside the circuit
/// breaker (and not retrying the breaker's own rejections), the breaker outside a bulkhead.
fn tr_stack<S, B>(
    inner: S,
    concurrency: usize,
) -> Result<
    impl Service<Request<Bytes>, Response = Response<B>, Error = TrError, Future: Send + 'static>
    + Clone
    + Send
    + 'static,
    String,
>
where
    S: Service<Request<Bytes>, Response = Response<B>, Error = LlmError> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
{
    let bulkhead = BulkheadLayer::builder()
        .max_concurrent_calls(concurrency)
        .max_wait_duration(Duration::from_secs(1))
        .build()
        .map_err(|e| e.to_string())?;
    // The breaker counts what signals a sick upstream (5xx, timeouts, connection failures),
    // not 429s or bad requests: the same classification seawall's breaker uses.
    let breaker = CircuitBreakerLayer::builder()
        .failure_rate_threshold(0.5)
        .sliding_window_size(100)
        .minimum_number_of_calls(20)
        .wait_duration_in_open(Duration::from_secs(30))
        .failure_classifier(
            |r: &Result<Response<B>, BulkheadServiceError<LlmError>>| match r {
                Ok(_) => false,
                Err(BulkheadServiceError::Inner(e)) => {
                    e.class().default_disposition().counts_for_breaker
                }
                Err(BulkheadServiceError::Bulkhead(_)) => false,
            },
        )
        .build()
        .map_err(|e| e.to_string())?;
    // Transient errors only (429, 5xx, timeouts, connection failures), never an open circuit.
    let retry = RetryLayer::<Request<Bytes>, Response<B>, TrError>::builder()
        .max_attempts(3)
        .exponential_backoff(Duration::from_millis(100))
        .retry_on(|e: &TrError| {
            tr_class(e).is_some_and(|c| c.default_disposition().retry == RetryPolicy::Retry)
        })
        .build();
    Ok(ServiceBuilder::new()
        .layer(retry)
        .layer(breaker)
        .layer(bulkhead)
        .service(inner))
}

/// Policy 4: tower-resilience, stacked and configured as its composition guide recommends for a
/// client of an external API, with its fallback outermost: a `FallbackLayer::tower_service` to
/// the backup provider's own copy of the stack (a second dependency, its own breaker), and
/// inside it a second one to the larger-context model's copy for context-length errors. Its
/// fallback hands the backup only the request, not the error, so choosing the target by the
/// error takes the two layers, each with a `handle` predicate.
pub(crate) fn tower_resilience<S, B>(
    classified: S,
    concurrency: usize,
) -> Result<impl AsyncFn(Request<Bytes>) -> Reading, String>
where
    S: Service<Request<Bytes>, Response = Response<B>, Error = LlmError> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let primary = tr_stack(classified.clone(), concurrency)?;
    let backup = tr_stack(switch_model(classified.clone(), BACKUP_MODEL), concurrency)?;
    let large = tr_stack(switch_model(classified, LARGE_MODEL), concurrency)?;
    let to_large = TrFallbackLayer::<Request<Bytes>, Response<B>, TrError>::tower_service(large)
        .handle(|e: &TrError| tr_class(e) == Some(FailureClass::ContextLengthExceeded));
    // Every error of the primary but a bad request (an open circuit and a full bulkhead too);
    // not when the larger model failed: the backup's copy of the model has the same window.
    let to_backup =
        TrFallbackLayer::<Request<Bytes>, Response<B>, FallbackError<TrError>>::tower_service(
            backup,
        )
        .handle(|e: &FallbackError<TrError>| match e {
            FallbackError::Inner(e) => !matches!(
                tr_class(e),
                Some(FailureClass::InvalidRequest | FailureClass::ContextLengthExceeded)
            ),
            FallbackError::FallbackFailed(_) => false,
        });
    let svc = ServiceBuilder::new()
        .layer(to_backup)
        .layer(to_large)
        .service(primary);
    Ok(
        async move |req: Request<Bytes>| match svc.clone().oneshot(req).await {
            Ok(resp) => read_to_end(resp.into_body()).await,
            Err(
                FallbackError::Inner(FallbackError::Inner(e) | FallbackError::FallbackFailed(e))
                | FallbackError::FallbackFailed(e),
            ) => Err(tr_label(&e)),
        },
    )
}

/// How long LiteLLM's router keeps a deployment out of its picks (`cooldown_time`).
const COOLDOWN: Duration = Duration::from_secs(5);
/// The share of a minute's calls that must fail before a deployment cools down.
const COOLDOWN_FAILURE_SHARE: f64 = 0.5;
/// The fewest calls in the minute before the failure share counts.
const COOLDOWN_MIN_CALLS: u32 = 5;

/// One deployment's cooldown, as LiteLLM's router keeps it: a 429 cools it down at once; so
/// does a minute in which more than half of at least five calls failed.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cooldown {
    /// Until when the deployment is out of the picks.
    until: Option<Duration>,
    /// The minute the counts are for (whole minutes since the run's start).
    minute: u64,
    failures: u32,
    calls: u32,
}

impl Cooldown {
    /// Whether the deployment may be picked at `now` (time since the run's start).
    pub(crate) fn available(&self, now: Duration) -> bool {
        self.until.is_none_or(|until| now >= until)
    }

    /// Counts one call's result at `now`: `failed` when it is a failure the router counts,
    /// `rate_limited` for a 429.
    pub(crate) fn record(&mut self, now: Duration, failed: bool, rate_limited: bool) {
        let minute = now.as_secs() / 60;
        if minute != self.minute {
            (self.minute, self.failures, self.calls) = (minute, 0, 0);
        }
        self.calls += 1;
        self.failures += u32::from(failed);
        let share = f64::from(self.failures) / f64::from(self.calls);
        if rate_limited
            || (failed && self.calls >= COOLDOWN_MIN_CALLS && share > COOLDOWN_FAILURE_SHARE)
        {
            self.until = Some(now + COOLDOWN);
        }
    }
}

/// Whether LiteLLM's router counts an error against the deployment: 401, 404, 408, 429 and
/// server errors, and failures without a response (timeouts, connection errors).
fn counts_for_cooldown(e: &LlmError) -> bool {
    match e.status().map(|s| s.as_u16()) {
        Some(401 | 404 | 408 | 429) => true,
        Some(s) => s >= 500,
        None => true,
    }
}

/// Whether the openai-python rules retry `err`, and after how long (`retries` done so far).
fn openai_retry(err: &LlmError, retries: u32, random: &SeededRandom) -> Option<Duration> {
    const MAX_RETRIES: u32 = 2;
    const MAX_RETRY_AFTER: Duration = Duration::from_secs(120);
    let hint = err.retry_after();
    let should = if hint.is_some_and(|h| h > MAX_RETRY_AFTER) {
        false
    } else if let Some(directive) = err.should_retry() {
        directive
    } else {
        match err.status().map(|s| s.as_u16()) {
            Some(408 | 409 | 429) => true,
            Some(s) => s >= 500,
            // No response: a connection error or a timeout, which the SDK retries.
            None => true,
        }
    };
    if retries >= MAX_RETRIES || !should {
        return None;
    }
    Some(
        match hint.filter(|h| !h.is_zero() && *h <= MAX_RETRY_AFTER) {
            Some(h) => h,
            None => {
                let base = (0.5 * 2f64.powi(retries as i32)).min(8.0);
                Duration::from_secs_f64(base * (1.0 - 0.25 * random.next_f64()))
            }
        },
    )
}

/// Why a LiteLLM-style call to one model group ended without a response head.
enum GroupError {
    /// The group's only deployment is cooling down ("no deployments available").
    CooledDown,
    /// The upstream's error, after the router's retries.
    Upstream(LlmError),
}

impl GroupError {
    fn label(&self) -> &'static str {
        match self {
            GroupError::CooledDown => "cooldown",
            GroupError::Upstream(e) => e.class().as_str(),
        }
    }
}

/// Policy 5: LiteLLM's Router emulated from its documented defaults (see [`Policy::explain`]):
/// one deployment per model group, each with its [`Cooldown`]; retries with the openai-python
/// rules inside a group; `fallbacks` to the backup provider's group after the retries, and
/// `context_window_fallbacks` to the larger-context model for a context-length error from
/// either provider's group, nested as the Router nests them.
pub(crate) fn litellm<S, B>(classified: S, seed: u64) -> impl AsyncFn(Request<Bytes>) -> Reading
where
    S: Service<Request<Bytes>, Response = Response<B>, Error = LlmError> + Clone,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let random = Arc::new(SeededRandom::new(seed));
    let cooldowns: Arc<Mutex<[Cooldown; 3]>> = Arc::default();
    let start = tokio::time::Instant::now();
    let group = async move |model: &'static str, mut req: Request<Bytes>| {
        let slot = match model {
            PRIMARY_MODEL => 0,
            BACKUP_MODEL => 1,
            _ => 2,
        };
        let _ = req.set_model(model);
        let mut retries = 0;
        loop {
            let now = start.elapsed();
            if !cooldowns
                .lock()
                .map(|c| c[slot].available(now))
                .unwrap_or(true)
            {
                return Err(GroupError::CooledDown);
            }
            let result = classified.clone().oneshot(req.clone()).await;
            let now = start.elapsed();
            let (failed, rate_limited) = match &result {
                Ok(_) => (false, false),
                Err(e) => (
                    counts_for_cooldown(e),
                    e.status().is_some_and(|s| s.as_u16() == 429),
                ),
            };
            if let Ok(mut c) = cooldowns.lock() {
                c[slot].record(now, failed, rate_limited);
            }
            let err = match result {
                Ok(resp) => return Ok(resp),
                Err(e) => e,
            };
            // A 429 cooled the group's only deployment down: nothing left to retry on.
            if rate_limited || err.class() == FailureClass::ContextLengthExceeded {
                return Err(GroupError::Upstream(err));
            }
            match openai_retry(&err, retries, &random) {
                Some(delay) => tokio::time::sleep(delay).await,
                None => return Err(GroupError::Upstream(err)),
            }
            retries += 1;
        }
    };
    // Fallbacks nest, as the Router's do: a fallback group's own failure goes through that
    // group's fallbacks in turn (its fallback handler calls itself for the fallback group),
    // never back to a group already tried. With three groups that is at most two levels, so
    // the Router's `max_fallbacks` (5) never binds here.
    async move |req: Request<Bytes>| {
        let mut model = PRIMARY_MODEL;
        let mut tried = Vec::with_capacity(3);
        loop {
            let err = match group(model, req.clone()).await {
                Ok(resp) => return read_to_end(resp.into_body()).await,
                Err(e) => e,
            };
            tried.push(model);
            let next = match &err {
                // `context_window_fallbacks`, set for each group as the Router's docs set it.
                GroupError::Upstream(e) if e.class() == FailureClass::ContextLengthExceeded => {
                    LARGE_MODEL
                }
                GroupError::Upstream(e) if e.class() == FailureClass::InvalidRequest => {
                    return Err(err.label());
                }
                // `fallbacks`: the primary's group only.
                _ if model == PRIMARY_MODEL => BACKUP_MODEL,
                _ => return Err(err.label()),
            };
            if tried.contains(&next) {
                return Err(err.label());
            }
            model = next;
        }
    }
}

/// What the seawall row needs beyond the scenario.
#[derive(Debug, Clone)]
pub(crate) struct SeawallSetup {
    /// The run's spend limit, enforced by the cost budget layer.
    pub(crate) budget: Usd,
    /// Concurrency permits of the gate.
    pub(crate) concurrency: usize,
    /// Time to first token before an attempt is abandoned and retried.
    pub(crate) first_token_timeout: Duration,
    /// Where the budget is counted: `None` in this process, else the fleet's store in Redis.
    pub(crate) budget_store: Option<RedisBudgetStore>,
    /// Whether the gate enforces the providers' rates itself (not when a fleet layer does).
    pub(crate) gate_rates: bool,
    /// The breaker's view shared with the fleet in Redis; `None`: this process's own.
    pub(crate) breaker_state: Option<RedisBreakerState>,
    /// Whether a `CacheLayer` (in memory) sits between observe and fallback (`--repeat`).
    pub(crate) cache: bool,
    /// Whether a `ContinueLayer` sits just outside fallback, as in the recommended stack: cut
    /// streams resumed (off for `--no-resume`'s extra run).
    pub(crate) resume: bool,
    /// Tokens of a stream that layer holds back, to ask a stream cut before them again
    /// (`--restart-within`; 0, the default, holds nothing).
    pub(crate) restart_within: u32,
}

impl SeawallSetup {
    /// One process's setup before the run's limit is known: no budget to speak of (the limit
    /// is set from the calm run), 200 permits (the demo sets one per client), the default 60 s
    /// to the first token, cut streams resumed, everything in memory.
    pub(crate) fn in_process() -> SeawallSetup {
        SeawallSetup {
            budget: Usd::from_dollars(1_000_000),
            concurrency: 200,
            first_token_timeout: Duration::from_secs(60),
            budget_store: None,
            breaker_state: None,
            gate_rates: true,
            cache: false,
            resume: true,
            restart_within: 0,
        }
    }
}

/// The providers' rate limits by the key seawall counts them under, for the gate or the fleet.
///
/// Each bucket holds a minute's worth, as the providers' buckets do (the mock's, like the
/// token bucket Anthropic documents, refills continuously up to its per-minute limit), rather
/// than the gate's default of ten seconds' worth, which is for a provider that enforces its
/// minute over shorter periods. A smaller bucket than the provider's only holds calls the
/// provider would have taken: past the backup's rate in a storm, the other rows' calls go
/// out at once while seawall's would wait in the gate.
pub(crate) fn provider_rates(scenario: &Scenario) -> [(String, Rates); 2] {
    let rates = |rpm: u32, tpm: u32| {
        let (rpm, tpm) = (u64::from(rpm), u64::from(tpm));
        Rates::new()
            .with_requests(Limit::per_minute(rpm).with_burst(rpm))
            .with_tokens(Limit::per_minute(tpm).with_burst(tpm))
    };
    [
        (
            format!("upstream/{PRIMARY_MODEL}"),
            rates(scenario.primary_rpm, scenario.primary_tpm),
        ),
        (
            format!("upstream/{BACKUP_MODEL}"),
            rates(scenario.backup_rpm, scenario.backup_tpm),
        ),
    ]
}

/// Policy 5: seawall's recommended stack, configured as a user with a backup provider would.
///
/// `fleet` sits just inside the gate: `Identity` for one process, a `FleetLimitLayer` for a
/// replica of the fleet run that shares the providers' rate limits in Redis.
pub(crate) fn seawall<T, B, F, FB>(
    transport: T,
    scenario: &Scenario,
    setup: &SeawallSetup,
    summary: Arc<Summary>,
    fleet: F,
) -> Result<impl AsyncFn(Request<Bytes>) -> Reading + use<T, B, F, FB>, String>
where
    T: Service<Request<Bytes>, Response = Response<B>> + Clone + Send + Sync + 'static,
    T::Error: Into<BoxError> + Send + Sync + 'static,
    T::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError> + Send + Sync + 'static,
    F: Layer<StreamTimeout<Classify<T>>>,
    F::Service: Service<Request<Bytes>, Response = Response<FB>, Error = LlmError>
        + Clone
        + Send
        + Sync
        + 'static,
    <F::Service as Service<Request<Bytes>>>::Future: Send + 'static,
    FB: Body<Data = Bytes> + Send + Unpin + 'static,
    FB::Error: Into<BoxError> + Send + Sync + 'static,
{
    let price = Price::per_million_f64(PRICE_IN, PRICE_OUT).map_err(|e| e.to_string())?;
    let prices = PriceTable::new()
        .with(PRIMARY_MODEL, price)
        .with(BACKUP_MODEL, price)
        .with(LARGE_MODEL, price);
    let mut budget =
        CostBudgetLayer::builder(prices).budget(Budget::total("storm-run", setup.budget));
    if let Some(store) = &setup.budget_store {
        budget = budget.store(store.clone());
    }
    let budget = budget.build().map_err(|e| e.to_string())?;
    let retry = BackoffRetryLayer::builder()
        .seed(scenario.seed ^ 0x05ea_3a11)
        .build()
        .map_err(|e| e.to_string())?;
    let mut breaker = seawall::breaker::CircuitBreakerLayer::builder()
        .random(SeededRandom::new(scenario.seed ^ 0x0b4e_a4e4));
    if let Some(state) = &setup.breaker_state {
        breaker = breaker.shared_state(state.clone());
    }
    let breaker = breaker.build().map_err(|e| e.to_string())?;
    let mut gate = ConcurrencyGateLayer::builder()
        .limit(setup.concurrency)
        .max_queue(10 * setup.concurrency)
        .max_wait(Duration::from_secs(30));
    if setup.gate_rates {
        for (key, rates) in provider_rates(scenario) {
            gate = gate.key_rates(key, rates);
        }
    }
    let gate = gate.build().map_err(|e| e.to_string())?;
    let timeouts = StreamTimeoutLayer::builder()
        .first_token(setup.first_token_timeout)
        .idle(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let fallback = FallbackLayer::builder()
        .target(Target::model(BACKUP_MODEL))
        .larger_context(Target::model(LARGE_MODEL))
        .build()
        .map_err(|e| e.to_string())?;
    // The models' windows as the user knows them: a prompt that cannot fit is refused before it
    // is sent, and the fallback's larger-context target takes it (whichever provider is down).
    let window = if scenario.long_prompts > 0.0 {
        CONTEXT_WINDOW
    } else {
        128_000
    };
    let guard = ContextGuardLayer::new(
        ContextWindows::new()
            .with(PRIMARY_MODEL, ModelLimits::new(window))
            .with(BACKUP_MODEL, ModelLimits::new(window))
            .with(LARGE_MODEL, ModelLimits::new(1_000_000)),
    );
    // With the cache, its answers and the stack's come in two body types: boxed to one.
    let cache = setup.cache.then(|| {
        ServiceBuilder::new()
            .map_response(box_response)
            .layer(CacheLayer::new(MemoryStore::new()))
            .into_inner()
    });
    // With resumption, the same: the continuation's body and the stack's boxed to one.
    let resume = setup.resume.then(|| {
        let layer = ContinueLayer::builder()
            .restart_within(setup.restart_within)
            .build()
            .expect("valid settings");
        ServiceBuilder::new()
            .map_response(box_response)
            .layer(layer)
            .into_inner()
    });
    let svc = ServiceBuilder::new()
        .layer(
            ObserveLayer::builder()
                .shared_recorder(summary)
                .build()
                .map_err(|e| e.to_string())?,
        )
        .option_layer(cache)
        .map_response(box_response)
        .option_layer(resume)
        .map_response(box_response)
        .layer(fallback)
        .layer(guard)
        .layer(retry)
        .layer(budget)
        .layer(breaker)
        .layer(gate)
        .layer(fleet)
        .layer(timeouts)
        .layer(ClassifyLayer::default())
        .service(transport);
    Ok(async move |req: Request<Bytes>| once(svc.clone(), req).await)
}

/// The transport behind the classifier, for policies 1-4.
pub(crate) fn classified<T>(transport: T) -> Classify<T> {
    ClassifyLayer::default().layer(transport)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn content_tokens_counts_the_words_of_text_deltas_joined_or_not() {
        let one =
            br#"data: {"choices":[{"index":0,"delta":{"content":" storm"},"finish_reason":null}]}"#;
        let role = br#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        // A continuation's held text comes as one delta of several words.
        let joined =
            br#"data: {"choices":[{"index":0,"delta":{"content":" the \"calm\" water"}}]}"#;
        assert_eq!(content_tokens(one), 1);
        assert_eq!(content_tokens(role), 0);
        assert_eq!(content_tokens(joined), 3);
        assert_eq!(content_tokens(&[one.as_slice(), joined].concat()), 4);
    }

    #[test]
    fn a_429_cools_a_deployment_down_for_five_seconds_at_once() {
        let mut c = Cooldown::default();
        c.record(S(10), true, true);
        assert!(!c.available(S(14)));
        assert!(c.available(S(15)));
    }

    #[test]
    fn failures_cool_a_deployment_down_only_past_half_of_five_calls_in_the_minute() {
        let mut c = Cooldown::default();
        // Four failures: too few calls to judge.
        for t in 0..4 {
            c.record(S(t), true, false);
        }
        assert!(c.available(S(4)));
        // The fifth: five calls, all failed.
        c.record(S(4), true, false);
        assert!(!c.available(S(5)));
        assert!(c.available(S(9)));
    }

    #[test]
    fn half_the_calls_failing_is_not_more_than_half() {
        let mut c = Cooldown::default();
        // Success, failure, ...: after the sixth call 3 of 6 failed.
        for t in 0..6 {
            c.record(S(t), t % 2 == 1, false);
        }
        assert!(c.available(S(6)));
    }

    #[test]
    fn the_failure_counts_start_again_each_minute() {
        let mut c = Cooldown::default();
        for t in 0..5 {
            c.record(S(t), false, false);
        }
        for t in 0..4 {
            c.record(S(50 + t), true, false);
        }
        // In the minute: 4 of 9 failed. The next minute: the first failure is one call.
        assert!(c.available(S(55)));
        c.record(S(61), true, false);
        assert!(c.available(S(61)));
    }

    /// What each model group answers in the router tests below.
    fn groups(
        answer: fn(&str) -> Result<&'static str, LlmError>,
    ) -> impl Service<
        Request<Bytes>,
        Response = Response<http_body_util::Full<Bytes>>,
        Error = LlmError,
        Future = impl Send,
    > + Clone {
        tower::service_fn(move |req: Request<Bytes>| {
            let body: serde_json::Value = serde_json::from_slice(req.body()).unwrap_or_default();
            let model = body["model"].as_str().unwrap_or_default().to_owned();
            let result = answer(&model).map(|text| {
                let sse =
                    format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n");
                Response::new(http_body_util::Full::new(Bytes::from(sse)))
            });
            std::future::ready(result)
        })
    }

    fn ask() -> Request<Bytes> {
        Request::post("/v1/chat/completions")
            .body(Bytes::from(format!(
                r#"{{"model":"{PRIMARY_MODEL}","messages":[{{"role":"user","content":"hi"}}]}}"#
            )))
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn the_router_sends_a_context_length_error_of_its_fallback_group_on_to_the_larger_model()
    {
        // The primary's key is out of quota; the backup's copy of the model is too small.
        let router = litellm(
            groups(|model| match model {
                PRIMARY_MODEL => Err(LlmError::new(FailureClass::QuotaExhausted, "quota")
                    .with_status(http::StatusCode::TOO_MANY_REQUESTS)),
                BACKUP_MODEL => Err(LlmError::new(FailureClass::ContextLengthExceeded, "long")
                    .with_status(http::StatusCode::BAD_REQUEST)),
                _ => Ok("answered by the larger model"),
            }),
            7,
        );
        assert_eq!(router(ask()).await.map(|r| r.tokens), Ok(5));
    }

    #[tokio::test(start_paused = true)]
    async fn the_router_falls_back_only_from_the_primarys_group_and_never_twice_to_one_group() {
        // The backup's own server error has no fallback of its own: the call fails with it.
        let router = litellm(
            groups(|model| match model {
                PRIMARY_MODEL => Err(LlmError::new(FailureClass::QuotaExhausted, "quota")
                    .with_status(http::StatusCode::TOO_MANY_REQUESTS)),
                BACKUP_MODEL => Err(LlmError::new(FailureClass::ServerError, "500")
                    .with_status(http::StatusCode::INTERNAL_SERVER_ERROR)),
                _ => Ok("never asked"),
            }),
            7,
        );
        assert_eq!(router(ask()).await.map(|r| r.tokens), Err("server_error"));
        // Every group too small: the larger model's own error ends it, no loop.
        let router = litellm(
            groups(|_| {
                Err(LlmError::new(FailureClass::ContextLengthExceeded, "long")
                    .with_status(http::StatusCode::BAD_REQUEST))
            }),
            7,
        );
        assert_eq!(
            router(ask()).await.map(|r| r.tokens),
            Err("context_length_exceeded")
        );
    }

    #[test]
    fn a_bad_request_does_not_count_against_a_deployment() {
        let e = LlmError::new(FailureClass::ContextLengthExceeded, "too long")
            .with_status(http::StatusCode::BAD_REQUEST);
        assert!(!counts_for_cooldown(&e));
        let e = LlmError::new(FailureClass::Overloaded, "busy")
            .with_status(http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(counts_for_cooldown(&e));
    }
}
