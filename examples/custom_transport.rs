//! seawall around your own client: typed requests and answers, no HTTP.
//!
//! ```text
//! cargo run --example custom_transport
//! ```
//!
//! The layers are generic over two small traits, so they wrap any `Service`: an SDK client, a
//! gRPC stub, a test double. Here a fake SDK takes an `Ask` and answers an `Answer` or an
//! `SdkError`, an enum of its own that converts into seawall's `LlmError` (the conversion is
//! the classification: a rate limit with its hint, an overload, an exhausted quota, a bad
//! prompt). `Ask` implements `LlmRequest` and `Answer` implements `LlmResponse` in a few lines
//! each, and the stack (observe, fallback, retry, cost budget, breaker, gate) works on them
//! unchanged. It shows three calls:
//!
//! 1. a rate limit (honouring the SDK's `retry_after`) and an overload, both retried away;
//! 2. an exhausted quota on the primary model, answered by the fallback model at once;
//! 3. a bad prompt, which nothing retries or falls back from.
//!
//! After each, the observe layer's record: attempts, cost, the model that served.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use seawall::breaker::CircuitBreakerLayer;
use seawall::budget::{Budget, CostBudgetLayer, Price, PriceTable, Usd};
use seawall::core::{BoxError, Completion, OnComplete, Outcome, Usage};
use seawall::fallback::{FallbackLayer, Target};
use seawall::gate::ConcurrencyGateLayer;
use seawall::observe::{CallRecord, ObserveLayer};
use seawall::retry::BackoffRetryLayer;
use seawall::{FailureClass, LlmError, LlmRequest, LlmResponse};
use tower::{Service, ServiceBuilder, ServiceExt};

// ---- the SDK's own types ------------------------------------------------------------------

/// A question for the model. Cheap to clone (the retry layer keeps a copy to resend).
#[derive(Clone, Debug)]
struct Ask {
    model: String,
    prompt: Arc<str>,
    max_tokens: u32,
    /// Where the layers leave per-call facts for the observe layer (optional: without it the
    /// record still comes, with fewer fields).
    extensions: http::Extensions,
}

/// The model's answer, read whole.
#[derive(Debug)]
struct Answer {
    text: String,
    model: String,
    usage: Usage,
    extensions: http::Extensions,
}

/// The SDK's errors.
#[derive(Debug)]
enum SdkError {
    Busy { retry_after: Duration },
    Overloaded,
    OutOfCredit,
    BadPrompt(&'static str),
}

impl fmt::Display for SdkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SdkError::Busy { retry_after } => write!(f, "busy, retry after {retry_after:?}"),
            SdkError::Overloaded => f.write_str("overloaded"),
            SdkError::OutOfCredit => f.write_str("out of credit"),
            SdkError::BadPrompt(why) => write!(f, "bad prompt: {why}"),
        }
    }
}

impl std::error::Error for SdkError {}

// ---- the glue: three small impls ----------------------------------------------------------

/// The classification: what each SDK error means to the layers.
impl From<SdkError> for LlmError {
    fn from(e: SdkError) -> LlmError {
        let class = match e {
            SdkError::Busy { .. } => FailureClass::RateLimited,
            SdkError::Overloaded => FailureClass::Overloaded,
            SdkError::OutOfCredit => FailureClass::QuotaExhausted,
            SdkError::BadPrompt(_) => FailureClass::InvalidRequest,
        };
        let err = LlmError::new(class, e.to_string());
        match e {
            SdkError::Busy { retry_after } => err.with_retry_after(retry_after),
            _ => err,
        }
    }
}

impl LlmRequest for Ask {
    fn model(&self) -> Option<&str> {
        Some(&self.model)
    }
    fn max_output_tokens(&self) -> Option<u32> {
        Some(self.max_tokens)
    }
    fn estimated_input_tokens(&self) -> u32 {
        (self.prompt.len() / 4) as u32 + 4
    }
    fn set_model(&mut self, model: &str) -> Result<(), LlmError> {
        model.clone_into(&mut self.model);
        Ok(())
    }
    fn extensions(&self) -> Option<&http::Extensions> {
        Some(&self.extensions)
    }
    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        Some(&mut self.extensions)
    }
}

impl LlmResponse for Answer {
    // A fully-read answer: there is no body to wait for, so a hook (a gate permit, a budget
    // settlement, a breaker outcome, the observe record) runs at once.
    type Hooked<G: OnComplete> = Answer;

    fn usage(&self) -> Option<Usage> {
        Some(self.usage)
    }
    fn served_model(&self) -> Option<&str> {
        Some(&self.model)
    }
    fn extensions(&self) -> Option<&http::Extensions> {
        Some(&self.extensions)
    }
    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        Some(&mut self.extensions)
    }
    fn on_complete<G: OnComplete>(self, hook: G) -> Answer {
        hook.on_complete(Completion {
            outcome: Outcome::Complete,
            report: None,
            usage: Some(self.usage),
        });
        self
    }
}

// ---- a fake SDK client --------------------------------------------------------------------

/// Answers each model from a script of failures, then succeeds.
#[derive(Clone, Default)]
struct FakeSdk {
    script: Arc<Mutex<HashMap<String, VecDeque<SdkError>>>>,
    calls: Arc<Mutex<Vec<String>>>,
}

impl FakeSdk {
    fn fail(&self, model: &str, errors: impl IntoIterator<Item = SdkError>) {
        let mut script = self.script.lock().unwrap();
        script.entry(model.to_owned()).or_default().extend(errors);
    }

    fn take_calls(&self) -> Vec<String> {
        std::mem::take(&mut self.calls.lock().unwrap())
    }
}

impl Service<Ask> for FakeSdk {
    type Response = Answer;
    type Error = SdkError;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, SdkError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), SdkError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, ask: Ask) -> Self::Future {
        self.calls.lock().unwrap().push(ask.model.clone());
        let scripted = self
            .script
            .lock()
            .unwrap()
            .get_mut(&ask.model)
            .and_then(VecDeque::pop_front);
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if let Some(e) = scripted {
                return Err(e);
            }
            if ask.prompt.trim().is_empty() {
                return Err(SdkError::BadPrompt("the prompt is empty"));
            }
            let text = format!("({}) You asked: {}", ask.model, ask.prompt);
            let usage = Usage {
                input_tokens: u64::from(ask.estimated_input_tokens()),
                output_tokens: text.len() as u64 / 4,
                cached_input_tokens: 0,
                cache_write_input_tokens: 0,
                cache_write_1h_input_tokens: 0,
            };
            Ok(Answer {
                text,
                model: ask.model,
                usage,
                extensions: http::Extensions::new(),
            })
        })
    }
}

// ---- the stack ----------------------------------------------------------------------------

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let sdk = FakeSdk::default();
    let records: Arc<Mutex<Vec<CallRecord>>> = Arc::default();
    let sink = records.clone();

    let prices = PriceTable::new()
        .with("big-model", Price::per_million_f64(3.0, 15.0)?)
        .with("small-model", Price::per_million_f64(0.25, 1.25)?);
    let mut client = ServiceBuilder::new()
        .layer(
            ObserveLayer::builder()
                .recorder(move |r: &CallRecord| sink.lock().unwrap().push(r.clone()))
                .build()?,
        )
        .layer(FallbackLayer::new([Target::model("small-model")]))
        .layer(
            BackoffRetryLayer::builder()
                // Defaults are seconds; a demo wants milliseconds.
                .base_delay(Duration::from_millis(100))
                .overload_min_delay(Duration::from_millis(300))
                .build()?,
        )
        .layer(
            CostBudgetLayer::builder(prices)
                .budget(Budget::daily("daily", Usd::from_dollars(1)))
                .build()?,
        )
        .layer(CircuitBreakerLayer::new())
        .layer(ConcurrencyGateLayer::new(8))
        .service(sdk.clone());

    let ask = |prompt: &str| Ask {
        model: "big-model".to_owned(),
        prompt: prompt.into(),
        max_tokens: 256,
        extensions: http::Extensions::new(),
    };

    println!("1. a rate limit and an overload, retried away");
    sdk.fail(
        "big-model",
        [
            SdkError::Busy {
                retry_after: Duration::from_millis(200),
            },
            SdkError::Overloaded,
        ],
    );
    let answer = client
        .ready()
        .await?
        .call(ask("What is a circuit breaker?"))
        .await;
    report(answer, &sdk, &records);

    println!("2. the primary model is out of credit: the fallback answers at once");
    sdk.fail("big-model", [SdkError::OutOfCredit]);
    let answer = client.ready().await?.call(ask("And a fallback?")).await;
    report(answer, &sdk, &records);

    println!("3. a bad prompt: neither retried nor sent to the fallback");
    let answer = client.ready().await?.call(ask("   ")).await;
    report(answer, &sdk, &records);
    Ok(())
}

fn report(answer: Result<Answer, LlmError>, sdk: &FakeSdk, records: &Mutex<Vec<CallRecord>>) {
    match answer {
        Ok(a) => println!("   answer: {}", a.text),
        Err(e) => println!("   error:  {e}"),
    }
    println!("   SDK calls: {:?}", sdk.take_calls());
    if let Some(r) = records.lock().unwrap().pop() {
        println!(
            "   record: outcome {:?}, attempts {}, served by {} ({}), cost ${:.6}, {:.0?}\n",
            r.outcome,
            r.attempts,
            r.target.as_deref().unwrap_or("-"),
            r.served_model.as_deref().unwrap_or("-"),
            r.cost_usd.unwrap_or(0.0),
            r.latency,
        );
    }
}
