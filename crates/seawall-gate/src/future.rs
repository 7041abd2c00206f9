//! The gate's response future, and what it notes in the request and its context: the
//! queue time of an admitted call, or the rejection of a refused one.

use std::time::Duration;

use seawall_core::{AdmitFuture, CallContext, FailureClass, LlmRequest};

use crate::error::QueueWait;
use crate::shared::GatePermit;

/// The response future of [`ConcurrencyGate`](crate::ConcurrencyGate): waits in the gate's
/// queue if it must, calls the inner service, and attaches the [`GatePermit`] to the response.
///
/// Dropping it at any point gives back whatever it holds: its queue place, its key's line,
/// its permit.
pub type ResponseFuture<S, Req, F> = AdmitFuture<S, Req, F, GatePermit>;

pub(crate) fn note_admitted<Req: LlmRequest>(req: &mut Req, wait: Duration) {
    if let Some(cx) = req.call_context() {
        cx.update(|f| *f.queue_wait.get_or_insert(Duration::ZERO) += wait);
    }
    if let Some(ext) = req.extensions_mut() {
        ext.insert(QueueWait(wait));
    }
    if wait.is_zero() {
        tracing::trace!(target: "seawall::gate", queue_wait_ms = 0.0, "seawall gate: admitted");
    } else {
        let ms = wait.as_secs_f64() * 1e3;
        tracing::Span::current().record("queue_wait_ms", ms);
        tracing::debug!(target: "seawall::gate", queue_wait_ms = ms, "seawall gate: admitted after waiting");
    }
}

/// Records a rejection (and the time waited before it) in the call context.
pub(crate) fn note_rejected(cx: Option<&CallContext>, wait: Duration) {
    if let Some(cx) = cx {
        cx.update(|f| {
            *f.queue_wait.get_or_insert(Duration::ZERO) += wait;
            f.rejections.push(FailureClass::GateRejected);
        });
    }
}
