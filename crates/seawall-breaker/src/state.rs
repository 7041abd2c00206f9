//! The public vocabulary of the breaker: states, manual modes, verdicts, and state-change
//! events.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use seawall_core::FailureClass;

/// The state of one key's breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Calls pass and are counted.
    Closed,
    /// Calls are rejected with `CircuitOpen` until the open period ends.
    Open,
    /// A bounded number of probe calls pass; the rest are rejected.
    HalfOpen,
    /// Manually opened: every call is rejected until the mode is changed.
    ForcedOpen,
    /// Manually disabled: every call passes and nothing is counted.
    Disabled,
    /// Every call passes and is counted, but the breaker never trips.
    MetricsOnly,
}

impl State {
    pub(crate) const fn code(self) -> u64 {
        match self {
            State::Closed => 0,
            State::Open => 1,
            State::HalfOpen => 2,
            State::ForcedOpen => 3,
            State::Disabled => 4,
            State::MetricsOnly => 5,
        }
    }

    pub(crate) const fn from_code(code: u64) -> State {
        match code & 7 {
            1 => State::Open,
            2 => State::HalfOpen,
            3 => State::ForcedOpen,
            4 => State::Disabled,
            5 => State::MetricsOnly,
            _ => State::Closed,
        }
    }

    /// A stable snake_case name, for logs and metrics labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
            State::ForcedOpen => "forced_open",
            State::Disabled => "disabled",
            State::MetricsOnly => "metrics_only",
        }
    }

    /// Whether a manual mode (not the automatic state machine) set this state.
    pub const fn is_manual(self) -> bool {
        matches!(
            self,
            State::ForcedOpen | State::Disabled | State::MetricsOnly
        )
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mode set at run time through a [`BreakerHandle`](crate::BreakerHandle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The automatic state machine, starting from a fresh `Closed` state.
    Normal,
    /// Reject every call.
    ForcedOpen,
    /// Let every call through and count nothing.
    Disabled,
    /// Let every call through, count it, never trip.
    MetricsOnly,
}

impl Mode {
    pub(crate) const fn state(self) -> State {
        match self {
            Mode::Normal => State::Closed,
            Mode::ForcedOpen => State::ForcedOpen,
            Mode::Disabled => State::Disabled,
            Mode::MetricsOnly => State::MetricsOnly,
        }
    }
}

/// How an outcome counts for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// A success: counts as a call, resets the consecutive-failure streak.
    Success,
    /// A failure: counts as a call and against the thresholds.
    Failure,
    /// Neither: not a call at all (a 4xx, a rate limit, a cancellation, ...). It does not
    /// break a consecutive-failure streak either.
    Ignore,
}

/// Why a breaker changed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The failure rate of the window reached its threshold.
    FailureRate,
    /// The slow-call rate of the window reached its threshold.
    SlowCallRate,
    /// Too many failures in a row.
    ConsecutiveFailures,
    /// Half-open probes failed.
    ProbeFailed,
    /// Enough half-open probes succeeded.
    ProbesSucceeded,
    /// The open period ended; probes may go.
    OpenElapsed,
    /// An error carried a hint (retry-after, an exhausted rate-limit reset) to stay away
    /// until a given instant.
    RetryHint,
    /// A call ended in a class that opens the breaker at once
    /// ([`CircuitBreakerBuilder::open_at_once`](crate::CircuitBreakerBuilder::open_at_once); by
    /// default an exhausted quota).
    OpenAtOnce(FailureClass),
    /// A mode was set through the handle.
    Manual,
    /// The fleet's shared state said so (a [`SharedBreakerState`](crate::SharedBreakerState)):
    /// the fleet's evidence or another replica opened the key, this replica was granted the
    /// probe, or the fleet closed the key after another replica's probe succeeded.
    Shared,
}

impl Reason {
    /// A stable snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::FailureRate => "failure_rate",
            Reason::SlowCallRate => "slow_call_rate",
            Reason::ConsecutiveFailures => "consecutive_failures",
            Reason::ProbeFailed => "probe_failed",
            Reason::ProbesSucceeded => "probes_succeeded",
            Reason::OpenElapsed => "open_elapsed",
            Reason::RetryHint => "retry_hint",
            Reason::OpenAtOnce(_) => "open_at_once",
            Reason::Manual => "manual",
            Reason::Shared => "shared",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One state change of one key's breaker, as given to the
/// [`on_state_change`](crate::CircuitBreakerBuilder::on_state_change) callback.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateChange {
    /// The breaker's key.
    pub key: Arc<str>,
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
    /// Why.
    pub reason: Reason,
    /// For a change to `Open`: how long it stays open.
    pub open_for: Option<Duration>,
}

/// A read-only view of one key's breaker.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct KeySnapshot {
    /// The key.
    pub key: Arc<str>,
    /// The current state. An `Open` breaker whose period has ended turns `HalfOpen` at its
    /// next call; `retry_after` is then zero.
    pub state: State,
    /// Counted calls in the window.
    pub calls: u32,
    /// Failures in the window.
    pub failures: u32,
    /// Slow calls in the window.
    pub slow_calls: u32,
    /// The current streak of failures.
    pub consecutive_failures: u32,
    /// For `Open`: how long until the next probe is allowed.
    pub retry_after: Option<Duration>,
    /// For `HalfOpen`: probes now in flight.
    pub probes_in_flight: u32,
}

impl KeySnapshot {
    /// Failures over counted calls, if any call was counted.
    pub fn failure_rate(&self) -> Option<f64> {
        (self.calls > 0).then(|| f64::from(self.failures) / f64::from(self.calls))
    }

    /// Slow calls over counted calls, if any call was counted.
    pub fn slow_call_rate(&self) -> Option<f64> {
        (self.calls > 0).then(|| f64::from(self.slow_calls) / f64::from(self.calls))
    }
}
