//! The clock the fleet limits' buckets and leases and the shared breakers' open periods and
//! windows are computed on, injectable so that tests move time by setting it.
//!
//! Every replica passes its own reading to the scripts (in milliseconds since the Unix epoch
//! by default) rather than using the server's `TIME`: tests can then drive refills, pauses,
//! open periods and lease expiry through a [`ManualClock`] while Redis runs on real time, and
//! the scripts stay deterministic. Replicas' wall clocks differ by a few milliseconds under NTP, which moves a
//! refill or a lease expiry by as much; a bucket never refills twice for a clock that runs
//! behind (time only moves forward in the scripts).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of time in milliseconds, for the fleet's buckets, pauses, leases and open periods.
pub trait Clock: fmt::Debug + Send + Sync + 'static {
    /// Now, in milliseconds (since the Unix epoch for [`SystemClock`]; any origin works as
    /// long as every replica of the fleet uses the same one).
    fn now_ms(&self) -> u64;
}

/// The wall clock: milliseconds since the Unix epoch. The default.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told: every clone reads and moves the same time.
///
/// ```
/// use std::time::Duration;
/// use seawall_redis::{Clock, ManualClock};
/// let clock = ManualClock::new(1_000);
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(clock.now_ms(), 3_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `ms`.
    pub fn new(ms: u64) -> Self {
        ManualClock(Arc::new(AtomicU64::new(ms)))
    }

    /// Sets the time.
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::Release);
    }

    /// Moves the time forward by `d`.
    pub fn advance(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(ms))
            })
            .ok();
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}
