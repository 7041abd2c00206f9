//! seawall's retry and breaker layers around a real tonic client, through
//! `GrpcClassifyLayer`, against a tonic server that fails on purpose.
//!
//! The stack takes the request *message* (`GenerateRequest`, `Clone`, with `LlmRequest`
//! implemented below) and a `tower::service_fn` builds the `tonic::Request` per attempt, as
//! the crate docs explain. Where the retry layer must actually wait, client and server talk
//! HTTP/2 over an in-memory duplex pipe instead of TCP, so the whole exchange runs on paused
//! tokio time and the two-second wait costs nothing; the rest runs over TCP on loopback and
//! never has to wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::llm_stream::proto::{GenerateRequest, Token};
use crate::llm_stream::{Llm, LlmClient, LlmServer, TokenStream};
use hyper_util::rt::TokioIo;
use seawall_breaker::CircuitBreakerLayer;
use seawall_core::{FailureClass, GiveUp, LlmError, LlmRequest};
use seawall_retry::BackoffRetryLayer;
use seawall_tonic::{GrpcClassifyLayer, GrpcResponse};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status, Streaming};
use tonic_types::{ErrorDetails, StatusExt};
use tower::{Service, ServiceBuilder, ServiceExt};

impl LlmRequest for GenerateRequest {
    fn model(&self) -> Option<&str> {
        Some(&self.model)
    }

    fn max_output_tokens(&self) -> Option<u32> {
        Some(self.max_tokens)
    }

    fn estimated_input_tokens(&self) -> u32 {
        u32::try_from(self.prompt.len() / 4).unwrap_or(u32::MAX)
    }
}

/// A server that answers the `n`th call (from 0) as its script says, and counts the calls.
struct Scripted {
    calls: Arc<AtomicUsize>,
    script: fn(usize) -> Result<Vec<&'static str>, Status>,
}

impl Llm for Scripted {
    async fn generate(
        &self,
        _request: tonic::Request<GenerateRequest>,
    ) -> Result<tonic::Response<TokenStream>, Status> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let tokens = (self.script)(n)?;
        let tokens = tokens.into_iter().map(|t| Ok(Token { text: t.to_owned() }));
        Ok(tonic::Response::new(Box::pin(futures_util::stream::iter(
            tokens,
        ))))
    }
}

fn scripted(
    script: fn(usize) -> Result<Vec<&'static str>, Status>,
) -> (Scripted, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let server = Scripted {
        calls: calls.clone(),
        script,
    };
    (server, calls)
}

/// The server over TCP on a free loopback port, and a channel to it.
async fn over_loopback(server: Scripted) -> Channel {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(Server::builder().serve_with_incoming(LlmServer::new(server), incoming));
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy()
}

/// The server over an in-memory HTTP/2 connection (tonic's server and client, no socket), so
/// that a test can run on paused time.
async fn in_memory(server: Scripted) -> Channel {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    // One connection, and an incoming stream that stays open so the server keeps serving it.
    let incoming = futures_util::StreamExt::chain(
        futures_util::stream::iter([Ok::<_, std::io::Error>(server_io)]),
        futures_util::stream::pending(),
    );
    tokio::spawn(Server::builder().serve_with_incoming(LlmServer::new(server), incoming));
    let mut client_io = Some(client_io);
    Endpoint::from_static("http://in-memory.invalid")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let io = client_io.take();
            async move {
                io.map(TokioIo::new)
                    .ok_or_else(|| std::io::Error::other("the in-memory connection is taken"))
            }
        }))
        .await
        .unwrap()
}

/// The generated client's method as a tower service of the request message.
fn grpc_call(
    client: LlmClient,
) -> impl Service<
    GenerateRequest,
    Response = tonic::Response<Streaming<Token>>,
    Error = Status,
    Future: Send,
> + Clone {
    tower::service_fn(move |req: GenerateRequest| {
        let mut client = client.clone();
        async move { client.generate(req).await }
    })
}

fn ask() -> GenerateRequest {
    GenerateRequest {
        model: "llama-3-8b".to_owned(),
        prompt: "Hello!".to_owned(),
        max_tokens: 16,
    }
}

async fn texts(resp: GrpcResponse<tonic::Response<Streaming<Token>>>) -> Vec<String> {
    let mut stream = resp.into_inner().into_inner();
    let mut out = Vec::new();
    while let Some(token) = stream.message().await.unwrap() {
        out.push(token.text);
    }
    out
}

fn rate_limited_for(delay: Duration) -> Status {
    Status::with_error_details(
        Code::ResourceExhausted,
        "requests per minute exceeded",
        ErrorDetails::with_retry_info(Some(delay)),
    )
}

#[tokio::test(start_paused = true)]
async fn the_retry_layer_waits_the_servers_retry_info_then_succeeds() {
    let (server, calls) = scripted(|n| match n {
        0 => Err(rate_limited_for(Duration::from_secs(2))),
        _ => Ok(vec!["Hello", " there"]),
    });
    let client = LlmClient::new(in_memory(server).await);
    let stack = ServiceBuilder::new()
        .layer(BackoffRetryLayer::new())
        .layer(CircuitBreakerLayer::new())
        .layer(GrpcClassifyLayer::new())
        .service(grpc_call(client));

    let start = Instant::now();
    let resp = stack.oneshot(ask()).await.expect("the retry succeeds");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "the retry waited the server's RetryInfo delay: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(3),
        "and not much more: {waited:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(texts(resp).await, ["Hello", " there"]);
}

#[tokio::test(start_paused = true)]
async fn a_negative_pushback_stops_the_retry_layer() {
    let (server, calls) = scripted(|_| {
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata.insert(seawall_tonic::PUSHBACK_KEY, "-1".parse().unwrap());
        Err(Status::with_metadata(
            Code::Unavailable,
            "draining",
            metadata,
        ))
    });
    let client = LlmClient::new(in_memory(server).await);
    let stack = ServiceBuilder::new()
        .layer(BackoffRetryLayer::new())
        .layer(GrpcClassifyLayer::new())
        .service(grpc_call(client));
    let err = stack.oneshot(ask()).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Overloaded);
    assert_eq!(err.give_up(), Some(GiveUp::NotRetryable), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_retry_info_longer_than_the_retry_cap_ends_the_call_at_once_with_the_hint() {
    let (server, calls) = scripted(|_| Err(rate_limited_for(Duration::from_secs(120))));
    let client = LlmClient::new(over_loopback(server).await);
    let stack = ServiceBuilder::new()
        .layer(BackoffRetryLayer::new())
        .layer(CircuitBreakerLayer::new())
        .layer(GrpcClassifyLayer::new())
        .service(grpc_call(client));
    let err = tokio::time::timeout(Duration::from_secs(30), stack.oneshot(ask()))
        .await
        .expect("no wait")
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::RateLimited);
    assert_eq!(err.retry_hint(), Some(Duration::from_secs(120)));
    assert_eq!(err.give_up(), Some(GiveUp::HintTooLong), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // And a seawall server in front would pass the hint on to its own callers.
    let status = seawall_tonic::to_status(&err);
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.get_details_retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(120))
    );
}

#[tokio::test]
async fn the_breaker_opens_on_unavailable_and_stops_calling_the_server() {
    let (server, calls) = scripted(|_| Err(Status::unavailable("engine is restarting")));
    let client = LlmClient::new(over_loopback(server).await);
    let mut stack = ServiceBuilder::new()
        .layer(CircuitBreakerLayer::new())
        .layer(GrpcClassifyLayer::new())
        .service(grpc_call(client));
    // The breaker's default: five failures in a row open it.
    for _ in 0..5 {
        let err = stack.ready().await.unwrap().call(ask()).await.unwrap_err();
        assert_eq!(err.class(), FailureClass::Overloaded, "{err}");
    }
    let err: LlmError = stack.ready().await.unwrap().call(ask()).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::CircuitOpen, "{err}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        5,
        "the open breaker kept the call away"
    );
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_failure() {
    // A port that was free a moment ago: nothing listens there now.
    let addr = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let classified = ServiceBuilder::new()
        .layer(GrpcClassifyLayer::new())
        .service(grpc_call(LlmClient::new(channel)));
    let err = tokio::time::timeout(Duration::from_secs(30), classified.oneshot(ask()))
        .await
        .expect("a refused connection fails at once")
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Connect, "{err}");
}
