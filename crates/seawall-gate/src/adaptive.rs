//! Adaptive concurrency: additive increase, multiplicative decrease (AIMD).

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
/// let a = Adaptive::new().min_limit(2).decrease_factor(0.5);
/// assert_eq!(a.get_min_limit(), 2);
/// assert_eq!(Adaptive::new().decrease_factor(f64::NAN).get_decrease_factor(), 0.7);
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

    /// The lowest limit a decrease goes to (at least 1).
    pub fn min_limit(mut self, n: usize) -> Self {
        self.min_limit = n.max(1);
        self
    }

    /// The factor of a decrease, clamped to `[0.1, 0.95]`; a NaN keeps the default.
    pub fn decrease_factor(mut self, f: f64) -> Self {
        if !f.is_nan() {
            self.decrease_factor = f.clamp(0.1, 0.95);
        }
        self
    }

    /// The lowest limit a decrease goes to.
    pub fn get_min_limit(&self) -> usize {
        self.min_limit
    }

    /// The factor of a decrease.
    pub fn get_decrease_factor(&self) -> f64 {
        self.decrease_factor
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
        assert_eq!(a.min_limit(3).decreased(4), 3);
        assert_eq!(a.min_limit(3).decreased(2), 2, "never raises");
        assert_eq!(a.decrease_factor(2.0).get_decrease_factor(), 0.95);
        assert_eq!(a.decrease_factor(0.95).decreased(10), 9);
    }
}
