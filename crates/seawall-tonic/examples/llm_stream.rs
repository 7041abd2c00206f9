//! A gRPC service that streams an LLM's answer: `seawall.example.v1.Llm/Generate` takes a
//! prompt and streams the tokens back as the model writes them, calling the model through the
//! recommended seawall stack and ending failed calls with the status gRPC clients expect.
//!
//! ```text
//! cargo run -p seawall-tonic --example llm_stream                        # serve until Ctrl-C
//! cargo run -p seawall-tonic --example llm_stream -- "Write a haiku"     # serve, ask once, exit
//! OPENAI_API_KEY=sk-... cargo run -p seawall-tonic --example llm_stream  # a real provider
//! ```
//!
//! Without `OPENAI_API_KEY` the model is `seawall_mock`'s chaos upstream on a free loopback
//! port, which fails one call in five with a 503 (retried, so rarely seen by a client).
//! `LLM_STREAM_ADDR` sets the address (default `127.0.0.1:50051`), `MODEL` the default model.
//! The service has no client authentication and spends the upstream key for whoever reaches
//! it, so it refuses to listen anywhere but on a loopback address. With `grpcurl`:
//!
//! ```text
//! grpcurl -plaintext -import-path crates/seawall-tonic/proto -proto llm.proto \
//!   -d '{"prompt":"Hello!"}' 127.0.0.1:50051 seawall.example.v1.Llm/Generate
//! ```
//!
//! What a client sees:
//!
//! - tokens as `Token` messages, once the first real token has arrived (the commit point:
//!   retries, overloads and keep-alives before it are invisible);
//! - a failure before the first token as the call's status: `RESOURCE_EXHAUSTED` for a rate
//!   limit (with `google.rpc.RetryInfo` when the upstream said when to come back) or an
//!   exhausted quota, `INVALID_ARGUMENT` for a prompt too long for the model, `UNAVAILABLE`
//!   for an outage, and so on ([`seawall_tonic::to_status`]), with `google.rpc.ErrorInfo`
//!   naming the failure class;
//! - a failure after the first token as a status that ends the stream (`UNAVAILABLE`, reason
//!   `STREAM_INTERRUPTED`): the tokens already sent stand, and nothing is repeated.
//!
//! The messages and the server and client glue are written by hand, with `proto/llm.proto`
//! as the contract (the crate docs say why no code generator). The stack is the README's
//! recommended order (observe, retry, breaker, gate, stream timeouts, classify, transport);
//! a cost budget and a fallback slot in as in the workspace's `examples/gateway.rs`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use seawall_breaker::CircuitBreakerLayer;
use seawall_classify::ClassifyLayer;
use seawall_core::{BoxError, LlmError, SseDecoder, SseItem};
use seawall_gate::ConcurrencyGateLayer;
use seawall_http::{ApiKey, HttpTransport, OpenAiConfig};
use seawall_mock::{ErrorRule, MockUpstream, Profile};
use seawall_observe::{ObserveLayer, TracingRecorder};
use seawall_retry::BackoffRetryLayer;
use seawall_stream::StreamTimeoutLayer;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{IntoRequest, Status, Streaming};
use tonic_prost::ProstCodec;
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};

/// The messages of `proto/llm.proto`, as `prost-build` would write them.
pub(crate) mod proto {
    /// A prompt, and the model to answer it.
    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub(crate) struct GenerateRequest {
        /// The model; empty for the server's default.
        #[prost(string, tag = "1")]
        pub(crate) model: String,
        /// The prompt.
        #[prost(string, tag = "2")]
        pub(crate) prompt: String,
        /// The most tokens to generate; 0 for the server's default.
        #[prost(uint32, tag = "3")]
        pub(crate) max_tokens: u32,
    }

    /// The next piece of the answer.
    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub(crate) struct Token {
        /// Its text.
        #[prost(string, tag = "1")]
        pub(crate) text: String,
    }
}

use proto::{GenerateRequest, Token};

/// The method's path: `/<package>.<service>/<method>`.
pub(crate) const GENERATE_PATH: &str = "/seawall.example.v1.Llm/Generate";

/// A boxed future, as the hand-written glue hands them around.
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A stream of answer tokens that may end with a status.
pub(crate) type TokenStream = Pin<Box<dyn Stream<Item = Result<Token, Status>> + Send>>;

/// What the service does: the trait `tonic-build` would generate for `service Llm`.
pub(crate) trait Llm: Send + Sync + 'static {
    /// Answers one `Generate` call.
    fn generate(
        &self,
        request: tonic::Request<GenerateRequest>,
    ) -> impl Future<Output = Result<tonic::Response<TokenStream>, Status>> + Send;
}

/// Serves an [`Llm`] over gRPC: routes by path and lets tonic's server machinery decode the
/// request, encode the stream and write the status.
#[derive(Debug)]
pub(crate) struct LlmServer<T> {
    inner: Arc<T>,
}

impl<T> LlmServer<T> {
    pub(crate) fn new(inner: T) -> Self {
        LlmServer {
            inner: Arc::new(inner),
        }
    }
}

impl<T> Clone for LlmServer<T> {
    fn clone(&self) -> Self {
        LlmServer {
            inner: self.inner.clone(),
        }
    }
}

impl<T: Llm> tower::Service<http::Request<tonic::body::Body>> for LlmServer<T> {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() != GENERATE_PATH {
            return Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) });
        }
        let method = Generate(self.inner.clone());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<Token, GenerateRequest>::new());
            Ok(grpc.server_streaming(method, req).await)
        })
    }
}

/// One `Generate` call, as the tower service tonic's server machinery drives.
struct Generate<T>(Arc<T>);

impl<T: Llm> tower::Service<tonic::Request<GenerateRequest>> for Generate<T> {
    type Response = tonic::Response<TokenStream>;
    type Error = Status;
    type Future = BoxFuture<Result<Self::Response, Status>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<GenerateRequest>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { inner.generate(request).await })
    }
}

/// A client of the service: the struct `tonic-build` would generate.
#[derive(Clone, Debug)]
pub(crate) struct LlmClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl LlmClient {
    pub(crate) fn new(channel: Channel) -> Self {
        LlmClient {
            grpc: tonic::client::Grpc::new(channel),
        }
    }

    /// Calls `Generate`: the tokens, or the status the call failed with before its first one.
    pub(crate) async fn generate(
        &mut self,
        request: impl IntoRequest<GenerateRequest>,
    ) -> Result<tonic::Response<Streaming<Token>>, Status> {
        // A channel that cannot connect says so here; keep its error chain, so that a
        // classifier sees the refused connection.
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::from_error(e.into()))?;
        let path = http::uri::PathAndQuery::from_static(GENERATE_PATH);
        let codec = ProstCodec::<GenerateRequest, Token>::new();
        self.grpc
            .server_streaming(request.into_request(), path, codec)
            .await
    }
}

/// The protected LLM client: every call through the whole stack.
pub(crate) type Client = BoxCloneSyncService<
    http::Request<Bytes>,
    http::Response<UnsyncBoxBody<Bytes, LlmError>>,
    LlmError,
>;

/// How many calls may be in flight upstream at once (and idle connections kept).
const PERMITS: usize = 16;

/// The stack's settings that a deployment (or a test) changes.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The model when a request names none (`MODEL`).
    pub(crate) model: String,
    /// The most time one call may spend, retries and their waits included. A rate limit
    /// whose retry hint reaches past it ends the call at once, with the hint.
    pub(crate) time_budget: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            model: "gpt-4o-mini".to_owned(),
            time_budget: Duration::from_secs(60),
        }
    }
}

/// The recommended stack, outer to inner, around the HTTP transport.
pub(crate) fn client(config: &OpenAiConfig, settings: &Settings) -> Result<Client, BoxError> {
    let transport = HttpTransport::builder()
        .pool_max_idle_per_host(PERMITS)
        .upstream(config.upstream()?)
        .build()?;
    let retry = BackoffRetryLayer::builder()
        .overload_min_delay(Duration::from_secs(1))
        .time_budget(settings.time_budget)
        .build()?;
    let gate = ConcurrencyGateLayer::builder()
        .limit(PERMITS)
        .max_queue(256)
        .max_wait(Duration::from_secs(10))
        .build()?;
    let timeouts = StreamTimeoutLayer::builder()
        .first_token(Duration::from_secs(30))
        .idle(Duration::from_secs(30))
        .build()?;
    let stack = ServiceBuilder::new()
        .map_response(boxed)
        .layer(ObserveLayer::builder().recorder(TracingRecorder).build()?)
        .layer(retry)
        .layer(CircuitBreakerLayer::new())
        .layer(gate)
        .layer(timeouts)
        .layer(ClassifyLayer::default())
        .service(transport);
    Ok(BoxCloneSyncService::new(stack))
}

/// One body type for the stack's nested body wrappers.
fn boxed<B>(resp: http::Response<B>) -> http::Response<UnsyncBoxBody<Bytes, LlmError>>
where
    B: http_body::Body<Data = Bytes, Error = LlmError> + Send + 'static,
{
    resp.map(BodyExt::boxed_unsync)
}

/// The service: each `Generate` call is one streamed chat completion through the stack.
#[derive(Clone)]
pub(crate) struct LlmService {
    client: Client,
    settings: Settings,
}

impl LlmService {
    pub(crate) fn new(client: Client, settings: Settings) -> Self {
        LlmService { client, settings }
    }
}

impl Llm for LlmService {
    async fn generate(
        &self,
        request: tonic::Request<GenerateRequest>,
    ) -> Result<tonic::Response<TokenStream>, Status> {
        // The client's `grpc-timeout`: the stack stops retrying and falling back when the
        // client stops waiting, and the call ends with `DEADLINE_EXCEEDED`.
        let deadline = seawall_tonic::deadline(&request);
        let ask = request.into_inner();
        if ask.prompt.trim().is_empty() {
            return Err(Status::invalid_argument("The prompt is empty."));
        }
        let model = if ask.model.is_empty() {
            &self.settings.model
        } else {
            &ask.model
        };
        let body = serde_json::json!({
            "model": model,
            "stream": true,
            "max_tokens": if ask.max_tokens == 0 { 256 } else { ask.max_tokens },
            "messages": [{"role": "user", "content": ask.prompt}],
        });
        let mut req = http::Request::post("/chat/completions")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Bytes::from(body.to_string()))
            .map_err(|_| Status::invalid_argument("The request could not be built."))?;
        if let Some(deadline) = deadline {
            req.extensions_mut().insert(deadline);
        }
        // The stack's future resolves at the first real token (the commit point), so an
        // error here is a failure before any output: the call's status.
        let resp = self.client.clone().oneshot(req).await.map_err(failed)?;
        Ok(tonic::Response::new(Box::pin(tokens(resp.into_body()))))
    }
}

/// The status for a failed call, after logging the whole (redacted) error for the operator.
fn failed(err: LlmError) -> Status {
    tracing::warn!(
        class = err.class().as_str(),
        error = &err as &(dyn std::error::Error + 'static),
        "llm_stream: call failed"
    );
    seawall_tonic::into_status(err)
}

/// The text deltas of an OpenAI-style SSE body, one `Token` each; a body error after the
/// first token ends the stream with its status.
fn tokens(body: UnsyncBoxBody<Bytes, LlmError>) -> impl Stream<Item = Result<Token, Status>> {
    struct State {
        body: UnsyncBoxBody<Bytes, LlmError>,
        sse: SseDecoder,
        ready: VecDeque<String>,
        done: bool,
    }
    let state = State {
        body,
        sse: SseDecoder::default(),
        ready: VecDeque::new(),
        done: false,
    };
    futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(text) = s.ready.pop_front() {
                return Some((Ok(Token { text }), s));
            }
            if s.done {
                return None;
            }
            let ready = &mut s.ready;
            let mut on_item = |item: SseItem<'_>| {
                if let SseItem::Event(event) = item {
                    ready.extend(delta_text(event.data));
                }
                ControlFlow::<()>::Continue(())
            };
            match s.body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        let _ = s.sse.feed(data, &mut on_item);
                    }
                }
                Some(Err(err)) => {
                    s.done = true;
                    return Some((Err(failed(err)), s));
                }
                None => {
                    let _ = s.sse.finish(&mut on_item);
                    s.done = true;
                }
            }
        }
    })
}

/// The content delta of one chat-completion chunk, if it has text.
fn delta_text(data: &[u8]) -> Option<String> {
    let chunk: serde_json::Value = serde_json::from_slice(data).ok()?;
    let text = chunk["choices"][0]["delta"]["content"].as_str()?;
    (!text.is_empty()).then(|| text.to_owned())
}

/// Serves the service on `listener` until the process ends.
pub(crate) async fn serve(listener: TcpListener, service: LlmService) -> Result<(), BoxError> {
    Server::builder()
        .serve_with_incoming(LlmServer::new(service), TcpIncoming::from(listener))
        .await?;
    Ok(())
}

/// Binds `addr` if it is a loopback address: the service has no client authentication.
pub(crate) async fn bind(addr: &str) -> Result<TcpListener, BoxError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(addr).await?.collect();
    if let Some(open) = addrs.iter().find(|a| !a.ip().is_loopback()) {
        return Err(format!(
            "refusing to listen on {open}: this example has no client authentication and \
             would spend the upstream key for anyone who reaches it; use a loopback address"
        )
        .into());
    }
    Ok(TcpListener::bind(addrs.as_slice()).await?)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    let mut settings = Settings::default();
    if let Ok(model) = std::env::var("MODEL") {
        settings.model = model;
    }
    let config = match OpenAiConfig::from_env() {
        Ok(config) => {
            println!("upstream: {} (OPENAI_API_KEY)", config.base_url());
            config
        }
        Err(e) if e.field() == "OPENAI_API_KEY" => {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            let chaos = Profile::default()
                .seed(7)
                .error(ErrorRule::random(503, 0.2));
            tokio::spawn(seawall_mock::serve(listener, MockUpstream::new(chaos)));
            println!("upstream: the chaos upstream at http://{addr}/v1 (no OPENAI_API_KEY)");
            OpenAiConfig::new(ApiKey::new("sk-chaos-mock")?)
                .with_base_url(format!("http://{addr}/v1"))
        }
        Err(e) => return Err(e.into()),
    };
    let service = LlmService::new(client(&config, &settings)?, settings);
    let addr = std::env::var("LLM_STREAM_ADDR").unwrap_or_else(|_| "127.0.0.1:50051".to_owned());
    let listener = bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("seawall.example.v1.Llm on {local}");
    let server = tokio::spawn(serve(listener, service));

    let Some(prompt) = std::env::args().nth(1) else {
        println!("Ctrl-C stops it.");
        tokio::select! {
            result = server => result??,
            _ = tokio::signal::ctrl_c() => {}
        }
        return Ok(());
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{local}"))?
        .connect()
        .await?;
    let ask = GenerateRequest {
        prompt,
        ..GenerateRequest::default()
    };
    match LlmClient::new(channel).generate(ask).await {
        Ok(resp) => {
            let mut stream = resp.into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(token)) => print!("{}", token.text),
                    Ok(None) => break,
                    Err(status) => {
                        println!(
                            "\n[the stream ended with {:?}: {}]",
                            status.code(),
                            status.message()
                        );
                        break;
                    }
                }
            }
            println!();
        }
        Err(status) => println!("[no answer: {:?}: {}]", status.code(), status.message()),
    }
    Ok(())
}
