//! A ready HTTP transport for seawall: the innermost `Service` of a stack, talking to real
//! OpenAI-compatible and Anthropic endpoints.
//!
//! seawall's layers work around any `Service`; this crate is the one to start with when there is
//! no client yet. [`HttpTransport`] is a `Service<http::Request<Bytes>>` answering
//! `http::Response<hyper::body::Incoming>` (bodies stream as they arrive), built on hyper 1 and
//! hyper-util's pooled client, with rustls for HTTPS (the `ring` provider, so no cmake is
//! needed) and HTTP/2 by ALPN.
//!
//! Why a transport of its own rather than an SDK: SDKs retry on their own (two retries by
//! default), which multiplies seawall's retries and hides attempts from its budgets and
//! breakers. This transport never retries; it resolves at the response head, and leaves
//! classification to `ClassifyLayer`, timeouts to `StreamTimeoutLayer`, and concurrency to the
//! gate (size its pool to the gate's permits).
//!
//! The endpoint and the key come from the environment, as in the official SDKs:
//! [`OpenAiConfig::from_env`] reads `OPENAI_API_KEY` and `OPENAI_BASE_URL`,
//! [`AnthropicConfig::from_env`] reads `ANTHROPIC_API_KEY` and `ANTHROPIC_BASE_URL`. Requests
//! then use relative URIs (`/chat/completions`, `/v1/messages`), and the transport adds the
//! credentials. The other providers users have come from their own variables too:
//! [`AzureOpenAiConfig::from_env`] (`AZURE_OPENAI_ENDPOINT`, `AZURE_OPENAI_API_KEY`,
//! `OPENAI_API_VERSION`: deployment paths and the `api-version` query, or Azure's v1 API),
//! [`OpenAiConfig::gemini_from_env`] (`GEMINI_API_KEY`: Gemini's OpenAI-compatible endpoint)
//! and [`OpenAiConfig::compatible_from_env`] (`{PREFIX}_API_KEY` and `{PREFIX}_BASE_URL`, for
//! DeepSeek, Groq, Mistral, OpenRouter, a self-hosted vLLM, ...). The configurations live in
//! `seawall-core` so that every transport shares them.
//!
//! Behind a corporate proxy, the transport finds it where curl and the SDKs do:
//! `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY` (see
//! [`HttpTransportBuilder::proxy`]). Keys are held in [`ApiKey`], whose `Debug` is redacted, and their header values
//! are marked sensitive.
//!
//! ```no_run
//! use bytes::Bytes;
//! use http_body_util::BodyExt;
//! use seawall_http::{HttpTransport, OpenAiConfig};
//! use tower::ServiceExt;
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let upstream = OpenAiConfig::from_env()?.upstream()?;
//! let transport = HttpTransport::builder()
//!     .pool_max_idle_per_host(16) // the gate's permits
//!     .upstream(upstream)
//!     .build()?;
//! let req = http::Request::post("/chat/completions").body(Bytes::from_static(
//!     br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#,
//! ))?;
//! let resp = transport.oneshot(req).await?;
//! println!("{} {:?}", resp.status(), resp.into_body().collect().await?.to_bytes());
//! # Ok(()) }
//! ```
#![doc(html_root_url = "https://docs.rs/seawall-http/0.1.0")]

mod proxy;
mod transport;

/// The proxy rules of [`HttpTransportBuilder::proxy`] (hyper-util's, re-exported).
pub use hyper_util::client::proxy::matcher::Matcher as ProxyMatcher;
#[doc(no_inline)]
pub use seawall_core::ConfigError;
/// The upstream configurations, shared by every transport (they live in `seawall-core`).
pub use seawall_core::upstream::{
    AnthropicConfig, ApiKey, AzureOpenAiConfig, OpenAiConfig, Upstream,
};
pub use transport::{HttpTransport, HttpTransportBuilder, ResponseFuture, into_llm_error};
