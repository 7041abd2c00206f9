//! [`RepairBody`]: the answer the layer read whole and validated, re-emitted; or the
//! upstream's body passed through (a streamed answer, an error status, an answer too large to
//! read, after the part already read).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

pin_project_lite::pin_project! {
    /// The body of a response of [`Repair`](crate::Repair).
    ///
    /// A validated answer is one frame holding the bytes the upstream sent (and its
    /// trailers, if it had any); a passed-through body is the upstream's, frame for frame,
    /// after whatever the layer had already read of it.
    pub struct RepairBody<B> {
        #[pin]
        inner: Option<B>,
        read: Option<Bytes>,
        rest: Option<Pin<Box<B>>>,
        trailers: Option<HeaderMap>,
    }
}

impl<B> RepairBody<B> {
    /// The upstream's body, untouched.
    pub(crate) fn pass(inner: B) -> Self {
        RepairBody {
            inner: Some(inner),
            read: None,
            rest: None,
            trailers: None,
        }
    }

    /// A body read whole.
    pub(crate) fn read(bytes: Bytes, trailers: Option<HeaderMap>) -> Self {
        RepairBody {
            inner: None,
            read: (!bytes.is_empty()).then_some(bytes),
            rest: None,
            trailers,
        }
    }

    /// The part of a body already read, then the rest of it.
    pub(crate) fn resume(read: Bytes, rest: Pin<Box<B>>) -> Self {
        RepairBody {
            inner: None,
            read: (!read.is_empty()).then_some(read),
            rest: Some(rest),
            trailers: None,
        }
    }

    /// Whether the layer read this body whole (and validated it, unless it was not an
    /// answer it could judge).
    pub fn is_read(&self) -> bool {
        self.inner.is_none() && self.rest.is_none()
    }
}

impl<B> std::fmt::Debug for RepairBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepairBody")
            .field("read", &self.read.as_ref().map(Bytes::len))
            .field("passing", &(self.inner.is_some() || self.rest.is_some()))
            .finish_non_exhaustive()
    }
}

impl<B> Body for RepairBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        if let Some(inner) = this.inner.as_pin_mut() {
            return inner.poll_frame(cx);
        }
        if let Some(bytes) = this.read.take() {
            return Poll::Ready(Some(Ok(Frame::data(bytes))));
        }
        if let Some(rest) = this.rest.as_mut() {
            return rest.as_mut().poll_frame(cx);
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        if let Some(inner) = &self.inner {
            return inner.is_end_stream();
        }
        self.read.is_none()
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        if let Some(inner) = &self.inner {
            return inner.size_hint();
        }
        let read = self.read.as_ref().map_or(0, |b| b.len() as u64);
        match &self.rest {
            Some(rest) => seawall_core::size_hint_plus(rest.size_hint(), read),
            None => SizeHint::with_exact(read),
        }
    }
}
