//! Test doubles: a request type, and an upstream whose replies a test scripts; its bodies
//! are the shared test support's channel-fed bodies.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use seawall_core::{LlmError, LlmRequest, MediaParts, RateLimitSnapshot, Usage};
use seawall_gate::QueueWait;
pub use seawall_test_support::{ChanBody, Feed, settle};
use tokio::time::Instant;

/// The shared typed request: `Ask::numbered(id)` for model `m`, `.key(..)`, `.tokens(..)`.
pub use seawall_test_support::{Ask, Name};

/// What the upstream answers to one call.
#[derive(Debug)]
pub enum Reply {
    Ok {
        delay: Duration,
        usage: Option<Usage>,
        snapshot: Option<Box<RateLimitSnapshot>>,
        /// Keep the body open until the test ends it (a stream).
        hold: bool,
    },
    Err {
        delay: Duration,
        error: LlmError,
    },
}

impl Reply {
    pub fn ok() -> Self {
        Reply::Ok {
            delay: Duration::ZERO,
            usage: None,
            snapshot: None,
            hold: false,
        }
    }
    pub fn after(delay: Duration) -> Self {
        Reply::Ok {
            delay,
            usage: None,
            snapshot: None,
            hold: false,
        }
    }
    pub fn stream() -> Self {
        Reply::Ok {
            delay: Duration::ZERO,
            usage: None,
            snapshot: None,
            hold: true,
        }
    }
    pub fn used(total_in: u64, total_out: u64) -> Self {
        Reply::Ok {
            delay: Duration::ZERO,
            usage: Some(Usage {
                input_tokens: total_in,
                output_tokens: total_out,
                cached_input_tokens: 0,
                cache_write_input_tokens: 0,
                cache_write_1h_input_tokens: 0,
            }),
            snapshot: None,
            hold: false,
        }
    }
    pub fn with_snapshot(snapshot: RateLimitSnapshot) -> Self {
        Reply::Ok {
            delay: Duration::ZERO,
            usage: None,
            snapshot: Some(Box::new(snapshot)),
            hold: false,
        }
    }
    pub fn err(error: LlmError) -> Self {
        Reply::Err {
            delay: Duration::ZERO,
            error,
        }
    }
}

/// One call the upstream saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub id: usize,
    pub key: Option<String>,
    pub at: Instant,
    pub queue_wait: Option<QueueWait>,
}

type Script = Box<dyn Fn(&Ask) -> Reply + Send + Sync>;

pub struct State {
    script: Script,
    /// Calls from the upstream call until the body is dropped (or the error returned).
    live: AtomicUsize,
    max_live: AtomicUsize,
    seen: Mutex<Vec<Seen>>,
    streams: Mutex<Vec<(usize, Feed)>>,
}

/// An upstream double; clones share its state.
#[derive(Clone)]
pub struct Upstream(pub Arc<State>);

impl Upstream {
    pub fn new(script: impl Fn(&Ask) -> Reply + Send + Sync + 'static) -> Self {
        Upstream(Arc::new(State {
            script: Box::new(script),
            live: AtomicUsize::new(0),
            max_live: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
            streams: Mutex::new(Vec::new()),
        }))
    }

    pub fn live(&self) -> usize {
        self.0.live.load(Ordering::SeqCst)
    }
    pub fn max_live(&self) -> usize {
        self.0.max_live.load(Ordering::SeqCst)
    }
    pub fn seen(&self) -> Vec<Seen> {
        self.0.seen.lock().unwrap().clone()
    }
    pub fn calls(&self) -> usize {
        self.0.seen.lock().unwrap().len()
    }
    /// Sends a chunk on the open stream of call `id`.
    pub fn send(&self, id: usize, chunk: &'static str) {
        let s = self.0.streams.lock().unwrap();
        let (_, tx) = s.iter().find(|(i, _)| *i == id).expect("no such stream");
        tx.send(Ok(Frame::data(Bytes::from_static(chunk.as_bytes()))))
            .unwrap();
    }
    /// Fails the open stream of call `id` with `err`.
    pub fn fail(&self, id: usize, err: LlmError) {
        let s = self.0.streams.lock().unwrap();
        let (_, tx) = s.iter().find(|(i, _)| *i == id).expect("no such stream");
        tx.send(Err(err)).unwrap();
    }
    /// Ends the open stream of call `id`.
    pub fn end(&self, id: usize) {
        self.0.streams.lock().unwrap().retain(|(i, _)| *i != id);
    }
}

/// Counts a call as live until dropped.
pub struct Live(Arc<State>);

impl Live {
    fn new(st: &Arc<State>) -> Self {
        let n = st.live.fetch_add(1, Ordering::SeqCst) + 1;
        st.max_live.fetch_max(n, Ordering::SeqCst);
        Live(st.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

pub type Resp = http::Response<ChanBody>;
/// The gate's response type over this upstream.
pub type Resp2 = http::Response<seawall_core::HookedBody<ChanBody, seawall_gate::GatePermit>>;
pub type BoxFut = Pin<Box<dyn Future<Output = Result<Resp, LlmError>> + Send>>;

impl tower::Service<Ask> for Upstream {
    type Response = Resp;
    type Error = LlmError;
    type Future = BoxFut;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Ask) -> BoxFut {
        let st = self.0.clone();
        st.seen.lock().unwrap().push(Seen {
            id: req.id,
            key: req.model.as_deref().map(str::to_owned),
            at: Instant::now(),
            queue_wait: req.ext.get::<QueueWait>().copied(),
        });
        let live = Live::new(&st);
        let reply = (st.script)(&req);
        Box::pin(async move {
            match reply {
                Reply::Err { delay, error } => {
                    tokio::time::sleep(delay).await;
                    drop(live);
                    Err(error)
                }
                Reply::Ok {
                    delay,
                    usage,
                    snapshot,
                    hold,
                } => {
                    tokio::time::sleep(delay).await;
                    let (tx, body) = ChanBody::channel();
                    if hold {
                        st.streams.lock().unwrap().push((req.id, tx));
                    }
                    let mut resp = http::Response::new(body.holding(live));
                    if let Some(u) = usage {
                        resp.extensions_mut().insert(u);
                    }
                    if let Some(s) = snapshot {
                        resp.extensions_mut().insert(*s);
                    }
                    Ok(resp)
                }
            }
        })
    }
}

/// A gate over the scripted upstream.
pub type Gate = seawall_gate::ConcurrencyGate<Upstream>;

/// The gate `b` builds, over `up`.
pub fn gate(b: seawall_gate::ConcurrencyGateBuilder, up: &Upstream) -> Gate {
    use tower::Layer;
    b.build().unwrap().layer(up.clone())
}

/// Calls and returns the response or error (the response is dropped by the caller).
pub async fn call(svc: &Gate, req: Ask) -> Result<Resp2, LlmError> {
    use tower::ServiceExt;
    svc.clone().oneshot(req).await
}

/// The gate's rejection inside `e`, which must be one.
pub fn rejection(e: &LlmError) -> &seawall_gate::Rejection {
    assert_eq!(e.class(), seawall_core::FailureClass::GateRejected, "{e}");
    seawall_gate::Rejection::of(e).expect("a gate rejection")
}
