//! Shared helpers: a canned transport and a chunked body that counts what was pulled.
#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use seawall_classify::{ClassifiedBody, Classifier, ClassifyLayer};
use seawall_core::LlmError;
use tower::{Layer, ServiceExt};

/// A body made of fixed chunks (or errors), counting the bytes pulled and noticing its drop.
#[derive(Debug)]
pub struct Chunks {
    items: VecDeque<Result<Bytes, io::Error>>,
    pub pulled: Arc<AtomicUsize>,
    pub dropped: Arc<AtomicUsize>,
}

impl Chunks {
    pub fn new<I, T>(items: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<Bytes>,
    {
        Chunks {
            items: items.into_iter().map(|c| Ok(c.into())).collect(),
            pulled: Arc::default(),
            dropped: Arc::default(),
        }
    }

    pub fn one(body: impl Into<Bytes>) -> Self {
        Chunks::new([body.into()])
    }

    pub fn empty() -> Self {
        Chunks::new(Vec::<Bytes>::new())
    }

    /// Appends a transport error after the chunks.
    pub fn then_fail(mut self, kind: io::ErrorKind) -> Self {
        self.items
            .push_back(Err(io::Error::new(kind, "connection reset by peer")));
        self
    }
}

impl Drop for Chunks {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        Poll::Ready(self.items.pop_front().map(|item| {
            item.map(|b| {
                self.pulled.fetch_add(b.len(), Ordering::SeqCst);
                Frame::data(b)
            })
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.items.is_empty()
    }
}

pub fn response(status: u16, headers: &[(&str, &str)], body: Chunks) -> Response<Chunks> {
    let mut b = Response::builder().status(status);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(body).unwrap()
}

pub fn sse_response(body: Chunks) -> Response<Chunks> {
    response(
        200,
        &[("content-type", "text/event-stream; charset=utf-8")],
        body,
    )
}

pub fn chat_request(stream: bool) -> Request<Bytes> {
    let body = format!(
        r#"{{"model":"gpt-4o-mini","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    Request::post("https://api.openai.com/v1/chat/completions")
        .body(Bytes::from(body))
        .unwrap()
}

/// Sends one request through `ClassifyLayer` with `classifier` to a transport that answers
/// `resp`.
pub async fn run_with<C>(
    classifier: C,
    resp: Response<Chunks>,
) -> Result<Response<ClassifiedBody<Chunks>>, LlmError>
where
    C: Classifier + Clone,
{
    let cell = Mutex::new(Some(resp));
    let transport = tower::service_fn(move |_req: Request<Bytes>| {
        let r = cell.lock().unwrap().take().expect("one call");
        async move { Ok::<_, io::Error>(r) }
    });
    ClassifyLayer::builder()
        .classifier(classifier)
        .build()
        .unwrap()
        .layer(transport)
        .oneshot(chat_request(false))
        .await
}

/// Like [`run_with`], with a request of our choosing.
pub async fn run_request(
    req: Request<Bytes>,
    resp: Response<Chunks>,
) -> Result<Response<ClassifiedBody<Chunks>>, LlmError> {
    let cell = Mutex::new(Some(resp));
    let transport = tower::service_fn(move |_req: Request<Bytes>| {
        let r = cell.lock().unwrap().take().expect("one call");
        async move { Ok::<_, io::Error>(r) }
    });
    ClassifyLayer::default().layer(transport).oneshot(req).await
}

pub async fn run(resp: Response<Chunks>) -> Result<Response<ClassifiedBody<Chunks>>, LlmError> {
    run_with(seawall_classify::AutoClassifier, resp).await
}

pub async fn error_of(status: u16, headers: &[(&str, &str)], body: &str) -> LlmError {
    run(response(status, headers, Chunks::one(body.to_owned())))
        .await
        .expect_err("a failure status")
}

/// Reads a body to its end: the bytes, and the error that ended it, if any.
pub async fn drain<B>(mut body: B) -> (Vec<u8>, Option<LlmError>)
where
    B: Body<Data = Bytes, Error = LlmError> + Unpin,
{
    use http_body_util::BodyExt;
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    out.extend_from_slice(&d);
                }
            }
            Err(e) => {
                // After an error the body is over.
                assert!(body.frame().await.is_none(), "a frame after the error");
                return (out, Some(e));
            }
        }
    }
    (out, None)
}
