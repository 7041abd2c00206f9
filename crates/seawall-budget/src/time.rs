//! UTC timestamps for windows and records, and the clock that makes them on tokio's time.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub(crate) const NANOS_PER_SEC: u64 = 1_000_000_000;
const SECS_PER_DAY: u64 = 86_400;

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
    pub(crate) fn civil(self) -> Civil {
        let secs = self.0 / NANOS_PER_SEC;
        let (year, month, day) = civil_from_days((secs / SECS_PER_DAY) as i64);
        let sod = secs % SECS_PER_DAY;
        Civil {
            year,
            month,
            day,
            hour: (sod / 3600) as u32,
            minute: (sod / 60 % 60) as u32,
            second: (sod % 60) as u32,
            nanos: (self.0 % NANOS_PER_SEC) as u32,
        }
    }

    /// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`. Returns `None` for anything else,
    /// an impossible date, or an instant before the epoch.
    pub fn parse_rfc3339(s: &str) -> Option<Timestamp> {
        let b = s.as_bytes();
        if b.len() < 20 || !s.is_ascii() {
            return None;
        }
        let num = |r: std::ops::Range<usize>| -> Option<u32> {
            let part = &s[r];
            part.bytes()
                .all(|c| c.is_ascii_digit())
                .then(|| part.parse().ok())?
        };
        let (year, month, day) = (num(0..4)? as i64, num(5..7)?, num(8..10)?);
        let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
        if b[4] != b'-'
            || b[7] != b'-'
            || !matches!(b[10], b'T' | b't' | b' ')
            || b[13] != b':'
            || b[16] != b':'
        {
            return None;
        }
        if !(1..=12).contains(&month)
            || day == 0
            || day > days_in_month(year, month)
            || hour > 23
            || minute > 59
            || second > 59
        {
            return None;
        }
        let mut rest = &s[19..];
        let mut nanos: u64 = 0;
        if let Some(frac) = rest.strip_prefix('.') {
            let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 || digits > 9 {
                return None;
            }
            nanos = frac[..digits].parse::<u64>().ok()? * 10u64.pow(9 - digits as u32);
            rest = &frac[digits..];
        }
        let offset_secs: i64 = match rest {
            "Z" | "z" => 0,
            _ if rest.len() == 6 && (rest.starts_with('+') || rest.starts_with('-')) => {
                let h: i64 = rest[1..3].parse().ok()?;
                let m: i64 = rest[4..6].parse().ok()?;
                if &rest[3..4] != ":" || h > 23 || m > 59 {
                    return None;
                }
                let off = h * 3600 + m * 60;
                if rest.starts_with('-') { -off } else { off }
            }
            _ => return None,
        };
        let days = days_from_civil(year, month, day);
        let secs = days * SECS_PER_DAY as i64 + i64::from(hour * 3600 + minute * 60 + second)
            - offset_secs;
        let secs = u64::try_from(secs).ok()?;
        secs.checked_mul(NANOS_PER_SEC)?
            .checked_add(nanos)
            .map(Timestamp)
    }
}

impl fmt::Display for Timestamp {
    /// RFC 3339 in UTC, with milliseconds (nanoseconds when the instant has them).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.civil();
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.",
            c.year, c.month, c.day, c.hour, c.minute, c.second
        )?;
        if c.nanos % 1_000_000 == 0 {
            write!(f, "{:03}Z", c.nanos / 1_000_000)
        } else {
            write!(f, "{:09}Z", c.nanos)
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

/// A UTC calendar date and time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Civil {
    pub(crate) year: i64,
    pub(crate) month: u32,
    pub(crate) day: u32,
    pub(crate) hour: u32,
    pub(crate) minute: u32,
    pub(crate) second: u32,
    pub(crate) nanos: u32,
}

fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(y) => 29,
        2 => 28,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (inverse of [`days_from_civil`]).
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Wall-clock time on tokio's clock: a UTC origin paired with the tokio instant at which it
/// was taken. On paused test time, calendar windows roll over when the test advances time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    origin: tokio::time::Instant,
    wall: Timestamp,
}

impl Clock {
    /// A clock that reads `wall` now (the system clock if `None`).
    pub(crate) fn new(wall: Option<SystemTime>) -> Clock {
        Clock {
            origin: tokio::time::Instant::now(),
            wall: Timestamp::from_system_time(wall.unwrap_or_else(SystemTime::now)),
        }
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.at(tokio::time::Instant::now())
    }

    pub(crate) fn at(&self, instant: tokio::time::Instant) -> Timestamp {
        self.wall
            .saturating_add(instant.saturating_duration_since(self.origin))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
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
        let c = Clock::new(Some(origin));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(c.now(), Timestamp::from_unix_secs(1_005));
    }

    proptest::proptest! {
        #[test]
        fn days_round_trip(z in 0i64..200_000) {
            let (y, m, d) = civil_from_days(z);
            proptest::prop_assert_eq!(days_from_civil(y, m, d), z);
            proptest::prop_assert!(d >= 1 && d <= days_in_month(y, m));
        }

        #[test]
        fn display_parses_back(n in 0u64..10_000_000_000_000_000_000) {
            let t = Timestamp::from_unix_nanos(n);
            proptest::prop_assert_eq!(Timestamp::parse_rfc3339(&t.to_string()), Some(t));
        }
    }
}
