//! The layer's shared state as one thread's services hold it.
//!
//! Every call's future keeps the layer's state (policy, budget, counters) until the call ends.
//! Cloned from the layer's one `Arc` for each call, that would write its count, a cache line
//! every thread calling through the layer writes, twice per call. The services of one thread
//! share a handle of their own instead, made once per thread, whose count only that thread
//! writes.

use crate::policy::Shared;

/// The layer's state, bound to the thread that made it.
pub(crate) type ThreadShared = seawall_core::ThreadBound<Shared>;
