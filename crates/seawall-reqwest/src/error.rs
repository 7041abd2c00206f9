//! reqwest's errors as seawall classes.
//!
//! reqwest says what went wrong with flags (`is_connect`, `is_timeout`, `is_request`, ...) on
//! one error type, over the same hyper and hyper-util errors seawall's own transport reads. The
//! retry layer's decision hangs on one question, *could the request have reached the
//! upstream?*, so the classes are: `Connect` (it was not sent: always safe to retry),
//! `Timeout` (no response head in time), `Disconnected` (sent, then the connection failed: it
//! may have been billed, so retried only when idempotent), and `InvalidRequest` for a request
//! reqwest could not build or a redirect it refused.
//!
//! reqwest puts the request URL in its errors' `Display` and `Debug`, and a URL can hold a
//! credential (Gemini's native API takes `?key=`): the URL is stripped before anything else
//! sees the error.

use seawall_core::{FailureClass, LlmError};

/// The [`LlmError`] of a `reqwest::Error`, with the reqwest error (its URL stripped) as its
/// source.
///
/// - `is_builder()`: [`FailureClass::InvalidRequest`] (nothing was sent);
/// - `is_redirect()`: [`FailureClass::InvalidRequest`]: seawall follows no redirect (a
///   redirect on an LLM API means the base URL is wrong), and a client that follows them and
///   gives up reports this;
/// - otherwise the source chain is read as for seawall's own transport
///   ([`seawall_classify::classify_transport_error`], with hyper's flags): `is_connect()`
///   (refused, DNS, a connect timeout) or a request hyper handed back unsent is
///   [`FailureClass::Connect`]; `is_timeout()` outside connecting is
///   [`FailureClass::Timeout`]; an error after the request was written (`is_request()` with a
///   reset or an incomplete message, `is_body()`, `is_decode()`) is
///   [`FailureClass::Disconnected`].
///
/// No part of the URL (a `?key=` query, a `user:password@` authority) and no header appears in
/// the result's `Display`, `Debug` or sources.
pub fn classify_reqwest_error(error: reqwest::Error) -> LlmError {
    let error = error.without_url();
    if error.is_builder() {
        LlmError::new(
            FailureClass::InvalidRequest,
            "the request could not be built",
        )
        .with_source(error)
    } else if error.is_redirect() {
        LlmError::new(
            FailureClass::InvalidRequest,
            "the upstream answered with a redirect, which seawall does not follow: \
             point the base URL at the final location",
        )
        .with_source(error)
    } else {
        seawall_classify::classify_transport_error(Box::new(error))
    }
}
