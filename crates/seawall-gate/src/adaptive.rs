//! Adaptive concurrency: additive increase, multiplicative decrease (AIMD).

use seawall_core::ConfigError;

/// Settings of the adaptive mode, which lowers the concurrency limit when the upstream pushes
/// back and raises it again slowly.
///
/// - **Decrease**: a call that fails with `RateLimited` or `Overloaded` (as an error, or as the
///   error that ends its body) multiplies the limit by `decrease_factor` (default **0.7**, the
///   factor the AWS SDKs' adaptive retry mode uses for its send rate), rounded down, and by at
///   least 1, never below `min_limit` (default **1**).
/// - **One decrease per round trip**: a signal from a call admitted *before* the latest change
///   of the limit is ignored, so a wave of 429s answering one burst lowers the limit once, not
///   once per call (the rule TCP congestion control uses).
/// - **Increase**: after as many successful calls (body complete) as the current limit, the
///   limit grows by **1**, up to the configured limit (the ceiling set on the builder or with
///   [`GateHandle::set_limit`](crate::GateHandle::set_limit)). From a halved limit `L/2`, getting
///   back to `L` takes about `L²/8` successful calls.
///
/// ```
/// use seawall_gate::Adaptive;
/// let a = Adaptive::new().with_min_limit(2).with_decrease_factor(0.5);
/// assert_eq!(a.min_limit(), 2);
/// assert_eq!(a.decrease_factor(), 0.5);
/// // Out-of-range values are refused when the gate is built, never clamped.
/// let bad = Adaptive::new().with_decrease_factor(f64::NAN);
/// assert!(seawall_gate::ConcurrencyGateLayer::builder().adaptive(bad).build().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adaptive {
    min_limit: usize,
    decrease_factor: f64,
}

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive {
            min_limit: 1,
            decrease_factor: 0.7,
        }
    }
}

impl Adaptive {
    /// The defaults: factor 0.7, minimum 1.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the lowest limit a decrease goes to (at least 1; the gate's builder refuses 0).
    pub fn with_min_limit(mut self, n: usize) -> Self {
        self.min_limit = n;
        self
    }

    /// Sets the factor of a decrease, in `[0.1, 0.95]` (the gate's builder refuses other
    /// values and NaN).
    pub fn with_decrease_factor(mut self, f: f64) -> Self {
        self.decrease_factor = f;
        self
    }

    /// The lowest limit a decrease goes to.
    pub fn min_limit(&self) -> usize {
        self.min_limit
    }

    /// The factor of a decrease.
    pub fn decrease_factor(&self) -> f64 {
        self.decrease_factor
    }

    /// Refuses a minimum of 0 and a factor outside `[0.1, 0.95]`.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.min_limit == 0 {
            return Err(ConfigError::new(
                "adaptive",
                "the minimum limit must be at least 1",
            ));
        }
        if !(0.1..=0.95).contains(&self.decrease_factor) {
            return Err(ConfigError::new(
                "adaptive",
                format!(
                    "the decrease factor must be in [0.1, 0.95], got {}",
                    self.decrease_factor
                ),
            ));
        }
        Ok(())
    }

    /// The limit after a decrease from `limit`.
    pub(crate) fn decreased(&self, limit: usize) -> usize {
        let cut = (limit as f64 * self.decrease_factor).floor() as usize;
        cut.min(limit.saturating_sub(1))
            .max(self.min_limit)
            .min(limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decrease_steps() {
        let a = Adaptive::new();
        assert_eq!(a.decreased(10), 7);
        assert_eq!(a.decreased(2), 1);
        assert_eq!(a.decreased(1), 1);
        assert_eq!(a.with_min_limit(3).decreased(4), 3);
        assert_eq!(a.with_min_limit(3).decreased(2), 2, "never raises");
        assert_eq!(a.with_decrease_factor(0.95).decreased(10), 9);
    }

    #[test]
    fn out_of_range_settings_are_refused_not_clamped() {
        for bad in [
            Adaptive::new().with_decrease_factor(2.0),
            Adaptive::new().with_decrease_factor(0.05),
            Adaptive::new().with_decrease_factor(f64::NAN),
            Adaptive::new().with_min_limit(0),
        ] {
            let err = bad.check().unwrap_err();
            assert_eq!(err.field(), "adaptive", "{err}");
        }
        assert_eq!(
            Adaptive::new().with_decrease_factor(2.0).decrease_factor(),
            2.0
        );
        assert!(Adaptive::new().with_decrease_factor(0.95).check().is_ok());
        assert!(Adaptive::new().with_decrease_factor(0.1).check().is_ok());
    }
}
