//! The transport service: the innermost hop of a stack, sending requests over a pooled hyper
//! client and turning what went wrong before a response head into a classified error.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::PROXY_AUTHORIZATION;
use http::uri::Scheme;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::{self, Client, connect::HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use seawall_core::{BoxError, ConfigError, LlmError};
use tower_service::Service;

use seawall_core::upstream::{Upstream, route};

use crate::proxy::{ProxyConnector, intercept};

type Inner = Client<HttpsConnector<ProxyConnector>, Full<Bytes>>;

/// An HTTP/1.1 and HTTP/2 client for LLM APIs: `Service<http::Request<Bytes>>`.
///
/// - hyper 1 with hyper-util's pooled client, keep-alive, and a pool sized by
///   [`pool_max_idle_per_host`](HttpTransportBuilder::pool_max_idle_per_host);
/// - HTTPS with rustls (the `ring` provider) and the Mozilla roots of `webpki-roots`, HTTP/2 by
///   ALPN;
/// - no retries of its own: seawall's retry layer is the only retry loop. (hyper resends a
///   request only when a pooled connection turned out closed *before* the request was written,
///   which cannot bill twice.)
/// - with an [`Upstream`], relative request URIs are resolved against its base URL and its
///   headers (credentials, API version, `content-type: application/json`) are added unless
///   the request has them. Credentials go only to the upstream's own origin.
/// - through the proxy that `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY` name (read
///   when the transport is built; see [`HttpTransportBuilder::proxy`]).
///
/// Clones share one connection pool; [`with_upstream`](Self::with_upstream) makes a transport
/// for another upstream on the same pool.
///
/// **Errors** are boxed, as the transport made them, so a classifier can read the source chain:
/// a [`hyper_util::client::legacy::Error`] (`is_connect()` for a refused, reset or timed-out
/// connection attempt, with the `std::io::Error` in its sources), or an [`LlmError`] of class
/// `InvalidRequest` for a request this transport cannot send (a relative URI with no base URL).
/// [`into_llm_error`] classifies them when no classifier is stacked.
#[derive(Clone)]
pub struct HttpTransport {
    client: Inner,
    upstream: Option<Arc<Upstream>>,
    proxy: Option<Arc<Matcher>>,
}

impl HttpTransport {
    /// A transport with the default settings (see [`HttpTransportBuilder`]).
    pub fn new() -> Result<Self, ConfigError> {
        Self::builder().build()
    }

    /// A builder.
    pub fn builder() -> HttpTransportBuilder {
        HttpTransportBuilder::default()
    }

    /// This transport, sending to `upstream` (sharing the connection pool).
    pub fn with_upstream(mut self, upstream: Upstream) -> Self {
        self.upstream = Some(Arc::new(upstream));
        self
    }

    /// The upstream, if set.
    pub fn upstream(&self) -> Option<&Upstream> {
        self.upstream.as_deref()
    }

    fn prepare(&self, req: Request<Bytes>) -> Result<Request<Full<Bytes>>, LlmError> {
        let (mut parts, body) = req.into_parts();
        route(self.upstream.as_deref(), &mut parts, &body)?;
        // A forward proxy (plain `http://` destinations) reads its credentials from the request;
        // a tunnel (`https://`) gets them in its `CONNECT`, never in the end-to-end request.
        if parts.uri.scheme() == Some(&Scheme::HTTP)
            && !parts.headers.contains_key(PROXY_AUTHORIZATION)
        {
            if let Some(auth) = intercept(self.proxy.as_deref(), &parts.uri)
                .as_ref()
                .and_then(|p| p.basic_auth())
            {
                let mut auth = auth.clone();
                auth.set_sensitive(true);
                parts.headers.insert(PROXY_AUTHORIZATION, auth);
            }
        }
        Ok(Request::from_parts(parts, Full::new(body)))
    }
}

impl fmt::Debug for HttpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpTransport")
            .field("upstream", &self.upstream)
            .field("proxy", &self.proxy)
            .finish_non_exhaustive()
    }
}

impl Service<Request<Bytes>> for HttpTransport {
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // The pooled client is always ready; concurrency is the gate's job.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> ResponseFuture {
        let state = match self.prepare(req) {
            Ok(req) => State::Sent(self.client.request(req)),
            Err(e) => State::Refused(Some(e)),
        };
        ResponseFuture { state }
    }
}

/// The future of [`HttpTransport`]: resolves at the response head.
pub struct ResponseFuture {
    state: State,
}

enum State {
    Sent(legacy::ResponseFuture),
    Refused(Option<LlmError>),
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<Incoming>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.state {
            State::Sent(fut) => {
                let Poll::Ready(result) = Pin::new(fut).poll(cx) else {
                    return Poll::Pending;
                };
                // Finished: a further poll panics like a refusal already returned.
                self.state = State::Refused(None);
                Poll::Ready(result.map_err(Into::into))
            }
            State::Refused(err) => match err.take() {
                Some(e) => Poll::Ready(Err(e.into())),
                None => seawall_core::polled_after_completion(),
            },
        }
    }
}

/// Settings of an [`HttpTransport`].
///
/// Defaults: 32 idle connections kept per host, idle connections closed after 90 s, a 10 s
/// connect timeout, TCP keep-alive every 60 s, HTTP/2 offered by ALPN over HTTPS (HTTP/1.1
/// otherwise), TLS with the Mozilla roots, proxies from the environment.
#[derive(Debug, Clone)]
pub struct HttpTransportBuilder {
    proxy: Proxies,
    pool_max_idle_per_host: usize,
    pool_idle_timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    tcp_keepalive: Option<Duration>,
    http2: bool,
    http2_prior_knowledge: bool,
    tls: Option<rustls::ClientConfig>,
    upstream: Option<Upstream>,
}

/// Where the proxy settings come from.
#[derive(Debug, Clone)]
enum Proxies {
    FromEnv,
    Given(Arc<Matcher>),
    Off,
}

impl Default for HttpTransportBuilder {
    fn default() -> Self {
        HttpTransportBuilder {
            proxy: Proxies::FromEnv,
            pool_max_idle_per_host: 32,
            pool_idle_timeout: Some(Duration::from_secs(90)),
            connect_timeout: Some(Duration::from_secs(10)),
            tcp_keepalive: Some(Duration::from_secs(60)),
            http2: true,
            http2_prior_knowledge: false,
            tls: None,
            upstream: None,
        }
    }
}

impl HttpTransportBuilder {
    /// How many idle connections are kept per host. Size it to the concurrency gate's permits:
    /// over HTTP/1.1 each call in flight holds one connection, and a connection the pool does
    /// not keep is closed and opened again (a TLS handshake) by the next call.
    pub fn pool_max_idle_per_host(mut self, n: usize) -> Self {
        self.pool_max_idle_per_host = n;
        self
    }

    /// How long an idle pooled connection is kept (`None`: until the server closes it).
    pub fn pool_idle_timeout(mut self, d: impl Into<Option<Duration>>) -> Self {
        self.pool_idle_timeout = d.into();
        self
    }

    /// The TCP connect timeout (`None`: the operating system's). A timed-out connect is a
    /// connect error.
    pub fn connect_timeout(mut self, d: impl Into<Option<Duration>>) -> Self {
        self.connect_timeout = d.into();
        self
    }

    /// The TCP keep-alive interval (`None`: off).
    pub fn tcp_keepalive(mut self, d: impl Into<Option<Duration>>) -> Self {
        self.tcp_keepalive = d.into();
        self
    }

    /// Whether HTTP/2 is offered over HTTPS (by ALPN). On by default.
    pub fn http2(mut self, on: bool) -> Self {
        self.http2 = on;
        self
    }

    /// Speak only HTTP/2, also over plain `http://` (prior knowledge, h2c).
    pub fn http2_prior_knowledge(mut self, on: bool) -> Self {
        self.http2_prior_knowledge = on;
        self
    }

    /// Uses this rustls configuration (a private CA, client certificates) instead of the
    /// Mozilla roots. Its ALPN list is replaced by the protocols enabled here.
    pub fn tls_config(mut self, config: rustls::ClientConfig) -> Self {
        self.tls = Some(config);
        self
    }

    /// Sends through the proxies `matcher` names, instead of those of the environment.
    ///
    /// By default the builder reads `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY`
    /// (or their lowercase forms) when it builds, as curl and the official SDKs do. `https://`
    /// destinations go through a `CONNECT` tunnel with TLS end to end, `http://` ones to the
    /// proxy in absolute form; credentials in the proxy URL become `Proxy-Authorization`.
    ///
    /// ```
    /// use seawall_http::{HttpTransport, ProxyMatcher};
    ///
    /// let proxies = ProxyMatcher::builder()
    ///     .https("http://proxy.internal:3128")
    ///     .no("localhost,127.0.0.1,.svc.cluster.local")
    ///     .build();
    /// let transport = HttpTransport::builder().proxy(proxies).build().unwrap();
    /// # let _ = transport;
    /// ```
    pub fn proxy(mut self, matcher: Matcher) -> Self {
        self.proxy = Proxies::Given(Arc::new(matcher));
        self
    }

    /// Connects directly, whatever the environment says.
    pub fn no_proxy(mut self) -> Self {
        self.proxy = Proxies::Off;
        self
    }

    /// Sends to `upstream` (see [`HttpTransport::with_upstream`]).
    pub fn upstream(mut self, upstream: Upstream) -> Self {
        self.upstream = Some(upstream);
        self
    }

    /// Builds the transport. Must run inside a tokio runtime only when the transport is used.
    pub fn build(self) -> Result<HttpTransport, ConfigError> {
        let tls = match self.tls {
            Some(mut c) => {
                c.alpn_protocols.clear();
                c
            }
            None => default_tls()?,
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(self.connect_timeout);
        http.set_keepalive(self.tcp_keepalive);
        let proxy = match self.proxy {
            Proxies::FromEnv => Some(Arc::new(Matcher::from_env())),
            Proxies::Given(m) => Some(m),
            Proxies::Off => None,
        };
        let tcp = ProxyConnector::new(http, proxy.clone());
        let b = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1();
        let connector = if self.http2 || self.http2_prior_knowledge {
            b.enable_http2().wrap_connector(tcp)
        } else {
            b.wrap_connector(tcp)
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(self.pool_max_idle_per_host)
            .pool_idle_timeout(self.pool_idle_timeout)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .http2_only(self.http2_prior_knowledge)
            .build(connector);
        Ok(HttpTransport {
            client,
            upstream: self.upstream.map(Arc::new),
            proxy,
        })
    }
}

fn default_tls() -> Result<rustls::ClientConfig, ConfigError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::new("tls", "the TLS setup failed").with_source(e))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The [`LlmError`] of a transport error, for stacks without a classifier: the same reading
/// as [`seawall_classify::classify_transport_error`] (it is that function), so a stack with and
/// a stack without a `ClassifyLayer` agree. `Connect` when the connection could not be made
/// (refused, DNS, a timed-out connect: the request was not sent, so a retry is safe),
/// `Timeout` when the response head did not come in time, `Disconnected` for anything else
/// after that (the upstream may have received and billed the request). An `LlmError` inside is
/// returned as it is.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use tower::{ServiceBuilder, ServiceExt};
/// use seawall_http::{HttpTransport, into_llm_error};
///
/// let transport = ServiceBuilder::new()
///     .map_err(into_llm_error)
///     .service(HttpTransport::new()?);
/// # let _ = transport; Ok(()) }
/// ```
pub fn into_llm_error(err: BoxError) -> LlmError {
    seawall_classify::classify_transport_error(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use seawall_core::FailureClass;
    use std::io;

    #[test]
    fn a_timeout_before_the_response_head_is_a_timeout_with_or_without_a_classifier() {
        // This transport's own reading used to call it `Disconnected`, the classifier's
        // `Timeout`; now both are the classifier's.
        let timed_out = || -> BoxError { Box::new(io::Error::from(io::ErrorKind::TimedOut)) };
        let here = into_llm_error(timed_out());
        let classifier = seawall_classify::classify_transport_error(timed_out());
        assert_eq!(here.class(), FailureClass::Timeout);
        assert_eq!(here.class(), classifier.class());
        assert_eq!(here.message(), classifier.message());
    }

    #[test]
    fn refused_and_reset_keep_their_classes() {
        let refused: BoxError = Box::new(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(into_llm_error(refused).class(), FailureClass::Connect);
        let reset: BoxError = Box::new(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(into_llm_error(reset).class(), FailureClass::Disconnected);
        let own = LlmError::new(FailureClass::InvalidRequest, "no base URL");
        assert_eq!(
            into_llm_error(Box::new(own)).class(),
            FailureClass::InvalidRequest
        );
    }
}
