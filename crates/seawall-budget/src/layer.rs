//! [`CostBudgetLayer`], its [`Builder`], and the choices a user can make.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use seawall_core::{FailureClass, PartEstimate};
use tower_layer::Layer;

use crate::accounting::AccountingSink;
use crate::budget::{Budget, Scope};
use crate::error::ConfigError;
use crate::keys::NoKeys;
use crate::price::PriceTable;
use crate::service::CostBudget;
use crate::store::{BudgetStore, MemoryStore, SoftLimitCrossed, Spend};
use crate::time::{Clock, Timestamp, WallFn};

/// What to do with a request that does not say how many tokens it may produce.
///
/// Without a maximum the cost of an attempt has no upper bound, so nothing can be reserved.
/// A maximum that bounds nothing (negative, not a number) counts as none; see
/// [`RequestMeta::parse`](seawall_core::RequestMeta::parse) for the values that are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingMaxOutput {
    /// Refuse it with `BudgetExceeded` (code `max_output_tokens_required`). The default: the
    /// layer does not change what a request asks for unless told to.
    #[default]
    Reject,
    /// Write this maximum into the request (`LlmRequest::set_max_output_tokens`) and reserve
    /// for it.
    Default(u32),
}

/// What an attempt that reported no usage is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Nothing: the reservation is released.
    Release,
    /// The reservation (the estimate, an upper bound of what it may have cost).
    ChargeEstimate,
}

/// The default settlement of a failed attempt that reported no usage.
///
/// Charged the estimate: the outcomes after which the upstream may have done, and billed,
/// the work: our attempt timeout (`Timeout`), `UpstreamTimeout` (504), `Disconnected` (lost
/// after sending) and `StreamInterrupted` (content had begun). Released: everything else,
/// which fails before the upstream bills: connection failures, 4xx, 429, 5xx rejections,
/// and local rejections by inner layers. A dropped call or body is charged the estimate too
/// (see [`Builder::on_drop`]).
pub const fn default_settlement(class: FailureClass) -> Settlement {
    match class {
        FailureClass::Timeout
        | FailureClass::UpstreamTimeout
        | FailureClass::Disconnected
        | FailureClass::StreamInterrupted => Settlement::ChargeEstimate,
        _ => Settlement::Release,
    }
}

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

/// A tower layer that prices every attempt before it goes out, reserves its worst-case cost
/// against every budget it falls under, refuses it with `BudgetExceeded` if any budget would
/// be crossed, and settles the reservation against the usage the response reports.
///
/// Build it with [`CostBudgetLayer::builder`]. Every service the layer makes shares one set
/// of counters; clones of the layer do too.
///
/// ```
/// use seawall_budget::{Budget, CostBudgetLayer, MissingMaxOutput, Price, PriceTable, Usd};
///
/// let prices = PriceTable::new()
///     .with("gpt-4o-mini", Price::per_million_f64(0.15, 0.60).unwrap());
/// let layer = CostBudgetLayer::builder(prices)
///     .budget(Budget::monthly("monthly", Usd::from_dollars(100)).soft_limit_percent(80))
///     .budget(Budget::hourly("per-model-hourly", Usd::from_dollars(5)).per_model())
///     .missing_max_output(MissingMaxOutput::Default(1024))
///     .build()
///     .unwrap();
/// assert_eq!(layer.spend("monthly", None).unwrap().remaining(), Usd::from_dollars(100));
/// ```
pub struct CostBudgetLayer<K = NoKeys> {
    core: Arc<Core>,
    keys: Arc<K>,
}

impl CostBudgetLayer<NoKeys> {
    /// Starts a layer with these prices.
    pub fn builder(prices: PriceTable) -> Builder<NoKeys> {
        Builder {
            prices,
            budgets: Vec::new(),
            keys: NoKeys,
            keys_set: false,
            store: None,
            sink: None,
            on_soft: None,
            missing_max: MissingMaxOutput::Reject,
            input_margin_percent: 0,
            parts: PartEstimate::DEFAULT,
            overrides: Vec::new(),
            on_drop: Settlement::ChargeEstimate,
            wall: None,
        }
    }
}

impl<K> CostBudgetLayer<K> {
    /// The counter of the budget named `budget` for `key` (`None` for a global budget), now;
    /// `None` if the layer has no such budget.
    pub fn spend(&self, budget: &str, key: Option<&str>) -> Option<Spend> {
        let b = self.core.budgets.iter().find(|b| b.name() == budget)?;
        let key = match b.scope() {
            Scope::Global => None,
            _ => Some(key.unwrap_or(UNKEYED)),
        };
        Some(self.core.store.spend(b, key, self.core.clock.now()))
    }

    /// The budgets, in the order they are checked.
    pub fn budgets(&self) -> &[Budget] {
        &self.core.budgets
    }

    /// The price table.
    pub fn prices(&self) -> &PriceTable {
        &self.core.prices
    }

    /// The layer's clock, in UTC.
    pub fn now(&self) -> Timestamp {
        self.core.clock.now()
    }
}

impl<K> Clone for CostBudgetLayer<K> {
    fn clone(&self) -> Self {
        CostBudgetLayer {
            core: self.core.clone(),
            keys: self.keys.clone(),
        }
    }
}

impl<K> fmt::Debug for CostBudgetLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CostBudgetLayer")
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

impl<S, K> Layer<S> for CostBudgetLayer<K> {
    type Service = CostBudget<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        CostBudget::new(inner, self.core.clone(), self.keys.clone())
    }
}

/// Configures a [`CostBudgetLayer`].
pub struct Builder<K = NoKeys> {
    prices: PriceTable,
    budgets: Vec<Budget>,
    keys: K,
    keys_set: bool,
    store: Option<Arc<dyn BudgetStore>>,
    sink: Option<Arc<dyn AccountingSink>>,
    on_soft: Option<Arc<SoftFn>>,
    missing_max: MissingMaxOutput,
    input_margin_percent: u32,
    parts: PartEstimate,
    overrides: Vec<(FailureClass, Settlement)>,
    on_drop: Settlement,
    wall: Option<Arc<WallFn>>,
}

impl<K> fmt::Debug for Builder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("models", &self.prices.len())
            .field("budgets", &self.budgets)
            .field("missing_max", &self.missing_max)
            .finish_non_exhaustive()
    }
}

impl<K> Builder<K> {
    /// Adds a budget. Every attempt is checked against all of them at once.
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budgets.push(budget);
        self
    }

    /// Sets the [`KeyFn`](seawall_core::KeyFn) that reads the keys of [`Budget::per_key`]
    /// budgets from a request: one key function gives every scope the same key, a
    /// [`ScopeKeys`](crate::ScopeKeys) has a key function per scope. It returns the key
    /// (`"acme"`), or `None`, which counts the request under [`UNKEYED`].
    ///
    /// Keys appear in errors, events and spend records: return an identifier, never a secret
    /// (use [`fingerprint`](crate::fingerprint) to key by API key).
    pub fn keys<F>(self, keys: F) -> Builder<F> {
        Builder {
            prices: self.prices,
            budgets: self.budgets,
            keys,
            keys_set: true,
            store: self.store,
            sink: self.sink,
            on_soft: self.on_soft,
            missing_max: self.missing_max,
            input_margin_percent: self.input_margin_percent,
            parts: self.parts,
            overrides: self.overrides,
            on_drop: self.on_drop,
            wall: self.wall,
        }
    }

    /// Keeps the counters in `store` (default: a new [`MemoryStore`] for this layer). Pass
    /// the same `Arc` to several layers to share their budgets.
    pub fn store(mut self, store: impl BudgetStore) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// Sends one [`SpendRecord`](crate::SpendRecord) per attempt to `sink`.
    pub fn sink(mut self, sink: impl AccountingSink) -> Self {
        self.sink = Some(Arc::new(sink));
        self
    }

    /// Calls `f` when a budget's settled spend reaches its soft threshold (once per window
    /// and key), besides the `tracing` warning that is always logged.
    pub fn on_soft_limit(mut self, f: impl Fn(&SoftLimitCrossed) + Send + Sync + 'static) -> Self {
        self.on_soft = Some(Arc::new(f));
        self
    }

    /// What to do with requests that set no maximum output tokens (default: reject).
    pub fn missing_max_output(mut self, policy: MissingMaxOutput) -> Self {
        self.missing_max = policy;
        self
    }

    /// Reserves for `percent` more input tokens than the request estimates (default 0).
    ///
    /// Output is bounded exactly by the maximum output tokens, but the input estimate
    /// (characters / 4 for HTTP JSON requests) can be low for code or non-Latin text; an
    /// attempt that costs more than its reservation is still charged in full, so the margin
    /// is what keeps concurrent under-estimates from pushing spend over the limit.
    pub fn input_margin_percent(mut self, percent: u32) -> Self {
        self.input_margin_percent = percent;
        self
    }

    /// The input tokens reserved for each image, audio part and file of a request (default
    /// [`PartEstimate::DEFAULT`], whose documentation says how its figures were chosen).
    ///
    /// A request's text is estimated from its characters; its non-text parts cannot be (a
    /// base64 image is not prose), so each is reserved at this estimate, and the margin of
    /// [`Builder::input_margin_percent`] applies to them too.
    pub fn part_estimate(mut self, parts: PartEstimate) -> Self {
        self.parts = parts;
        self
    }

    /// Overrides what a failed attempt of `class` that reported no usage is charged (see
    /// [`default_settlement`]).
    pub fn on_failure(mut self, class: FailureClass, settlement: Settlement) -> Self {
        self.overrides.push((class, settlement));
        self
    }

    /// What an attempt is charged when the caller drops the call while it is in flight, or
    /// drops a body before its end, without usage reported (default: the estimate, since the
    /// upstream keeps generating and billing).
    pub fn on_drop(mut self, settlement: Settlement) -> Self {
        self.on_drop = settlement;
        self
    }

    /// Where the layer reads the UTC time (default: [`SystemTime::now`]).
    ///
    /// The clock is read at every admission and settlement, so calendar windows roll when
    /// this clock crosses their boundary, whatever happened in between: a suspended host, a
    /// clock set right after start-up. Pass a function to control the time in tests.
    pub fn wall_clock(mut self, now: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.wall = Some(Arc::new(now));
        self
    }

    /// A wall clock that reads `origin` now and then advances with tokio's clock, so tests on
    /// paused time can place a calendar boundary exactly (see [`Builder::wall_clock`]).
    pub fn wall_clock_origin(mut self, origin: SystemTime) -> Self {
        self.wall = Some(Clock::from_origin(origin));
        self
    }

    /// Checks the configuration and builds the layer.
    pub fn build(self) -> Result<CostBudgetLayer<K>, ConfigError> {
        let mut keyed = false;
        for (i, b) in self.budgets.iter().enumerate() {
            b.validate()?;
            if self.budgets[..i].iter().any(|o| o.name() == b.name()) {
                return Err(ConfigError::new(format!(
                    "two budgets are named {:?}; names must be unique",
                    b.name()
                )));
            }
            match b.scope() {
                Scope::Global => {}
                Scope::Model => keyed = true,
                Scope::Key(scope) => {
                    keyed = true;
                    if !self.keys_set {
                        return Err(ConfigError::new(format!(
                            "budget {:?} is kept per {scope:?}, but no key function was set \
                             (Builder::keys)",
                            b.name()
                        )));
                    }
                }
            }
        }
        if let MissingMaxOutput::Default(0) = self.missing_max {
            return Err(ConfigError::new(
                "the default max output tokens must be more than zero",
            ));
        }
        if self.input_margin_percent > 1000 {
            return Err(ConfigError::new(format!(
                "an input margin of {}% is not plausible (at most 1000%)",
                self.input_margin_percent
            )));
        }
        let store = self.store.unwrap_or_else(|| Arc::new(MemoryStore::new()));
        Ok(CostBudgetLayer {
            core: Arc::new(Core {
                prices: self.prices,
                budgets: self.budgets.into_boxed_slice(),
                keyed,
                store,
                sink: self.sink,
                on_soft: self.on_soft,
                missing_max: self.missing_max,
                input_margin_percent: self.input_margin_percent,
                parts: self.parts,
                overrides: self.overrides,
                on_drop: self.on_drop,
                clock: Clock::new(self.wall),
                unkeyed: UNKEYED.into(),
            }),
            keys: Arc::new(self.keys),
        })
    }
}
