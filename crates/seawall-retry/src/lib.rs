//! `BackoffRetryLayer`: the one retry loop of a seawall stack.
//!
//! Retries are where LLM clients go wrong most often: they retry what cannot succeed (an
//! `insufficient_quota` 429, a context-length 400), ignore the server's `Retry-After`, or honour
//! it without a cap, block for minutes because nothing bounds the total time, multiply the load
//! on an upstream that is already failing, and do all of it silently. This layer retries only
//! what the classification allows, waits as the server asks (within limits), stays inside a
//! total time budget and a shared retry budget, and logs every retry.
//!
//! It should be the *only* retry loop: turn the SDK's and the transport's retries off. In the
//! recommended stack it sits inside `observe` and `fallback` and outside `cost_budget`,
//! `breaker`, `gate`, the stream timeouts and `classify`, so every attempt is charged, counted
//! by the breaker and gated, while a backoff wait holds no gate permit.
//!
//! # How a failed attempt is decided
//!
//! The layer never looks at raw responses: it reads the [`LlmError`] the classifier made. In
//! order:
//!
//! 1. Local rejections (circuit open, gate full, budgets, deadlines) and `StreamInterrupted`
//!    are never retried here.
//! 2. The server's `x-should-retry` directive ([`LlmError::should_retry`]) wins either way;
//!    otherwise the class's [`Disposition`](seawall_core::Disposition) decides, with
//!    [`LlmRequest::is_idempotent`] for the classes that may have been billed (504, lost
//!    connection). 400/401/403/404/422, quota exhaustion, context length and content policy
//!    are never retried by default.
//! 3. A runtime switch that is off ([`RetryHandle::set_enabled`]) stops here
//!    ([`GiveUp::Disabled`]).
//! 4. `max_attempts` **counts the first call**: `max_attempts(3)` means one call and at most
//!    two retries. Each class also has its own maximum number of retries per call.
//! 5. The delay: the server's hint ([`LlmError::retry_hint`]: `Retry-After`, or the reset of
//!    an exhausted rate-limit window) plus up to 10% jitter, never less than the hint. A hint
//!    above the cap (60 s) fails at once ([`GiveUp::HintTooLong`]) with the hint still in the
//!    error, rather than sleeping for it or retrying early (a zero hint counts as none).
//!    Without a hint, the exponential [`Backoff`]; after an overload (503/529) at least 5 s
//!    (plus jitter). A server hint wins over the overload minimum too: the server knows.
//! 6. With a standby wait set ([`BackoffRetryBuilder::standby_wait`], off by default), when a
//!    fallback stands by for the request (a `FallbackLayer` outside marks it with
//!    [`seawall_core::Standby`] when it has a next target), a longer delay fails at once
//!    ([`GiveUp::Standby`]),
//!    with the upstream's class: an overload's 5 s on the primary is 5 s the backup would
//!    have spent answering. Nothing is spent from the retry budget. The chain's last target
//!    is not marked, so it waits as before.
//! 7. A delay that does not fit in what is left of the time budget fails at once
//!    ([`GiveUp::DeadlineTooClose`]): no wait ever crosses the budget.
//! 8. Last, the shared [`RetryBudget`] must grant the retry ([`GiveUp::RetryBudget`]
//!    otherwise; counted by [`RetryHandle::budget_exhausted`]).
//!
//! The final error is the last attempt's error, with the earlier attempts
//! ([`LlmError::attempts`]: class, status, time taken and delay slept after each) and the
//! reason ([`LlmError::give_up`]), so a caller can choose between a cached answer, a smaller
//! model and an error page. The upstream class is kept (a rate limit stays `RateLimited`), so
//! a fallback layer outside still sees what happened.
//!
//! # A breaker below that opens during a wait
//!
//! In an incident the calls that failed just before the circuit breaker below opened are all
//! waiting to retry (after an overload, at least 5 s), and each would wake only to be
//! refused by the open breaker; a fallback layer outside would get them only then, 5 s late.
//! So a seawall breaker attaches itself to the error of every attempt it admitted that failed
//! ([`seawall_core::Circuit`]), and while this layer waits it watches that breaker: if it
//! opens (or is forced open) and will still be open when the wait ends, the attempt the wait
//! is for is decided at once, as the refusal it would have got. The call then ends with the
//! breaker's `CircuitOpen` error and its history, which is what the wait would have led to,
//! only sooner, and the fallback takes it at once. A breaker that will be half-open by
//! the end of the wait cuts nothing short: the retry may be its probe. This costs nothing
//! on a call that does not wait; a wait that watches a breaker allocates its watch once.
//!
//! # Time budget
//!
//! The total time budget (120 s by default) covers every attempt and every wait of a logical
//! call, up to the response (the commit point: with the stream layer inside, the first real
//! content). It is checked before every wait, and an attempt still in flight when it runs
//! out is cancelled: the call fails with a [`FailureClass::DeadlineExceeded`] error that
//! carries the history and, in its message and source, the last upstream error. The clock
//! starts at the first poll of the response future (read lazily: a call answered at once
//! never reads it). A non-streamed call that legitimately takes
//! minutes needs a larger budget (or [`BackoffRetryBuilder::no_time_budget`]).
//!
//! # The caller's deadline
//!
//! A request carrying a [`Deadline`](seawall_core::Deadline) (an extension, or a
//! `grpc-timeout` / `x-seawall-timeout` / `x-stainless-timeout` header) cuts the time budget
//! to it. A wait that would end past the deadline is not slept, and no attempt starts past it:
//! the call ends at once with [`FailureClass::DeadlineExceeded`] and
//! [`GiveUp::DeadlineTooClose`], the last upstream error as its source and in its message
//! (and its retry hint kept), so the caller learns both that its time ran out and why. When
//! the layer's own budget is the tighter bound, a wait that does not fit ends the call with
//! the last upstream error, as above. A call that arrives past its deadline makes no attempt
//! and pays nothing into the retry budget.
//!
//! # Streams and the commit point
//!
//! An `Ok` from the inner service is passed through untouched: the stream layer inside only
//! answers once real content has arrived, so an `Ok` means the commit point was reached and
//! nothing after it (a broken stream is an error *of the body*) is ever retried. Only an `Err`
//! from the service future is.
//!
//! # Defaults
//!
//! | setting | default | why |
//! |---|---|---|
//! | `max_attempts` | 4 (one call + up to 3 retries) | lets an overload use its 3 retries; the per-class caps are the real limits |
//! | per-class retries | rate limit 2, overload 3, server error 2, 504 / lost connection 1 (idempotent only), connect 3, other retryable classes 2 | an SDK's 2 retries, more where the request never reached the upstream or an overload needs time |
//! | backoff | full jitter under `min(8 s, 0.5 s * 2^n)` | the official SDKs' curve (providers' limiters are tuned for it); full jitter spreads a fleet that failed together |
//! | server hint cap | 60 s, +0–10% jitter | what anthropic-python and the gateways honour; the jitter keeps a fleet from returning in lockstep |
//! | overload minimum | 5 s, +0–10% jitter | an overloaded upstream recovers in seconds, and an instant retry adds to the overload |
//! | time budget | 120 s | bounds the classic "30 s timeout × 3 attempts + sleeps" pile-up while leaving room for one 60 s hint |
//! | retry budget | 20% of calls + 10 per 10 s, shared | Finagle's and Envoy's ratio: an incident can add at most 20% load, while a quiet service can still retry |
//! | idempotency key / attempt header | off | they change what is sent upstream: opt in |
//!
//! # What the request type must provide
//!
//! `Req: LlmRequest + Clone`. The layer keeps one copy of the request to resend
//! ([`LlmRequest::keep`]) and makes each retry's request from it. An `http::Request<Bytes>` is
//! kept in parts that cost no allocation (the body is a reference-counted `Bytes`, a few
//! headers are kept inline, the extensions seawall puts in by value); the request is rebuilt
//! only when a retry sends it. A request with many headers or extensions of other types keeps
//! those maps cloned (a few small allocations, what `tower::retry::Retry` pays). Other request
//! types are cloned: a typed request should make `Clone` cheap (an `Arc` for the prompt). Headers (idempotency key, attempt number) are written through
//! [`LlmRequest::headers_mut`]; request types without headers are sent unchanged.
//!
//! The inner service must be `Clone` (tower's `mem::replace` pattern keeps a ready service for
//! the first call and a clone for the retries) and its error must convert into [`LlmError`].
//! The layer needs a tokio runtime with the time driver (all waits are `tokio::time`, so tests
//! run on paused time), and draws jitter from an injectable, seedable [`Random`] source.
//!
//! # Cost of a call that needs no retry
//!
//! One kept request (above) and one service clone; one reference-count
//! increment for the layer's shared state; one atomic add for the retry budget (a plain read
//! once the saved credit is full); no clock read, no timer and no allocation (the idempotency
//! key, when asked for, is the only one). The clock is read and the one timer armed only when
//! an attempt has to wait; the retry bookkeeping is allocated only at the first retry.
//!
//! [`Random`]: seawall_core::Random
#![doc(html_root_url = "https://docs.rs/seawall-retry/0.1.0")]
#![cfg_attr(
    test,
    allow(clippy::float_cmp, reason = "tests compare with exact expected values")
)]

mod backoff;
mod budget;
mod config;
mod future;
mod handle;
mod layer;
mod local;
mod policy;
mod service;
mod sync;

pub use backoff::{Backoff, Jitter};
pub use budget::RetryBudget;
pub use future::ResponseFuture;
pub use handle::RetryHandle;
pub use layer::{BackoffRetryBuilder, BackoffRetryLayer, IDEMPOTENCY_KEY};
pub use service::BackoffRetry;

#[doc(no_inline)]
pub use seawall_core::{Attempt, ConfigError, FailureClass, GiveUp, LlmError, LlmRequest};
