//! Fleet-wide rate limits and concurrency for the gate: a key's request and token buckets, the
//! upstream's pauses and an optional permit count, kept in Redis so that N replicas together
//! stay under one key's limits.
//!
//! # Why a layer of its own
//!
//! The gate ([`ConcurrencyGateLayer`](seawall_gate::ConcurrencyGateLayer)) already does the
//! hard local work: a FIFO queue with a bound, per-replica permits, cancel-safe waiting.
//! Making *its* state remote would put a round trip under every queue operation. Instead,
//! [`FleetLimitLayer`] sits just inside the gate and adds only what must be fleet-wide: the
//! gate keeps the queue and the replica's permits; a call it admits then asks the fleet once
//! for the key's rates, pause and permit, and is sent only when the fleet says yes. A call
//! waiting for the fleet holds a local gate permit, so the gate's limit also bounds how many
//! of a replica's calls wait on Redis at once.
//!
//! ```text
//! observe → fallback → retry → budget → breaker → gate → FLEET → timeouts → classify → transport
//! ```
//!
//! Inside the retry layer, so each attempt is admitted and settled on its own and a backoff
//! sleep holds nothing; outside the classifier, so it reads classified errors (a 429's
//! `Retry-After`) and the body's usage. Give the gate no rates of its own for the same keys
//! (the fleet's are the ones that count); its pause-reading stays useful and costs nothing.
//!
//! # Per call
//!
//! 1. The service prices the request exactly as the gate does ([`Cost::of`]: the prompt
//!    estimate, media parts, and the maximum output times the choices) and takes its key from
//!    the [`KeyFn`](seawall_core::KeyFn) (`host/model` by default).
//! 2. **One round trip**: `fleet_acquire.lua` checks the key's pause, refills and checks both
//!    buckets and (if the key has permits) counts the live holds, and either takes one
//!    request, the estimated tokens and a hold (a lease scored by its expiry), all at once, or
//!    answers "wait N ms" (or "never", for a zero limit). A pause this replica already knows
//!    of is answered locally without a round trip.
//! 3. On "wait", the future sleeps and asks again while the total stays within
//!    [`max_wait`](FleetLimitBuilder::max_wait); a wait past it is rejected at once with a
//!    `GateRejected` error carrying the time as its retry hint and a [`FleetRejection`] as its
//!    source. With `max_wait = 0` an over-limit call is refused at once.
//! 4. The response carries a [`FleetPermit`] (an [`OnComplete`](seawall_core::OnComplete)
//!    hook, as the gate's permit is). When the body ends, fails or is dropped, **one more
//!    round trip** (`fleet_settle.lua`, in the background) ends the hold, which frees the
//!    permit, and settles the tokens: unused ones go back (never above the burst), an overrun
//!    becomes debt that delays the next admissions of the whole fleet. A call that ends
//!    without a usage report keeps only its input estimate charged, as in the gate.
//! 5. A response whose rate-limit headers say `remaining = 0`, or a 429 with a hint, pauses
//!    the key here at once and, in the background, for the fleet (`fleet_pause.lua`: one
//!    conditional `SET PX`, where a later pause wins).
//!
//! So an admitted call costs two round trips, one before and one after (plus one for a
//! pause, and one per key every [`renew_every`](FleetLimitBuilder::renew_every) while calls
//! are in flight). Each is a single script: atomic, with no lock and no retry loop.
//!
//! # Key layout
//!
//! Under the [`SharedRedis`](crate::SharedRedis) prefix, per key (cut to
//! [`MAX_KEY_LEN`](seawall_core::MAX_KEY_LEN) bytes; the braces are a Redis Cluster hash tag,
//! so one script touches one shard):
//!
//! | Redis key | type | holds | expires |
//! |---|---|---|---|
//! | `{prefix}:fleet:{<key>}:b` | hash | the buckets: `r`, `r_at` (requests), `t`, `t_at` (tokens); levels may be negative (debt) | once every bucket in it has refilled (a missing bucket is full) |
//! | `{prefix}:fleet:{<key>}:h` | sorted set | the calls in flight: hold id → lease expiry (ms) | a lease after the last admission or renewal |
//! | `{prefix}:fleet:{<key>}:p` | string | the pause: paused until (ms) | with the pause |
//!
//! Requests without a key use `{prefix}:fleet:none:*`. Every replica passes its own
//! [`Clock`] reading to the scripts (milliseconds; the wall clock by default), so tests drive
//! refills, pauses and leases through a [`ManualClock`] while Redis runs on real time; the
//! TTLs use the server's clock and are garbage collection only.
//!
//! # Permits and leases
//!
//! A key with [`permits`](FleetLimitBuilder::permits) admits a call only while fewer holds
//! than that are live. Every hold is a lease: the replica that took it renews the leases of
//! its calls in flight (`fleet_renew.lua`, one call per key) every `renew_every` (10 s), each
//! for [`lease`](FleetLimitBuilder::lease) (30 s), so a call that streams for minutes keeps its
//! permit, while the holds of a replica that died run out a lease later and the next
//! admission purges them. A call that waits for a permit polls every
//! [`permit_poll`](FleetLimitBuilder::permit_poll), since nothing tells it when a call on
//! another replica ends.
//!
//! # When Redis is slow or gone
//!
//! Each script call has the [`SharedRedis`](crate::SharedRedis) timeout (50 ms by default).
//! When it fails, the layer's [`OnUnavailable`](crate::OnUnavailable) decides:
//!
//! - `FailClosed` (the default: a default cannot know the fleet's size) refuses the call with
//!   a `SharedStateUnavailable` error;
//! - `FailOpen { replicas }` admits it under an in-process share of `1 / replicas` of every
//!   rate and permit count, counted with the gate's own [`Bucket`](seawall_gate::Bucket)s, so
//!   the fleet as a whole stays near its limit while it cannot coordinate.
//!
//! While the connection is degraded, one call every 250 ms asks Redis (and pays the timeout
//! if it is still gone); the others follow the policy at once, so an outage does not add the
//! timeout to every call, and the fleet's state takes over within 250 ms of Redis answering.
//!
//! An acquire that timed out may still have run. Hold ids are unique per attempt and every
//! change a script makes after an admission goes through the hold, so the layer queues a
//! cancellation of the id (which gives the request and the tokens back only if the hold
//! exists) and nothing is charged twice. For the same reason a settlement or cancellation is
//! safe to send again, and is, up to four times within about a second when one times out (a
//! slow moment of the server, or a script cache emptied by a restart whose `NOSCRIPT` answer
//! came after the timeout). A settlement lost for good leaves the tokens charged (the
//! conservative error) and the hold to run out with its lease.
//!
//! The fleet's waits are added to the call's `queue_wait` and its refusals to its
//! `rejections` in the [`CallContext`](seawall_core::CallContext), as the gate's are.
//!
//! # Not covered
//!
//! The limits are fixed when the layer is built (no run-time handle yet), and every replica
//! must be built with the same limits and lease for a key: the scripts take them as arguments.
//! A pause and a renewal are each one attempt (the next renewal comes a `renew_every` later).

mod error;
mod future;
mod keys;
mod layer;
mod local;
mod permit;
mod service;
mod state;

pub use crate::clock::{Clock, ManualClock, SystemClock};
pub use error::FleetRejection;
pub use future::ResponseFuture;
pub use layer::{
    DEFAULT_LEASE, DEFAULT_MAX_WAIT, DEFAULT_PERMIT_POLL, DEFAULT_RENEW_EVERY, FleetLimitBuilder,
    FleetLimitLayer,
};
pub use permit::FleetPermit;
pub use service::FleetLimit;

#[cfg(doc)]
use seawall_gate::Cost;

/// The source of `scripts/fleet_acquire.lua`, after the bucket functions of
/// `scripts/fleet_bucket.lua` it shares with the settle script; public so that the scripts can
/// be tested (and read) on their own.
pub const ACQUIRE: &str = concat!(
    include_str!("../scripts/fleet_bucket.lua"),
    include_str!("../scripts/fleet_acquire.lua")
);
/// The source of `scripts/fleet_settle.lua`, after the bucket functions.
pub const SETTLE: &str = concat!(
    include_str!("../scripts/fleet_bucket.lua"),
    include_str!("../scripts/fleet_settle.lua")
);
/// The source of `scripts/fleet_pause.lua`.
pub const PAUSE: &str = include_str!("../scripts/fleet_pause.lua");
/// The source of `scripts/fleet_renew.lua`.
pub const RENEW: &str = include_str!("../scripts/fleet_renew.lua");
