//! A scripted upstream shared by the integration tests; the typed request is the shared
//! test support's.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use seawall_core::{FailureClass, LlmError};
pub use seawall_test_support::Ask;
use tokio::time::Instant;
use tower::Service;

pub type Reply = Result<&'static str, LlmError>;
type Script = Arc<dyn Fn(usize) -> Reply + Send + Sync>;
type Log = Arc<Mutex<Vec<(Instant, Option<HeaderMap>)>>>;

/// An upstream that answers the n-th call (0-based) with `script(n)`, after `latency`.
#[derive(Clone)]
pub struct Mock {
    script: Script,
    latency: Duration,
    log: Log,
    dropped: Arc<AtomicUsize>,
}

/// Counts the response futures that were dropped, finished or not.
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Mock {
    pub fn new(script: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Self {
        Mock {
            script: Arc::new(script),
            latency: Duration::ZERO,
            log: Arc::default(),
            dropped: Arc::default(),
        }
    }

    /// Always fails with `err()`.
    pub fn failing(err: impl Fn() -> LlmError + Send + Sync + 'static) -> Self {
        Mock::new(move |_| Err(err()))
    }

    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    pub fn calls(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    pub fn times(&self) -> Vec<Instant> {
        self.log.lock().unwrap().iter().map(|(t, _)| *t).collect()
    }

    /// Time between the end of one attempt and the start of the next: the delay slept.
    pub fn gaps(&self) -> Vec<Duration> {
        self.times()
            .windows(2)
            .map(|w| w[1] - w[0] - self.latency)
            .collect()
    }

    pub fn headers(&self) -> Vec<HeaderMap> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .map(|(_, h)| h.clone().unwrap_or_default())
            .collect()
    }

    pub fn dropped(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }

    fn respond(&self, headers: Option<HeaderMap>) -> MockFuture {
        let n = {
            let mut log = self.log.lock().unwrap();
            log.push((Instant::now(), headers));
            log.len() - 1
        };
        let reply = (self.script)(n);
        let latency = self.latency;
        let guard = DropCount(self.dropped.clone());
        Box::pin(async move {
            let _guard = guard;
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            reply
        })
    }
}

pub type MockFuture = Pin<Box<dyn Future<Output = Reply> + Send>>;

impl Service<Ask> for Mock {
    type Response = &'static str;
    type Error = LlmError;
    type Future = MockFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Ask) -> MockFuture {
        self.respond(None)
    }
}

impl Service<http::Request<Bytes>> for Mock {
    type Response = &'static str;
    type Error = LlmError;
    type Future = MockFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Bytes>) -> MockFuture {
        self.respond(Some(req.headers().clone()))
    }
}

pub fn err(class: FailureClass, status: u16) -> LlmError {
    LlmError::new(class, "upstream said no")
        .with_status(StatusCode::from_u16(status).expect("status"))
}

pub fn rate_limited() -> LlmError {
    err(FailureClass::RateLimited, 429).with_code("rate_limit_exceeded")
}

pub fn server_error() -> LlmError {
    err(FailureClass::ServerError, 500)
}

pub fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}
