//! Transport errors: what went wrong before a response head arrived.

use std::error::Error as StdError;
use std::io;

use seawall_core::{BoxError, FailureClass, LlmError};

#[derive(Default)]
struct Findings {
    llm: Option<LlmError>,
    /// hyper-util says the connection could not be made.
    connect: bool,
    /// Refused, unreachable, DNS: nothing was sent.
    refused: bool,
    /// hyper returned the request unsent (`is_canceled`).
    not_sent: bool,
    timeout: bool,
    /// Reset, EOF, incomplete message: the request may have reached the upstream.
    after_send: bool,
}

/// Classifies an error of the inner service from its source chain.
///
/// - an [`LlmError`] anywhere in the chain is passed through unchanged (a copy of it, when it
///   is not the outermost error);
/// - `hyper_util::client::legacy::Error::is_connect()` (feature `hyper`), `ConnectionRefused`, unreachable host
///   or network, DNS failures ("dns error", "failed to lookup address"), and hyper's
///   `is_canceled()` (the request was handed back unsent) give [`FailureClass::Connect`];
/// - `tower::timeout::error::Elapsed` (by type with feature `tower`, else by its text),
///   `tokio::time::error::Elapsed`, hyper's `is_timeout()` and
///   `io::ErrorKind::TimedOut` give [`FailureClass::Timeout`] (a timeout while connecting
///   stays `Connect`);
/// - anything else (reset, broken pipe, unexpected EOF, hyper's `is_incomplete_message()`,
///   a parse error, an unknown error) gives [`FailureClass::Disconnected`]: the request may
///   have reached the upstream, so it is retried only when idempotent. A bare
///   `ConnectionReset` counts as after-send unless the chain says it happened while
///   connecting.
///
/// ```
/// use seawall_classify::classify_transport_error;
/// use seawall_core::FailureClass;
///
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// assert_eq!(classify_transport_error(refused.into()).class(), FailureClass::Connect);
/// let elapsed = tower::timeout::error::Elapsed::new();
/// assert_eq!(classify_transport_error(elapsed.into()).class(), FailureClass::Timeout);
/// ```
pub fn classify_transport_error(error: BoxError) -> LlmError {
    let error = match error.downcast::<LlmError>() {
        Ok(e) => return *e,
        Err(e) => e,
    };
    let mut f = Findings::default();
    let mut chain = String::new();
    {
        let root: &(dyn StdError + 'static) = &*error;
        visit(root, &mut f, &mut chain, 0);
    }
    if let Some(found) = f.llm.take() {
        return found.with_source(error);
    }
    let (class, what) = if f.connect || f.refused || f.not_sent {
        (FailureClass::Connect, "could not connect")
    } else if f.timeout {
        (FailureClass::Timeout, "timed out before a response")
    } else if f.after_send {
        (
            FailureClass::Disconnected,
            "connection lost after the request was sent",
        )
    } else {
        (FailureClass::Disconnected, "transport error")
    };
    LlmError::new(class, format!("{what}: {chain}")).with_source(error)
}

const MAX_DEPTH: usize = 16;

fn visit(e: &(dyn StdError + 'static), f: &mut Findings, chain: &mut String, depth: usize) {
    if depth >= MAX_DEPTH || f.llm.is_some() {
        return;
    }
    let text = e.to_string();
    if chain.len() < 512 && !text.is_empty() && !chain.ends_with(text.as_str()) {
        if !chain.is_empty() {
            chain.push_str(": ");
        }
        chain.push_str(&text);
    }
    if let Some(l) = e.downcast_ref::<LlmError>() {
        f.llm = Some(l.clone_with(l.class(), l.message()));
        return;
    }
    #[cfg(feature = "hyper")]
    if let Some(h) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
        f.connect |= h.is_connect();
    }
    #[cfg(feature = "hyper")]
    if let Some(h) = e.downcast_ref::<hyper::Error>() {
        f.timeout |= h.is_timeout();
        f.not_sent |= h.is_canceled();
        f.after_send |=
            h.is_incomplete_message() || h.is_closed() || h.is_body_write_aborted() || h.is_parse();
    }
    #[cfg(feature = "tower")]
    if e.is::<tower::timeout::error::Elapsed>() {
        f.timeout = true;
    }
    if e.is::<tokio::time::error::Elapsed>() {
        f.timeout = true;
    }
    if let Some(io) = e.downcast_ref::<io::Error>() {
        use io::ErrorKind::*;
        match io.kind() {
            ConnectionRefused | HostUnreachable | NetworkUnreachable | AddrNotAvailable
            | NetworkDown => f.refused = true,
            TimedOut => f.timeout = true,
            ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | NotConnected
            | WriteZero => f.after_send = true,
            _ => {}
        }
        // `io::Error::source` skips the wrapped error itself; look at it directly.
        if let Some(inner) = io.get_ref() {
            let inner: &(dyn StdError + 'static) = inner;
            visit(inner, f, chain, depth + 1);
        }
    }
    let lower = text.to_ascii_lowercase();
    if [
        "dns error",
        "failed to lookup address",
        "name or service not known",
        "no such host",
    ]
    .iter()
    .any(|p| lower.contains(p))
        || lower.contains("connection refused")
    {
        f.refused = true;
    }
    if lower.contains("timed out") || lower.contains("deadline has elapsed") {
        f.timeout = true;
    }
    if let Some(next) = e.source() {
        visit(next, f, chain, depth + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;
    use std::time::Duration;

    #[derive(Debug)]
    struct Wrap(&'static str, Option<BoxError>);
    impl fmt::Display for Wrap {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }
    impl StdError for Wrap {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_deref().map(|e| e as &(dyn StdError + 'static))
        }
    }

    fn class(e: impl Into<BoxError>) -> FailureClass {
        classify_transport_error(e.into()).class()
    }

    #[test]
    fn io_kinds() {
        use io::ErrorKind::*;
        for (kind, want) in [
            (ConnectionRefused, FailureClass::Connect),
            (HostUnreachable, FailureClass::Connect),
            (NetworkUnreachable, FailureClass::Connect),
            (TimedOut, FailureClass::Timeout),
            (ConnectionReset, FailureClass::Disconnected),
            (BrokenPipe, FailureClass::Disconnected),
            (UnexpectedEof, FailureClass::Disconnected),
            (PermissionDenied, FailureClass::Disconnected),
        ] {
            assert_eq!(class(io::Error::from(kind)), want, "{kind:?}");
            // Deep in a chain too.
            let wrapped = Wrap("client error", Some(Box::new(io::Error::from(kind))));
            assert_eq!(class(wrapped), want, "wrapped {kind:?}");
        }
    }

    #[test]
    fn elapsed_is_timeout() {
        assert_eq!(
            class(tower::timeout::error::Elapsed::new()),
            FailureClass::Timeout
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let elapsed = rt
            .block_on(async {
                tokio::time::timeout(Duration::from_millis(1), std::future::pending::<()>()).await
            })
            .unwrap_err();
        assert_eq!(
            class(Wrap("request failed", Some(Box::new(elapsed)))),
            FailureClass::Timeout
        );
    }

    #[test]
    fn llm_error_passes_through() {
        let inner = LlmError::new(FailureClass::Overloaded, "busy")
            .with_retry_after(Duration::from_secs(3))
            .with_request_id("req_9");
        let e = classify_transport_error(Box::new(inner));
        assert_eq!(e.class(), FailureClass::Overloaded);
        assert_eq!(e.message(), "busy");
        let inner = LlmError::new(FailureClass::QuotaExhausted, "no money")
            .with_retry_after(Duration::from_secs(3))
            .with_request_id("req_9");
        let e = classify_transport_error(Box::new(Wrap("sdk", Some(Box::new(inner)))));
        assert_eq!(e.class(), FailureClass::QuotaExhausted);
        assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(e.request_id(), Some("req_9"));
        // Inside an io::Error too.
        let io = io::Error::other(LlmError::new(FailureClass::NotFound, "gone"));
        assert_eq!(class(io), FailureClass::NotFound);
    }

    #[test]
    fn dns_text_and_unknown() {
        assert_eq!(
            class(Wrap(
                "dns error: failed to lookup address information",
                None
            )),
            FailureClass::Connect
        );
        let e = classify_transport_error("something odd".into());
        assert_eq!(e.class(), FailureClass::Disconnected);
        assert!(e.message().contains("something odd"));
    }

    #[test]
    fn credentials_do_not_leak() {
        let e = classify_transport_error(
            "GET https://h/v1?api-key=topsecret123 failed: connection refused".into(),
        );
        assert_eq!(e.class(), FailureClass::Connect);
        assert!(!format!("{e} {e:?}").contains("topsecret123"));
    }
}
