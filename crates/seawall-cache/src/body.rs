//! [`CacheBody`]: a stored answer replayed, or the upstream's body passed through (and, on a
//! miss, assembled on the way so that a complete answer is stored when it ends).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::flight::{FlightState, Landing};
use crate::future::Pending;
use crate::store::StoreFuture;

pin_project_lite::pin_project! {
    /// The body of a response of [`Cache`](crate::Cache).
    ///
    /// A hit is one frame holding the whole answer (a JSON body, or a complete SSE stream
    /// ending with its finish marker). Otherwise the upstream's frames pass through unchanged;
    /// on a miss they are also read into the answer, which is stored when the body ends
    /// complete (its finish marker seen, no error, not dropped).
    pub struct CacheBody<B> {
        #[pin]
        inner: Option<B>,
        cached: Option<Bytes>,
        fill: Option<Box<Pending>>,
    }
}

impl<B> CacheBody<B> {
    pub(crate) fn cached(bytes: Bytes) -> Self {
        CacheBody {
            inner: None,
            cached: Some(bytes),
            fill: None,
        }
    }

    /// The upstream's body, passed through, and stored as it passes when `fill` is given.
    pub(crate) fn upstream(inner: B, fill: Option<Box<Pending>>) -> Self {
        CacheBody {
            inner: Some(inner),
            cached: None,
            fill,
        }
    }

    /// Whether this body replays a stored answer.
    pub fn is_cached(&self) -> bool {
        self.inner.is_none()
    }

    /// The upstream's body, when this is not a replay.
    pub fn get_ref(&self) -> Option<&B> {
        self.inner.as_ref()
    }
}

impl<B> std::fmt::Debug for CacheBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheBody")
            .field("cached", &self.inner.is_none())
            .field("storing", &self.fill.is_some())
            .finish_non_exhaustive()
    }
}

impl<B> Body for CacheBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            return Poll::Ready(this.cached.take().map(|b| Ok(Frame::data(b))));
        };
        let polled = ready!(inner.poll_frame(cx));
        let Some(fill) = this.fill.as_mut() else {
            return Poll::Ready(polled);
        };
        let ended = match &polled {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    if let Some(assembler) = fill.assembler.as_mut() {
                        assembler.feed(data);
                    }
                }
                // Trailers end the exchange; a body that says it is done after this frame is
                // not polled again (hyper stops there).
                frame.is_trailers()
                    || this
                        .inner
                        .as_ref()
                        .get_ref()
                        .as_ref()
                        .is_some_and(B::is_end_stream)
            }
            Some(Err(_)) => {
                if let Some(fill) = this.fill.take() {
                    fill.failed();
                }
                false
            }
            None => true,
        };
        if ended {
            if let Some(fill) = this.fill.take() {
                fill.complete();
            }
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Some(inner) => inner.is_end_stream(),
            None => self.cached.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(inner) => inner.size_hint(),
            None => SizeHint::with_exact(self.cached.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}

/// The storing half of a pending call: what the body does with it when it ends.
impl Pending {
    /// The body ended: store the answer if it is complete, and tell the flight. (Without an
    /// assembly, never the case for a body given one, the pending call's `Drop` ends a lead.)
    pub(crate) fn complete(mut self: Box<Self>) {
        let Some(assembler) = self.assembler.take() else {
            return;
        };
        let lead = self.lead.take();
        // The classifier's report, when there is one, must agree the stream finished.
        let report = self.report.take();
        let finished = report.as_ref().is_none_or(|r| r.is_finished());
        let ticket = self.ticket.take();
        // The in-memory store takes a JSON answer unchecked: what a miss must know (complete,
        // no error, not too large) is known here, the rest is checked at its first use (see
        // `Answer::unchecked`). The semantic index is not given an answer it would search
        // for nothing: with a ticket, the check is made now.
        let shared = &*self.shared;
        let memory = shared.memory.as_ref();
        let finished_answer = match memory {
            Some(_) => assembler.finish_unchecked(),
            None => assembler.finish(),
        };
        let answer = match finished_answer {
            Ok(answer) if finished && (ticket.is_none() || answer.checked().is_some()) => {
                Arc::new(answer)
            }
            Ok(_) | Err(_) => {
                if let Some(lead) = lead {
                    shared.end_lead(lead, FlightState::Failed);
                }
                return;
            }
        };
        let key = self.key;
        match memory {
            // Stored at once, as the flight ends and lands. Its time to live runs from when
            // the answer arrived, as the classifier's report timed it (no clock read here);
            // without a report, from now.
            Some(memory) => {
                let arrived = report
                    .as_ref()
                    .and_then(|r| r.last_content_at())
                    .unwrap_or_else(tokio::time::Instant::now);
                memory.store_landing(&key, answer, shared.ttl, arrived, lead);
            }
            None => {
                let landing = lead.map(|l| l.done(&shared.flights, answer.clone()));
                // At once when the store can, else through its future.
                match shared.store.put_now(&key, answer, shared.ttl) {
                    None => drop(landing),
                    Some(answer) => store(shared.store.put(&key, answer, shared.ttl), landing),
                }
            }
        }
        if let Some(ticket) = ticket {
            ticket.index(shared, &key);
        }
    }

    /// The body failed: nothing is stored; waiters make their own calls.
    pub(crate) fn failed(mut self: Box<Self>) {
        if let Some(lead) = self.lead.take() {
            self.shared.end_lead(lead, FlightState::Failed);
        }
    }
}

/// Drives a store's `put` to its end: at once when it is ready at once (the in-memory store),
/// else on a task, keeping the flight landed until then.
fn store(mut put: StoreFuture<()>, landing: Option<Landing>) {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match put.as_mut().poll(&mut cx) {
        Poll::Ready(result) => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "cache store failed; answer not stored");
            }
            drop(landing);
        }
        Poll::Pending => match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(e) = put.await {
                        tracing::debug!(error = %e, "cache store failed; answer not stored");
                    }
                    drop(landing);
                });
            }
            Err(_) => tracing::warn!("no tokio runtime to finish storing an answer; not stored"),
        },
    }
}
