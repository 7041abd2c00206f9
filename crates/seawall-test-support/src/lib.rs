//! Fixtures the workspace's tests share, so that each lives in one place instead of a copy per
//! test file: a typed request, channel-fed bodies, a paused-time harness, the
//! polled-after-completion check, extreme-duration strategies, a counting allocator, a
//! service that counts its clones, a captured log, a loopback port that refuses connections,
//! and behind features an auditing budget store and the budget stores' conformance tests
//! (`budget`) and a loopback chaos upstream (`mock`) and a real `redis-server` on loopback
//! (`redis`).
//!
//! Not published: only the workspace's own tests depend on it, as a dev-dependency.

mod alloc;
#[cfg(feature = "budget")]
mod audit;
mod bench;
mod body;
mod captured;
mod clones;
#[cfg(feature = "budget")]
pub mod conformance;
#[cfg(feature = "mock")]
mod loopback;
mod poll;
#[cfg(feature = "redis")]
mod redis;
// tokio leaves its network types out under `--cfg loom`, which the loom models are built with;
// no model needs a port.
#[cfg(not(loom))]
mod refused;
mod request;
mod strategy;
mod time;

#[doc(hidden)]
pub use cap;
#[doc(hidden)]
pub use tokio;

#[cfg(feature = "budget")]
pub use audit::AuditStore;
pub use bench::{Bare, Done, complete_now};
pub use body::{ChanBody, Chunks, Feed, drain};
pub use captured::{Captured, global_log};
pub use clones::{Clones, CountClones, count_clones};
#[cfg(feature = "mock")]
pub use loopback::start_mock;
pub use poll::{poll_again_after, poll_twice};
#[cfg(feature = "redis")]
pub use redis::RedisServer;
#[cfg(not(loom))]
pub use refused::RefusedPort;
pub use request::{Ask, NAME_LEN, Name, Tenant, long_names, tenant_key};
pub use strategy::{Draws, extreme_duration, extreme_duration_or_none, reframed_sse};
pub use time::{eventually, paused_runtime, settle};
