//! A seawall stack under async-openai's client.
//!
//! async-openai (with its `middleware` feature) sends every request through a tower
//! `Service<HttpRequestFactory, Response = reqwest::Response>` installed with
//! `Client::with_http_service`. [`OpenAiService`] is that service over a seawall stack: for each
//! call it builds the `reqwest::Request` from the factory once, converts it into the stack's
//! `http::Request<Bytes>` (the stack replays those bytes for every attempt), and converts the
//! stack's answer back into a `reqwest::Response` whose body streams, so
//! `client.chat().create(..)` and `create_stream(..)` work unchanged.
//!
//! **One retry loop.** async-openai's own retry layer (`OpenAIRetryLayer`, which its default
//! client installs) is not used: `with_http_service` replaces the default executor, and
//! seawall's retry layer inside the stack is the only retry loop. Do not add
//! `OpenAIRetryLayer` around this service: retries would multiply.
//!
//! **Errors.** A call that failed for good becomes an [`OpenAIError`] by [`into_openai_error`]:
//! an error the upstream answered (a status outside 2xx: rate limit, quota, overload after the
//! retries, invalid request) is `OpenAIError::ApiError` with the upstream's status, message,
//! type and code, exactly as async-openai's own client reports it, so existing matching on
//! `ApiError` keeps working; everything else (seawall's own decisions such as an open circuit
//! or a spent budget, transport failures, broken streams before the commit point) is
//! `OpenAIError::Boxed` holding the [`LlmError`], which downcasts. A stream that breaks after
//! its first content yields that content, then an `OpenAIError::StreamError`: never a silent
//! truncation, and never retried.
//!
//! The stack's innermost service is a [`ReqwestTransport`](crate::ReqwestTransport) without an
//! upstream: async-openai's requests already carry the absolute URL and the credentials of its
//! config.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll};

use async_openai::error::{ApiError, ApiErrorResponse, OpenAIError};
use async_openai::middleware::HttpRequestFactory;
use bytes::Bytes;
use http_body::Body;
use seawall_core::{BoxError, LlmError};
use tower_layer::Layer;
use tower_service::Service;

use crate::convert::{buffer_request, response_to_reqwest};

/// Wraps a seawall stack into an [`OpenAiService`].
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenAiLayer {
    _private: (),
}

impl OpenAiLayer {
    /// The layer.
    pub fn new() -> Self {
        OpenAiLayer::default()
    }
}

impl<S> Layer<S> for OpenAiLayer {
    type Service = OpenAiService<S>;

    fn layer(&self, inner: S) -> OpenAiService<S> {
        OpenAiService::new(inner)
    }
}

/// A seawall stack as async-openai's HTTP service: `Service<HttpRequestFactory>` answering
/// `reqwest::Response`, for `async_openai::Client::with_http_service`. See the
/// [module docs](self); the crate docs show it in use.
#[derive(Clone, Debug)]
pub struct OpenAiService<S> {
    inner: S,
}

impl<S> OpenAiService<S> {
    /// The service around `inner`, a seawall stack.
    pub fn new(inner: S) -> Self {
        OpenAiService { inner }
    }

    /// The stack.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// The future of [`OpenAiService`] (boxed: the request factory's own future is).
pub type OpenAiFuture =
    Pin<Box<dyn Future<Output = Result<reqwest::Response, OpenAIError>> + Send + 'static>>;

impl<S, B> Service<HttpRequestFactory> for OpenAiService<S>
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Error: Into<LlmError>,
    S::Future: Send,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = reqwest::Response;
    type Error = OpenAIError;
    type Future = OpenAiFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), OpenAIError>> {
        // The request is built (asynchronously) before the stack is called, so the stack is
        // driven ready inside the call, on a clone, as tower's own retry does. seawall's layers
        // are always ready anyway: refusals come from `call`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, factory: HttpRequestFactory) -> OpenAiFuture {
        let mut stack = self.inner.clone();
        Box::pin(async move {
            let request = factory.build().await?;
            let url = request.url().clone();
            let request = buffer_request(request).await.map_err(into_openai_error)?;
            poll_fn(|cx| stack.poll_ready(cx))
                .await
                .map_err(|e| into_openai_error(e.into()))?;
            match stack.call(request).await {
                Ok(resp) => Ok(response_to_reqwest(resp, url)),
                Err(e) => Err(into_openai_error(e.into())),
            }
        })
    }
}

/// The [`OpenAIError`] of a call that failed for good: `ApiError` for an error the upstream
/// answered (a status outside 2xx), with its status, message, type and code; `Boxed` holding
/// the [`LlmError`] for everything else.
///
/// ```
/// use async_openai::error::OpenAIError;
/// use seawall_core::{FailureClass, LlmError};
/// use seawall_reqwest::into_openai_error;
///
/// let quota = LlmError::new(FailureClass::QuotaExhausted, "You exceeded your current quota")
///     .with_status(http::StatusCode::TOO_MANY_REQUESTS)
///     .with_code("insufficient_quota");
/// let OpenAIError::ApiError(e) = into_openai_error(quota) else { panic!() };
/// assert_eq!(e.status_code, 429);
/// assert_eq!(e.api_error.code.as_deref(), Some("insufficient_quota"));
///
/// let open = LlmError::new(FailureClass::CircuitOpen, "circuit open");
/// let OpenAIError::Boxed(e) = into_openai_error(open) else { panic!() };
/// assert_eq!(e.downcast_ref::<LlmError>().unwrap().class(), FailureClass::CircuitOpen);
/// ```
pub fn into_openai_error(error: LlmError) -> OpenAIError {
    match error.status() {
        Some(status) if !status.is_success() => OpenAIError::ApiError(ApiErrorResponse {
            status_code: status,
            api_error: ApiError {
                message: error.message().to_owned(),
                r#type: error.error_type().map(str::to_owned),
                param: None,
                code: error.code().map(str::to_owned),
            },
        }),
        _ => OpenAIError::Boxed(Box::new(error)),
    }
}
