//! A chaos upstream for LLM APIs: an OpenAI- and Anthropic-compatible server that fails the
//! way the real providers fail, on purpose, reproducibly.
//!
//! seawall's layers exist for the bad days of an LLM API: 429 storms with `retry-after`,
//! `insufficient_quota`, 503/529 overloads, outages, slow first tokens, streams that stop
//! without a finish marker, keep-alive comments that are not tokens, HTML error pages from a
//! proxy. Those days cannot be ordered from a real provider, and a test double that only
//! returns canned statuses misses what matters: headers, timing, billing, partial streams.
//! This crate plays the upstream with all of it, from one seeded [`Profile`]:
//!
//! - **wire formats**: OpenAI `POST /v1/chat/completions` and Anthropic `POST /v1/messages`,
//!   complete or SSE (`"stream": true`), with the providers' error bodies, request ids and
//!   rate-limit headers (`x-ratelimit-*` with Go durations; `anthropic-ratelimit-*` with
//!   RFC 3339 resets) on every response;
//!   plus a minimal OpenAI `POST /v1/embeddings` (deterministic hash-based vectors);
//! - **faults**: per-key RPM/TPM token buckets with 429 + `retry-after` (and `retry-after-ms`),
//!   and OpenAI's 429 "Request too large" for one request over the whole TPM; quota
//!   exhaustion; bursts and outage windows of 500/502/503/504/529; latency
//!   distributions for the head, the first token and each token; streams cut after N tokens;
//!   mid-stream error events; keep-alives before the first token; context-length errors;
//!   malformed bodies;
//! - **continuations**: an answer's text is a deterministic walk through a fixed list of
//!   words, so a request that carries a partial answer as the assistant's last turn is
//!   answered with the remainder of the answer the mock would have given (prefix +
//!   continuation is the uncut answer, word for word): an Anthropic prefill (refused with
//!   Anthropic's 400 when it ends in whitespace), `"prefix": true` on the last assistant
//!   message (DeepSeek, Mistral), vLLM's `"continue_final_message": true` (refused, as vLLM
//!   does, unless `"add_generation_prompt": false`). On the OpenAI wire without those options,
//!   a user turn saying "continue" right after an assistant turn is answered like a model
//!   that is only asked would: the remainder, starting with the partial answer's last word
//!   again (an overlap for the client to trim). The remainder is at least one word; an answer
//!   of random length draws its length again, so only a fixed length gives exact texts;
//! - **accounting**: [`Stats`] counts requests by outcome and status, and tokens billed the way
//!   providers bill (partial streams included, and every one of the `n` answers an OpenAI
//!   request asks for, though the body carries only the first), so a simulation can price its
//!   wasted spend.
//!
//! One fault model, two front ends. [`MockUpstream`] is a `tower::Service` with no sockets,
//! paced by `tokio::time`, so it runs on a paused clock: a storm of thousands of requests
//! takes milliseconds of real time and is the same on every run for a fixed seed. [`router`]
//! and [`serve`] put the same model behind axum for end-to-end tests over loopback, and the
//! `seawall-mock` binary serves a profile file with one command:
//!
//! ```text
//! cargo run -p seawall-mock --features cli -- --profile crates/seawall-mock/profiles/storm.toml --addr 127.0.0.1:8080
//! ```
//!
//! In process, on virtual time:
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http_body_util::BodyExt;
//! use seawall_mock::{Delay, ErrorRule, MockUpstream, Profile};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let profile = Profile::default()
//!     .seed(7)
//!     .first_token_latency(Delay::fixed(Duration::from_millis(400)))
//!     .error(ErrorRule::outage(529, Duration::from_secs(10), Duration::from_secs(20)));
//! let upstream = MockUpstream::new(profile);
//! let ask = || {
//!     http::Request::post("http://mock/v1/messages")
//!         .header("x-api-key", "sk-ant-test")
//!         .body(Bytes::from(r#"{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,
//!                               "messages":[{"role":"user","content":"hi"}]}"#))
//!         .unwrap()
//! };
//! let stream = upstream.clone().oneshot(ask()).await.unwrap();
//! let sse = stream.into_body().collect().await.unwrap().to_bytes();
//! assert!(sse.ends_with(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
//!
//! tokio::time::sleep(Duration::from_secs(12)).await; // virtual time: returns at once
//! let overloaded = upstream.clone().oneshot(ask()).await.unwrap();
//! assert_eq!(overloaded.status(), 529);
//! assert_eq!(upstream.stats().server_errors, 1);
//! # }
//! ```
#![doc(html_root_url = "https://docs.rs/seawall-mock/0.1.0")]
#![cfg_attr(
    test,
    allow(clippy::float_cmp, reason = "tests compare with exact expected values")
)]

mod body;
mod embeddings;
mod future;
mod profile;
mod rng;
mod server;
mod stats;
mod upstream;
mod wire;

pub use body::{MockBody, MockError};
pub use future::ResponseFuture;
pub use profile::{
    Auth, ContextWindow, Count, Cut, Delay, Draws, ErrorRule, KeepAlive, KeepAliveStyle, KeyBy,
    KeyLimits, Latency, Limits, LogNormal, Malformed, MalformedKind, MidStreamError, Output,
    Profile, ProfileError, Quota, StreamFaults,
};
pub use server::{router, serve};
pub use stats::Stats;
pub use upstream::MockUpstream;
