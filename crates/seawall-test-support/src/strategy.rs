//! The durations that break careless arithmetic (zero, one nanosecond, `Duration::MAX`, and
//! anything in between), for property tests that no configured duration panics a call.

use std::time::Duration;

use proptest::prelude::*;

/// Durations at and near the edges of what a `Duration` holds.
pub fn extreme_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(Duration::MAX),
        Just(Duration::from_secs(u64::MAX)),
        any::<u64>().prop_map(Duration::from_nanos),
        any::<u64>().prop_map(Duration::from_secs),
    ]
}

/// Durations at and near the edges of what a `Duration` holds, or none.
pub fn extreme_duration_or_none() -> impl Strategy<Value = Option<Duration>> {
    prop_oneof![
        Just(None),
        Just(Some(Duration::ZERO)),
        Just(Some(Duration::from_nanos(1))),
        Just(Some(Duration::MAX)),
        Just(Some(Duration::from_secs(u64::MAX))),
        any::<u64>().prop_map(|n| Some(Duration::from_nanos(n))),
        any::<u64>().prop_map(|s| Some(Duration::from_secs(s))),
    ]
}
