//! seawall's `RepairLayer`: a new turn, not a retry, for an answer that fails validation.
//!
//! A transport error deserves a retry: the same request, sent again, may well get through.
//! An answer that arrived fine but is unusable (the JSON does not parse, a field is missing)
//! does not: the same request sampled again costs as much and has the same odds. What helps
//! is what a person would do: show the model its answer and say what is wrong with it. This
//! layer does that. A validator of the caller's reads each complete answer (an [`Answer`]:
//! its text, finish reason and JSON, in OpenAI's or Anthropic's wire format); when it
//! complains, the layer sends a *repair turn*: the original messages, the answer as an
//! `assistant` turn and a `user` turn with the complaint (a [template](RepairBuilder::template)
//! with `{error}` in it), in the request's own wire format (Anthropic's `system` untouched).
//! After [`max_repairs`](RepairBuilder::max_repairs) turns (2 by default) it gives up with an
//! [`LlmError`](seawall_core::LlmError) of class
//! [`ContentInvalid`](seawall_core::FailureClass::ContentInvalid), whose source
//! ([`ContentInvalid`]) lists every answer's complaint.
//!
//! ```
//! use bytes::Bytes;
//! use seawall_repair::{RepairLayer, require_fields, validate_json};
//! use tower::ServiceBuilder;
//!
//! # fn stack<S, B>(upstream: S) -> impl tower::Service<http::Request<Bytes>>
//! # where
//! #     S: tower::Service<http::Request<Bytes>, Response = http::Response<B>> + Clone,
//! #     S::Error: Into<seawall_core::LlmError>,
//! #     B: http_body::Body<Data = Bytes>,
//! #     B::Error: Into<seawall_core::BoxError>,
//! # {
//! // Any closure over the answer will do; two common ones are shipped.
//! let fields = require_fields(&["city", "country"]);
//! let layer = RepairLayer::new(move |answer: &seawall_repair::Answer<'_>| {
//!     fields(answer)?;
//!     let city = answer.text_as_json()?["city"].as_str().unwrap_or_default().len();
//!     if city == 0 { return Err("`city` must be a non-empty string".into()); }
//!     Ok(())
//! });
//! ServiceBuilder::new()
//!     // .layer(ObserveLayer::new()).layer(CacheLayer::new(..))
//!     .layer(layer)
//!     // .layer(fallback).layer(retry).layer(budget) ...
//!     .service(upstream)
//! # }
//! ```
//!
//! # Where it goes
//!
//! Outside fallback, retry, budget and gate; inside cache and observe:
//!
//! ```text
//! observe → cache → repair → fallback → retry → budget → breaker → gate → stream → classify → transport
//! ```
//!
//! - **Outside retry, budget, breaker and gate**, so each repair turn is a call like any other:
//!   retried on a transport error, charged and settled by the budget, counted by the breaker,
//!   admitted by the gate (whose permit is not held between turns: the body of each turn is
//!   read to its end, which releases it). Inside retry, a retry would re-run the repair loop
//!   and the budget would not see the turns.
//! - **Outside fallback**, so an invalid answer from a fallback target is repaired too, and a
//!   repair turn whose primary is down is served by the fallback.
//! - **Inside cache**, so the cache stores the answer the caller got (valid, after its
//!   repairs) under the caller's request, never an invalid one.
//! - **Inside observe**, which records the logical call once, with `repairs` (each turn is
//!   also an attempt: `attempts` counts them, `retries()` does not).
//!
//! # What is validated, and what is passed through untouched
//!
//! Validated: a `POST` to Chat Completions or Messages, not streamed, asking for one answer,
//! whose response has a 2xx status and a JSON body of that format's answer shape, without
//! tool calls. Everything else is passed through untouched:
//!
//! - **streamed requests** (`"stream": true`): their answer reaches the caller as it is
//!   generated, and a repair can never run for an answer the caller has already seen;
//! - other APIs (Responses, embeddings), several answers (`n` above 1);
//! - error statuses (with a classifier below, those are `Err`s anyway);
//! - bodies that are not JSON or not an answer (no `choices[0].message`, no `content`
//!   array): there is no text to show the model, and the classifier reports broken or empty
//!   answers as errors of their own;
//! - answers with tool calls: a turn after a tool call must carry the tool's result, which
//!   only the caller has;
//! - **answers larger than [`max_body_bytes`](RepairBuilder::max_body_bytes)** (1 MiB by
//!   default): the layer reads at most that much to judge an answer, so a larger one (by its
//!   `content-length`, or once the bytes read pass the limit) is handed back unvalidated,
//!   what was read and then the rest. Failing a large but healthy answer would be worse than
//!   not judging it, and holding an unbounded body in memory is not an option.
//!
//! A validated answer is read whole before the caller sees a byte of it (that is the point),
//! and re-emitted as one frame, byte for byte, with the last turn's head.
//!
//! # Repair turns
//!
//! Each repair turn is the *original* request with the latest answer and its complaint
//! appended (not every earlier one: the prompt does not grow with each turn). Its
//! extensions come along (call context, deadline, idempotency), and its token estimate is
//! made again, since the prompt is longer. An empty answer adds no `assistant` turn (Anthropic
//! refuses an empty one), only the complaint. When the caller's
//! [`Deadline`](seawall_core::Deadline) has passed, no repair turn is sent: the layer gives
//! up with the complaints so far. A turn that fails (retries exhausted, budget spent) ends the
//! call with that turn's error. The call record's `usage` is the last turn's; its cost, all of
//! them.
#![doc(html_root_url = "https://docs.rs/seawall-repair/0.1.0")]

mod answer;
mod body;
mod error;
mod future;
mod layer;
mod service;
mod turn;

pub use answer::{Answer, Wire, require_fields, validate_json};
pub use body::RepairBody;
pub use error::{ContentInvalid, MAX_ERROR_LEN};
pub use future::ResponseFuture;
pub use layer::{DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_REPAIRS, RepairBuilder, RepairLayer};
pub use seawall_core::ConfigError;
pub use service::Repair;
pub use turn::{DEFAULT_TEMPLATE, ERROR_PLACEHOLDER};
