//! The permit an admitted call holds until its response ends, and what its end reports back.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use std::time::Duration;

use seawall_core::{
    AdmitGuard, CacheStatus, Completion, FailureClass, LlmError, LlmRequest, LlmResponse,
    OnComplete, Outcome, RateLimitSnapshot, Usage,
};

use tokio::time::Instant;

use super::{LocalShared, Shared};
use crate::error::QueueWait;
use crate::future::note_admitted;
use crate::key::{Cost, KeyState};
use crate::lanes::Lane;

impl Shared {
    /// Counts an admission and hands out its permit, which holds the gate through `handle`.
    pub(super) fn admit(
        handle: &Arc<LocalShared>,
        key: Arc<KeyState>,
        cost: Cost,
        lane: Lane,
    ) -> GatePermit {
        let this: &Shared = handle;
        this.admitted.add(1);
        GatePermit {
            held: Some(Held {
                shared: handle.clone(),
                key,
                cost,
                lane,
                epoch: this.epoch.load(Ordering::Acquire),
                // A clock read only when auto-sizing measures how long permits are held.
                since: this.sizer.as_ref().map(|_| Instant::now()),
            }),
            wait: Duration::ZERO,
            cached: false,
        }
    }
}

struct Held {
    shared: Arc<LocalShared>,
    key: Arc<KeyState>,
    cost: Cost,
    lane: Lane,
    epoch: u64,
    since: Option<Instant>,
}

impl Held {
    fn failed(&self, err: &LlmError) {
        self.shared.autosize_limits(err.rate_limit());
        if let Some(d) = super::signals::pause_hint(err) {
            self.shared.pause(&self.key, d);
        }
        if matches!(
            err.class(),
            FailureClass::RateLimited | FailureClass::Overloaded
        ) {
            self.shared.congestion(self.epoch);
        }
    }
}

/// A gate permit, held by a response until its body ends or is dropped.
///
/// It is the [`OnComplete`] hook the gate attaches to every response: when it fires (or is
/// dropped) it gives the permit back, settles the token reservation against the reported usage,
/// and feeds the adaptive mode. It appears in the gate's response type
/// (`<S::Response as LlmResponse>::Hooked<GatePermit>`).
pub struct GatePermit {
    held: Option<Held>,
    /// How long the call waited in the gate for it.
    pub(crate) wait: Duration,
    /// A cache (stacked inside the gate) served the answer: no provider tokens were used, and
    /// its time says nothing of the upstream's.
    cached: bool,
}

impl fmt::Debug for GatePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatePermit")
            .field("held", &self.held.is_some())
            .field("key", &self.held.as_ref().and_then(|h| h.key.name()))
            .finish()
    }
}

impl GatePermit {
    fn finish(&mut self, f: impl FnOnce(&Held)) {
        if let Some(h) = self.held.take() {
            f(&h);
            h.shared.release(h.lane);
        }
    }

}

impl AdmitGuard for GatePermit {
    /// Notes the queue time in the request, its context and the tracing span.
    fn before_call<Req: LlmRequest>(&mut self, req: &mut Req) {
        note_admitted(req, self.wait);
    }

    /// Reads the response head (a `remaining = 0` snapshot pauses the key until its reset;
    /// a cache's hit uses no tokens) and puts the queue time in the response's extensions.
    fn at_head<T: LlmResponse>(&mut self, resp: &mut T) {
        self.cached = CacheStatus::served(resp);
        if let Some(h) = &self.held {
            let snapshot = resp.rate_limit();
            h.shared.autosize_limits(snapshot);
            if let Some(d) = snapshot.and_then(RateLimitSnapshot::exhausted_until) {
                h.shared.pause(&h.key, d);
            }
        }
        if let Some(ext) = resp.extensions_mut() {
            seawall_core::reserve_extensions(ext);
            ext.insert(QueueWait(self.wait));
        }
    }

    /// The inner service failed: the output tokens were never produced.
    fn failed(mut self, err: &LlmError) {
        self.finish(|h| {
            h.settle(None);
            h.failed(err);
        });
    }
}

impl Held {
    /// Settles the token reservation against the reported usage. Without usage (a call
    /// dropped before its head, a body dropped or ended without a usage report) the output
    /// part goes back and the input estimate stays charged, as for a failure: keeping a
    /// `max_tokens` of billions charged would lock the key for good after one disconnect.
    fn settle(&self, usage: Option<seawall_core::Usage>) {
        self.key
            .settle_tokens(self.cost.tokens, self.cost.used(usage));
    }
}

impl OnComplete for GatePermit {
    fn on_complete(mut self, c: Completion<'_>) {
        if self.cached {
            self.finish(|h| h.settle(Some(Usage::default())));
            return;
        }
        self.finish(|h| {
            h.settle(c.usage);
            match c.outcome {
                Outcome::Complete => {
                    h.shared.autosize_completed(h.since, c.usage);
                    h.shared.success();
                }
                Outcome::Failed(Some(e)) => h.failed(e),
                Outcome::Failed(None) | Outcome::Dropped => {}
            }
        });
    }
}

impl Drop for GatePermit {
    // `finish` takes what the permit holds, so after the body-end hook this does nothing. A
    // permit dropped unfired (the future or the body dropped) still goes back to the pool, and
    // its tokens settle as if only the prompt was used.
    fn drop(&mut self) {
        self.finish(|h| h.settle(None));
    }
}
