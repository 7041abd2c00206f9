//! The last-resort cache: the last good answer to an identical request.
//!
//! When every target has failed, an answer that was good a few minutes ago is often better
//! than an error (a summary, a classification, a canned reply). The cache keeps, per request
//! key, the last successful response of a *non-streaming* request, bounded by a TTL, a number
//! of entries and a total size, and serves it only as the last resort, clearly marked.
//!
//! Storing a response means reading its body. A response type opts in through [`Replay`]:
//! `http::Response<B>` does when its body type can be rebuilt from bytes ([`ReplayBody`]:
//! `Full<Bytes>`, `BoxBody<Bytes, E>`, `UnsyncBoxBody<Bytes, E>`); a fully-read typed response
//! does by cloning itself. A body larger than the entry cap is handed to the caller whole
//! (the bytes read so far, then the rest), and not stored.
//!
//! This module holds the settings and the marker the last resort leaves on a response; what a
//! request's key is, how a response is captured and replayed, and the bounded store each have
//! a submodule of their own.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use seawall_core::ServedBy;

mod replay;
mod request_key;
mod store;

pub use replay::{HttpSnapshot, Replay, ReplayBody};
pub use request_key::RequestKey;
pub(crate) use store::{Cache, CacheOps};

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Settings of the last-resort cache.
///
/// Defaults: at most 1024 entries, 32 MiB in total, 1 MiB per entry.
///
/// ```
/// use std::time::Duration;
/// use seawall_fallback::ResponseCache;
///
/// let cache = ResponseCache::new(Duration::from_secs(600))
///     .with_max_entries(256)
///     .with_max_entry_bytes(64 * 1024);
/// assert_eq!(cache.max_entries(), 256);
/// assert_eq!(cache.max_bytes(), 32 * 1024 * 1024);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseCache {
    ttl: Duration,
    max_entries: usize,
    max_bytes: usize,
    max_entry_bytes: usize,
}

impl ResponseCache {
    /// A cache whose entries are served for `ttl` after they were stored.
    pub fn new(ttl: Duration) -> Self {
        ResponseCache {
            ttl,
            max_entries: 1024,
            max_bytes: 32 * 1024 * 1024,
            max_entry_bytes: 1024 * 1024,
        }
    }

    /// Keeps at most `n` entries (the oldest go first).
    pub fn with_max_entries(mut self, n: usize) -> Self {
        self.max_entries = n;
        self
    }

    /// Keeps at most `n` bytes of snapshots in total (the oldest go first).
    pub fn with_max_bytes(mut self, n: usize) -> Self {
        self.max_bytes = n;
        self
    }

    /// Stores no response larger than `n` bytes; a larger body is passed through untouched.
    pub fn with_max_entry_bytes(mut self, n: usize) -> Self {
        self.max_entry_bytes = n;
        self
    }

    /// How long an entry is served after it was stored.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The most entries kept.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// The most bytes kept in total.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The largest entry stored.
    pub fn max_entry_bytes(&self) -> usize {
        self.max_entry_bytes
    }

    fn entry_cap(&self) -> usize {
        self.max_entry_bytes.min(self.max_bytes)
    }
}

/// How the last resort answered, in the response extensions (next to a
/// [`ServedBy`] with `degraded: true`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LastResort {
    /// A cached answer to an identical request.
    Cached {
        /// How old the answer is.
        age: Duration,
        /// Which target had served it.
        served_by: ServedBy,
    },
    /// The configured static degraded response.
    Static,
}
