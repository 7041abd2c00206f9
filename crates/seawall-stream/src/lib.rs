//! Timeouts for LLM responses that stream, and the commit point.
//!
//! An LLM answer is not one response: its head arrives, then (for a stream) a trickle of
//! server-sent events over seconds or minutes. One whole-request timeout either kills healthy
//! long answers or waits minutes on a dead upstream. [`StreamTimeoutLayer`] bounds each phase on
//! its own ([`StreamTimeouts`]):
//!
//! - **attempt**: from the call to the response head;
//! - **first token**: from the call to the first *real* content of a streamed request;
//! - **idle**: the longest gap between body frames once content flows;
//! - **total** (optional): from the call to the end of the body.
//!
//! # The commit point
//!
//! The response future resolves only when the first real content arrives. Frames that carry
//! none are held (bounded) and replayed to the caller afterwards: `: keep-alive` comments and
//! blank lines (DeepSeek sends them while a request is queued), `event: ping`, Anthropic's
//! `message_start`, OpenAI's role-only first delta. So a time-to-first-token timeout, or an error
//! event before any content (Anthropic's `event: error` overloaded after a `200`), is an `Err`
//! from the service future, which the retry and fallback layers outside may act on; nothing has
//! reached the caller yet. After the commit point, every failure (idle timeout, total deadline,
//! broken connection, error event) is a body error of class `StreamInterrupted`, which nothing
//! retries: part of the answer is already with the caller.
//!
//! A response that is not a server-sent-events stream commits at its first bytes, or when it
//! ends.
//!
//! Whether a frame carries content is read from the classifier's
//! [`BodyReport`](seawall_core::BodyReport) in the response extensions when a classifying layer
//! sits inside this one; without one, this crate reads the events itself (cheaply: after the
//! commit point only events that may hold a finish marker or an error are parsed).
//!
//! # The caller's deadline
//!
//! A request carrying a [`Deadline`](seawall_core::Deadline) (an extension, or a
//! `grpc-timeout` / `x-seawall-timeout` / `x-stainless-timeout` header) cuts every bound before
//! the commit point to it: the attempt, the first token, and the idle gaps of a body that is
//! not a stream. When the deadline rather than one of this layer's timeouts fires, the error is
//! `DeadlineExceeded` (not `Timeout`), which nothing retries; an attempt that arrives past it
//! is not made at all. After the commit point the body is the caller's: it is not cut at the
//! deadline, because a caller that stops waiting drops it, and the SDKs' `x-stainless-timeout`
//! is a per-read timeout that a flowing stream keeps meeting.
//!
//! # Completeness
//!
//! A stream that ends without its finish marker (`data: [DONE]` or a `finish_reason`, Anthropic
//! `message_stop`, Responses `response.completed`) ends with a `StreamInterrupted` error, never
//! as a silently truncated answer. With a classifier stacked, its body does this check; without
//! one, this crate does. A stream that reaches its finish marker without any content at all
//! (and not at the token limit) is an `EmptyResponse` `Err`: nothing reached the caller, and a
//! second try usually fixes this glitch, unless the content filter is what stopped it
//! (`content_filter`, Anthropic's `refusal`): that is `ContentFiltered`, which the same prompt
//! would meet again. The finish reason is in [`StreamStats`]: `hit_length_limit()` says the
//! answer stopped at `max_tokens` and the caller may ask for a continuation.
//!
//! # Measurements
//!
//! [`StreamStats::of`] reads the time to first token and, once the body ends, how it ended and
//! the mean time per output token. They are kept in the classifier's shared
//! [`BodyReport`](seawall_core::BodyReport) when one is stacked inside (no allocation of this
//! layer's own per call), else in a report this layer keeps. Both are also written to the call's
//! [`CallContext`](seawall_core::CallContext) when an observing layer put one in the request.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//! use seawall_core::LlmError;
//! use seawall_stream::{StreamStats, StreamTimeoutLayer};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Any service answering `http::Response<impl Body<Data = Bytes>>`: a transport, a mock.
//! let upstream = tower::service_fn(|_req: http::Request<Bytes>| async {
//!     let events = ": keep-alive\n\n\
//!         data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\n\
//!         data: [DONE]\n\n";
//!     let resp = http::Response::builder()
//!         .header("content-type", "text/event-stream")
//!         .body(Full::new(Bytes::from(events)))
//!         .unwrap();
//!     Ok::<_, LlmError>(resp)
//! });
//! let timeouts = StreamTimeoutLayer::builder()
//!     .first_token(Duration::from_secs(20))
//!     .idle(Duration::from_secs(10))
//!     .build()?;
//! let svc = ServiceBuilder::new().layer(timeouts).service(upstream);
//!
//! let req = http::Request::post("/v1/chat/completions")
//!     .body(Bytes::from_static(br#"{"model":"m","stream":true}"#))
//!     .unwrap();
//! let resp = svc.oneshot(req).await?; // resolves at the first real token
//! let stats = StreamStats::of(&resp).expect("attached by the layer");
//! let body = resp.into_body().collect().await?.to_bytes();
//! assert!(body.starts_with(b": keep-alive")); // held frames are replayed, in order
//! assert!(stats.is_complete() && !stats.hit_length_limit());
//! # Ok(())
//! # }
//! ```
//!
//! Bodies must be `Unpin` (hyper's `Incoming` and the usual bodies are); wrap another body in
//! `Box::pin` first.
#![doc(html_root_url = "https://docs.rs/seawall-stream/0.1.0")]

mod body;
mod config;
mod future;
mod layer;
mod service;
mod sse;
mod stats;

pub use body::TimedBody;
pub use config::StreamTimeouts;
pub use future::ResponseFuture;
pub use layer::{StreamTimeoutBuilder, StreamTimeoutLayer};
pub use seawall_core::StreamEnd;
pub use service::StreamTimeout;
pub use stats::StreamStats;

#[doc(no_inline)]
pub use seawall_core::ConfigError;
