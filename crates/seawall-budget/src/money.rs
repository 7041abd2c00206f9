//! [`Usd`]: money as whole nano-dollars, so every sum and comparison is exact.

use std::fmt;
use std::str::FromStr;

use seawall_core::ConfigError;

const NANOS_PER_DOLLAR: u64 = 1_000_000_000;

/// An amount of US dollars, held as a whole number of nano-dollars (10⁻⁹ USD).
///
/// Floating-point money drifts: a million additions of `0.000_037_5` do not sum to `37.5`.
/// The budget compares `spent + reserved + this call <= limit` at every admission, so the
/// counters must be exact; nano-dollars are fine enough for the cheapest models (a cached
/// token at $0.01 per million tokens is 0.01 nano-dollars, and a call's cost is rounded up to
/// the next nano-dollar once, after all its tokens are summed) and a `u64` still holds
/// $18 billion. All arithmetic saturates instead of wrapping.
///
/// ```
/// use seawall_budget::Usd;
/// let price: Usd = "2.50".parse().unwrap();
/// assert_eq!(price, Usd::from_cents(250));
/// assert_eq!(price.as_nanos(), 2_500_000_000);
/// assert_eq!(price.to_string(), "$2.50");
/// assert_eq!(Usd::from_f64(0.0375).unwrap().to_string(), "$0.0375");
/// assert!(Usd::from_f64(-1.0).is_err());
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Usd(u64);

impl Usd {
    /// Nothing.
    pub const ZERO: Usd = Usd(0);
    /// The largest amount.
    pub const MAX: Usd = Usd(u64::MAX);

    /// `n` nano-dollars.
    pub const fn from_nanos(n: u64) -> Usd {
        Usd(n)
    }

    /// `n` micro-dollars.
    pub const fn from_micros(n: u64) -> Usd {
        Usd(n.saturating_mul(1_000))
    }

    /// `n` cents.
    pub const fn from_cents(n: u64) -> Usd {
        Usd(n.saturating_mul(10_000_000))
    }

    /// `n` whole dollars.
    pub const fn from_dollars(n: u64) -> Usd {
        Usd(n.saturating_mul(NANOS_PER_DOLLAR))
    }

    /// Dollars from a float, rounded to the nearest nano-dollar. Negative, NaN, infinite or
    /// too large (over $18 billion) values are an error.
    pub fn from_f64(dollars: f64) -> Result<Usd, ConfigError> {
        if !dollars.is_finite() || dollars < 0.0 {
            return Err(ConfigError::new(
                "dollars",
                format!("{dollars} is not a valid amount (must be finite and not negative)"),
            ));
        }
        let nanos = (dollars * NANOS_PER_DOLLAR as f64).round();
        if nanos >= u64::MAX as f64 {
            return Err(ConfigError::new(
                "dollars",
                format!("{dollars} is too large"),
            ));
        }
        Ok(Usd(nanos as u64))
    }

    /// The amount in nano-dollars.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The amount in dollars, as a float (for display and reports, not for sums).
    pub fn as_f64(self) -> f64 {
        (self.0 / NANOS_PER_DOLLAR) as f64 + (self.0 % NANOS_PER_DOLLAR) as f64 / 1e9
    }

    /// `self + other`, saturating at [`Usd::MAX`].
    pub const fn saturating_add(self, other: Usd) -> Usd {
        Usd(self.0.saturating_add(other.0))
    }

    /// `self - other`, saturating at zero.
    pub const fn saturating_sub(self, other: Usd) -> Usd {
        Usd(self.0.saturating_sub(other.0))
    }

    /// `self * percent / 100`, rounded down.
    pub const fn percent(self, percent: u32) -> Usd {
        let v = self.0 as u128 * percent as u128 / 100;
        Usd(if v > u64::MAX as u128 {
            u64::MAX
        } else {
            v as u64
        })
    }
}

impl fmt::Display for Usd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / NANOS_PER_DOLLAR;
        let frac = self.0 % NANOS_PER_DOLLAR;
        let mut digits = format!("{frac:09}");
        while digits.len() > 2 && digits.ends_with('0') {
            digits.pop();
        }
        write!(f, "${whole}.{digits}")
    }
}

impl fmt::Debug for Usd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Usd({self})")
    }
}

impl FromStr for Usd {
    type Err = ConfigError;

    /// Parses a decimal amount exactly: `"2.50"`, `"$0.0375"`, `"15"`. At most nine decimal
    /// places; no sign, exponent or thousands separator.
    fn from_str(s: &str) -> Result<Usd, ConfigError> {
        let bad = || {
            ConfigError::new(
                "dollars",
                format!("{s:?} is not an amount of dollars like \"2.50\""),
            )
        };
        let t = s.trim();
        let t = t.strip_prefix('$').unwrap_or(t);
        let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
        if whole.is_empty() && frac.is_empty() {
            return Err(bad());
        }
        if !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        if frac.len() > 9 {
            return Err(ConfigError::new(
                "dollars",
                format!("{s:?} has more than nine decimal places"),
            ));
        }
        let whole: u64 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| bad())?
        };
        let mut nanos: u64 = 0;
        for (i, b) in frac.bytes().enumerate() {
            nanos += u64::from(b - b'0') * 10u64.pow(8 - i as u32);
        }
        whole
            .checked_mul(NANOS_PER_DOLLAR)
            .and_then(|w| w.checked_add(nanos))
            .map(Usd)
            .ok_or_else(|| ConfigError::new("dollars", format!("{s:?} is too large")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_are_exact() {
        for (text, nanos, shown) in [
            ("2.50", 2_500_000_000, "$2.50"),
            ("$0.0375", 37_500_000, "$0.0375"),
            ("15", 15_000_000_000, "$15.00"),
            (".5", 500_000_000, "$0.50"),
            ("0.000000001", 1, "$0.000000001"),
        ] {
            let u: Usd = text.parse().unwrap();
            assert_eq!(u.as_nanos(), nanos, "{text}");
            assert_eq!(u.to_string(), shown);
        }
    }

    #[test]
    fn bad_amounts_are_errors_not_panics() {
        for text in [
            "",
            ".",
            "-1",
            "1e3",
            "1,000",
            "0.0000000001",
            "99999999999999999999",
            "abc",
        ] {
            assert!(text.parse::<Usd>().is_err(), "{text}");
        }
        for f in [f64::NAN, f64::INFINITY, -0.5, 1e30] {
            assert!(Usd::from_f64(f).is_err(), "{f}");
        }
    }

    #[test]
    fn float_conversion_rounds_to_the_nano() {
        assert_eq!(Usd::from_f64(0.075).unwrap(), Usd::from_nanos(75_000_000));
        assert_eq!(Usd::from_f64(1e-10).unwrap(), Usd::ZERO);
        assert_eq!(Usd::from_cents(150).as_f64(), 1.5);
        assert_eq!(Usd::MAX.saturating_add(Usd::from_nanos(1)), Usd::MAX);
        assert_eq!(Usd::ZERO.saturating_sub(Usd::from_nanos(1)), Usd::ZERO);
        assert_eq!(Usd::from_dollars(1).percent(80), Usd::from_cents(80));
    }
}
