//! Outbound proxies: `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY`, as curl reads them.
//!
//! Corporate networks reach the LLM APIs only through a proxy, and every tool there (curl, the
//! official SDKs, reqwest) finds it in these variables, so the transport does too. hyper-util
//! has the pieces, and they are used as they are: its `Matcher` reads the variables (with
//! curl's `NO_PROXY` rules: domains, suffixes, IPs and CIDR ranges, `*`) and its `Tunnel` speaks
//! `CONNECT`. What this module adds is the choice per destination:
//!
//! - an `https://` destination behind a proxy goes through a `CONNECT` tunnel, and TLS runs
//!   end to end inside it (the proxy sees only the host name and port);
//! - an `http://` destination behind a proxy is sent to the proxy in absolute form
//!   (`POST http://host/v1/chat/completions`), with `Proxy-Authorization` when the proxy URL
//!   has credentials;
//! - anything else connects directly.
//!
//! Only `http://` proxies are spoken to (the common case); a `socks5://` or `https://` proxy
//! URL fails each connection with a clear connect error rather than being bypassed silently.
//! A failed proxy handshake (refused, `407`, a non-`200` answer to `CONNECT`) is a connect
//! error: nothing was sent upstream, so a retry is safe. Proxy credentials are never shown:
//! the matcher keeps them out of the proxy URI and its `Debug`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use http::uri::Scheme;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::proxy::matcher::{Intercept, Matcher};
use seawall_core::BoxError;
use tower_service::Service;

/// The TCP connector of [`HttpTransport`](crate::HttpTransport), sending through a proxy when
/// the matcher says so.
#[derive(Clone)]
pub(crate) struct ProxyConnector {
    direct: HttpConnector,
    matcher: Option<Arc<Matcher>>,
}

impl ProxyConnector {
    pub(crate) fn new(direct: HttpConnector, matcher: Option<Arc<Matcher>>) -> Self {
        ProxyConnector { direct, matcher }
    }
}

/// The proxy for `dst`, if one applies.
pub(crate) fn intercept(matcher: Option<&Matcher>, dst: &Uri) -> Option<Intercept> {
    matcher?.intercept(dst)
}

fn unsupported_proxy(scheme: &str) -> BoxError {
    format!(
        "a {scheme}:// proxy is not supported by this transport; use an http:// proxy \
         (or reqwest, through seawall-reqwest)"
    )
    .into()
}

type Connecting = Pin<Box<dyn Future<Output = Result<ProxyStream, BoxError>> + Send>>;

impl Service<Uri> for ProxyConnector {
    type Response = ProxyStream;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.direct.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Connecting {
        let mut direct = self.direct.clone();
        let Some(proxy) = intercept(self.matcher.as_deref(), &dst) else {
            return Box::pin(async move {
                let io = direct.call(dst).await?;
                Ok(ProxyStream::new(io, false))
            });
        };
        let proxy_scheme = proxy.uri().scheme().cloned().unwrap_or(Scheme::HTTP);
        if proxy_scheme != Scheme::HTTP {
            return Box::pin(async move { Err(unsupported_proxy(proxy_scheme.as_str())) });
        }
        if dst.scheme() == Some(&Scheme::HTTPS) {
            let mut tunnel = Tunnel::new(proxy.uri().clone(), direct);
            if let Some(auth) = proxy.basic_auth() {
                tunnel = tunnel.with_auth(auth.clone());
            }
            Box::pin(async move {
                let io = tunnel.call(dst).await?;
                Ok(ProxyStream::new(io, false))
            })
        } else {
            let to_proxy = proxy.uri().clone();
            Box::pin(async move {
                let io = direct.call(to_proxy).await?;
                Ok(ProxyStream::new(io, true))
            })
        }
    }
}

/// What the direct connector gives: a tokio TCP stream.
type Tcp = <HttpConnector as Service<Uri>>::Response;

/// A TCP connection that knows whether it leads to a forward proxy: hyper then writes
/// request targets in absolute form.
#[derive(Debug)]
pub(crate) struct ProxyStream {
    io: Tcp,
    forward: bool,
}

impl ProxyStream {
    fn new(io: Tcp, forward: bool) -> Self {
        ProxyStream { io, forward }
    }
}

impl Connection for ProxyStream {
    fn connected(&self) -> Connected {
        self.io.connected().proxy(self.forward)
    }
}

impl Read for ProxyStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl Write for ProxyStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}
