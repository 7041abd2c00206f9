//! seawall for gRPC: LLM failures as the `tonic::Status` gRPC clients expect, and the
//! statuses of LLM servers reached over gRPC as classified seawall errors.
//!
//! Two directions, because a gRPC service meets LLM failures on both sides:
//!
//! - **A tonic server calling an LLM** through the seawall stack has an [`LlmError`] when the
//!   call fails, and must end the RPC with a `Status`. [`to_status`] / [`into_status`] pick
//!   the gRPC code by the error's [`FailureClass`], write a fixed class-level message (never
//!   the upstream's text), and put the retry hint into `google.rpc.RetryInfo` (and the gRPC
//!   `grpc-retry-pushback-ms` metadata, `-1` for a spent quota or budget) and the class into
//!   `google.rpc.ErrorInfo`, using `tonic-types`' encoding of the google.rpc error model.
//! - **A client calling an LLM server over gRPC** (vLLM, Triton, TGI, or another seawall
//!   server) gets `Status`es. [`classify_status`] turns one into the [`LlmError`] an HTTP stack
//!   would have produced for the same failure (class, retry hint, do-not-retry), and
//!   [`GrpcClassifyLayer`] does it for every call of a service, so seawall's retry, breaker and
//!   observe layers can wrap a tonic client.
//!
//! # From a class to a gRPC code
//!
//! | class | code | why |
//! |---|---|---|
//! | `RateLimited`, `QuotaExhausted`, `GateRejected`, `BudgetExceeded` | `RESOURCE_EXHAUSTED` | a quota or the system's capacity is used up; ErrorInfo's reason tells a rate limit (come back after RetryInfo's delay) from a spent quota or budget |
//! | `Overloaded`, `ServerError`, `Connect`, `Disconnected`, `EmptyResponse`, `CircuitOpen`, `RetryBudgetExhausted`, `SharedStateUnavailable` | `UNAVAILABLE` | transient: the code gRPC clients retry with backoff |
//! | `StreamInterrupted` | `UNAVAILABLE` | the upstream broke off; gRPC clients never retry a call by themselves once a message arrived, so it cannot duplicate output |
//! | `Timeout`, `UpstreamTimeout`, `RequestTimeout`, `DeadlineExceeded` | `DEADLINE_EXCEEDED` | out of time, ours or the upstream's |
//! | `ContextLengthExceeded`, `InvalidRequest` | `INVALID_ARGUMENT` | the request itself must change |
//! | `ContentFiltered` | `INVALID_ARGUMENT` | the prompt is the problem whatever the server's state; `FAILED_PRECONDITION` would say "wait for the system to change", `PERMISSION_DENIED` "your credentials lack a right". ErrorInfo says `CONTENT_FILTERED` |
//! | `Conflict` | `ABORTED` | a concurrency conflict, to be retried at a higher level |
//! | `Authentication` | `UNAUTHENTICATED` | |
//! | `PermissionDenied` | `PERMISSION_DENIED` | |
//! | `NotFound` | `NOT_FOUND` | an unknown model |
//! | `ContentInvalid` | `INTERNAL` | the model's answers failed the server's validation on every repair turn: the server's dependency broke its contract; not `UNAVAILABLE`, which clients retry, since the repair turns were already the better retry |
//!
//! `Authentication` and `PermissionDenied` say the *upstream* refused the credentials the
//! server used. When the server forwards its caller's key that is the caller's problem, as the
//! codes say; a server calling with its own key may prefer to answer `INTERNAL` for them,
//! which it can do by matching on the class before calling [`to_status`].
//!
//! The reverse direction, from a code to a class, is tabled on [`classify_status`].
//!
//! # The client's deadline
//!
//! A gRPC client sends how long it will wait (`grpc-timeout`). A handler that calls the model
//! through a seawall stack passes it on with [`deadline`]: put the
//! [`Deadline`](seawall_core::Deadline) it returns into the extensions of the request it sends
//! down the stack, and the retry, fallback, budget, breaker and stream layers stop working when
//! the client stops waiting, ending with `DEADLINE_EXCEEDED`. A stack around a tonic *client*
//! hands what is left of its own deadline to the server with [`set_deadline`].
//!
//! # A function, not `From`
//!
//! `impl From<LlmError> for tonic::Status` would let `?` convert, but the orphan rule forbids
//! it here: both the trait's type parameter and the type are foreign to this crate (and
//! `seawall-core` cannot name tonic without making every user compile it). An extension trait
//! would only add an import to what a function does, so this crate offers functions, which
//! also fit `map_err` without a closure: `.map_err(seawall_tonic::into_status)?`. For the same
//! reason the other direction is [`classify_status`], not `From<Status> for LlmError`.
//!
//! # Stacking seawall's layers on a tonic client
//!
//! tonic's generated clients are not tower services of seawall's request type, so wrap the
//! client method in `tower::service_fn` and put [`GrpcClassifyLayer`] next to it. Two things
//! the layers above need, and why:
//!
//! - **the request type**: the retry layer keeps a copy of the request for the next attempt
//!   (`Clone`) and every layer reads the model and the token estimate from it
//!   ([`LlmRequest`](seawall_core::LlmRequest)). `tonic::Request<T>` is neither: it is not
//!   `Clone`, and this crate may not implement seawall's trait for tonic's type. So the
//!   stack takes the *message* (prost messages are `Clone`, and your crate, which owns the
//!   generated type, implements `LlmRequest` for it in a few lines), and the service function
//!   builds a fresh `tonic::Request` per attempt (with its metadata and deadline).
//! - **the response type**: the breaker and the observe layer need
//!   [`LlmResponse`](seawall_core::LlmResponse), which the classifying layer provides by
//!   wrapping each answer in a [`GrpcResponse`], done at its head.
//!
//! ```
//! use std::time::Duration;
//! use seawall_breaker::CircuitBreakerLayer;
//! use seawall_core::{FailureClass, LlmError, LlmRequest};
//! use seawall_retry::BackoffRetryLayer;
//! use seawall_tonic::GrpcClassifyLayer;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! /// The generated request message (prost messages are `Clone`).
//! #[derive(Clone)]
//! struct Generate { model: String, prompt: String, max_tokens: u32 }
//!
//! impl LlmRequest for Generate {
//!     fn model(&self) -> Option<&str> { Some(&self.model) }
//!     fn max_output_tokens(&self) -> Option<u32> { Some(self.max_tokens) }
//!     fn estimated_input_tokens(&self) -> u32 { (self.prompt.len() / 4) as u32 }
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), LlmError> {
//! // In a real program: `let mut client = client.clone(); async move { client.generate(req).await }`.
//! let grpc_call = tower::service_fn(|req: Generate| async move {
//!     let _request = tonic::Request::new(req.prompt);
//!     Err::<tonic::Response<String>, _>(tonic::Status::permission_denied("no access to this model"))
//! });
//! let client = ServiceBuilder::new()
//!     .layer(BackoffRetryLayer::new())
//!     .layer(CircuitBreakerLayer::new())
//!     .layer(GrpcClassifyLayer::new())
//!     .service(grpc_call);
//! let ask = Generate { model: "llama-3-8b".into(), prompt: "Hello".into(), max_tokens: 64 };
//! let err = client.oneshot(ask).await.unwrap_err();
//! assert_eq!(err.class(), FailureClass::PermissionDenied);
//! # Ok(())
//! # }
//! ```
//!
//! # The example service, and protobuf without `protoc`
//!
//! `examples/llm_stream.rs` is a server-streaming tonic service (a prompt in, tokens out)
//! whose handler calls the LLM through the recommended stack and ends failed calls with
//! [`into_status`]; `proto/llm.proto` is its contract for clients in other languages.
//!
//! Its protobuf code is written by hand: two `prost::Message` structs and the few lines of
//! server and client glue that `tonic-build` would generate. The alternatives were weighed:
//! `protoc` is not on a fresh machine; `protox` with `tonic-prost-build` in a `build.rs`
//! adds 22 crates the workspace does not otherwise build (a protobuf parser and compiler,
//! `prost-reflect`, `logos`, `miette`, `petgraph`, `prost-build`, `tonic-build`,
//! `pulldown-cmark`, ...) to every build of the crate's tests and examples, for two messages
//! and one method; checked-in generated code is honest only
//! with a check that it still matches the `.proto`, which needs that same generator. The
//! hand-written structs state each field's name, type and tag next to the code that uses
//! them, and a test (in `tests/grpc/service.rs`) reads `proto/llm.proto` and checks every field
//! against what the structs put on the wire, so the two cannot drift apart silently.
//! A service with many messages should generate its code instead.
#![doc(html_root_url = "https://docs.rs/seawall-tonic/0.1.0")]

mod classify;
mod deadline;
mod layer;
mod response;
mod service;
mod status;

pub use classify::classify_status;
pub use deadline::{deadline, set_deadline};
pub use layer::GrpcClassifyLayer;
pub use response::GrpcResponse;
pub use service::{GrpcClassify, ResponseFuture};
pub use status::{ERROR_DOMAIN, PUSHBACK_KEY, error_reason, grpc_code, into_status, to_status};

#[doc(no_inline)]
pub use seawall_core::{FailureClass, LlmError};
