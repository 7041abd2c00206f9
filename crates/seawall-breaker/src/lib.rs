//! A keyed circuit breaker for LLM calls, as a tower layer.
//!
//! When a provider or a model is down, callers should fail in microseconds instead of piling
//! up 30-second timeouts and retries against it. [`CircuitBreakerLayer`] keeps one breaker per
//! key (`host/model` by default, from [`LlmRequest::state_key`]; any [`KeyFn`] through
//! [`CircuitBreakerBuilder::key_fn`], requests without a key sharing the breaker of the empty key) in one
//! layer, and rejects calls to a sick key with an [`LlmError`] of class
//! [`CircuitOpen`](seawall_core::FailureClass::CircuitOpen) whose `retry_after` says when
//! the next probe is allowed, which a fallback layer can act on at once.
//!
//! # What counts
//!
//! The breaker is about the *upstream's* health, so by default only classes whose
//! [`Disposition`](seawall_core::Disposition) says `counts_for_breaker` are failures: 5xx and
//! 529 overloads, upstream and local timeouts, connection failures, and streams broken after
//! their first token. Everything else is *neither* a success nor a failure: 4xx (bad requests,
//! context length, content filter, auth), rate limits and exhausted quotas (back-pressure, not
//! sickness), seawall's own rejections, cancelled calls (a future or body dropped early), and
//! answers a cache stacked inside the breaker served (no call reached the upstream).
//! A 429 storm or a burst of bad requests never opens the breaker, and does not interrupt a
//! run of consecutive failures either. Change this per class with
//! [`CircuitBreakerBuilder::verdict`], [`CircuitBreakerBuilder::dispositions`] and [`CircuitBreakerBuilder::on_cancel`].
//!
//! One class is different: an exhausted quota is not sickness, but it does not pass in
//! seconds either (a spending limit, an unpaid bill), and every call sent to the key meanwhile
//! costs a round trip for the same refusal. So one call ending in `QuotaExhausted` opens the
//! key's breaker at once: calls are refused locally (a fallback layer outside sends them to
//! its next target at once), one probe per open period finds out when the key is topped up,
//! and the period doubles while it is not. The refusals say the quota is the cause.
//! [`CircuitBreakerBuilder::open_at_once`] changes the list (empty: off).
//!
//! An outcome is known only when the body ends: a stream that breaks after its first token is
//! a failure, one that ends normally a success. So an admitted call holds its place (a
//! half-open probe slot in particular) until its body ends or is dropped, through
//! [`LlmResponse::on_complete`].
//!
//! # States
//!
//! `Closed` → `Open` when, in the closed state, any trip condition holds:
//!
//! - the failure rate over a count window (last 100 calls by default) or a time window reaches
//!   its threshold (50%), once the window holds the minimum number of calls (20). Until the
//!   window is full (a count window) or has spanned its duration (a time window), the calls
//!   whose response head arrived and whose outcome is not known yet count in the rate's
//!   denominator: a stream's success is recorded only when it ends, so in the first seconds
//!   after a start or a close, at hundreds of streams a second, the window would otherwise
//!   hold only the few failures at the head, and a 3% error rate would read as 100%. Once it
//!   is full, outcomes alone count, so a provider whose every stream breaks after its head
//!   still opens it;
//! - 5 failures in a row (ignored outcomes do not break the streak). "In a row" means one
//!   after the other with no answer between them. A stream's failure comes at its head and
//!   its success only when its body ends, seconds later, so in a burst of streams a few
//!   early errors would otherwise count as a run while hundreds of answers were flowing (the
//!   start of any busy minute, or a fallback target receiving a failed-over burst). So a
//!   response head ends the run (a stream that breaks after it is still a failure, in the
//!   failure rate), and a failure extends the run only if no other failure was recorded
//!   while its call was in flight: calls that fail together are one step. A success at a
//!   body's end does not end the run: its head already did, when it came. A stream that
//!   answered before the failures began, ending well among them, says nothing of the
//!   upstream now, and at the start of a storm the streams already flowing would otherwise
//!   break every run for seconds;
//! - optionally, the slow-call rate: a call is slow when its response head took longer than a
//!   threshold. Behind seawall's stream layer the head is the first token, so this is time to
//!   first token, not the length of the stream.
//!
//! `Open` rejects calls for 10 s, doubling with each consecutive re-open up to 120 s, minus up
//! to 10% jitter. An error can also open the breaker until the instant it names (a
//! `retry-after`, or the reset of an exhausted rate-limit window) with
//! [`CircuitBreakerBuilder::open_on_retry_hint`]. Then `HalfOpen` admits exactly [`CircuitBreakerBuilder::probes`] calls at
//! once (1), however many callers race for them; [`CircuitBreakerBuilder::probe_successes`] successes close
//! it, [`CircuitBreakerBuilder::probe_failures`] failures re-open it. A probe that neither ends nor is
//! dropped loses its slot after [`CircuitBreakerBuilder::max_probe_wait`] (60 s), so a breaker cannot stay
//! half-open forever.
//!
//! Through a [`BreakerHandle`] a key (or every key) can be switched at run time to
//! `ForcedOpen`, `Disabled` or `MetricsOnly` (count, never trip) and back, and every key's
//! state and counts can be read. Every state change is a `tracing` event (target
//! `seawall::breaker`) and, optionally, a callback ([`CircuitBreakerBuilder::on_state_change`]).
//!
//! # A retry above
//!
//! The error of every admitted attempt that failed carries this breaker
//! ([`LlmError::set_circuit`](seawall_core::LlmError::set_circuit)). A retry layer above that
//! waits before trying again watches it, and when the breaker opens during the wait and will
//! still be open when the wait ends, ends the call at once with the refusal it would get
//! (see `seawall_retry`'s docs): the calls that failed just before the breaker opened reach a
//! fallback at once instead of after their backoff.
//!
//! # A fleet
//!
//! By default each process keeps its own breakers. A fleet of replicas can share them through
//! a [`SharedBreakerState`] set with [`CircuitBreakerBuilder::shared_state`] (e.g.
//! `seawall_redis::RedisBreakerState`): a key the fleet opens opens on every replica within a
//! bounded delay, one replica probes for the whole fleet, and a key opens fleet-wide only on
//! the fleet's evidence, so one replica with a bad network does not open it for the others.
//! Nothing of this is on a call's path: the shared state's own task collects each key's
//! outcome counts and applies the fleet's decisions to the local breakers through a
//! [`FleetLink`].
//!
//! # Cost
//!
//! In the closed state a call does one map lookup under an uncontended read lock, one atomic
//! load of the state word, and on completion a ring-slot swap and a counter update: no lock
//! taken for writing, no allocation. Transitions take a per-key mutex. Keys are cut to
//! [`MAX_KEY_LEN`](seawall_core::MAX_KEY_LEN) bytes and capped in number
//! ([`CircuitBreakerBuilder::max_keys`], 1024); at the cap, idle closed keys are evicted, open ones never,
//! and keys that find no room share the [`OVERFLOW_KEY`] breaker.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use seawall_breaker::{CircuitBreakerLayer, State};
//! use seawall_core::{FailureClass, LlmError};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let breaker = CircuitBreakerLayer::builder()
//!     .consecutive_failures(3)
//!     .open_for(Duration::from_secs(30))
//!     .build()
//!     .unwrap();
//! let handle = breaker.handle();
//! let mut svc = ServiceBuilder::new().layer(breaker).service_fn(|_req: http::Request<Bytes>| async {
//!     Err::<http::Response<String>, _>(LlmError::new(FailureClass::ServerError, "500"))
//! });
//! let req = || {
//!     http::Request::post("https://api.openai.com/v1/chat/completions")
//!         .body(Bytes::from_static(br#"{"model":"gpt-4o","messages":[]}"#))
//!         .unwrap()
//! };
//! for _ in 0..3 {
//!     let err = svc.ready().await.unwrap().call(req()).await.unwrap_err();
//!     assert_eq!(err.class(), FailureClass::ServerError);
//! }
//! assert_eq!(handle.state("api.openai.com/gpt-4o"), Some(State::Open));
//! let err = svc.ready().await.unwrap().call(req()).await.unwrap_err();
//! assert_eq!(err.class(), FailureClass::CircuitOpen);
//! assert!(err.retry_after().unwrap() <= Duration::from_secs(30));
//! # }
//! ```
#![doc(html_root_url = "https://docs.rs/seawall-breaker/0.1.0")]

mod breaker;
mod config;
mod future;
mod layer;
mod local;
mod registry;
mod service;
mod shared;
mod state;
mod sync;
mod window;

pub use future::{BreakerGuard, ResponseFuture};
pub use layer::{CircuitBreakerBuilder, CircuitBreakerLayer, MAX_PROBES};
pub use registry::{BreakerHandle, OVERFLOW_KEY};
pub use seawall_core::{BorrowedKey, FixedKey, KeyFn, ModelKey, StateKey};
pub use service::CircuitBreaker;
pub use shared::{FleetLink, FleetRules, KeyReport, SharedBreakerState};
pub use state::{KeySnapshot, Mode, Reason, State, StateChange, Verdict};

#[doc(no_inline)]
pub use seawall_core::{ConfigError, LlmError, LlmRequest, LlmResponse};
