//! The HTTP front end: the same model behind axum.

use std::io;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt;
use http::StatusCode;
use tokio::net::TcpListener;

use crate::upstream::MockUpstream;

/// The largest request body read, in bytes.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// An axum router that answers every path with the upstream (OpenAI under
/// `.../chat/completions` and `.../embeddings`, Anthropic under `.../messages`, the provider's
/// 404 elsewhere), plus
/// `GET /mock/stats` with the [`Stats`](crate::Stats) as JSON.
///
/// ```no_run
/// # async fn run() -> std::io::Result<()> {
/// use seawall_mock::{MockUpstream, Profile};
/// let upstream = MockUpstream::new(Profile::builtin("storm").unwrap());
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// axum::serve(listener, seawall_mock::router(upstream))
///     .with_graceful_shutdown(async { let _ = tokio::signal::ctrl_c().await; })
///     .await
/// # }
/// ```
pub fn router(upstream: MockUpstream) -> Router {
    Router::new()
        .route("/mock/stats", get(stats))
        .fallback(handle)
        .with_state(upstream)
}

/// Serves the upstream on `listener` until the listener fails, with `TCP_NODELAY` on every
/// accepted connection: without it, Nagle's algorithm holds each small SSE event of a stream
/// until the reader's delayed ACK (some 40 ms per event on Linux).
///
/// ```no_run
/// # async fn run() -> std::io::Result<()> {
/// use seawall_mock::{MockUpstream, Profile};
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// println!("mock on http://{}", listener.local_addr()?);
/// seawall_mock::serve(listener, MockUpstream::new(Profile::default())).await
/// # }
/// ```
pub async fn serve(listener: TcpListener, upstream: MockUpstream) -> io::Result<()> {
    axum::serve(listener.tap_io(no_delay), router(upstream)).await
}

/// Turns Nagle's algorithm off on an accepted connection (see [`serve`]). A socket that
/// refuses is served all the same, only slower for streams.
fn no_delay(tcp: &mut tokio::net::TcpStream) {
    let _ = tcp.set_nodelay(true);
}

async fn handle(State(upstream): State<MockUpstream>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large or unreadable",
        )
            .into_response();
    };
    let req = http::Request::from_parts(parts, bytes);
    match upstream.respond(req).await {
        Ok(response) => response.map(Body::new),
        Err(never) => match never {},
    }
}

async fn stats(State(upstream): State<MockUpstream>) -> Response {
    let s = upstream.stats();
    let by_status: serde_json::Map<String, serde_json::Value> = s
        .by_status
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    let v = serde_json::json!({
        "elapsed_secs": s.elapsed.as_secs_f64(),
        "requests": s.requests,
        "ok": s.ok,
        "rate_limited": s.rate_limited,
        "quota_exhausted": s.quota_exhausted,
        "context_length": s.context_length,
        "server_errors": s.server_errors,
        "malformed": s.malformed,
        "rejected": s.rejected,
        "by_status": by_status,
        "streams_started": s.streams_started,
        "streams_completed": s.streams_completed,
        "streams_cut": s.streams_cut,
        "streams_errored": s.streams_errored,
        "abandoned": s.abandoned,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "wasted_input_tokens": s.wasted_input_tokens,
        "wasted_output_tokens": s.wasted_output_tokens,
    });
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}
