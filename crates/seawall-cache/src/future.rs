//! What happens after `call`: look the key up, wait for an identical call in flight or lead
//! one, and wrap the upstream's answer so a complete one is stored as it passes by.

use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use seawall_core::{BodyReport, CacheStatus, CallContext, ServedBy, SpareClone, Usage};
use tower_service::Service;

use crate::answer::{Answer, Assembler, Format, Wire};
use crate::body::CacheBody;
use crate::flight::{self, FlightState, Join, Lead};
use crate::key::CacheKey;
use crate::service::Shared;
use crate::store::{Looked, StoreError, StoreFuture};

/// The header every response of the cache carries: `hit`, `miss`, `bypass` or
/// `semantic(0.973)` (a semantic hit, with its score).
pub const CACHE_HEADER: http::HeaderName = http::HeaderName::from_static("x-seawall-cache");

type WaitFuture = Pin<Box<dyn Future<Output = FlightState> + Send>>;

pin_project_lite::pin_project! {
    /// The response future of [`Cache`](crate::Cache).
    pub struct ResponseFuture<S, F> {
        // The upstream call's future, once made, boxed: under a stack it is the future of
        // every layer below (kilobytes), and a hit, which never makes it, would otherwise
        // move that much with every move of this future; a miss or a bypass, which goes
        // upstream anyway, pays one allocation for it. Kept apart from `state`, so a change
        // of state writes a few dozen bytes.
        upstream: Option<Pin<Box<F>>>,
        state: State,
        // The service for a call that goes upstream after a wait, claimed from the layer's
        // spare and cloned when it does (polled ready first); `None` once called, or for a
        // call made in `call`.
        svc: Option<SpareClone<S>>,
        call: Option<Box<Pending>>,
    }
}

/// What a lookup found: an answer, nothing, or a store failure (a miss too).
type Found = Result<Option<Arc<Answer>>, StoreError>;

/// A hit's response, before its body type is known (built when polled).
struct Served {
    body: Bytes,
    usage: Usage,
    format: Format,
}

enum State {
    Lookup {
        fut: StoreFuture<Option<Arc<Answer>>>,
    },
    // A lookup the store answered at once (`CacheStore::get_now`).
    Looked {
        found: Option<Found>,
    },
    // A hit decided in `call`.
    Hit {
        served: Option<Served>,
    },
    Wait {
        fut: WaitFuture,
    },
    Semantic {
        fut: crate::semantic::SearchFuture,
    },
    // Send the pending request upstream (where a `no-cache` call starts).
    Send,
    // Wait for `upstream`.
    Call,
    Done,
}

/// A cacheable call: what it needs until its answer is stored. It lives in the response
/// future until the upstream answers, then in the body, which fills it with the answer as it
/// passes (one allocation for the whole call).
///
/// It holds the lead of its key's flight, when it has one, and ends the flight in `Drop` if
/// nothing else did (the future or the body dropped first): the flight is then abandoned, and
/// its waiters join again.
pub(crate) struct Pending {
    req: Option<Request<Bytes>>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) key: CacheKey,
    wire: Wire,
    format: Format,
    status: CacheStatus,
    pub(crate) lead: Option<Lead>,
    /// How many flights had landed before a remote store's first lookup (see `miss`).
    landed: u64,
    /// Whether this call may wait for an identical one (not after a failed flight).
    may_wait: bool,
    /// Whether the semantic cache was searched (once per call).
    searched: bool,
    /// The prompt's vector, to index the answer under once it is stored.
    pub(crate) ticket: Option<crate::semantic::Ticket>,
    context: Option<Arc<CallContext>>,
    /// Once the upstream answered with an answer that may be stored: its assembly, and the
    /// classifier's report of the body (whether it finished, when its content arrived).
    pub(crate) assembler: Option<Assembler>,
    pub(crate) report: Option<Arc<BodyReport>>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(lead) = self.lead.take() {
            self.shared.end_lead(lead, FlightState::Abandoned);
        }
    }
}

impl<S, F> std::fmt::Debug for ResponseFuture<S, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("cacheable", &self.call.is_some())
            .finish_non_exhaustive()
    }
}

pub(crate) fn context_of<B>(req: &Request<B>) -> Option<Arc<CallContext>> {
    req.extensions().get::<Arc<CallContext>>().cloned()
}

impl<S, F> ResponseFuture<S, F> {
    pub(crate) fn bypass(fut: F, context: Option<Arc<CallContext>>) -> Self {
        if let Some(cx) = context {
            cx.update(|f| f.cache = Some(CacheStatus::Bypass));
        }
        ResponseFuture {
            upstream: Some(Box::pin(fut)),
            state: State::Call,
            svc: None,
            call: None,
        }
    }

    /// A hit the store answered at once, in `call`: ready when first polled.
    pub(crate) fn hit(answer: &Answer, format: Format, context: Option<Arc<CallContext>>) -> Self {
        if let Some(cx) = &context {
            served(cx, CacheStatus::Hit);
        }
        ResponseFuture {
            upstream: None,
            state: State::Hit {
                served: Some(Served {
                    body: answer.render(format),
                    usage: answer.usage(),
                    format,
                }),
            },
            svc: None,
            call: None,
        }
    }

    /// A cacheable call; `found` is the store's answer when it gave one at once (`None`: look
    /// it up through its future).
    pub(crate) fn cached(
        svc: SpareClone<S>,
        req: Request<Bytes>,
        call: Call,
        found: Option<Found>,
    ) -> Self {
        let (state, status) = if call.refresh {
            // `no-cache`: straight upstream, then the fresh answer is stored.
            (State::Send, CacheStatus::Bypass)
        } else if let Some(found) = found {
            (State::Looked { found: Some(found) }, CacheStatus::Miss)
        } else {
            let fut = call.shared.store.get(&call.key);
            (State::Lookup { fut }, CacheStatus::Miss)
        };
        ResponseFuture {
            upstream: None,
            state,
            svc: Some(svc),
            call: Some(Pending::new(req, call, status)),
        }
    }
}

impl<S, B> ResponseFuture<S, S::Future>
where
    S: Service<Request<Bytes>, Response = Response<B>> + Clone,
    B: http_body::Body<Data = Bytes>,
{
    /// A cacheable call the store found nothing for at once (the in-memory store's miss, with
    /// the flight it joined in the same step, or a remote store's that could say at once).
    ///
    /// When nothing stands between it and the upstream (it leads its key's flight, or
    /// single flight is off, and no semantic search comes first), `svc`, the ready service,
    /// is called here, as `call` does on a bypass. Only a call that may have to call later
    /// (after waiting for a flight, a second look or a search) claims the `spare`, cloned if
    /// it does call.
    pub(crate) fn missed(
        svc: &mut S,
        spare: &mut seawall_core::Spare<S>,
        req: Request<Bytes>,
        call: Call,
        looked: Looked,
    ) -> Self {
        let mut pending = Pending::new(req, call, CacheStatus::Miss);
        match pending.after_look(looked) {
            State::Send => {
                let Some(req) = pending.req.take() else {
                    seawall_core::polled_after_completion();
                };
                ResponseFuture {
                    upstream: Some(Box::pin(svc.call(req))),
                    state: State::Call,
                    svc: None,
                    call: Some(pending),
                }
            }
            state => ResponseFuture {
                upstream: None,
                state,
                svc: Some(spare.claim(svc)),
                call: Some(pending),
            },
        }
    }
}

/// What `call` decided for a cacheable request that was not answered at once.
pub(crate) struct Call {
    pub(crate) shared: Arc<Shared>,
    pub(crate) key: CacheKey,
    pub(crate) wire: Wire,
    pub(crate) format: Format,
    pub(crate) refresh: bool,
    /// How many flights had landed before a remote store's first lookup (see `Pending::miss`;
    /// 0 and unread for the in-memory store).
    pub(crate) landed: u64,
}

/// Records a hit (exact or semantic) in the call's context: no upstream call, nothing spent.
fn served(cx: &CallContext, status: CacheStatus) {
    cx.update(|f| {
        f.cache = Some(status);
        f.cost_usd.get_or_insert(0.0);
    });
}

/// A hit's response: the replayed body, its content type, the stored usage, the cache status.
fn hit_response<B>(served: Served, status: CacheStatus) -> Response<CacheBody<B>> {
    let (mut parts, ()) = Response::new(()).into_parts();
    parts.headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(served.format.content_type()),
    );
    parts.extensions.insert(served.usage);
    mark(&mut parts, status);
    Response::from_parts(parts, CacheBody::cached(served.body))
}

impl<S, B> Future for ResponseFuture<S, S::Future>
where
    S: Service<Request<Bytes>, Response = Response<B>> + Clone,
    B: http_body::Body<Data = Bytes>,
{
    type Output = Result<Response<CacheBody<B>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        loop {
            match this.state {
                State::Hit { served } => {
                    let Some(served) = served.take() else {
                        seawall_core::polled_after_completion();
                    };
                    *this.state = State::Done;
                    return Poll::Ready(Ok(hit_response(served, CacheStatus::Hit)));
                }
                State::Lookup { fut } => {
                    let found = ready!(fut.as_mut().poll(cx));
                    if let Some(resp) = looked(this.call, this.state, found) {
                        return Poll::Ready(Ok(resp));
                    }
                }
                State::Looked { found } => {
                    let found = found.take().unwrap_or(Ok(None));
                    if let Some(resp) = looked(this.call, this.state, found) {
                        return Poll::Ready(Ok(resp));
                    }
                }
                State::Wait { fut } => {
                    let flight = ready!(fut.as_mut().poll(cx));
                    let Some(p) = this.call.as_mut() else {
                        seawall_core::polled_after_completion();
                    };
                    match flight {
                        // An answer stored unchecked is checked before it is served; one
                        // that fails is a failed flight's (see `Answer::unchecked`).
                        FlightState::Done(answer) if answer.checked().is_some() => {
                            *this.state = State::Done;
                            return Poll::Ready(Ok(p.hit(&answer, CacheStatus::Hit)));
                        }
                        FlightState::Done(_) => p.may_wait = false,
                        FlightState::Similar(answer, score) => {
                            *this.state = State::Done;
                            return Poll::Ready(Ok(p.hit(&answer, CacheStatus::Semantic(score))));
                        }
                        // The leader went away: join again (and maybe lead).
                        FlightState::Abandoned | FlightState::Running => {}
                        // A failure is not shared: call on our own.
                        FlightState::Failed => p.may_wait = false,
                    }
                    *this.state = p.miss();
                }
                State::Semantic { fut } => {
                    let searched = ready!(fut.as_mut().poll(cx));
                    let Some(p) = this.call.as_mut() else {
                        seawall_core::polled_after_completion();
                    };
                    match searched {
                        crate::semantic::Searched::Found { answer, score } => {
                            if let Some(lead) = p.lead.take() {
                                let state = FlightState::Similar(answer.clone(), score);
                                p.shared.end_lead(lead, state);
                            }
                            *this.state = State::Done;
                            let status = CacheStatus::Semantic(score);
                            return Poll::Ready(Ok(p.hit(&answer, status)));
                        }
                        crate::semantic::Searched::NotFound(ticket) => {
                            p.ticket = ticket;
                            *this.state = State::Send;
                        }
                    }
                }
                State::Send => {
                    let Some(p) = this.call.as_mut() else {
                        seawall_core::polled_after_completion();
                    };
                    if let Err(e) = ready!(poll_ready(this.svc, cx)) {
                        if let Some(lead) = p.lead.take() {
                            p.shared.end_lead(lead, FlightState::Failed);
                        }
                        *this.state = State::Done;
                        return Poll::Ready(Err(e));
                    }
                    *this.upstream = Some(send(this.svc, p));
                    *this.state = State::Call;
                }
                State::Call => {
                    let Some(fut) = this.upstream.as_mut() else {
                        seawall_core::polled_after_completion();
                    };
                    // The response is taken apart where it lands and built once, around its
                    // body, as it is handed up: every move of it is a copy of a kilobyte
                    // under a stack.
                    let (mut parts, body) = match ready!(fut.as_mut().poll(cx)) {
                        Ok(resp) => resp.into_parts(),
                        Err(e) => {
                            if let Some(p) = this.call.as_mut() {
                                if let Some(lead) = p.lead.take() {
                                    p.shared.end_lead(lead, FlightState::Failed);
                                }
                            }
                            *this.upstream = None;
                            *this.state = State::Done;
                            return Poll::Ready(Err(e));
                        }
                    };
                    let fill = match this.call.take() {
                        None => {
                            mark(&mut parts, CacheStatus::Bypass);
                            None
                        }
                        Some(p) => p.answered(&mut parts),
                    };
                    *this.upstream = None;
                    *this.state = State::Done;
                    return Poll::Ready(Ok(Response::from_parts(
                        parts,
                        CacheBody::upstream(body, fill),
                    )));
                }
                State::Done => seawall_core::polled_after_completion(),
            }
        }
    }
}

/// After a lookup (through the store's future or at once): the hit's response, or the next
/// state set.
fn looked<B>(
    call: &mut Option<Box<Pending>>,
    state: &mut State,
    found: Found,
) -> Option<Response<CacheBody<B>>> {
    let Some(p) = call.as_mut() else {
        seawall_core::polled_after_completion();
    };
    match p.looked(found) {
        ControlFlow::Break(resp) => {
            *state = State::Done;
            Some(resp)
        }
        ControlFlow::Continue(next) => {
            *state = next;
            None
        }
    }
}

/// Drives the service a call that waited will be sent on ready: the clone of the spare, made
/// here.
fn poll_ready<S, B>(
    svc: &mut Option<SpareClone<S>>,
    cx: &mut Context<'_>,
) -> Poll<Result<(), S::Error>>
where
    S: Service<Request<Bytes>, Response = Response<B>> + Clone,
{
    match svc.as_mut() {
        Some(svc) => svc.get().poll_ready(cx),
        None => Poll::Ready(Ok(())),
    }
}

/// Sends the pending request upstream, on the service [`poll_ready`] readied.
fn send<S, B>(svc: &mut Option<SpareClone<S>>, p: &mut Pending) -> Pin<Box<S::Future>>
where
    S: Service<Request<Bytes>, Response = Response<B>> + Clone,
{
    // The service is called where it is kept (a move of it or of the request is a copy),
    // and dropped once called.
    let fut = match (svc.as_mut(), p.req.take()) {
        (Some(svc), Some(req)) => Box::pin(svc.get().call(req)),
        // Each call is sent once: `miss` runs at most once per future that gets this far.
        _ => seawall_core::polled_after_completion(),
    };
    *svc = None;
    fut
}

impl Pending {
    /// A cacheable call, without its service.
    fn new(req: Request<Bytes>, call: Call, status: CacheStatus) -> Box<Self> {
        let Call {
            shared,
            key,
            wire,
            format,
            refresh,
            landed,
        } = call;
        let context = context_of(&req);
        if let Some(cx) = &context {
            cx.update(|f| f.cache = Some(status));
        }
        Box::new(Pending {
            req: Some(req),
            shared,
            key,
            wire,
            format,
            status,
            lead: None,
            landed,
            may_wait: !refresh,
            searched: false,
            ticket: None,
            context,
            assembler: None,
            report: None,
        })
    }

    /// After a lookup: serve what it found as a hit, or go on (upstream when this call
    /// already leads its flight, else to the flight).
    fn looked<B>(&mut self, found: Found) -> ControlFlow<Response<CacheBody<B>>, State> {
        match found {
            Ok(Some(answer)) => {
                if let Some(lead) = self.lead.take() {
                    // Found on the leader's second look: serve its waiters too.
                    self.shared.serve_lead(lead, answer.clone());
                }
                return ControlFlow::Break(self.hit(&answer, CacheStatus::Hit));
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "cache lookup failed; calling upstream"),
        }
        ControlFlow::Continue(if self.lead.is_some() {
            self.upstream()
        } else {
            self.miss()
        })
    }

    /// After a miss: lead or join the key's flight, or call on our own.
    ///
    /// The in-memory store looks again and joins in one step (see `MemoryStore::look`). Over
    /// a remote store, a new leader looks the store up once more before it calls when,
    /// between its first look and its joining, a flight landed (stored its answer and left
    /// the table): it may have been this key's, and the answer is then in the store. When
    /// none landed (the flight table counts them), the first look still holds and the leader
    /// calls at once.
    fn miss(&mut self) -> State {
        if self.may_wait && self.shared.single_flight {
            let looked = self.shared.memory.as_ref().map(|m| m.look(&self.key, true));
            if let Some(looked) = looked {
                return self.after_look(looked);
            }
            match self.shared.flights.join(self.key) {
                Join::Lead(lead) => {
                    let look_again = self.shared.flights.landed_since(self.landed);
                    self.lead = Some(lead);
                    if look_again {
                        return match self.shared.store.get_now(&self.key) {
                            Some(found) => State::Looked { found: Some(found) },
                            None => State::Lookup {
                                fut: self.shared.store.get(&self.key),
                            },
                        };
                    }
                    // The first look still holds: on upstream (by the semantic cache, if on).
                    return self.upstream();
                }
                Join::Wait(rx) => {
                    return State::Wait {
                        fut: Box::pin(flight::wait(rx)),
                    };
                }
            }
        }
        self.upstream()
    }

    /// After the in-memory store's look (and join): serve what it found, lead, wait, or (no
    /// flight joined) go on as after any miss.
    fn after_look(&mut self, looked: Looked) -> State {
        match looked {
            Looked::Hit(answer) => State::Looked {
                found: Some(Ok(Some(answer))),
            },
            Looked::Lead(lead) => {
                self.lead = Some(lead);
                self.upstream()
            }
            Looked::Wait(rx) => State::Wait {
                fut: Box::pin(flight::wait(rx)),
            },
            Looked::Miss => self.miss(),
        }
    }

    /// On the way upstream: search the semantic cache first (once), when it is on.
    fn upstream(&mut self) -> State {
        if !self.searched {
            self.searched = true;
            if let Some(fut) = self
                .req
                .as_ref()
                .and_then(|req| crate::semantic::search(&self.shared, req))
            {
                return State::Semantic { fut };
            }
        }
        State::Send
    }

    /// Serves `answer` as a hit (`status`: exact or semantic).
    fn hit<B>(&mut self, answer: &Answer, status: CacheStatus) -> Response<CacheBody<B>> {
        self.status = status;
        if let Some(cx) = &self.context {
            served(cx, status);
        }
        let served = Served {
            body: answer.render(self.format),
            usage: answer.usage(),
            format: self.format,
        };
        hit_response(served, status)
    }

    /// The upstream answered: marks its response and, if the answer may be stored, gives
    /// itself, ready to assemble the answer, to the body, which stores it as it passes by.
    fn answered(mut self: Box<Self>, parts: &mut http::response::Parts) -> Option<Box<Self>> {
        // The content type, looked up once: whether the body is of a known type, and which.
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .map(HeaderValue::as_bytes);
        let storable = parts.status == http::StatusCode::OK
            && content_type.is_none_or(known_type)
            && !self.served_by_fallback(&parts.extensions);
        let streamed = content_type.map_or(matches!(self.format, Format::Sse { .. }), |v| {
            v.starts_with(b"text/event-stream")
        });
        mark(parts, self.status);
        if !storable {
            if let Some(lead) = self.lead.take() {
                self.shared.end_lead(lead, FlightState::Failed);
            }
            return None;
        }
        self.assembler = Some(Assembler::new(
            self.wire,
            streamed,
            self.shared.max_entry_bytes,
        ));
        self.report = parts.extensions.get::<Arc<BodyReport>>().cloned();
        Some(self)
    }

    /// Whether a fallback target (or a degraded last resort) gave the answer, and that is not
    /// allowed in the cache.
    fn served_by_fallback(&self, extensions: &http::Extensions) -> bool {
        let refused =
            |s: &ServedBy| s.degraded || (&*s.target != "primary" && !self.shared.allow_fallback);
        match extensions.get::<ServedBy>() {
            Some(s) => refused(s),
            None => self
                .context
                .as_ref()
                .is_some_and(|cx| cx.update(|f| f.served_by.as_ref().is_some_and(refused))),
        }
    }
}

/// A JSON or SSE content type (a parameter such as `; charset=utf-8` is fine).
fn known_type(v: &[u8]) -> bool {
    v.starts_with(b"application/json") || v.starts_with(b"text/event-stream")
}

fn mark(parts: &mut http::response::Parts, status: CacheStatus) {
    // A semantic hit says its score, as the call record does (`semantic(0.973)`).
    let value = match status {
        CacheStatus::Semantic(_) => HeaderValue::from_str(&status.to_string())
            .unwrap_or_else(|_| HeaderValue::from_static(status.as_str())),
        _ => HeaderValue::from_static(status.as_str()),
    };
    parts.headers.insert(CACHE_HEADER, value);
    parts.extensions.insert(status);
}
