//! The atomics and the lock the breaker state is built from: `loom`'s under `--cfg loom`, so
//! the model tests can explore every interleaving, the standard library's otherwise.
//!
//! This is the crate's one switch between the two (as tokio's `loom` module is): state that the
//! loom models exercise imports its primitives from here and never names `std::sync` or `loom`
//! itself, so a model always tests the code that ships.

#[cfg(loom)]
pub(crate) use loom::sync::Mutex;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU8, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::Mutex;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
