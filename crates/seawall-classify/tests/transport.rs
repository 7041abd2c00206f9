//! Transport errors from real hyper / hyper-util clients over loopback, and timeouts.

use std::convert::Infallible;
use std::io;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use seawall_classify::ClassifyLayer;
use seawall_core::FailureClass;
use seawall_test_support::RefusedPort;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};

fn request(port: u16) -> Request<Bytes> {
    Request::post(format!("http://127.0.0.1:{port}/v1/messages"))
        .header("anthropic-version", "2023-06-01")
        .body(Bytes::from_static(
            br#"{"model":"claude-haiku-4-5","max_tokens":10,"stream":true,"messages":[]}"#,
        ))
        .unwrap()
}

/// A real hyper-util client as the transport.
fn hyper_transport() -> impl Service<
    Request<Bytes>,
    Response = http::Response<hyper::body::Incoming>,
    Error = hyper_util::client::legacy::Error,
    Future = impl Send,
> + Clone {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    tower::service_fn(move |req: Request<Bytes>| client.request(req.map(Full::new)))
}

/// Serves one connection: reads the request head, then runs `reply`.
async fn one_shot_server<F, Fut>(reply: F) -> u16
where
    F: FnOnce(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 8192];
        let mut seen = Vec::new();
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = sock.read(&mut buf).await.unwrap();
            if n == 0 {
                return;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        reply(sock).await;
    });
    port
}

#[tokio::test]
async fn connection_refused_is_connect() {
    let refused = RefusedPort::new();
    let err = ServiceBuilder::new()
        .layer(ClassifyLayer::default())
        .service(hyper_transport())
        .oneshot(request(refused.port()))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Connect, "{err:?}");
    assert!(
        err.message().starts_with("could not connect"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn connection_closed_after_sending_is_disconnected() {
    let port = one_shot_server(|sock| async move { drop(sock) }).await;
    let err = ServiceBuilder::new()
        .layer(ClassifyLayer::default())
        .service(hyper_transport())
        .oneshot(request(port))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Disconnected, "{err:?}");
}

#[tokio::test]
async fn real_http_error_status_and_broken_stream() {
    let port = one_shot_server(|mut sock| async move {
        let body = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let head = format!(
            "HTTP/1.1 529 Site Overloaded\r\ncontent-type: application/json\r\nrequest-id: req_real\r\nx-should-retry: true\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        sock.write_all(head.as_bytes()).await.unwrap();
    })
    .await;
    let err = ServiceBuilder::new()
        .layer(ClassifyLayer::default())
        .service(hyper_transport())
        .oneshot(request(port))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Overloaded);
    assert_eq!(err.request_id(), Some("req_real"));
    assert_eq!(err.should_retry(), Some(true));

    // A chunked SSE stream cut after its first content.
    let port = one_shot_server(|mut sock| async move {
        let event = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
            event.len()
        );
        sock.write_all(head.as_bytes()).await.unwrap();
        sock.flush().await.unwrap();
    })
    .await;
    let resp = ServiceBuilder::new()
        .layer(ClassifyLayer::default())
        .service(hyper_transport())
        .oneshot(request(port))
        .await
        .unwrap();
    let mut body = resp.into_body();
    assert!(body.frame().await.unwrap().is_ok());
    let err = loop {
        match body.frame().await {
            Some(Ok(_)) => {}
            Some(Err(e)) => break e,
            None => panic!("the cut stream ended silently"),
        }
    };
    assert_eq!(err.class(), FailureClass::StreamInterrupted, "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn attempt_timeout_inside_is_timeout() {
    let slow = tower::service_fn(|_req: Request<Bytes>| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, io::Error>(http::Response::new(Full::new(Bytes::new())))
    });
    let err = ServiceBuilder::new()
        .layer(ClassifyLayer::default())
        .timeout(Duration::from_secs(5))
        .service(slow)
        .oneshot(request(1))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Timeout);
}

#[tokio::test]
async fn readiness_errors_are_classified() {
    #[derive(Clone)]
    struct NotReady;
    impl Service<Request<Bytes>> for NotReady {
        type Response = http::Response<Full<Bytes>>;
        type Error = io::Error;
        type Future = std::future::Ready<Result<Self::Response, io::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
            Poll::Ready(Err(io::ErrorKind::ConnectionRefused.into()))
        }
        fn call(&mut self, _: Request<Bytes>) -> Self::Future {
            unreachable!("never ready")
        }
    }
    let err = ServiceBuilder::new()
        .layer(ClassifyLayer::default())
        .service(NotReady)
        .oneshot(request(1))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Connect);
}

#[tokio::test]
async fn infallible_transports_work_too() {
    let ok = tower::service_fn(|_req: Request<Bytes>| async {
        let resp = http::Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        Ok::<_, Infallible>(resp)
    });
    let resp = ServiceBuilder::new()
        .layer(ClassifyLayer::default())
        .service(ok)
        .oneshot(request(1))
        .await
        .unwrap();
    assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "{}");
}
