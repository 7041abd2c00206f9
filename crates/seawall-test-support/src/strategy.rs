//! The durations that break careless arithmetic (zero, one nanosecond, `Duration::MAX`, and
//! anything in between), for property tests that no configured duration panics a call.

use std::time::Duration;

use proptest::prelude::*;

/// Durations at and near the edges of what a `Duration` holds.
pub fn extreme_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(Duration::MAX),
        Just(Duration::from_secs(u64::MAX)),
        any::<u64>().prop_map(Duration::from_nanos),
        any::<u64>().prop_map(Duration::from_secs),
    ]
}

/// Durations at and near the edges of what a `Duration` holds, or none.
pub fn extreme_duration_or_none() -> impl Strategy<Value = Option<Duration>> {
    prop_oneof![
        Just(None),
        Just(Some(Duration::ZERO)),
        Just(Some(Duration::from_nanos(1))),
        Just(Some(Duration::MAX)),
        Just(Some(Duration::from_secs(u64::MAX))),
        any::<u64>().prop_map(|n| Some(Duration::from_nanos(n))),
        any::<u64>().prop_map(|s| Some(Duration::from_secs(s))),
    ]
}

/// The same server-sent-events stream as the wire may deliver it: each line ending of
/// `stream` (written with LF) turned into LF, CR or CRLF, a byte order mark or none, and the
/// bytes cut into chunks at arbitrary places. A reader must see the same events in every one.
pub fn reframed_sse(stream: &'static [u8]) -> impl Strategy<Value = Vec<Vec<u8>>> {
    (
        proptest::collection::vec(0usize..3, 1..16),
        any::<bool>(),
        proptest::collection::vec(any::<usize>(), 0..12),
    )
        .prop_map(move |(endings, bom, cuts)| {
            let mut body = if bom {
                b"\xEF\xBB\xBF".to_vec()
            } else {
                Vec::new()
            };
            for (i, b) in stream.iter().enumerate() {
                // A CR followed by an LF would be one ending (CRLF), not two.
                let after_cr = body.last() == Some(&b'\r');
                match (b, endings[i % endings.len()]) {
                    (b'\n', 0) if !after_cr => body.push(b'\n'),
                    (b'\n', 1) => body.push(b'\r'),
                    (b'\n', _) => body.extend_from_slice(b"\r\n"),
                    (b, _) => body.push(*b),
                }
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (body.len() + 1)).collect();
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut last = 0;
            for c in cuts.into_iter().chain([body.len()]) {
                chunks.push(body[last..c].to_vec());
                last = c;
            }
            chunks
        })
}

/// The draws of one fuzz case: proptest's own generator, seeded from one `u64` that proptest
/// generates, so a failing case names its seed and runs again from it. For tests that build
/// a whole scene (a fault profile, a workload, hostile bodies) from one seed rather than from
/// a tree of strategies.
#[derive(Debug)]
pub struct Draws(proptest::test_runner::TestRng);

impl Draws {
    /// The draws of the case `seed`.
    pub fn new(seed: u64) -> Self {
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        bytes[8..].copy_from_slice(&(!seed).to_le_bytes());
        Draws(proptest::test_runner::TestRng::from_seed(
            proptest::test_runner::RngAlgorithm::XorShift,
            &bytes,
        ))
    }

    /// Any `u64`.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { self.0.random_range(0..n) }
    }

    /// One of `items` (which must not be empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A probability in `[0, max)`.
    pub fn rate(&mut self, max: f64) -> f64 {
        self.0.random_range(0.0..1.0) * max
    }

    /// A duration below `max_ms` milliseconds.
    pub fn ms(&mut self, max_ms: u64) -> Duration {
        Duration::from_millis(self.0.random_range(0..max_ms.max(1)))
    }
}
