//! seawall: tower middleware that keeps LLM API failure storms away from an application.
//!
//! Each policy is its own crate with its own `Layer`, re-exported here behind a cargo feature
//! of the same name (the policy layers are on by default; `http`, `mock`, `redis` and `tonic`
//! are opt-in, so a user with their own transport compiles no HTTP stack). Stack only the ones you need with
//! `tower::ServiceBuilder`; the README explains the recommended order and why.
//!
//! | feature | module | layer |
//! |---|---|---|
//! | `classify` | [`classify`] | `ClassifyLayer`: status, headers, bodies and transport errors to one [`LlmError`] |
//! | `retry` | [`retry`] | `BackoffRetryLayer`: classified retries, server hints, time and retry budgets |
//! | `breaker` | [`breaker`] | `CircuitBreakerLayer`: per provider/model, failure-rate and slow-call windows |
//! | `fallback` | [`fallback`] | `FallbackLayer`: another model or provider when the primary failed for good |
//! | `gate` | [`gate`] | `ConcurrencyGateLayer`: shared permits, bounded queue, RPM/TPM limits |
//! | `budget` | [`budget`] | `CostBudgetLayer`: reserve, settle, never overspend, account every attempt |
//! | `stream` | [`stream`] | attempt, time-to-first-token and idle timeouts; the commit point |
//! | `observe` | [`observe`] | one record per logical call |
//! | `cache` | [`cache`] | `CacheLayer`: complete answers served without a call, single flight, an opt-in semantic cache |
//! | `repair` | [`repair`] | `RepairLayer`: a new turn, showing the model its answer and what was wrong, when an answer fails validation |
//! | `continue` | [`continuation`] | `ContinueLayer`: answers cut by `max_tokens` continued, cut streams resumed (the module is named `continuation`: `continue` is a keyword) |
//! | `guard` | [`guard`] | `ContextGuardLayer`: a request checked against its model's context window before it is sent (`tiktoken`, opt-in: exact counts for OpenAI models) |
//! | `http` | `http` (opt-in) | a hyper/rustls transport with no retries of its own |
//! | `mock` | `mock` (opt-in) | the chaos upstream, over HTTP or in process |
//! | `redis` | `redis` (opt-in) | budgets, rate limits, permits and breaker state shared by a fleet |
//! | `tonic` | `tonic` (opt-in) | `LlmError` as a gRPC `Status`, and `GrpcClassifyLayer` for LLM servers over gRPC |
//! | `reqwest` | `reqwest` (opt-in) | a user's `reqwest::Client` as the transport; `reqwest-middleware` and `async-openai` add those integrations |

pub use seawall_core as core;
pub use seawall_core::{FailureClass, LlmError, LlmRequest, LlmResponse};

#[cfg(feature = "breaker")]
pub use seawall_breaker as breaker;
#[cfg(feature = "budget")]
pub use seawall_budget as budget;
#[cfg(feature = "cache")]
pub use seawall_cache as cache;
#[cfg(feature = "classify")]
pub use seawall_classify as classify;
#[cfg(feature = "continue")]
pub use seawall_continue as continuation;
#[cfg(feature = "fallback")]
pub use seawall_fallback as fallback;
#[cfg(feature = "gate")]
pub use seawall_gate as gate;
#[cfg(feature = "guard")]
pub use seawall_guard as guard;
#[cfg(feature = "http")]
pub use seawall_http as http;
#[cfg(feature = "mock")]
pub use seawall_mock as mock;
#[cfg(feature = "observe")]
pub use seawall_observe as observe;
#[cfg(feature = "redis")]
pub use seawall_redis as redis;
#[cfg(feature = "repair")]
pub use seawall_repair as repair;
#[cfg(feature = "reqwest")]
pub use seawall_reqwest as reqwest;
#[cfg(feature = "retry")]
pub use seawall_retry as retry;
#[cfg(feature = "stream")]
pub use seawall_stream as stream;
#[cfg(feature = "tonic")]
pub use seawall_tonic as tonic;

/// The README's examples, compiled as doctests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
