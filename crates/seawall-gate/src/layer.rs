//! The gate's layer and its builder.

use std::sync::Arc;
use std::time::Duration;

use seawall_core::{ConfigError, PartEstimate, StateKey};
use tower_layer::Layer;

use crate::adaptive::Adaptive;
use crate::autosize::AutoSize;
use crate::config::{DEFAULT_LIMIT, check, default_settings};
use crate::handle::GateHandle;
use crate::lanes::{LANES, LaneShare, Priority};
use crate::rate::Rates;
use crate::service::ConcurrencyGate;
use crate::shared::{Settings, Shared};

/// Applies a [`ConcurrencyGate`]: shared concurrency permits, a bounded FIFO wait queue,
/// per-key request and token rates, pauses the upstream asks for, and an optional adaptive
/// limit.
///
/// The gate's state lives in the layer, so every service it makes (and every clone of those)
/// shares one set of permits, one queue and one table of keys. Build one layer per upstream
/// budget you want to protect and keep its [`handle`](Self::handle) to change it at run time.
///
/// ```
/// use std::time::Duration;
/// use seawall_gate::{Adaptive, ConcurrencyGateLayer, Rates};
///
/// let gate = ConcurrencyGateLayer::builder()
///     .limit(32)
///     .max_queue(500)
///     .max_wait(Duration::from_secs(10))
///     .rates(Rates::new().requests_per_minute(500).tokens_per_minute(200_000))
///     .adaptive(Adaptive::new())
///     .build()?;
/// assert_eq!(gate.handle().stats().limit, 32);
/// # Ok::<(), seawall_gate::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ConcurrencyGateLayer<K = StateKey> {
    shared: Arc<Shared>,
    key: K,
}

impl ConcurrencyGateLayer {
    /// A gate of `limit` permits with the default queue bound, wait and no rates.
    ///
    /// # Panics
    ///
    /// If `limit` is more than the gate can count (`tokio`'s semaphore maximum, about
    /// 2^61); use the [builder](Self::builder) to get that as an error.
    pub fn new(limit: usize) -> Self {
        Self::builder()
            .limit(limit)
            .build()
            .expect("a gate of this limit with the default settings is valid")
    }

    /// A builder with the defaults: limit [`DEFAULT_LIMIT`], queue [`DEFAULT_MAX_QUEUE`](crate::DEFAULT_MAX_QUEUE), wait
    /// [`DEFAULT_MAX_WAIT`](crate::DEFAULT_MAX_WAIT), no rates, no adaptive mode, keys from
    /// `LlmRequest::state_key`.
    pub fn builder() -> ConcurrencyGateBuilder {
        ConcurrencyGateBuilder {
            settings: default_settings(DEFAULT_LIMIT),
            key: StateKey,
        }
    }
}

impl<K> ConcurrencyGateLayer<K> {
    /// A handle to change the gate while it runs.
    pub fn handle(&self) -> GateHandle {
        GateHandle::new(self.shared.clone())
    }
}

impl<S, K: Clone> Layer<S> for ConcurrencyGateLayer<K> {
    type Service = ConcurrencyGate<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyGate::from_parts(inner, self.shared.clone(), self.key.clone())
    }
}

/// Builds a [`ConcurrencyGateLayer`].
#[derive(Debug, Clone)]
pub struct ConcurrencyGateBuilder<K = StateKey> {
    settings: Settings,
    key: K,
}

impl<K> ConcurrencyGateBuilder<K> {
    /// The concurrency limit (0 admits nothing until raised with the handle).
    pub fn limit(mut self, limit: usize) -> Self {
        self.settings.limit = limit;
        self
    }

    /// The maximum number of waiting calls; one more is rejected at once (0: never wait). With
    /// [lanes](Self::lane), each lane has this many places.
    pub fn max_queue(mut self, max: usize) -> Self {
        self.settings.max_queue = max;
        self
    }

    /// The maximum time a call waits for admission before it is rejected. A caller's
    /// [`Deadline`](seawall_core::Deadline) that comes first cuts it, and a call whose deadline
    /// ends its wait fails with `DeadlineExceeded` instead.
    pub fn max_wait(mut self, max: Duration) -> Self {
        self.settings.max_wait = max;
        self
    }

    /// The longest a call waits for its key's request or token rate, or for the upstream's
    /// pause, when a fallback target stands by for it (the request carries
    /// [`Standby`](seawall_core::Standby), as the fallback layer marks it). A call that would
    /// wait longer, counting the calls already in the key's line, is refused at once with
    /// [`RejectReason::Spilled`](crate::RejectReason::Spilled), and the fallback sends it to
    /// its next target: the backup's room is better than seconds in the primary's queue.
    /// The wait for a permit is not cut: permits are usually shared by every target.
    ///
    /// [`DEFAULT_STANDBY_WAIT`](crate::DEFAULT_STANDBY_WAIT) (1 s) by default; a wait at least
    /// the [maximum wait](Self::max_wait) holds these calls as any other.
    pub fn standby_wait(mut self, max: Duration) -> Self {
        self.settings.standby_wait = max;
        self
    }

    /// The longest pause an upstream signal can impose on a key.
    pub fn max_pause(mut self, max: Duration) -> Self {
        self.settings.max_pause = max;
        self
    }

    /// The rates of every key without rates of its own.
    pub fn rates(mut self, rates: Rates) -> Self {
        self.settings.rates = rates;
        self
    }

    /// The rates of one key (as the key function names it, `host/model` by default).
    pub fn key_rates(mut self, key: impl Into<Arc<str>>, rates: Rates) -> Self {
        self.settings.key_rates.push((key.into(), rates));
        self
    }

    /// Turns on the adaptive (AIMD) mode.
    pub fn adaptive(mut self, adaptive: Adaptive) -> Self {
        self.settings.adaptive = Some(adaptive);
        self
    }

    /// Turns on auto-sizing: the limit follows the upstream's rate limits times the observed
    /// latency, between the mode's minimum and maximum; [`limit`](Self::limit) is where it
    /// starts. [`AutoSize`] explains the rule.
    pub fn autosize(mut self, autosize: AutoSize) -> Self {
        self.settings.autosize = Some(autosize);
        self
    }

    /// How many keys keep their own state (idle ones are forgotten first; paused or rate-limited
    /// ones never, nor one a service remembers as the last key it called under); calls under
    /// further keys share the unkeyed state. Keys are also cut to
    /// [`MAX_KEY_LEN`](seawall_core::MAX_KEY_LEN) bytes. Protects memory when keys come from
    /// user input. Default [`DEFAULT_MAX_KEYS`](crate::DEFAULT_MAX_KEYS).
    pub fn max_keys(mut self, max: usize) -> Self {
        self.settings.max_keys = max;
        self
    }

    /// The tokens a request's images, audio parts and files count for in the token rates
    /// (default [`PartEstimate::DEFAULT`], whose documentation says how its figures were
    /// chosen).
    pub fn part_estimate(mut self, parts: PartEstimate) -> Self {
        self.settings.parts = parts;
        self
    }

    /// Turns on priority lanes and sets `priority`'s share (every lane not named keeps
    /// [`LaneShare::FULL`]). A call's lane comes from a [`Priority`] extension or the
    /// [`PRIORITY_HEADER`](crate::PRIORITY_HEADER); the rules (shares, borrowing, the order
    /// of the queue and its starvation bound) are in [`LaneShare`]'s documentation.
    ///
    /// ```
    /// use seawall_gate::{ConcurrencyGateLayer, LaneShare, Priority};
    /// // The batch lane may hold half the permits and half of each key's burst while
    /// // interactive calls are about; all of them while they are not.
    /// let gate = ConcurrencyGateLayer::builder()
    ///     .limit(16)
    ///     .lane(Priority::Batch, LaneShare { permits: 0.5, rate: 0.5 })
    ///     .build()?;
    /// # let _ = gate;
    /// # Ok::<(), seawall_gate::ConfigError>(())
    /// ```
    pub fn lane(mut self, priority: Priority, share: LaneShare) -> Self {
        let shares = self
            .settings
            .lanes
            .get_or_insert([LaneShare::FULL; LANES]);
        shares[priority.index()] = share;
        self
    }

    /// How long a lane counts as busy after its last call ended, holding other lanes to their
    /// shares (default [`DEFAULT_LANE_LINGER`](crate::DEFAULT_LANE_LINGER)). Only used with
    /// [`lane`](Self::lane).
    pub fn lane_linger(mut self, linger: Duration) -> Self {
        self.settings.lane_linger = linger;
        self
    }

    /// Computes each request's key with `key`, a [`KeyFn`](seawall_core::KeyFn), instead of
    /// `LlmRequest::state_key`.
    ///
    /// ```
    /// use seawall_gate::ConcurrencyGateLayer;
    /// // One key per provider host rather than per model.
    /// let gate = ConcurrencyGateLayer::builder()
    ///     .key_fn(|req: &http::Request<bytes::Bytes>| req.uri().host().map(str::to_owned))
    ///     .build()?;
    /// # let _ = gate;
    /// # Ok::<(), seawall_gate::ConfigError>(())
    /// ```
    pub fn key_fn<K2>(self, key: K2) -> ConcurrencyGateBuilder<K2> {
        ConcurrencyGateBuilder {
            settings: self.settings,
            key,
        }
    }

    /// Checks the settings and builds the layer. A limit above what the gate can count,
    /// a rate with a burst of 0 and adaptive settings out of range are refused, never clamped.
    pub fn build(self) -> Result<ConcurrencyGateLayer<K>, ConfigError> {
        check(&self.settings)?;
        Ok(ConcurrencyGateLayer {
            shared: Arc::new(Shared::new(self.settings)),
            key: self.key,
        })
    }
}
