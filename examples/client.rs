//! One protected, streamed LLM call through the recommended stack: the answer as it streams,
//! then the call's record.
//!
//! ```text
//! cargo run --example client                                 # no key: the chaos upstream
//! OPENAI_API_KEY=sk-... cargo run --example client           # OpenAI (or OPENAI_BASE_URL)
//! ANTHROPIC_API_KEY=sk-ant-... cargo run --example client    # Anthropic
//! cargo run --example client -- "Write a haiku about retries"
//! ```
//!
//! With `OPENAI_API_KEY` set it calls OpenAI's chat completions (`OPENAI_BASE_URL` points it at
//! any compatible endpoint), else with `ANTHROPIC_API_KEY` Anthropic's messages API, else the
//! chaos upstream (`seawall_mock::serve`) on a loopback port, which starts with a two-second
//! outage (529, then 503) and sends keep-alive comments before each stream's first token.
//! `MODEL` picks the model, `FALLBACK_MODEL` adds a fallback model.
//!
//! Models are priced from `crates/seawall-budget/prices.example.toml`; the budget refuses a
//! model that file does not list (code `unpriced_model`) rather than guess what it costs.
//! `DEFAULT_PRICE=3,15` opts in to pricing unlisted models at $3 in and $15 out per million
//! tokens.
//!
//! What it shows: the stack (observe, fallback, retry, cost budget, breaker, gate, stream
//! timeouts, classify, the `seawall-http` transport) around a plain `http::Request<Bytes>`; the
//! answer streaming in only once the first real token has arrived (the commit point); and the
//! one record the observe layer writes per logical call, with the attempts the retry layer
//! made, the time to first token, the queue wait, the usage and the cost.

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use seawall::breaker::CircuitBreakerLayer;
use seawall::budget::{Budget, CostBudgetLayer, Price, PriceTable, Usd};
use seawall::classify::ClassifyLayer;
use seawall::core::BoxError;
use seawall::fallback::{FallbackLayer, Target};
use seawall::gate::ConcurrencyGateLayer;
use seawall::http::{AnthropicConfig, ApiKey, HttpTransport, OpenAiConfig, Upstream};
use seawall::mock::{Delay, ErrorRule, KeepAliveStyle, MockUpstream, Profile};
use seawall::observe::{CallRecord, ObserveLayer};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::StreamTimeoutLayer;
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt};

/// The example price table, plus the default price `DEFAULT_PRICE` opts in to.
fn prices() -> Result<PriceTable, BoxError> {
    let mut prices =
        PriceTable::from_toml_str(include_str!("../crates/seawall-budget/prices.example.toml"))?;
    if let Ok(v) = std::env::var("DEFAULT_PRICE") {
        let bad = || {
            format!("DEFAULT_PRICE must be `input,output` in dollars per million tokens, not {v:?}")
        };
        let (input, output) = v.split_once(',').ok_or_else(bad)?;
        let input: f64 = input.trim().parse().map_err(|_| bad())?;
        let output: f64 = output.trim().parse().map_err(|_| bad())?;
        prices.set_default(Some(Price::per_million_f64(input, output)?));
    }
    Ok(prices)
}

/// Which API the call speaks.
#[derive(Clone, Copy, PartialEq)]
enum Api {
    OpenAi,
    Anthropic,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The retry layer logs each retry at INFO (`RUST_LOG` overrides the filter).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("seawall=info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let prompt = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "In one sentence: why should retries honour Retry-After?".to_owned());
    let (api, upstream, default_model) = pick_upstream().await?;
    let model = std::env::var("MODEL").unwrap_or_else(|_| default_model.to_owned());

    let record: Arc<Mutex<Option<CallRecord>>> = Arc::default();
    let sink = record.clone();
    let observe = ObserveLayer::builder()
        .config_version("example-client")
        .recorder(move |r: &CallRecord| *sink.lock().unwrap() = Some(r.clone()))
        .build()?;
    let fallbacks = std::env::var("FALLBACK_MODEL").ok().map(Target::model);
    let prices = prices()?;
    let retry = BackoffRetryLayer::builder()
        // The default is 5 s after an overload; 1 s keeps the example quick.
        .overload_min_delay(Duration::from_secs(1))
        .build()?;
    let client = ServiceBuilder::new()
        .layer(observe)
        .layer(FallbackLayer::new(fallbacks))
        .layer(retry)
        .layer(
            CostBudgetLayer::builder(prices)
                .budget(Budget::total("this run", Usd::from_cents(10)))
                .build()?,
        )
        .layer(CircuitBreakerLayer::new())
        .layer(ConcurrencyGateLayer::new(4))
        .layer(
            StreamTimeoutLayer::builder()
                .first_token(Duration::from_secs(30))
                .build()?,
        )
        .layer(ClassifyLayer::default())
        .service(
            HttpTransport::builder()
                .pool_max_idle_per_host(4)
                .upstream(upstream)
                .build()?,
        );

    let (path, body) = match api {
        Api::OpenAi => (
            "/chat/completions",
            json!({"model": model, "max_tokens": 200, "stream": true,
                   "stream_options": {"include_usage": true},
                   "messages": [{"role": "user", "content": prompt}]}),
        ),
        Api::Anthropic => (
            "/v1/messages",
            json!({"model": model, "max_tokens": 200, "stream": true,
                   "messages": [{"role": "user", "content": prompt}]}),
        ),
    };
    let req = http::Request::post(path).body(Bytes::from(body.to_string()))?;

    println!("> {prompt}\n");
    match client.oneshot(req).await {
        Ok(resp) => {
            let mut body = resp.into_body();
            let mut sse = SseText::default();
            let mut out = std::io::stdout();
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(frame) => {
                        if let Some(data) = frame.data_ref() {
                            write!(out, "{}", sse.feed(data))?;
                            out.flush()?;
                        }
                    }
                    Err(e) => {
                        println!("\n[the stream broke after it began: {e}]");
                        break;
                    }
                }
            }
            println!();
        }
        Err(e) => println!("[no answer: {e}]"),
    }

    let record = record.lock().unwrap().take();
    if let Some(r) = record {
        println!(
            "\nthe call's record:\n{}",
            serde_json::to_string_pretty(&r)?
        );
    }
    Ok(())
}

/// OpenAI or Anthropic from the environment, else the chaos upstream on loopback.
async fn pick_upstream() -> Result<(Api, Upstream, &'static str), BoxError> {
    if std::env::var_os("OPENAI_API_KEY").is_some() {
        let cfg = OpenAiConfig::from_env()?;
        println!("[calling {} with OPENAI_API_KEY]", cfg.base_url());
        return Ok((Api::OpenAi, cfg.upstream()?, "gpt-4o-mini"));
    }
    if std::env::var_os("ANTHROPIC_API_KEY").is_some() {
        let cfg = AnthropicConfig::from_env()?;
        println!("[calling {} with ANTHROPIC_API_KEY]", cfg.base_url());
        return Ok((Api::Anthropic, cfg.upstream()?, "claude-haiku-4-5"));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let ms = Duration::from_millis;
    // The upstream's first two seconds are an outage (529, then 503); every stream starts with
    // keep-alive comments.
    let profile = Profile::default()
        .seed(1)
        .first_token_latency(Delay::fixed(ms(400)))
        .per_token_latency(Delay::fixed(ms(40)))
        .keepalives(1.0, ms(100), KeepAliveStyle::Comment)
        .error(ErrorRule::outage(529, ms(0), ms(500)))
        .error(ErrorRule::outage(503, ms(500), ms(2000)));
    tokio::spawn(seawall::mock::serve(listener, MockUpstream::new(profile)));
    println!("[no API key set: calling the chaos upstream at http://{addr}/v1]");
    let upstream = OpenAiConfig::new(ApiKey::new("sk-chaos-mock")?)
        .with_base_url(format!("http://{addr}/v1"))
        .upstream()?;
    Ok((Api::OpenAi, upstream, "gpt-4o-mini"))
}

/// Pulls the text out of OpenAI or Anthropic server-sent events, across chunk boundaries.
#[derive(Default)]
struct SseText {
    line: Vec<u8>,
}

impl SseText {
    fn feed(&mut self, data: &[u8]) -> String {
        let mut text = String::new();
        for &b in data {
            if b != b'\n' {
                self.line.push(b);
                continue;
            }
            let line = std::mem::take(&mut self.line);
            let Some(json) = line.strip_prefix(b"data: ") else {
                continue;
            };
            let Ok(v) = serde_json::from_slice::<Value>(json) else {
                continue;
            };
            let delta = v["choices"][0]["delta"]["content"]
                .as_str()
                .or_else(|| v["delta"]["text"].as_str());
            text.push_str(delta.unwrap_or_default());
        }
        text
    }
}
