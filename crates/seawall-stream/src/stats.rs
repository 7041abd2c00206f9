//! What the layer measured about one response, and the handle users read it through.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use seawall_core::{BodyReport, FinishReason, StreamEnd, StreamTiming};

/// Timings and the end of one response: read it with [`StreamStats::of`] before consuming the
/// body; its body-end facts fill in as the body is read.
///
/// A handle (cloning it counts a reference): the figures live in the response's
/// [`BodyReport`], which the classifier inside this layer already shares (so timing a stream
/// costs no allocation of its own); with no classifier inside, this layer keeps a report of its
/// own for them.
///
/// ```
/// # use seawall_stream::StreamStats;
/// # fn demo<B>(resp: &http::Response<B>) {
/// if let Some(stats) = StreamStats::of(resp) {
///     // ... read the body to its end, then:
///     if stats.hit_length_limit() {
///         // the answer was cut by max_tokens: ask for a continuation
///     }
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct StreamStats {
    // Its stream timing is set: built only by this crate, after setting it.
    report: Arc<BodyReport>,
}

/// The report this layer keeps when no classifier inside gave it one, under a type of its own
/// so that the outer layers, which read `Arc<BodyReport>` for usage, do not take it for the
/// classifier's.
#[derive(Clone)]
pub(crate) struct OwnReport(pub(crate) Arc<BodyReport>);

impl StreamStats {
    /// Records `timing` in `report` and returns the handle to it; gives `report` back when
    /// another stream layer already timed it.
    pub(crate) fn record(
        report: Arc<BodyReport>,
        timing: StreamTiming,
    ) -> Result<Self, Arc<BodyReport>> {
        if report.set_stream_timing(timing) {
            Ok(Self::over(report))
        } else {
            Err(report)
        }
    }

    /// The handle to a report whose stream timing is set.
    pub(crate) fn over(report: Arc<BodyReport>) -> Self {
        StreamStats { report }
    }

    /// The stats a [`StreamTimeoutLayer`](crate::StreamTimeoutLayer) attached to `response`.
    pub fn of<B>(response: &http::Response<B>) -> Option<StreamStats> {
        let ext = response.extensions();
        let timed = |r: &&Arc<BodyReport>| r.stream_timing().is_some();
        let report = ext
            .get::<Arc<BodyReport>>()
            .filter(timed)
            .or_else(|| ext.get::<OwnReport>().map(|own| &own.0).filter(timed))?;
        Some(Self::over(Arc::clone(report)))
    }

    fn timing(&self) -> Option<&StreamTiming> {
        self.report.stream_timing()
    }

    /// Time from the call to the first real content (for a body that is not a stream, to its
    /// first bytes). `None` when the body ended before any content.
    pub fn time_to_first_token(&self) -> Option<Duration> {
        self.timing()?.time_to_first_token()
    }

    /// Mean time per output token after the first, known once the body has ended. It comes from
    /// the classifier's [`BodyReport`] when one is stacked (usage-based), else from this layer's
    /// own count of content events.
    pub fn time_per_output_token(&self) -> Option<Duration> {
        self.timing()?.time_per_output_token()
    }

    /// Why the upstream said the answer finished, once seen. From the [`BodyReport`] when a
    /// classifier is stacked, else from this layer's own reading of the stream.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.report.finish_reason()
    }

    /// Whether the answer stopped at the output token limit (`finish_reason: "length"`,
    /// `stop_reason: "max_tokens"`): the caller may ask for a continuation.
    pub fn hit_length_limit(&self) -> bool {
        matches!(self.finish_reason(), Some(FinishReason::Length))
    }

    /// How the body ended, once it has.
    pub fn end(&self) -> Option<StreamEnd> {
        self.timing()?.end()
    }

    /// Whether the body ended normally (with its finish marker, for a stream).
    pub fn is_complete(&self) -> bool {
        self.end() == Some(StreamEnd::Complete)
    }

    /// Whether the response was a server-sent-events stream.
    pub fn is_streamed(&self) -> bool {
        self.timing().is_some_and(StreamTiming::is_streamed)
    }

    /// The report the figures are kept in (to write the end and pace into).
    pub(crate) fn report(&self) -> &BodyReport {
        &self.report
    }
}

impl fmt::Debug for StreamStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamStats")
            .field("ttft", &self.time_to_first_token())
            .field("streamed", &self.is_streamed())
            .field("finish_reason", &self.finish_reason())
            .field("tpot", &self.time_per_output_token())
            .field("end", &self.end())
            .finish()
    }
}
