//! The shared vocabulary of seawall.
//!
//! seawall is a set of tower middleware that keeps LLM API failure storms away from an
//! application. Every layer decides from one classification of each outcome, so they all speak
//! the types defined here:
//!
//! - [`FailureClass`] and its default [`Disposition`] (retry? counts for a breaker? worth a
//!   fallback?), overridable per class in a [`Dispositions`] table;
//! - [`LlmError`], the one error type of every layer, which never prints credentials;
//! - [`RateLimitSnapshot`], the upstream's rate-limit headers in one shape;
//! - [`LlmRequest`] and [`LlmResponse`], the few things layers read from requests and responses,
//!   implemented for `http::Request<Bytes>` / `http::Response<B>` and easy to implement for a
//!   typed client;
//! - [`AdmitFuture`], the response future of every layer that admits a call before sending
//!   it (the gate, the budget, the fleet-wide limits), with an [`AdmitGuard`] per layer;
//! - [`OnComplete`] hooks and [`HookedBody`], so a permit or a budget reservation is held until
//!   a streamed body ends or is dropped, not released at the response head;
//! - [`BodyReport`], the facts about a body (usage, finish reason, first token) parsed once,
//!   and [`ReportedUsage`], the one reading of the providers' usage objects into a [`Usage`];
//! - [`SseDecoder`], the one server-sent-events line splitter and event assembler, and
//!   [`FinishReason::from_provider`], the one reading of the providers' finish reasons;
//! - [`CallContext`], through which layers report to an observer, and [`CacheStatus`], what
//!   a cache did with a call, and [`ContextAction`], what a context guard did with it;
//! - [`Deadline`], the caller's deadline that every inner bound is cut to;
//! - [`Spare`], the one clone of an inner service that a layer's later calls (retries,
//!   fallbacks to the same path, continuations, a cache's misses after a wait) are cloned
//!   from, and [`ThreadBound`], a state handle of one thread's;
//! - [`Random`], an injectable, seedable jitter source;
//! - [`ConfigError`], what every builder returns for a value it refuses;
//! - [`KeyFn`], how breakers, gates and budgets read a request's key ([`StateKey`] by
//!   default), and [`bound_key`], which caps the length of the keys their state is stored under;
//! - [`ModelMap`], the lookup by model name (exact, or a `*` prefix pattern) that the price
//!   table and the context windows share, and [`read_table_file`] for their files.
#![doc(html_root_url = "https://docs.rs/seawall-core/0.1.0")]

mod admit;
mod circuit;
mod class;
mod config;
mod context;
mod deadline;
mod error;
mod finish;
mod future;
mod inline;
pub mod json_scan;
mod key;
mod model_map;
mod random;
mod ratelimit;
mod ratelimit_headers;
mod request;
mod response;
mod spare;
mod sse;
mod thread;
mod time;
pub mod upstream;
mod usage;
mod wire;

pub use admit::{AdmitFuture, AdmitGuard, PendingAdmission};
pub use circuit::{Circuit, Refusal};
pub use class::{Disposition, Dispositions, FailureClass, Fallback, RetryPolicy};
pub use config::ConfigError;
pub use context::{CacheStatus, CallContext, CallFacts, ContextAction, ServedBy};
pub use deadline::{Deadline, TIMEOUT_HEADER, parse_grpc_timeout};
pub use error::{
    Attempt, BoxError, GiveUp, LlmError, MAX_MESSAGE_LEN, redact, redact_shared, shown_id,
};
pub use finish::ChoiceEnds;
pub use future::{POLLED_AFTER_COMPLETION, polled_after_completion};
pub use inline::{FrameQueue, shared_name};
pub use key::{BorrowedKey, FixedKey, KeyFn, MAX_KEY_LEN, ModelKey, StateKey, bound_key};
pub use model_map::{ModelMap, TableFormat, read_table_file};
pub use random::{Random, SeededRandom};
pub use ratelimit::{RateLimitSnapshot, RateLimitWindow};
pub use ratelimit_headers::{ANTHROPIC_RATE_LIMIT_HEADERS, OPENAI_RATE_LIMIT_HEADERS};
pub use request::{
    Idempotent, KeptRequest, LlmRequest, MediaParts, PROMPT_FIELDS, PartEstimate, Prepared,
    Provider, RequestMeta, RequestSizes, ServiceTier, Standby,
};
pub use response::{
    BodyReport, Completion, FinishReason, HookedBody, LlmResponse, OnComplete, Outcome,
    REQUEST_ID_HEADERS, StreamEnd, StreamTiming, Usage, as_llm_error, content_coding, header,
    is_media_type, request_id, reserve_extensions, size_hint_plus,
};
pub use spare::{Spare, SpareClone};
pub use sse::{SseDecoder, SseEvent, SseItem};
pub use thread::{ThreadBound, thread_tag};
pub use time::instant_after;
pub use usage::ReportedUsage;
pub use wire::ChatWire;
