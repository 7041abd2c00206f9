//! The transport under `StreamTimeoutLayer`, over loopback: real hyper bodies, real SSE framing.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use seawall_core::{FailureClass, LlmError};
use seawall_http::{HttpTransport, Upstream};
use seawall_stream::{StreamStats, StreamTimeoutLayer, StreamTimeouts};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tower::{Layer, ServiceExt};

/// A server body fed by the test, one frame per message.
struct Feed(mpsc::UnboundedReceiver<&'static str>);

impl http_body::Body for Feed {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|m| m.map(|s| Ok(Frame::data(Bytes::from_static(s.as_bytes())))))
    }
}

/// A one-connection SSE server; the returned sender writes its body.
async fn sse_server() -> (String, mpsc::UnboundedSender<&'static str>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::unbounded_channel();
    let rx = std::sync::Mutex::new(Some(rx));
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
            let rx = rx.lock().unwrap().take().expect("one request");
            async move {
                Ok::<_, hyper::Error>(
                    Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(Feed(rx))
                        .unwrap(),
                )
            }
        });
        let _ = auto::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(stream), svc)
            .await;
    });
    (url, tx)
}

fn stack(url: &str) -> seawall_stream::StreamTimeout<HttpTransport> {
    let transport = HttpTransport::builder()
        .upstream(Upstream::new(url).unwrap())
        .build()
        .unwrap();
    // Real sockets and real time: no timeouts here (they are tested on paused time).
    StreamTimeoutLayer::builder()
        .timeouts(StreamTimeouts::none())
        .build()
        .unwrap()
        .layer(transport)
}

fn chat() -> Request<Bytes> {
    Request::post("/chat/completions")
        .body(Bytes::from_static(br#"{"model":"m","stream":true}"#))
        .unwrap()
}

const DELTA: &str =
    "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n";

#[tokio::test]
async fn a_stream_with_keepalives_passes_through_whole() {
    let (url, tx) = sse_server().await;
    tx.send(": keep-alive\n\n").unwrap();
    tx.send("\n").unwrap();
    tx.send(DELTA).unwrap();
    tx.send("data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\n")
        .unwrap();
    tx.send("data: [DONE]\n\n").unwrap();
    drop(tx);
    let resp = stack(&url).oneshot(chat()).await.unwrap();
    let stats = StreamStats::of(&resp).unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body.starts_with(b": keep-alive\n\n\n"));
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    assert!(stats.time_to_first_token().is_some());
    assert!(stats.is_complete() && stats.hit_length_limit());
}

#[tokio::test]
async fn a_cut_stream_is_interrupted_and_an_early_error_event_is_an_err() {
    let (url, tx) = sse_server().await;
    tx.send(DELTA).unwrap();
    drop(tx); // the server ends the body without [DONE]
    let resp = stack(&url).oneshot(chat()).await.unwrap();
    let err: LlmError = resp.into_body().collect().await.unwrap_err();
    assert_eq!(err.class(), FailureClass::StreamInterrupted);

    let (url, tx) = sse_server().await;
    tx.send(": keep-alive\n\n").unwrap();
    tx.send("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n")
        .unwrap();
    let err = stack(&url).oneshot(chat()).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Overloaded);
}
