//! The retry loop itself: one future per logical call that runs the attempts, sleeps the
//! backoff, enforces the time budget and reports each retry and the final give-up.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use seawall_core::{
    Attempt, Deadline, FailureClass, GiveUp, KeptRequest, LlmError, LlmRequest, Refusal, SpareClone,
};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::local::ThreadShared;
use crate::policy::{CLASSES, Decision, Failure};
use crate::service::attempt_value;

pin_project! {
    /// Response future of [`BackoffRetry`](crate::BackoffRetry): the whole logical call,
    /// attempts and waits included. Dropping it cancels the attempt in flight or the wait.
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S::Future>,
        // One timer, armed only when the call has to wait: for the backoff, or for the end
        // of the time budget while an attempt is in flight.
        #[pin]
        timer: Option<Sleep>,
        call: Call<S, Req>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Calling { #[pin] future: F },
        Waiting,
        Readying,
        // The caller's deadline had passed before the first attempt: it was not made.
        Expired { err: Option<LlmError> },
        Done,
    }
}

/// The bookkeeping of one logical call (nothing here is pinned).
struct Call<S, Req> {
    /// The retries' service: cloned from the layer's spare at the first retry, polled ready
    /// before each.
    service: SpareClone<S>,
    /// The request as the first attempt was sent, each retry's copy made from it.
    request: KeptRequest<Req>,
    shared: Arc<ThreadShared>,
    /// When the call started: set lazily, at the first poll that had to wait or the first
    /// failure, so a call answered at once never reads the clock.
    start: Option<Instant>,
    attempts: u32,
    /// Created at the first retry: a call that needs none never builds it.
    retrying: Option<Box<Retrying>>,
    /// The caller's deadline: it cuts the time budget, and no attempt starts past it.
    deadline: Option<Deadline>,
}

/// What a call that has retried keeps.
struct Retrying {
    attempt_start: Instant,
    wake: Instant,
    class_retries: [u8; CLASSES],
    history: Vec<Attempt>,
    previous_delay: Duration,
    last_error: Option<LlmError>,
    /// While waiting: the refusal the breaker below would give the next attempt, if it
    /// opens meanwhile (see `seawall_core::Circuit`).
    refusal: Option<Refusal>,
}

impl Retrying {
    /// The wait before the next attempt: `None` when it is over; the refusal the breaker
    /// below would give that attempt, as soon as it would (see `seawall_core::Circuit`).
    fn poll_wait(
        &mut self,
        timer: Pin<&mut Option<Sleep>>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<LlmError>> {
        if poll_timer(timer, self.wake, cx).is_ready() {
            self.refusal = None;
            return Poll::Ready(None);
        }
        let Some(refusal) = &mut self.refusal else {
            return Poll::Pending;
        };
        let err = ready!(refusal.as_mut().poll(cx));
        self.refusal = None;
        Poll::Ready(Some(err))
    }
}

impl<S, Req> ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    pub(crate) fn new(
        future: S::Future,
        service: SpareClone<S>,
        request: KeptRequest<Req>,
        shared: Arc<ThreadShared>,
        deadline: Option<Deadline>,
    ) -> Self {
        ResponseFuture {
            state: State::Calling { future },
            timer: None,
            call: Call {
                service,
                request,
                shared,
                start: None,
                attempts: 1,
                retrying: None,
                deadline,
            },
        }
    }

    /// A call that arrived past the caller's deadline: it fails with `err`, no attempt made.
    pub(crate) fn expired(
        service: SpareClone<S>,
        request: Req,
        shared: Arc<ThreadShared>,
        err: LlmError,
    ) -> Self {
        ResponseFuture {
            state: State::Expired { err: Some(err) },
            timer: None,
            call: Call {
                service,
                request: KeptRequest::whole(request),
                shared,
                start: None,
                attempts: 0,
                retrying: None,
                deadline: None,
            },
        }
    }
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req> + Clone,
    S::Error: Into<LlmError>,
    Req: LlmRequest + Clone,
{
    type Output = Result<S::Response, LlmError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Calling { future } => match future.poll(cx) {
                    // An answer means the commit point was reached: it is never retried.
                    Poll::Ready(Ok(response)) => {
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(response));
                    }
                    Poll::Ready(Err(err)) => match this.call.on_error(err.into()) {
                        Ok(()) => this.state.set(State::Waiting),
                        Err(last) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(last));
                        }
                    },
                    Poll::Pending => {
                        this.call.start.get_or_insert_with(Instant::now);
                        return poll_deadline(this.call, this.timer, this.state, cx);
                    }
                },
                StateProj::Waiting => {
                    let refused = match &mut this.call.retrying {
                        Some(r) => ready!(r.poll_wait(this.timer.as_mut(), cx)),
                        None => None,
                    };
                    match refused {
                        // The breaker below opened and will still refuse the attempt this wait
                        // is for: that attempt is decided now, as if it had been made.
                        Some(err) => {
                            // Noted as the breaker notes a refusal it gives at a call.
                            let request = this.call.request.get();
                            if let Some(cx) = request.call_context() {
                                cx.update(|f| f.rejections.push(err.class()));
                            }
                            if let Err(last) = this.call.on_error(err) {
                                this.state.set(State::Done);
                                return Poll::Ready(Err(last));
                            }
                        }
                        None => this.state.set(State::Readying),
                    }
                }
                // Every retry is a new `call`, so the service is made ready again first: the
                // readiness the caller saw was spent on the first attempt.
                StateProj::Readying => match this.call.service.get().poll_ready(cx) {
                    Poll::Ready(Ok(())) => {
                        // Never start an attempt past the caller's deadline (the wait ended
                        // before it, but the inner service may have taken its time to be ready).
                        if this.call.deadline.is_some_and(|d| d.has_passed()) {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(this.call.cut_error(Cut::Deadline)));
                        }
                        let request = this.call.next_request();
                        let future = this.call.service.get().call(request);
                        this.state.set(State::Calling { future });
                    }
                    Poll::Ready(Err(err)) => {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(this
                            .call
                            .give_up(err.into(), GiveUp::NotRetryable)));
                    }
                    Poll::Pending => return poll_deadline(this.call, this.timer, this.state, cx),
                },
                StateProj::Expired { err } => {
                    let err = err.take();
                    this.state.set(State::Done);
                    return Poll::Ready(Err(err.unwrap_or_else(|| {
                        LlmError::new(FailureClass::DeadlineExceeded, "the deadline had passed")
                    })));
                }
                StateProj::Done => seawall_core::polled_after_completion(),
            }
        }
    }
}

/// While the call waits on the inner service, watches the end of the time budget and the
/// caller's deadline; when the first of them comes, the attempt is dropped (cancelled) and the
/// call fails with `DeadlineExceeded`.
fn poll_deadline<S, Req, F, T>(
    call: &mut Call<S, Req>,
    timer: Pin<&mut Option<Sleep>>,
    mut state: Pin<&mut State<F>>,
    cx: &mut Context<'_>,
) -> Poll<Result<T, LlmError>> {
    let budget_end = match (call.shared.policy.time_budget, call.start) {
        (Some(budget), Some(start)) => Some(seawall_core::instant_after(start, budget)),
        _ => None,
    };
    let (at, cut) = match (budget_end, call.deadline) {
        (Some(b), Some(d)) if d.instant() <= b => (d.instant(), Cut::Deadline),
        (Some(b), _) => (b, Cut::Budget),
        (None, Some(d)) => (d.instant(), Cut::Deadline),
        (None, None) => return Poll::Pending,
    };
    ready!(poll_timer(timer, at, cx));
    state.set(State::Done);
    Poll::Ready(Err(call.cut_error(cut)))
}

/// Which bound ended a call: the layer's own time budget or the caller's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    Budget,
    Deadline,
}

/// Polls the one timer, pointing it at `at` first (arming it on first use).
fn poll_timer(mut timer: Pin<&mut Option<Sleep>>, at: Instant, cx: &mut Context<'_>) -> Poll<()> {
    match timer.as_mut().as_pin_mut() {
        Some(sleep) => {
            if sleep.deadline() != at {
                sleep.reset(at);
            }
        }
        None => timer.set(Some(tokio::time::sleep_until(at))),
    }
    match timer.as_pin_mut() {
        Some(sleep) => sleep.poll(cx),
        None => Poll::Ready(()),
    }
}

impl<S, Req> Call<S, Req>
where
    Req: LlmRequest + Clone,
{
    /// Decides about a failed attempt: `Ok` when a retry is scheduled (at `retrying.wake`),
    /// else the final error.
    fn on_error(&mut self, mut err: LlmError) -> Result<(), LlmError> {
        // Kept only for the wait before the next attempt; never handed on.
        let circuit = err.take_circuit();
        let now = Instant::now();
        let start = *self.start.get_or_insert(now);
        let attempt_start = self.retrying.as_ref().map_or(start, |r| r.attempt_start);
        let elapsed = now.saturating_duration_since(attempt_start);
        let spent = now.saturating_duration_since(start);
        let class = err.class();
        let index = class.index();
        let (class_retries, previous_delay) = match &self.retrying {
            Some(r) => (u32::from(r.class_retries[index]), r.previous_delay),
            None => (0, Duration::ZERO),
        };
        let budget_left = self
            .shared
            .policy
            .time_budget
            .map(|b| b.saturating_sub(spent));
        // The caller's deadline cuts the time budget: a wait must end before both.
        let deadline_left = self
            .deadline
            .map(|d| d.instant().saturating_duration_since(now));
        let failure = Failure {
            attempts: self.attempts,
            class_retries,
            previous_delay,
            remaining: match (budget_left, deadline_left) {
                (Some(b), Some(d)) => Some(b.min(d)),
                (b, d) => b.or(d),
            },
            standby: self.request.has_standby(),
        };
        let idempotent = self.request.is_idempotent();
        match self.shared.decide(&err, idempotent, failure) {
            // The caller's deadline, not the layer's own budget, left no room for the wait:
            // the caller learns that it was its deadline, with the last failure as the source.
            Decision::GiveUp(GiveUp::DeadlineTooClose)
                if deadline_left.is_some_and(|d| budget_left.is_none_or(|b| d <= b)) =>
            {
                Err(self.deadline_too_close(err, now))
            }
            Decision::GiveUp(reason) => Err(self.give_up(err, reason)),
            Decision::Retry { delay, source } => {
                tracing::info!(
                    target: "seawall::retry",
                    attempt = self.attempts,
                    class = class.as_str(),
                    status = err.status().map_or(0, |s| s.as_u16()),
                    delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    reason = source.as_str(),
                    request_id = err.request_id().unwrap_or(""),
                    "retrying LLM call after {class}",
                );
                let r = self.retrying.get_or_insert_with(|| {
                    Box::new(Retrying {
                        attempt_start: now,
                        wake: now,
                        class_retries: [0; CLASSES],
                        history: Vec::new(),
                        previous_delay: Duration::ZERO,
                        last_error: None,
                        refusal: None,
                    })
                });
                r.history.push(Attempt {
                    class,
                    status: err.status(),
                    elapsed,
                    delay,
                });
                r.class_retries[index] = r.class_retries[index].saturating_add(1);
                r.previous_delay = delay;
                r.last_error = Some(err);
                r.wake = seawall_core::instant_after(now, delay);
                r.refusal = circuit.map(|c| c.refusal_at(r.wake));
                Ok(())
            }
        }
    }

    /// The request for the next attempt, with its attempt number.
    fn next_request(&mut self) -> Req {
        self.attempts += 1;
        let attempt = self.attempts;
        let mut request = self.request.get();
        if let Some(name) = &self.shared.policy.attempt_header {
            if let Some(headers) = request.headers_mut() {
                headers.insert(name.clone(), attempt_value(attempt));
            }
        }
        if let Some(cx) = request.call_context() {
            // Add, not max: a fallback outside this layer runs a second retry loop for the
            // same logical call, and its attempts are upstream calls too.
            cx.update(|facts| facts.attempts += 1);
        }
        if let Some(r) = &mut self.retrying {
            r.attempt_start = Instant::now();
        }
        request
    }
}

impl<S, Req> Call<S, Req> {
    /// The final error: `err` with the history of the earlier attempts and the reason.
    fn give_up(&mut self, mut err: LlmError, reason: GiveUp) -> LlmError {
        let history = self
            .retrying
            .as_mut()
            .map(|r| std::mem::take(&mut r.history))
            .unwrap_or_default();
        if reason == GiveUp::NotRetryable && history.is_empty() {
            tracing::debug!(
                target: "seawall::retry",
                class = err.class().as_str(),
                status = err.status().map_or(0, |s| s.as_u16()),
                reason = reason.as_str(),
                "not retrying LLM call",
            );
        } else {
            tracing::info!(
                target: "seawall::retry",
                attempts = self.attempts,
                class = err.class().as_str(),
                status = err.status().map_or(0, |s| s.as_u16()),
                retry_after_ms = err.retry_hint().map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                reason = reason.as_str(),
                "giving up on LLM call",
            );
        }
        err.set_attempts(history);
        err.set_give_up(reason);
        err
    }

    /// The time budget or the caller's deadline ran out while an attempt was in flight (or
    /// the inner service was not ready for the next one).
    fn cut_error(&mut self, cut: Cut) -> LlmError {
        let attempt = self.attempts;
        let what = match (cut, self.shared.policy.time_budget) {
            (Cut::Budget, Some(budget)) => format!("time budget of {budget:?}"),
            _ => "the caller's deadline".to_owned(),
        };
        let last_error = self.retrying.as_mut().and_then(|r| r.last_error.take());
        let message = match &last_error {
            Some(last) => format!("{what} ran out during attempt {attempt}; last error: {last}"),
            None => format!("{what} ran out during attempt {attempt}"),
        };
        let mut err = LlmError::new(FailureClass::DeadlineExceeded, message);
        if let Some(last) = last_error {
            err = err.with_source(last);
        }
        self.give_up(err, GiveUp::DeadlineTooClose)
    }

    /// The next wait would end past the caller's deadline: the call ends now, as
    /// `DeadlineExceeded`, with `last` (the failure that asked for the wait) as its source
    /// and in its message, and the attempt history.
    fn deadline_too_close(&mut self, last: LlmError, now: Instant) -> LlmError {
        let left = self.deadline.map_or(Duration::ZERO, |d| {
            d.instant().saturating_duration_since(now)
        });
        let attempts = self.attempts;
        let message = format!(
            "the caller's deadline leaves {left:?}, too little for a retry after attempt \
             {attempts}; last error: {last}"
        );
        let mut err = LlmError::new(FailureClass::DeadlineExceeded, message);
        // The server's hint stays readable: when to come back is still worth knowing.
        if let Some(hint) = last.retry_hint() {
            err = err.with_retry_after(hint);
        }
        if let Some(id) = last.request_id() {
            err = err.with_request_id(id);
        }
        let err = err.with_source(last);
        self.give_up(err, GiveUp::DeadlineTooClose)
    }
}

impl<S, Req> fmt::Debug for ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Calling { .. } => "calling",
            State::Waiting => "waiting",
            State::Readying => "readying",
            State::Expired { .. } | State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("attempts", &self.call.attempts)
            .field(
                "history",
                &self.call.retrying.as_ref().map(|r| r.history.as_slice()),
            )
            .finish_non_exhaustive()
    }
}
