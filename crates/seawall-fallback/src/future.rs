//! The fallback chain of one call: the primary attempt, then each target of the chosen list in
//! turn, then the cache or the degraded answer, driven as one future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use seawall_core::{
    CallContext, FailureClass, Fallback, KeptRequest, LlmError, LlmRequest, LlmResponse, ServedBy,
    SpareClone, Standby,
};
use tokio::time::{Instant, Sleep, sleep_until};
use tower::util::BoxCloneSyncService;
use tower_service::Service;

use crate::cache::{BoxFuture, CacheOps, LastResort};
use crate::error::{FallbackError, Tried};
use crate::state::Local;
use crate::target::Route;

pin_project! {
    /// The response future of [`Fallback`](crate::Fallback).
    ///
    /// Dropping it cancels the target running at that moment, and no further target is
    /// called: nothing runs in the background.
    pub struct ResponseFuture<F, S, Req, Resp> {
        #[pin]
        state: State<F, Resp>,
        // Boxed, as `Chain::pending` is: most calls set no deadline, and the future is moved
        // whole as the layers above build theirs.
        deadline: Option<Pin<Box<Sleep>>>,
        chain: Chain<S, Req, Resp>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, Resp> {
        // A call to the wrapped service: the caller's request, or a rewrite of it.
        Calling { #[pin] fut: F },
        // A call to another target service.
        Other { fut: BoxFuture<Result<Resp, LlmError>> },
        // The next target is chosen; its service is being driven ready.
        Ready,
        // A success is being read into the last-resort cache.
        Capture { fut: BoxFuture<Resp> },
        // The caller's deadline had passed before the call: nothing was started.
        Expired { err: Option<LlmError> },
        Done,
    }
}

enum Next<Req, Resp> {
    Primary,
    Other(BoxCloneSyncService<Req, Resp, LlmError>),
}

enum Step<Resp> {
    Start,
    Capture(BoxFuture<Resp>),
    Done(Result<Resp, LlmError>),
}

/// Everything the chain knows besides the in-flight future.
struct Chain<S, Req, Resp> {
    shared: Arc<Local<Req, Resp>>,
    /// The caller's request, kept to build each target's copy.
    original: Option<KeptRequest<Req>>,
    /// The claim on a clone of the wrapped service, for targets routed to it.
    primary: Option<SpareClone<S>>,
    /// The next target's request and service, while it is driven ready. Boxed: only a call
    /// that falls back has one, and inline it would add a request's size to every call's
    /// future.
    pending: Option<Box<(Req, Next<Req, Resp>)>>,
    /// The current target's name once the chain left the primary (`None`: the primary's,
    /// read from the layer's state: no copy of a shared name per call, an atomic write to
    /// make and one to drop).
    current_name: Option<Arc<str>>,
    current_model: Option<Arc<str>>,
    /// The list chosen by the primary's failure; `None` while the primary runs.
    list: Option<Fallback>,
    next: usize,
    fallbacks: usize,
    tried: Vec<Tried>,
    last_resort: bool,
    cache_key: Option<u64>,
    context: Option<Arc<CallContext>>,
    deadline_at: Option<Instant>,
    /// The caller's request came marked [`Standby`]: a fallback layer further out stands by
    /// after this chain's last target too.
    outer_standby: bool,
}

impl<F, S, Req, Resp> ResponseFuture<F, S, Req, Resp> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        shared: Arc<Local<Req, Resp>>,
        original: Option<KeptRequest<Req>>,
        primary: Option<SpareClone<S>>,
        model: Option<Arc<str>>,
        cache_key: Option<u64>,
        context: Option<Arc<CallContext>>,
        deadline_at: Option<Instant>,
        outer_standby: bool,
        call: impl FnOnce() -> F,
    ) -> Self {
        // Everything else first, the primary's future last, in the struct it is kept in: the
        // future (the inner stack's, kilobytes) is then written in place, not copied in.
        let deadline = deadline_at.map(|at| Box::pin(sleep_until(at)));
        ResponseFuture {
            state: State::Calling { fut: call() },
            deadline,
            chain: Chain {
                current_name: None,
                shared,
                original,
                primary,
                pending: None,
                current_model: model,
                list: None,
                next: 0,
                fallbacks: 0,
                tried: Vec::new(),
                last_resort: false,
                cache_key,
                context,
                deadline_at,
                outer_standby,
            },
        }
    }
}

impl<F, S, Req, Resp> ResponseFuture<F, S, Req, Resp> {
    /// A call that arrived past the caller's deadline: it fails with `err` at its first poll,
    /// and no target, the primary included, is started.
    pub(crate) fn expired(shared: Arc<Local<Req, Resp>>, err: LlmError) -> Self {
        ResponseFuture {
            state: State::Expired { err: Some(err) },
            deadline: None,
            chain: Chain {
                current_name: None,
                shared,
                original: None,
                primary: None,
                pending: None,
                current_model: None,
                list: None,
                next: 0,
                fallbacks: 0,
                tried: Vec::new(),
                last_resort: false,
                cache_key: None,
                context: None,
                deadline_at: None,
                outer_standby: false,
            },
        }
    }
}

fn internal() -> LlmError {
    LlmError::new(
        FailureClass::ServerError,
        "seawall-fallback: no service prepared for this target",
    )
}

impl<S, Req, Resp> Chain<S, Req, Resp> {
    /// The current target's name.
    fn name(&self) -> &Arc<str> {
        self.current_name
            .as_ref()
            .unwrap_or(&self.shared.primary_name)
    }
}

impl<S, Req: LlmRequest + Clone, Resp> Chain<S, Req, Resp> {
    /// The call's context: the kept request's when the request is kept (not copied apart
    /// from it: a copy is an atomic write, its drop another), else the chain's own.
    fn context(&self) -> Option<&Arc<CallContext>> {
        match &self.original {
            Some(original) => original.call_context(),
            None => self.context.as_ref(),
        }
    }
}

impl<S, Req, Resp> Chain<S, Req, Resp>
where
    S: Service<Req, Response = Resp> + Clone,
    S::Error: Into<LlmError>,
    Req: LlmRequest + Clone,
    Resp: LlmResponse,
{
    fn deadline_passed(&self) -> bool {
        self.deadline_at.is_some_and(|d| Instant::now() >= d)
    }

    fn mark(&self, resp: &mut Resp, served: ServedBy, last: Option<LastResort>) {
        if let Some(cx) = self.context() {
            let served = served.clone();
            cx.update(|f| f.served_by = Some(served));
        }
        if let Some(ext) = resp.extensions_mut() {
            seawall_core::reserve_extensions(ext);
            ext.insert(served);
            if let Some(last) = last {
                ext.insert(last);
            }
        }
    }

    /// Marks a success in place: `Some` with the last-resort cache, its key and the answer's
    /// server when the answer is to be read into it, `None` when it goes back as it is. The
    /// response is taken by reference: a few hundred bytes, not moved in and out on every
    /// call's way back.
    fn succeed(&self, resp: &mut Resp) -> Option<(&dyn CacheOps<Req, Resp>, u64, ServedBy)> {
        // The name the request asked for is reused when the upstream echoes it back.
        let model = match (resp.served_model(), &self.current_model) {
            (Some(served), Some(asked)) if served == &**asked => Some(asked.clone()),
            // Another name (a dated version of the one asked for): shared per thread.
            (Some(served), _) => Some(seawall_core::shared_name(served)),
            (None, asked) => asked.clone(),
        };
        let served = ServedBy {
            target: self.name().clone(),
            model,
            degraded: false,
        };
        match (&self.shared.cache, self.cache_key) {
            (Some(cache), Some(key)) => {
                self.mark(resp, served.clone(), None);
                Some((&**cache, key, served))
            }
            _ => {
                self.mark(resp, served, None);
                None
            }
        }
    }

    /// The current target failed with `err` (`cut`: our deadline stopped it).
    fn fail(&mut self, err: LlmError, cut: bool) -> Step<Resp> {
        let which = self.shared.dispositions.get(err.class()).fallback;
        let first = self.list.is_none();
        if first {
            if which == Fallback::No && !cut {
                // The request itself is at fault: no fallback, no last resort, and the error
                // goes back unchanged.
                return Step::Done(Err(err));
            }
            self.list = Some(which);
            self.last_resort = which == Fallback::Yes;
        }
        self.last_resort |= cut;
        tracing::debug!(
            target: "seawall::fallback",
            failed = %self.name(),
            class = %err.class(),
            "fallback target failed"
        );
        self.tried.push(Tried::new(
            self.name().clone(),
            self.current_model.clone(),
            err,
        ));
        if cut {
            return self.finish(true);
        }
        if !first && which == Fallback::No {
            return self.finish(false);
        }
        self.advance()
    }

    /// Prepares the next target of the list, or finishes.
    fn advance(&mut self) -> Step<Resp> {
        let shared = self.shared.clone();
        let list = shared.list(self.list.unwrap_or(Fallback::No));
        loop {
            if self.deadline_passed() {
                return self.finish(true);
            }
            if self.fallbacks >= shared.max_fallbacks {
                return self.finish(false);
            }
            let Some(target) = list.get(self.next) else {
                return self.finish(false);
            };
            self.next += 1;
            let Some(original) = &self.original else {
                return self.finish(false);
            };
            let mut req = original.get();
            if let Err(e) = target.prepare(&mut req) {
                // A target that cannot be built for this request (a request type that cannot
                // switch models, a failing rewrite) is skipped, and listed.
                self.tried.push(Tried::new(
                    target.name_arc().clone(),
                    target.model_arc().cloned(),
                    e,
                ));
                continue;
            }
            // Another target after this one (or a fallback further out) stands by for it.
            let more = self.next < list.len() && self.fallbacks + 1 < shared.max_fallbacks;
            Standby::set(&mut req, more || self.outer_standby);
            let next = match target.route() {
                Route::Primary => Next::Primary,
                Route::Service(s) => Next::Other(s.clone()),
            };
            self.current_name = Some(target.name_arc().clone());
            self.current_model = target
                .model_arc()
                .cloned()
                .or_else(|| req.model().map(Arc::from));
            self.pending = Some(Box::new((req, next)));
            self.fallbacks += 1;
            if let Some(cx) = self.context() {
                cx.update(|f| f.fallbacks += 1);
            }
            tracing::debug!(
                target: "seawall::fallback",
                next = %self.name(),
                n = self.fallbacks,
                "falling back"
            );
            return Step::Start;
        }
    }

    /// The chain is over without a response: the last resort, or the final error.
    fn finish(&mut self, deadline: bool) -> Step<Resp> {
        let mut tried = std::mem::take(&mut self.tried);
        let err = match tried.pop() {
            Some(only) if tried.is_empty() && !deadline => only.into_error(),
            Some(last) => {
                tried.push(last);
                FallbackError::new(tried, deadline).into_llm_error()
            }
            None => FallbackError::new(tried, true).into_llm_error(),
        };
        if self.last_resort {
            if let (Some(cache), Some(key)) = (&self.shared.cache, self.cache_key) {
                if let Some((mut resp, how)) = cache.replay(key) {
                    let model = match &how {
                        LastResort::Cached { served_by, .. } => served_by.model.clone(),
                        LastResort::Static => None,
                    };
                    let served = ServedBy {
                        target: Arc::from("cache"),
                        model,
                        degraded: true,
                    };
                    tracing::warn!(target: "seawall::fallback", error = %err, "answering from the last-resort cache");
                    self.mark(&mut resp, served, Some(how));
                    return Step::Done(Ok(resp));
                }
            }
            if let (Some(degraded), Some(original)) = (&self.shared.degraded, &self.original) {
                let mut resp = degraded(&original.get(), &err);
                let served = ServedBy {
                    target: Arc::from("degraded"),
                    model: None,
                    degraded: true,
                };
                tracing::warn!(target: "seawall::fallback", error = %err, "answering with the degraded response");
                self.mark(&mut resp, served, Some(LastResort::Static));
                return Step::Done(Ok(resp));
            }
        }
        Step::Done(Err(err))
    }

    fn poll_target_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        match self.pending.as_deref_mut() {
            Some((_, Next::Primary)) => match &mut self.primary {
                Some(s) => s.get().poll_ready(cx).map_err(Into::into),
                None => Poll::Ready(Err(internal())),
            },
            Some((_, Next::Other(s))) => s.poll_ready(cx),
            None => Poll::Ready(Err(internal())),
        }
    }

    fn call_target(&mut self) -> Result<State<S::Future, Resp>, LlmError> {
        match (self.pending.take().map(|p| *p), &mut self.primary) {
            (Some((req, Next::Primary)), Some(s)) => Ok(State::Calling {
                fut: s.get().call(req),
            }),
            (Some((req, Next::Other(mut s))), _) => Ok(State::Other { fut: s.call(req) }),
            _ => Err(internal()),
        }
    }
}

impl<S, Req, Resp> Future for ResponseFuture<S::Future, S, Req, Resp>
where
    S: Service<Req, Response = Resp> + Clone,
    S::Error: Into<LlmError>,
    Req: LlmRequest + Clone,
    Resp: LlmResponse,
{
    type Output = Result<Resp, LlmError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let polled = match this.state.as_mut().project() {
                StateProj::Calling { fut } => match fut.poll(cx) {
                    // The usual end, handled where the response lands: marked in place and
                    // handed back, not moved through the chain's steps.
                    Poll::Ready(Ok(mut resp)) => {
                        this.state.set(State::Done);
                        let Some((cache, key, served)) = this.chain.succeed(&mut resp) else {
                            return Poll::Ready(Ok(resp));
                        };
                        let fut = cache.capture(key, served, resp);
                        this.state.set(State::Capture { fut });
                        continue;
                    }
                    Poll::Ready(Err(e)) => Poll::Ready(Err(e.into())),
                    Poll::Pending => Poll::Pending,
                },
                StateProj::Other { fut } => fut.as_mut().poll(cx),
                StateProj::Ready => match this.chain.poll_target_ready(cx) {
                    Poll::Ready(Ok(())) => match this.chain.call_target() {
                        Ok(next) => {
                            this.state.set(next);
                            continue;
                        }
                        Err(e) => Poll::Ready(Err(e)),
                    },
                    Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                    Poll::Pending => Poll::Pending,
                },
                StateProj::Capture { fut } => {
                    let resp = ready!(fut.as_mut().poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(resp));
                }
                StateProj::Expired { err } => {
                    let err = err.take().unwrap_or_else(internal);
                    this.state.set(State::Done);
                    return Poll::Ready(Err(err));
                }
                StateProj::Done => seawall_core::polled_after_completion(),
            };
            let (outcome, cut) = match polled {
                Poll::Ready(outcome) => (outcome, false),
                Poll::Pending => {
                    let fired = this
                        .deadline
                        .as_mut()
                        .is_some_and(|s| s.as_mut().poll(cx).is_ready());
                    if !fired {
                        return Poll::Pending;
                    }
                    let err = LlmError::new(
                        FailureClass::DeadlineExceeded,
                        "the deadline passed while this target was running",
                    );
                    (Err(err), true)
                }
            };
            // Drops the finished (or cancelled) target's future before anything else starts.
            this.state.set(State::Done);
            let step = match outcome {
                Ok(mut resp) => match this.chain.succeed(&mut resp) {
                    None => Step::Done(Ok(resp)),
                    Some((cache, key, served)) => Step::Capture(cache.capture(key, served, resp)),
                },
                Err(err) => this.chain.fail(err, cut),
            };
            match step {
                Step::Start => this.state.set(State::Ready),
                Step::Capture(fut) => this.state.set(State::Capture { fut }),
                Step::Done(result) => return Poll::Ready(result),
            }
        }
    }
}

impl<F, S, Req, Resp> fmt::Debug for ResponseFuture<F, S, Req, Resp> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Calling { .. } => "calling",
            State::Other { .. } => "calling",
            State::Ready => "readying",
            State::Capture { .. } => "capturing",
            State::Expired { .. } | State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("target", self.chain.name())
            .field("fallbacks", &self.chain.fallbacks)
            .finish()
    }
}
