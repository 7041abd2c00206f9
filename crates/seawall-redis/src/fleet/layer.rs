//! The fleet limit's layer and its builder.

use std::sync::Arc;
use std::time::Duration;

use seawall_core::{ConfigError, PartEstimate, StateKey};
use seawall_gate::{DEFAULT_MAX_KEYS, DEFAULT_MAX_PAUSE, Rates};
use tower_layer::Layer;

use super::keys::Limits;
use super::service::FleetLimit;
use super::state::{Fleet, Settings};
use crate::clock::{Clock, SystemClock};
use crate::{OnUnavailable, SharedRedis};

/// The default longest wait for the fleet's admission before a call is rejected.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(10);
/// The default lease of a fleet hold: how long the permits of a replica that died stay taken.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The default interval at which a replica renews the leases of its calls in flight.
pub const DEFAULT_RENEW_EVERY: Duration = Duration::from_secs(10);
/// The default interval at which a call waiting for a fleet permit asks again.
pub const DEFAULT_PERMIT_POLL: Duration = Duration::from_millis(25);

/// Applies a [`FleetLimit`]: a key's request and token rates, its upstream pauses and
/// (optionally) its concurrency permits, counted for the whole fleet in Redis.
///
/// The state lives in the layer: every service it makes, and every clone, shares one set of
/// loaded scripts, one in-process share and one lease renewer. Build one per replica (each
/// with the replica's [`SharedRedis`]); the replicas meet in Redis under the handle's prefix.
///
/// ```no_run
/// use std::time::Duration;
/// use seawall_gate::{ConcurrencyGateLayer, Rates};
/// use seawall_redis::{OnUnavailable, SharedRedis, fleet::FleetLimitLayer};
/// use tower::ServiceBuilder;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let redis = SharedRedis::new("redis://127.0.0.1:6379/")?;
/// let fleet = FleetLimitLayer::builder(redis)
///     .rates(Rates::new().requests_per_minute(500).tokens_per_minute(200_000))
///     .key_permits("vllm.internal/llama-3-70b", 32)
///     .on_unavailable(OnUnavailable::fail_open(4))
///     .build()?;
/// let stack = ServiceBuilder::new()
///     .layer(ConcurrencyGateLayer::new(16))
///     .layer(fleet);
/// # let _ = stack;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct FleetLimitLayer<K = StateKey> {
    fleet: Arc<Fleet>,
    key: K,
}

impl FleetLimitLayer {
    /// Fleet-wide `rates` for every key, on `redis`, with the defaults: no permits, fail
    /// closed, wait at most [`DEFAULT_MAX_WAIT`], keys from `LlmRequest::state_key`.
    ///
    /// Must be called inside a tokio runtime (settlements run as tasks of it). Never fails:
    /// the builder refuses only settings `new` does not take.
    pub fn new(redis: SharedRedis, rates: Rates) -> Self {
        Self::builder(redis)
            .rates(rates)
            .build()
            .expect("the default settings are valid")
    }

    /// A builder on `redis` with the defaults: no rates, no permits, fail closed (a default
    /// cannot know the fleet's size), max wait [`DEFAULT_MAX_WAIT`], max pause
    /// [`DEFAULT_MAX_PAUSE`], lease [`DEFAULT_LEASE`] renewed every [`DEFAULT_RENEW_EVERY`],
    /// the wall clock, keys from `LlmRequest::state_key`.
    pub fn builder(redis: SharedRedis) -> FleetLimitBuilder {
        FleetLimitBuilder {
            redis,
            clock: Arc::new(SystemClock),
            settings: Settings {
                limits: Limits::default(),
                on_unavailable: OnUnavailable::FailClosed,
                max_wait: DEFAULT_MAX_WAIT,
                max_pause: DEFAULT_MAX_PAUSE,
                lease: DEFAULT_LEASE,
                renew_every: Some(DEFAULT_RENEW_EVERY),
                permit_poll: DEFAULT_PERMIT_POLL,
                parts: PartEstimate::DEFAULT,
                max_keys: DEFAULT_MAX_KEYS,
            },
            key: StateKey,
        }
    }
}

impl<S, K: Clone> Layer<S> for FleetLimitLayer<K> {
    type Service = FleetLimit<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        FleetLimit::from_parts(inner, self.fleet.clone(), self.key.clone())
    }
}

/// Builds a [`FleetLimitLayer`].
#[derive(Clone, Debug)]
pub struct FleetLimitBuilder<K = StateKey> {
    redis: SharedRedis,
    clock: Arc<dyn Clock>,
    settings: Settings,
    key: K,
}

impl<K> FleetLimitBuilder<K> {
    /// The fleet-wide rates of every key without rates of its own (none by default). Use the
    /// provider's limits for the API key the fleet shares.
    pub fn rates(mut self, rates: Rates) -> Self {
        self.settings.limits.rates = rates;
        self
    }

    /// The fleet-wide rates of one key (as the key function names it, `host/model` by
    /// default).
    pub fn key_rates(mut self, key: impl Into<Arc<str>>, rates: Rates) -> Self {
        self.settings.limits.key_rates.insert(key.into(), rates);
        self
    }

    /// A fleet-wide concurrency limit for every key without one of its own (none by
    /// default): at most `permits` calls of a key in flight across the fleet.
    pub fn permits(mut self, permits: u32) -> Self {
        self.settings.limits.permits = Some(permits);
        self
    }

    /// A fleet-wide concurrency limit for one key, e.g. a self-hosted model server that takes
    /// 32 requests at a time in all.
    pub fn key_permits(mut self, key: impl Into<Arc<str>>, permits: u32) -> Self {
        self.settings
            .limits
            .key_permits
            .insert(key.into(), Some(permits));
        self
    }

    /// What to do when Redis does not answer in time (fail closed by default).
    pub fn on_unavailable(mut self, policy: OnUnavailable) -> Self {
        self.settings.on_unavailable = policy;
        self
    }

    /// The longest a call waits for the fleet's admission (a pause, a refill, a permit);
    /// a call that would wait longer is rejected at once. Zero: never wait.
    pub fn max_wait(mut self, max: Duration) -> Self {
        self.settings.max_wait = max;
        self
    }

    /// The longest pause an upstream signal can impose on a key.
    pub fn max_pause(mut self, max: Duration) -> Self {
        self.settings.max_pause = max;
        self
    }

    /// How long a hold lasts without renewal: the time a replica that died keeps its permits.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// How often the replica renews the leases of its calls in flight (must be shorter than
    /// the lease); `None` never renews, so a call that outlives its lease loses its permit.
    pub fn renew_every(mut self, every: Option<Duration>) -> Self {
        self.settings.renew_every = every;
        self
    }

    /// How often a call waiting for a fleet permit asks again.
    pub fn permit_poll(mut self, every: Duration) -> Self {
        self.settings.permit_poll = every;
        self
    }

    /// The tokens a request's images, audio parts and files count for, as in the gate.
    pub fn part_estimate(mut self, parts: PartEstimate) -> Self {
        self.settings.parts = parts;
        self
    }

    /// How many keys keep an in-process share of their own while Redis is unreachable.
    pub fn max_keys(mut self, max: usize) -> Self {
        self.settings.max_keys = max;
        self
    }

    /// The clock the buckets, pauses and leases are computed on (the wall clock by default;
    /// every replica must use the same origin).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Computes each request's key with `key`, a [`KeyFn`](seawall_core::KeyFn), instead of
    /// `LlmRequest::state_key`.
    pub fn key_fn<K2>(self, key: K2) -> FleetLimitBuilder<K2> {
        FleetLimitBuilder {
            redis: self.redis,
            clock: self.clock,
            settings: self.settings,
            key,
        }
    }

    /// Checks the settings and builds the layer. Zero permits, a zero lease or poll, a
    /// renewal not shorter than the lease are refused, never clamped.
    ///
    /// Must be called inside a tokio runtime (settlements and renewals run as its tasks).
    pub fn build(self) -> Result<FleetLimitLayer<K>, ConfigError> {
        let s = &self.settings;
        let zero_permits =
            s.limits.permits == Some(0) || s.limits.key_permits.values().any(|p| *p == Some(0));
        if zero_permits {
            return Err(ConfigError::new(
                "permits",
                "must be at least 1 (leave it unset for no concurrency limit)",
            ));
        }
        if s.lease.as_millis() == 0 {
            return Err(ConfigError::new("lease", "must be at least 1 ms"));
        }
        if s.renew_every.is_some_and(|r| r.is_zero() || r >= s.lease) {
            return Err(ConfigError::new(
                "renew_every",
                "must be more than zero and shorter than the lease",
            ));
        }
        if s.permit_poll.as_millis() == 0 {
            return Err(ConfigError::new("permit_poll", "must be at least 1 ms"));
        }
        Ok(FleetLimitLayer {
            fleet: Arc::new(Fleet::new(self.redis, self.clock, self.settings)),
            key: self.key,
        })
    }
}
