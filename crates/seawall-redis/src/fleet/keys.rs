//! Where a key's fleet state lives in Redis, and the limits this replica applies to it.
//!
//! A request's key (from the layer's `KeyFn`, `host/model` by default) is cut to
//! [`MAX_KEY_LEN`](seawall_core::MAX_KEY_LEN) bytes and names three Redis keys:
//!
//! | Redis key | type | holds |
//! |---|---|---|
//! | `{prefix}:fleet:{<key>}:b` | hash | the request and token buckets (`r`, `r_at`, `t`, `t_at`) |
//! | `{prefix}:fleet:{<key>}:h` | sorted set | the calls in flight: hold id → lease expiry (ms) |
//! | `{prefix}:fleet:{<key>}:p` | string | the upstream's pause: paused until (ms) |
//!
//! The braces make the key a Redis Cluster hash tag, so the three land on one shard and one
//! script can touch them all. Requests without a key share `{prefix}:fleet:none:*`, which no
//! keyed name can spell (those always have a brace).

use std::collections::HashMap;
use std::sync::Arc;

use seawall_core::bound_key;
use seawall_gate::Rates;

use crate::SharedRedis;

/// One key's Redis names and the limits this replica applies to it.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) name: Option<Arc<str>>,
    pub(crate) rates: Rates,
    pub(crate) permits: Option<u32>,
    pub(crate) buckets: String,
    pub(crate) holds: Arc<str>,
    pub(crate) pause: String,
}

/// The limits by key, fixed when the layer is built.
#[derive(Debug, Clone, Default)]
pub(crate) struct Limits {
    pub(crate) rates: Rates,
    pub(crate) key_rates: HashMap<Arc<str>, Rates>,
    pub(crate) permits: Option<u32>,
    pub(crate) key_permits: HashMap<Arc<str>, Option<u32>>,
}

impl Limits {
    /// The Redis names and limits of `key`.
    pub(crate) fn target(&self, redis: &SharedRedis, key: Option<&str>) -> Target {
        let name: Option<Arc<str>> = key.map(|k| Arc::from(&*bound_key(k)));
        let base = match &name {
            Some(k) => redis.key("fleet", &format!("{{{k}}}")),
            None => redis.key("fleet", "none"),
        };
        let rates = name
            .as_ref()
            .and_then(|n| self.key_rates.get(n))
            .copied()
            .unwrap_or(self.rates);
        let permits = name
            .as_ref()
            .and_then(|n| self.key_permits.get(n))
            .copied()
            .unwrap_or(self.permits);
        Target {
            name,
            rates,
            permits,
            buckets: format!("{base}:b"),
            holds: Arc::from(format!("{base}:h")),
            pause: format!("{base}:p"),
        }
    }
}
