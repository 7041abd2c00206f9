//! Runtime control of a gate.

use std::sync::Arc;
use std::time::Duration;

use seawall_core::ConfigError;

use crate::adaptive::Adaptive;
use crate::lanes::{LaneStats, Priority};
use crate::rate::Rates;
use crate::shared::{GateStats, Shared};

/// Changes a running gate: its concurrency limit, queue bound, maximum wait, rates and adaptive
/// mode, without rebuilding the stack. Cheap to clone; every clone controls the same gate.
///
/// ```
/// use std::time::Duration;
/// use seawall_gate::{ConcurrencyGateLayer, Rates};
///
/// let layer = ConcurrencyGateLayer::new(32);
/// let handle = layer.handle();
/// // During an incident: halve concurrency, stop queueing for long, slow down one model.
/// handle.set_limit(16);
/// handle.set_max_wait(Duration::from_secs(2));
/// handle.set_key_rates("api.openai.com/gpt-4o", Some(Rates::new().requests_per_minute(100)));
/// assert_eq!(handle.stats().limit, 16);
/// ```
#[derive(Clone, Debug)]
pub struct GateHandle {
    shared: Arc<Shared>,
}

impl GateHandle {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        GateHandle { shared }
    }

    /// Sets the concurrency limit (the adaptive mode's ceiling, and its current limit too).
    /// Raising it admits waiters at once; lowering it takes effect as calls in flight finish.
    /// Zero stops all admissions (waiters are rejected at their maximum wait).
    pub fn set_limit(&self, limit: usize) {
        self.shared.set_limit(limit);
    }

    /// The concurrency limit in force.
    pub fn limit(&self) -> usize {
        self.shared.stats().limit
    }

    /// Sets the maximum number of waiting calls (0: never wait, reject when no permit is free);
    /// per lane when the gate has lanes.
    pub fn set_max_queue(&self, max: usize) {
        self.shared.set_max_queue(max);
    }

    /// Sets the maximum wait of calls that arrive from now on.
    pub fn set_max_wait(&self, max: Duration) {
        self.shared.set_max_wait(max);
    }

    /// Sets the longest wait for a key's rate or pause of calls that a fallback target stands
    /// by for, from now on (see [`ConcurrencyGateBuilder::standby_wait`](crate::ConcurrencyGateBuilder::standby_wait)).
    pub fn set_standby_wait(&self, max: Duration) {
        self.shared.set_standby_wait(max);
    }

    /// Sets the longest pause an upstream signal (a `remaining = 0` window, a 429's hint) can
    /// impose on a key.
    pub fn set_max_pause(&self, max: Duration) {
        self.shared.set_max_pause(max);
    }

    /// Sets the rates of every key that has no rates of its own.
    pub fn set_rates(&self, rates: Rates) {
        self.shared.keys.set_default(rates);
    }

    /// Sets (or, with `None`, removes) the rates of one key.
    pub fn set_key_rates(&self, key: &str, rates: Option<Rates>) {
        self.shared.keys.set_for_key(key, rates);
    }

    /// The rates that apply to `key`.
    pub fn rates_for(&self, key: &str) -> Rates {
        self.shared.keys.rates_for(key)
    }

    /// The rates of keys without rates of their own.
    pub fn rates(&self) -> Rates {
        self.shared.keys.default_rates()
    }

    /// Pauses admissions for `key` (`None`: unkeyed requests) for `d`, as if the upstream had
    /// asked for it.
    pub fn pause_key(&self, key: Option<&str>, d: Duration) {
        self.shared.pause_key(key, d);
    }

    /// Turns the adaptive (AIMD) mode on with these settings, or off (restoring the configured
    /// limit). Settings the builder would refuse are refused here too, and change nothing.
    pub fn set_adaptive(&self, adaptive: Option<Adaptive>) -> Result<(), ConfigError> {
        if let Some(a) = &adaptive {
            a.check()?;
        }
        self.shared.set_adaptive(adaptive);
        Ok(())
    }

    /// The adaptive mode's settings, if it is on.
    pub fn adaptive(&self) -> Option<Adaptive> {
        self.shared.adaptive()
    }

    /// Counters and settings, now.
    pub fn stats(&self) -> GateStats {
        self.shared.stats()
    }

    /// Counters of one priority lane, now (a gate without lanes has every call in
    /// [`Priority::Interactive`]).
    pub fn lane_stats(&self, priority: Priority) -> LaneStats {
        self.shared.lane_stats(priority)
    }

    /// How many keys have their own state.
    pub fn keys(&self) -> usize {
        self.shared.keys.len()
    }
}
