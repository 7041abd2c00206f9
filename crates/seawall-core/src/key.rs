//! The keys that per-key state (breakers, gate rates, budget counters) is stored under: how a
//! layer reads a request's key, and how that key is kept short.
//!
//! Breakers, gates and budgets all keep state per key, and all read the key the same way:
//! through a [`KeyFn`], the one key-function trait of seawall. The standard keys
//! ([`StateKey`], [`ModelKey`], [`FixedKey`]) are defined here once; any closure
//! `Fn(&Req) -> Option<T>` that returns an owned key is a key function too, and [`BorrowedKey`]
//! wraps one that borrows its key from the request.
//!
//! Keys come from request bodies (the model name) or from caller-supplied functions, so a
//! client decides how long they are. A table that stores the key verbatim lets one client pin
//! megabytes per entry with a long model name. [`bound_key`] keeps every key within
//! [`MAX_KEY_LEN`] bytes while keeping distinct keys distinct (up to a 64-bit hash collision),
//! so the memory of a keyed table is bounded by its capacity times this length, whatever the
//! clients send. Every keyed table bounds the keys a [`KeyFn`] returns before storing them.

use std::borrow::Cow;
use std::fmt;
use std::hash::{DefaultHasher, Hasher};

use crate::LlmRequest;

/// Reads the key a request's per-key state is kept under: its circuit breaker, its gate rates
/// and pauses, its budget counters.
///
/// `None` means the request has no key; each layer says where such requests go (the breaker
/// of the empty key, the gate's unkeyed state, the budget's `UNKEYED` counter). The key may
/// borrow from the request or from the key function itself; layers cut it with [`bound_key`]
/// before they store it.
///
/// Implemented by the standard keys [`StateKey`] (the default of every layer),
/// [`ModelKey`] and [`FixedKey`]; by every closure or function `Fn(&Req) -> Option<T>` whose
/// key `T` is owned (`String`, `&'static str`, `Cow<'static, str>`); and by [`BorrowedKey`],
/// which wraps a function that borrows its key from the request.
///
/// ```
/// use std::borrow::Cow;
/// use bytes::Bytes;
/// use seawall_core::{BorrowedKey, FixedKey, KeyFn, StateKey};
///
/// let req = http::Request::post("https://api.openai.com/v1/chat/completions")
///     .header("x-tenant", "acme")
///     .body(Bytes::new())
///     .unwrap();
/// // An owned key from a closure.
/// let tenant = |req: &http::Request<Bytes>| {
///     req.headers().get("x-tenant")?.to_str().ok().map(str::to_owned)
/// };
/// assert_eq!(tenant.key(&req).as_deref(), Some("acme"));
/// // A key borrowed from the request: no allocation per call.
/// let host = BorrowedKey::new(|req: &http::Request<Bytes>| req.uri().host().map(Cow::Borrowed));
/// assert_eq!(host.key(&req).as_deref(), Some("api.openai.com"));
/// assert_eq!(FixedKey::new("shared").key(&req).as_deref(), Some("shared"));
/// # let _ = StateKey;
/// ```
pub trait KeyFn<Req> {
    /// The key of `req`, if it has one.
    fn key<'a>(&'a self, req: &'a Req) -> Option<Cow<'a, str>>;

    /// The key of `req` in the keyed table named `scope`, for a layer that keeps several
    /// (the budget's per-key budgets, each named by its scope). The default is
    /// [`key`](Self::key) whatever the scope; a key function that reads a different key per
    /// scope overrides it.
    #[inline]
    fn scoped_key<'a>(&'a self, scope: &str, req: &'a Req) -> Option<Cow<'a, str>> {
        let _ = scope;
        self.key(req)
    }
}

impl<Req, F, T> KeyFn<Req> for F
where
    F: Fn(&Req) -> Option<T>,
    T: Into<Cow<'static, str>>,
{
    #[inline]
    fn key<'a>(&'a self, req: &'a Req) -> Option<Cow<'a, str>> {
        self(req).map(Into::into)
    }
}

/// Keys requests by [`LlmRequest::state_key`]: provider host and model for HTTP requests
/// (`api.openai.com/gpt-4o`), the model for typed requests. The default key of every layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateKey;

impl<Req: LlmRequest> KeyFn<Req> for StateKey {
    #[inline]
    fn key<'a>(&'a self, req: &'a Req) -> Option<Cow<'a, str>> {
        req.state_key().map(Cow::Borrowed)
    }
}

/// Keys requests by [`LlmRequest::model`] alone, so every provider serving a model shares
/// one state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelKey;

impl<Req: LlmRequest> KeyFn<Req> for ModelKey {
    #[inline]
    fn key<'a>(&'a self, req: &'a Req) -> Option<Cow<'a, str>> {
        req.model().map(Cow::Borrowed)
    }
}

/// Gives every request the same key: one state for all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedKey(Cow<'static, str>);

impl FixedKey {
    /// The key `key`, for every request.
    pub fn new(key: impl Into<Cow<'static, str>>) -> Self {
        FixedKey(key.into())
    }

    /// The key.
    pub fn get(&self) -> &str {
        &self.0
    }
}

impl<Req> KeyFn<Req> for FixedKey {
    #[inline]
    fn key<'a>(&'a self, _req: &'a Req) -> Option<Cow<'a, str>> {
        Some(Cow::Borrowed(&self.0))
    }
}

/// A key function that borrows its key from the request, so reading the key allocates
/// nothing.
///
/// A closure passed where any [`KeyFn`] is accepted cannot tie its result to its argument;
/// [`new`](Self::new) asks for exactly that signature, so the closure is checked against it.
#[derive(Clone, Copy)]
pub struct BorrowedKey<F>(F);

impl<F> BorrowedKey<F> {
    /// Wraps `f`, which returns a key borrowed from the request.
    pub fn new<Req>(f: F) -> Self
    where
        F: for<'a> Fn(&'a Req) -> Option<Cow<'a, str>>,
    {
        BorrowedKey(f)
    }

    /// The wrapped function.
    pub fn get_ref(&self) -> &F {
        &self.0
    }
}

impl<F> fmt::Debug for BorrowedKey<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BorrowedKey").finish_non_exhaustive()
    }
}

impl<Req, F> KeyFn<Req> for BorrowedKey<F>
where
    F: for<'a> Fn(&'a Req) -> Option<Cow<'a, str>>,
{
    #[inline]
    fn key<'a>(&'a self, req: &'a Req) -> Option<Cow<'a, str>> {
        (self.0)(req)
    }
}

/// The longest key, in bytes, that layers store as given. A longer key is stored as
/// [`bound_key`] makes it: a prefix, `#`, and a hash of the whole key.
pub const MAX_KEY_LEN: usize = 256;

/// `#` and 16 hex digits.
const SUFFIX_LEN: usize = 17;

/// `key` itself when it is at most [`MAX_KEY_LEN`] bytes; otherwise its longest prefix (cut
/// at a character boundary) that leaves room for `#` and 16 hex digits of a 64-bit hash of the
/// whole key, so the result is at most [`MAX_KEY_LEN`] bytes.
///
/// The hash is the standard library's SipHash-1-3 with fixed (zero) keys
/// ([`DefaultHasher::new`]): the same key always gives the same result within a process and
/// across processes built with the same Rust release, which is all a table of in-process
/// state needs. It is not a secret: two long keys that share a prefix and collide on 64 bits
/// share their state.
///
/// ```
/// use seawall_core::{MAX_KEY_LEN, bound_key};
///
/// assert_eq!(bound_key("api.openai.com/gpt-4o"), "api.openai.com/gpt-4o");
/// let long = format!("api.openai.com/{}", "x".repeat(100_000));
/// let bounded = bound_key(&long);
/// assert!(bounded.len() <= MAX_KEY_LEN);
/// assert!(bounded.starts_with("api.openai.com/xxx"));
/// assert_eq!(bounded, bound_key(&long));
/// assert_ne!(bounded, bound_key(&format!("{long}y")));
/// ```
pub fn bound_key(key: &str) -> Cow<'_, str> {
    if key.len() <= MAX_KEY_LEN {
        return Cow::Borrowed(key);
    }
    let mut hasher = DefaultHasher::new();
    hasher.write(key.as_bytes());
    let hash = hasher.finish();
    let mut cut = MAX_KEY_LEN - SUFFIX_LEN;
    while !key.is_char_boundary(cut) {
        cut -= 1;
    }
    Cow::Owned(format!("{}#{hash:016x}", &key[..cut]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn short_keys_are_kept_as_given() {
        let exact = "k".repeat(MAX_KEY_LEN);
        assert!(matches!(bound_key(&exact), Cow::Borrowed(k) if k == exact));
        assert!(matches!(bound_key(""), Cow::Borrowed("")));
    }

    #[test]
    fn long_keys_are_cut_at_a_character_boundary() {
        // Four-byte characters: the cut point falls inside one.
        let key = "𝄞".repeat(1000);
        let bounded = bound_key(&key);
        assert!(bounded.len() <= MAX_KEY_LEN);
        let prefix = bounded.split('#').next().unwrap();
        assert!(key.starts_with(prefix));
        assert_eq!(prefix.len(), (MAX_KEY_LEN - SUFFIX_LEN) / 4 * 4);
    }

    #[test]
    fn http_request_keys_are_bounded() {
        use crate::LlmRequest;
        let model = "m".repeat(64 * 1024);
        let body = format!(r#"{{"model":"{model}","messages":[]}}"#);
        let mut req = http::Request::post("https://api.openai.com/v1/chat/completions")
            .body(bytes::Bytes::from(body))
            .unwrap();
        req.prepare();
        let key = req.state_key().unwrap();
        assert!(key.len() <= MAX_KEY_LEN);
        assert!(key.starts_with("api.openai.com/mmm"));
        assert_eq!(req.model(), Some(&*model));
    }

    struct Ask {
        model: Option<&'static str>,
        key: Option<&'static str>,
    }

    impl LlmRequest for Ask {
        fn model(&self) -> Option<&str> {
            self.model
        }
        fn max_output_tokens(&self) -> Option<u32> {
            None
        }
        fn estimated_input_tokens(&self) -> u32 {
            0
        }
        fn set_model(&mut self, _model: &str) -> Result<(), crate::LlmError> {
            Ok(())
        }
        fn state_key(&self) -> Option<&str> {
            self.key
        }
    }

    #[test]
    fn standard_keys_read_the_state_key_the_model_or_nothing_of_the_request() {
        let ask = Ask {
            model: Some("gpt-4o"),
            key: Some("api.openai.com/gpt-4o"),
        };
        assert_eq!(StateKey.key(&ask).as_deref(), Some("api.openai.com/gpt-4o"));
        assert_eq!(ModelKey.key(&ask).as_deref(), Some("gpt-4o"));
        assert_eq!(FixedKey::new("all").key(&ask).as_deref(), Some("all"));
        let bare = Ask {
            model: None,
            key: None,
        };
        assert_eq!(StateKey.key(&bare), None);
        assert_eq!(ModelKey.key(&bare), None);
        assert_eq!(FixedKey::new("all").key(&bare).as_deref(), Some("all"));
    }

    #[test]
    fn closures_give_owned_keys_and_borrowed_keys_borrow_from_the_request() {
        let ask = Ask {
            model: Some("gpt-4o"),
            key: None,
        };
        let owned = |a: &Ask| a.model.map(|m| format!("tenant/{m}"));
        assert_eq!(owned.key(&ask).as_deref(), Some("tenant/gpt-4o"));
        let fixed = |_: &Ask| Some("static");
        assert!(matches!(fixed.key(&ask), Some(Cow::Borrowed("static"))));
        let borrowed = BorrowedKey::new(|a: &Ask| a.model.map(Cow::Borrowed));
        assert!(matches!(borrowed.key(&ask), Some(Cow::Borrowed("gpt-4o"))));
    }

    proptest! {
        #[test]
        fn bounded_keys_are_short_stable_and_distinct(
            a in ".{0,600}",
            b in ".{0,600}",
        ) {
            let (ba, bb) = (bound_key(&a), bound_key(&b));
            prop_assert!(ba.len() <= MAX_KEY_LEN);
            prop_assert!(bb.len() <= MAX_KEY_LEN);
            prop_assert_eq!(&ba, &bound_key(&a));
            if a != b {
                prop_assert_ne!(ba, bb);
            }
        }

        #[test]
        fn keys_past_the_cap_differing_only_at_the_end_stay_distinct(
            len in MAX_KEY_LEN..5_000usize,
            last in any::<char>(),
        ) {
            let base = "m".repeat(len);
            let other = format!("{base}{last}");
            prop_assert_ne!(bound_key(&base), bound_key(&other));
        }
    }
}
