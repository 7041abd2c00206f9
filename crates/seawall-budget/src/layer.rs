//! [`CostBudgetLayer`] and its [`CostBudgetBuilder`]: the budget's configuration.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use seawall_core::{ConfigError, FailureClass, PartEstimate};
use tower_layer::Layer;

use crate::accounting::AccountingSink;
use crate::budget::{Budget, Scope};
use crate::config::{MissingMaxOutput, Settlement};
use crate::keys::NoKeys;
use crate::price::PriceTable;
use crate::service::CostBudget;
use crate::state::{Core, SoftFn, UNKEYED};
use crate::store::{BudgetStore, MemoryStore, SoftLimitCrossed, Spend, SpendFuture};
use crate::time::{Clock, Timestamp, WallFn};

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
    /// A layer with these prices and the defaults: no budgets (add them with the
    /// [builder](Self::builder)), requests without a maximum output refused, counters in a
    /// [`MemoryStore`] of its own.
    pub fn new(prices: PriceTable) -> Self {
        Self::builder(prices).assemble(false)
    }

    /// Starts a builder with these prices: the price table is the one setting without a
    /// default, so it is the argument of both `new` and `builder`.
    pub fn builder(prices: PriceTable) -> CostBudgetBuilder<NoKeys> {
        CostBudgetBuilder {
            settings: Settings {
                prices,
                budgets: Vec::new(),
                store: None,
                sink: None,
                on_soft: None,
                missing_max: MissingMaxOutput::Reject,
                input_margin_percent: 0,
                parts: PartEstimate::DEFAULT,
                overrides: Vec::new(),
                on_drop: Settlement::ChargeEstimate,
                wall: None,
            },
            keys: NoKeys,
            keys_set: false,
        }
    }
}

impl<K> CostBudgetLayer<K> {
    /// The counter of the budget named `budget` for `key` (`None` for a global budget), now;
    /// `None` if the layer has no such budget. A remote store answers what this replica last
    /// saw without waiting; [`CostBudgetLayer::read_spend`] asks the store itself.
    pub fn spend(&self, budget: &str, key: Option<&str>) -> Option<Spend> {
        let (b, key) = self.counter(budget, key)?;
        Some(self.core.store.spend(b, key, self.core.clock.now()))
    }

    /// The counter of the budget named `budget` for `key`, read from the store's source of
    /// truth: the same as [`CostBudgetLayer::spend`] for the in-process store, one round trip
    /// for a remote one (whose `spend` is only what this replica last saw). `None` if the
    /// layer has no such budget.
    pub fn read_spend(&self, budget: &str, key: Option<&str>) -> Option<SpendFuture> {
        let (b, key) = self.counter(budget, key)?;
        Some(self.core.store.read(b, key, self.core.clock.now()))
    }

    /// The budget named `budget` and the key its counter for `key` is kept under.
    fn counter<'a>(
        &'a self,
        budget: &str,
        key: Option<&'a str>,
    ) -> Option<(&'a Budget, Option<&'a str>)> {
        let b = self.core.budgets.iter().find(|b| b.name() == budget)?;
        let key = match b.scope() {
            Scope::Global => None,
            _ => Some(key.unwrap_or(UNKEYED)),
        };
        Some((b, key))
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
        CostBudget::from_parts(inner, self.core.clone(), self.keys.clone())
    }
}

/// Configures a [`CostBudgetLayer`].
pub struct CostBudgetBuilder<K = NoKeys> {
    settings: Settings,
    keys: K,
    keys_set: bool,
}

/// Every setting but the key function, whose type the builder changes.
struct Settings {
    prices: PriceTable,
    budgets: Vec<Budget>,
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

impl<K> fmt::Debug for CostBudgetBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CostBudgetBuilder")
            .field("models", &self.settings.prices.len())
            .field("budgets", &self.settings.budgets)
            .field("missing_max", &self.settings.missing_max)
            .finish_non_exhaustive()
    }
}

impl<K> CostBudgetBuilder<K> {
    /// Adds a budget. Every attempt is checked against all of them at once.
    pub fn budget(mut self, budget: Budget) -> Self {
        self.settings.budgets.push(budget);
        self
    }

    /// Sets the [`KeyFn`](seawall_core::KeyFn) that reads the keys of [`Budget::per_key`]
    /// budgets from a request: one key function gives every scope the same key, a
    /// [`ScopeKeys`](crate::ScopeKeys) has a key function per scope. It returns the key
    /// (`"acme"`), or `None`, which counts the request under [`UNKEYED`].
    ///
    /// Keys appear in errors, events and spend records: return an identifier, never a secret
    /// (use [`fingerprint`](crate::fingerprint) to key by API key).
    pub fn keys<F>(self, keys: F) -> CostBudgetBuilder<F> {
        CostBudgetBuilder {
            settings: self.settings,
            keys,
            keys_set: true,
        }
    }

    /// Keeps the counters in `store` (default: a new [`MemoryStore`] for this layer). Pass
    /// the same `Arc` to several layers to share their budgets; give the layers of several
    /// replicas a store in Redis (`seawall-redis`'s `RedisBudgetStore`) to share them across a
    /// fleet.
    pub fn store(mut self, store: impl BudgetStore) -> Self {
        self.settings.store = Some(Arc::new(store));
        self
    }

    /// Sends one [`SpendRecord`](crate::SpendRecord) per attempt to `sink`.
    pub fn sink(mut self, sink: impl AccountingSink) -> Self {
        self.settings.sink = Some(Arc::new(sink));
        self
    }

    /// Calls `f` when a budget's settled spend reaches its soft threshold (once per window
    /// and key), besides the `tracing` warning that is always logged.
    pub fn on_soft_limit(mut self, f: impl Fn(&SoftLimitCrossed) + Send + Sync + 'static) -> Self {
        self.settings.on_soft = Some(Arc::new(f));
        self
    }

    /// What to do with requests that set no maximum output tokens (default: reject).
    pub fn missing_max_output(mut self, policy: MissingMaxOutput) -> Self {
        self.settings.missing_max = policy;
        self
    }

    /// Reserves for `percent` more input tokens than the request estimates (default 0).
    ///
    /// Output is bounded exactly by the maximum output tokens, but the input estimate
    /// (characters / 4 for HTTP JSON requests) can be low for code or non-Latin text; an
    /// attempt that costs more than its reservation is still charged in full, so the margin
    /// is what keeps concurrent under-estimates from pushing spend over the limit.
    pub fn input_margin_percent(mut self, percent: u32) -> Self {
        self.settings.input_margin_percent = percent;
        self
    }

    /// The input tokens reserved for each image, audio part and file of a request (default
    /// [`PartEstimate::DEFAULT`], whose documentation says how its figures were chosen).
    ///
    /// A request's text is estimated from its characters; its non-text parts cannot be (a
    /// base64 image is not prose), so each is reserved at this estimate, and the margin of
    /// [`CostBudgetBuilder::input_margin_percent`] applies to them too.
    pub fn part_estimate(mut self, parts: PartEstimate) -> Self {
        self.settings.parts = parts;
        self
    }

    /// Overrides what a failed attempt of `class` that reported no usage is charged (see
    /// [`default_settlement`](crate::default_settlement)).
    pub fn on_failure(mut self, class: FailureClass, settlement: Settlement) -> Self {
        self.settings.overrides.push((class, settlement));
        self
    }

    /// What an attempt is charged when the caller drops the call while it is in flight, or
    /// drops a body before its end, without usage reported (default: the estimate, since the
    /// upstream keeps generating and billing).
    pub fn on_drop(mut self, settlement: Settlement) -> Self {
        self.settings.on_drop = settlement;
        self
    }

    /// Where the layer reads the UTC time (default: [`SystemTime::now`]).
    ///
    /// The clock is read at every admission and settlement, so calendar windows roll when
    /// this clock crosses their boundary, whatever happened in between: a suspended host, a
    /// clock set right after start-up. Pass a function to control the time in tests.
    pub fn wall_clock(mut self, now: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.settings.wall = Some(Arc::new(now));
        self
    }

    /// A wall clock that reads `origin` now and then advances with tokio's clock, so tests on
    /// paused time can place a calendar boundary exactly (see [`CostBudgetBuilder::wall_clock`]).
    pub fn wall_clock_origin(mut self, origin: SystemTime) -> Self {
        self.settings.wall = Some(Clock::from_origin(origin));
        self
    }

    /// Checks the configuration and builds the layer.
    pub fn build(self) -> Result<CostBudgetLayer<K>, ConfigError> {
        let keyed = self.check()?;
        Ok(self.assemble(keyed))
    }

    /// Refuses a configuration the layer cannot enforce; says whether any budget is keyed.
    fn check(&self) -> Result<bool, ConfigError> {
        let mut keyed = false;
        for (i, b) in self.settings.budgets.iter().enumerate() {
            b.validate()?;
            if self.settings.budgets[..i]
                .iter()
                .any(|o| o.name() == b.name())
            {
                return Err(ConfigError::new(
                    "budget",
                    format!("two budgets are named {:?}; names must be unique", b.name()),
                ));
            }
            match b.scope() {
                Scope::Global => {}
                Scope::Model => keyed = true,
                Scope::Key(scope) => {
                    keyed = true;
                    if !self.keys_set {
                        return Err(ConfigError::new(
                            "keys",
                            format!(
                                "budget {:?} is kept per {scope:?}, but no key function was set \
                                 (CostBudgetBuilder::keys)",
                                b.name()
                            ),
                        ));
                    }
                }
            }
        }
        if let MissingMaxOutput::Default(0) = self.settings.missing_max {
            return Err(ConfigError::new(
                "missing_max_output",
                "the default max output tokens must be more than zero",
            ));
        }
        if self.settings.input_margin_percent > 1000 {
            return Err(ConfigError::new(
                "input_margin_percent",
                format!(
                    "{}% is not plausible (at most 1000%)",
                    self.settings.input_margin_percent
                ),
            ));
        }
        Ok(keyed)
    }

    /// The layer of a checked configuration (or of the defaults, which need no check).
    fn assemble(self, keyed: bool) -> CostBudgetLayer<K> {
        let s = self.settings;
        CostBudgetLayer {
            core: Arc::new(Core {
                prices: s.prices,
                budgets: s.budgets.into_boxed_slice(),
                list: crate::local::next_id(),
                keyed,
                store: s.store.unwrap_or_else(|| Arc::new(MemoryStore::new())),
                sink: s.sink,
                on_soft: s.on_soft,
                missing_max: s.missing_max,
                input_margin_percent: s.input_margin_percent,
                parts: s.parts,
                overrides: s.overrides,
                on_drop: s.on_drop,
                clock: Clock::new(s.wall),
                unkeyed: UNKEYED.into(),
            }),
            keys: Arc::new(self.keys),
        }
    }
}
