//! One connection to the fleet's Redis, shared by every store of a replica, with the timeout
//! and the degraded/recovered bookkeeping each call goes through.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use seawall_core::ConfigError;

/// How long a call to Redis may take before the layer treats the state as unreachable.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// While Redis is degraded, how often a call on the caller's path asks it again (see
/// [`SharedRedis::skip_while_degraded`]).
pub const PROBE_EVERY: Duration = Duration::from_millis(250);

/// A handle on the fleet's Redis: cheap to clone, one multiplexed connection per replica.
///
/// The connection is made lazily and remade on its own after a failure, so building a
/// handle never waits and a replica that starts while Redis is down still serves (under its
/// layers' [`OnUnavailable`](crate::OnUnavailable) policies). Its `Debug` output never shows
/// the URL, which may hold a password.
#[derive(Clone)]
pub struct SharedRedis {
    inner: Arc<Inner>,
}

struct Inner {
    conn: ConnectionManager,
    timeout: Duration,
    prefix: Arc<str>,
    replica: Arc<str>,
    degraded: AtomicBool,
    failures: AtomicU64,
    /// When a call last asked a degraded Redis (real time since `epoch`, in ns: this is
    /// about the connection, not about any layer's clock).
    last_probe: AtomicU64,
    epoch: std::time::Instant,
    calls: AtomicU64,
}

impl fmt::Debug for SharedRedis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRedis")
            .field("prefix", &self.inner.prefix)
            .field("replica", &self.inner.replica)
            .field("timeout", &self.inner.timeout)
            .field("degraded", &self.is_degraded())
            .finish_non_exhaustive()
    }
}

/// Builds a [`SharedRedis`].
#[derive(Debug, Clone)]
pub struct SharedRedisBuilder {
    url: Redacted,
    timeout: Duration,
    prefix: Arc<str>,
    replica: Option<Arc<str>>,
}

/// A URL that may hold a password: never printed.
#[derive(Clone)]
struct Redacted(String);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redis url>\"")
    }
}

impl SharedRedis {
    /// A handle on the Redis at `url` (`redis://[:password@]host:port/db`) with the defaults.
    pub fn new(url: impl Into<String>) -> Result<SharedRedis, ConfigError> {
        Self::builder(url).build()
    }

    /// A builder for a handle on the Redis at `url`.
    pub fn builder(url: impl Into<String>) -> SharedRedisBuilder {
        SharedRedisBuilder {
            url: Redacted(url.into()),
            timeout: DEFAULT_TIMEOUT,
            prefix: Arc::from("seawall"),
            replica: None,
        }
    }

    /// How long one call may take.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The prefix of every key this handle writes (`seawall` by default).
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// This replica's name in the fleet's records (random unless set).
    pub fn replica(&self) -> &str {
        &self.inner.replica
    }

    /// Whether the last call failed (the state is being served under the layers' policies).
    pub fn is_degraded(&self) -> bool {
        self.inner.degraded.load(Ordering::Relaxed)
    }

    /// Whether a call on the caller's path should skip Redis and follow its layer's
    /// [`OnUnavailable`](crate::OnUnavailable) policy at once: while the connection is
    /// degraded, only one such call every [`PROBE_EVERY`] asks (and pays the timeout if Redis
    /// is still gone), so an outage does not add the timeout to every call. The winner of a
    /// period probes; a success clears the degraded state for everyone.
    pub fn skip_while_degraded(&self) -> bool {
        if !self.is_degraded() {
            return false;
        }
        let now = u64::try_from(self.inner.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let last = self.inner.last_probe.load(Ordering::Acquire);
        let every = u64::try_from(PROBE_EVERY.as_nanos()).unwrap_or(u64::MAX);
        if now.saturating_sub(last) < every {
            return true;
        }
        // The one call that wins this probes; the others go on skipping.
        self.inner
            .last_probe
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    }

    /// How many calls failed or timed out since the handle was built.
    pub fn failures(&self) -> u64 {
        self.inner.failures.load(Ordering::Relaxed)
    }

    /// How many calls were made through [`run`](Self::run) since the handle was built (each is
    /// one round trip, or its attempt).
    pub fn calls(&self) -> u64 {
        self.inner.calls.load(Ordering::Relaxed)
    }

    /// A key under this handle's prefix: `prefix:kind:name`.
    pub fn key(&self, kind: &str, name: &str) -> String {
        format!("{}:{kind}:{name}", self.inner.prefix)
    }

    /// Runs one Redis call on the shared connection within the timeout.
    ///
    /// `Err(Unavailable)` when it failed or took too long; the first failure after a success
    /// logs a warning, the first success after a failure logs the recovery. `store` names the
    /// caller in the log and the metric.
    pub async fn run<T, F, Fut>(&self, store: &'static str, call: F) -> Result<T, Unavailable>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        self.inner.calls.fetch_add(1, Ordering::Relaxed);
        let conn = self.inner.conn.clone();
        match tokio::time::timeout(self.inner.timeout, call(conn)).await {
            Ok(Ok(value)) => {
                // Read first: a swap on every success would write the shared flag's cache
                // line on every call of every task.
                if self.is_degraded() && self.inner.degraded.swap(false, Ordering::Relaxed) {
                    tracing::warn!(target: "seawall::redis", store, "shared state reachable again");
                }
                Ok(value)
            }
            Ok(Err(e)) if e.is_timeout() => {
                Err(self.failed(store, Unavailable::TimedOut(self.inner.timeout)))
            }
            Ok(Err(e)) => Err(self.failed(store, Unavailable::Failed(e.kind().into()))),
            Err(_) => Err(self.failed(store, Unavailable::TimedOut(self.inner.timeout))),
        }
    }

    fn failed(&self, store: &'static str, why: Unavailable) -> Unavailable {
        self.inner.failures.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("seawall_redis_unavailable_total", "store" => store).increment(1);
        if !self.inner.degraded.swap(true, Ordering::Relaxed) {
            tracing::warn!(target: "seawall::redis", store, error = %why,
                "shared state unreachable; layers follow their OnUnavailable policy");
        }
        why
    }
}

impl SharedRedisBuilder {
    /// How long one call may take before it counts as a failure (50 ms by default: a LAN
    /// round trip is well under a millisecond, so this only fires when Redis is in trouble).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The prefix of every key (`seawall` by default): fleets sharing one Redis use their own.
    pub fn prefix(mut self, prefix: impl Into<Arc<str>>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// This replica's name (a random one by default); it names leases in Redis, so a
    /// reservation can be traced to the replica that holds it.
    pub fn replica(mut self, name: impl Into<Arc<str>>) -> Self {
        self.replica = Some(name.into());
        self
    }

    /// The handle. Fails on a malformed URL or a zero timeout; never waits for the server.
    ///
    /// Must be called inside a tokio runtime (the connection is driven by a task of it).
    pub fn build(self) -> Result<SharedRedis, ConfigError> {
        if self.timeout.is_zero() {
            return Err(ConfigError::new("timeout", "must be more than zero"));
        }
        if self.prefix.is_empty() || self.prefix.contains(char::is_whitespace) {
            return Err(ConfigError::new("prefix", "must be a non-empty word"));
        }
        // The client error may quote the URL: keep it out of the message and the source.
        let client = redis::Client::open(self.url.0.as_str())
            .map_err(|e| ConfigError::new("url", format!("is not a Redis URL ({:?})", e.kind())))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| ConfigError::new("url", format!("cannot be used ({:?})", e.kind())))?;
        let replica = self.replica.unwrap_or_else(random_replica_name);
        Ok(SharedRedis {
            inner: Arc::new(Inner {
                conn,
                timeout: self.timeout,
                prefix: self.prefix,
                replica,
                degraded: AtomicBool::new(false),
                failures: AtomicU64::new(0),
                last_probe: AtomicU64::new(0),
                epoch: std::time::Instant::now(),
                calls: AtomicU64::new(0),
            }),
        })
    }
}

fn random_replica_name() -> Arc<str> {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    Arc::from(format!("r{:016x}", h.finish()))
}

/// Why a call to Redis did not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unavailable {
    /// No answer within the timeout.
    TimedOut(Duration),
    /// The connection or the server refused (the kind of error, never its text, which may
    /// quote the URL).
    Failed(ErrorKind),
    /// Not asked: the connection is degraded and another call probes it this period.
    Degraded,
}

/// The kind of a Redis failure, as a short name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorKind(String);

impl From<redis::ErrorKind> for ErrorKind {
    fn from(kind: redis::ErrorKind) -> Self {
        ErrorKind(format!("{kind:?}"))
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::TimedOut(d) => write!(f, "no answer from redis within {d:?}"),
            Unavailable::Failed(kind) => write!(f, "redis call failed ({})", kind.0),
            Unavailable::Degraded => {
                f.write_str("redis is unreachable; not asked until it answers a probe")
            }
        }
    }
}

impl std::error::Error for Unavailable {}
