//! A counter split over several cache lines, for figures every call updates and only the
//! stats read (calls in flight, calls admitted).
//!
//! One atomic that every call of every thread adds to is a cache line that moves between
//! cores on every call: with two threads calling at once it costs more than the rest of the
//! gate's fast path. Each thread adds to one of a few stripes instead (its own, as long as
//! there are no more threads than stripes) and a reader sums them. A decrement may land on
//! another stripe than its increment (a permit released on another thread); the sum, taken
//! with wrapping arithmetic, is still exact once the updates it races with are done.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const STRIPES: usize = 8;

/// One stripe, alone on its cache line (two lines: adjacent-line prefetch pairs them).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

/// A counter of stripes; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Striped([Stripe; STRIPES]);

/// Threads get stripes in turn.
static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn stripe() -> usize {
    STRIPE
        .try_with(|s| {
            let mut i = s.get();
            if i == usize::MAX {
                i = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed) % STRIPES;
                s.set(i);
            }
            i
        })
        .unwrap_or(0)
}

impl Striped {
    // Relaxed: the counters publish no other data; readers want a figure, not a fence.
    pub(crate) fn add(&self, n: u64) {
        self.0[stripe()].0.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn sub(&self, n: u64) {
        self.0[stripe()].0.fetch_sub(n, Ordering::Relaxed);
    }

    /// The sum of the stripes.
    pub(crate) fn get(&self) -> u64 {
        self.0
            .iter()
            .fold(0u64, |sum, s| sum.wrapping_add(s.0.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increments_and_decrements_on_other_threads_sum_exactly() {
        let c = Striped::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..1000).for_each(|_| c.add(1)));
            }
        });
        assert_eq!(c.get(), 4000);
        // Released elsewhere than taken: stripes may wrap, the sum does not.
        std::thread::scope(|s| {
            s.spawn(|| (0..4000).for_each(|_| c.sub(1)));
        });
        assert_eq!(c.get(), 0);
    }
}
