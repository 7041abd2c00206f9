//! The retry layer's configuration: the policy, the budget and the jitter source that every
//! service made by one layer shares, and the builder that checks them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use seawall_core::{ConfigError, Dispositions, FailureClass, Random, SeededRandom};
use tower_layer::Layer;

use crate::backoff::{Backoff, Jitter};
use crate::budget::RetryBudget;
use crate::config::Settings;
use crate::handle::RetryHandle;
use crate::policy::Shared;
use crate::service::BackoffRetry;

/// The conventional `Idempotency-Key` header name, for
/// [`BackoffRetryBuilder::idempotency_key`].
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Applies classified retries to a service: see the [crate docs](crate).
///
/// Every service this layer makes shares one retry budget, one runtime switch
/// ([`handle`](Self::handle)) and one jitter source.
///
/// ```
/// use std::time::Duration;
/// use seawall_core::{FailureClass, LlmError};
/// use seawall_retry::BackoffRetryLayer;
/// use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
///
/// # #[derive(Clone)] struct Ask;
/// # impl seawall_core::LlmRequest for Ask {
/// #     fn model(&self) -> Option<&str> { None }
/// #     fn max_output_tokens(&self) -> Option<u32> { None }
/// #     fn estimated_input_tokens(&self) -> u32 { 0 }
/// # }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = BackoffRetryLayer::builder()
///     .max_attempts(3) // the first call and two retries
///     .time_budget(Duration::from_secs(60))
///     .build()?;
/// let handle = layer.handle(); // flip retries off at run time, for every clone
///
/// let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
/// let counter = calls.clone();
/// let upstream = service_fn(move |_: Ask| {
///     let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
///     async move {
///         if n == 0 {
///             // What a classifier makes of a 503.
///             Err(LlmError::new(FailureClass::Overloaded, "busy")
///                 .with_status(http::StatusCode::SERVICE_UNAVAILABLE))
///         } else {
///             Ok("hello")
///         }
///     }
/// });
/// let mut svc = ServiceBuilder::new().layer(layer).service(upstream);
/// let start = tokio::time::Instant::now();
/// let answer = svc.ready().await?.call(Ask).await?;
/// assert_eq!(answer, "hello");
/// // An overload waits at least the 5 s minimum (plus up to 10% jitter).
/// assert!(start.elapsed() >= Duration::from_secs(5));
/// assert_eq!(handle.retries(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct BackoffRetryLayer {
    shared: Arc<Shared>,
}

impl BackoffRetryLayer {
    /// A layer with every default (see the [crate docs](crate#defaults)).
    pub fn new() -> Self {
        BackoffRetryBuilder::new()
            .build()
            .expect("the default configuration is valid")
    }

    /// A builder to change the defaults.
    pub fn builder() -> BackoffRetryBuilder {
        BackoffRetryBuilder::new()
    }

    /// The runtime switch and counters, shared with every service this layer made or will make.
    pub fn handle(&self) -> RetryHandle {
        RetryHandle::new(self.shared.clone())
    }

    /// The shared retry budget, if there is one.
    pub fn retry_budget(&self) -> Option<&Arc<RetryBudget>> {
        self.shared.budget.as_ref()
    }

    /// The state the layer's services share, for the decision's unit tests.
    #[cfg(test)]
    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}

impl Default for BackoffRetryLayer {
    fn default() -> Self {
        Self::new()
    }
}

/// Wrapping a service clones it once, for the retries' [spare](seawall_core::Spare).
impl<S: Clone> Layer<S> for BackoffRetryLayer {
    type Service = BackoffRetry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BackoffRetry::from_shared(inner, self.shared.clone())
    }
}

impl fmt::Debug for BackoffRetryLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackoffRetryLayer")
            .field("shared", &self.shared)
            .finish()
    }
}

/// Builds a [`BackoffRetryLayer`]; every setter has a default, and [`build`](Self::build)
/// checks the values.
pub struct BackoffRetryBuilder {
    settings: Settings,
}

impl BackoffRetryBuilder {
    fn new() -> Self {
        BackoffRetryBuilder {
            settings: Settings::default(),
        }
    }

    /// The most upstream calls per logical call, **the first call included** (default 4: one
    /// call and up to three retries). `1` turns retries off. Per-class maximums apply too.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.settings.max_attempts = attempts;
        self
    }

    /// The most retries after failures of `class` within one logical call (defaults: rate
    /// limits 2, overloads 3, server errors 2, upstream timeouts and lost connections 1 (and
    /// only for idempotent requests), connect failures 3, other classes 2 when the server's
    /// `x-should-retry: true` asks for a retry). Local classes are never retried. At most 255
    /// ([`build`](Self::build) refuses more).
    pub fn max_retries(mut self, class: FailureClass, retries: u32) -> Self {
        self.settings.max_retries[class.index()] = retries;
        self
    }

    /// Which classes may be retried (default: the failure-class table, [`Dispositions::default`]).
    pub fn dispositions(mut self, dispositions: Dispositions) -> Self {
        self.settings.dispositions = dispositions;
        self
    }

    /// The delay before the first retry, before jitter (default 0.5 s).
    pub fn base_delay(mut self, base: Duration) -> Self {
        self.settings.base = base;
        self
    }

    /// The growth of the delay per retry (default 2.0; at least 1).
    pub fn multiplier(mut self, multiplier: f64) -> Self {
        self.settings.multiplier = multiplier;
        self
    }

    /// The longest computed delay (default 8 s). Server hints have their own cap.
    pub fn max_delay(mut self, max: Duration) -> Self {
        self.settings.max_delay = max;
        self
    }

    /// The jitter mode (default [`Jitter::Full`]).
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.settings.jitter = jitter;
        self
    }

    /// Sets base, multiplier, cap and jitter at once.
    pub fn backoff(self, backoff: Backoff) -> Self {
        self.base_delay(backoff.base())
            .multiplier(backoff.multiplier())
            .max_delay(backoff.max_delay())
            .jitter(backoff.jitter())
    }

    /// The longest server-requested delay honoured (default 60 s, as anthropic-python and most
    /// gateways). A longer hint fails the call at once with the hint in the error.
    pub fn max_server_hint(mut self, max: Duration) -> Self {
        self.settings.max_hint = max;
        self
    }

    /// The random extra added to a server hint and to the overload minimum, as a fraction of
    /// it (default 0.1: up to +10%). Only ever added, so a hint is never cut short.
    pub fn hint_jitter(mut self, fraction: f64) -> Self {
        self.settings.hint_jitter = fraction;
        self
    }

    /// The least wait after an overload (503 / 529) when the server gave no hint (default
    /// 5 s, plus the hint jitter): an overloaded upstream needs seconds, not milliseconds.
    pub fn overload_min_delay(mut self, min: Duration) -> Self {
        self.settings.overload_min = min;
        self
    }

    /// The longest wait before a retry when a fallback stands by for the request (off by
    /// default). A `FallbackLayer` outside marks the requests it has a next target for
    /// ([`seawall_core::Standby`]); with this set, when such a request's next retry would wait
    /// longer (an overload's 5 s minimum, a `Retry-After` of seconds), the layer gives up at
    /// once ([`GiveUp::Standby`](seawall_core::GiveUp::Standby)) and the fallback answers
    /// instead of the wait. Unmarked requests (no fallback, or the chain's last target) wait
    /// as before; `Duration::MAX` turns it off again.
    ///
    /// Off by default because it trades spend for latency: in the storm demo at 1 s it lowered
    /// seawall's P95 and P99 in most seeds and its loopback P99 by a quarter, and it sent more
    /// calls to the backup, whose share of cut streams then decided the waste goal against
    /// seawall in more seeds (BENCHMARKS.md, section 5).
    pub fn standby_wait(mut self, max: Duration) -> Self {
        self.settings.standby_wait = max;
        self
    }

    /// The total time budget of a logical call: every attempt (up to its response, i.e. the
    /// commit point) and every wait (default 120 s). No wait crosses it, and an attempt in
    /// flight when it runs out is cancelled.
    pub fn time_budget(mut self, budget: Duration) -> Self {
        self.settings.time_budget = Some(budget);
        self
    }

    /// No total time budget: attempts and waits are bounded only by the caps.
    pub fn no_time_budget(mut self) -> Self {
        self.settings.time_budget = None;
        self
    }

    /// The retry budget shared by every service of this layer (default
    /// [`RetryBudget::default`]).
    pub fn retry_budget(self, budget: RetryBudget) -> Self {
        self.shared_retry_budget(Arc::new(budget))
    }

    /// A retry budget shared with other layers too (a primary and a fallback path, say).
    pub fn shared_retry_budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.settings.budget = Some(budget);
        self
    }

    /// No retry budget: only the per-call caps limit retries.
    pub fn no_retry_budget(mut self) -> Self {
        self.settings.budget = None;
        self
    }

    /// Adds a random key header (a v4 UUID) to requests that do not have one, generated once
    /// per logical call and sent unchanged with every attempt, so the upstream can deduplicate
    /// (off by default; [`IDEMPOTENCY_KEY`] is the usual name). For HTTP requests the
    /// `idempotency-key` header also marks the request idempotent.
    pub fn idempotency_key(mut self, header: HeaderName) -> Self {
        self.settings.idempotency_header = Some(header);
        self
    }

    /// Sets a header to the attempt number (1 for the first call) on every attempt (off by
    /// default).
    pub fn attempt_header(mut self, header: HeaderName) -> Self {
        self.settings.attempt_header = Some(header);
        self
    }

    /// The jitter source (default: [`SeededRandom::from_entropy`]).
    pub fn random(mut self, random: impl Random) -> Self {
        self.settings.random = Some(Arc::new(random));
        self
    }

    /// A reproducible jitter source: [`SeededRandom::new(seed)`](SeededRandom::new).
    /// Idempotency keys never come from it.
    pub fn seed(self, seed: u64) -> Self {
        self.random(SeededRandom::new(seed))
    }

    /// Checks the values and builds the layer.
    pub fn build(self) -> Result<BackoffRetryLayer, ConfigError> {
        Ok(BackoffRetryLayer {
            shared: Arc::new(self.settings.into_shared()?),
        })
    }
}

impl fmt::Debug for BackoffRetryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackoffRetryBuilder")
            .field("max_attempts", &self.settings.max_attempts)
            .field("base", &self.settings.base)
            .field("multiplier", &self.settings.multiplier)
            .field("max_delay", &self.settings.max_delay)
            .field("jitter", &self.settings.jitter)
            .field("max_hint", &self.settings.max_hint)
            .field("time_budget", &self.settings.time_budget)
            .finish_non_exhaustive()
    }
}
