//! Shared state for a fleet of replicas, on Redis.
//!
//! # Why
//!
//! Every seawall layer keeps its state in its own process by default, which is right for one
//! process and wrong for a fleet: with N replicas a "$100 a day" budget is $100·N, a 500 RPM
//! key limit is 500·N RPM, and an upstream outage is learned N times over. This crate puts
//! that state in the Redis the fleet already runs, behind the same seams the in-process state
//! uses, so a stack switches by passing a store to a builder and nothing else changes.
//!
//! # The pieces
//!
//! - [`RedisBudgetStore`]: a `BudgetStore` for `CostBudgetBuilder::store`, one budget for
//!   the fleet ([`budget`] explains the scripts, leases and idempotent attempt ids).
//! - [`FleetLimitLayer`]: the key's RPM/TPM buckets, upstream pauses and optional permits,
//!   fleet-wide, just inside the in-process gate ([`fleet`]).
//! - [`RedisBreakerState`]: a `SharedBreakerState` for `CircuitBreakerBuilder::shared_state`,
//!   one view of a sick upstream and one probe at a time for the fleet ([`breaker`]).
//!
//! - [`RedisCacheStore`]: a `CacheStore` for `CacheLayer`, the cache's answers shared by the
//!   fleet ([`cache`]).
//!
//! All of them share one [`SharedRedis`] per replica.
//!
//! # What a call costs
//!
//! Every decision that must be exact for the fleet (reserve a budget, take from a rate bucket,
//! take a permit) is one Lua script run atomically by the server: one round trip, all lines or
//! none. Settling is one more. Anything that only needs to be *learned* (a breaker opened by
//! another replica) is polled in the background and read locally, so a call through a closed
//! breaker costs no round trip at all.
//!
//! # When Redis is slow or gone
//!
//! Every call to Redis has a short timeout ([`SharedRedisBuilder::timeout`], 50 ms by
//! default). What a layer does when it fires is its own [`OnUnavailable`] policy: refuse the
//! call with [`FailureClass::SharedStateUnavailable`](seawall_core::FailureClass) (fail closed),
//! or keep enforcing a per-replica share of the limit in process (fail open to local state).
//! Either way the replica logs one `tracing` warning when it degrades and one when it recovers
//! (target `seawall::redis`), and counts failed calls in the `seawall_redis_unavailable_total`
//! metric. The connection reconnects on its own.
//!
//! # The client
//!
//! redis-rs, the Redis project's own Rust client, with its tokio `ConnectionManager`: one
//! multiplexed connection per replica that every store shares (no pool to size), remade on its
//! own after a failure, and `Script`, which runs a script by its hash and loads it once when
//! a (restarted) server answers NOSCRIPT. fred would do as well; redis-rs is the more widely
//! used of the two and pulls fewer dependencies with the features used here.
#![doc(html_root_url = "https://docs.rs/seawall-redis/0.1.0")]

pub mod breaker;
pub mod budget;
pub mod cache;
mod client;
mod clock;
pub mod fleet;
mod policy;

pub use breaker::{RedisBreakerState, RedisBreakerStateBuilder};
pub use budget::{DEFAULT_LEASE, RedisBudgetStore, RedisBudgetStoreBuilder};
pub use cache::{RedisCacheStore, RedisCacheStoreBuilder};
pub use client::{
    DEFAULT_TIMEOUT, ErrorKind, PROBE_EVERY, SharedRedis, SharedRedisBuilder, Unavailable,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use fleet::{FleetLimit, FleetLimitBuilder, FleetLimitLayer};
pub use policy::OnUnavailable;
/// The Redis client this crate is built on, for callers who run their own commands.
pub use redis;
