//! UTC timestamps for windows and records, and the wall clock that makes them.
//!
//! Calendar windows (an hour, a day, a month, in UTC) must roll when the wall clock says so.
//! Adding monotonic time to one reading taken at start-up does not do that: the monotonic
//! clock stops while the host is suspended, so the windows fall behind by the length of
//! every suspend, and a wall clock that was wrong at start-up (not yet synchronised) stays
//! wrong for the life of the layer. So the layer reads the wall clock every time it needs
//! the time: at each admission and each settlement, the only moments a window may roll.
//! The clock is a plain function, so a test can jump it forward or correct it.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub(crate) const NANOS_PER_SEC: u64 = 1_000_000_000;

/// A UTC instant, in nanoseconds since the Unix epoch (1970-01-01T00:00:00Z).
///
/// Budget windows and spend records use it. It serializes as an RFC 3339 string
/// (`"2025-01-31T23:00:00.000Z"`).
///
/// ```
/// use seawall_budget::Timestamp;
/// let t = Timestamp::parse_rfc3339("2024-02-29T12:30:00Z").unwrap();
/// assert_eq!(t.to_string(), "2024-02-29T12:30:00.000Z");
/// assert_eq!(t.as_unix_nanos() % 1_000_000_000, 0);
/// assert!(Timestamp::parse_rfc3339("2024-02-30T00:00:00Z").is_none());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// 1970-01-01T00:00:00Z.
    pub const UNIX_EPOCH: Timestamp = Timestamp(0);

    /// From nanoseconds since the epoch.
    pub const fn from_unix_nanos(nanos: u64) -> Timestamp {
        Timestamp(nanos)
    }

    /// From whole seconds since the epoch (saturating).
    pub const fn from_unix_secs(secs: u64) -> Timestamp {
        Timestamp(secs.saturating_mul(NANOS_PER_SEC))
    }

    /// From a `SystemTime`; times before the epoch become the epoch, times after 2554 saturate.
    pub fn from_system_time(t: SystemTime) -> Timestamp {
        let since = t
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Nanoseconds since the epoch.
    pub const fn as_unix_nanos(self) -> u64 {
        self.0
    }

    /// Milliseconds since the epoch.
    pub const fn as_unix_millis(self) -> u64 {
        self.0 / 1_000_000
    }

    /// `self + d`, saturating.
    pub fn saturating_add(self, d: Duration) -> Timestamp {
        Timestamp(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }

    /// `self - earlier`, or zero if `earlier` is later.
    pub const fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// The UTC calendar date and time.
    pub(crate) fn utc(self) -> time::OffsetDateTime {
        // A u64 of nanoseconds since the epoch is always within `time`'s range.
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(self.0))
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
    }

    /// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`. Returns `None` for anything else,
    /// an impossible date, or an instant before the epoch.
    pub fn parse_rfc3339(s: &str) -> Option<Timestamp> {
        let t =
            time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
        u64::try_from(t.unix_timestamp_nanos()).ok().map(Timestamp)
    }
}

impl fmt::Display for Timestamp {
    /// RFC 3339 in UTC, with milliseconds (nanoseconds when the instant has them).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.utc();
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.",
            c.year(),
            u8::from(c.month()),
            c.day(),
            c.hour(),
            c.minute(),
            c.second()
        )?;
        let nanos = c.nanosecond();
        if nanos % 1_000_000 == 0 {
            write!(f, "{:03}Z", nanos / 1_000_000)
        } else {
            write!(f, "{nanos:09}Z")
        }
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Timestamp::parse_rfc3339(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("{s:?} is not an RFC 3339 time")))
    }
}

/// A source of wall-clock time.
pub(crate) type WallFn = dyn Fn() -> SystemTime + Send + Sync;

/// The layer's wall clock: the system clock, or a function given to the builder.
#[derive(Clone)]
pub(crate) struct Clock(Option<Arc<WallFn>>);

impl Clock {
    /// Reads `wall` (the system clock if `None`) each time the layer needs the time.
    pub(crate) fn new(wall: Option<Arc<WallFn>>) -> Clock {
        Clock(wall)
    }

    /// A clock that reads `origin` now and then advances with tokio's clock.
    pub(crate) fn from_origin(origin: SystemTime) -> Arc<WallFn> {
        let start = tokio::time::Instant::now();
        Arc::new(move || origin.checked_add(start.elapsed()).unwrap_or(origin))
    }

    /// The time now, read from the wall clock.
    pub(crate) fn now(&self) -> Timestamp {
        Timestamp::from_system_time(self.0.as_ref().map_or_else(SystemTime::now, |f| f()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        let leap = Timestamp::from_unix_secs(19_782 * 86_400);
        assert_eq!(leap.to_string(), "2024-02-29T00:00:00.000Z");
        let t = Timestamp::parse_rfc3339("2025-12-31T23:59:59.5+01:00").unwrap();
        assert_eq!(t.to_string(), "2025-12-31T22:59:59.500Z");
        let t = Timestamp::parse_rfc3339("1999-12-31t23:00:00.000000001-02:30").unwrap();
        assert_eq!(t.to_string(), "2000-01-01T01:30:00.000000001Z");
    }

    #[test]
    fn bad_times_are_none() {
        for s in [
            "",
            "2025-13-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2025-01-01T24:00:00Z",
            "2025-01-01T00:00:00",
            "2025-01-01T00:00:00.Z",
            "2025-01-01T00:00:00+0100",
            "1969-12-31T23:59:59Z",
            "2025-01-01T00:00:00ZZ",
            "２０２５-01-01T00:00:00Z",
        ] {
            assert_eq!(Timestamp::parse_rfc3339(s), None, "{s}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn clock_follows_paused_time() {
        let origin = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let c = Clock::new(Some(Clock::from_origin(origin)));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(c.now(), Timestamp::from_unix_secs(1_005));
    }

    proptest::proptest! {
        #[test]
        fn display_parses_back(n in 0u64..10_000_000_000_000_000_000) {
            let t = Timestamp::from_unix_nanos(n);
            proptest::prop_assert_eq!(Timestamp::parse_rfc3339(&t.to_string()), Some(t));
        }
    }
}
