//! seawall's `ContinueLayer`: one answer, even when it was cut.
//!
//! An answer can be cut two ways. The upstream stops at `max_tokens` (`finish_reason:
//! "length"`, `stop_reason: "max_tokens"`): the answer is well formed but incomplete. Or a
//! stream breaks after its first token: the caller has part of the answer, and without this
//! layer its stream ends with a `StreamInterrupted` error, which nothing may retry (the commit
//! point is past). The cure is the same: ask the model to go on from exactly where it
//! stopped, with a follow-up request that is the original request plus the partial answer as
//! the assistant's last turn, and give the caller one answer.
//!
//! # How a follow-up asks ([`ContinuationStyle`])
//!
//! - Anthropic Messages: an assistant prefill (the last message is the assistant's; the
//!   answer continues it). Anthropic refuses a prefill that ends in whitespace, so trailing
//!   whitespace is left out of it and dropped from the continuation's start if repeated.
//! - OpenAI-compatible servers, chosen per layer with [`ContinueBuilder::openai_style`]:
//!   vLLM's `continue_final_message` ([`ContinueFinalMessage`](ContinuationStyle::ContinueFinalMessage)),
//!   DeepSeek's and Mistral's `"prefix": true` ([`Prefix`](ContinuationStyle::Prefix)), or,
//!   for plain OpenAI, which has no continuation support, an extra user turn asking to
//!   continue exactly where it stopped ([`Instruction`](ContinuationStyle::Instruction), the
//!   default), with the overlap a model may repeat trimmed.
//!
//! # What the caller gets
//!
//! - **Length, not streamed**: one answer whose text is the concatenation, whose usage is the
//!   sum of the attempts' and whose finish reason is the last one. If a follow-up fails, the
//!   answer as far as it got (still finishing with `length`).
//! - **Length, streamed**: the continuation's content chunks follow in the same stream: no
//!   second role delta or `message_start`, one `[DONE]` or `message_stop`, the final usage
//!   summed.
//! - **Resume**: a stream cut after its first token (the body yields a `StreamInterrupted`
//!   error; DeepSeek's `finish_reason: insufficient_system_resource` and a router's `error`
//!   are such cuts) does not
//!   end: the continuation's content follows what was delivered, without
//!   duplicated text (every event is passed on whole, so a cut never leaves half an event
//!   with the caller), and the final usage is the sum (the cut attempt's output counted by
//!   its content deltas, its prompt estimated, when it was cut before it said). If
//!   resumption is off or unsupported for the answer (a tool call, a thinking block or
//!   reasoning text such as `reasoning_content`), or the follow-up fails before its first
//!   content, the caller gets the `StreamInterrupted` error unchanged.
//!
//! # A cut before the caller saw anything: asked again ([`restart_within`](ContinueBuilder::restart_within))
//!
//! A resumption is not free: its prompt carries the prompt again, the text so far and the
//! turns that ask to go on. For a stream cut within its first dozen tokens or so, sending the
//! original request again costs less, but only if the caller has none of the cut stream yet.
//! With `restart_within(n)` the layer holds a stream's events back until its text reaches
//! `n` tokens (or the answer ends, or it is one the layer cannot continue): a cut before that
//! drops what was held and sends the original request again, whose stream the caller then
//! gets from its start, and a cut after it is resumed as above. The layer moves the commit
//! point, as the caller sees it, `n` tokens later, and the caller's first token with it. Off
//! by default.
//!
//! Up to [`max_continuations`](ContinueBuilder::max_continuations) follow-ups per call
//! (3 by default), continuations, resumptions and restarts together. The call record counts
//! them: [`CallFacts::continuations`](seawall_core::CallFacts), `resumed` and `restarts`.
//!
//! # Where it goes
//!
//! Outside retry, budget and gate; inside cache and observe:
//!
//! ```text
//! observe → cache → continue → fallback → retry → budget → breaker → gate → stream → classify → transport
//! ```
//!
//! Each follow-up goes through the inner stack like any call: it is retried, gated, admitted
//! by the breaker and priced by the budget (which prices each attempt itself, so the cost
//! needs no summing here). Inside observe, the call is recorded once, with its continuations;
//! inside the cache, the cache stores the whole answer, never a part. Outside fallback, a
//! follow-up may be served by a fallback target when the primary is down.
//!
//! ```
//! use seawall_continue::ContinueLayer;
//! use tower::ServiceBuilder;
//!
//! # fn stack<S: Clone>(upstream: S) -> impl Sized {
//! ServiceBuilder::new()
//!     // .layer(ObserveLayer::new()).layer(CacheLayer::new(..))
//!     .layer(ContinueLayer::new())
//!     // .layer(fallback).layer(retry).layer(budget) ...
//!     .service(upstream)
//! # }
//! ```
//!
//! # Cost
//!
//! A request the layer may continue is kept (core's `KeptRequest`: its parts, without
//! allocating) and rebuilt only when a follow-up is made, and so is the follow-up's service
//! (cloned from one spare the service keeps, not for every call). A
//! non-streamed answer whose finish reason the classifier already read passes through
//! untouched; without a classifier, the answer's finish reason is scanned from its bytes
//! (nothing built, a body of one frame not copied), and the answer is parsed only when it
//! finished with `length`. A stream is read event by event, each in one pass of a byte cursor
//! that keeps only what the layer needs (the text, the finish reason, whether it is a tool
//! call, the usage once); anything that pass is unsure of is read by serde as before.
#![doc(html_root_url = "https://docs.rs/seawall-continue/0.1.0")]

mod answer;
mod body;
mod events;
mod future;
mod layer;
mod request;
mod scan;
mod service;
mod trim;
mod usage;

pub use body::ContinueBody;
pub use future::ResponseFuture;
pub use layer::{
    ContinuationStyle, ContinueBuilder, ContinueLayer, DEFAULT_INSTRUCTION,
    DEFAULT_MAX_CONTINUATIONS,
};
pub use service::Continue;
