//! An OpenAI- and Anthropic-compatible gateway: `POST /v1/chat/completions` and
//! `POST /v1/messages`, each protected by the full recommended seawall stack, with streaming
//! passed through to the client as server-sent events. Point the official SDKs at it:
//! `OpenAI(base_url="http://127.0.0.1:8080/v1")`, `Anthropic(base_url="http://127.0.0.1:8080")`
//! (tests/sdk/ runs both against it). `cargo run --release --example gateway_load` measures
//! the latency it adds under load.
//!
//! ```text
//! cargo run --example gateway                            # no keys: an in-process chaos upstream
//! OPENAI_API_KEY=sk-... cargo run --example gateway      # OpenAI (OPENAI_BASE_URL too)
//! ANTHROPIC_API_KEY=sk-ant-... cargo run --example gateway   # Anthropic (ANTHROPIC_BASE_URL too)
//! ```
//!
//! Routes:
//!
//! - `POST /v1/chat/completions`: OpenAI's Chat Completions API, to the OpenAI upstream
//!   (`OPENAI_API_KEY`, `OPENAI_BASE_URL`).
//! - `POST /v1/messages`: Anthropic's Messages API, to the Anthropic upstream
//!   (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`).
//! - `GET /v1/models` and `GET /v1/models/{id}`: the models the gateway serves (its price
//!   table's, plus the fallback model), in OpenAI's list format, or in Anthropic's when the
//!   request carries `anthropic-version` (the Anthropic SDK always sends it). Each format
//!   lists its own upstream's models.
//!
//! The gateway does not translate between the two formats: `/v1/messages` needs an Anthropic
//! upstream and `/v1/chat/completions` an OpenAI one. With only `OPENAI_API_KEY` set,
//! `/v1/messages` answers 404 with an error that says so (and the other way round). With
//! neither key, the chaos upstream below speaks both formats and serves both routes.
//!
//! It prints its address and ready-to-paste `curl` commands. `GATEWAY_ADDR` sets the address
//! (default `127.0.0.1:8080`), `FALLBACK_MODEL` the model tried when the requested OpenAI
//! model has failed for good (default `gpt-4o-mini`), `ANTHROPIC_FALLBACK_MODEL` the same for
//! Claude (default `claude-haiku-4-5`), `RUST_LOG` the log filter (default `info,seawall::observe=warn`), `GATEWAY_PERMITS` a fixed number of calls in
//! flight per upstream (default: sized from the upstream's rate-limit headers times its
//! latency, see `AutoSize`), `GATEWAY_CACHE_TTL` how many seconds complete answers are kept
//! and served again (default: no cache; see below).
//!
//! With `GATEWAY_CACHE_TTL` a `CacheLayer` sits right inside the call record, outside the
//! fallback and the retries, and answers a request that asks again exactly what an earlier
//! one asked, streamed or not, without a call upstream; the response says
//! `x-seawall-cache: hit` (`miss`, `bypass`); a client's `Cache-Control: no-cache` asks
//! upstream and stores the fresh answer, `no-store` leaves the cache alone. Only requests that
//! say `"temperature": 0` are
//! cached: an answer sampled at a temperature (the APIs' default when a request names none)
//! is one draw, and a client that asked for a draw gets its own. Each client key of
//! `GATEWAY_KEYS` has its own answers; without client keys every caller shares them.
//!
//! The gateway spends its upstream keys for whoever reaches it, so it is closed by default:
//!
//! - `GATEWAY_KEYS` (comma-separated) lists the keys clients must send, as
//!   `Authorization: Bearer <key>` (the OpenAI SDK) or `x-api-key: <key>` (the Anthropic SDK);
//!   they are compared in constant time. Without it the gateway refuses to listen anywhere but
//!   on a loopback address, and its banner says so.
//! - Clients see the answer, its content type and who served it; the upstream's rate-limit
//!   headers, organisation and project ids and request ids stay behind.
//! - A failure reaches the client as an HTTP status and a class-level message, in the error
//!   format of the API it called (OpenAI's `{"error":{...}}`, Anthropic's
//!   `{"type":"error","error":{...}}`), with the same status for the same failure class. In
//!   OpenAI's format it carries OpenAI's own names where clients branch on them: a spent quota
//!   is type and code `insufficient_quota` (which async-openai's retry layer, for one, does not
//!   retry), and the codes `rate_limit_exceeded` and `context_length_exceeded` mark a rate
//!   limit and a prompt too long. The detail (the provider's message, a budget's limit and
//!   spend) goes to the log, redacted.
//! - The gateway is the one retry loop. Every error it answers carries `x-should-retry: false`,
//!   which the official OpenAI and Anthropic SDKs obey: without it, their default two retries
//!   of a 429 or 5xx would send each failed call through the gateway's retries and fallbacks
//!   three times. `retry-after` still says when a new call may succeed.
//! - Request bodies are capped at [`MAX_REQUEST_BODY`] (413 beyond).
//! - A model missing from the price table is refused with a 400, since its spend cannot be
//!   counted; `GATEWAY_ALLOW_UNPRICED=1` prices such models at a default rate instead. One
//!   daily budget covers both APIs.
//!
//! Without `OPENAI_API_KEY` and `ANTHROPIC_API_KEY` the gateway starts `seawall_mock::serve` on
//! a free loopback port with a faulty profile: 503s and 500s now and then, an HTML 502 from a
//! "proxy", a 529 outage of `gpt-4o` and `claude-sonnet-4-5` for 20 s of every minute,
//! keep-alive comments before the first token, overload events before the first token, and the
//! odd stream cut mid-way. What it shows, in the log and in `curl`'s output:
//!
//! - retried failures never reach the client (`seawall::retry` log lines);
//! - during the outage the answer comes from the fallback model, and the response says so in
//!   its `x-seawall-served-by` header;
//! - keep-alives pass through, but a stream is committed only at its first real token;
//! - a stream cut after its first token is continued in the same stream: the
//!   `ContinueLayer` asks for the rest (the prompt and the text so far) through the whole
//!   stack and splices it in, so the client reads one answer with one finish (`seawall::call`
//!   records count the `continuations`); a stream it cannot continue (after 3 follow-ups, or
//!   one with a tool call) ends with an SSE error event (`stream_interrupted` for OpenAI
//!   clients, an `event: error` for Anthropic ones), never as a silently truncated answer;
//! - a failure that cannot be helped becomes an HTTP status and a class-level message
//!   (`insufficient_quota` as 429, a context-length error as 400, an outage as 503, ...);
//! - one structured record per call (target `seawall::call`): attempts, queue wait, time to
//!   first token, cost, who served.
//!
//! The gateway uses its own upstream keys; a client's `Authorization` or `x-api-key` header is
//! not forwarded, nor its `anthropic-version` or `anthropic-beta` (the upstream gets the
//! configured version).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use bytes::Bytes;
use seawall::LlmError;
use seawall::breaker::CircuitBreakerLayer;
use seawall::budget::{Budget, CostBudgetLayer, MemoryStore, MissingMaxOutput, Price, Usd};
use seawall::cache::{CacheControl, CacheLayer};
use seawall::classify::ClassifyLayer;
use seawall::continuation::ContinueLayer;
use seawall::core::{BoxError, ConfigError, Deadline};
use seawall::fallback::{FallbackLayer, Target, box_response};
use seawall::gate::{AutoSize, ConcurrencyGateLayer};
use seawall::http::{AnthropicConfig, ApiKey, HttpTransport, OpenAiConfig, Upstream};
use seawall::mock::{
    Count, Delay, ErrorRule, KeepAliveStyle, MalformedKind, MockUpstream, Profile,
};
use seawall::observe::{ObserveLayer, TracingRecorder};
use seawall::retry::BackoffRetryLayer;
use seawall::stream::StreamTimeoutLayer;
use subtle::{ConditionallySelectable, ConstantTimeEq};
use tokio::net::TcpListener;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceBuilder, ServiceExt};

// As an example's crate root, this file would look for `mod errors;` in examples/, where Cargo
// takes every file for an example of its own; so the modules live in examples/gateway/ and
// are named by path (which also holds when the tests include this file as a module).
#[path = "gateway/errors.rs"]
mod errors;
#[path = "gateway/log.rs"]
mod log;
#[path = "gateway/models.rs"]
mod models;

use errors::{Dialect, ProxyBody, PublicError};
use models::Model;

/// One upstream's protected client: every request through the whole stack.
pub(crate) type Client =
    BoxCloneSyncService<http::Request<Bytes>, http::Response<ProxyBody>, LlmError>;

/// How many calls may be in flight to one upstream at once until the gate has sized itself,
/// and the fewest it sizes itself to: against an instant upstream, Little's law asks for a
/// handful, and a few milliseconds of scheduling delay would then leave callers queueing for
/// permits the upstream has room for.
const START_PERMITS: usize = 16;
/// The most calls the gate lets in flight to one upstream (and idle connections kept).
const MAX_PERMITS: usize = 256;

/// How the gate in front of each upstream sizes its permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permits {
    /// From the upstream's rate-limit headers times the observed latency
    /// ([`AutoSize`]: 70% of the limit), starting at [`START_PERMITS`], in
    /// `[START_PERMITS, MAX_PERMITS]`.
    Auto,
    /// A fixed number.
    Fixed(usize),
}

/// The largest request body accepted: 1 MiB, far more than a long text conversation needs,
/// small enough that a client cannot make the gateway buffer much per connection.
pub(crate) const MAX_REQUEST_BODY: usize = 1024 * 1024;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let _log = init_logging();
    let settings = Settings::from_env()?;
    let openai = unless_missing(OpenAiConfig::from_env(), "OPENAI_API_KEY")?;
    let anthropic = unless_missing(AnthropicConfig::from_env(), "ANTHROPIC_API_KEY")?;
    let (openai, anthropic, upstreams) = if openai.is_none() && anthropic.is_none() {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(seawall::mock::serve(listener, MockUpstream::new(chaos())));
        let (openai, anthropic) = mock_upstreams(addr, "sk-chaos-mock")?;
        let note = format!(
            "  both routes: the chaos upstream at http://{addr} (no OPENAI_API_KEY nor \
             ANTHROPIC_API_KEY; stats: curl -s http://{addr}/mock/stats)"
        );
        (Some(openai), Some(anthropic), note)
    } else {
        let openai_note = openai.as_ref().map_or_else(
            || "not served (OPENAI_API_KEY unset)".to_owned(),
            |c| format!("{} (OPENAI_API_KEY)", c.base_url()),
        );
        let anthropic_note = anthropic.as_ref().map_or_else(
            || "not served (ANTHROPIC_API_KEY unset)".to_owned(),
            |c| format!("{} (ANTHROPIC_API_KEY)", c.base_url()),
        );
        let note =
            format!("  /v1/chat/completions: {openai_note}\n  /v1/messages: {anthropic_note}");
        let openai = openai.map(|c| c.upstream()).transpose()?;
        let anthropic = anthropic.map(|c| c.upstream()).transpose()?;
        (openai, anthropic, note)
    };
    let providers = match fixed_permits()? {
        None => Providers::new(openai, anthropic, &settings)?,
        Some(n) => Providers::with_permits(openai, anthropic, &settings, Permits::Fixed(n))?,
    };
    let listener = bind(&settings.addr, &settings.keys).await?;
    print!("{}", banner(listener.local_addr()?, &upstreams, &settings));
    axum::serve(listener.tap_io(no_delay), app(providers, settings.keys))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// `GATEWAY_PERMITS`: a fixed number of permits per upstream instead of auto-sizing.
fn fixed_permits() -> Result<Option<usize>, ConfigError> {
    match std::env::var("GATEWAY_PERMITS") {
        Err(_) => Ok(None),
        Ok(v) => v.trim().parse().map(Some).map_err(|_| {
            ConfigError::new("GATEWAY_PERMITS", format!("a number of permits, got {v:?}"))
        }),
    }
}

/// Sends each write of a client connection at once: without `TCP_NODELAY`, Nagle's algorithm
/// holds a stream's small SSE events until the client's delayed ACK, some 40 ms each.
pub(crate) fn no_delay(tcp: &mut tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!("gateway: TCP_NODELAY not set: {e}");
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`, without the observe layer's
/// `gen_ai.call` spans), through a writer thread ([`log::stderr`]). Keep the guard it gives
/// for the life of the process: dropped, it writes out what is queued.
///
/// Those spans are for a tracing exporter (OpenTelemetry's GenAI conventions); this log never
/// prints them, yet a text subscriber that enables them formats each of their 13 fields as
/// they are recorded, a fifth of the gateway's CPU time per call under load. The call record
/// (target `seawall::call`) carries the same figures.
///
/// Every call's record is kept at the default filter (it is what an operator reads to see
/// attempts, cost and who served), but no call waits for it to be written: a worker formats
/// the line and queues it, and the writer thread writes many lines per system call.
pub(crate) fn init_logging() -> tracing_appender::non_blocking::WorkerGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,seawall::observe=warn"));
    // Colours only for a terminal: in a file or a log collector the escape codes are noise,
    // and writing them was about a quarter of the cost of each call's record.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (writer, guard) = log::stderr();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer)
        .init();
    guard
}

/// The OpenAI and the Anthropic upstream on one `seawall-mock` server at `addr` (it speaks
/// both), called with `key`.
pub(crate) fn mock_upstreams(
    addr: SocketAddr,
    key: &str,
) -> Result<(Upstream, Upstream), BoxError> {
    let key = ApiKey::new(key)?;
    let openai = OpenAiConfig::new(key.clone()).with_base_url(format!("http://{addr}/v1"));
    let anthropic = AnthropicConfig::new(key).with_base_url(format!("http://{addr}"));
    Ok((openai.upstream()?, anthropic.upstream()?))
}

/// A configuration read from the environment, or `None` when its key variable is not set.
fn unless_missing<T>(read: Result<T, ConfigError>, key: &str) -> Result<Option<T>, ConfigError> {
    match read {
        Ok(config) => Ok(Some(config)),
        Err(e) if e.field() == key => Ok(None),
        Err(e) => Err(e),
    }
}

/// What the environment configures.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Where to listen (`GATEWAY_ADDR`).
    pub(crate) addr: String,
    /// The keys clients must present (`GATEWAY_KEYS`).
    pub(crate) keys: ClientKeys,
    /// The OpenAI model tried when the requested one failed for good (`FALLBACK_MODEL`).
    pub(crate) fallback_model: String,
    /// The Claude model tried when the requested one failed for good
    /// (`ANTHROPIC_FALLBACK_MODEL`).
    pub(crate) anthropic_fallback_model: String,
    /// Whether models without a price are served at a default rate (`GATEWAY_ALLOW_UNPRICED`).
    pub(crate) allow_unpriced: bool,
    /// How long complete answers are kept and served again (`GATEWAY_CACHE_TTL`, in seconds;
    /// no cache when unset or 0).
    pub(crate) cache_ttl: Option<Duration>,
}

impl Settings {
    fn from_env() -> Result<Self, BoxError> {
        let var = |name: &str| std::env::var(name).ok();
        let cache_ttl = cache_ttl(var("GATEWAY_CACHE_TTL").as_deref())?;
        Ok(Settings {
            addr: var("GATEWAY_ADDR").unwrap_or_else(|| "127.0.0.1:8080".to_owned()),
            keys: ClientKeys::parse(&var("GATEWAY_KEYS").unwrap_or_default()),
            fallback_model: var("FALLBACK_MODEL").unwrap_or_else(|| "gpt-4o-mini".to_owned()),
            anthropic_fallback_model: var("ANTHROPIC_FALLBACK_MODEL")
                .unwrap_or_else(|| "claude-haiku-4-5".to_owned()),
            allow_unpriced: var("GATEWAY_ALLOW_UNPRICED")
                .is_some_and(|v| matches!(v.trim(), "1" | "true" | "yes")),
            cache_ttl,
        })
    }
}

/// `GATEWAY_CACHE_TTL`: whole seconds; unset or 0 is no cache.
fn cache_ttl(value: Option<&str>) -> Result<Option<Duration>, String> {
    match value.map(|v| v.trim().parse::<u64>()) {
        None | Some(Ok(0)) => Ok(None),
        Some(Ok(secs)) => Ok(Some(Duration::from_secs(secs))),
        Some(Err(_)) => {
            Err("GATEWAY_CACHE_TTL must be a whole number of seconds (0 or unset: no cache)".into())
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

    /// Which of the keys `presented` is, if any. Every key is compared, each in constant time
    /// (`subtle`), so the timing tells neither which key matched nor how much of one did; only
    /// a key's length can show, which a random key does not give away.
    fn find(&self, presented: &[u8]) -> Option<ClientTenant> {
        let (hit, at) = self.0.iter().enumerate().fold(
            (subtle::Choice::from(0), 0u64),
            |(hit, at), (i, key)| {
                let same = key.ct_eq(presented);
                (hit | same, u64::conditional_select(&at, &(i as u64), same))
            },
        );
        bool::from(hit).then_some(ClientTenant(at))
    }
}

/// Which of [`ClientKeys`] a request presented (its place in `GATEWAY_KEYS`), kept in the
/// request's extensions: the cache keeps each client's answers apart by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientTenant(u64);

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
async fn require_key(State(keys): State<ClientKeys>, mut req: Request, next: Next) -> Response {
    if keys.is_empty() {
        return next.run(req).await;
    }
    if let Some(tenant) = presented_key(req.headers()).and_then(|k| keys.find(k)) {
        req.extensions_mut().insert(tenant);
        return next.run(req).await;
    }
    let dialect = Dialect::of(req.uri().path(), req.headers());
    let mut resp = PublicError::gateway(
        StatusCode::UNAUTHORIZED,
        "authentication_error",
        "Missing or unknown API key: send one of the gateway's keys as \
         `Authorization: Bearer <key>` or `x-api-key: <key>`.",
        Some("invalid_api_key"),
    )
    .response(dialect, None);
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

/// One upstream's protected client and the models it serves.
#[derive(Clone)]
pub(crate) struct Provider {
    client: Clients,
    models: Arc<[Model]>,
}

/// One stack shared by every request, without a clone of it per request.
///
/// A tower service is called through `&mut self`, so the usual way to share one is to clone
/// it for each request (and axum's `State` extractor clones the state once more). A clone of
/// this stack clones every layer's state (a boxed service per layer, the breaker's and the
/// gate's handles, the HTTP client's): a tenth of the gateway's instructions per call under
/// callgrind, before dropping it again. Since each layer's future owns
/// all it needs, a stack is free again as soon as `call` has returned its future: so a
/// request takes an idle stack from this pool (or clones one when none is idle), makes its
/// call, and puts the stack back before awaiting the answer. The pool holds about as many
/// stacks as requests are ever between those two points at once: one per worker thread.
///
/// Cloning the pool itself (axum's `State` extractor clones the state for every request) is
/// one reference count.
#[derive(Clone)]
pub(crate) struct Clients(Arc<Pool>);

struct Pool {
    /// The stack cloned when none is idle.
    template: Client,
    idle: std::sync::Mutex<Vec<Client>>,
}

impl Clients {
    fn new(client: Client) -> Self {
        Clients(Arc::new(Pool {
            template: client,
            idle: std::sync::Mutex::default(),
        }))
    }

    /// Sends `req` through an idle stack.
    async fn call(&self, req: http::Request<Bytes>) -> Result<http::Response<ProxyBody>, LlmError> {
        // A poisoned lock only means another request panicked while holding it; the stacks
        // in it are still whole.
        let pool = &*self.0;
        let idle = pool.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut client = idle.unwrap_or_else(|| pool.template.clone());
        // The contract of `call`: only once the stack said it was ready. A stack dropped while
        // waiting (the caller went away) is simply not returned to the pool.
        let answer = client.ready().await?.call(req);
        pool.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(client);
        answer.await
    }
}

/// The upstreams behind the two APIs; `None` where none is configured.
#[derive(Clone)]
pub(crate) struct Providers {
    openai: Option<Provider>,
    anthropic: Option<Provider>,
}

impl Providers {
    /// A stack for each upstream given, its gate auto-sized. Both charge one daily budget.
    pub(crate) fn new(
        openai: Option<Upstream>,
        anthropic: Option<Upstream>,
        settings: &Settings,
    ) -> Result<Self, BoxError> {
        Self::with_permits(openai, anthropic, settings, Permits::Auto)
    }

    /// As [`new`](Self::new), with the gates' permits sized as `permits` says.
    pub(crate) fn with_permits(
        openai: Option<Upstream>,
        anthropic: Option<Upstream>,
        settings: &Settings,
        permits: Permits,
    ) -> Result<Self, BoxError> {
        let store = Arc::new(MemoryStore::default());
        // One store of answers for both APIs (their keys differ by path).
        let answers = seawall::cache::MemoryStore::new();
        let stack = |up, dialect| provider(up, dialect, &store, &answers, settings, permits);
        Ok(Providers {
            openai: openai.map(|up| stack(up, Dialect::OpenAi)).transpose()?,
            anthropic: anthropic
                .map(|up| stack(up, Dialect::Anthropic))
                .transpose()?,
        })
    }

    fn get(&self, dialect: Dialect) -> Option<&Provider> {
        match dialect {
            Dialect::OpenAi => self.openai.as_ref(),
            Dialect::Anthropic => self.anthropic.as_ref(),
        }
    }

    /// The models served in `dialect`'s API (none without its upstream).
    fn models(&self, dialect: Dialect) -> &[Model] {
        self.get(dialect).map_or(&[], |p| &p.models)
    }
}

/// The gateway's HTTP application around its upstreams.
pub(crate) fn app(providers: Providers, keys: ClientKeys) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/messages", post(messages))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(retrieve_model))
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BODY))
        // Checked before the body is read.
        .route_layer(middleware::from_fn_with_state(keys, require_key))
        .with_state(providers)
}

async fn chat_completions(State(providers): State<Providers>, req: Request) -> Response {
    forward(&providers, Dialect::OpenAi, req).await
}

async fn messages(State(providers): State<Providers>, req: Request) -> Response {
    forward(&providers, Dialect::Anthropic, req).await
}

/// Sends a request through the stack of `dialect`'s upstream. Of the caller's headers only the
/// timeout goes on (as a [`Deadline`]: `grpc-timeout`, `x-seawall-timeout`, or the SDKs'
/// `x-stainless-timeout`), so no layer works for a caller that has stopped waiting, and its
/// cache directive (as a [`CacheControl`], for the cache).
///
/// It takes the whole request rather than `HeaderMap` and `Bytes` extractors: the `HeaderMap`
/// extractor clones every header, and the timeout is all that is read of them.
async fn forward(providers: &Providers, dialect: Dialect, req: Request) -> Response {
    let Some(provider) = providers.get(dialect) else {
        return PublicError::gateway(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            match dialect {
                Dialect::OpenAi => {
                    "This gateway has no OpenAI upstream, so it does not serve \
                     /v1/chat/completions. It does not translate between the OpenAI and \
                     Anthropic formats."
                }
                Dialect::Anthropic => {
                    "This gateway has no Anthropic upstream, so it does not serve /v1/messages. \
                     It does not translate between the OpenAI and Anthropic formats."
                }
            },
            Some("route_not_served"),
        )
        .response(dialect, None);
    };
    let deadline = Deadline::from_headers(req.headers());
    let tenant = req.extensions().get::<ClientTenant>().copied();
    // A client's `Cache-Control: no-cache` (ask upstream, store the fresh answer) or
    // `no-store` (leave the cache alone), for the cache alone: the header is not sent on.
    let cache_control = CacheControl::of(&req);
    // Read as the `Bytes` extractor does, so the body limit still answers 413.
    let body = match Bytes::from_request(req, &()).await {
        Ok(body) => body,
        Err(rejection) => return unreadable_body(&rejection).response(dialect, None),
    };
    // Relative to the upstream's base URL: OpenAI's includes `/v1`, Anthropic's does not.
    // Static parts, so building the request parses and copies nothing.
    let path = match dialect {
        Dialect::OpenAi => "/chat/completions",
        Dialect::Anthropic => "/v1/messages",
    };
    let mut req = http::Request::new(body);
    *req.method_mut() = http::Method::POST;
    *req.uri_mut() = http::Uri::from_static(path);
    req.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(deadline) = deadline {
        req.extensions_mut().insert(deadline);
    }
    if let Some(tenant) = tenant {
        req.extensions_mut().insert(tenant);
    }
    if let Some(cache_control) = cache_control {
        req.extensions_mut().insert(cache_control);
    }
    match provider.client.call(req).await {
        Ok(resp) => resp.map(axum::body::Body::new),
        Err(e) => errors::error_response(&e, dialect),
    }
}

/// A body too large for [`MAX_REQUEST_BODY`] (413), or one that could not be read.
fn unreadable_body(rejection: &BytesRejection) -> PublicError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        PublicError::gateway(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "The request body is larger than this gateway accepts.",
            Some("request_too_large"),
        )
    } else {
        PublicError::gateway(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "The request body could not be read.",
            None,
        )
    }
}

async fn list_models(State(providers): State<Providers>, headers: HeaderMap) -> Response {
    let dialect = Dialect::of("/v1/models", &headers);
    Json(models::list_json(providers.models(dialect), dialect)).into_response()
}

async fn retrieve_model(
    State(providers): State<Providers>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let dialect = Dialect::of("/v1/models", &headers);
    match providers.models(dialect).iter().find(|m| m.id == id) {
        Some(model) => Json(models::model_json(model, dialect)).into_response(),
        None => PublicError::gateway(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "The requested model or resource does not exist.",
            Some("model_not_found"),
        )
        .response(dialect, None),
    }
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

/// The recommended stack, outer to inner, around the HTTP transport to `upstream`, for the
/// API of `dialect`: its price table, its fallback model, the budget `store` shared by both
/// APIs, and with `GATEWAY_CACHE_TTL` a cache of their `answers`.
fn provider(
    upstream: Upstream,
    dialect: Dialect,
    store: &Arc<MemoryStore>,
    answers: &seawall::cache::MemoryStore,
    settings: &Settings,
    permits: Permits,
) -> Result<Provider, BoxError> {
    let (priced, fallback) = match dialect {
        Dialect::OpenAi => (models::OPENAI_MODELS, &settings.fallback_model),
        Dialect::Anthropic => (models::ANTHROPIC_MODELS, &settings.anthropic_fallback_model),
    };
    let transport = HttpTransport::builder()
        .pool_max_idle_per_host(match permits {
            Permits::Auto => MAX_PERMITS,
            Permits::Fixed(n) => n,
        })
        .upstream(upstream)
        .build()?;
    let mut prices = models::price_table(priced)?;
    if settings.allow_unpriced {
        // Without a default, the budget refuses unlisted models (code `unpriced_model`).
        prices.set_default(Some(Price::per_million_f64(5.0, 15.0)?));
    }
    let budget = CostBudgetLayer::builder(prices)
        .budget(Budget::daily("daily", Usd::from_dollars(5)))
        .store(Arc::clone(store))
        .missing_max_output(MissingMaxOutput::Default(1024))
        .build()?;
    let retry = BackoffRetryLayer::builder()
        // The default is 5 s after an overload; shorter here so the demo stays snappy.
        .overload_min_delay(Duration::from_secs(1))
        .time_budget(Duration::from_secs(60))
        .build()?;
    // Auto-sized: as many permits as 70% of the upstream's request limit (from its rate-limit
    // headers) times how long a call takes, so a fleet of slow streams does not queue behind
    // a fixed guess, and a burst stays within the limit.
    let gate = ConcurrencyGateLayer::builder()
        .max_queue(256)
        .max_wait(Duration::from_secs(10));
    let gate = match permits {
        Permits::Auto => gate.limit(START_PERMITS).autosize(
            AutoSize::new()
                .with_min_limit(START_PERMITS)
                .with_max_limit(MAX_PERMITS),
        ),
        Permits::Fixed(n) => gate.limit(n),
    }
    .build()?;
    let timeouts = StreamTimeoutLayer::builder()
        .first_token(Duration::from_secs(30))
        .idle(Duration::from_secs(30))
        .build()?;

    let below = ServiceBuilder::new()
        // One body type above, with the cache or without.
        .map_response(box_response)
        // A stream cut after its first token, or an answer cut by max_tokens, continued by a
        // follow-up through every layer below; the client reads one stream.
        .layer(ContinueLayer::new())
        .layer(FallbackLayer::new([Target::model(fallback)]))
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
    let top = ServiceBuilder::new()
        .map_response(move |resp| errors::proxy_response(resp, dialect))
        .layer(ObserveLayer::builder().recorder(TracingRecorder).build()?);
    let client: Client = match settings.cache_ttl {
        None => BoxCloneSyncService::new(top.service(below)),
        Some(ttl) => {
            // Outside fallback and retry: a hit costs no attempt, no permit, no budget.
            let cache = CacheLayer::builder(answers.clone())
                .ttl(ttl)
                // Only what a client asked to be decoded greedily (`"temperature": 0`): a
                // client that samples gets its own sample, never another client's.
                .max_temperature(0.0)
                .partition(|req: &http::Request<Bytes>| {
                    let tenant = req.extensions().get::<ClientTenant>()?;
                    Some(format!("client-{}", tenant.0))
                })
                .build()?;
            BoxCloneSyncService::new(top.map_response(box_response).layer(cache).service(below))
        }
    };
    Ok(Provider {
        client: Clients::new(client),
        models: models::served(priced, fallback),
    })
}

/// A provider having a bad day, reproducibly.
fn chaos() -> Profile {
    let ms = Duration::from_millis;
    Profile::default()
        .seed(42)
        // Rate-limit headers as a real provider sends them (10,000 requests a minute), which
        // the gate sizes its permits from.
        .rpm(10_000)
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
                .model("gpt-4o")
                .model("claude-sonnet-4-5"),
        )
        .error(ErrorRule::random(503, 0.1))
        .error(ErrorRule::random(500, 0.05))
}

/// The banner printed at start: where, what upstreams (one line each, indented), and who may
/// call.
pub(crate) fn banner(addr: SocketAddr, upstreams: &str, settings: &Settings) -> String {
    use std::fmt::Write;
    let url = format!("http://{addr}/v1/chat/completions");
    let messages = format!("http://{addr}/v1/messages");
    let mut b = String::new();
    let _ = writeln!(b, "seawall gateway on http://{addr}");
    let _ = writeln!(b, "upstreams:\n{upstreams}");
    let _ = writeln!(
        b,
        "fallback models: {} (OpenAI), {} (Anthropic)",
        settings.fallback_model, settings.anthropic_fallback_model
    );
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
        "cache: {}",
        match settings.cache_ttl {
            Some(ttl) => format!(
                "answers to requests with \"temperature\": 0 kept {} s, per client key",
                ttl.as_secs()
            ),
            None => "off (GATEWAY_CACHE_TTL=<seconds> turns it on)".to_owned(),
        }
    );
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
    let _ = writeln!(
        b,
        "The same through Anthropic's Messages API (streamed with \"stream\":true):"
    );
    let _ = writeln!(
        b,
        "  curl -s {messages}{auth} -H 'anthropic-version: 2023-06-01' -H 'content-type: application/json' \\\n    -d '{{\"model\":\"claude-sonnet-4-5\",\"max_tokens\":256,\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'\n"
    );
    let _ = writeln!(
        b,
        "The models served (Anthropic's list format with -H 'anthropic-version: 2023-06-01'):"
    );
    let _ = writeln!(b, "  curl -s http://{addr}/v1/models{auth}\n");
    let _ = writeln!(b, "Ctrl-C stops it.");
    b
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll};

    use super::*;

    /// Answers 200 at once.
    #[derive(Clone)]
    struct Ok200;

    impl tower::Service<http::Request<Bytes>> for Ok200 {
        type Response = http::Response<ProxyBody>;
        type Error = LlmError;
        type Future = std::future::Ready<Result<Self::Response, LlmError>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<Bytes>) -> Self::Future {
            let resp = http::Response::new(http_body_util::Empty::<Bytes>::new());
            std::future::ready(Ok(errors::proxy_response(
                resp.map(|b| http_body_util::BodyExt::map_err(b, |e| match e {})),
                Dialect::OpenAi,
            )))
        }
    }

    #[test]
    fn the_cache_ttl_is_whole_seconds_and_zero_or_unset_turns_the_cache_off() {
        assert_eq!(cache_ttl(None), Ok(None));
        assert_eq!(cache_ttl(Some("0")), Ok(None));
        assert_eq!(cache_ttl(Some(" 600 ")), Ok(Some(Duration::from_secs(600))));
        for bad in ["", "ten", "-5", "1.5", "99999999999999999999999"] {
            let e = cache_ttl(Some(bad)).unwrap_err();
            assert!(e.contains("GATEWAY_CACHE_TTL"), "{bad:?}: {e}");
        }
    }

    #[tokio::test]
    async fn calls_one_after_another_reuse_one_pooled_stack_instead_of_cloning_each_time() {
        let (upstream, clones) = seawall_test_support::count_clones(Ok200);
        let clients = Clients::new(BoxCloneSyncService::new(upstream));
        for _ in 0..10 {
            let state = clients.clone();
            let resp = state.call(http::Request::new(Bytes::new())).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
        }
        assert_eq!(clones.count(), 1, "one clone, when the pool was empty");
    }
}
