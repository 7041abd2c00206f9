//! Capture and replay: reading a response into a snapshot while handing the caller an
//! equivalent response, and building fresh responses from that snapshot.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Full};

/// A response that can be stored and served again.
pub trait Replay: Sized {
    /// What the cache keeps.
    type Snapshot: Send + Sync + 'static;

    /// Reads the response into a snapshot of at most `max_bytes`, and gives back a response
    /// equivalent to the original for the caller. Returns no snapshot when the response is
    /// too large or not a success.
    fn capture(
        self,
        max_bytes: usize,
    ) -> impl Future<Output = (Self, Option<Self::Snapshot>)> + Send;

    /// A fresh response from a snapshot.
    fn replay(snapshot: &Self::Snapshot) -> Self;

    /// The size of a snapshot, for the cache's byte bound.
    fn snapshot_len(snapshot: &Self::Snapshot) -> usize;
}

/// A body type that can be rebuilt from bytes, so an `http::Response` of it can be cached.
pub trait ReplayBody: Body<Data = Bytes> + Unpin + Sized {
    /// A body that yields `data`, then `trailers`.
    fn from_bytes(data: Bytes, trailers: Option<HeaderMap>) -> Self;

    /// A body that yields `prefix` (already read from `rest`), then the rest of `rest`.
    fn resume(prefix: Bytes, rest: Self) -> Self;

    /// A body that yields `prefix`, then `error` (the error reading the original stopped at).
    fn failed(prefix: Bytes, error: Self::Error) -> Self;
}

/// The stored form of an HTTP response: status, version, headers, body and trailers
/// (extensions are not kept). Its `Debug` shows header names, never their values.
#[derive(Clone)]
pub struct HttpSnapshot {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

impl HttpSnapshot {
    /// The stored status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stored body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }
}

impl std::fmt::Debug for HttpSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSnapshot")
            .field("status", &self.status)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("body_len", &self.body.len())
            .field("trailers", &self.trailers.is_some())
            .finish()
    }
}

fn join(chunks: Vec<Bytes>, len: usize) -> Bytes {
    match <[Bytes; 1]>::try_from(chunks) {
        Ok([one]) => one,
        Err(chunks) => {
            let mut buf = BytesMut::with_capacity(len);
            for c in chunks {
                buf.extend_from_slice(&c);
            }
            buf.freeze()
        }
    }
}

impl<B> Replay for Response<B>
where
    B: ReplayBody + Send,
    B::Error: Send,
{
    type Snapshot = HttpSnapshot;

    async fn capture(self, max_bytes: usize) -> (Self, Option<HttpSnapshot>) {
        let (parts, mut body) = self.into_parts();
        if !parts.status.is_success()
            || body.size_hint().lower() > u64::try_from(max_bytes).unwrap_or(u64::MAX)
        {
            return (Response::from_parts(parts, body), None);
        }
        let mut chunks = Vec::new();
        let mut len = 0usize;
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => match frame.into_data() {
                    Ok(data) => {
                        len += data.len();
                        chunks.push(data);
                        if len > max_bytes {
                            let prefix = join(chunks, len);
                            let body = B::resume(prefix, body);
                            return (Response::from_parts(parts, body), None);
                        }
                    }
                    Err(frame) => {
                        if let Ok(t) = frame.into_trailers() {
                            trailers = Some(t);
                        }
                    }
                },
                Err(e) => {
                    let body = B::failed(join(chunks, len), e);
                    return (Response::from_parts(parts, body), None);
                }
            }
        }
        let bytes = join(chunks, len);
        let snapshot = HttpSnapshot {
            status: parts.status,
            version: parts.version,
            headers: parts.headers.clone(),
            body: bytes.clone(),
            trailers: trailers.clone(),
        };
        let body = B::from_bytes(bytes, trailers);
        (Response::from_parts(parts, body), Some(snapshot))
    }

    fn replay(s: &HttpSnapshot) -> Self {
        let mut resp = Response::new(B::from_bytes(s.body.clone(), s.trailers.clone()));
        *resp.status_mut() = s.status;
        *resp.version_mut() = s.version;
        *resp.headers_mut() = s.headers.clone();
        resp
    }

    fn snapshot_len(s: &HttpSnapshot) -> usize {
        let headers: usize = s
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len())
            .sum();
        s.body.len() + headers
    }
}

/// A `Full` body is one frame: once it was read, the bytes read are all of it.
impl ReplayBody for Full<Bytes> {
    fn from_bytes(data: Bytes, _trailers: Option<HeaderMap>) -> Self {
        Full::new(data)
    }

    fn resume(prefix: Bytes, _rest: Self) -> Self {
        Full::new(prefix)
    }

    fn failed(_prefix: Bytes, error: Self::Error) -> Self {
        match error {}
    }
}

impl<E> ReplayBody for BoxBody<Bytes, E>
where
    E: Send + Sync + 'static,
{
    fn from_bytes(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        BoxBody::new(Replayed::<Self, E>::new(data, None, trailers, None))
    }

    fn resume(prefix: Bytes, rest: Self) -> Self {
        BoxBody::new(Replayed::new(prefix, Some(rest), None, None))
    }

    fn failed(prefix: Bytes, error: E) -> Self {
        BoxBody::new(Replayed::<Self, E>::new(prefix, None, None, Some(error)))
    }
}

impl<E> ReplayBody for UnsyncBoxBody<Bytes, E>
where
    E: Send + 'static,
{
    fn from_bytes(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        UnsyncBoxBody::new(Replayed::<Self, E>::new(data, None, trailers, None))
    }

    fn resume(prefix: Bytes, rest: Self) -> Self {
        UnsyncBoxBody::new(Replayed::new(prefix, Some(rest), None, None))
    }

    fn failed(prefix: Bytes, error: E) -> Self {
        UnsyncBoxBody::new(Replayed::<Self, E>::new(prefix, None, None, Some(error)))
    }
}

/// Bytes, then optionally the rest of a body, an error, or trailers.
struct Replayed<B, E> {
    data: Option<Bytes>,
    rest: Option<B>,
    trailers: Option<HeaderMap>,
    error: Option<E>,
}

impl<B, E> Replayed<B, E> {
    fn new(data: Bytes, rest: Option<B>, trailers: Option<HeaderMap>, error: Option<E>) -> Self {
        Replayed {
            data: (!data.is_empty()).then_some(data),
            rest,
            trailers,
            error,
        }
    }
}

// No field is structurally pinned but the rest of the body, which is `Unpin` itself.
impl<B: Unpin, E> Unpin for Replayed<B, E> {}

impl<B, E> Body for Replayed<B, E>
where
    B: Body<Data = Bytes, Error = E> + Unpin,
{
    type Data = Bytes;
    type Error = E;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, E>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(rest) = &mut this.rest {
            return Pin::new(rest).poll_frame(cx);
        }
        if let Some(e) = this.error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
            && self.rest.as_ref().is_none_or(Body::is_end_stream)
            && self.error.is_none()
            && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let len = self.data.as_ref().map_or(0, |d| d.len() as u64);
        match &self.rest {
            Some(rest) => seawall_core::size_hint_plus(rest.size_hint(), len),
            None => SizeHint::with_exact(len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn oversized_body_reaches_the_caller_whole() {
        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"0123456789"))),
            Ok(Frame::data(Bytes::from_static(b"abcdefghij"))),
            Ok(Frame::data(Bytes::from_static(b"KLMNOPQRST"))),
        ];
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
        let resp = Response::new(UnsyncBoxBody::new(body));
        let (resp, snap) = resp.capture(15).await;
        assert!(snap.is_none());
        let all = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&all[..], b"0123456789abcdefghijKLMNOPQRST");
    }

    #[tokio::test]
    async fn body_error_while_capturing_reaches_the_caller() {
        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"{\"partial\""))),
            Err(std::io::Error::other("reset")),
        ];
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
        let resp = Response::new(BoxBody::new(body));
        let (resp, snap) = resp.capture(1024).await;
        assert!(snap.is_none());
        let mut body = resp.into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "{\"partial\"");
        assert!(body.frame().await.unwrap().is_err());
    }

    #[tokio::test]
    async fn snapshot_replays_status_headers_body_and_trailers() {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-done", "1".parse().unwrap());
        let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"{\"ok\":"))),
            Ok(Frame::data(Bytes::from_static(b"true}"))),
            Ok(Frame::trailers(trailers)),
        ];
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
        let mut resp = Response::new(UnsyncBoxBody::new(body));
        resp.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        let (resp, snap) = resp.capture(1024).await;
        let snap = snap.unwrap();
        assert_eq!(snap.body(), "{\"ok\":true}");
        let original = resp.into_body().collect().await.unwrap();
        assert_eq!(original.trailers().unwrap()["x-done"], "1");
        let again = <Response<UnsyncBoxBody<Bytes, std::io::Error>>>::replay(&snap);
        assert_eq!(again.status(), StatusCode::OK);
        assert_eq!(again.headers()["content-type"], "application/json");
        let collected = again.into_body().collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["x-done"], "1");
        assert_eq!(collected.to_bytes(), "{\"ok\":true}");
        let full = <Response<Full<Bytes>>>::replay(&snap);
        assert_eq!(
            full.into_body().collect().await.unwrap().to_bytes(),
            "{\"ok\":true}"
        );
    }
}
