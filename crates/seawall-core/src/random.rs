//! An injectable, seedable source of randomness for jitter.
//!
//! Jitter must be reproducible in tests and in the storm simulation, and must not take a lock
//! on the hot path. [`SeededRandom`] is SplitMix64 over one atomic counter: every draw is a
//! single `fetch_add`, clones of a layer share the sequence, and a fixed seed gives a fixed
//! sequence (for a fixed order of draws).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// A source of uniform random numbers in `[0, 1)`.
pub trait Random: Send + Sync + 'static {
    /// The next number in `[0, 1)`.
    fn next_f64(&self) -> f64;
}

/// SplitMix64 over an atomic counter: lock-free, seedable.
///
/// ```
/// use seawall_core::{Random, SeededRandom};
/// let a = SeededRandom::new(7);
/// let b = SeededRandom::new(7);
/// assert_eq!(a.next_f64(), b.next_f64());
/// assert!((0.0..1.0).contains(&a.next_f64()));
/// ```
pub struct SeededRandom {
    state: AtomicU64,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl SeededRandom {
    /// A sequence fixed by `seed`.
    pub const fn new(seed: u64) -> Self {
        SeededRandom {
            state: AtomicU64::new(seed),
        }
    }

    /// A sequence seeded from the process's hash-map randomness (not reproducible).
    pub fn from_entropy() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x5eed);
        Self::new(h.finish())
    }

    /// The next 64 random bits.
    pub fn next_u64(&self) -> u64 {
        let mut z = self
            .state
            .fetch_add(GOLDEN_GAMMA, Ordering::Relaxed)
            .wrapping_add(GOLDEN_GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl Random for SeededRandom {
    fn next_f64(&self) -> f64 {
        // The top 53 bits, scaled: uniform in [0, 1).
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

impl Default for SeededRandom {
    fn default() -> Self {
        Self::from_entropy()
    }
}

impl fmt::Debug for SeededRandom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SeededRandom").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roughly_uniform() {
        let r = SeededRandom::new(1);
        let mut buckets = [0u32; 10];
        for _ in 0..100_000 {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            buckets[(x * 10.0) as usize] += 1;
        }
        for b in buckets {
            assert!((9_000..11_000).contains(&b), "{buckets:?}");
        }
    }
}
