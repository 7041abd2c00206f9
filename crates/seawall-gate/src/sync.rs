//! The atomic the permit pool's debt is kept in: `loom`'s under `--cfg loom`, so the model tests
//! can explore every interleaving of releases and resizes, the standard library's otherwise.
//!
//! This is the crate's one switch between the two (as tokio's `loom` module is): state that the
//! loom models exercise imports its primitives from here and never names `std::sync` or `loom`
//! itself, so a model always tests the code that ships. Under `--cfg loom` the crate root
//! compiles only the permit bookkeeping, the one part the models check.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicUsize, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};
