//! Sliding windows of call outcomes, updated with atomics only.
//!
//! Two shapes, as in resilience4j:
//!
//! - [`CountWindow`]: the last `n` counted calls. A ring of one-byte outcome slots plus the
//!   totals packed into one `u64`. Recording is a `fetch_add` for the ring index, a `swap` of
//!   the slot and, only when the outcome differs from the one it replaces, one `fetch_add` on
//!   the totals. A run of successes therefore writes nothing but the ring index, and once
//!   the window is full of successes, nothing at all (see `CountWindow::record`).
//! - [`TimeWindow`]: the calls of the last `d`, in `n` buckets of `d / n`. Each bucket is
//!   three `u64` words (calls, failures, slow calls), each holding its period number (tag) in
//!   the high half and a saturating 32-bit count in the low half, updated by CAS; a word whose
//!   tag is old is reset by the first writer of the new period. 32-bit counts keep the failure
//!   rate exact at any realistic call rate (a 14-bit count would saturate at 16,383 calls per
//!   bucket, under 20k calls per second, and overstate the failure rate above it).
//!
//! Both give totals that agree with a naive list of outcomes when calls do not overlap (the
//! proptests below check it). Under concurrency the totals can be off by the few updates in
//! flight, never drift: every swapped-out outcome is subtracted exactly once.

use std::time::Duration;

use crate::sync::{AtomicU8, AtomicU64, Ordering};

/// Totals over a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Counted calls (successes and failures; ignored outcomes are not calls).
    pub(crate) calls: u32,
    /// Failures among them.
    pub(crate) failures: u32,
    /// Slow calls among them.
    pub(crate) slow: u32,
}

/// The shape of a window, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowKind {
    /// The last `n` counted calls.
    Count(u32),
    /// The counted calls of the last duration.
    Time(Duration),
}

/// The largest count window.
pub(crate) const MAX_COUNT_WINDOW: u32 = 100_000;
/// The shortest and longest time windows.
pub(crate) const MIN_TIME_WINDOW: Duration = Duration::from_millis(100);
pub(crate) const MAX_TIME_WINDOW: Duration = Duration::from_secs(3600);

const SUCCESS: u8 = 1;
const FAILURE: u8 = 2;
const SLOW: u8 = 4;

fn code(failure: bool, slow: bool) -> u8 {
    (if failure { FAILURE } else { SUCCESS }) | if slow { SLOW } else { 0 }
}

/// A window of either shape.
#[derive(Debug)]
pub(crate) enum Window {
    Count(CountWindow),
    Time(TimeWindow),
}

impl Window {
    pub(crate) fn new(kind: WindowKind) -> Self {
        match kind {
            WindowKind::Count(n) => Window::Count(CountWindow::new(n)),
            WindowKind::Time(d) => Window::Time(TimeWindow::new(d)),
        }
    }

    /// Records one counted call at `now` (nanoseconds on the breaker's clock). Returns whether
    /// the totals may have changed.
    #[inline]
    pub(crate) fn record(&self, failure: bool, slow: bool, now: u64) -> bool {
        match self {
            Window::Count(w) => w.record(code(failure, slow)),
            Window::Time(w) => {
                w.record(code(failure, slow), now);
                true
            }
        }
    }

    pub(crate) fn totals(&self, now: u64) -> Totals {
        match self {
            Window::Count(w) => w.totals(),
            Window::Time(w) => w.totals(now),
        }
    }

    pub(crate) fn reset(&self) {
        match self {
            Window::Count(w) => w.reset(),
            Window::Time(w) => w.reset(),
        }
    }

    pub(crate) fn is_time_based(&self) -> bool {
        matches!(self, Window::Time(_))
    }
}

// Count window totals: three 21-bit fields, each stored with a bias of 2^20 so that a
// subtraction applied before its matching addition (two writers racing on one slot) dips below
// the bias instead of borrowing from the next field.
const FIELD: u32 = 21;
const FIELD_MASK: u64 = (1 << FIELD) - 1;
const BIAS: u64 = 1 << 20;
const ZERO_TOTALS: u64 = BIAS | (BIAS << FIELD) | (BIAS << (2 * FIELD));

fn fields(code: u8) -> [i64; 3] {
    [
        i64::from(code != 0),
        i64::from(code & FAILURE != 0),
        i64::from(code & SLOW != 0),
    ]
}

fn packed_delta(old: u8, new: u8) -> u64 {
    let (o, n) = (fields(old), fields(new));
    let mut delta = 0u64;
    for (i, (n, o)) in n.iter().zip(o).enumerate() {
        delta = delta.wrapping_add(((n - o) as u64).wrapping_shl(FIELD * i as u32));
    }
    delta
}

fn unpack_field(packed: u64, i: u32, max: u32) -> u32 {
    let raw = (packed >> (FIELD * i)) & FIELD_MASK;
    raw.saturating_sub(BIAS).min(u64::from(max)) as u32
}

/// The last `n` counted calls.
#[derive(Debug)]
pub(crate) struct CountWindow {
    slots: Box<[AtomicU8]>,
    next: AtomicU64,
    totals: AtomicU64,
}

impl CountWindow {
    pub(crate) fn new(n: u32) -> Self {
        let n = n.clamp(1, MAX_COUNT_WINDOW);
        CountWindow {
            slots: (0..n).map(|_| AtomicU8::new(0)).collect(),
            next: AtomicU64::new(0),
            totals: AtomicU64::new(ZERO_TOTALS),
        }
    }

    // Every access here is Relaxed: the ring and the totals publish no other data, and each
    // location's own modification order is all the arithmetic needs (every swapped-out code is
    // subtracted exactly once, whatever order other threads see the writes in). A reader may
    // see totals a few updates behind, which the module docs allow.
    #[inline]
    fn record(&self, code: u8) -> bool {
        // A full window of plain successes stays the same when one more success replaces its
        // oldest: every slot holds the same code, so which one the ring index points at does
        // not matter. Reading the totals (written only when an outcome changes) instead of
        // advancing the shared ring index keeps a healthy key's calls from writing any cache
        // line the other threads use. A writer racing with a failure may see the totals just
        // before the failure lands: its success then counts as recorded before that failure.
        if code == SUCCESS
            && self.totals.load(Ordering::Relaxed) == ZERO_TOTALS + self.slots.len() as u64
        {
            return false;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len() as u64;
        let slot = &self.slots[i as usize];
        // The common case, a success replacing a success, writes nothing. (A writer racing
        // on the same slot may then overwrite it; the totals follow the slot either way.)
        if slot.load(Ordering::Relaxed) == code {
            return false;
        }
        let old = slot.swap(code, Ordering::Relaxed);
        if old == code {
            return false;
        }
        self.totals
            .fetch_add(packed_delta(old, code), Ordering::Relaxed);
        true
    }

    fn totals(&self) -> Totals {
        let p = self.totals.load(Ordering::Relaxed);
        let n = self.slots.len() as u32;
        let calls = unpack_field(p, 0, n);
        Totals {
            calls,
            failures: unpack_field(p, 1, calls),
            slow: unpack_field(p, 2, calls),
        }
    }

    /// Empties the window. Drains slot by slot, so a writer racing with the reset leaves at
    /// most its own outcome behind, and the totals stay exact.
    fn reset(&self) {
        for slot in self.slots.iter() {
            let old = slot.swap(0, Ordering::Relaxed);
            if old != 0 {
                self.totals
                    .fetch_add(packed_delta(old, 0), Ordering::Relaxed);
            }
        }
        self.next.store(0, Ordering::Relaxed);
    }
}

// Time window bucket: one word per counter, each [tag: 32 bits][count: 32 bits]. Each word
// carries its own tag, so it is reset by its own first writer of a new period and a success
// touches only the `calls` word. A 32-bit tag repeats after 2^32 periods (over a year even at
// the shortest bucket width), so a stale word is never taken for a current one.
const COUNT_BITS: u32 = 32;
/// The most calls one time bucket counts; more saturate. At about one bucket per second,
/// that is over four billion calls per second per key.
pub(crate) const BUCKET_MAX: u64 = u32::MAX as u64;
const TAG_MASK: u64 = u32::MAX as u64;

/// One time bucket: calls, failures and slow calls of one period.
#[derive(Debug)]
struct Bucket {
    calls: AtomicU64,
    failures: AtomicU64,
    slow: AtomicU64,
}

impl Bucket {
    fn new() -> Self {
        Bucket {
            calls: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            slow: AtomicU64::new(0),
        }
    }
}

/// Adds one to `word`'s count for period `tag`, starting from zero if the word holds an older
/// period; saturates at [`BUCKET_MAX`].
fn bump(word: &AtomicU64, tag: u64) {
    let mut cur = word.load(Ordering::Relaxed);
    loop {
        let count = if cur >> COUNT_BITS == tag {
            cur & BUCKET_MAX
        } else {
            0
        };
        let next = (tag << COUNT_BITS) | (count + 1).min(BUCKET_MAX);
        if next == cur {
            return;
        }
        match word.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(actual) => cur = actual,
        }
    }
}

/// `word`'s count if it belongs to period `tag`, else zero.
fn count_of(word: &AtomicU64, tag: u64) -> u64 {
    let w = word.load(Ordering::Relaxed);
    if w >> COUNT_BITS == tag {
        w & BUCKET_MAX
    } else {
        0
    }
}

/// The counted calls of the last `duration`, in buckets.
#[derive(Debug)]
pub(crate) struct TimeWindow {
    buckets: Box<[Bucket]>,
    width: u64,
}

impl TimeWindow {
    pub(crate) fn new(duration: Duration) -> Self {
        let duration = duration.clamp(MIN_TIME_WINDOW, MAX_TIME_WINDOW);
        let nanos = duration.as_nanos() as u64;
        // About one bucket per second, between 10 and 300 buckets.
        let n = nanos.div_ceil(1_000_000_000).clamp(10, 300);
        TimeWindow {
            buckets: (0..n).map(|_| Bucket::new()).collect(),
            width: nanos.div_ceil(n),
        }
    }

    /// The width of one bucket.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn bucket_width(&self) -> Duration {
        Duration::from_nanos(self.width)
    }

    fn record(&self, code: u8, now: u64) {
        let index = now / self.width;
        let tag = index & TAG_MASK;
        let bucket = &self.buckets[(index % self.buckets.len() as u64) as usize];
        bump(&bucket.calls, tag);
        if code & FAILURE != 0 {
            bump(&bucket.failures, tag);
        }
        if code & SLOW != 0 {
            bump(&bucket.slow, tag);
        }
    }

    fn totals(&self, now: u64) -> Totals {
        let index = now / self.width;
        let n = self.buckets.len() as u64;
        let (mut calls, mut failures, mut slow) = (0u64, 0u64, 0u64);
        for back in 0..n.min(index + 1) {
            let i = index - back;
            let tag = i & TAG_MASK;
            let b = &self.buckets[(i % n) as usize];
            calls += count_of(&b.calls, tag);
            failures += count_of(&b.failures, tag);
            slow += count_of(&b.slow, tag);
        }
        // A call in flight may show its failure before its call: never more than the calls.
        let clamp = |v: u64| v.min(calls).min(u64::from(u32::MAX)) as u32;
        Totals {
            calls: clamp(calls),
            failures: clamp(failures),
            slow: clamp(slow),
        }
    }

    fn reset(&self) {
        for b in self.buckets.iter() {
            // Tag 0 with no counts: counts for nothing whatever its tag matches.
            for word in [&b.calls, &b.failures, &b.slow] {
                word.store(0, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[test]
    fn a_success_on_a_full_window_of_successes_writes_nothing() {
        let w = CountWindow::new(3);
        for _ in 0..3 {
            w.record(SUCCESS);
        }
        let next = w.next.load(Ordering::Relaxed);
        assert!(!w.record(SUCCESS));
        assert_eq!(w.next.load(Ordering::Relaxed), next, "the ring index moved");
        // Anything else is still recorded.
        assert!(w.record(FAILURE));
        assert_eq!(w.totals().failures, 1);
        assert_eq!(w.next.load(Ordering::Relaxed), next + 1);
    }

    #[test]
    fn count_window_rolls_over() {
        let w = Window::new(WindowKind::Count(3));
        assert!(w.record(true, false, 0));
        assert!(w.record(false, true, 0));
        assert!(w.record(false, false, 0));
        assert_eq!(
            w.totals(0),
            Totals {
                calls: 3,
                failures: 1,
                slow: 1
            }
        );
        // Replaces the failure with a failure: nothing changes, nothing written.
        assert!(!w.record(true, false, 0));
        assert!(w.record(false, false, 0));
        assert_eq!(
            w.totals(0),
            Totals {
                calls: 3,
                failures: 1,
                slow: 0
            }
        );
        w.reset();
        assert_eq!(w.totals(0), Totals::default());
    }

    #[test]
    fn time_window_forgets_old_buckets() {
        let w = TimeWindow::new(Duration::from_secs(10));
        assert_eq!(w.bucket_width(), Duration::from_secs(1));
        let s = 1_000_000_000u64;
        w.record(code(true, false), 0);
        w.record(code(false, false), 5 * s);
        assert_eq!(w.totals(9 * s).calls, 2);
        assert_eq!(w.totals(10 * s).calls, 1, "bucket 0 left the window");
        // Bucket 0 is reused for period 10: the stale counts are replaced.
        w.record(code(true, false), 10 * s);
        assert_eq!(
            w.totals(10 * s),
            Totals {
                calls: 2,
                failures: 1,
                slow: 0
            }
        );
        assert_eq!(w.totals(100 * s), Totals::default());
    }

    #[test]
    fn time_bucket_saturates_instead_of_overflowing() {
        let w = TimeWindow::new(Duration::from_secs(10));
        let b = &w.buckets[0];
        for word in [&b.calls, &b.failures, &b.slow] {
            word.store(BUCKET_MAX - 2, Ordering::Relaxed);
        }
        for _ in 0..10 {
            w.record(code(true, true), 0);
        }
        let t = w.totals(0);
        assert_eq!(u64::from(t.calls), BUCKET_MAX);
        assert_eq!(u64::from(t.failures), BUCKET_MAX);
        assert_eq!(u64::from(t.slow), BUCKET_MAX);
    }

    #[test]
    fn time_bucket_failure_rate_is_exact_past_sixteen_thousand_calls() {
        // One hour window: one-second buckets, so this is 40k calls in one second.
        let w = TimeWindow::new(Duration::from_secs(3600));
        for i in 0..40_000u32 {
            w.record(code(i % 4 == 0, i % 8 == 0), 0);
        }
        assert_eq!(
            w.totals(0),
            Totals {
                calls: 40_000,
                failures: 10_000,
                slow: 5_000
            }
        );
    }

    #[test]
    fn concurrent_time_window_loses_no_call() {
        let w = std::sync::Arc::new(TimeWindow::new(Duration::from_secs(10)));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let w = w.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u32 {
                        w.record(code((i + t) % 2 == 0, false), 0);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let t = w.totals(0);
        assert_eq!((t.calls, t.failures), (80_000, 40_000));
    }

    #[test]
    fn concurrent_count_window_totals_match_slots() {
        let w = std::sync::Arc::new(CountWindow::new(8));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let w = w.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u32 {
                        w.record(code((i + t) % 3 == 0, i % 5 == 0));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut naive = Totals::default();
        for s in w.slots.iter() {
            let f = fields(s.load(Ordering::Relaxed));
            naive.calls += f[0] as u32;
            naive.failures += f[1] as u32;
            naive.slow += f[2] as u32;
        }
        assert_eq!(w.totals(), naive);
        assert_eq!(naive.calls, 8);
    }

    fn totals_of<'a>(outcomes: impl Iterator<Item = &'a (bool, bool)>) -> Totals {
        let mut t = Totals::default();
        for (f, s) in outcomes {
            t.calls += 1;
            t.failures += u32::from(*f);
            t.slow += u32::from(*s);
        }
        t
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn busy_time_window_agrees_with_naive_counts(
            window_s in 1u64..3_600,
            bursts in proptest::collection::vec(
                (0u32..=4, 0u32..=4, 1u32..30_000, 0u64..3_000),
                1..12,
            ),
        ) {
            let tw = TimeWindow::new(Duration::from_secs(window_s));
            let width = tw.width;
            let n = tw.buckets.len() as u64;
            let w = Window::Time(tw);
            // The model: each burst's time and counts; the window holds the bursts whose
            // bucket is one of the last `n`.
            let mut naive: Vec<(u64, Totals)> = Vec::new();
            let mut now = 0u64;
            for (fail_every, slow_every, calls, advance_ms) in bursts {
                now += advance_ms * 1_000_000;
                let mut t = Totals::default();
                for i in 0..calls {
                    let failure = fail_every != 0 && i % fail_every == 0;
                    let slow = slow_every != 0 && i % slow_every == 0;
                    w.record(failure, slow, now);
                    t.calls += 1;
                    t.failures += u32::from(failure);
                    t.slow += u32::from(slow);
                }
                naive.push((now, t));
                let cur = now / width;
                let mut want = Totals::default();
                for (at, t) in &naive {
                    if at / width + n > cur {
                        want.calls += t.calls;
                        want.failures += t.failures;
                        want.slow += t.slow;
                    }
                }
                prop_assert_eq!(w.totals(now), want);
            }
        }
    }

    proptest! {
        #[test]
        fn count_window_agrees_with_naive_model(
            n in 1u32..40,
            ops in proptest::collection::vec((any::<bool>(), any::<bool>(), 0u8..8), 0..300),
        ) {
            let w = Window::new(WindowKind::Count(n));
            let mut naive: VecDeque<(bool, bool)> = VecDeque::new();
            for (failure, slow, op) in ops {
                if op == 0 {
                    w.reset();
                    naive.clear();
                } else {
                    w.record(failure, slow, 0);
                    naive.push_back((failure, slow));
                    if naive.len() > n as usize {
                        naive.pop_front();
                    }
                }
                prop_assert_eq!(w.totals(0), totals_of(naive.iter()));
            }
        }

        #[test]
        fn time_window_agrees_with_naive_model(
            window_ms in 100u64..30_000,
            ops in proptest::collection::vec((any::<bool>(), any::<bool>(), 0u64..3_000), 0..300),
        ) {
            let tw = TimeWindow::new(Duration::from_millis(window_ms));
            let width = tw.width;
            let n = tw.buckets.len() as u64;
            let w = Window::Time(tw);
            // The model: every outcome with its time; the window holds those whose bucket is
            // one of the last `n` buckets.
            let mut naive: Vec<(u64, (bool, bool))> = Vec::new();
            let mut now = 0u64;
            for (failure, slow, advance_ms) in ops {
                now += advance_ms * 1_000_000;
                w.record(failure, slow, now);
                naive.push((now, (failure, slow)));
                let cur = now / width;
                let inside = naive
                    .iter()
                    .filter(|(t, _)| t / width + n > cur)
                    .map(|(_, o)| o);
                prop_assert_eq!(w.totals(now), totals_of(inside));
            }
        }
    }
}
