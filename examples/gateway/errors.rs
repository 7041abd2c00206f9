//! What a client of the gateway sees when something fails, in the error format of the API it
//! speaks: a status and a class-level message, never the upstream's own text.
//!
//! The two official SDK families parse errors differently (OpenAI's `{"error":{...}}`,
//! Anthropic's `{"type":"error","error":{...}}`), so every refusal, every upstream failure and
//! every failure inside a stream is rendered for the [`Dialect`] of the request. The statuses
//! are the same for both: they follow the failure class, not the provider.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use seawall::core::ServedBy;
use seawall::{FailureClass, LlmError};

/// The API a client speaks, which decides the shape of its error bodies and model list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// OpenAI's: `{"error":{"message","type","code","param"}}`, errors in a stream as a
    /// `data:` event.
    OpenAi,
    /// Anthropic's: `{"type":"error","error":{"type","message"}}`, errors in a stream as an
    /// `event: error`.
    Anthropic,
}

impl Dialect {
    /// Anthropic for `/v1/messages` and for any request carrying `anthropic-version` (the
    /// Anthropic SDK sends it on every call); OpenAI otherwise.
    pub(crate) fn of(path: &str, headers: &HeaderMap) -> Self {
        if path.ends_with("/messages") || headers.contains_key("anthropic-version") {
            Dialect::Anthropic
        } else {
            Dialect::OpenAi
        }
    }
}

/// What a client is told about a failure: a status and a class-level message. Never the
/// upstream's text or codes (they can name the gateway's account, organisation or key),
/// nor a budget's limit and spend: those go to the log.
#[derive(Debug)]
pub(crate) struct PublicError {
    status: StatusCode,
    /// OpenAI's `type`; Anthropic's is derived from the status.
    kind: &'static str,
    message: &'static str,
    /// OpenAI's `code` (Anthropic's bodies have none).
    code: Option<&'static str>,
}

impl PublicError {
    /// A refusal by the gateway itself (no key, too large, no such route or model).
    pub(crate) const fn gateway(
        status: StatusCode,
        kind: &'static str,
        message: &'static str,
        code: Option<&'static str>,
    ) -> Self {
        PublicError {
            status,
            kind,
            message,
            code,
        }
    }

    /// The error as a complete response in `dialect`, with `retry-after` when known, and
    /// `x-should-retry: false`: the gateway already retried what a retry could help, so the
    /// SDKs (which obey that header) must not multiply it.
    pub(crate) fn response(&self, dialect: Dialect, retry_after: Option<u64>) -> Response {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            HeaderName::from_static("x-should-retry"),
            HeaderValue::from_static("false"),
        );
        if let Some(secs) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        (self.status, headers, error_body(self, dialect)).into_response()
    }
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
        RateLimited => (
            StatusCode::TOO_MANY_REQUESTS,
            "Too many requests. Please try again later.",
        ),
        QuotaExhausted => (
            StatusCode::TOO_MANY_REQUESTS,
            "The gateway's upstream quota is used up. Retrying will not help until it is \
             restored.",
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
        // The upstream answered, but never in a valid shape: 502 is "an invalid response from
        // the upstream server".
        ContentInvalid => (
            StatusCode::BAD_GATEWAY,
            "The upstream's answer did not pass validation.",
        ),
        // The gateway's own key was refused, the upstream broke, or the stream did: the
        // client's request is not at fault.
        _ => (StatusCode::BAD_GATEWAY, "The upstream service failed."),
    };
    let (kind, code) = openai_names(e.class());
    PublicError {
        status,
        kind,
        message,
        code,
    }
}

/// The OpenAI format's type and code for a class: OpenAI's own where clients branch on them
/// (a spent quota is `insufficient_quota`, which async-openai's retry layer, unlike every other
/// 429, does not retry), else the class's name and no code.
fn openai_names(class: FailureClass) -> (&'static str, Option<&'static str>) {
    match class {
        FailureClass::QuotaExhausted => ("insufficient_quota", Some("insufficient_quota")),
        FailureClass::RateLimited => (class.as_str(), Some("rate_limit_exceeded")),
        FailureClass::ContextLengthExceeded => (class.as_str(), Some("context_length_exceeded")),
        _ => (class.as_str(), None),
    }
}

/// Anthropic's error `type` for a status, as its API and SDK use them.
fn anthropic_kind(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 409 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

/// The error body in the client's format.
fn error_body(e: &PublicError, dialect: Dialect) -> String {
    let body = match dialect {
        Dialect::OpenAi => serde_json::json!({
            "error": {
                "message": e.message,
                "type": e.kind,
                "code": e.code,
                "param": null,
            }
        }),
        Dialect::Anthropic => serde_json::json!({
            "type": "error",
            "error": {
                "type": anthropic_kind(e.status),
                "message": e.message,
            }
        }),
    };
    body.to_string()
}

/// The whole (redacted) story of a failure, source chain included, for the operator.
fn log_failure(e: &LlmError, public: &PublicError) {
    tracing::warn!(
        status = public.status.as_u16(),
        error = e as &(dyn std::error::Error + 'static),
        "gateway: call failed"
    );
}

/// A failed call as the client's response: logged in full, answered at class level.
pub(crate) fn error_response(e: &LlmError, dialect: Dialect) -> Response {
    let public = public_error(e);
    log_failure(e, &public);
    let retry_after = e
        .retry_hint()
        .map(|hint| hint.as_secs() + u64::from(hint.subsec_nanos() > 0));
    public.response(dialect, retry_after)
}

/// Keeps only the content type and cache directive of the upstream's headers (its rate-limit
/// state, organisation, project and request ids are the gateway's business, not the
/// client's), says who served and, with the cache on, whether it answered
/// (`x-seawall-cache`), and turns a body error into an SSE error event for streams.
pub(crate) fn proxy_response<B>(
    resp: http::Response<B>,
    dialect: Dialect,
) -> http::Response<ProxyBody>
where
    B: Body<Data = Bytes, Error = LlmError> + Send + 'static,
{
    let (mut parts, body) = resp.into_parts();
    // The upstream's head is reused (its header map keeps its allocation): the two headers
    // kept are taken out, the rest cleared, and they go back with who served.
    let content_type = parts.headers.remove(header::CONTENT_TYPE);
    let cache_control = parts.headers.remove(header::CACHE_CONTROL);
    let cached = parts.headers.remove(seawall::cache::CACHE_HEADER);
    parts.headers.clear();
    let sse = content_type
        .as_ref()
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if let Some(v) = content_type {
        parts.headers.insert(header::CONTENT_TYPE, v);
    }
    if let Some(v) = cache_control {
        parts.headers.insert(header::CACHE_CONTROL, v);
    }
    if let Some(v) = cached {
        parts.headers.insert(seawall::cache::CACHE_HEADER, v);
    }
    if let Some(served) = parts.extensions.get::<ServedBy>() {
        if let Ok(v) = HeaderValue::from_str(&served.target) {
            parts
                .headers
                .insert(HeaderName::from_static("x-seawall-served-by"), v);
        }
    }
    // Nothing of the upstream's extensions is the client's business, and the version is the
    // server's to choose, as for a response built anew.
    parts.extensions.clear();
    parts.version = http::Version::default();
    let body = ProxyBody {
        inner: body.boxed_unsync(),
        sse: sse.then_some(dialect),
        done: false,
    };
    http::Response::from_parts(parts, body)
}

/// The response body handed to the client. A failure of a stream after its first token cannot
/// become an HTTP status any more; it becomes a last SSE event, the way the provider whose
/// API the client speaks reports errors inside a stream.
pub(crate) struct ProxyBody {
    inner: UnsyncBoxBody<Bytes, LlmError>,
    /// The stream's dialect, for an SSE body.
    sse: Option<Dialect>,
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
        match (Pin::new(&mut self.inner).poll_frame(cx), self.sse) {
            (Poll::Ready(Some(Err(e))), Some(dialect)) => {
                self.done = true;
                let public = public_error(&e);
                log_failure(&e, &public);
                let event = match dialect {
                    Dialect::OpenAi => format!("data: {}\n\n", error_body(&public, dialect)),
                    Dialect::Anthropic => {
                        format!("event: error\ndata: {}\n\n", error_body(&public, dialect))
                    }
                };
                Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
            }
            (other, _) => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }
}
