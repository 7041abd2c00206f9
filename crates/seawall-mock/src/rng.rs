//! Sampling helpers over a plain (unshared) SplitMix64 generator.
//!
//! The upstream draws per-request seeds from one shared [`seawall_core::SeededRandom`]; each
//! stream then owns a [`Rng`] seeded from it, so its per-token latencies do not depend on how
//! other streams interleave.

use std::time::Duration;

use crate::profile::{Count, Delay};

/// FNV-1a of some bytes, continuing from `h` (start from [`FNV_START`]): a text's stable
/// fingerprint, the same on every platform and Rust release.
pub(crate) fn fnv1a(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// FNV-1a's offset basis.
pub(crate) const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// SplitMix64, owned by one stream or one request.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p` (never draws when `p` is 0 or 1, so adding a fault with
    /// probability 0 does not shift the sequence).
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            false
        } else if p >= 1.0 {
            true
        } else {
            self.next_f64() < p
        }
    }

    /// Uniform in `[0, n)`; `n` must be positive.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((self.next_f64() * n as f64) as usize).min(n - 1)
    }

    pub(crate) fn count(&mut self, c: Count) -> u32 {
        if c.min >= c.max {
            c.min
        } else {
            let span = u64::from(c.max - c.min) + 1;
            c.min + (self.next_u64() % span) as u32
        }
    }

    /// A standard normal draw (Box-Muller).
    fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    pub(crate) fn delay(&mut self, d: &Delay) -> Duration {
        let mut total = d.fixed;
        if let Some((lo, hi)) = d.uniform {
            total = total
                .saturating_add(lo.saturating_add(hi.saturating_sub(lo).mul_f64(self.next_f64())));
        }
        if let Some(l) = d.lognormal {
            let factor = (l.sigma * self.normal()).exp();
            // Capped at a day: a draw from the far tail must not overflow.
            total = total.saturating_add(
                Duration::try_from_secs_f64(l.median.as_secs_f64() * factor)
                    .unwrap_or(Duration::from_secs(86_400))
                    .min(Duration::from_secs(86_400)),
            );
        }
        match d.max {
            Some(max) => total.min(max),
            None => total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_stay_in_range_and_cover_it() {
        let mut r = Rng::new(3);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let n = r.count(Count::range(10, 14));
            assert!((10..=14).contains(&n));
            seen[(n - 10) as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
        assert_eq!(r.count(Count::fixed(7)), 7);
    }

    #[test]
    fn delays_respect_their_parts() {
        let mut r = Rng::new(5);
        let d = Delay::uniform(Duration::from_millis(10), Duration::from_millis(20))
            .plus(Duration::from_millis(5));
        for _ in 0..1000 {
            let x = r.delay(&d);
            assert!(
                x >= Duration::from_millis(15) && x <= Duration::from_millis(25),
                "{x:?}"
            );
        }
        let ln = Delay::lognormal(Duration::from_millis(100), 0.5).capped(Duration::from_secs(1));
        let mut draws: Vec<Duration> = (0..2001).map(|_| r.delay(&ln)).collect();
        draws.sort();
        let median = draws[1000];
        assert!(
            median > Duration::from_millis(85) && median < Duration::from_millis(115),
            "{median:?}"
        );
        assert!(draws.iter().all(|d| *d <= Duration::from_secs(1)));
    }
}
