//! [`CostBudget`], the service the layer makes: prices each attempt and reserves its worst-case
//! cost against every budget before any money can be spent on it.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use seawall_core::{FailureClass, KeyFn, LlmError, LlmRequest, LlmResponse, RequestSizes};
use tower_service::Service;

use crate::budget::Scope;
use crate::config::MissingMaxOutput;
use crate::future::ResponseFuture;
use crate::guard::BudgetGuard;
use crate::keys::NoKeys;
use crate::price::PriceTable;
use crate::state::{Bound, Core, ThreadCore};
use crate::store::Admission;

/// Checks every attempt against the budgets before calling the inner service, and settles it
/// when the response ends. Made by [`CostBudgetLayer`](crate::CostBudgetLayer).
///
/// The inner service must be `Clone`: when a remote [`BudgetStore`](crate::BudgetStore)
/// decides asynchronously, the service that was made ready is moved into the response future
/// and called from there, and a clone takes its place.
pub struct CostBudget<S, K> {
    inner: S,
    /// The layer's core and key function as this thread's services share them (see
    /// [`Bound`]): cloning the service, as the retry layer does on every call, writes only
    /// this thread's count.
    bound: Arc<Bound<K>>,
}

impl<S> CostBudget<S, NoKeys> {
    /// Wraps `inner` with `prices` and the defaults, as
    /// [`CostBudgetLayer::new`](crate::CostBudgetLayer::new) does: no budgets yet (only the
    /// pricing and the maximum-output rule apply) and counters of its own. Build a layer to add
    /// budgets or share the counters.
    pub fn new(inner: S, prices: PriceTable) -> Self {
        tower_layer::Layer::layer(&crate::CostBudgetLayer::new(prices), inner)
    }
}

impl<S, K> CostBudget<S, K> {
    pub(crate) fn from_parts(inner: S, core: Arc<Core>, keys: Arc<K>) -> Self {
        CostBudget {
            inner,
            bound: Arc::new(Bound::new(core, keys)),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K> Clone for CostBudget<S, K> {
    fn clone(&self) -> Self {
        CostBudget {
            inner: self.inner.clone(),
            bound: self.bound.clone(),
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for CostBudget<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CostBudget")
            .field("inner", &self.inner)
            .field("budget", &self.bound.core)
            .finish_non_exhaustive()
    }
}

impl<S, K, Req> Service<Req> for CostBudget<S, K>
where
    S: Service<Req> + Clone,
    S::Response: LlmResponse,
    S::Error: Into<LlmError>,
    Req: LlmRequest,
    K: KeyFn<Req>,
{
    type Response = <S::Response as LlmResponse>::Hooked<BudgetGuard>;
    type Error = LlmError;
    type Future = ResponseFuture<S::Future, S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.bound.is_local() {
            // Made ready on another thread than the last time (or than the layer): bind here
            // once, so this thread's calls write no count another thread writes.
            self.bound = Arc::new(self.bound.on_this_thread());
        }
        // Budget refusals come from `call`: a readiness error is fatal to tower's `Buffer`.
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let sizes = req.prepared().sizes;
        // Past the caller's deadline nothing is reserved or spent: the answer would come too
        // late to be read. One extension lookup, and a clock read only when a deadline is set.
        if let Some(Err(e)) = req.deadline().map(|d| d.check()) {
            return ResponseFuture::refused(e);
        }
        let bound = &*self.bound;
        let guard = match price_attempt(&bound.core, &*bound.keys, &mut req, &sizes) {
            Ok(g) => g,
            Err(e) => return ResponseFuture::refused(e),
        };
        let admission = bound
            .core
            .store
            .reserve(&guard.charge(guard.admission_time()));
        match admission {
            Admission::Ready(Ok(())) => ResponseFuture::call(&mut self.inner, req, guard),
            Admission::Ready(Err(refused)) => ResponseFuture::refused(guard.refuse(refused)),
            Admission::Pending(admission) => {
                // The guard goes with the store's decision: armed once admitted (before the
                // call), or turned into the refusal. Dropped undecided, it holds nothing.
                let decided = Box::pin(async move {
                    match admission.await {
                        Ok(()) => Ok(guard),
                        Err(refused) => Err(guard.refuse(refused)),
                    }
                });
                // Call later, on the service that was made ready; keep a clone here.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::admitting(decided, inner, req)
            }
        }
    }
}

/// Prices the attempt (`sizes`: the request's, as `prepared` read them) and prepares its
/// reservation (not yet made).
fn price_attempt<Req, K>(
    core: &Arc<ThreadCore>,
    keys: &K,
    req: &mut Req,
    sizes: &RequestSizes,
) -> Result<BudgetGuard, LlmError>
where
    Req: LlmRequest,
    K: KeyFn<Req>,
{
    let mut guard = BudgetGuard::new(core.clone(), req.call_context().cloned());
    // The request's shared copy of the name (an HTTP request's `prepare` made it, from a
    // per-thread cache): no allocation.
    guard.set_model(req.model_shared());
    let model = guard.model().map(|m| &**m);
    // Looked up only when some tier has prices of its own.
    let tier = core
        .prices
        .has_tiers()
        .then(|| req.service_tier())
        .flatten();
    let Some((price, tier)) = core.prices.price_of(model, tier) else {
        let msg = match model {
            Some(m) => format!(
                "no price for model {m:?}: add it to the price table, or give the table a default price"
            ),
            None => "the request names no model and the price table has no default price".into(),
        };
        let err = LlmError::new(FailureClass::BudgetExceeded, msg).with_code("unpriced_model");
        return Err(guard.reject(err));
    };
    guard.set_price(&price, tier);
    let max_output = match (sizes.max_output_tokens, core.missing_max) {
        (Some(n), _) => n,
        (None, MissingMaxOutput::Default(n)) => {
            if let Err(e) = req.set_max_output_tokens(n) {
                return Err(guard.reject(e));
            }
            n
        }
        (None, MissingMaxOutput::Reject) => {
            let err = LlmError::new(
                FailureClass::BudgetExceeded,
                "the request sets no maximum output tokens, so its cost has no upper bound: \
                 set max_tokens, or give the budget a default (MissingMaxOutput::Default)",
            )
            .with_code("max_output_tokens_required");
            return Err(guard.reject(err));
        }
    };
    // Every answer (`n`, `best_of`) may use the whole maximum.
    let output = u64::from(max_output).saturating_mul(u64::from(sizes.choices.max(1)));
    let input = sizes.input_tokens(&core.parts);
    let input = u128::from(input) * u128::from(100 + core.input_margin_percent);
    let input = u64::try_from(input.div_ceil(100)).unwrap_or(u64::MAX);
    let amount = price.estimate(input, output);
    let keys = if core.keyed {
        // Each budget's key, borrowed where the key function lends it, then this thread's
        // shared copy of the list (see `local`): no allocation once the list was seen.
        let model = guard.model().map_or(&*core.unkeyed, |m| &**m);
        let key = |b: &crate::Budget| match b.scope() {
            Scope::Global => None,
            Scope::Model => Some(Cow::Borrowed(model)),
            Scope::Key(scope) => Some(
                keys.scoped_key(scope, req)
                    .unwrap_or(Cow::Borrowed(&*core.unkeyed)),
            ),
        };
        const INLINE: usize = 4;
        if core.budgets.len() <= INLINE {
            let mut lines: [Option<Cow<'_, str>>; INLINE] = Default::default();
            for (line, b) in lines.iter_mut().zip(core.budgets.iter()) {
                *line = key(b);
            }
            Some(crate::local::keys(&lines[..core.budgets.len()]))
        } else {
            let lines: Vec<_> = core.budgets.iter().map(key).collect();
            Some(crate::local::keys(&lines))
        }
    } else {
        None
    };
    guard.set_reservation(keys, amount);
    Ok(guard)
}
