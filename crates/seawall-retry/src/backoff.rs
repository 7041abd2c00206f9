//! Exponential backoff with jitter.
//!
//! The delay before retry `n` (0 for the first retry) has the ceiling
//! `min(max_delay, base * multiplier^n)`; the [`Jitter`] mode decides where under (or around)
//! that ceiling the actual delay falls. All arithmetic saturates at `max_delay`: no input makes
//! it panic or overflow.

use std::time::Duration;

use seawall_core::Random;

use seawall_core::ConfigError;

/// How a computed delay is randomised, so that clients failing together do not come back
/// together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Jitter {
    /// Uniform in `[0, ceiling]`. The default: it spreads a fleet the most and keeps the total
    /// work of a storm lowest (the server's own hint still wins when it gives one).
    #[default]
    Full,
    /// `ceiling / 2` plus uniform `[0, ceiling / 2]`: never shorter than half the ceiling.
    Equal,
    /// Uniform in `[base, previous * multiplier]`, capped at `max_delay`: each delay grows from
    /// the one before rather than from the retry number.
    Decorrelated,
    /// Exactly the ceiling. For tests and single clients only.
    None,
}

impl Jitter {
    /// A stable snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Jitter::Full => "full",
            Jitter::Equal => "equal",
            Jitter::Decorrelated => "decorrelated",
            Jitter::None => "none",
        }
    }
}

/// Exponential backoff: a base delay, a multiplier, a cap and a [`Jitter`] mode.
///
/// The default is full jitter under `min(8 s, 0.5 s * 2^n)`: the 0.5 s / 8 s curve is the
/// one the official OpenAI and Anthropic SDKs use, so providers' limiters are tuned for it,
/// and full jitter spreads a fleet that failed together.
///
/// ```
/// use std::time::Duration;
/// use seawall_core::SeededRandom;
/// use seawall_retry::{Backoff, Jitter};
///
/// let b = Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(10), Jitter::None)?;
/// let rng = SeededRandom::new(1);
/// let delays: Vec<_> = (0..5).map(|n| b.delay(n, Duration::ZERO, &rng).as_secs()).collect();
/// assert_eq!(delays, [1, 2, 4, 8, 10]);
/// # Ok::<(), seawall_retry::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    base: Duration,
    multiplier: f64,
    max: Duration,
    jitter: Jitter,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(500),
            multiplier: 2.0,
            max: Duration::from_secs(8),
            jitter: Jitter::Full,
        }
    }
}

impl Backoff {
    /// A backoff of `base * multiplier^n`, capped at `max_delay`.
    ///
    /// Fails when `multiplier` is not a finite number of at least 1, or `max_delay` is shorter
    /// than `base`.
    pub fn new(
        base: Duration,
        multiplier: f64,
        max_delay: Duration,
        jitter: Jitter,
    ) -> Result<Self, ConfigError> {
        if !multiplier.is_finite() || multiplier < 1.0 {
            return Err(ConfigError::new(
                "multiplier",
                format!("must be a finite number >= 1, got {multiplier}"),
            ));
        }
        if max_delay < base {
            return Err(ConfigError::new(
                "max_delay",
                format!("{max_delay:?} is shorter than the base delay ({base:?})"),
            ));
        }
        Ok(Backoff {
            base,
            multiplier,
            max: max_delay,
            jitter,
        })
    }

    /// The delay before the first retry, before jitter.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The growth factor per retry.
    pub fn multiplier(&self) -> f64 {
        self.multiplier
    }

    /// The longest computed delay.
    pub fn max_delay(&self) -> Duration {
        self.max
    }

    /// The jitter mode.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The delay before retry `retry` (0 for the first) without jitter:
    /// `min(max_delay, base * multiplier^retry)`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        if self.base.is_zero() {
            return Duration::ZERO;
        }
        // `powi` saturates to infinity, which `clamp_secs` turns into the cap.
        let exp = i32::try_from(retry).unwrap_or(i32::MAX);
        clamp_secs(
            self.base.as_secs_f64() * self.multiplier.powi(exp),
            self.max,
        )
    }

    /// The delay before retry `retry` (0 for the first), drawn from `random`.
    ///
    /// `previous` is the delay before the previous retry; only [`Jitter::Decorrelated`] reads
    /// it (pass `Duration::ZERO` for the first retry). The result is never above `max_delay`.
    pub fn delay(&self, retry: u32, previous: Duration, random: &dyn Random) -> Duration {
        let r = unit(random);
        match self.jitter {
            Jitter::None => self.ceiling(retry),
            Jitter::Full => {
                let c = self.ceiling(retry);
                clamp_secs(c.as_secs_f64() * r, c)
            }
            Jitter::Equal => {
                let c = self.ceiling(retry);
                let half = c.as_secs_f64() / 2.0;
                clamp_secs(half + half * r, c)
            }
            Jitter::Decorrelated => {
                let lo = self.base.min(self.max);
                let from = previous.max(self.base).as_secs_f64();
                let hi = clamp_secs(from * self.multiplier, self.max).max(lo);
                let lo_s = lo.as_secs_f64();
                clamp_secs(lo_s + (hi.as_secs_f64() - lo_s) * r, hi).max(lo)
            }
        }
    }
}

/// A draw from `random`, forced into `[0, 1]` whatever a user-supplied source returns.
pub(crate) fn unit(random: &dyn Random) -> f64 {
    let r = random.next_f64();
    if r.is_finite() {
        r.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// `secs` as a duration in `[0, max]`; NaN and negatives give zero, infinity gives `max`.
pub(crate) fn clamp_secs(secs: f64, max: Duration) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        Duration::ZERO
    } else if secs >= max.as_secs_f64() {
        max
    } else {
        Duration::from_secs_f64(secs).min(max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use seawall_core::SeededRandom;

    struct Fixed(f64);
    impl Random for Fixed {
        fn next_f64(&self) -> f64 {
            self.0
        }
    }

    #[test]
    fn ceiling_grows_and_saturates() {
        let b = Backoff::default();
        assert_eq!(b.ceiling(0), Duration::from_millis(500));
        assert_eq!(b.ceiling(3), Duration::from_secs(4));
        assert_eq!(b.ceiling(4), Duration::from_secs(8));
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(8));
        let zero = Backoff::new(Duration::ZERO, 3.0, Duration::ZERO, Jitter::Full).unwrap();
        assert_eq!(zero.ceiling(10_000), Duration::ZERO);
    }

    #[test]
    fn modes_at_the_extremes_of_the_draw() {
        let mk = |j| Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(30), j);
        let full = mk(Jitter::Full).unwrap();
        assert_eq!(full.delay(2, Duration::ZERO, &Fixed(0.0)), Duration::ZERO);
        assert_eq!(
            full.delay(2, Duration::ZERO, &Fixed(0.5)),
            Duration::from_secs(2)
        );
        let equal = mk(Jitter::Equal).unwrap();
        assert_eq!(
            equal.delay(2, Duration::ZERO, &Fixed(0.0)),
            Duration::from_secs(2)
        );
        assert_eq!(
            equal.delay(2, Duration::ZERO, &Fixed(1.0)),
            Duration::from_secs(4)
        );
        let dec = mk(Jitter::Decorrelated).unwrap();
        assert_eq!(
            dec.delay(0, Duration::ZERO, &Fixed(0.0)),
            Duration::from_secs(1)
        );
        assert_eq!(
            dec.delay(0, Duration::from_secs(5), &Fixed(1.0)),
            Duration::from_secs(10)
        );
        assert_eq!(
            dec.delay(0, Duration::from_secs(50), &Fixed(1.0)),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn hostile_random_sources_are_tamed() {
        let b = Backoff::default();
        for v in [f64::NAN, f64::INFINITY, -3.0, 7.0] {
            let d = b.delay(1, Duration::ZERO, &Fixed(v));
            assert!(d <= b.ceiling(1), "{v}: {d:?}");
        }
        let _ = b.delay(1, Duration::MAX, &SeededRandom::new(3));
    }

    #[test]
    fn bad_parameters_are_errors() {
        let s = Duration::from_secs(1);
        for m in [f64::NAN, f64::INFINITY, 0.5, -2.0] {
            assert!(Backoff::new(s, m, s, Jitter::Full).is_err(), "{m}");
        }
        let e = Backoff::new(s * 2, 2.0, s, Jitter::Full).unwrap_err();
        assert!(e.to_string().contains("shorter than the base"));
        assert_eq!(Jitter::Decorrelated.as_str(), "decorrelated");
    }
}
