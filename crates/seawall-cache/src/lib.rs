//! seawall's `CacheLayer`: answers without calls.
//!
//! The cheapest, fastest and most reliable LLM call is the one not made. This layer serves a
//! request from a stored answer to an identical request, and makes identical requests in
//! flight at the same time share one upstream call. It is careful about what "identical"
//! means and about what is stored, since a careless cache either never hits (a timestamp in
//! the prompt makes every key unique) or serves wrong answers.
//!
//! # Where it goes
//!
//! Outside fallback and retry, inside observe:
//!
//! ```text
//! observe → cache → fallback → retry → budget → breaker → gate → stream → classify → transport
//! ```
//!
//! A hit then costs no attempt, no gate permit and no budget (the budget, inside, never sees
//! it), and the observer still records it once, as a call with `cache: hit`, 0 attempts and
//! 0 cost. Inside retry, a hit would be looked up per attempt; inside the budget, it would be
//! charged.
//!
//! ```
//! use bytes::Bytes;
//! use seawall_cache::{CacheLayer, MemoryStore};
//! use tower::ServiceBuilder;
//!
//! # fn stack<S, B>(upstream: S) -> impl tower::Service<http::Request<Bytes>>
//! # where
//! #     S: tower::Service<http::Request<Bytes>, Response = http::Response<B>> + Clone,
//! #     B: http_body::Body<Data = Bytes>,
//! # {
//! ServiceBuilder::new()
//!     // .layer(ObserveLayer::new())
//!     .layer(CacheLayer::new(MemoryStore::new()))
//!     // .layer(fallback).layer(retry).layer(budget) ...
//!     .service(upstream)
//! # }
//! ```
//!
//! # The key
//!
//! A SHA-256 digest of what determines the answer ([`KeyDeriver`]): method, path and query,
//! the API-version headers, the partition (by default the credential headers, so tenants never
//! share answers; see [`CacheBuilder::partition`] and
//! [`shared_across_tenants`](CacheBuilder::shared_across_tenants)), and the JSON body in a
//! canonical form independent of key order, whitespace and number spelling, without `stream`
//! and `stream_options`. A [normalisation hook](CacheBuilder::normalize) strips what varies
//! but does not change the answer.
//!
//! # What is stored
//!
//! Only complete answers: HTTP 200, a JSON or SSE body of the OpenAI Chat Completions or
//! Anthropic Messages format, the finish marker seen (and, with a classifier in the stack, its
//! report agreeing), no body error, the body read to its end, a finish reason of `stop` or
//! `length` (`end_turn`, `stop_sequence`, `max_tokens`), one choice of plain text, not served
//! by a fallback target (unless [allowed](CacheBuilder::allow_fallback_answers)) and never a
//! degraded one. An answer is kept in a compact canonical form ([`Answer`]) plus the raw body
//! of a non-streamed answer (whose parts are parsed from it only when a replay in the other
//! form first needs them), so a streamed request is served a valid SSE stream (in its own
//! wire format, ending with `[DONE]` or `message_stop`) from a non-streamed answer, and a
//! non-streamed request a JSON body from a streamed one.
//!
//! When a check is made is a matter of cost, not of what is stored or served. A miss checks at
//! once what it must know to keep the answer at all: the status, the content type, the body
//! read to its end without an error and within the entry bound, the fallback and the
//! classifier's report. The rest, for a JSON answer going to the [`MemoryStore`] (one choice
//! of plain text, the finish reason, the usage), is checked at the answer's first use: the
//! store's lookup and a waiting caller of the same flight check it before it is served, once,
//! and an answer that fails is never served, leaves the store, and its call is a miss as it
//! always was; and it replaces an answer already stored only if it passes the check then, so
//! a `no-cache` refresh that brings back a tool call keeps the stored answer, as before. Most
//! stored answers are never used again (hit rates are often low), and the
//! check was the largest part of a miss after the key. Such an answer holds its place and its
//! bytes (its raw body, counted as before) until its first use or its eviction, so answers
//! that turn out not storable can push the oldest entries out a little earlier than before.
//! Any other store, a remote one shared by a fleet, is handed checked answers only: a remote
//! write costs a round trip and an encoding of the answer's parts anyway, every instance of
//! the fleet would read an unchecked entry, and its readers are not all this layer.
//!
//! # What is passed through (`bypass`)
//!
//! Neither read nor written, counted as `bypass` in the call record:
//!
//! - other APIs than Chat Completions and Messages (Responses, embeddings, legacy
//!   completions), other methods than POST;
//! - bodies that are not a JSON object, nested deeper than 128 levels or larger than the
//!   [body limit](CacheBuilder::max_body_bytes);
//! - several choices (`n` or `best_of` above 1);
//! - a `temperature` above the [threshold](CacheBuilder::max_temperature) (1.0 by default; a
//!   request without one is sampled at the providers' default, 1.0);
//! - requests the [time-sensitive predicate](CacheBuilder::bypass_when) picks;
//! - `Cache-Control: no-store` or the [`CacheControl::NoStore`] extension.
//!
//! `Cache-Control: no-cache` (or [`CacheControl::NoCache`]) reads through: the call goes
//! upstream and its answer, if complete, replaces the stored one (also recorded as `bypass`).
//! Answers that turn out not to be cacheable (tool calls, thinking blocks or reasoning text
//! such as DeepSeek's `reasoning_content`, citations such as OpenAI's `annotations` or
//! Anthropic's `citations`, a content filter, a cut stream, an error) are passed through and
//! not stored; the call stays a `miss`.
//!
//! # Single flight
//!
//! Identical requests that miss at the same time share one upstream call: the first leads,
//! the others wait for its answer, each in its own future (dropping a waiter costs nothing).
//! How the flight ends decides what the waiters do:
//!
//! - the answer was complete and stored: every waiter is served it, as a hit;
//! - the leader went away (its future or its body dropped) first: the waiters join again, one
//!   of them leads a new flight, the others wait for it; nothing hangs;
//! - the leader's call failed, or its answer is not cacheable: a failure is never shared, and
//!   each waiter makes its own call, without a flight. (Putting them behind new leaders one at
//!   a time would make the last of N waiters wait N calls when the failure repeats; the layers
//!   inside the cache, breaker, gate and budget, protect the upstream from that burst.)
//!
//! A caller that misses just as another flight's answer lands is served that answer instead of
//! calling again: the in-memory store looks a key up and joins its flight under one lock,
//! under which a flight also stores its answer and ends; over a remote store, a new leader
//! looks once more before it calls if a flight landed since its first look.
//! Streamed requests wait for the whole answer, then get it replayed at once.
//!
//! # Usage and cost
//!
//! A hit's response carries the stored answer's usage (in its body and as a `Usage` response
//! extension), so clients see what the answer contains; the call record says `cache: hit`
//! with cost 0, and no budget is charged. Every response carries the [`CacheStatus`] in its
//! extensions and the [`CACHE_HEADER`] header.
//!
//! # Stores
//!
//! [`MemoryStore`] (bounded by entries and bytes, TTL on tokio's clock) is the default; any
//! [`CacheStore`] plugs in, such as a Redis store shared by a fleet.
//!
//! # Semantic cache (opt-in)
//!
//! With [`CacheBuilder::semantic`], an exact miss whose prompt is close enough in meaning to
//! one whose answer is stored is served that answer, marked `semantic(score)` in the header
//! and the call record. Only the prompt's text may differ: the model, the parameters, the
//! tools, the tenant and the conversation's shape must be identical (the search runs among
//! the entries of the request's *context key*, its key without the text). The similarity is
//! cosine, over vectors from a pluggable [`Embedder`] ([`OpenAiEmbedder`] calls an
//! `/embeddings` endpoint through a seawall stack); the threshold is 0.95 by default and never
//! below [0.80](CacheBuilder::SEMANTIC_THRESHOLD_FLOOR). The bypass rules are the exact
//! cache's; a failing embedder makes a plain miss. The [`SemanticIndex`] searches exactly:
//! a scan of 1,000 vectors of dimension 1536 takes 0.25 ms and of 10,000 about 7 ms (1 ms at
//! dimension 256), less than the embedding call that precedes it.
//!
//! ```
//! use seawall_cache::{CacheLayer, EmbedFuture, Embedder, MemoryStore};
//!
//! # struct MyEmbedder;
//! # impl Embedder for MyEmbedder {
//! #     fn embed(&self, _: &str) -> EmbedFuture { Box::pin(std::future::ready(Ok(vec![1.0]))) }
//! # }
//! let layer = CacheLayer::builder(MemoryStore::new())
//!     .semantic(MyEmbedder)
//!     .semantic_threshold(0.97)
//!     .build()?;
//! assert!(layer.semantic_index().is_some());
//! # Ok::<(), seawall_core::ConfigError>(())
//! ```
#![doc(html_root_url = "https://docs.rs/seawall-cache/0.1.0")]

mod answer;
mod body;
mod flight;
mod future;
mod key;
mod layer;
mod semantic;
mod service;
mod store;

pub use answer::{Answer, Assembler, DecodeError, Format, NotCacheable, SharedAnswer, Wire};
pub use body::CacheBody;
pub use future::{CACHE_HEADER, ResponseFuture};
pub use key::{BodyFacts, CacheKey, KeyDeriver, Normalize, Unkeyable};
pub use layer::{BypassFn, CacheBuilder, CacheLayer, PartitionFn};
pub use seawall_core::{CacheStatus, ConfigError};
pub use semantic::{EmbedError, EmbedFuture, Embedder, OpenAiEmbedder, SemanticIndex};
pub use service::{Cache, CacheControl};
pub use store::{CacheStore, MemoryStore, StoreError, StoreFuture};
