//! Nothing to link: this package exists for its benches (`overhead.rs`, `allocs.rs`), which
//! measure the facade's layers alone and stacked beside their peers. See BENCHMARKS.md.
