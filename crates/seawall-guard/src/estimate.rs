//! How the guard counts a prompt's tokens: a trait, so a cheap estimate can be swapped for an
//! exact tokenizer where one is at hand.

use bytes::Bytes;
use http::Request;
use seawall_core::{LlmRequest, PartEstimate};

/// Counts the prompt tokens of a request: its text and its non-text parts.
///
/// The guard calls it on a prepared request (its [`RequestMeta`](seawall_core::RequestMeta)
/// is in the extensions, so [`LlmRequest`]'s methods answer), once per check, and again on
/// each trimmed candidate while trimming. Removing messages from a request must never raise
/// its count: the trimmer searches for the fewest turns to drop on that assumption (and
/// checks its answer).
///
/// A closure is an estimator:
///
/// ```
/// use seawall_core::LlmRequest;
/// use seawall_guard::TokenEstimator;
///
/// let twice = |req: &http::Request<bytes::Bytes>| 2 * u64::from(req.estimated_input_tokens());
/// let _: &dyn TokenEstimator = &twice;
/// ```
pub trait TokenEstimator: Send + Sync + 'static {
    /// The prompt tokens of `req`.
    fn prompt_tokens(&self, req: &Request<Bytes>) -> u64;
}

impl<F> TokenEstimator for F
where
    F: Fn(&Request<Bytes>) -> u64 + Send + Sync + 'static,
{
    fn prompt_tokens(&self, req: &Request<Bytes>) -> u64 {
        self(req)
    }
}

/// The default estimate, the one the rest of the stack makes (the gate's token buckets, the
/// budget's reservations, the chaos upstream's context check): characters of text / 4, plus 4
/// per piece of text ([`LlmRequest::estimated_input_tokens`]), and each image, audio clip and
/// file at a [`PartEstimate`]. It costs nothing: the request's body was parsed once already.
///
/// It is a rough figure: about right for English prose, high for short messages (the 4 per
/// piece), low for code and for languages written without spaces (Chinese and Japanese run
/// near one token per character). A request it counts low passes and meets the upstream's own
/// check, as without the guard; one it counts high can be refused or trimmed while it would
/// have fit, so near the limit an exact count (the `tiktoken` feature for OpenAI models) is
/// worth its cost.
///
/// ```
/// use seawall_core::{LlmRequest, PartEstimate};
/// use seawall_guard::{CharEstimate, TokenEstimator};
///
/// let mut req = http::Request::post("http://h/v1/chat/completions").body(bytes::Bytes::from(
///     r#"{"model":"m","messages":[{"role":"user","content":"abcdefgh"}]}"#,
/// )).unwrap();
/// req.prepare();
/// // "user" + "abcdefgh": 12 characters -> 3 tokens, plus 4 for each of 2 pieces.
/// assert_eq!(CharEstimate::new().prompt_tokens(&req), 11);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CharEstimate {
    parts: PartEstimate,
}

impl CharEstimate {
    /// The estimate with the default [`PartEstimate`] for non-text parts.
    pub const fn new() -> Self {
        CharEstimate {
            parts: PartEstimate::DEFAULT,
        }
    }

    /// Counts non-text parts at `parts` instead.
    pub const fn parts(mut self, parts: PartEstimate) -> Self {
        self.parts = parts;
        self
    }
}

impl TokenEstimator for CharEstimate {
    fn prompt_tokens(&self, req: &Request<Bytes>) -> u64 {
        u64::from(req.estimated_input_tokens())
            .saturating_add(self.parts.tokens(&req.media_parts()))
    }
}
