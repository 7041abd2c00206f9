//! The five client policies, each an async function from a request to an outcome: the call
//! and the reading of its streamed answer to the end.
//!
//! All five sit on the same transport behind seawall's `ClassifyLayer`, so every policy sees
//! the same upstream as the same statuses, hints and classes. Retries of policies 1-4 happen
//! before the response head, as in the SDK and the tower layers they stand for (a stream that
//! breaks after its head is final), except the naive loop, which retries the whole call.

use std::pin::pin;
use std::sync::Arc;
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
use seawall::observe::{ObserveLayer, Summary};
use seawall::redis::{RedisBreakerState, RedisBudgetStore};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::{StreamTimeout, StreamTimeoutLayer};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_resilience::bulkhead::{BulkheadLayer, BulkheadServiceError};
use tower_resilience::circuitbreaker::{CircuitBreakerError, CircuitBreakerLayer};
use tower_resilience::retry::RetryLayer;

use crate::scenario::{BACKUP_MODEL, PRICE_IN, PRICE_OUT, PRIMARY_MODEL, Scenario};

/// How a logical call ended: `Ok` when the whole answer arrived, else why not.
pub(crate) type Outcome = Result<(), &'static str>;

/// The policies, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    NoRetry,
    Naive,
    OpenAi,
    TowerResilience,
    Seawall,
}

impl Policy {
    pub(crate) const ALL: [Policy; 5] = [
        Policy::NoRetry,
        Policy::Naive,
        Policy::OpenAi,
        Policy::TowerResilience,
        Policy::Seawall,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Policy::NoRetry => "1 no retries",
            Policy::Naive => "2 naive 3x1s",
            Policy::OpenAi => "3 openai-python",
            Policy::TowerResilience => "4 tower-resilience",
            Policy::Seawall => "5 seawall",
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
                "as seawall's does) > bulkhead (200 calls, 1 s wait). Its FallbackLayer is not",
                "stacked: only seawall is given the backup provider",
            ],
            Policy::Seawall => &[
                "observe > fallback (to the backup provider) > retry > cost budget (the run's",
                "limit) > breaker > gate (200 permits, the providers' RPM/TPM) > stream timeouts",
                "(first token 8 s, idle 10 s) > classify; every other setting at its default",
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
        if req.model() == Some(BACKUP_MODEL) {
            self.backup.call(req)
        } else {
            self.primary.call(req)
        }
    }
}

/// Reads a body to its end; its first error is the outcome.
pub(crate) async fn read_to_end<B>(body: B) -> Outcome
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = pin!(body);
    while let Some(frame) = body.frame().await {
        if let Err(e) = frame {
            return Err(class_of(e.into()));
        }
    }
    Ok(())
}

fn class_of(e: BoxError) -> &'static str {
    LlmError::from_boxed(e).class().as_str()
}

/// Sends one request through `svc` and reads the answer.
async fn once<S, B>(svc: S, req: Request<Bytes>) -> Outcome
where
    S: Service<Request<Bytes>, Response = Response<B>, Error = LlmError>,
    B: Body,
    B::Error: Into<BoxError>,
{
    match svc.oneshot(req).await {
        Ok(resp) => read_to_end(resp.into_body()).await,
        Err(e) => Err(e.class().as_str()),
    }
}

/// Policy 1: no retries.
pub(crate) fn no_retry<S, B>(classified: S) -> impl AsyncFn(Request<Bytes>) -> Outcome
where
    S: Service<Request<Bytes>, Response = Response<B>, Error = LlmError> + Clone,
    B: Body,
    B::Error: Into<BoxError>,
{
    async move |req| once(classified.clone(), req).await
}

/// Policy 2, naive: retry every error (the stream's too), three times, after a fixed second.
pub(crate) fn naive<S, B>(classified: S) -> impl AsyncFn(Request<Bytes>) -> Outcome
where
    S: Service<Request<Bytes>, Response = Response<B>, Error = LlmError> + Clone,
    B: Body,
    B::Error: Into<BoxError>,
{
    async move |req: Request<Bytes>| {
        let mut last = Ok(());
        for attempt in 0..4 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            last = once(classified.clone(), req.clone()).await;
            if last.is_ok() {
                break;
            }
        }
        last
    }
}

/// Policy 3: the openai-python SDK's retry rules (v1.x `_base_client.py`).
pub(crate) fn openai<S, B>(classified: S, seed: u64) -> impl AsyncFn(Request<Bytes>) -> Outcome
where
    S: Service<Request<Bytes>, Response = Response<B>, Error = LlmError> + Clone,
    B: Body,
    B::Error: Into<BoxError>,
{
    const MAX_RETRIES: u32 = 2;
    const MAX_RETRY_AFTER: Duration = Duration::from_secs(120);
    let random = Arc::new(SeededRandom::new(seed));
    async move |req: Request<Bytes>| {
        let mut retries = 0;
        loop {
            let err = match classified.clone().oneshot(req.clone()).await {
                // Once the head is in, the SDK returns the stream: nothing after it is retried.
                Ok(resp) => return read_to_end(resp.into_body()).await,
                Err(e) => e,
            };
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
                return Err(err.class().as_str());
            }
            let delay = match hint.filter(|h| !h.is_zero() && *h <= MAX_RETRY_AFTER) {
                Some(h) => h,
                None => {
                    let base = (0.5 * 2f64.powi(retries as i32)).min(8.0);
                    Duration::from_secs_f64(base * (1.0 - 0.25 * random.next_f64()))
                }
            };
            tokio::time::sleep(delay).await;
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

/// Policy 4: tower-resilience, stacked and configured as its composition guide recommends for a
/// client of an external API: retry outside the circuit breaker (and not retrying the
/// breaker's own rejections), the breaker outside a bulkhead.
pub(crate) fn tower_resilience<S, B>(
    classified: S,
    concurrency: usize,
) -> Result<impl AsyncFn(Request<Bytes>) -> Outcome, String>
where
    S: Service<Request<Bytes>, Response = Response<B>, Error = LlmError> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Error: Into<BoxError>,
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
    let svc = ServiceBuilder::new()
        .layer(retry)
        .layer(breaker)
        .layer(bulkhead)
        .service(classified);
    Ok(
        async move |req: Request<Bytes>| match svc.clone().oneshot(req).await {
            Ok(resp) => read_to_end(resp.into_body()).await,
            Err(CircuitBreakerError::OpenCircuit) => Err("circuit_open"),
            Err(CircuitBreakerError::Inner(BulkheadServiceError::Bulkhead(_))) => {
                Err("bulkhead_full")
            }
            Err(CircuitBreakerError::Inner(BulkheadServiceError::Inner(e))) => {
                Err(e.class().as_str())
            }
        },
    )
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
    /// Whether a `ContinueLayer` sits just outside fallback (`--resume`): cut streams resumed.
    pub(crate) resume: bool,
}

impl SeawallSetup {
    /// One process's setup before the run's limit is known: no budget to speak of (the limit
    /// is set from the calm run), 200 permits, 8 s to the first token, everything in memory.
    pub(crate) fn in_process() -> SeawallSetup {
        SeawallSetup {
            budget: Usd::from_dollars(1_000_000),
            concurrency: 200,
            first_token_timeout: Duration::from_secs(8),
            budget_store: None,
            breaker_state: None,
            gate_rates: true,
            cache: false,
            resume: false,
        }
    }
}

/// The providers' rate limits by the key seawall counts them under, for the gate or the fleet.
pub(crate) fn provider_rates(scenario: &Scenario) -> [(String, Rates); 2] {
    let rates = |rpm: u32, tpm: u32| {
        let (rpm, tpm) = (u64::from(rpm), u64::from(tpm));
        if scenario.minute_buckets {
            Rates::new()
                .with_requests(Limit::per_minute(rpm).with_burst(rpm))
                .with_tokens(Limit::per_minute(tpm).with_burst(tpm))
        } else {
            Rates::new().requests_per_minute(rpm).tokens_per_minute(tpm)
        }
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
) -> Result<impl AsyncFn(Request<Bytes>) -> Outcome + use<T, B, F, FB>, String>
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
        .with(BACKUP_MODEL, price);
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
        .build()
        .map_err(|e| e.to_string())?;
    // With the cache, its answers and the stack's come in two body types: boxed to one.
    let cache = setup.cache.then(|| {
        ServiceBuilder::new()
            .map_response(box_response)
            .layer(CacheLayer::new(MemoryStore::new()))
            .into_inner()
    });
    // With resumption, the same: the continuation's body and the stack's boxed to one.
    let resume = setup.resume.then(|| {
        ServiceBuilder::new()
            .map_response(box_response)
            .layer(ContinueLayer::new())
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
