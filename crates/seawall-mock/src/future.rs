//! The response future of the in-process service: the answer, held until its latency passed.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::body::MockBody;
use crate::stats::Counters;
use crate::upstream::Inner;

/// Tokens billed when a request was accepted, and the key's billing counter.
#[derive(Debug)]
pub(crate) struct Billed {
    input: u64,
    output: u64,
    pub(crate) key: Arc<AtomicU64>,
}

impl Billed {
    pub(crate) fn new(input: u64, output: u64, key: Arc<AtomicU64>) -> Self {
        Billed { input, output, key }
    }

    pub(crate) fn charge(&self, c: &Counters) {
        c.input_tokens.fetch_add(self.input, Relaxed);
        c.output_tokens.fetch_add(self.output, Relaxed);
        self.key.fetch_add(self.input + self.output, Relaxed);
    }

    pub(crate) fn waste(&self, c: &Counters) {
        c.wasted_input_tokens.fetch_add(self.input, Relaxed);
        c.wasted_output_tokens.fetch_add(self.output, Relaxed);
    }
}

pin_project! {
    /// The future of [`MockUpstream`](crate::MockUpstream)'s `call`: resolves to the response
    /// once the profile's latency (to the head, or to the whole answer) has passed on
    /// `tokio::time`. It never fails.
    ///
    /// Dropping it early does not take back what the upstream was asked: the request was
    /// already counted and billed, as a real provider bills a request whose client timed out.
    pub struct ResponseFuture {
        #[pin]
        delay: Option<Sleep>,
        response: Option<Response<MockBody>>,
        billed: Option<(Arc<Inner>, Billed)>,
    }

    impl PinnedDrop for ResponseFuture {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(mut response) = this.response.take() {
                response.body_mut().disarm();
                if let Some((inner, billed)) = this.billed.take() {
                    inner.counters.abandoned.fetch_add(1, Relaxed);
                    billed.waste(&inner.counters);
                }
            }
        }
    }
}

impl ResponseFuture {
    pub(crate) fn new(
        response: Response<MockBody>,
        at: Instant,
        now: bool,
        billed: Option<(Arc<Inner>, Billed)>,
    ) -> Self {
        ResponseFuture {
            delay: (!now).then(|| tokio::time::sleep_until(at)),
            response: Some(response),
            billed,
        }
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("status", &self.response.as_ref().map(|r| r.status()))
            .finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<MockBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Some(delay) = this.delay.as_mut().as_pin_mut() {
            ready!(delay.poll(cx));
            this.delay.set(None);
        }
        this.billed.take();
        let Some(response) = this.response.take() else {
            seawall_core::polled_after_completion();
        };
        Poll::Ready(Ok(response))
    }
}
