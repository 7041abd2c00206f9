//! How keyed budgets find a request's key.

use std::sync::Arc;

/// Reads the key of a [`Budget::per_key`](crate::Budget::per_key) budget from a request.
///
/// Implemented for closures `Fn(&str, &Req) -> Option<Arc<str>>`, which get the scope name
/// and the request:
///
/// ```
/// use std::sync::Arc;
/// use bytes::Bytes;
/// use seawall_budget::{Budget, CostBudgetLayer, PriceTable, Usd};
///
/// let layer = CostBudgetLayer::builder(PriceTable::new())
///     .budget(Budget::daily("tenant-daily", Usd::from_dollars(5)).per_key("tenant"))
///     .keys(|scope: &str, req: &http::Request<Bytes>| match scope {
///         "tenant" => req.headers().get("x-tenant")?.to_str().ok().map(Arc::from),
///         _ => None,
///     })
///     .build()
///     .unwrap();
/// # let _ = layer;
/// ```
pub trait BudgetKeys<Req>: Send + Sync + 'static {
    /// The key of `req` for the scope named `scope`, if it has one.
    fn key(&self, scope: &str, req: &Req) -> Option<Arc<str>>;
}

impl<Req, F> BudgetKeys<Req> for F
where
    F: Fn(&str, &Req) -> Option<Arc<str>> + Send + Sync + 'static,
{
    fn key(&self, scope: &str, req: &Req) -> Option<Arc<str>> {
        self(scope, req)
    }
}

/// No key function: every per-key budget would count all requests under one key, so the
/// builder refuses per-key budgets without [`Builder::keys`](crate::Builder::keys).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoKeys;

impl<Req> BudgetKeys<Req> for NoKeys {
    fn key(&self, _scope: &str, _req: &Req) -> Option<Arc<str>> {
        None
    }
}

/// A stable, non-reversible identifier for a secret (an API key, say), for use as a budget
/// key: `"fp-"` and 16 hex digits of its 64-bit FNV-1a hash. The same secret always gives the
/// same identifier, across processes and versions, and the secret never reaches errors,
/// logs or spend records.
///
/// ```
/// let id = seawall_budget::fingerprint("sk-proj-abc123");
/// assert_eq!(id.len(), 19);
/// assert!(!id.contains("abc123"));
/// assert_eq!(id, seawall_budget::fingerprint("sk-proj-abc123"));
/// ```
pub fn fingerprint(secret: &str) -> Arc<str> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in secret.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("fp-{h:016x}").into()
}
