//! Deadlines that cannot overflow.
//!
//! `Instant + Duration` panics when the sum does not fit the platform's clock, and every
//! duration a user configures (a time budget, a maximum wait, a server hint honoured up to
//! `Duration::MAX`) ends up added to an `Instant` somewhere. A duration too long for the
//! clock can only mean "never", so layers compute deadlines with [`instant_after`], which
//! turns an overflow into a far-future instant instead of a panic in the middle of a call.

use std::time::Duration;

use tokio::time::Instant;

/// How far ahead "never" is: about 30 years, as tokio's own far future.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `start + d`, or, when that does not fit in an [`Instant`], a time about 30 years after
/// `start` (a deadline that never comes).
pub fn instant_after(start: Instant, d: Duration) -> Instant {
    start
        .checked_add(d)
        .or_else(|| start.checked_add(FAR_FUTURE))
        .unwrap_or(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_that_fits_is_added_exactly() {
        let now = Instant::now();
        assert_eq!(
            instant_after(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
    }

    proptest::proptest! {
        #[test]
        fn never_panics_and_never_goes_back(secs in proptest::prelude::any::<u64>(), nanos in 0u32..1_000_000_000) {
            let now = Instant::now();
            let d = Duration::new(secs, nanos);
            let at = instant_after(now, d);
            proptest::prop_assert!(at >= now);
            if d <= FAR_FUTURE {
                proptest::prop_assert_eq!(at, now + d);
            }
        }
    }
}
