//! Concurrency permits that can be resized while they are held.
//!
//! The pool is a `tokio::sync::Semaphore` (FIFO, cancel-safe). Its permits are taken with
//! `forget` and given back by [`Permits::release`], so that a shrink can be settled lazily: when
//! the limit drops below the number of permits in flight, the missing permits become a *debt*
//! that the next releases pay by not returning their permit. The invariant, after every
//! operation, is `available + held - debt == limit`.

use crate::sync::{AtomicUsize, Ordering};

/// The debt half of the permit pool, separate from the semaphore so loom can check it.
#[derive(Debug, Default)]
pub(crate) struct Debt {
    owed: AtomicUsize,
}

impl Debt {
    /// Gives one permit back: pays one unit of debt if there is any, else calls `add(1)`.
    pub(crate) fn release(&self, forget: impl Fn(usize) -> usize, add: impl Fn(usize)) {
        if self.take(1) == 0 {
            add(1);
            self.settle(forget, add);
        }
    }

    /// Raises the limit by `n`: pays debt first, adds the rest.
    pub(crate) fn grow(&self, n: usize, forget: impl Fn(usize) -> usize, add: impl Fn(usize)) {
        let paid = self.take(n);
        if n > paid {
            add(n - paid);
            self.settle(forget, add);
        }
    }

    /// Lowers the limit by `n`: permits still held are owed, paid by later releases.
    pub(crate) fn shrink(&self, n: usize, forget: impl Fn(usize) -> usize, add: impl Fn(usize)) {
        self.owed.fetch_add(n, Ordering::AcqRel);
        self.settle(forget, add);
    }

    // Orderings: the debt changes only by read-modify-writes (AcqRel), and each of them reads
    // the latest value in the debt's own modification order, so no unit is paid twice or lost.
    // The loads in `settle` and `owed` may be a step behind; `settle` copes by running after
    // every change on either side (the comment below). That the two sides then meet rests on
    // the pool's count also changing only by read-modify-writes: the loom models check it with
    // an acquire-release stand-in for the semaphore.
    /// Pays the debt from free permits. Runs after every `add` and every new debt, so a
    /// release that decided to add (debt was zero) just before a shrink owed more still
    /// settles that debt: whichever of the two comes last sees both the debt and the permit.
    fn settle(&self, forget: impl Fn(usize) -> usize, add: impl Fn(usize)) {
        loop {
            let owed = self.owed.load(Ordering::Acquire);
            if owed == 0 {
                return;
            }
            let forgotten = forget(owed);
            if forgotten == 0 {
                return;
            }
            let paid = self.take(forgotten);
            if forgotten == paid {
                return;
            }
            // Releases paid part of the debt meanwhile: return what we took too much.
            add(forgotten - paid);
        }
    }

    /// Takes up to `n` from the debt; returns how much was taken.
    ///
    /// No debt (every release but those after a shrink) is seen with a load, not a
    /// read-modify-write: an atomic instruction fewer per call. A load that finds 0 while a
    /// shrink has just owed more is a release that came first; the settle after its `add`
    /// (and the shrink's own) meet as the comment above says.
    fn take(&self, n: usize) -> usize {
        if self.owed.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut taken = 0;
        let _ = self
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| {
                taken = d.min(n);
                Some(d - taken)
            });
        taken
    }

    /// What is still owed.
    pub(crate) fn owed(&self) -> usize {
        self.owed.load(Ordering::Acquire)
    }
}

#[cfg(not(loom))]
pub(crate) use pool::Permits;

#[cfg(not(loom))]
mod pool {
    use super::Debt;
    use tokio::sync::Semaphore;

    /// A resizable FIFO permit pool.
    #[derive(Debug)]
    pub(crate) struct Permits {
        sem: Semaphore,
        debt: Debt,
    }

    impl Permits {
        /// The largest limit the pool accepts.
        pub(crate) const MAX: usize = Semaphore::MAX_PERMITS;

        pub(crate) fn new(limit: usize) -> Self {
            Permits {
                sem: Semaphore::new(limit.min(Self::MAX)),
                debt: Debt::default(),
            }
        }

        /// Takes a permit if one is free and nobody is queued before us.
        pub(crate) fn try_acquire(&self) -> bool {
            match self.sem.try_acquire() {
                Ok(p) => {
                    p.forget();
                    true
                }
                Err(_) => false,
            }
        }

        /// Waits in FIFO order for a permit. Cancel-safe: a dropped wait holds nothing.
        pub(crate) async fn acquire(&self) -> bool {
            match self.sem.acquire().await {
                Ok(p) => {
                    p.forget();
                    true
                }
                Err(_) => false,
            }
        }

        pub(crate) fn release(&self) {
            self.debt
                .release(|n| self.sem.forget_permits(n), |n| self.sem.add_permits(n));
        }

        pub(crate) fn resize(&self, from: usize, to: usize) {
            let forget = |n| self.sem.forget_permits(n);
            let add = |n| self.sem.add_permits(n);
            if to > from {
                self.debt.grow(to - from, forget, add);
            } else if from > to {
                self.debt.shrink(from - to, forget, add);
            }
        }

        /// Permits free right now.
        pub(crate) fn available(&self) -> usize {
            self.sem.available_permits()
        }

        /// Permits owed by calls in flight after a shrink.
        pub(crate) fn owed(&self) -> usize {
            self.debt.owed()
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::Debt;
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::thread;

    /// Explores every interleaving with up to three preemptions (tokio's own loom tests use
    /// such bounds; without one these models take many minutes).
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(f);
    }

    /// A stand-in for the semaphore's free-permit count.
    #[derive(Default)]
    struct Pool(AtomicUsize);

    impl Pool {
        fn add(&self, n: usize) {
            self.0.fetch_add(n, Ordering::AcqRel);
        }
        fn forget(&self, n: usize) -> usize {
            let mut took = 0;
            let _ = self
                .0
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                    took = a.min(n);
                    Some(a - took)
                });
            took
        }
        fn try_take(&self) -> bool {
            self.0
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| a.checked_sub(1))
                .is_ok()
        }
    }

    /// Two holders release while the limit shrinks from 2 to 1: the books balance, no permit
    /// is created or lost, and no debt is left behind with a permit free to pay it.
    #[test]
    fn loom_release_races_shrink() {
        model(|| {
            let pool = Arc::new(Pool::default());
            let debt = Arc::new(Debt::default());
            // Limit 2, both permits held.
            let mut hs = Vec::new();
            for _ in 0..2 {
                let (p, d) = (pool.clone(), debt.clone());
                hs.push(thread::spawn(move || {
                    d.release(|n| p.forget(n), |n| p.add(n))
                }));
            }
            let (p, d) = (pool.clone(), debt.clone());
            hs.push(thread::spawn(move || {
                d.shrink(1, |n| p.forget(n), |n| p.add(n));
            }));
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(pool.0.load(Ordering::Acquire), 1);
            assert_eq!(debt.owed(), 0);
        });
    }

    /// Grow and shrink race with a release and an acquire; at the end everything held is
    /// released and the free count equals the final limit.
    #[test]
    fn loom_grow_shrink_release_acquire() {
        model(|| {
            // Limit 1, held by one caller; nothing free.
            let pool = Arc::new(Pool::default());
            let debt = Arc::new(Debt::default());
            let (p1, d1) = (pool.clone(), debt.clone());
            let releaser = thread::spawn(move || d1.release(|n| p1.forget(n), |n| p1.add(n)));
            let (p2, d2) = (pool.clone(), debt.clone());
            let resizer = thread::spawn(move || {
                // 1 -> 3 -> 2
                d2.grow(2, |n| p2.forget(n), |n| p2.add(n));
                d2.shrink(1, |n| p2.forget(n), |n| p2.add(n));
            });
            let (p3, d3) = (pool.clone(), debt.clone());
            let taker = thread::spawn(move || {
                if p3.try_take() {
                    d3.release(|n| p3.forget(n), |n| p3.add(n));
                }
            });
            releaser.join().unwrap();
            resizer.join().unwrap();
            taker.join().unwrap();
            assert_eq!(pool.0.load(Ordering::Acquire), 2);
            assert_eq!(debt.owed(), 0);
        });
    }
}
