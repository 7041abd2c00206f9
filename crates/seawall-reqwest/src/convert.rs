//! The conversions between reqwest's types and the seawall stack's, in one place: the
//! transport, the middleware and the async-openai adapter all cross the same border, and
//! crossing it one way everywhere keeps timeouts, extensions and URLs from being lost on one
//! path only.
//!
//! - a `reqwest::Request` becomes an `http::Request<Bytes>` (the stack replays the bytes for
//!   every attempt); its extensions (where reqwest keeps a per-request timeout) travel with
//!   it and come back when the attempt is turned into a `reqwest::Request` again;
//! - the stack's `http::Response<B>` becomes a `reqwest::Response` whose body streams on as
//!   the stack's body yields it, and whose `url()` is the request's.

use bytes::Bytes;
use seawall_core::{FailureClass, LlmError};

/// A `reqwest::Request` on its way into the stack.
#[cfg(any(feature = "middleware", feature = "async-openai"))]
pub(crate) enum Converted {
    /// Its body was bytes (or absent): the stack can replay it.
    Buffered(http::Request<Bytes>),
    /// Its body is a stream: given back untouched, it can be sent once only.
    Streaming(reqwest::Request),
}

/// Converts a request whose body is bytes; a streamed body is handed back.
#[cfg(any(feature = "middleware", feature = "async-openai"))]
pub(crate) fn request_to_http(req: reqwest::Request) -> Result<Converted, LlmError> {
    let bytes = match req.body() {
        None => Bytes::new(),
        Some(body) => match body.as_bytes() {
            Some(b) => Bytes::copy_from_slice(b),
            None => return Ok(Converted::Streaming(req)),
        },
    };
    let (parts, _) = http::Request::<reqwest::Body>::try_from(req)
        .map_err(crate::error::classify_reqwest_error)?
        .into_parts();
    Ok(Converted::Buffered(http::Request::from_parts(parts, bytes)))
}

/// Converts a request, reading a streamed body into memory first (for callers that build the
/// request again for every call, such as async-openai's request factory).
#[cfg(feature = "async-openai")]
pub(crate) async fn buffer_request(
    req: reqwest::Request,
) -> Result<http::Request<Bytes>, LlmError> {
    match request_to_http(req)? {
        Converted::Buffered(req) => Ok(req),
        Converted::Streaming(req) => {
            use http_body_util::BodyExt;
            let (parts, body) = http::Request::<reqwest::Body>::try_from(req)
                .map_err(crate::error::classify_reqwest_error)?
                .into_parts();
            let bytes = body
                .collect()
                .await
                .map_err(|e| {
                    LlmError::new(
                        FailureClass::InvalidRequest,
                        "the request body could not be read",
                    )
                    .with_source(e.without_url())
                })?
                .to_bytes();
            Ok(http::Request::from_parts(parts, bytes))
        }
    }
}

/// One attempt of the stack, as reqwest sends it. A relative URI is an `InvalidRequest`.
pub(crate) fn http_to_request(req: http::Request<Bytes>) -> Result<reqwest::Request, LlmError> {
    reqwest::Request::try_from(req).map_err(|e| {
        LlmError::new(
            FailureClass::InvalidRequest,
            "the request URI is not an absolute http(s) URL",
        )
        .with_source(e.without_url())
    })
}

/// The stack's response as a `reqwest::Response`: the body streams on as the stack yields it
/// (its errors become reqwest body errors with the stack's error as their source), and
/// `url()` answers `url`.
#[cfg(any(feature = "middleware", feature = "async-openai"))]
pub(crate) fn response_to_reqwest<B>(
    resp: http::Response<B>,
    url: reqwest::Url,
) -> reqwest::Response
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<seawall_core::BoxError>,
{
    use http_body_util::BodyDataStream;
    use reqwest::ResponseBuilderExt;

    let (mut parts, body) = resp.into_parts();
    // reqwest reads the response URL from an extension only its response builder can set.
    if let Ok(with_url) = http::Response::builder().url(url).body(()) {
        parts.extensions.extend(with_url.into_parts().0.extensions);
    }
    // `wrap_stream` rather than `wrap`: the stack's bodies (guards, timers) need not be `Sync`.
    let body = reqwest::Body::wrap_stream(BodyDataStream::new(body));
    reqwest::Response::from(http::Response::from_parts(parts, body))
}
