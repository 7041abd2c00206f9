//! Per-thread helpers that keep the budget's hot path off memory other threads write.
//!
//! Every attempt names the key of each budget as `Arc<str>` (the guard keeps them until the
//! attempt settles, and a [`Charge`](crate::Charge) hands the keys to the store as a slice),
//! and takes a charge id unique in the process. Done naively, each attempt allocates the slice
//! and a fresh `Arc<str>` per key, or clones one shared copy (an atomic write on a count every
//! thread writes), and takes its id from one process-wide counter (another). Here each thread
//! keeps the few key lists it used last, and a block of ids of its own, so a steady stream of
//! attempts allocates nothing for them and writes no cache line another thread writes. (The
//! model's name comes shared from the request: `LlmRequest::model_shared`.)

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use seawall_core::MAX_KEY_LEN;

/// Each budget's key, as a guard keeps them and a charge passes them to the store.
pub(crate) type KeyList = Arc<[Option<Arc<str>>]>;

/// Key lists remembered per thread.
const RECENT: usize = 8;

thread_local! {
    static KEYS: RefCell<Recent<KeyList>> = const { RefCell::new(Recent::new()) };
    /// The next id of this thread's block, and the block's end.
    static IDS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// The last few values made, the oldest replaced first.
struct Recent<T> {
    values: [Option<T>; RECENT],
    /// The slot the next new value replaces.
    next: usize,
}

impl<T: Clone> Recent<T> {
    const fn new() -> Self {
        Recent {
            values: [const { None }; RECENT],
            next: 0,
        }
    }

    /// The value `matches` finds, or the one `make` makes (remembered).
    fn get(&mut self, matches: impl Fn(&T) -> bool, make: impl FnOnce() -> T) -> T {
        if let Some(found) = self.values.iter().flatten().find(|n| matches(n)) {
            return found.clone();
        }
        let new = make();
        self.values[self.next] = Some(new.clone());
        self.next = (self.next + 1) % RECENT;
        new
    }
}

/// The keys `lines` (one per budget, `None` for a global one) as a shared slice: this
/// thread's copy when it made the same list recently, else a new one. Lists with a key
/// longer than a key may be are not remembered.
pub(crate) fn keys<K: AsRef<str>>(lines: &[Option<K>]) -> KeyList {
    let make = || {
        lines
            .iter()
            .map(|k| k.as_ref().map(|k| Arc::from(k.as_ref())))
            .collect()
    };
    if lines
        .iter()
        .flatten()
        .any(|k| k.as_ref().len() > MAX_KEY_LEN)
    {
        return make();
    }
    let same = |list: &KeyList| {
        list.len() == lines.len()
            && list
                .iter()
                .zip(lines)
                .all(|(a, b)| a.as_deref() == b.as_ref().map(AsRef::as_ref))
    };
    KEYS.try_with(|r| r.borrow_mut().get(same, make))
        .unwrap_or_else(|_| make())
}

/// The ids of charges made in this process, handed to threads in blocks.
static NEXT_BLOCK: AtomicU64 = AtomicU64::new(1);
/// Ids a thread takes from the process-wide counter at once.
const BLOCK: u64 = 1024;

/// A charge id no other charge of this process has (not in order across threads).
pub(crate) fn next_id() -> u64 {
    IDS.try_with(|ids| {
        let (next, end) = ids.get();
        if next < end {
            ids.set((next + 1, end));
            return next;
        }
        let start = NEXT_BLOCK.fetch_add(BLOCK, Ordering::Relaxed);
        ids.set((start + 1, start + BLOCK));
        start
    })
    .unwrap_or_else(|_| NEXT_BLOCK.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_recent_key_list_is_the_same_allocation() {
        let a = keys(&[None, Some("gpt-4o"), Some("acme")]);
        let b = keys(&[None, Some("gpt-4o"), Some("acme")]);
        assert!(Arc::ptr_eq(&a, &b));
        let c = keys(&[None, Some("gpt-4o"), Some("other")]);
        let want: [Option<Arc<str>>; 3] = [None, Some("gpt-4o".into()), Some("other".into())];
        assert_eq!(*c, want);
        assert_eq!(keys(&[None, Some("gpt-4o")]).len(), 2);
    }

    #[test]
    fn ids_are_unique_across_threads() {
        let ids: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..3 * BLOCK).map(|_| next_id()).collect::<Vec<_>>()))
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let unique: HashSet<u64> = ids.iter().copied().collect();
        assert_eq!(unique.len(), ids.len());
        assert!(!unique.contains(&0));
    }
}
