//! The fleet permit an admitted call holds until its response ends, and what its end does:
//! settle the tokens, give the permit back, and publish any pause the upstream asked for.

use std::fmt;
use std::sync::Arc;

use seawall_core::{
    AdmitGuard, CacheStatus, Completion, LlmError, LlmResponse, OnComplete, Outcome,
    RateLimitSnapshot, Usage,
};
use seawall_gate::Cost;

use super::keys::Target;
use super::state::Fleet;

/// A call's admission under the fleet's limits, held by its response until the body ends or
/// is dropped.
///
/// It is the [`OnComplete`] hook the layer attaches to every response (as the gate's
/// `GatePermit` is): when it fires, or is dropped unfired, it ends the call's hold in Redis
/// in the background, giving back unused tokens or charging an overrun as debt (one script
/// call), which frees the fleet permit. A call admitted by the in-process share while Redis
/// was unreachable gives its local permit back and settles locally instead.
pub struct FleetPermit {
    held: Option<Held>,
    /// A cache (stacked inside) served the answer: no provider tokens were used.
    cached: bool,
}

struct Held {
    fleet: Arc<Fleet>,
    target: Arc<Target>,
    cost: Cost,
    /// The hold id in Redis; `None` for an admission by the in-process share.
    id: Option<Arc<str>>,
}

impl fmt::Debug for FleetPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self.held.as_ref();
        f.debug_struct("FleetPermit")
            .field("held", &held.is_some())
            .field("key", &held.and_then(|h| h.target.name.as_deref()))
            .field("shared", &held.is_some_and(|h| h.id.is_some()))
            .finish()
    }
}

impl FleetPermit {
    pub(crate) fn fleet(fleet: Arc<Fleet>, target: Arc<Target>, cost: Cost, id: Arc<str>) -> Self {
        FleetPermit {
            held: Some(Held {
                fleet,
                target,
                cost,
                id: Some(id),
            }),
            cached: false,
        }
    }

    pub(crate) fn local(fleet: Arc<Fleet>, target: Arc<Target>, cost: Cost) -> Self {
        FleetPermit {
            held: Some(Held {
                fleet,
                target,
                cost,
                id: None,
            }),
            cached: false,
        }
    }

    /// Whether the fleet admitted the call (rather than the in-process share).
    pub fn is_shared(&self) -> bool {
        self.held.as_ref().is_some_and(|h| h.id.is_some())
    }

    /// Ends the call once: settles against `usage` and gives the permit back.
    fn finish(&mut self, usage: Option<Usage>) {
        if let Some(h) = self.held.take() {
            let used = h.cost.used(usage);
            match h.id {
                Some(id) => h.fleet.settle(h.target, id, h.cost, used, false),
                None => {
                    let now = h.fleet.clock.now_ms();
                    h.fleet.local.release(&h.target, h.cost, used, now);
                }
            }
        }
    }

    fn saw_error(&self, err: &LlmError) {
        let Some(h) = &self.held else { return };
        if let Some(d) = seawall_gate::pause_hint(err) {
            h.fleet.pause(&h.target, d);
        }
    }
}

impl AdmitGuard for FleetPermit {
    /// Reads a response head: a `remaining = 0` snapshot pauses the key fleet-wide until
    /// its reset; a cache's hit uses no tokens.
    fn at_head<T: LlmResponse>(&mut self, resp: &mut T) {
        self.cached = CacheStatus::served(resp);
        if let Some(h) = &self.held {
            if let Some(d) = resp
                .rate_limit()
                .and_then(RateLimitSnapshot::exhausted_until)
            {
                h.fleet.pause(&h.target, d);
            }
        }
    }

    /// The call failed: a 429's hint (or an exhausted window's reset) pauses the key
    /// fleet-wide; the output tokens were never produced.
    fn failed(mut self, err: &LlmError) {
        self.saw_error(err);
        self.finish(None);
    }
}

impl OnComplete for FleetPermit {
    fn on_complete(mut self, c: Completion<'_>) {
        if let Outcome::Failed(Some(e)) = c.outcome {
            self.saw_error(e);
        }
        let usage = if self.cached {
            Some(Usage::default())
        } else {
            c.usage
        };
        self.finish(usage);
    }
}

impl Drop for FleetPermit {
    // `finish` takes what the permit holds, so after the body-end hook this does nothing. A
    // permit dropped unfired (the future or the body dropped) still ends its hold, settling
    // as if only the prompt was used.
    fn drop(&mut self) {
        self.finish(None);
    }
}
