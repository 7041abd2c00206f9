//! The atomics the retry budget is built from: `loom`'s under `--cfg loom`, so the model tests
//! can explore every interleaving of deposits and withdrawals, the standard library's otherwise.
//!
//! This is the crate's one switch between the two (as tokio's `loom` module is): state that the
//! loom models exercise imports its primitives from here and never names `std::sync` or `loom`
//! itself, so a model always tests the code that ships. The runtime knobs of the policy stay on
//! the standard library's atomics: no model explores them, and loom's atomics may only be
//! created inside a model.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
