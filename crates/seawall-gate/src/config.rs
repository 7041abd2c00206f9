//! The gate's defaults and the checks its builder runs, shared by the layer and by
//! [`ConcurrencyGate::new`](crate::ConcurrencyGate::new).

use std::time::Duration;

use seawall_core::{ConfigError, PartEstimate};

use crate::lanes::DEFAULT_LANE_LINGER;
use crate::permits::Permits;
use crate::rate::{Limit, Rates};
use crate::shared::Settings;

/// The default concurrency limit of [`ConcurrencyGateLayer::builder`](crate::ConcurrencyGateLayer::builder).
pub const DEFAULT_LIMIT: usize = 16;
/// The default maximum number of waiting calls.
pub const DEFAULT_MAX_QUEUE: usize = 1024;
/// The default maximum wait in the queue.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(30);
/// The default longest pause an upstream signal can impose on a key (Envoy ignores rate-limit
/// resets beyond 300 s too).
pub const DEFAULT_MAX_PAUSE: Duration = Duration::from_secs(300);
/// The default longest wait for a key's rate or pause of a call that a fallback target stands
/// by for ([`Standby`](seawall_core::Standby)); a longer wait sends it there at once.
pub const DEFAULT_STANDBY_WAIT: Duration = Duration::from_secs(1);
/// The default number of keys with their own state; more keys share the unkeyed state.
pub const DEFAULT_MAX_KEYS: usize = 1024;

/// The default settings, with `limit` permits.
pub(crate) fn default_settings(limit: usize) -> Settings {
    Settings {
        limit,
        max_queue: DEFAULT_MAX_QUEUE,
        max_wait: DEFAULT_MAX_WAIT,
        standby_wait: DEFAULT_STANDBY_WAIT,
        max_pause: DEFAULT_MAX_PAUSE,
        rates: Rates::new(),
        key_rates: Vec::new(),
        adaptive: None,
        autosize: None,
        max_keys: DEFAULT_MAX_KEYS,
        parts: PartEstimate::DEFAULT,
        lanes: None,
        lane_linger: DEFAULT_LANE_LINGER,
    }
}

/// Refuses what the gate would otherwise have to clamp.
pub(crate) fn check(s: &Settings) -> Result<(), ConfigError> {
    if s.limit > Permits::MAX {
        return Err(ConfigError::new(
            "limit",
            format!("must be at most {}, got {}", Permits::MAX, s.limit),
        ));
    }
    check_rates("rates", &s.rates)?;
    for (_, rates) in &s.key_rates {
        check_rates("key_rates", rates)?;
    }
    if let Some(a) = &s.adaptive {
        a.check()?;
    }
    if let Some(a) = &s.autosize {
        a.check(Permits::MAX)?;
    }
    for share in s.lanes.iter().flatten() {
        share.check()?;
    }
    Ok(())
}

fn check_rates(field: &'static str, rates: &Rates) -> Result<(), ConfigError> {
    let zero = |l: Option<Limit>| l.is_some_and(|l| l.configured_burst() == Some(0));
    if zero(rates.requests()) || zero(rates.tokens()) {
        return Err(ConfigError::new(field, "a burst must be at least 1"));
    }
    Ok(())
}
