//! `FallbackLayer`: another model or provider once the primary path has failed for good.
//!
//! When the primary model is overloaded, out of quota, behind an open circuit, or the prompt
//! no longer fits its context window, a user would rather have an answer from somewhere else
//! than an error. This layer sits outside the retry layer (only `observe` goes around it): by
//! the time an error reaches it, the primary path has done its retries, so the error is final
//! for that path, and the layer tries the next target of a chain.
//!
//! # Why it looks like this
//!
//! - **Classification decides.** The failure's [`FailureClass`](seawall_core::FailureClass)
//!   and its [`Disposition`](seawall_core::Disposition) choose the list: availability failures
//!   (overload, server errors, timeouts, quota, auth, not found, `CircuitOpen`,
//!   `GateRejected`) go down the regular chain, `ContextLengthExceeded` goes to a separate
//!   list of larger-context models, `ContentFiltered` to an optional content-policy list, and
//!   a request at fault (`InvalidRequest`, 408/409, budget) never falls back: its error comes
//!   back unchanged. A local rejection (`CircuitOpen`, `GateRejected`) arrives at once, so the
//!   next target is called at once; the layer itself never sleeps.
//! - **Says when it stands by.** The primary's request, when the chain has a target for a
//!   gate's refusal, and each target's request but the last one the chain may call, carry
//!   [`Standby`](seawall_core::Standby). A concurrency gate below then refuses such a call
//!   at once, rather than hold it past its standby wait for a key's rate, and this layer
//!   sends it on: the backup's room is used instead of seconds in the primary's queue.
//! - **Targets mix.** A [`Target`] is either a rewrite of the request sent to the same
//!   service (another model, another API key) or another service entirely (another provider's
//!   transport with its own breaker and retry stack). A target's own failure moves the chain
//!   on, unless its class says the request is at fault.
//! - **Streams commit once.** An `Ok` from the inner service is final. With seawall's stream
//!   layer inside, a stream resolves only at its first real content, so a failure before the
//!   first token is an `Err` here (and falls back) while a failure after it is an error from
//!   the body, which passes through: nothing is switched after the caller has seen a byte.
//! - **Bounded.** At most [`max_fallbacks`](FallbackBuilder::max_fallbacks) targets after the
//!   primary, and an optional overall [`deadline`](FallbackBuilder::deadline): no target
//!   starts after it, and one still running at it is cancelled. The caller's
//!   [`Deadline`](seawall_core::Deadline) on the request bounds the chain too; the earlier
//!   of the two wins.
//! - **A last resort, clearly marked.** When the regular chain is exhausted (or the deadline
//!   passed), the layer can answer with the last good response to an identical request
//!   ([`ResponseCache`]) or a static degraded response. Both carry
//!   [`ServedBy`](seawall_core::ServedBy) with `degraded: true` and a [`LastResort`]
//!   extension.
//! - **Tells who served.** Every response carries a `ServedBy` extension (target name and
//!   model); the call's [`CallContext`](seawall_core::CallContext), when an observer put one in
//!   the request, gets `served_by` and `fallbacks`. The final error keeps a short user-facing
//!   message, with the technical detail (every target tried, with its class and error) in a
//!   [`FallbackError`] reachable through [`FallbackError::of`].
//! - **No sticky state.** Every call starts at the primary, so traffic returns to it as soon
//!   as it recovers. Keep a circuit breaker inside the primary's stack so that a sick primary
//!   costs a fast `CircuitOpen` instead of a full retry cycle.
//!
//! # Errors
//!
//! A failure that is not worth a fallback (or one with no target to go to) comes back exactly
//! as the inner service returned it. Once a fallback was tried, the error has the last
//! target's class, status, provider code and retry hint (`DeadlineExceeded` when the deadline
//! stopped the chain), a short user-facing message, and a [`FallbackError`] source listing
//! every target tried. A target's own failure moves the chain on unless its class is never
//! worth a fallback (an invalid request, a spent budget): then the chain stops there.
//!
//! # Example
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use seawall_core::{FailureClass, LlmError, LlmRequest, ServedBy};
//! use seawall_fallback::{FallbackLayer, Target};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // The primary path: here, one whose big model is overloaded.
//! let upstream = tower::service_fn(|req: Request<Bytes>| async move {
//!     match req.model() {
//!         Some("gpt-4o") => Err(LlmError::new(FailureClass::Overloaded, "overloaded")),
//!         _ => Ok(Response::new(Full::new(Bytes::from_static(b"{\"answer\":42}")))),
//!     }
//! });
//! let client = ServiceBuilder::new()
//!     .layer(FallbackLayer::new([Target::model("gpt-4o-mini")]))
//!     .service(upstream);
//!
//! let req = Request::post("https://api.openai.com/v1/chat/completions")
//!     .body(Bytes::from_static(br#"{"model":"gpt-4o","messages":[]}"#))
//!     .unwrap();
//! let resp = client.oneshot(req).await.unwrap();
//! let served = resp.extensions().get::<ServedBy>().unwrap();
//! assert_eq!(&*served.target, "gpt-4o-mini");
//! assert!(!served.degraded);
//! # }
//! ```
//!
//! Targets that are other services must return the primary's response type. For HTTP stacks,
//! whose body types differ from one stack to the next, map each one through [`box_response`].
#![doc(html_root_url = "https://docs.rs/seawall-fallback/0.1.0")]

mod cache;
mod error;
mod future;
mod layer;
mod service;
mod state;
mod target;

pub use cache::{HttpSnapshot, LastResort, Replay, ReplayBody, RequestKey, ResponseCache};
pub use error::{FallbackError, Tried};
pub use future::ResponseFuture;
pub use layer::{FallbackBuilder, FallbackLayer};
pub use service::Fallback;
pub use target::Target;

#[doc(no_inline)]
pub use seawall_core::ConfigError;

use bytes::Bytes;
use http_body::Body;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use seawall_core::{BoxError, LlmError};

/// Boxes an HTTP response's body into one type, with body errors as [`LlmError`], so stacks
/// with different layers (and so different body types) can serve in one fallback chain:
/// `.map_response(seawall_fallback::box_response)`. The result can be cached
/// ([`ReplayBody`] is implemented for it).
pub fn box_response<B>(resp: http::Response<B>) -> http::Response<UnsyncBoxBody<Bytes, LlmError>>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    resp.map(|b| b.map_err(|e| LlmError::from_boxed(e.into())).boxed_unsync())
}
