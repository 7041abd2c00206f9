//! One structured record per logical LLM call.
//!
//! An operator must be able to answer within a minute: is it queueing here or slow upstream,
//! how often do we retry, what does this feature cost per day. Per-attempt logs from each
//! layer do not answer that; one record per *logical* call, with the latency split into queue
//! time, time to first token and upstream time, does.
//!
//! [`ObserveLayer`] sits outermost. It puts a [`CallContext`](seawall_core::CallContext) into
//! the request's extensions; the inner layers write what they know into it (the gate its queue
//! wait, the retry layer its attempts, the budget the cost, the stream layer the time to first
//! token, the fallback the target that served). When the body ends (or the call fails, or the
//! caller goes away) the layer assembles a [`CallRecord`] and:
//!
//! - fills its `tracing` span `gen_ai.call` (OpenTelemetry GenAI field names:
//!   `gen_ai.request.model`, `gen_ai.response.model`, `gen_ai.usage.input_tokens`, ...);
//! - hands the record to a [`Recorder`]: [`MetricsRecorder`] (the `metrics` facade, so any
//!   exporter works), [`TracingRecorder`], a [`Summary`] for P50/P95/P99 and rates, or your own
//!   closure. Several combine as a tuple.
//!
//! A field no stacked layer knows stays `None`: a stack without a gate has no queue time
//! rather than a wrong one.
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use seawall_observe::{ObserveLayer, Summary};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), seawall_observe::ConfigError> {
//! let summary = Arc::new(Summary::new());
//! let observe = ObserveLayer::builder()
//!     .shared_recorder(summary.clone())
//!     .config_version("v42")
//!     .build()?;
//! let mut svc = ServiceBuilder::new()
//!     .layer(observe)
//!     .service_fn(|_req: http::Request<Bytes>| async {
//!         Ok::<_, seawall_core::LlmError>(http::Response::new(http_body_util::Full::new(Bytes::from("{}"))))
//!     });
//! let req = http::Request::post("http://localhost/v1/chat/completions")
//!     .body(Bytes::from(r#"{"model":"gpt-4o-mini","messages":[]}"#))
//!     .unwrap();
//! let resp = svc.ready().await.unwrap().call(req).await.unwrap();
//! drop(resp); // the record is emitted when the body ends or is dropped
//! assert_eq!(summary.report().calls, 1);
//! # Ok(())
//! # }
//! ```

mod future;
mod layer;
mod metrics;
mod record;
mod service;
mod summary;

pub use future::{Finish, ResponseFuture};
pub use layer::{ObserveBuilder, ObserveLayer};
pub use metrics::{DEFAULT_MAX_MODELS, MetricsRecorder, OTHER_MODEL};
pub use record::{CallOutcome, CallRecord, NoopRecorder, Recorder, TracingRecorder};
pub use service::Observe;
pub use summary::{Summary, SummaryReport, percentile};

#[doc(no_inline)]
pub use seawall_core::ConfigError;
