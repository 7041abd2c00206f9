//! Bounding the keys that per-key state is stored under.
//!
//! Keys of breakers, gates and budgets come from request bodies (the model name) or from
//! caller-supplied functions, so a client decides how long they are. A table that stores the
//! key verbatim lets one client pin megabytes per entry with a long model name. [`bound_key`]
//! keeps every key within [`MAX_KEY_LEN`] bytes while keeping distinct keys distinct (up to a
//! 64-bit hash collision), so the memory of a keyed table is bounded by its capacity times
//! this length, whatever the clients send.

use std::borrow::Cow;
use std::hash::{DefaultHasher, Hasher};

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
