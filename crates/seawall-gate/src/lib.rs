//! A concurrency gate for LLM calls: shared permits, a bounded FIFO queue, per-key request and
//! token rates that read the upstream's rate-limit headers, and an adaptive limit.
//!
//! # Why
//!
//! A batch job that fires thousands of requests at once trips the provider's rate limits, then
//! retries into them. Requests queued inside an HTTP client's connection pool look like a slow
//! upstream, and nothing bounds how long they wait. [`ConcurrencyGateLayer`] keeps the queue in
//! the application's hands:
//!
//! - **Permits shared by every clone** of the service (tower's `ConcurrencyLimitLayer` makes a
//!   new semaphore per `layer()` call). A permit is taken for each attempt and held until the
//!   response *body* ends or is dropped, so a stream keeps its permit while it streams. It is
//!   given back when the caller drops the future at any point, queued or in flight.
//! - **A bounded FIFO queue**: at most `max_queue` calls wait, each at most `max_wait`. One more
//!   is rejected at once with an [`LlmError`](seawall_core::LlmError) of class `GateRejected`
//!   ("busy, retry later") naming the queue depth; [`Rejection::of`] gives the details.
//! - **Request and token rates per key** (`host/model` by default): a token bucket with
//!   continuous refill ([`Rates`], [`Limit`]). A call costs one request and its estimated
//!   tokens (prompt estimate plus `max_tokens`); when the response reports its usage, unused
//!   tokens go back and an overrun is charged.
//! - **Reads the upstream**: a response whose rate-limit headers say `remaining = 0`, or a 429
//!   with a `Retry-After` or reset, pauses admissions for that key until the reset, so queued
//!   calls wait in the gate instead of each earning its own 429.
//! - **A fallback that stands by**: holding a call for seconds of its key's rate while the
//!   backup named in a fallback chain has room is the wrong trade. A request marked
//!   [`Standby`](seawall_core::Standby) (the fallback layer marks those it has a next target
//!   for) waits for its key's rate or pause at most the
//!   [standby wait](ConcurrencyGateBuilder::standby_wait), counting the calls already in the
//!   key's line; one that would wait longer is turned away at once with
//!   [`RejectReason::Spilled`], and the fallback sends it on.
//! - **Runtime control**: a [`GateHandle`] changes the limit, the queue, the wait and the rates
//!   without rebuilding the stack; an [`Adaptive`] mode lowers the limit on 429s and overloads
//!   and raises it back slowly.
//! - **Priority lanes** (opt-in, [`lane`](ConcurrencyGateBuilder::lane)): a batch job sharing
//!   the gate with interactive traffic would otherwise fill the one FIFO queue, and every
//!   interactive call would wait behind its backlog. A call's [`Priority`] (an extension or
//!   the [`PRIORITY_HEADER`]) picks its lane; each lane has a [`LaneShare`] of the permits
//!   and of each key's rate burst, borrows what the other lane leaves idle, and waits first
//!   when both are busy. The queue serves the interactive lane first, yet passes a waiting
//!   batch call over at most [`LANE_FAIRNESS`] times in a row. The rules are in
//!   [`LaneShare`]'s documentation.
//! - **The caller's deadline**: a [`Deadline`](seawall_core::Deadline) cuts the maximum wait
//!   to what remains of it. A call that cannot be admitted before it fails with
//!   `DeadlineExceeded` (not `GateRejected`: the gate is not what is short, the caller's time
//!   is, and a retry would not help); one already past it fails before taking a permit. A
//!   call with a standby is spilled instead: the fallback may still answer in time.
//! - **Visible queue time**: each call's wait goes into the request and response extensions
//!   ([`QueueWait`]), the per-call `CallContext`, and a `tracing` field (`queue_wait_ms`).
//!
//! # Where it goes
//!
//! Inside the retry layer (so a backoff sleep holds no permit) and outside the stream timeouts
//! and the classifier (so it sees classified errors and the body's usage):
//! `observe → fallback → retry → cost_budget → breaker → gate → timeouts → classify → transport`.
//!
//! # How a call is admitted
//!
//! 1. If the key's line is free, the key is not paused and its buckets hold the cost, and a
//!    permit is free with nobody queued for it, the call goes at once: a read-locked key lookup,
//!    a semaphore `try_acquire`, the key's bucket mutex only when it has rates, and no
//!    allocation besides the [`QueueWait`] extension entries (when the types have extensions).
//!    A gate with lanes adds the lane's rules under one mutex; a caller's deadline costs one
//!    extension lookup and a clock read.
//! 2. Otherwise it takes a queue place (or is rejected when the queue is full). A key with rates
//!    or a pause has a FIFO line of its own: its head sleeps until the pause ends and the
//!    buckets hold its cost (rejecting at once when that is past the deadline, or for a call
//!    with a standby, past its standby wait), then waits for a
//!    permit in the gate-wide FIFO. Rates are taken only when the permit is in hand, so a call
//!    that waited long for a permit never sends in a clump with others, and a call dropped
//!    while waiting leaves no trace.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use seawall_core::LlmError;
//! use seawall_gate::{ConcurrencyGateLayer, QueueWait, Rates};
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gate = ConcurrencyGateLayer::builder()
//!     .limit(8)
//!     .max_queue(100)
//!     .max_wait(Duration::from_secs(5))
//!     .rates(Rates::new().requests_per_minute(500).tokens_per_minute(100_000))
//!     .build()?;
//! let transport = service_fn(|_req: Request<Bytes>| async {
//!     Ok::<_, LlmError>(Response::new(Full::new(Bytes::from_static(b"{}"))))
//! });
//! let mut svc = ServiceBuilder::new().layer(gate.clone()).service(transport);
//!
//! let req = Request::post("https://api.openai.com/v1/chat/completions")
//!     .body(Bytes::from_static(br#"{"model":"gpt-4o-mini","max_tokens":64,"messages":[]}"#))
//!     .unwrap();
//! let resp = svc.ready().await?.call(req).await?;
//! assert_eq!(resp.extensions().get::<QueueWait>(), Some(&QueueWait(Duration::ZERO)));
//! assert_eq!(gate.handle().stats().admitted, 1);
//! # Ok(())
//! # }
//! ```
#![doc(html_root_url = "https://docs.rs/seawall-gate/0.1.0")]
#![cfg_attr(
    test,
    allow(clippy::float_cmp, reason = "tests compare with exact expected values")
)]

mod permits;
mod sync;

/// Marks every item in it `#[cfg(not(loom))]`: the loom build models the permit pool alone,
/// and one list of what it leaves out reads better than a `cfg` line on each item.
macro_rules! not_loom {
    ($($item:item)*) => { $( #[cfg(not(loom))] $item )* };
}

not_loom! {
    mod adaptive;
    mod autosize;
    mod config;
    mod error;
    mod future;
    mod handle;
    mod key;
    mod lanes;
    mod layer;
    mod rate;
    mod service;
    mod shared;
    mod striped;

    pub use adaptive::Adaptive;
    pub use autosize::{AutoSize, LATENCY_WEIGHT};
    pub use config::{
        DEFAULT_LIMIT, DEFAULT_MAX_KEYS, DEFAULT_MAX_PAUSE, DEFAULT_MAX_QUEUE, DEFAULT_MAX_WAIT,
        DEFAULT_STANDBY_WAIT,
    };
    pub use error::{QueueWait, RejectReason, Rejection};
    pub use future::ResponseFuture;
    pub use handle::GateHandle;
    pub use layer::{ConcurrencyGateBuilder, ConcurrencyGateLayer};
    pub use key::Cost;
    pub use lanes::{DEFAULT_LANE_LINGER, LANE_FAIRNESS, LaneShare, LaneStats, PRIORITY_HEADER, Priority};
    pub use rate::{Bucket, Limit, Rates, Ready};
    /// The gate's former name of [`KeyFn`], with the same method: kept so that key types written
    /// against it still compile.
    #[doc(hidden)]
    pub use seawall_core::KeyFn as GateKey;
    pub use seawall_core::{BorrowedKey, FixedKey, KeyFn, ModelKey, StateKey};
    pub use service::ConcurrencyGate;
    pub use shared::{GatePermit, GateStats, pause_hint};

    #[doc(no_inline)]
    pub use seawall_core::ConfigError;
}
