//! The seam through which a fleet of replicas shares its breakers' state
//! ([`SharedBreakerState`]), and what the breaker hands it ([`FleetLink`]).
//!
//! # Why the seam is shaped this way
//!
//! A breaker's whole point is to be cheap when the upstream is healthy, so sharing must not
//! put anything on the path of a call through a closed breaker: no I/O, no lookup in another
//! map, no call into the shared state. The seam is therefore turned around. The breaker does
//! not *ask* the shared state on each call; the shared state's own background task *tells* the
//! breakers what the fleet decided ([`FleetLink::open`], [`FleetLink::grant_probe`],
//! [`FleetLink::close`]), which changes each key's ordinary state word, the one every call
//! already reads. What a replica contributes goes the other way, also off the call path:
//!
//! - outcome counts, added to one packed counter per key (one `fetch_add` per counted call,
//!   only when sharing is on) and collected by the task ([`FleetLink::collect`]);
//! - state changes, handed to [`SharedBreakerState::on_state_change`] on the caller's task
//!   (rare; the implementation queues them and wakes its task).
//!
//! A key the fleet holds open does not go half-open by itself when its open period ends: a
//! call then marks it as *wanted*, and the key goes half-open only on the replica the fleet
//! grants the probe to. When the shared state cannot be reached the implementation calls
//! [`FleetLink::release_all`], and every key runs on its local state again.
//!
//! Without a shared state (the default), none of this exists: the breaker's cost is the same
//! as without the seam, but for one `Option` check when an outcome is counted.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use seawall_core::{ConfigError, bound_key};

use crate::registry::Shared;
use crate::state::{State, StateChange};
use crate::window::WindowKind;

/// State shared by the breakers of many replicas (e.g. on Redis), set with
/// [`CircuitBreakerBuilder::shared_state`](crate::CircuitBreakerBuilder::shared_state).
///
/// Nothing here runs per call. The implementation keeps its own background task, which
/// collects this replica's evidence through the [`FleetLink`] it is given, merges it with the
/// fleet's, and applies the fleet's decisions back through the link.
pub trait SharedBreakerState: Send + Sync + 'static {
    /// Starts sharing the breakers of a layer being built. Called once, by
    /// [`build`](crate::CircuitBreakerBuilder::build), whose error this is if it fails (e.g.
    /// no runtime to run a task on). The link does not keep the layer alive: once the layer,
    /// its services and handles are dropped, [`FleetLink::collect`] returns `None`.
    fn attach(&self, link: FleetLink) -> Result<(), ConfigError>;

    /// A local state change of one key, after its `tracing` event and the
    /// [`on_state_change`](crate::CircuitBreakerBuilder::on_state_change) callback. Runs on
    /// the caller's task: it must not block or do I/O. Changes the fleet itself caused have
    /// [`Reason::Shared`](crate::Reason::Shared).
    fn on_state_change(&self, change: &StateChange);

    /// How often the fleet's state is refreshed: the `retry_after` of a call refused because
    /// the fleet holds its key open past the open period (another replica is probing).
    fn interval(&self) -> Duration;
}

/// The breakers' settings the fleet applies to its shared evidence.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct FleetRules {
    /// Trip when failures make up at least this share of the calls (`None`: never).
    pub failure_rate: Option<f64>,
    /// Trip when slow calls make up at least this share of the calls (`None`: off).
    pub slow_call_rate: Option<f64>,
    /// The fewest calls before a rate can trip.
    pub minimum_calls: u32,
    /// The breaker's time window, if it has one (a count window has no duration).
    pub time_window: Option<Duration>,
    /// How long a key stays open after it trips (the first open period, before jitter).
    pub open_for: Duration,
    /// How long a probe may take: the longest a probe lease should last.
    pub max_probe_wait: Duration,
}

/// What one key of this replica has to tell the fleet, from [`FleetLink::collect`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyReport {
    /// The key.
    pub key: Arc<str>,
    /// The key's state now.
    pub state: State,
    /// Counted calls since the last collection.
    pub calls: u32,
    /// Failures among them.
    pub failures: u32,
    /// Slow calls among them.
    pub slow_calls: u32,
    /// Whether the fleet holds the key open here ([`FleetLink::open`]).
    pub held: bool,
    /// Whether a call found the key held open past its open period since the last
    /// collection: this replica has traffic to probe with.
    pub wants_probe: bool,
}

/// A layer's breakers, as its [`SharedBreakerState`] sees them. Cheap to clone; does not keep
/// the layer alive.
#[derive(Clone)]
pub struct FleetLink {
    shared: Weak<Shared>,
    rules: FleetRules,
}

impl FleetLink {
    pub(crate) fn new(shared: &Arc<Shared>) -> Self {
        let cfg = &shared.cfg;
        let rules = FleetRules {
            failure_rate: cfg.failure_rate,
            slow_call_rate: cfg.slow_threshold.map(|_| cfg.slow_rate),
            minimum_calls: cfg.minimum_calls,
            time_window: match cfg.window {
                WindowKind::Time(d) => Some(d),
                WindowKind::Count(_) => None,
            },
            open_for: cfg.open_base,
            max_probe_wait: cfg.max_probe_wait,
        };
        FleetLink {
            shared: Arc::downgrade(shared),
            rules,
        }
    }

    /// The breakers' settings.
    pub fn rules(&self) -> FleetRules {
        self.rules
    }

    /// Whether the layer is still in use (some layer, service or handle of it is alive).
    pub fn is_alive(&self) -> bool {
        self.shared.strong_count() > 0
    }

    /// Takes what each key has to tell the fleet since the last collection: the keys with
    /// counted calls, held open by the fleet, or wanting to probe. `None` once the layer is
    /// gone: the implementation's task should end.
    pub fn collect(&self) -> Option<Vec<KeyReport>> {
        let shared = self.shared.upgrade()?;
        let reports = shared
            .all()
            .into_iter()
            .filter_map(|b| {
                let (calls, failures, slow_calls) = b.take_evidence();
                let (held, wants_probe) = b.take_fleet_flags();
                (calls > 0 || held || wants_probe).then(|| KeyReport {
                    key: b.key().clone(),
                    state: b.state(),
                    calls,
                    failures,
                    slow_calls,
                    held,
                    wants_probe,
                })
            })
            .collect();
        Some(reports)
    }

    /// The fleet holds `key` open for `remaining` more (zero: its period is over but the
    /// probe is another replica's): a closed or half-open key opens (with
    /// [`Reason::Shared`](crate::Reason::Shared)), and the key stays open past then until
    /// [`grant_probe`](Self::grant_probe), [`close`](Self::close) or
    /// [`release_all`](Self::release_all). Creates the key's breaker if needed; manual modes
    /// are left alone.
    pub fn open(&self, key: &str, remaining: Duration) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let bounded = bound_key(key);
        let b = shared.breaker(&bounded);
        // At the key cap the lookup may answer with the overflow breaker: not this key's.
        if **b.key() == *bounded {
            b.fleet_open(remaining, shared.cfg.now());
        }
    }

    /// This replica holds the fleet's probe lease for `key`: if the fleet holds the key open
    /// here, it turns half-open and admits its probes.
    pub fn grant_probe(&self, key: &str) {
        if let Some(shared) = self.shared.upgrade() {
            if let Some(b) = shared.get(key) {
                b.fleet_probe(shared.cfg.now());
            }
        }
    }

    /// The fleet closed `key`: if the fleet held it open here, it closes.
    pub fn close(&self, key: &str) {
        if let Some(shared) = self.shared.upgrade() {
            if let Some(b) = shared.get(key) {
                b.fleet_close(shared.cfg.now());
            }
        }
    }

    /// The fleet's state cannot be read: every key runs on its local state again.
    pub fn release_all(&self) {
        if let Some(shared) = self.shared.upgrade() {
            for b in shared.all() {
                b.fleet_release();
            }
        }
    }
}

impl fmt::Debug for FleetLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetLink")
            .field("alive", &self.is_alive())
            .field("rules", &self.rules)
            .finish()
    }
}
