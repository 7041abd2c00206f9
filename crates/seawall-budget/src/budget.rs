//! What a budget is: a limit, over a window, for everyone or per key.

use std::sync::Arc;
use std::time::Duration;

use crate::money::Usd;
use crate::time::{NANOS_PER_SEC, Timestamp};
use seawall_core::ConfigError;

/// A UTC calendar period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    /// From the top of each hour.
    Hour,
    /// From midnight UTC.
    Day,
    /// From the first of each month, midnight UTC.
    Month,
}

/// Over which span of time a budget's spend is summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Window {
    /// Everything ever spent through this layer (or its store).
    Total,
    /// The last `Duration`, kept in [`Window::ROLLING_BUCKETS`] sub-windows. Spend leaves the
    /// window between `duration` and `duration × (1 + 1/60)` after it was settled, never
    /// earlier, so the window can only over-count.
    Rolling(Duration),
    /// The current UTC calendar period: resets at its boundary.
    Calendar(Period),
}

impl Window {
    /// The number of sub-windows of a rolling window.
    pub const ROLLING_BUCKETS: u64 = 60;

    /// The calendar period `now` is in (hours, days or months since the epoch), for
    /// calendar windows; 0 for the others.
    pub fn period_index(&self, now: Timestamp) -> u64 {
        let secs = now.as_unix_nanos() / NANOS_PER_SEC;
        match self {
            Window::Calendar(Period::Hour) => secs / 3600,
            Window::Calendar(Period::Day) => secs / 86_400,
            Window::Calendar(Period::Month) => {
                let t = now.utc();
                (t.year() as u64) * 12 + u64::from(u8::from(t.month())) - 1
            }
            Window::Total | Window::Rolling(_) => 0,
        }
    }

    /// When the calendar period that holds `now` ends; `None` for other windows.
    pub fn period_end(&self, now: Timestamp) -> Option<Timestamp> {
        let secs = now.as_unix_nanos() / NANOS_PER_SEC;
        let end = match self {
            Window::Calendar(Period::Hour) => (secs / 3600 + 1) * 3600,
            Window::Calendar(Period::Day) => (secs / 86_400 + 1) * 86_400,
            Window::Calendar(Period::Month) => {
                let t = now.utc();
                let (year, month) = match t.month() {
                    time::Month::December => (t.year() + 1, time::Month::January),
                    m => (t.year(), m.next()),
                };
                let first = time::Date::from_calendar_date(year, month, 1).ok()?;
                first.midnight().assume_utc().unix_timestamp() as u64
            }
            Window::Total | Window::Rolling(_) => return None,
        };
        Some(Timestamp::from_unix_secs(end))
    }

    /// The width of one sub-window of a rolling window, in nanoseconds (at least 1).
    pub fn bucket_nanos(&self) -> u64 {
        match self {
            Window::Rolling(d) => {
                (u64::try_from(d.as_nanos()).unwrap_or(u64::MAX) / Self::ROLLING_BUCKETS).max(1)
            }
            _ => u64::MAX,
        }
    }

    /// The index of the rolling sub-window that holds `now`; 0 for other windows.
    pub fn bucket_index(&self, now: Timestamp) -> u64 {
        match self {
            Window::Rolling(_) => now.as_unix_nanos() / self.bucket_nanos(),
            _ => 0,
        }
    }
}

/// Whose spend a budget counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every call through the layer, together.
    Global,
    /// Each model apart (the request's model name).
    Model,
    /// Each value of a named key apart (`"tenant"`, `"user"`, `"api_key"`): the layer's key
    /// function ([`CostBudgetBuilder::keys`](crate::CostBudgetBuilder::keys)) reads the value from the request.
    Key(Arc<str>),
}

/// A spending limit over a window, for everyone or per key, with an optional soft threshold.
///
/// ```
/// use std::time::Duration;
/// use seawall_budget::{Budget, Usd};
///
/// let monthly = Budget::monthly("team", Usd::from_dollars(500)).soft_limit_percent(80);
/// let burst = Budget::rolling("burst", Usd::from_dollars(20), Duration::from_secs(3600));
/// let per_tenant = Budget::daily("tenant-daily", Usd::from_dollars(5)).per_key("tenant");
/// assert_eq!(monthly.soft_limit(), Some(Usd::from_dollars(400)));
/// # let _ = (burst, per_tenant);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Budget {
    name: Arc<str>,
    limit: Usd,
    window: Window,
    scope: Scope,
    soft_percent: Option<u32>,
}

/// Equal names, by pointer first (see [`Budget::same_as`]).
fn same_name(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

impl Budget {
    /// `==`, with the names compared by pointer first. The store compares an attempt's
    /// budgets with those its lease was taken for on every reservation and settlement, where
    /// they are clones of the same budgets whose names share one allocation: comparing the
    /// text each time (as `==` does) was a tenth of the layer's own cost.
    pub(crate) fn same_as(&self, other: &Budget) -> bool {
        // Destructured, so that a field added later cannot be left out here.
        let Budget {
            name,
            limit,
            window,
            scope,
            soft_percent,
        } = self;
        let scope = match (scope, &other.scope) {
            (Scope::Key(a), Scope::Key(b)) => same_name(a, b),
            (a, b) => a == b,
        };
        scope
            && same_name(name, &other.name)
            && *limit == other.limit
            && *window == other.window
            && *soft_percent == other.soft_percent
    }

    /// A global budget of `limit` over `window`. The name identifies the budget's counters
    /// in the store, in errors and in events; it must be unique within a layer.
    pub fn new(name: &str, limit: Usd, window: Window) -> Budget {
        Budget {
            name: name.into(),
            limit,
            window,
            scope: Scope::Global,
            soft_percent: None,
        }
    }

    /// A limit on everything ever spent.
    pub fn total(name: &str, limit: Usd) -> Budget {
        Budget::new(name, limit, Window::Total)
    }

    /// A limit per UTC clock hour.
    pub fn hourly(name: &str, limit: Usd) -> Budget {
        Budget::new(name, limit, Window::Calendar(Period::Hour))
    }

    /// A limit per UTC day.
    pub fn daily(name: &str, limit: Usd) -> Budget {
        Budget::new(name, limit, Window::Calendar(Period::Day))
    }

    /// A limit per UTC calendar month.
    pub fn monthly(name: &str, limit: Usd) -> Budget {
        Budget::new(name, limit, Window::Calendar(Period::Month))
    }

    /// A limit over the last `window` (a rolling window, at least one second long).
    pub fn rolling(name: &str, limit: Usd, window: Duration) -> Budget {
        Budget::new(name, limit, Window::Rolling(window))
    }

    /// Counts each model apart.
    pub fn per_model(mut self) -> Budget {
        self.scope = Scope::Model;
        self
    }

    /// Counts each value of the key named `scope` apart (read by the layer's key function).
    pub fn per_key(mut self, scope: &str) -> Budget {
        self.scope = Scope::Key(scope.into());
        self
    }

    /// Fires the layer's soft-limit callback and a `tracing` warning once per window (per
    /// key) when settled spend reaches `percent` of the limit (1 to 100).
    pub fn soft_limit_percent(mut self, percent: u32) -> Budget {
        self.soft_percent = Some(percent);
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The shared name.
    pub fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    /// The limit.
    pub fn limit(&self) -> Usd {
        self.limit
    }

    /// The window.
    pub fn window(&self) -> Window {
        self.window
    }

    /// Whose spend it counts.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The soft threshold, as an amount.
    pub fn soft_limit(&self) -> Option<Usd> {
        self.soft_percent.map(|p| self.limit.percent(p))
    }

    /// This budget with `1 / parts` of its limit (rounded down; `parts` 0 counts as 1), same
    /// name, window, scope and soft threshold: the share one of `parts` replicas enforces on
    /// its own while the store they share cannot be reached.
    pub fn share(&self, parts: u32) -> Budget {
        let mut b = self.clone();
        b.limit = Usd::from_nanos(self.limit.as_nanos() / u64::from(parts.max(1)));
        b
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let name = &self.name;
        if name.is_empty() {
            return Err(ConfigError::new("budget", "a budget needs a name"));
        }
        if let Window::Rolling(d) = self.window {
            if d < Duration::from_secs(1) {
                return Err(ConfigError::new(
                    "budget",
                    format!("{name:?}: a rolling window must be at least one second, not {d:?}"),
                ));
            }
        }
        if let Some(p) = self.soft_percent {
            if !(1..=100).contains(&p) {
                return Err(ConfigError::new(
                    "budget",
                    format!("{name:?}: the soft limit must be 1 to 100 percent, not {p}"),
                ));
            }
        }
        if let Scope::Key(k) = &self.scope {
            if k.is_empty() {
                return Err(ConfigError::new(
                    "budget",
                    format!("{name:?}: the key scope needs a name"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_as_is_equality_whether_names_share_an_allocation_or_not() {
        let usd = Usd::from_dollars;
        let budgets = [
            Budget::daily("d", usd(5)),
            Budget::daily("d", usd(6)),
            Budget::monthly("d", usd(5)),
            Budget::daily("e", usd(5)),
            Budget::daily("d", usd(5)).per_model(),
            Budget::daily("d", usd(5)).per_key("tenant"),
            Budget::daily("d", usd(5)).per_key("user"),
            Budget::daily("d", usd(5)).soft_limit_percent(80),
        ];
        for a in &budgets {
            // A clone shares the names' allocations; a rebuilt budget does not.
            assert!(a.same_as(&a.clone()));
            for b in &budgets {
                let rebuilt = Budget {
                    name: Arc::from(&*b.name),
                    scope: match &b.scope {
                        Scope::Key(k) => Scope::Key(Arc::from(&**k)),
                        other => other.clone(),
                    },
                    ..b.clone()
                };
                assert_eq!(a.same_as(b), a == b, "{a:?} / {b:?}");
                assert_eq!(a.same_as(&rebuilt), a == b, "{a:?} / {b:?} rebuilt");
            }
        }
    }

    fn at(s: &str) -> Timestamp {
        Timestamp::parse_rfc3339(s).unwrap()
    }

    #[test]
    fn calendar_boundaries() {
        let month = Window::Calendar(Period::Month);
        let jan = at("2024-01-31T23:59:59.999Z");
        let feb = at("2024-02-01T00:00:00Z");
        assert_eq!(month.period_index(jan) + 1, month.period_index(feb));
        assert_eq!(month.period_end(jan), Some(feb));
        assert_eq!(
            month.period_end(at("2024-02-29T10:00:00Z")),
            Some(at("2024-03-01T00:00:00Z"))
        );
        assert_eq!(
            month.period_end(at("2024-12-15T00:00:00Z")),
            Some(at("2025-01-01T00:00:00Z"))
        );
        let day = Window::Calendar(Period::Day);
        assert_eq!(
            day.period_end(at("2024-02-28T13:00:00Z")),
            Some(at("2024-02-29T00:00:00Z"))
        );
        let hour = Window::Calendar(Period::Hour);
        assert_eq!(
            hour.period_end(at("2024-02-28T13:59:00Z")),
            Some(at("2024-02-28T14:00:00Z"))
        );
        assert_eq!(Window::Total.period_end(jan), None);
        assert_eq!(
            Window::Rolling(Duration::from_secs(3600)).bucket_nanos(),
            60 * NANOS_PER_SEC
        );
    }

    #[test]
    fn bad_budgets_are_refused() {
        let one = Usd::from_dollars(1);
        for (b, needle) in [
            (Budget::total("", one), "name"),
            (
                Budget::rolling("r", one, Duration::from_millis(10)),
                "at least one second",
            ),
            (Budget::total("s", one).soft_limit_percent(0), "1 to 100"),
            (Budget::total("s", one).soft_limit_percent(101), "1 to 100"),
            (Budget::total("k", one).per_key(""), "key scope"),
        ] {
            let err = b.validate().unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
    }
}
