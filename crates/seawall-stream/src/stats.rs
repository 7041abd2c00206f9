//! What the layer measured about one response, attached to it.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use seawall_core::{BodyReport, FinishReason};

/// How a timed body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StreamEnd {
    /// The body ended normally (for a stream: with its finish marker).
    Complete,
    /// The body failed after the commit point: an upstream error, a broken connection, or the
    /// end of a stream without its finish marker.
    Interrupted,
    /// The idle timeout or the total deadline cut the body.
    TimedOut,
}

/// Timings and the end of one response, in its extensions as `Arc<StreamStats>`.
///
/// Take the `Arc` before consuming the body; its body-end facts fill in as the body is read.
///
/// ```
/// # use std::sync::Arc;
/// # use seawall_stream::StreamStats;
/// # fn demo<B>(resp: &http::Response<B>) {
/// if let Some(stats) = StreamStats::of(resp) {
///     let stats = Arc::clone(stats);
///     // ... read the body to its end, then:
///     if stats.hit_length_limit() {
///         // the answer was cut by max_tokens: ask for a continuation
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct StreamStats {
    pub(crate) ttft: Option<Duration>,
    pub(crate) streamed: bool,
    pub(crate) report: Option<Arc<BodyReport>>,
    pub(crate) finish_reason: OnceLock<FinishReason>,
    pub(crate) tpot: OnceLock<Duration>,
    pub(crate) end: OnceLock<StreamEnd>,
}

impl StreamStats {
    pub(crate) fn new(
        ttft: Option<Duration>,
        streamed: bool,
        report: Option<Arc<BodyReport>>,
    ) -> Self {
        StreamStats {
            ttft,
            streamed,
            report,
            finish_reason: OnceLock::new(),
            tpot: OnceLock::new(),
            end: OnceLock::new(),
        }
    }

    /// The stats a [`StreamTimeoutLayer`](crate::StreamTimeoutLayer) attached to `response`.
    pub fn of<B>(response: &http::Response<B>) -> Option<&Arc<StreamStats>> {
        response.extensions().get()
    }

    /// Time from the call to the first real content (for a body that is not a stream, to its
    /// first bytes). `None` when the body ended before any content.
    pub fn time_to_first_token(&self) -> Option<Duration> {
        self.ttft
    }

    /// Mean time per output token after the first, known once the body has ended. It comes from
    /// the classifier's [`BodyReport`] when one is stacked (usage-based), else from this layer's
    /// own count of content events.
    pub fn time_per_output_token(&self) -> Option<Duration> {
        self.tpot.get().copied()
    }

    /// Why the upstream said the answer finished, once seen. From the [`BodyReport`] when a
    /// classifier is stacked, else from this layer's own reading of the stream.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.report
            .as_deref()
            .and_then(BodyReport::finish_reason)
            .or_else(|| self.finish_reason.get())
    }

    /// Whether the answer stopped at the output token limit (`finish_reason: "length"`,
    /// `stop_reason: "max_tokens"`): the caller may ask for a continuation.
    pub fn hit_length_limit(&self) -> bool {
        matches!(self.finish_reason(), Some(FinishReason::Length))
    }

    /// How the body ended, once it has.
    pub fn end(&self) -> Option<StreamEnd> {
        self.end.get().copied()
    }

    /// Whether the body ended normally (with its finish marker, for a stream).
    pub fn is_complete(&self) -> bool {
        self.end() == Some(StreamEnd::Complete)
    }

    /// Whether the response was a server-sent-events stream.
    pub fn is_streamed(&self) -> bool {
        self.streamed
    }
}
