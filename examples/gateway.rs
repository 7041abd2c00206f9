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
//! - a failure that cannot be helped becomes an HTTP status and the provider's message
//!   (`insufficient_quota` as 429, a context-length error as 400, an outage as 503, ...),
//!   never the gateway's credentials;
//! - one structured record per call (target `seawall::call`): attempts, queue wait, time to
//!   first token, cost, who served.
//!
//! The gateway uses its own upstream key; a client's `Authorization` header is not forwarded.

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
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
use seawall::http::{ApiKey, ConfigError, HttpTransport, OpenAiConfig};
use seawall::mock::{
    Count, Delay, ErrorRule, KeepAliveStyle, MalformedKind, MockUpstream, Profile,
};
use seawall::observe::{ObserveLayer, TracingRecorder};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::{StreamTimeoutLayer, StreamTimeouts};
use seawall::{FailureClass, LlmError};
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};

/// The protected client: every request through the whole stack.
type Client = BoxCloneSyncService<http::Request<Bytes>, http::Response<ProxyBody>, LlmError>;

/// How many calls may be in flight upstream at once (and idle connections kept).
const PERMITS: usize = 16;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    let (config, upstream_note) = match OpenAiConfig::from_env() {
        Ok(config) => {
            let note = format!("{} (OPENAI_API_KEY)", config.base_url());
            (config, note)
        }
        Err(ConfigError::MissingVar(_)) => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
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
    let fallback_model =
        std::env::var("FALLBACK_MODEL").unwrap_or_else(|_| "gpt-4o-mini".to_owned());
    let client = client(&config, &fallback_model)?;

    let app = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .with_state(client);
    let addr = std::env::var("GATEWAY_ADDR").unwrap_or_else(|_| "127.0.0.1:8080".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    print_banner(listener.local_addr()?, &upstream_note, &fallback_model);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// The recommended stack, outer to inner, around the HTTP transport.
fn client(config: &OpenAiConfig, fallback_model: &str) -> Result<Client, BoxError> {
    let transport = HttpTransport::builder()
        .pool_max_idle_per_host(PERMITS)
        .upstream(config.upstream()?)
        .build()?;
    let prices = PriceTable::new()
        .with("gpt-4o", Price::per_million_f64(2.5, 10.0)?)
        .with("gpt-4o-mini", Price::per_million_f64(0.15, 0.6)?)
        .with_default(Price::per_million_f64(5.0, 15.0)?);
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
        .build();
    let timeouts = StreamTimeouts::new()
        .with_first_token(Duration::from_secs(30))
        .with_idle(Duration::from_secs(30));

    let stack = ServiceBuilder::new()
        .map_response(proxy_response)
        .layer(ObserveLayer::new().recorder(TracingRecorder))
        .layer(FallbackLayer::new([Target::model(fallback_model)]))
        // One body type for every target, so another provider's stack can join the chain as
        // `Target::service("name", other_stack.map_response(box_response))`.
        .map_response(box_response)
        .layer(retry)
        .layer(budget)
        .layer(CircuitBreakerLayer::new())
        .layer(gate)
        .layer(StreamTimeoutLayer::new(timeouts))
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

/// Keeps the upstream's useful headers, says who served, and turns a body error into an SSE
/// error event for streams.
fn proxy_response<B>(resp: http::Response<B>) -> http::Response<ProxyBody>
where
    B: Body<Data = Bytes, Error = LlmError> + Send + 'static,
{
    let (parts, body) = resp.into_parts();
    let mut out = http::Response::builder().status(parts.status);
    for (name, value) in &parts.headers {
        let keep = name == header::CONTENT_TYPE
            || name == header::CACHE_CONTROL
            || name.as_str().starts_with("x-ratelimit-")
            || name.as_str().ends_with("request-id");
        if keep {
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
struct ProxyBody {
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
                let event = format!("data: {}\n\n", error_json(&e));
                Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }
}

/// The status a client gets for a failure.
fn status_of(class: FailureClass) -> StatusCode {
    use FailureClass::*;
    match class {
        RateLimited | QuotaExhausted => StatusCode::TOO_MANY_REQUESTS,
        BudgetExceeded => StatusCode::PAYMENT_REQUIRED,
        ContextLengthExceeded | ContentFiltered | InvalidRequest => StatusCode::BAD_REQUEST,
        NotFound => StatusCode::NOT_FOUND,
        Conflict => StatusCode::CONFLICT,
        Overloaded | CircuitOpen | GateRejected | RetryBudgetExhausted => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        Timeout | UpstreamTimeout | RequestTimeout | DeadlineExceeded => {
            StatusCode::GATEWAY_TIMEOUT
        }
        // The gateway's own key was refused, the upstream broke, or the stream did: the
        // client's request is not at fault.
        _ => StatusCode::BAD_GATEWAY,
    }
}

/// An OpenAI-style error body with the classified error's message (already free of
/// credentials: `LlmError` redacts them).
fn error_json(e: &LlmError) -> String {
    serde_json::json!({
        "error": {
            "message": e.message(),
            "type": e.class().as_str(),
            "code": e.code(),
            "param": null,
        }
    })
    .to_string()
}

fn error_response(e: &LlmError) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(hint) = e.retry_hint() {
        let secs = hint.as_secs() + u64::from(hint.subsec_nanos() > 0);
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    }
    (status_of(e.class()), headers, error_json(e)).into_response()
}

fn print_banner(addr: SocketAddr, upstream: &str, fallback_model: &str) {
    let url = format!("http://{addr}/v1/chat/completions");
    println!("seawall gateway on http://{addr}");
    println!("upstream: {upstream}");
    println!("fallback model: {fallback_model}\n");
    println!("A complete answer:");
    println!(
        "  curl -s {url} -H 'content-type: application/json' \\\n    -d '{{\"model\":\"gpt-4o\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'\n"
    );
    println!("A streamed answer (server-sent events, with who served it in the headers):");
    println!(
        "  curl -sN -D - {url} -H 'content-type: application/json' \\\n    -d '{{\"model\":\"gpt-4o\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'\n"
    );
    println!("Ctrl-C stops it.");
}
