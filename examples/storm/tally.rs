//! Where a run's spend went: every upstream attempt, tied to the logical call it served, and
//! the run's waste broken down by why it was billed without being delivered.
//!
//! The providers only know what they billed and whether each stream ended with its finish
//! marker; they cannot tell a stream cut after half its text and then resumed (its text
//! reached the caller inside the whole answer) from one whose text was thrown away. The
//! waste the table shows is therefore the caller's view, the same for every row: what the
//! providers billed, less what the complete answers delivered would have cost in one clean
//! call each (their prompt and their text). This module explains that figure: it wraps the
//! in-process transport, records each attempt (its call, its prompt, the text it streamed and
//! how it ended) and sorts each call's extra spend by cause.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use seawall::core::LlmRequest;
use tower::Service;

use crate::policies::{Outcome, content_tokens};
use crate::report::dollars;
use crate::scenario::{CONTEXT_WINDOW, LARGE_MODEL, PRIMARY_MODEL};

/// The logical call a request serves, set by the driver as a request extension (it travels
/// with the request's clones through every layer, to the transport).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallId(pub(crate) u32);

/// How an attempt ended at the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum End {
    /// An error status: nothing billed.
    Status(u16),
    /// The stream ended with its finish marker.
    Complete,
    /// The stream stopped without one (cut, or an error event).
    Broken,
    /// The caller dropped the stream before its end (a timeout, or a policy giving up).
    Dropped,
    /// The caller dropped the request before its response head.
    HeadDropped,
}

/// One request the providers received.
#[derive(Debug, Clone)]
struct Attempt {
    call: Option<u32>,
    /// Sent to the primary provider's model; to the larger-context model.
    primary: bool,
    large: bool,
    input: u32,
    output: u32,
    end: End,
}

impl Attempt {
    /// What the provider billed for it: the prompt of an accepted request, the text streamed.
    fn billed(&self) -> f64 {
        match self.end {
            End::Status(_) => 0.0,
            _ => dollars(u64::from(self.input), u64::from(self.output)),
        }
    }
}

/// The attempts of a run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ledger(Arc<Mutex<Vec<Attempt>>>);

impl Ledger {
    fn push(&self, a: Attempt) {
        if let Ok(mut v) = self.0.lock() {
            v.push(a);
        }
    }

    /// Where the waste went, given every call's outcome (indexed by [`CallId`]) and the
    /// providers' own figure for the spend: one line.
    pub(crate) fn explain(&self, outcomes: &[Outcome], spend: f64) -> String {
        let attempts = self.0.lock().map(|v| v.clone()).unwrap_or_default();
        let mut by_call: BTreeMap<u32, Vec<&Attempt>> = BTreeMap::new();
        let mut unattributed = spend;
        for a in &attempts {
            unattributed -= a.billed();
            if let Some(c) = a.call {
                by_call.entry(c).or_default().push(a);
            }
        }
        // Failed calls: all they were billed, by how each attempt ended.
        let (mut failed, mut failed_calls) = ([0.0; 3], 0);
        // Answers delivered after a first try that was billed and thrown away.
        let (mut again, mut again_calls) = ([0.0; 3], 0);
        // Answers delivered by resuming a cut stream: the extra prompt(s) sent.
        let (mut resumed, mut resumed_calls, mut follow_ups) = (0.0, 0, 0);
        let slot = |end: End| match end {
            End::Broken => 0,
            End::Dropped | End::HeadDropped => 1,
            _ => 2,
        };
        for (call, tries) in &by_call {
            let Some(outcome) = outcomes.get(*call as usize) else {
                continue;
            };
            let billed: f64 = tries.iter().map(|a| a.billed()).sum();
            match outcome {
                Err(_) => {
                    if billed > 0.0 {
                        failed_calls += 1;
                    }
                    for a in tries {
                        failed[slot(a.end)] += a.billed();
                    }
                }
                Ok(d) => {
                    let extra = billed - dollars(u64::from(d.input), u64::from(d.output));
                    // A follow-up carries the prompt and the text so far: a longer prompt.
                    let n = tries
                        .iter()
                        .filter(|a| a.input > d.input && !matches!(a.end, End::Status(_)))
                        .count();
                    if n > 0 {
                        resumed += extra;
                        resumed_calls += 1;
                        follow_ups += n;
                    } else if extra > 1e-12 {
                        again_calls += 1;
                        for a in tries.iter().filter(|a| a.end != End::Complete) {
                            again[slot(a.end)] += a.billed();
                        }
                    }
                }
            }
        }
        // Prompts too long for the model: how many got an answer, from which model, and what
        // they wasted (billed beyond the clean cost of their answers).
        let (mut long, mut long_ok, mut long_large, mut long_waste) = (0, 0, 0, 0.0);
        // 429s from the primary, and calls that sent the primary the same request after one.
        let (mut primary_429, mut retried_429) = (0, 0);
        for (call, tries) in &by_call {
            let Some(outcome) = outcomes.get(*call as usize) else {
                continue;
            };
            if tries.first().is_some_and(|a| a.input > CONTEXT_WINDOW) {
                long += 1;
                let billed: f64 = tries.iter().map(|a| a.billed()).sum();
                long_waste += match outcome {
                    Ok(d) => billed - dollars(u64::from(d.input), u64::from(d.output)),
                    Err(_) => billed,
                };
                if outcome.is_ok() {
                    long_ok += 1;
                    long_large +=
                        usize::from(tries.iter().any(|a| a.large && a.end == End::Complete));
                }
            }
            let first = tries
                .iter()
                .position(|a| a.primary && a.end == End::Status(429));
            if let Some(i) = first {
                primary_429 += tries
                    .iter()
                    .filter(|a| a.primary && a.end == End::Status(429))
                    .count();
                // The same request again (a follow-up carries a longer prompt: not a retry).
                let input = tries[i].input;
                retried_429 +=
                    usize::from(tries[i + 1..].iter().any(|a| a.primary && a.input == input));
            }
        }
        let k = |v: f64| format!("${v:.4}");
        let mut s = String::new();
        let _ = write!(
            s,
            "failed calls {} ({failed_calls}: broken {}, dropped {}, other {}); asked again {} \
             ({again_calls}: broken {}, dropped {}, other {}); resumed {} ({resumed_calls} \
             answers, {follow_ups} follow-ups)",
            k(failed.iter().sum()),
            k(failed[0]),
            k(failed[1]),
            k(failed[2]),
            k(again.iter().sum()),
            k(again[0]),
            k(again[1]),
            k(again[2]),
            k(resumed),
        );
        if long > 0 {
            let _ = write!(
                s,
                "; prompts over the {CONTEXT_WINDOW}-token window: {long}, answered {long_ok} \
                 ({long_large} by {LARGE_MODEL}), waste on them {}",
                k(long_waste)
            );
        }
        let _ = write!(
            s,
            "; primary 429s {primary_429}, calls that sent the primary the same request after \
             one {retried_429}"
        );
        if unattributed.abs() > 5e-5 {
            let _ = write!(s, "; {} billed outside the ledger", k(unattributed));
        }
        s
    }
}

/// The transport with every attempt recorded in a [`Ledger`].
#[derive(Debug, Clone)]
pub(crate) struct Tally<S> {
    inner: S,
    ledger: Ledger,
}

impl<S> Tally<S> {
    pub(crate) fn new(inner: S, ledger: Ledger) -> Self {
        Tally { inner, ledger }
    }
}

/// Records an attempt once it ends; dropped before that, it ends as `HeadDropped`.
struct Pending {
    ledger: Ledger,
    attempt: Option<Attempt>,
}

impl Pending {
    fn end(&mut self, end: End, output: u32) {
        if let Some(mut a) = self.attempt.take() {
            a.end = end;
            a.output = output;
            self.ledger.push(a);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.end(End::HeadDropped, 0);
    }
}

impl<S, B> Service<Request<Bytes>> for Tally<S>
where
    S: Service<Request<Bytes>, Response = Response<B>>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Unpin,
{
    type Response = Response<TallyBody<B>>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Response<TallyBody<B>>, S::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Bytes>) -> Self::Future {
        req.prepare();
        let model = req.model().unwrap_or_default();
        let attempt = Attempt {
            call: req.extensions().get::<CallId>().map(|c| c.0),
            primary: model == PRIMARY_MODEL,
            large: model == LARGE_MODEL,
            input: req.estimated_input_tokens(),
            output: 0,
            end: End::HeadDropped,
        };
        let mut pending = Pending {
            ledger: self.ledger.clone(),
            attempt: Some(attempt),
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            if !resp.status().is_success() {
                pending.end(End::Status(resp.status().as_u16()), 0);
            }
            Ok(resp.map(|body| TallyBody {
                body,
                pending,
                tokens: 0,
                finished: false,
            }))
        })
    }
}

/// A response body that counts the text it streams and records how it ended.
pub(crate) struct TallyBody<B> {
    body: B,
    pending: Pending,
    tokens: u32,
    finished: bool,
}

impl<B: Body<Data = Bytes> + Unpin> Body for TallyBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(data) = f.data_ref() {
                    this.tokens += content_tokens(data);
                    let done = |m: &[u8]| data.windows(m.len()).any(|w| w == m);
                    this.finished |= done(b"[DONE]") || done(b"message_stop");
                }
            }
            Some(Err(_)) => this.pending.end(End::Broken, this.tokens),
            None => {
                let end = if this.finished {
                    End::Complete
                } else {
                    End::Broken
                };
                this.pending.end(end, this.tokens);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B> Drop for TallyBody<B> {
    fn drop(&mut self) {
        let end = if self.finished {
            End::Complete
        } else {
            End::Dropped
        };
        self.pending.end(end, self.tokens);
    }
}
