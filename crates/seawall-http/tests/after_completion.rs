//! Polling a finished call again is the caller's bug: it panics with the shared message
//! instead of returning an error the layers outside would act on.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::task::{Context, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use seawall_http::HttpTransport;
use seawall_test_support::poll_twice;
use tokio::net::TcpListener;
use tower::{Service, ServiceExt};

/// A server on a free loopback port that answers every request with `ok`.
async fn server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_: Request<Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}/v1/chat/completions")
}

#[tokio::test]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_finished_call_again_panics() {
    let url = server().await;
    let mut t = HttpTransport::new().unwrap();
    let req = Request::post(url).body(Bytes::from_static(b"{}")).unwrap();
    let mut fut = pin!(t.ready().await.unwrap().call(req));
    let resp = poll_fn(|cx| fut.as_mut().poll(cx)).await.unwrap();
    assert_eq!(resp.status(), 200);
    let _ = fut.as_mut().poll(&mut Context::from_waker(Waker::noop()));
}

#[tokio::test]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_refused_call_again_panics() {
    // A relative URI and no upstream to resolve it against: refused before sending.
    let mut t = HttpTransport::new().unwrap();
    let req = Request::post("/v1/chat/completions")
        .body(Bytes::new())
        .unwrap();
    poll_twice(t.ready().await.unwrap().call(req));
}
