//! The response future, and the guard that holds a call's place until its body ends.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use seawall_core::{
    CacheStatus, Circuit, Completion, FailureClass, LlmError, LlmResponse, OnComplete, Outcome,
    Refusal,
};
use tokio::time::Instant;

use crate::breaker::{Admission, Breaker};
use crate::local::Held;
use crate::service::refusal_error;
use crate::state::Verdict;

/// A retry waiting to send a call back through this breaker ends the call as soon as the
/// breaker would refuse it (see [`Circuit`]).
impl Circuit for Breaker {
    fn refusal_at(self: Arc<Self>, at: Instant) -> Refusal {
        Box::pin(async move { refusal_error(self.until_refused(at).await) })
    }
}

/// A call's admission, held until its outcome is known. Dropping it unrecorded counts as a
/// cancellation (and frees a probe slot at once).
pub(crate) struct Permit {
    /// The key's breaker, through the running thread's handle where the service has one.
    breaker: Option<Held>,
    admission: Admission,
    start: u64,
    slow: bool,
}

impl Permit {
    pub(crate) fn new(breaker: Held, admission: Admission, start: u64) -> Self {
        let breaker = (admission != Admission::Untracked).then_some(breaker);
        Permit {
            breaker,
            admission,
            start,
            slow: false,
        }
    }

    pub(crate) fn untracked() -> Self {
        Permit {
            breaker: None,
            admission: Admission::Untracked,
            start: 0,
            slow: false,
        }
    }

    /// The response head (or an error) arrived: decide whether the call was slow.
    fn head(&mut self) {
        if let Some(b) = &self.breaker {
            let cfg = b.config();
            if let Some(threshold) = cfg.slow_threshold {
                let elapsed = cfg.now().saturating_sub(self.start);
                self.slow = u128::from(elapsed) > threshold.as_nanos();
            }
        }
    }

    /// The response head arrived (see [`Breaker::answered`]).
    fn answered(&mut self) {
        if let Some(b) = &self.breaker {
            b.answered(&mut self.admission);
        }
    }

    /// The breaker, for the error of a failed attempt (a tracked one: a disabled breaker
    /// refuses nothing).
    fn circuit(&self) -> Option<Arc<dyn Circuit>> {
        self.breaker
            .as_ref()
            .map(|held| held.shared().clone() as Arc<dyn Circuit>)
    }

    fn finish(mut self, verdict: Verdict) {
        if let Some(b) = self.breaker.take() {
            let cfg = b.config();
            b.record(self.admission, verdict, self.slow, || cfg.now());
        }
    }

    fn finish_error(mut self, err: &LlmError) {
        let Some(b) = self.breaker.take() else {
            return;
        };
        let cfg = b.config();
        if let Some(hint) = &cfg.open_hint {
            if let Some(wait) = hint(err) {
                b.open_for_hint(wait, cfg.now());
            }
        }
        let class = err.class();
        let verdict = cfg.verdict(class);
        if cfg.open_at_once.contains(&class) {
            b.open_at_once(self.admission, class, verdict, self.slow, || cfg.now());
        } else {
            b.record(self.admission, verdict, self.slow, || cfg.now());
        }
    }
}

impl Drop for Permit {
    // Every other ending (`finish`, `finish_error`) takes the breaker out first, so this records
    // only a call that nobody finished: the caller dropped the future or the body. It must still
    // record something, or a dropped half-open probe would keep its slot until the maximum
    // probe wait; it counts as `on_cancel` says.
    fn drop(&mut self) {
        if let Some(b) = self.breaker.take() {
            let cfg = b.config();
            b.record(self.admission, cfg.on_cancel, false, || cfg.now());
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("key", &self.breaker.as_ref().map(|b| b.key()))
            .field("admission", &self.admission)
            .field("slow", &self.slow)
            .finish()
    }
}

/// Holds a call's place in its breaker (a half-open probe slot, or its count in the window)
/// until the response body ends, fails or is dropped, then records the outcome:
///
/// - the body ends: a success (slow if its head was);
/// - the body fails: as its error's class counts (a broken stream, `StreamInterrupted`, is a
///   failure; a body error that is not an [`LlmError`] counts as `StreamInterrupted`);
/// - the body is dropped early: a cancellation, ignored by default.
pub struct BreakerGuard {
    permit: Permit,
}

impl OnComplete for BreakerGuard {
    fn on_complete(self, completion: Completion<'_>) {
        let permit = self.permit;
        match completion.outcome {
            Outcome::Complete => permit.finish(Verdict::Success),
            Outcome::Failed(Some(err)) => permit.finish_error(err),
            Outcome::Failed(None) => {
                let verdict = permit.breaker.as_ref().map_or(Verdict::Ignore, |b| {
                    b.config().verdict(FailureClass::StreamInterrupted)
                });
                permit.finish(verdict);
            }
            Outcome::Dropped => {
                // Dropping the permit records a cancellation.
                drop(permit);
            }
        }
    }
}

impl fmt::Debug for BreakerGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerGuard")
            .field("permit", &self.permit)
            .finish()
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`CircuitBreaker`](crate::CircuitBreaker).
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Called {
            #[pin]
            fut: F,
            permit: Option<Permit>,
        },
        Rejected {
            error: Option<LlmError>,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(fut: F, permit: Permit) -> Self {
        ResponseFuture {
            kind: Kind::Called {
                fut,
                permit: Some(permit),
            },
        }
    }

    pub(crate) fn rejected(error: LlmError) -> Self {
        ResponseFuture {
            kind: Kind::Rejected { error: Some(error) },
        }
    }
}

impl<F, R, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<R, E>>,
    R: LlmResponse,
    E: Into<LlmError>,
{
    type Output = Result<R::Hooked<BreakerGuard>, LlmError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Rejected { error } => match error.take() {
                Some(error) => Poll::Ready(Err(error)),
                None => seawall_core::polled_after_completion(),
            },
            KindProj::Called { fut, permit } => {
                if permit.is_none() {
                    seawall_core::polled_after_completion();
                }
                let result = ready!(fut.poll(cx));
                let mut permit = permit.take().unwrap_or_else(Permit::untracked);
                permit.head();
                Poll::Ready(match result {
                    Ok(resp) => {
                        if CacheStatus::served(&resp) {
                            // A cache stacked inside answered: that says nothing of the
                            // upstream's health, so it is no call at all (a probe's slot goes
                            // to the next call).
                            std::mem::replace(&mut permit, Permit::untracked())
                                .finish(Verdict::Ignore);
                        } else {
                            permit.answered();
                        }
                        Ok(resp.on_complete(BreakerGuard { permit }))
                    }
                    Err(e) => {
                        let mut e: LlmError = e.into();
                        if let Some(circuit) = permit.circuit() {
                            e.set_circuit(circuit);
                        }
                        permit.finish_error(&e);
                        Err(e)
                    }
                })
            }
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
