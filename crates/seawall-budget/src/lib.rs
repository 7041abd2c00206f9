//! A cost budget for LLM calls: reserve before each attempt, settle on real usage, never
//! overspend, and account for every attempt.
//!
//! # Why
//!
//! A loop with a bug, or a retry storm during an incident, can spend a month's budget in a
//! night. General resilience libraries have no notion of cost, and LLM gateways that do tend to
//! check the budget *after* a call, so N concurrent calls can each pass the check and overshoot
//! by N requests. [`CostBudgetLayer`] closes that gap by treating every attempt's worst case as
//! spent until it is known:
//!
//! 1. **Price** the attempt: its model's [`Price`] from a [`PriceTable`] (loaded from TOML or
//!    JSON, or built in code), times the request's estimated input tokens and the most
//!    output tokens it may be billed: its maximum output times the answers it asks for
//!    (OpenAI's `n` and `best_of`). Input is its text (characters / 4) plus a fixed estimate
//!    per image, audio part and file ([`CostBudgetBuilder::part_estimate`]), since base64 data is not
//!    text. An unknown model gets the table's default price or is refused; a request
//!    without a maximum gets a configured default written into it or is refused
//!    ([`MissingMaxOutput`]).
//! 2. **Reserve** that estimate on every [`Budget`] the attempt falls under (a total, rolling
//!    and UTC calendar windows, global, per model or per key such as a tenant), all at once or
//!    not at all. If any budget would be crossed, the attempt is refused from `call` with an
//!    [`LlmError`](seawall_core::LlmError) of class `BudgetExceeded`, which the retry layer
//!    never retries. So at every admission, settled spend plus outstanding reservations stays
//!    within every limit.
//! 3. **Settle** when the attempt ends: for a streamed response, when the body ends or is
//!    dropped (the reservation is held until then), using the usage of the final chunk
//!    through the shared `BodyReport`. Reported usage is charged at its exact cost. Without
//!    usage: a completed response is charged the estimate (conservative: the upstream billed
//!    something we could not see); an attempt that failed before the upstream could bill
//!    (connection refused, 4xx, 429, 5xx) is released; one that may still be billed (our
//!    timeout, a 504, a connection lost after sending, a broken stream, a call or body
//!    dropped in flight) is charged the estimate by default ([`default_settlement`],
//!    [`CostBudgetBuilder::on_failure`], [`CostBudgetBuilder::on_drop`]).
//! 4. **Account**: one [`SpendRecord`] per attempt (refusals included) to an
//!    [`AccountingSink`], for instance [`JsonlSink`], which writes JSON Lines from a
//!    background thread and never blocks a call. The cost is also added to the call's
//!    `CallContext` for an outer observing layer.
//!
//! Money is counted in whole nano-dollars ([`Usd`]), so sums and limits are exact. Counters
//! live behind the [`BudgetStore`] trait; [`MemoryStore`] keeps them in process.
//!
//! # Sharing a budget across replicas
//!
//! A [`MemoryStore`] is one process's: with N replicas, each enforces the whole limit, so the
//! fleet may spend N times it. To give the fleet one budget, pass every replica's layer the
//! Redis store of the `seawall-redis` crate (`RedisBudgetStore`, through
//! [`CostBudgetBuilder::store`]): each reservation is then one atomic script in the fleet's
//! Redis (one round trip before the attempt), each settlement one more that the call does not
//! wait for, and reservations are leases that a replica that dies cannot hold forever. The
//! layer is unchanged: the store answers [`Admission::Pending`] and [`Settled::Pending`], and
//! may refuse with [`Refusal::Unavailable`] when Redis does not answer, which the layer turns
//! into an error of class `SharedStateUnavailable` (or, if the store is set to fail open, it
//! decides on its replica's share of each limit). Soft-limit crossings are reported when the
//! store has applied the settlement, from a task, after the call has returned.
//! [`CostBudgetLayer::spend`] then answers what this replica last saw;
//! [`CostBudgetLayer::read_spend`] asks the store.
//!
//! # Where it goes
//!
//! Inside the retry layer (so every attempt is checked and charged) and outside the breaker,
//! gate and stream timeouts (so a refused attempt costs no permit):
//! `observe → fallback → retry → cost_budget → breaker → gate → timeouts → classify`.
//!
//! # What is not exact
//!
//! Output is bounded exactly by the maximum output tokens times the answers, but the input
//! is an estimate, and so are images, audio and files. An
//! attempt whose real cost exceeds its reservation is still charged in full, so spend can end
//! above a limit by the under-estimates of the attempts in flight at that moment (and the
//! next attempts are refused). [`CostBudgetBuilder::input_margin_percent`] reserves extra input to make
//! that unlikely; a request type with an exact token count removes it. Prompt-cache writes
//! are settled at their own prices (Anthropic's 1.25× the input price, 2× for the writes kept
//! for an hour) but reserved at the input price, which cannot know what the provider will
//! write: an attempt that writes its prompt settles above its reservation by that surcharge,
//! which the same margin covers (25% for the five-minute cache, 100% for the hour-long one).
//! A model with long-context prices ([`Price::with_long_context`]) is reserved at the prices
//! its estimated input falls under: a prompt estimated just under the threshold that turns
//! out above it settles at the higher prices. OpenAI bills a request that asks for
//! `"service_tier": "priority"` above the standard prices and one for `"flex"` below them:
//! a table with the tiers' prices ([`PriceTable::insert_tier`]) prices each request by the
//! tier it asks for. A priority request OpenAI serves at the standard tier when its priority
//! capacity is spent is charged the priority prices: more than it is billed, never less.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use seawall_budget::{Budget, CostBudgetLayer, MemorySink, PriceTable, Usd};
//! use seawall_core::{FailureClass, Usage};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let prices = PriceTable::from_toml_str(r#"
//!     [models."gpt-4o-mini"]
//!     input = 0.15
//!     output = 0.60
//! "#).unwrap();
//! let records = std::sync::Arc::new(MemorySink::new());
//! let budget = CostBudgetLayer::builder(prices)
//!     .budget(Budget::daily("daily", Usd::from_cents(1)).soft_limit_percent(80))
//!     .sink(records.clone())
//!     .build()
//!     .unwrap();
//!
//! // A stand-in transport that reports usage on its (empty) body.
//! let transport = tower::service_fn(|_req: http::Request<Bytes>| async {
//!     let mut resp = http::Response::new(http_body_util::Empty::<Bytes>::new());
//!     resp.extensions_mut().insert(Usage { input_tokens: 20, output_tokens: 100, ..Usage::default() });
//!     Ok::<_, seawall_core::LlmError>(resp)
//! });
//! let mut svc = ServiceBuilder::new().layer(budget.clone()).service(transport);
//!
//! let ask = |max: u32| http::Request::post("https://api.openai.com/v1/chat/completions")
//!     .body(Bytes::from(format!(r#"{{"model":"gpt-4o-mini","max_tokens":{max},"messages":[]}}"#)))
//!     .unwrap();
//! svc.ready().await.unwrap().call(ask(200)).await.unwrap();
//! // 20 × $0.15/M + 100 × $0.60/M
//! assert_eq!(budget.spend("daily", None).unwrap().spent, Usd::from_nanos(63_000));
//!
//! // Asking for 20,000 output tokens could cost $0.012: more than is left today.
//! let err = svc.ready().await.unwrap().call(ask(20_000)).await.unwrap_err();
//! assert_eq!(err.class(), FailureClass::BudgetExceeded);
//! assert_eq!(records.records().len(), 2);
//! # }
//! ```
#![doc(html_root_url = "https://docs.rs/seawall-budget/0.1.0")]
#![cfg_attr(
    test,
    allow(clippy::float_cmp, reason = "tests compare with exact expected values")
)]

mod accounting;
mod budget;
mod config;
mod future;
mod guard;
mod keys;
mod layer;
mod local;
mod money;
mod price;
mod service;
mod state;
mod store;
mod time;

pub use accounting::{AccountingSink, AttemptOutcome, Charged, JsonlSink, MemorySink, SpendRecord};
pub use budget::{Budget, Period, Scope, Window};
pub use config::{MissingMaxOutput, Settlement, default_settlement};
pub use future::ResponseFuture;
pub use guard::BudgetGuard;
pub use keys::{DEFAULT_MAX_KEYS, NoKeys, OVERFLOW_KEY, ScopeKeys, fingerprint};
pub use layer::{CostBudgetBuilder, CostBudgetLayer};
pub use money::Usd;
pub use price::{Price, PriceTable};
pub use seawall_core::{BorrowedKey, FixedKey, KeyFn, ModelKey, StateKey};
pub use service::CostBudget;
pub use state::UNKEYED;
pub use store::{
    Admission, AdmissionFuture, BudgetStore, Charge, Exceeded, MemoryStore, Refusal, SettleFuture,
    Settled, SoftLimitCrossed, Spend, SpendFuture, StoreUnavailable,
};
pub use time::Timestamp;

#[doc(no_inline)]
pub use seawall_core::ConfigError;
