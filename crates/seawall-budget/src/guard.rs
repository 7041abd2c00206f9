//! [`BudgetGuard`]: one attempt's reservation, settled exactly once.

use std::fmt;
use std::sync::Arc;

use seawall_core::{
    AdmitGuard, CacheStatus, CallContext, Completion, FailureClass, LlmError, LlmRequest,
    LlmResponse, OnComplete, Outcome, ServiceTier, Usage,
};

use crate::accounting::{AttemptOutcome, Charged, SpendRecord};
use crate::budget::Scope;
use crate::config::Settlement;
use crate::local::KeyList;
use crate::money::Usd;
use crate::price::{Price, Rates};
use crate::state::{Core, ThreadCore};
use crate::store::{Charge, Exceeded, Refusal, Settled, SoftLimitCrossed};
use crate::time::Timestamp;

/// One attempt's reservation. It is settled exactly once: when the response (or its body)
/// ends, when the attempt fails, or, if dropped before either, as a dropped attempt.
///
/// It is the [`OnComplete`] hook the layer attaches to responses, so a streamed body holds
/// its reservation until it ends or is dropped.
pub struct BudgetGuard {
    /// This thread's handle on the layer's core: cloning it writes no shared count.
    core: Arc<ThreadCore>,
    /// Each budget's key; `None` when no budget is keyed.
    keys: Option<KeyList>,
    model: Option<Arc<str>>,
    /// The model's prices; past `long_above` input tokens, its long-context prices apply,
    /// looked up again (kept apart, a guard moves with every response: see `Price::base`).
    price: Rates,
    long_above: Option<u64>,
    /// The service tier the price is of, to find the same price again.
    tier: Option<ServiceTier>,
    reserved: Usd,
    id: u64,
    time: Timestamp,
    /// Read only when a sink records the attempt's duration.
    started: Option<tokio::time::Instant>,
    /// Read only when a sink records the attempt's number.
    attempt: Option<u32>,
    ctx: Option<Arc<CallContext>>,
    armed: bool,
    /// A cache (stacked inside the budget) served the answer: nothing to pay.
    cached: bool,
}

impl fmt::Debug for BudgetGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BudgetGuard")
            .field("model", &self.model)
            .field("reserved", &self.reserved)
            .field("attempt", &self.attempt)
            .field("armed", &self.armed)
            .finish_non_exhaustive()
    }
}

impl BudgetGuard {
    /// An unarmed guard: nothing reserved yet.
    pub(crate) fn new(core: Arc<ThreadCore>, ctx: Option<Arc<CallContext>>) -> BudgetGuard {
        // Both only for a sink's record (the attempt's number is read now: a retry counts the
        // next one into the same context).
        let attempt = core
            .sink
            .as_ref()
            .and(ctx.as_ref())
            .map(|c| c.update(|f| f.attempts.max(1)));
        let started = core.sink.is_some().then(tokio::time::Instant::now);
        BudgetGuard {
            time: core.clock.now(),
            core,
            keys: None,
            model: None,
            price: Price::per_million(Usd::ZERO, Usd::ZERO).base().0,
            long_above: None,
            tier: None,
            reserved: Usd::ZERO,
            id: 0,
            started,
            attempt,
            ctx,
            armed: false,
            cached: false,
        }
    }

    pub(crate) fn set_model(&mut self, model: Option<Arc<str>>) {
        self.model = model;
    }

    pub(crate) fn set_price(&mut self, price: &Price, tier: Option<ServiceTier>) {
        (self.price, self.long_above) = price.base();
        self.tier = tier;
    }

    pub(crate) fn set_reservation(&mut self, keys: Option<KeyList>, amount: Usd) {
        self.keys = keys;
        self.reserved = amount;
        // A fresh id per attempt: what a remote store applies each reservation once by.
        self.id = crate::local::next_id();
    }

    pub(crate) fn model(&self) -> Option<&Arc<str>> {
        self.model.as_ref()
    }

    /// The charge of this attempt at `now`.
    pub(crate) fn charge(&self, now: Timestamp) -> Charge<'_> {
        Charge::with_known_id(
            &self.core.budgets,
            self.keys.as_deref().unwrap_or_default(),
            self.reserved,
            now,
            self.id,
        )
        .of_list(self.core.list)
    }

    pub(crate) fn admission_time(&self) -> Timestamp {
        self.time
    }

    /// The store admitted the reservation: from now on it must be settled.
    pub(crate) fn arm(&mut self) {
        self.armed = true;
    }

    /// Refuses the attempt with `err` (nothing reserved, nothing charged), and records it.
    pub(crate) fn reject(mut self, err: LlmError) -> LlmError {
        self.armed = false;
        if err.class() == FailureClass::BudgetExceeded {
            if let Some(ctx) = &self.ctx {
                ctx.update(|f| f.rejections.push(FailureClass::BudgetExceeded));
            }
        }
        tracing::debug!(
            target: "seawall::budget",
            class = %err.class(),
            model = self.model.as_deref(),
            "seawall budget: attempt refused"
        );
        self.record(
            AttemptOutcome::Failed(err.class()),
            None,
            Usd::ZERO,
            Charged::Nothing,
            Usd::ZERO,
        );
        err
    }

    /// The store refused the reservation.
    pub(crate) fn refuse(self, refusal: Refusal) -> LlmError {
        let err = match refusal {
            Refusal::Exceeded(ex) => exceeded_error(&self.core, &ex, self.time),
            Refusal::Unavailable(why) => LlmError::new(
                FailureClass::SharedStateUnavailable,
                format!("{why}; attempt refused"),
            )
            .with_code("budget_store_unavailable"),
        };
        self.reject(err)
    }

    /// The attempt failed before a response arrived.
    pub(crate) fn fail(mut self, class: FailureClass) {
        self.finish(AttemptOutcome::Failed(class), None);
    }

    /// What `u` costs at the model's prices.
    fn cost(&self, u: &Usage) -> Usd {
        let long = self.long_above.is_some_and(|above| u.input_tokens > above);
        // The table cannot change: the same lookup finds the price the attempt was priced at.
        match long.then(|| self.core.prices.price_of(self.model.as_deref(), self.tier)) {
            Some(Some((price, _))) => price.cost(u),
            _ => self.price.cost(u),
        }
    }

    fn finish(&mut self, outcome: AttemptOutcome, usage: Option<Usage>) {
        if !self.armed {
            return;
        }
        self.armed = false;
        let (cost, charged) = match usage {
            Some(u) => (self.cost(&u), Charged::Usage),
            None => {
                let settlement = match outcome {
                    AttemptOutcome::Ok => Settlement::ChargeEstimate,
                    AttemptOutcome::Dropped => self.core.on_drop,
                    AttemptOutcome::Failed(class) => self.core.settlement_for(class),
                };
                match settlement {
                    Settlement::Release => (Usd::ZERO, Charged::Nothing),
                    Settlement::ChargeEstimate => (self.reserved, Charged::Estimate),
                }
            }
        };
        let now = self.core.clock.now();
        match self.core.store.settle(&self.charge(now), cost) {
            Settled::Ready(crossed) => report_crossings(&self.core, &crossed),
            // A remote store applies the settlement on its own; only its report is awaited,
            // off the caller's path. Without a runtime to wait on, the report is lost (the
            // settlement is not).
            Settled::Pending(report) => match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    let core = self.core.clone();
                    rt.spawn(async move { report_crossings(&core, &report.await) });
                }
                Err(_) => tracing::debug!(
                    target: "seawall::budget",
                    "seawall budget: settled outside a tokio runtime; soft limits not reported"
                ),
            },
        }
        if let Some(ctx) = &self.ctx {
            ctx.update(|f| *f.cost_usd.get_or_insert(0.0) += cost.as_f64());
        }
        tracing::trace!(
            target: "seawall::budget",
            model = self.model.as_deref(),
            outcome = %outcome,
            cost = %cost,
            reserved = %self.reserved,
            "seawall budget: attempt settled"
        );
        self.record(outcome, usage, cost, charged, self.reserved);
    }

    fn record(
        &self,
        outcome: AttemptOutcome,
        usage: Option<Usage>,
        cost: Usd,
        charged: Charged,
        reserved: Usd,
    ) {
        let Some(sink) = &self.core.sink else {
            return;
        };
        let mut keys: Vec<(Arc<str>, Arc<str>)> = Vec::new();
        for (budget, key) in self
            .core
            .budgets
            .iter()
            .zip(self.keys.iter().flat_map(|k| k.iter()))
        {
            let scope: &str = match budget.scope() {
                Scope::Global => continue,
                Scope::Model => "model",
                Scope::Key(s) => s,
            };
            if let Some(key) = key {
                if !keys.iter().any(|(s, _)| &**s == scope) {
                    keys.push((scope.into(), key.clone()));
                }
            }
        }
        sink.record(SpendRecord {
            time: self.time,
            keys,
            model: self.model.clone(),
            service_tier: self.tier,
            seconds: self.started.map_or(0.0, |s| s.elapsed().as_secs_f64()),
            input_tokens: usage.map(|u| u.input_tokens),
            output_tokens: usage.map(|u| u.output_tokens),
            cached_input_tokens: usage.map(|u| u.cached_input_tokens),
            cache_write_input_tokens: usage.map(|u| u.cache_write_input_tokens),
            cache_write_1h_input_tokens: usage.map(|u| u.cache_write_1h_input_tokens),
            cost_usd: cost.as_f64(),
            cost_nanos: cost.as_nanos(),
            reserved_nanos: reserved.as_nanos(),
            attempt: self.attempt,
            outcome,
            charged,
        });
    }
}

impl AdmitGuard for BudgetGuard {
    /// Admitted: from now on the reservation is settled however the call ends.
    fn before_call<Req: LlmRequest>(&mut self, _: &mut Req) {
        self.arm();
    }

    /// A cache's answer was billed by no provider: it settles at no cost.
    fn at_head<T: LlmResponse>(&mut self, resp: &mut T) {
        self.cached = CacheStatus::served(resp);
    }

    fn failed(self, err: &LlmError) {
        self.fail(err.class());
    }
}

impl OnComplete for BudgetGuard {
    fn on_complete(mut self, completion: Completion<'_>) {
        let outcome = match completion.outcome {
            Outcome::Complete => AttemptOutcome::Ok,
            Outcome::Failed(Some(e)) => AttemptOutcome::Failed(e.class()),
            // A body error that is not an `LlmError`: the stream broke after the head.
            Outcome::Failed(None) => AttemptOutcome::Failed(FailureClass::StreamInterrupted),
            Outcome::Dropped => AttemptOutcome::Dropped,
        };
        let usage = if self.cached {
            Some(Usage::default())
        } else {
            completion.usage
        };
        self.finish(outcome, usage);
    }
}

impl Drop for BudgetGuard {
    // `finish` disarms the guard, so after `reject`, `fail` or the body-end hook this does
    // nothing: an attempt is settled exactly once. Reached armed, the attempt was dropped before
    // anyone settled it (the caller went away), and its reservation is settled as `on_drop`
    // says instead of being held against the budget forever.
    fn drop(&mut self) {
        self.finish(AttemptOutcome::Dropped, None);
    }
}

/// Logs each soft threshold crossed and calls the layer's callback.
fn report_crossings(core: &Core, crossed: &[SoftLimitCrossed]) {
    for c in crossed {
        tracing::warn!(
            target: "seawall::budget",
            budget = %c.budget,
            key = c.key.as_deref(),
            spent = %c.spent,
            threshold = %c.threshold,
            limit = %c.limit,
            "seawall budget: soft limit reached"
        );
        if let Some(f) = &core.on_soft {
            f(c);
        }
    }
}

fn exceeded_error(core: &Core, ex: &Exceeded, now: Timestamp) -> LlmError {
    let key = match &ex.key {
        Some(k) => format!(" for {k:?}"),
        None => String::new(),
    };
    let mut err = LlmError::new(
        FailureClass::BudgetExceeded,
        format!(
            "budget {:?}{key} would be exceeded: spent {} + reserved {} + this attempt {} > limit {}",
            &*ex.budget, ex.spend.spent, ex.spend.reserved, ex.requested, ex.spend.limit
        ),
    )
    .with_code("budget_exceeded");
    // A reset only helps an attempt that fits the limit at all.
    let fits = ex.requested <= ex.spend.limit;
    let resets = core
        .budgets
        .iter()
        .find(|b| *b.name_arc() == ex.budget)
        .and_then(|b| b.window().period_end(now));
    if let Some(end) = resets.filter(|_| fits) {
        err = err.with_retry_after(end.saturating_duration_since(now));
    }
    err
}
