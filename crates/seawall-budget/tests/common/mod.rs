//! Test doubles shared by the integration tests: a typed request, a scriptable body.
#![allow(dead_code, unreachable_pub)]

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use seawall_budget::{Price, PriceTable, ScopeKeys, Usd};
use seawall_core::{BodyReport, LlmError, LlmRequest, Usage};
use tokio::sync::mpsc;

/// A typed request with explicit token counts, so the arithmetic in tests is exact.
#[derive(Debug, Clone, Default)]
pub struct Ask {
    pub model: Option<String>,
    pub input: u32,
    pub max: Option<u32>,
    pub ext: http::Extensions,
}

/// The tenant of a request, as an extension.
#[derive(Debug, Clone)]
pub struct Tenant(pub Arc<str>);

impl Ask {
    pub fn new(model: &str, input: u32, max: u32) -> Ask {
        Ask {
            model: Some(model.into()),
            input,
            max: Some(max),
            ext: http::Extensions::new(),
        }
    }

    pub fn tenant(mut self, t: &str) -> Ask {
        self.ext.insert(Tenant(t.into()));
        self
    }
}

impl LlmRequest for Ask {
    fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }
    fn max_output_tokens(&self) -> Option<u32> {
        self.max
    }
    fn estimated_input_tokens(&self) -> u32 {
        self.input
    }
    fn set_max_output_tokens(&mut self, max: u32) -> Result<(), LlmError> {
        self.max = Some(max);
        Ok(())
    }
    fn extensions(&self) -> Option<&http::Extensions> {
        Some(&self.ext)
    }
    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        Some(&mut self.ext)
    }
}

/// The tenant key function for `Ask`.
pub fn tenant_key(req: &Ask) -> Option<String> {
    req.ext.get::<Tenant>().map(|t| t.0.to_string())
}

/// The keys of the `tenant` scope, read by [`tenant_key`]; other scopes have none.
pub fn tenant_keys() -> ScopeKeys<Ask> {
    ScopeKeys::new().scope("tenant", tenant_key)
}

/// A body that is empty, or fed frame by frame from a channel.
#[derive(Debug)]
pub enum TestBody {
    Empty,
    Chan(mpsc::UnboundedReceiver<Result<Frame<Bytes>, LlmError>>),
}

impl Body for TestBody {
    type Data = Bytes;
    type Error = LlmError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, LlmError>>> {
        match self.get_mut() {
            TestBody::Empty => Poll::Ready(None),
            TestBody::Chan(rx) => rx.poll_recv(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, TestBody::Empty)
    }
}

pub type Resp = http::Response<TestBody>;

/// The sending end of a streamed `TestBody`.
pub type Feed = mpsc::UnboundedSender<Result<Frame<Bytes>, LlmError>>;

/// A complete response that reports `usage` at its head.
pub fn done(usage: Usage) -> Resp {
    let mut r = http::Response::new(TestBody::Empty);
    r.extensions_mut().insert(usage);
    r
}

/// A complete response without usage.
pub fn done_without_usage() -> Resp {
    http::Response::new(TestBody::Empty)
}

/// A streamed response: the sender feeds the body, the report carries its usage.
pub fn stream() -> (Resp, Feed, Arc<BodyReport>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let report = Arc::new(BodyReport::new());
    let mut r = http::Response::new(TestBody::Chan(rx));
    r.extensions_mut().insert(report.clone());
    (r, tx, report)
}

pub fn usage(input: u64, output: u64, cached: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cached_input_tokens: cached,
    }
}

/// $2.50 / $10 / cached $1.25 per million.
pub fn gpt4o() -> Price {
    Price::per_million(Usd::from_cents(250), Usd::from_dollars(10))
        .with_cached_input(Usd::from_cents(125))
}

/// $1 / $5 / cached $0.10 per million.
pub fn haiku() -> Price {
    Price::per_million(Usd::from_dollars(1), Usd::from_dollars(5))
        .with_cached_input(Usd::from_cents(10))
}

pub fn prices() -> PriceTable {
    PriceTable::new()
        .with("gpt-4o", gpt4o())
        .with("claude-haiku-4-5*", haiku())
}
