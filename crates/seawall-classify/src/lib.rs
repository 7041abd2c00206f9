//! `ClassifyLayer`: one classification of every outcome of an LLM API call.
//!
//! Every other seawall layer decides from a [`FailureClass`](seawall_core::FailureClass): the
//! retry layer retries a 429 `rate_limit_exceeded` but never a 429 `insufficient_quota`, the
//! breaker counts a 503 but not a 400, the fallback sends a `context_length_exceeded` to a
//! larger model. Those distinctions live in status codes, headers, JSON error bodies, SSE
//! events inside a 200 stream and transport error chains, and they differ between OpenAI-style
//! and Anthropic-style APIs. This crate reads all of them once, next to the transport, so the
//! layers above only ever see `Ok(response)` or an [`LlmError`](seawall_core::LlmError).
//!
//! [`ClassifyLayer`] wraps any `Service<http::Request<Bytes>, Response = http::Response<B>>`:
//!
//! - **Failure statuses** become `Err(LlmError)` with the class, status, provider code and
//!   type, message, request id, the server's retry hint (`retry-after-ms`,
//!   `x-ms-retry-after-ms`, `retry-after` as seconds or HTTP-date, "Please try again in
//!   1.4s"), `x-should-retry`, and the rate-limit snapshot. Error bodies are read up to a limit
//!   (64 KiB by default) and the rest is dropped unread.
//! - **Successful responses** pass through with a [`ClassifiedBody`] that never buffers a
//!   stream: it fills the shared [`BodyReport`](seawall_core::BodyReport) (first content,
//!   usage, model, finish reason, finish marker) and turns an error event inside the stream,
//!   a stream cut before its finish marker, or one that finished without any content, into a
//!   classified body error. The rate-limit snapshot is in the extensions, so a gate can act on
//!   `remaining = 0` before a 429.
//! - **Successful JSON answers** (not streamed) are small, so they are read ahead up to the
//!   error-body limit and parsed once *before* the future resolves: some OpenAI-compatible
//!   routers answer `200` with `{"error": {...}}`, and providers now and then return an
//!   answer with nothing in it. The first is the failure the object names (its numeric
//!   `status` or `code`, else its words, else `ServerError`); the second is
//!   `EmptyResponse`. Both are then ordinary `Err`s that retry and fallback act on, since
//!   nothing reached the caller. A larger answer passes through unread. Chat Completions,
//!   Messages and Responses API answers are read alike (a Responses answer's finish reason is
//!   its `incomplete_details.reason`, or a natural stop once `completed`; one that finished
//!   with no `output` items is empty; a background one still `queued` is not).
//! - **Transport errors** are classified from their source chain
//!   ([`classify_transport_error`]).
//!
//! Which classifier: [`AutoClassifier`] (the default) reads both wire formats, whichever a
//! response carries; [`OpenAiClassifier`] and [`AnthropicClassifier`] read one;
//! [`StatusClassifier`] looks at the status alone; implement [`Classifier`] for an upstream
//! of your own.
//!
//! Server hints are clamped to [`hints::MAX_HINT`] (one day); negative, NaN or unparseable
//! ones are ignored; a date in the past is zero. No input makes the classifier panic.
//!
//! Choices worth knowing:
//! - a stream that breaks or ends without its finish marker *before any content* is
//!   `Disconnected` (nothing reached the caller; retried only when idempotent, worth a
//!   fallback); after content it is `StreamInterrupted` (never retried);
//! - an SSE stream in a dialect other than OpenAI's or Anthropic's has no known finish marker,
//!   so its EOF is a normal end;
//! - an OpenAI stream that ends without `data: [DONE]` after every choice gave its finish
//!   reason is whole, not cut: some servers leave the marker out (Text Generation Inference
//!   before 2.1.1, some llama.cpp forks), and a connection can close just before it;
//! - a 429 whose only quota signal is its wording ("exceeded your current quota") but which
//!   says when to come back ("Please retry in 33s", or Google's `google.rpc.RetryInfo` in the
//!   body's `details`) is a per-window quota: `RateLimited`, retried after that delay; a
//!   `google.rpc.QuotaFailure` naming a per-day quota is `QuotaExhausted` whatever delay
//!   comes with it;
//! - a JSON answer of blank lines alone (DeepSeek keeps a slow request alive with empty lines,
//!   and may then close the connection) is `EmptyResponse`; blank lines before the document
//!   are read past;
//! - error events inside a stream, and error objects in a `200` JSON answer, are classified
//!   by the built-in rules for both wire formats, whatever the [`Classifier`]; so is an event
//!   or answer that is itself an error object (vLLM's `{"object": "error", ...}`) and, in a
//!   stream, Google's error objects in an array;
//! - an answer that stopped at the token limit with no content is not `EmptyResponse`: the
//!   same request would stop there again; one that the content filter stopped with no content
//!   (`content_filter`, Anthropic's `refusal`) is `ContentFiltered`, never retried;
//! - the body of the inner service must be `Unpin` (hyper's is), so that a JSON answer read
//!   ahead can be handed on.
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use seawall_classify::ClassifyLayer;
//! use seawall_core::FailureClass;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Any HTTP transport; here, one that always answers a quota error.
//! let transport = tower::service_fn(|_req: http::Request<Bytes>| async {
//!     let body = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
//!     Ok::<_, std::io::Error>(
//!         http::Response::builder().status(429).body(Full::new(Bytes::from(body))).unwrap(),
//!     )
//! });
//! let service = ServiceBuilder::new()
//!     .layer(ClassifyLayer::builder().error_body_limit(16 * 1024).build()?)
//!     .service(transport);
//!
//! let request = http::Request::post("https://api.openai.com/v1/chat/completions")
//!     .body(Bytes::from_static(br#"{"model":"gpt-4o-mini","messages":[]}"#))
//!     .unwrap();
//! let err = service.oneshot(request).await.unwrap_err();
//! assert_eq!(err.class(), FailureClass::QuotaExhausted); // a 429 that must not be retried
//! assert_eq!(err.code(), Some("insufficient_quota"));
//! # Ok(())
//! # }
//! ```
#![doc(html_root_url = "https://docs.rs/seawall-classify/0.1.0")]

mod body;
mod classifier;
mod error_body;
mod future;
pub mod hints;
mod layer;
mod parse;
mod service;
mod transport;

pub use body::ClassifiedBody;
pub use classifier::{
    AnthropicClassifier, AutoClassifier, Classifier, ErrorResponse, OpenAiClassifier,
    StatusClassifier, class_of, class_of_status,
};
pub use error_body::ProviderError;
pub use future::ResponseFuture;
pub use layer::{ClassifyBuilder, ClassifyLayer};
pub use service::{Classify, DEFAULT_ERROR_BODY_LIMIT};
pub use transport::classify_transport_error;

#[doc(no_inline)]
pub use seawall_core::ConfigError;
