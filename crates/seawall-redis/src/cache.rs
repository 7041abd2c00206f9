//! [`RedisCacheStore`]: the cache's answers in the fleet's Redis, so a question answered for
//! one replica is answered for all of them.
//!
//! Each answer is one Redis string under `prefix:cache:<key in hex>`, in the cache's compact
//! encoding ([`Answer::encode`]), written with `SET .. PX ttl` so Redis drops it when it
//! expires. Bounding the memory is Redis's job: give the fleet's Redis a `maxmemory` and an
//! eviction policy (`volatile-lru` or `allkeys-lru`); every entry has a time to live. The key
//! is a SHA-256 digest, so nothing of the prompt or the tenant is readable in Redis; the
//! answer itself is stored as the upstream gave it.
//!
//! When Redis is slow or gone, a lookup is a miss and a write is skipped (the cache fails
//! open: the call goes upstream as it would without a cache); while the connection is
//! degraded, only one call per probe period asks it, as for the other stores. Bytes in Redis
//! that are not a valid answer (another writer, another version) are a miss, never a panic.

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use seawall_cache::{Answer, CacheKey, CacheStore, StoreError, StoreFuture};
use seawall_core::ConfigError;

use crate::client::SharedRedis;

/// The most bytes of one answer written to Redis unless told otherwise: 1 MiB.
pub const DEFAULT_MAX_ENTRY_BYTES: usize = 1024 * 1024;

/// A [`CacheStore`] on the fleet's Redis, for `CacheLayer::new` / `CacheLayer::builder`.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use seawall_cache::CacheLayer;
/// use seawall_redis::{RedisCacheStore, SharedRedis};
///
/// let redis = SharedRedis::new("redis://127.0.0.1:6379/")?;
/// let layer = CacheLayer::new(RedisCacheStore::new(redis));
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RedisCacheStore {
    redis: SharedRedis,
    max_entry_bytes: usize,
}

/// Builds a [`RedisCacheStore`].
#[derive(Debug, Clone)]
pub struct RedisCacheStoreBuilder {
    redis: SharedRedis,
    max_entry_bytes: usize,
}

impl RedisCacheStore {
    /// A store on `redis` with the defaults (answers up to 1 MiB encoded).
    pub fn new(redis: SharedRedis) -> Self {
        RedisCacheStore {
            redis,
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
        }
    }

    /// A builder for a store on `redis`.
    pub fn builder(redis: SharedRedis) -> RedisCacheStoreBuilder {
        RedisCacheStoreBuilder {
            redis,
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
        }
    }

    /// The Redis key of a cache key.
    fn redis_key(&self, key: &CacheKey) -> String {
        self.redis.key("cache", &key.to_hex())
    }
}

impl RedisCacheStoreBuilder {
    /// The largest encoded answer written (default 1 MiB, at least 1); a larger one is not
    /// stored.
    pub fn max_entry_bytes(mut self, bytes: usize) -> Self {
        self.max_entry_bytes = bytes;
        self
    }

    /// The store.
    pub fn build(self) -> Result<RedisCacheStore, ConfigError> {
        if self.max_entry_bytes == 0 {
            return Err(ConfigError::new("max_entry_bytes", "must be at least 1"));
        }
        Ok(RedisCacheStore {
            redis: self.redis,
            max_entry_bytes: self.max_entry_bytes,
        })
    }
}

const STORE: &str = "cache";

impl CacheStore for RedisCacheStore {
    fn get(&self, key: &CacheKey) -> StoreFuture<Option<Arc<Answer>>> {
        let redis = self.redis.clone();
        let rkey = self.redis_key(key);
        Box::pin(async move {
            if redis.skip_while_degraded() {
                return Err(StoreError::new("redis is degraded; not asked"));
            }
            let bytes: Option<Vec<u8>> = redis
                .run(STORE, |mut conn| async move { conn.get(rkey).await })
                .await
                .map_err(|e| StoreError::new(e.to_string()))?;
            let Some(bytes) = bytes else {
                return Ok(None);
            };
            match Answer::decode(&bytes) {
                Ok(answer) => Ok(Some(Arc::new(answer))),
                Err(e) => {
                    tracing::debug!(target: "seawall::redis", error = %e, "cache entry unreadable; a miss");
                    Ok(None)
                }
            }
        })
    }

    fn put(&self, key: &CacheKey, answer: Arc<Answer>, ttl: Duration) -> StoreFuture<()> {
        let redis = self.redis.clone();
        let rkey = self.redis_key(key);
        let max = self.max_entry_bytes;
        Box::pin(async move {
            let bytes = answer.encode();
            if bytes.len() > max {
                return Ok(());
            }
            if redis.skip_while_degraded() {
                return Err(StoreError::new("redis is degraded; not asked"));
            }
            // At least a millisecond: `PX 0` is refused.
            let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
            redis
                .run(STORE, |mut conn| async move {
                    redis::cmd("SET")
                        .arg(rkey)
                        .arg(bytes)
                        .arg("PX")
                        .arg(ms)
                        .query_async::<()>(&mut conn)
                        .await
                })
                .await
                .map_err(|e| StoreError::new(e.to_string()))
        })
    }
}
