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
