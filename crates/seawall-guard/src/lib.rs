//! seawall's `ContextGuardLayer`: a request that cannot fit its model's context window is
//! dealt with before it is sent.
//!
//! A request whose prompt plus `max_tokens` is larger than the model's window is refused by
//! the upstream with a 400, after a full round trip (a large prompt takes a while to upload),
//! sometimes after time in a queue and a reservation in a budget, and through some gateways
//! with a bill. This layer knows the windows ([`ContextWindows`], loaded from TOML or JSON
//! like the budget's price table), counts the prompt ([`TokenEstimator`]) and decides first,
//! as its [`ContextPolicy`] says:
//!
//! - [`Refuse`](ContextPolicy::Refuse) (the default): fail at once with
//!   `ContextLengthExceeded`, the class the upstream's 400 would have had, so the layers
//!   outside act on it as on the real thing: a fallback sends it to its larger-context list.
//! - [`TrimOldest`](ContextPolicy::TrimOldest): drop the oldest conversation turns until it
//!   fits, never a system prompt, never the last user turn, never half of a tool call and its
//!   results (OpenAI Chat Completions and Anthropic Messages).
//! - [`LowerMaxTokens`](ContextPolicy::LowerMaxTokens): lower the output bound to the room
//!   the prompt leaves, down to a floor, and refuse below it.
//!
//! An output bound above the model's own output limit (when the table gives one) is refused
//! as `InvalidRequest` (a larger window would not help), or lowered to the limit under
//! `LowerMaxTokens`. After a rewrite the body's cached facts
//! ([`RequestMeta`](seawall_core::RequestMeta)) are parsed again, so the layers inside (the
//! budget's reservation, the gate's token buckets) see the request that is sent.
//!
//! # Where it goes
//!
//! Directly inside the fallback, outside retry:
//!
//! ```text
//! observe → cache → fallback → guard → retry → budget → breaker → gate → stream → classify → transport
//! ```
//!
//! - **Inside fallback**, so its refusal reaches the fallback's larger-context list as an
//!   ordinary `Err`, and the fallback's rewritten request (another model) comes back through
//!   the guard and is checked against *that* model's window: the larger model is called only
//!   if the prompt fits it. Outside the fallback, the guard would check the primary model only
//!   and its refusal would be final.
//! - **Outside retry**, so the check runs once per target rather than once per attempt (a
//!   refusal is never retried anyway), and **outside the budget and the gate**, so a refused
//!   call takes no reservation and no permit, and a trimmed one is charged for what is sent.
//! - A fallback target that is another service (seawall-fallback's `Target::service`: another
//!   provider's own stack) does not pass through this guard: give that stack a guard of its
//!   own.
//!
//! # What is not checked
//!
//! A model the table does not list (and no `[default]`), a request without a model, and a
//! body that is not a JSON object pass through unchanged, recorded as
//! [`ContextAction::Skipped`]: the guard refuses only what it knows. No input makes it panic:
//! numbers out of range are clamped as seawall-core reads them, and a body it cannot rewrite
//! is refused with a clear message instead of being sent too long. Without a `messages`
//! array (the legacy `prompt`, the Responses API's `input`) there is nothing to trim, so
//! `TrimOldest` refuses what does not fit.
//!
//! The count is an estimate unless an exact tokenizer is plugged in: the default
//! ([`CharEstimate`]) is the one the rest of the stack uses, and the `tiktoken` feature adds
//! `TiktokenEstimate`, exact for OpenAI models.
//!
//! # The record
//!
//! With an observer outside, the call's [`CallFacts`](seawall_core::CallFacts) get
//! `context_guard`: `skipped`, `fits`, `refused`, `trimmed(turns)` or
//! `max_tokens_lowered(from->to)` ([`ContextAction`]).
//!
//! ```
//! use bytes::Bytes;
//! use seawall_core::{FailureClass, LlmError};
//! use seawall_guard::{ContextGuardLayer, ContextWindows, ModelLimits};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let windows = ContextWindows::new().with("small-model", ModelLimits::new(1_000));
//! let upstream = tower::service_fn(|_req: http::Request<Bytes>| async {
//!     Ok::<_, LlmError>(http::Response::new(Bytes::from_static(b"{}")))
//! });
//! let client = ServiceBuilder::new()
//!     .layer(ContextGuardLayer::new(windows))
//!     .service(upstream);
//!
//! let long = "word ".repeat(2_000); // about 2,500 tokens
//! let body = format!(r#"{{"model":"small-model","max_tokens":100,"messages":[{{"role":"user","content":"{long}"}}]}}"#);
//! let req = http::Request::post("https://api.example/v1/chat/completions").body(Bytes::from(body)).unwrap();
//! let err = client.oneshot(req).await.unwrap_err();
//! assert_eq!(err.class(), FailureClass::ContextLengthExceeded);
//! # }
//! ```
#![doc(html_root_url = "https://docs.rs/seawall-guard/0.1.0")]

mod estimate;
mod future;
mod layer;
mod policy;
mod service;
#[cfg(feature = "tiktoken")]
mod tiktoken;
mod trim;
mod windows;

pub use estimate::{CharEstimate, TokenEstimator};
pub use future::ResponseFuture;
pub use layer::{ContextGuardBuilder, ContextGuardLayer};
pub use policy::ContextPolicy;
pub use service::ContextGuard;
#[cfg(feature = "tiktoken")]
pub use tiktoken::TiktokenEstimate;
pub use windows::{ContextWindows, ModelLimits};

#[doc(no_inline)]
pub use seawall_core::{ConfigError, ContextAction};
