//! An OpenAI-compatible gateway: `POST /v1/chat/completions`, protected by the full
//! recommended seawall stack, with streaming passed through to the client as server-sent events.
//!
//! ```text
//! cargo run --example gateway                          # no key: an in-process chaos upstream
//! OPENAI_API_KEY=sk-... cargo run --example gateway    # a real provider (OPENAI_BASE_URL too)
//! ```
//!
//! It prints its address and ready-to-paste `curl` commands. `GATEWAY_ADDR` sets the address
//! (default `127.0.0.1:8080`), `FALLBACK_MODEL` the model tried when the requested one has
//! failed for good (default `gpt-4o-mini`), `RUST_LOG` the log filter (default `info`).
//!
//! The gateway spends its upstream key for whoever reaches it, so it is closed by default:
//!
//! - `GATEWAY_KEYS` (comma-separated) lists the keys clients must send, as
//!   `Authorization: Bearer <key>` or `x-api-key: <key>`; they are compared in constant time.
//!   Without it the gateway refuses to listen anywhere but on a loopback address, and its
//!   banner says so.
//! - Clients see the answer, its content type and who served it; the upstream's rate-limit
//!   headers, organisation and project ids and request ids stay behind.
//! - A failure reaches the client as an HTTP status and a class-level message. The detail
//!   (the provider's message, a budget's limit and spend) goes to the log, redacted.
//! - Request bodies are capped at [`MAX_REQUEST_BODY`] (413 beyond).
//! - A model missing from the price table is refused with a 400, since its spend cannot be
//!   counted; `GATEWAY_ALLOW_UNPRICED=1` prices such models at a default rate instead.
//!
//! Without `OPENAI_API_KEY` the gateway starts `seawall_mock::serve` on a free loopback port with
//! a faulty profile: 503s and 500s now and then, an HTML 502 from a "proxy", a 529 outage of
//! `gpt-4o` for 20 s of every minute, keep-alive comments before the first token, overload
//! events before the first token, and the odd stream cut mid-way. What it shows, in the log
//! and in `curl`'s output:
//!
//! - retried failures never reach the client (`seawall::retry` log lines);
//! - during the `gpt-4o` outage the answer comes from `FALLBACK_MODEL`, and the response says
//!   so in its `x-seawall-served-by` header;
//! - keep-alives pass through, but a stream is committed only at its first real token;
//! - a stream cut after its first token ends with an SSE error event (`stream_interrupted`),
//!   never as a silently truncated answer;
//! - a failure that cannot be helped becomes an HTTP status and a class-level message
//!   (`insufficient_quota` as 429, a context-length error as 400, an outage as 503, ...);
//! - one structured record per call (target `seawall::call`): attempts, queue wait, time to
//!   first token, cost, who served.
//!
//! The gateway uses its own upstream key; a client's `Authorization` header is not forwarded.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use seawall::breaker::CircuitBreakerLayer;
use seawall::budget::{Budget, CostBudgetLayer, MissingMaxOutput, Price, PriceTable, Usd};
use seawall::classify::ClassifyLayer;
use seawall::core::{BoxError, ServedBy};
use seawall::fallback::{FallbackLayer, Target, box_response};
use seawall::gate::ConcurrencyGateLayer;
use seawall::http::{ApiKey, HttpTransport, OpenAiConfig};
use seawall::mock::{
    Count, Delay, ErrorRule, KeepAliveStyle, MalformedKind, MockUpstream, Profile,
};
use seawall::observe::{ObserveLayer, TracingRecorder};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::StreamTimeoutLayer;
use seawall::{FailureClass, LlmError};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};

/// The protected client: every request through the whole stack.
pub(crate) type Client =
    BoxCloneSyncService<http::Request<Bytes>, http::Response<ProxyBody>, LlmError>;

/// How many calls may be in flight upstream at once (and idle connections kept).
const PERMITS: usize = 16;

/// The largest request body accepted: 1 MiB, far more than a long text conversation needs,
/// small enough that a client cannot make the gateway buffer much per connection.
pub(crate) const MAX_REQUEST_BODY: usize = 1024 * 1024;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    let settings = Settings::from_env();
    let (config, upstream_note) = match OpenAiConfig::from_env() {
        Ok(config) => {
            let note = format!("{} (OPENAI_API_KEY)", config.base_url());
            (config, note)
        }
        Err(e) if e.field() == "OPENAI_API_KEY" => {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            tokio::spawn(seawall::mock::serve(listener, MockUpstream::new(chaos())));
            let config = OpenAiConfig::new(ApiKey::new("sk-chaos-mock")?)
                .with_base_url(format!("http://{addr}/v1"));
            let note = format!(
                "the chaos upstream at http://{addr}/v1 (no OPENAI_API_KEY; stats: curl -s http://{addr}/mock/stats)"
            );
            (config, note)
        }
        Err(e) => return Err(e.into()),
    };
    let client = client(&config, &settings)?;
    let listener = bind(&settings.addr, &settings.keys).await?;
    print!(
        "{}",
        banner(listener.local_addr()?, &upstream_note, &settings)
    );
    axum::serve(listener, app(client, settings.keys))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// What the environment configures.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Where to listen (`GATEWAY_ADDR`).
    pub(crate) addr: String,
    /// The keys clients must present (`GATEWAY_KEYS`).
    pub(crate) keys: ClientKeys,
    /// The model tried when the requested one failed for good (`FALLBACK_MODEL`).
    pub(crate) fallback_model: String,
    /// Whether models without a price are served at a default rate (`GATEWAY_ALLOW_UNPRICED`).
    pub(crate) allow_unpriced: bool,
}

impl Settings {
    fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok();
        Settings {
            addr: var("GATEWAY_ADDR").unwrap_or_else(|| "127.0.0.1:8080".to_owned()),
            keys: ClientKeys::parse(&var("GATEWAY_KEYS").unwrap_or_default()),
            fallback_model: var("FALLBACK_MODEL").unwrap_or_else(|| "gpt-4o-mini".to_owned()),
            allow_unpriced: var("GATEWAY_ALLOW_UNPRICED")
                .is_some_and(|v| matches!(v.trim(), "1" | "true" | "yes")),
        }
    }
}

/// The keys a client may present. `Debug` shows how many, never which.
#[derive(Clone, Default)]
pub(crate) struct ClientKeys(Arc<[Box<[u8]>]>);

impl std::fmt::Debug for ClientKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientKeys([{} keys])", self.0.len())
    }
}

impl ClientKeys {
    /// A comma-separated list; blanks around and between keys are ignored.
    pub(crate) fn parse(list: &str) -> Self {
        ClientKeys(
            list.split(',')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(|k| k.as_bytes().into())
                .collect(),
        )
    }

    /// No keys: anyone who can connect may call.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `presented` is one of the keys. Every key is compared, each in constant time
    /// (`subtle`), so the timing tells neither which key matched nor how much of one did; only
    /// a key's length can show, which a random key does not give away.
    fn accepts(&self, presented: &[u8]) -> bool {
        let hit = self.0.iter().fold(subtle::Choice::from(0), |hit, key| {
            hit | key.ct_eq(presented)
        });
        hit.into()
    }
}

/// The key a request presents: `Authorization: Bearer <key>`, else `x-api-key: <key>`.
fn presented_key(headers: &HeaderMap) -> Option<&[u8]> {
    let bearer = headers.get(header::AUTHORIZATION).and_then(|v| {
        let v = v.as_bytes();
        let (scheme, key) = v.split_at_checked(7)?;
        scheme.eq_ignore_ascii_case(b"bearer ").then_some(key)
    });
    bearer.or_else(|| headers.get("x-api-key").map(HeaderValue::as_bytes))
}

/// Lets a request through only with one of the client keys (any request when there are
/// none: then the gateway listens on loopback only).
async fn require_key(State(keys): State<ClientKeys>, req: Request, next: Next) -> Response {
    if keys.is_empty() || presented_key(req.headers()).is_some_and(|k| keys.accepts(k)) {
        return next.run(req).await;
    }
    let body = error_body(&PublicError {
        status: StatusCode::UNAUTHORIZED,
        kind: "authentication_error",
        message: "Missing or unknown API key: send one of the gateway's keys as \
                  `Authorization: Bearer <key>` or `x-api-key: <key>`.",
        code: Some("invalid_api_key"),
    });
    (
        StatusCode::UNAUTHORIZED,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::WWW_AUTHENTICATE, "Bearer"),
        ],
        body,
    )
        .into_response()
}

/// The gateway's HTTP application around a protected `client`.
pub(crate) fn app(client: Client, keys: ClientKeys) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BODY))
        // Checked before the body is read.
        .route_layer(middleware::from_fn_with_state(keys, require_key))
        .with_state(client)
}

/// Why an address may not be served: without client keys, anything but loopback.
pub(crate) fn check_exposure(addrs: &[SocketAddr], keys: &ClientKeys) -> Result<(), String> {
    match addrs.iter().find(|a| !a.ip().is_loopback()) {
        Some(open) if keys.is_empty() => Err(format!(
            "refusing to listen on {open} without GATEWAY_KEYS: anyone who can reach it would \
             spend the upstream key. Set GATEWAY_KEYS, or listen on loopback (127.0.0.1:8080)."
        )),
        _ => Ok(()),
    }
}

/// Binds `addr`, after [`check_exposure`] allowed it.
pub(crate) async fn bind(addr: &str, keys: &ClientKeys) -> Result<TcpListener, BoxError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(addr).await?.collect();
    check_exposure(&addrs, keys)?;
    Ok(TcpListener::bind(addrs.as_slice()).await?)
}

/// The recommended stack, outer to inner, around the HTTP transport.
pub(crate) fn client(config: &OpenAiConfig, settings: &Settings) -> Result<Client, BoxError> {
    let transport = HttpTransport::builder()
        .pool_max_idle_per_host(PERMITS)
        .upstream(config.upstream()?)
        .build()?;
    let mut prices = PriceTable::new()
        .with("gpt-4o", Price::per_million_f64(2.5, 10.0)?)
        .with("gpt-4o-mini", Price::per_million_f64(0.15, 0.6)?);
    if settings.allow_unpriced {
        // Without a default, the budget refuses unlisted models (code `unpriced_model`).
        prices.set_default(Some(Price::per_million_f64(5.0, 15.0)?));
    }
    let budget = CostBudgetLayer::builder(prices)
        .budget(Budget::daily("daily", Usd::from_dollars(5)))
        .missing_max_output(MissingMaxOutput::Default(1024))
        .build()?;
    let retry = BackoffRetryLayer::builder()
        // The default is 5 s after an overload; shorter here so the demo stays snappy.
        .overload_min_delay(Duration::from_secs(1))
        .time_budget(Duration::from_secs(60))
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
        .map_response(proxy_response)
        .layer(ObserveLayer::builder().recorder(TracingRecorder).build()?)
        .layer(FallbackLayer::new([Target::model(
            &settings.fallback_model,
        )]))
        // One body type for every target, so another provider's stack can join the chain as
        // `Target::service("name", other_stack.map_response(box_response))`.
        .map_response(box_response)
        .layer(retry)
        .layer(budget)
        .layer(CircuitBreakerLayer::new())
        .layer(gate)
        .layer(timeouts)
        .layer(ClassifyLayer::default())
        .service(transport);
    Ok(BoxCloneSyncService::new(stack))
}

/// A provider having a bad day, reproducibly.
fn chaos() -> Profile {
    let ms = Duration::from_millis;
    Profile::default()
        .seed(42)
        .head_latency(Delay::fixed(ms(20)))
        .first_token_latency(Delay::uniform(ms(150), ms(600)))
        .per_token_latency(Delay::uniform(ms(10), ms(30)))
        .output_tokens(Count::range(20, 60))
        .keepalives(0.3, ms(100), KeepAliveStyle::Comment)
        .mid_stream_errors(0.05, Count::fixed(0))
        .cut_streams(0.03, Count::range(5, 15), false)
        .malformed(0.02, &[MalformedKind::Html502])
        .error(
            ErrorRule::outage(529, Duration::from_secs(20), Duration::from_secs(40))
                .every(Duration::from_secs(60))
                .model("gpt-4o"),
        )
        .error(ErrorRule::random(503, 0.1))
        .error(ErrorRule::random(500, 0.05))
}

async fn chat_completions(State(client): State<Client>, body: Bytes) -> Response {
    let req = http::Request::post("/chat/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .body(body);
    let req = match req {
        Ok(req) => req,
        Err(e) => {
            return error_response(&LlmError::new(FailureClass::InvalidRequest, e.to_string()));
        }
    };
    match client.oneshot(req).await {
        Ok(resp) => resp.map(axum::body::Body::new),
        Err(e) => error_response(&e),
    }
}

/// Keeps only the content type and cache directive of the upstream's headers (its rate-limit
/// state, organisation, project and request ids are the gateway's business, not the
/// client's), says who served, and turns a body error into an SSE error event for streams.
fn proxy_response<B>(resp: http::Response<B>) -> http::Response<ProxyBody>
where
    B: Body<Data = Bytes, Error = LlmError> + Send + 'static,
{
    let (parts, body) = resp.into_parts();
    let mut out = http::Response::builder().status(parts.status);
    for (name, value) in &parts.headers {
        if name == header::CONTENT_TYPE || name == header::CACHE_CONTROL {
            out = out.header(name, value);
        }
    }
    if let Some(served) = parts.extensions.get::<ServedBy>() {
        if let Ok(v) = HeaderValue::from_str(&served.target) {
            out = out.header("x-seawall-served-by", v);
        }
    }
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let body = ProxyBody {
        inner: body.boxed_unsync(),
        sse,
        done: false,
    };
    out.body(body).unwrap_or_else(|_| {
        http::Response::new(ProxyBody {
            inner: http_body_util::Empty::new()
                .map_err(|e| match e {})
                .boxed_unsync(),
            sse: false,
            done: true,
        })
    })
}

/// The response body handed to the client. A failure of a stream after its first token cannot
/// become an HTTP status any more; it becomes a last SSE event, the way OpenAI reports errors
/// inside a stream.
pub(crate) struct ProxyBody {
    inner: UnsyncBoxBody<Bytes, LlmError>,
    sse: bool,
    done: bool,
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = LlmError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, LlmError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Err(e))) if self.sse => {
                self.done = true;
                let public = public_error(&e);
                log_failure(&e, &public);
                let event = format!("data: {}\n\n", error_body(&public));
                Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }
}

/// What a client is told about a failure: a status and a class-level message. Never the
/// upstream's text or codes (they can name the gateway's account, organisation or key),
/// nor a budget's limit and spend: those go to the log.
#[derive(Debug)]
pub(crate) struct PublicError {
    status: StatusCode,
    kind: &'static str,
    message: &'static str,
    code: Option<&'static str>,
}

fn public_error(e: &LlmError) -> PublicError {
    use FailureClass::*;
    if e.code() == Some("unpriced_model") {
        return PublicError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: "This gateway does not serve the requested model: it has no price for it.",
            code: Some("model_not_available"),
        };
    }
    let (status, message) = match e.class() {
        RateLimited | QuotaExhausted => (
            StatusCode::TOO_MANY_REQUESTS,
            "Too many requests. Please try again later.",
        ),
        BudgetExceeded => (
            StatusCode::PAYMENT_REQUIRED,
            "The spending limit of this gateway has been reached.",
        ),
        ContextLengthExceeded => (
            StatusCode::BAD_REQUEST,
            "The request is too long for the model.",
        ),
        ContentFiltered => (
            StatusCode::BAD_REQUEST,
            "The request was declined by the content policy.",
        ),
        InvalidRequest => (
            StatusCode::BAD_REQUEST,
            "The request was rejected as invalid.",
        ),
        NotFound => (
            StatusCode::NOT_FOUND,
            "The requested model or resource does not exist.",
        ),
        Conflict => (
            StatusCode::CONFLICT,
            "The request conflicted with another one. Please try again.",
        ),
        Overloaded | CircuitOpen | GateRejected | RetryBudgetExhausted => (
            StatusCode::SERVICE_UNAVAILABLE,
            "The service is temporarily unavailable. Please try again later.",
        ),
        Timeout | UpstreamTimeout | RequestTimeout | DeadlineExceeded => (
            StatusCode::GATEWAY_TIMEOUT,
            "The upstream service did not answer in time.",
        ),
        // The gateway's own key was refused, the upstream broke, or the stream did: the
        // client's request is not at fault.
        _ => (StatusCode::BAD_GATEWAY, "The upstream service failed."),
    };
    PublicError {
        status,
        kind: e.class().as_str(),
        message,
        code: None,
    }
}

/// An OpenAI-style error body.
fn error_body(e: &PublicError) -> String {
    serde_json::json!({
        "error": {
            "message": e.message,
            "type": e.kind,
            "code": e.code,
            "param": null,
        }
    })
    .to_string()
}

/// The whole (redacted) story of a failure, source chain included, for the operator.
fn log_failure(e: &LlmError, public: &PublicError) {
    tracing::warn!(
        status = public.status.as_u16(),
        error = e as &(dyn std::error::Error + 'static),
        "gateway: call failed"
    );
}

fn error_response(e: &LlmError) -> Response {
    let public = public_error(e);
    log_failure(e, &public);
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(hint) = e.retry_hint() {
        let secs = hint.as_secs() + u64::from(hint.subsec_nanos() > 0);
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    }
    (public.status, headers, error_body(&public)).into_response()
}

/// The banner printed at start: where, what upstream, and who may call.
pub(crate) fn banner(addr: SocketAddr, upstream: &str, settings: &Settings) -> String {
    use std::fmt::Write;
    let url = format!("http://{addr}/v1/chat/completions");
    let mut b = String::new();
    let _ = writeln!(b, "seawall gateway on http://{addr}");
    let _ = writeln!(b, "upstream: {upstream}");
    let _ = writeln!(b, "fallback model: {}", settings.fallback_model);
    let auth = if settings.keys.is_empty() {
        let _ = writeln!(
            b,
            "client keys: none (GATEWAY_KEYS unset), so it listens on loopback only and \
             anyone on this machine can use it"
        );
        ""
    } else {
        let _ = writeln!(
            b,
            "client keys: {} from GATEWAY_KEYS, sent as `Authorization: Bearer <key>` or \
             `x-api-key: <key>`",
            settings.keys.0.len()
        );
        " -H \"authorization: Bearer $GATEWAY_KEY\""
    };
    let _ = writeln!(
        b,
        "models without a price: {}\n",
        if settings.allow_unpriced {
            "served at the default price (GATEWAY_ALLOW_UNPRICED)"
        } else {
            "refused with 400 (GATEWAY_ALLOW_UNPRICED=1 serves them at a default price)"
        }
    );
    let _ = writeln!(b, "A complete answer:");
    let _ = writeln!(
        b,
        "  curl -s {url}{auth} -H 'content-type: application/json' \\\n    -d '{{\"model\":\"gpt-4o\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'\n"
    );
    let _ = writeln!(
        b,
        "A streamed answer (server-sent events, with who served it in the headers):"
    );
    let _ = writeln!(
        b,
        "  curl -sN -D - {url}{auth} -H 'content-type: application/json' \\\n    -d '{{\"model\":\"gpt-4o\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'\n"
    );
    let _ = writeln!(b, "Ctrl-C stops it.");
    b
}
