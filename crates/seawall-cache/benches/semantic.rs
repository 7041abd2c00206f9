//! The semantic index's exact search: one query against 1,000 and 10,000 entries of one
//! context, at dimension 1536 (`text-embedding-3-small`, `ada-002`) and 256 (a shortened
//! `text-embedding-3`), on one thread. The figures back the index's claim that brute force is
//! fine for the sizes a process holds.
//!
//! `cargo bench -p seawall-cache --bench semantic`

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use seawall_cache::{CacheKey, SemanticIndex};

/// A deterministic pseudo-random vector (SplitMix64), components in [-1, 1).
fn vector(seed: u64, dimension: usize) -> Vec<f32> {
    let mut s = seed;
    (0..dimension)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect()
}

fn key(i: u64) -> CacheKey {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&i.to_le_bytes());
    CacheKey::from_bytes(b)
}

fn search(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let context = CacheKey::from_bytes([0xc0; 32]);
    let mut group = c.benchmark_group("semantic_search");
    for dimension in [1536, 256] {
        for entries in [1_000u64, 10_000] {
            let index = SemanticIndex::new(entries as usize);
            for i in 0..entries {
                index.insert(
                    &context,
                    &key(i),
                    &vector(i, dimension),
                    Duration::from_secs(3600),
                );
            }
            let query = vector(u64::MAX, dimension);
            group.bench_with_input(
                BenchmarkId::new(format!("dim{dimension}"), entries),
                &query,
                |b, q| b.iter(|| std::hint::black_box(index.search(&context, q, 0.95))),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, search);
criterion_main!(benches);
