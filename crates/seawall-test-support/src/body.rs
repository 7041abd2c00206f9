//! A response body a test feeds frame by frame, to hold a stream open, fail it mid-way or end
//! it exactly when the test decides.

use std::any::Any;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use seawall_core::{BodyReport, LlmError};
use tokio::sync::mpsc;

/// The sending end of a [`ChanBody`]: each message is one frame, or the error that ends the
/// body. Dropping it ends the body.
pub type Feed = mpsc::UnboundedSender<Result<Frame<Bytes>, LlmError>>;

/// A body that is empty, or fed from a channel; it may hold a guard (a test's "call still
/// live" counter) until it is dropped.
pub struct ChanBody {
    rx: Option<mpsc::UnboundedReceiver<Result<Frame<Bytes>, LlmError>>>,
    guard: Option<Box<dyn Any + Send + Sync>>,
    content: Option<Arc<BodyReport>>,
}

impl ChanBody {
    /// A body that has ended before it starts.
    pub fn empty() -> Self {
        ChanBody {
            rx: None,
            guard: None,
            content: None,
        }
    }

    /// A body and the feed that sends its frames.
    pub fn channel() -> (Feed, Self) {
        let (tx, rx) = mpsc::unbounded_channel();
        let body = ChanBody {
            rx: Some(rx),
            guard: None,
            content: None,
        };
        (tx, body)
    }

    /// Records each data frame holding `"CONTENT"` as content in `report`: a stand-in for the
    /// classifier, for tests of the layers that read the report.
    pub fn recording_content(mut self, report: Arc<BodyReport>) -> Self {
        self.content = Some(report);
        self
    }

    /// Keeps `guard` alive as long as the body.
    pub fn holding(mut self, guard: impl Any + Send + Sync) -> Self {
        self.guard = Some(Box::new(guard));
        self
    }
}

impl fmt::Debug for ChanBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChanBody")
            .field("fed", &self.rx.is_some())
            .field("guarded", &self.guard.is_some())
            .finish()
    }
}

impl Body for ChanBody {
    type Data = Bytes;
    type Error = LlmError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, LlmError>>> {
        let this = self.get_mut();
        let Some(rx) = &mut this.rx else {
            return Poll::Ready(None);
        };
        let polled = rx.poll_recv(cx);
        if let (Poll::Ready(Some(Ok(f))), Some(r)) = (&polled, &this.content) {
            if f.data_ref()
                .is_some_and(|d| d.windows(7).any(|w| w == b"CONTENT"))
            {
                r.record_content();
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.rx.is_none()
    }
}

/// Reads a body to its end: the text received and the error it ended with, if any (what a
/// caller of a stack sees of a streamed answer).
pub async fn drain<B>(mut body: B) -> (String, Option<LlmError>)
where
    B: Body<Data = Bytes, Error = LlmError> + Unpin,
{
    let mut text = Vec::new();
    let mut error = None;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    text.extend_from_slice(&data);
                }
            }
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    (String::from_utf8_lossy(&text).into_owned(), error)
}

/// A body of given chunks, each one frame, that knows how many bytes it has left (as a body
/// with a `content-length` does: its size hint is exact).
#[derive(Debug, Clone, Default)]
pub struct Chunks(pub std::collections::VecDeque<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = LlmError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, LlmError>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.0.iter().map(|b| b.len() as u64).sum())
    }
}
