//! [`CacheLayer`] and its [`CacheBuilder`]: the cache's policy.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use seawall_core::{ConfigError, KeyFn};
use tower_layer::Layer;

use crate::key::{KeyDeriver, Normalize};
use crate::service::{Cache, Heads, Shared};
use crate::store::{CacheStore, MemoryStore};

/// A key function reading a request's partition (its tenant).
pub type PartitionFn = Arc<dyn KeyFn<Request<Bytes>> + Send + Sync>;

/// A predicate saying a request must always bypass the cache (a time-sensitive prompt).
pub type BypassFn = Arc<dyn Fn(&Request<Bytes>) -> bool + Send + Sync>;

/// Whose answers may be shared.
#[derive(Clone, Default)]
pub(crate) enum Partition {
    /// Requests with different credential headers (`authorization`, `x-api-key`, `api-key`)
    /// never share answers; the values are only hashed into the key.
    #[default]
    Credentials,
    /// Everyone shares.
    Shared,
    /// A key function reads the tenant.
    Key(PartitionFn),
}

/// The credential headers that partition the cache by default.
pub(crate) const CREDENTIAL_HEADERS: [http::HeaderName; 3] = [
    http::header::AUTHORIZATION,
    http::HeaderName::from_static("x-api-key"),
    http::HeaderName::from_static("api-key"),
];

impl Partition {
    pub(crate) fn of<'a>(
        &'a self,
        req: &'a Request<Bytes>,
        heads: &Heads<'a>,
    ) -> Option<Cow<'a, [u8]>> {
        match self {
            Partition::Shared => None,
            Partition::Credentials => heads.credential.map(|v| Cow::Borrowed(v.as_bytes())),
            Partition::Key(f) => f.key(req).map(|k| match k {
                Cow::Borrowed(s) => Cow::Borrowed(s.as_bytes()),
                Cow::Owned(s) => Cow::Owned(s.into_bytes()),
            }),
        }
    }
}

/// Serves identical requests from stored answers: no upstream call, no attempt, no permit, no
/// budget. Place it outside fallback and retry (see the [crate docs](crate)).
///
/// `CacheLayer::new(store)` has the defaults: answers kept 10 minutes; tenants (the credential
/// headers) never share; sampled answers above temperature 1.0 not cached; answers from a
/// fallback target not cached; bodies keyed up to 1 MiB; answers up to 1 MiB stored; single
/// flight on.
///
/// ```
/// use std::time::Duration;
/// use seawall_cache::{CacheLayer, MemoryStore};
///
/// let layer = CacheLayer::builder(MemoryStore::with_bounds(1_000, 16 << 20))
///     .ttl(Duration::from_secs(3600))
///     .max_temperature(0.0)
///     .build()?;
/// assert_eq!(layer.ttl(), Duration::from_secs(3600));
/// # Ok::<(), seawall_core::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct CacheLayer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for CacheLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheLayer")
            .field("ttl", &self.shared.ttl)
            .finish_non_exhaustive()
    }
}

impl CacheLayer {
    /// A layer over `store` with the defaults.
    pub fn new(store: impl CacheStore) -> Self {
        CacheLayer::builder(store).finish()
    }

    /// A builder over `store`, starting from the defaults.
    pub fn builder(store: impl CacheStore) -> CacheBuilder {
        let memory = in_memory(&store);
        let mut builder = CacheBuilder::new(Arc::new(store));
        builder.memory = memory;
        builder
    }

    /// How long answers are kept.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl Default for CacheLayer {
    /// A layer over a [`MemoryStore`] with its default bounds.
    fn default() -> Self {
        CacheLayer::new(MemoryStore::new())
    }
}

/// Wrapping a service clones it once, for the [spare](seawall_core::Spare) of the calls that
/// go upstream after a wait.
impl<S: Clone> Layer<S> for CacheLayer {
    type Service = Cache<S>;

    fn layer(&self, inner: S) -> Cache<S> {
        Cache::from_shared(inner, self.shared.clone())
    }
}

/// The store as the in-memory one, when it is: the layer then calls it directly and hands it
/// answers unchecked (see `Answer::unchecked`), which it checks at their first use. Any other
/// store is only ever handed checked answers.
fn in_memory(store: &dyn std::any::Any) -> Option<MemoryStore> {
    store
        .downcast_ref::<MemoryStore>()
        .or_else(|| store.downcast_ref::<Arc<MemoryStore>>().map(|s| &**s))
        .cloned()
}

/// Settings of a [`CacheLayer`]; every setting starts at the default documented on its method,
/// and [`build`](Self::build) checks them.
#[derive(Clone)]
pub struct CacheBuilder {
    store: Arc<dyn CacheStore>,
    memory: Option<MemoryStore>,
    ttl: Duration,
    keys: KeyDeriver,
    partition: Partition,
    max_temperature: Option<f64>,
    bypass: Option<BypassFn>,
    allow_fallback: bool,
    max_entry_bytes: usize,
    single_flight: bool,
    pub(crate) semantic: crate::semantic::Settings,
}

impl std::fmt::Debug for CacheBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheBuilder")
            .field("ttl", &self.ttl)
            .field("keys", &self.keys)
            .field("max_temperature", &self.max_temperature)
            .field("allow_fallback", &self.allow_fallback)
            .field("max_entry_bytes", &self.max_entry_bytes)
            .field("single_flight", &self.single_flight)
            .finish_non_exhaustive()
    }
}

impl CacheBuilder {
    fn new(store: Arc<dyn CacheStore>) -> Self {
        CacheBuilder {
            store,
            memory: None,
            ttl: Duration::from_secs(600),
            keys: KeyDeriver::new(),
            partition: Partition::Credentials,
            max_temperature: Some(1.0),
            bypass: None,
            allow_fallback: false,
            max_entry_bytes: 1024 * 1024,
            single_flight: true,
            semantic: Default::default(),
        }
    }

    /// How long an answer is served (default 10 minutes, more than 0). In the in-memory store
    /// the time runs from when the answer arrived, as the classifier's report timed its last
    /// content (from when it was stored, without a classifier); a remote store counts it from
    /// the write.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Edits each request body (as a JSON tree) before it is keyed, to strip what varies but
    /// does not change the answer. The request goes upstream unchanged.
    ///
    /// A prompt that starts with a request id and a timestamp makes every key unique: a 0%
    /// hit rate. Stripping them keys the question alone:
    ///
    /// ```
    /// use seawall_cache::{CacheLayer, MemoryStore};
    /// use serde_json::Value;
    ///
    /// let layer = CacheLayer::builder(MemoryStore::new())
    ///     .normalize(|body: &mut Value| {
    ///         let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) else {
    ///             return;
    ///         };
    ///         for m in messages {
    ///             if let Some(Value::String(text)) = m.get_mut("content") {
    ///                 // "[req 8c1f at 2026-12-01T19:00:00Z] What is ..." -> "What is ..."
    ///                 if text.starts_with("[req ") {
    ///                     if let Some(end) = text.find("] ") {
    ///                         text.replace_range(..end + 2, "");
    ///                     }
    ///                 }
    ///             }
    ///         }
    ///         if let Some(obj) = body.as_object_mut() {
    ///             obj.remove("user");
    ///             obj.remove("metadata");
    ///         }
    ///     })
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), seawall_core::ConfigError>(())
    /// ```
    pub fn normalize(
        mut self,
        hook: impl Fn(&mut serde_json::Value) + Send + Sync + 'static,
    ) -> Self {
        let hook: Normalize = Arc::new(hook);
        self.keys = self.keys.with_normalize(hook);
        self
    }

    /// Requests are kept apart by the tenant `key` reads (a header, a fingerprint of the API
    /// key): answers are shared only within a tenant, and a request without a tenant shares
    /// with the others without one. The default keeps apart requests with different
    /// credential headers (`authorization`, `x-api-key`, `api-key`).
    pub fn partition(mut self, key: impl KeyFn<Request<Bytes>> + Send + Sync + 'static) -> Self {
        self.partition = Partition::Key(Arc::new(key));
        self
    }

    /// Every request shares answers with every other, whoever sent it. Right for a gateway
    /// whose requests all go out with its own key, and for public, non-personal prompts.
    pub fn shared_across_tenants(mut self) -> Self {
        self.partition = Partition::Shared;
        self
    }

    /// Answers sampled above this `temperature` are not cached (default 1.0). A request without
    /// a temperature (or with one that is not a number) counts as sampled at the providers'
    /// default, 1.0: cached under the default threshold, not under a lower one. Caching a
    /// sampled answer replays one sample to everyone: set 0.0 to cache only greedy decoding
    /// (requests that say `"temperature": 0`), or see
    /// [`cache_any_temperature`](Self::cache_any_temperature).
    pub fn max_temperature(mut self, temperature: f64) -> Self {
        self.max_temperature = Some(temperature);
        self
    }

    /// Caches answers whatever their temperature (opting in to replaying one sample).
    pub fn cache_any_temperature(mut self) -> Self {
        self.max_temperature = None;
        self
    }

    /// Requests for which `predicate` is true always bypass the cache: neither read nor
    /// written. For time-sensitive prompts ("what's the weather today", "latest news").
    pub fn bypass_when(
        mut self,
        predicate: impl Fn(&Request<Bytes>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.bypass = Some(Arc::new(predicate));
        self
    }

    /// Whether an answer a fallback target gave (another model than the one asked for) is
    /// stored under the request's key (default no: the next caller would get the fallback's
    /// answer while the primary is healthy again). A degraded answer (the fallback's
    /// last-resort cache or a static reply) is never stored.
    pub fn allow_fallback_answers(mut self, allow: bool) -> Self {
        self.allow_fallback = allow;
        self
    }

    /// The largest answer stored, in bytes of body (default 1 MiB, at least 1); a larger one
    /// is passed through.
    pub fn max_entry_bytes(mut self, bytes: usize) -> Self {
        self.max_entry_bytes = bytes;
        self
    }

    /// The largest request body keyed (default 1 MiB, at least 1); a larger request
    /// bypasses the cache.
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.keys = self.keys.with_max_body(bytes);
        self
    }

    /// Whether identical requests in flight at once share one upstream call (default on).
    pub fn single_flight(mut self, on: bool) -> Self {
        self.single_flight = on;
        self
    }

    /// Checks the settings and builds the layer.
    pub fn build(self) -> Result<CacheLayer, ConfigError> {
        if self.ttl.is_zero() {
            return Err(ConfigError::new("ttl", "must be more than 0"));
        }
        if self.max_entry_bytes == 0 {
            return Err(ConfigError::new("max_entry_bytes", "must be at least 1"));
        }
        if self.keys.max_body() == 0 {
            return Err(ConfigError::new("max_body_bytes", "must be at least 1"));
        }
        if self
            .max_temperature
            .is_some_and(|t| !t.is_finite() || t < 0.0)
        {
            return Err(ConfigError::new(
                "max_temperature",
                "must be a finite number, at least 0",
            ));
        }
        self.semantic.check()?;
        Ok(self.finish())
    }

    fn finish(self) -> CacheLayer {
        CacheLayer {
            shared: Arc::new(Shared {
                store: self.store,
                memory: self.memory,
                flights: Default::default(),
                keys: self.keys,
                partition: self.partition,
                ttl: self.ttl,
                max_temperature: self.max_temperature,
                bypass: self.bypass,
                allow_fallback: self.allow_fallback,
                max_entry_bytes: self.max_entry_bytes,
                single_flight: self.single_flight,
                semantic: self.semantic.build(),
            }),
        }
    }
}
