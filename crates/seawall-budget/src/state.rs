//! What the services of one [`CostBudgetLayer`](crate::CostBudgetLayer) share at run time:
//! the prices, the budgets, the store and the settlement rules, behind one `Arc`.

use std::fmt;
use std::sync::Arc;

use seawall_core::{FailureClass, PartEstimate};

use crate::accounting::AccountingSink;
use crate::budget::Budget;
use crate::config::{MissingMaxOutput, Settlement, default_settlement};
use crate::price::PriceTable;
use crate::store::{BudgetStore, SoftLimitCrossed};
use crate::time::Clock;

pub(crate) type SoftFn = dyn Fn(&SoftLimitCrossed) + Send + Sync;

/// Everything the services of one layer share.
pub(crate) struct Core {
    pub(crate) prices: PriceTable,
    pub(crate) budgets: Box<[Budget]>,
    /// A number for `budgets` no other list of this process has, so that a lease recognises
    /// them without comparing each budget.
    pub(crate) list: u64,
    pub(crate) keyed: bool,
    pub(crate) store: Arc<dyn BudgetStore>,
    pub(crate) sink: Option<Arc<dyn AccountingSink>>,
    pub(crate) on_soft: Option<Arc<SoftFn>>,
    pub(crate) missing_max: MissingMaxOutput,
    pub(crate) input_margin_percent: u32,
    pub(crate) parts: PartEstimate,
    pub(crate) overrides: Vec<(FailureClass, Settlement)>,
    pub(crate) on_drop: Settlement,
    pub(crate) clock: Clock,
    pub(crate) unkeyed: Arc<str>,
}

impl Core {
    pub(crate) fn settlement_for(&self, class: FailureClass) -> Settlement {
        self.overrides
            .iter()
            .rev()
            .find(|(c, _)| *c == class)
            .map_or_else(|| default_settlement(class), |(_, s)| *s)
    }
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CostBudget")
            .field("models", &self.prices.len())
            .field("budgets", &self.budgets)
            .field("missing_max", &self.missing_max)
            .field("input_margin_percent", &self.input_margin_percent)
            .field("parts", &self.parts)
            .field("on_drop", &self.on_drop)
            .field("sink", &self.sink.is_some())
            .finish_non_exhaustive()
    }
}

/// The key under which a keyed budget counts requests for which no key was found.
pub const UNKEYED: &str = "(none)";

/// One thread's handle on a layer's [`Core`]: what an attempt's guard clones.
///
/// Every attempt's guard keeps the core until the attempt settles, and the retry layer clones
/// the budget service on every call. Cloning the layer's one `Arc<Core>` for each would write
/// its count, a cache line every thread calling through the layer writes, twice per call per
/// clone. The services of one thread share a handle of their own instead (see [`Bound`]), so
/// those counts are written by one thread only; the core's count is written once per thread.
pub(crate) struct ThreadCore(Arc<Core>);

impl std::ops::Deref for ThreadCore {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.0
    }
}

impl fmt::Debug for ThreadCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What a budget service holds: the core and key function, bound to the thread that last made
/// it ready. Clones of a service share it; a service made ready on another thread binds a new
/// one there (once), so the counts a call writes are its own thread's.
pub(crate) struct Bound<K> {
    pub(crate) core: Arc<ThreadCore>,
    pub(crate) keys: Arc<K>,
    thread: usize,
}

impl<K> Bound<K> {
    pub(crate) fn new(core: Arc<Core>, keys: Arc<K>) -> Self {
        Bound {
            core: Arc::new(ThreadCore(core)),
            keys,
            thread: seawall_core::thread_tag(),
        }
    }

    /// The same core and keys, bound to the running thread.
    pub(crate) fn on_this_thread(&self) -> Self {
        Bound::new(self.core.0.clone(), self.keys.clone())
    }

    /// Whether it was bound on the running thread.
    #[inline]
    pub(crate) fn is_local(&self) -> bool {
        self.thread == seawall_core::thread_tag()
    }
}
