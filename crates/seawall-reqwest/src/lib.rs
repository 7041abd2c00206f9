//! seawall in the reqwest client an application already has.
//!
//! Many applications reach LLM APIs through reqwest: directly, through a
//! `reqwest_middleware::ClientWithMiddleware` (and the frameworks that take one), or through
//! async-openai. This crate puts seawall's stack (classification, retries with server hints,
//! circuit breaker, concurrency gate, cost budget, fallback, stream timeouts) into each of
//! those without a second HTTP stack: the user's client, with its TLS backend, proxy, DNS and
//! pool settings, sends every attempt.
//!
//! | integration | type | feature |
//! |---|---|---|
//! | a `reqwest::Client` as the stack's transport | [`ReqwestTransport`] | always |
//! | the stack as a `reqwest_middleware::Middleware` | `SeawallMiddleware` over `NextService` (module `middleware`) | `middleware` |
//! | the stack as async-openai's HTTP service | `OpenAiService` / `OpenAiLayer` (module `openai`) | `async-openai` |
//!
//! reqwest is used with its default features off: the application chooses the TLS backend
//! (`rustls`, `native-tls`) on its own reqwest dependency. In every case seawall's retry layer
//! is the only retry loop: build the client with [`ReqwestTransport::client_builder`] (no
//! redirects, no retries), remove `reqwest-retry` from a middleware chain, and do not add
//! async-openai's `OpenAIRetryLayer`. reqwest's errors are classified by
//! [`classify_reqwest_error`], with the URL (which may hold a key) stripped.
//!
//! # A `reqwest::Client` as the transport
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use bytes::Bytes;
//! use seawall_classify::ClassifyLayer;
//! use seawall_core::upstream::{ApiKey, OpenAiConfig};
//! use seawall_reqwest::ReqwestTransport;
//! use seawall_retry::BackoffRetryLayer;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! let client = ReqwestTransport::client_builder().build()?; // + your TLS, proxy, pool
//! let upstream = OpenAiConfig::new(ApiKey::new("sk-...")?).upstream()?;
//! let stack = ServiceBuilder::new()
//!     .layer(BackoffRetryLayer::new())
//!     .layer(ClassifyLayer::new())
//!     .service(ReqwestTransport::new(client).with_upstream(upstream));
//! let request = http::Request::post("/chat/completions").body(Bytes::from(
//!     r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}]}"#,
//! ))?;
//! let answer = stack.oneshot(request).await?; // the body streams: answer.into_body()
//! # let _ = answer; Ok(()) }
//! ```
//!
//! # seawall as a reqwest middleware
//!
//! The stack ends in `NextService` (the rest of the chain) instead of a transport; build it
//! once, so every call shares its state.
//!
//! ```no_run
//! # #[cfg(feature = "middleware")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use seawall_classify::ClassifyLayer;
//! use seawall_reqwest::{NextService, ReqwestTransport, SeawallMiddleware, llm_error};
//! use seawall_retry::BackoffRetryLayer;
//! use tower::ServiceBuilder;
//!
//! let stack = ServiceBuilder::new()
//!     .layer(BackoffRetryLayer::new())
//!     .layer(ClassifyLayer::new())
//!     .service(NextService::new());
//! let client = reqwest_middleware::ClientBuilder::new(ReqwestTransport::client_builder().build()?)
//!     .with(SeawallMiddleware::new(stack)) // and no reqwest-retry
//!     .build();
//! let answer = client
//!     .post("https://api.openai.com/v1/chat/completions")
//!     .bearer_auth("sk-...")
//!     .header("content-type", "application/json")
//!     .body(r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}]}"#)
//!     .send()
//!     .await;
//! match answer {
//!     Ok(resp) => println!("{}", resp.text().await?),
//!     Err(e) => eprintln!("{:?}", llm_error(&e).map(|e| e.class())),
//! }
//! # Ok(()) }
//! ```
//!
//! # seawall under async-openai
//!
//! ```no_run
//! # #[cfg(feature = "async-openai")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use async_openai::{Client, config::OpenAIConfig};
//! use seawall_classify::ClassifyLayer;
//! use seawall_reqwest::{OpenAiLayer, ReqwestTransport};
//! use seawall_retry::BackoffRetryLayer;
//! use tower::ServiceBuilder;
//!
//! let service = ServiceBuilder::new()
//!     .layer(OpenAiLayer::new())
//!     .layer(BackoffRetryLayer::new())
//!     .layer(ClassifyLayer::new())
//!     .service(ReqwestTransport::new(ReqwestTransport::client_builder().build()?));
//! let client = Client::with_config(OpenAIConfig::new().with_api_key("sk-..."))
//!     .with_http_service(service);
//! // client.chat().create(..) and create_stream(..) as before.
//! # let _ = client; Ok(()) }
//! ```
//!
//! The recommended stack (README: observe, fallback, retry, budget, breaker, gate, stream,
//! classify) goes between the first line and the last in each example.

mod convert;
mod error;
#[cfg(feature = "middleware")]
pub mod middleware;
#[cfg(feature = "async-openai")]
pub mod openai;
mod transport;

pub use error::classify_reqwest_error;
#[cfg(feature = "middleware")]
pub use middleware::{NextFuture, NextService, SeawallMiddleware, llm_error};
#[cfg(feature = "async-openai")]
pub use openai::{OpenAiFuture, OpenAiLayer, OpenAiService, into_openai_error};
pub use transport::{ReqwestTransport, ResponseFuture};
