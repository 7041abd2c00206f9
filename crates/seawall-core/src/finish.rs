//! The one reading of the providers' words for why an answer stopped, shared by every parser
//! of bodies (the classifier's and the stream layer's), so that both report the same
//! [`FinishReason`] for the same word.
//!
//! The words, as the providers document them:
//!
//! - OpenAI Chat Completions `finish_reason`: `stop`, `length`, `tool_calls`, `content_filter`,
//!   and the deprecated `function_call`;
//! - OpenAI Responses `incomplete_details.reason`: `max_output_tokens`, `content_filter`;
//! - Anthropic Messages `stop_reason`: `end_turn`, `stop_sequence`, `max_tokens`, `tool_use`,
//!   `refusal`, `pause_turn`, and `model_context_window_exceeded` (the output stopped because
//!   the context window was full: a length limit, like `max_tokens`);
//! - Z.ai's (GLM) `finish_reason` beside OpenAI's: `sensitive` (its safety review stopped the
//!   answer: a content filter) and `model_context_window_exceeded`.
//!
//! Anything else (`pause_turn` included: the turn is not over, the caller continues it) is
//! kept as [`FinishReason::Other`], cut to [`FinishReason::MAX_OTHER_CHARS`] characters since
//! the upstream chooses its length.
//!
//! Three words are not a finish at all ([`FinishReason::failure_of`]): DeepSeek's
//! `insufficient_system_resource` (its inference system stopped the answer for lack of
//! resources), Z.ai's `network_error` (its inference failed mid-answer) and the `error` a
//! router normalises a provider's failure mid-answer to (OpenRouter). The answer is cut, and every parser reads it as a failure of its class:
//! retried before the commit point, resumed (by a continue layer) after it.

use crate::class::FailureClass;
use crate::error::LlmError;
use crate::response::FinishReason;

impl FinishReason {
    /// The most characters of an unknown reason kept in [`FinishReason::Other`].
    pub const MAX_OTHER_CHARS: usize = 64;

    /// The class of a finish word that says the answer failed rather than finished (see the
    /// module docs); `None` for every other word.
    ///
    /// ```
    /// use seawall_core::{FailureClass, FinishReason};
    /// assert_eq!(
    ///     FinishReason::failure_of("insufficient_system_resource"),
    ///     Some(FailureClass::Overloaded)
    /// );
    /// assert_eq!(FinishReason::failure_of("error"), Some(FailureClass::ServerError));
    /// assert_eq!(
    ///     FinishReason::failure_of("network_error"),
    ///     Some(FailureClass::ServerError)
    /// );
    /// assert_eq!(FinishReason::failure_of("stop"), None);
    /// ```
    pub fn failure_of(word: &str) -> Option<FailureClass> {
        match word {
            "insufficient_system_resource" => Some(FailureClass::Overloaded),
            "error" | "network_error" => Some(FailureClass::ServerError),
            _ => None,
        }
    }

    /// The error of a finish word that says the answer failed: [`FinishReason::failure_of`]'s
    /// class, the word as its type; `None` for every other word. Every reader of answers and
    /// streams reports such a word with it.
    ///
    /// ```
    /// use seawall_core::{FailureClass, FinishReason};
    /// let e = FinishReason::failure("network_error").unwrap();
    /// assert_eq!(e.class(), FailureClass::ServerError);
    /// assert_eq!(e.error_type(), Some("network_error"));
    /// assert!(FinishReason::failure("length").is_none());
    /// ```
    pub fn failure(word: &str) -> Option<LlmError> {
        let class = Self::failure_of(word)?;
        Some(
            LlmError::new(
                class,
                format!(
                    "the upstream stopped the answer with finish_reason `{word}`, not a finish"
                ),
            )
            .with_error_type(word),
        )
    }

    /// Reads a provider's finish (or stop, or incomplete) reason.
    ///
    /// ```
    /// use seawall_core::FinishReason;
    /// assert_eq!(FinishReason::from_provider("end_turn"), FinishReason::Stop);
    /// assert_eq!(FinishReason::from_provider("max_output_tokens"), FinishReason::Length);
    /// assert_eq!(FinishReason::from_provider("tool_use"), FinishReason::ToolCalls);
    /// assert_eq!(
    ///     FinishReason::from_provider("pause_turn"),
    ///     FinishReason::Other("pause_turn".into())
    /// );
    /// ```
    pub fn from_provider(word: &str) -> FinishReason {
        match word {
            "stop" | "end_turn" | "stop_sequence" => FinishReason::Stop,
            "length" | "max_tokens" | "max_output_tokens" | "model_context_window_exceeded" => {
                FinishReason::Length
            }
            "tool_calls" | "tool_use" | "function_call" => FinishReason::ToolCalls,
            "content_filter" | "refusal" | "sensitive" => FinishReason::ContentFilter,
            other => FinishReason::Other(
                other
                    .chars()
                    .take(Self::MAX_OTHER_CHARS)
                    .collect::<String>()
                    .into(),
            ),
        }
    }
}

/// Which choices of an OpenAI stream were seen (one bit per index below 64) and which gave a
/// finish reason: the one reading, shared by the classifier and the stream layer, of when such
/// a stream has its whole answer.
///
/// `data: [DONE]` ends an OpenAI stream, but a stream whose every choice, from index 0 to the
/// last one seen, gave its finish reason has its answer without it: some servers leave the
/// marker out (Text Generation Inference before 2.1.1, some llama.cpp forks), and a connection
/// can close just before it. An empty finish reason (a placeholder some servers put on every
/// chunk) is none. A choice index of 64 or more turns this off: the marker is then needed.
///
/// ```
/// use seawall_core::ChoiceEnds;
/// let mut ends = ChoiceEnds::default();
/// ends.saw(Some(0), None);
/// ends.saw(Some(1), None);
/// ends.saw(Some(0), Some("stop"));
/// assert!(!ends.all_ended());
/// ends.saw(Some(1), Some("length"));
/// assert!(ends.all_ended());
/// ```
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ChoiceEnds {
    seen: u64,
    ended: u64,
    wide: bool,
}

impl ChoiceEnds {
    /// Notes a choice (`index` absent: 0) and its finish reason (`None`: not finished yet).
    pub fn saw(&mut self, index: Option<u64>, finish: Option<&str>) {
        match index.unwrap_or(0) {
            i @ 0..64 => {
                self.seen |= 1 << i;
                if finish.is_some_and(|w| !w.is_empty()) {
                    self.ended |= 1 << i;
                }
            }
            _ => self.wide = true,
        }
    }

    /// Whether every choice from index 0 to the last seen gave its finish reason.
    pub fn all_ended(&self) -> bool {
        let top = 64 - self.seen.leading_zeros();
        let every = u64::MAX.checked_shr(64 - top).unwrap_or(0);
        !self.wide && every != 0 && self.ended & every == every
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_word_of_both_apis_maps_to_its_reason() {
        for (word, want) in [
            ("stop", FinishReason::Stop),
            ("end_turn", FinishReason::Stop),
            ("stop_sequence", FinishReason::Stop),
            ("length", FinishReason::Length),
            ("max_tokens", FinishReason::Length),
            ("max_output_tokens", FinishReason::Length),
            ("model_context_window_exceeded", FinishReason::Length),
            ("tool_calls", FinishReason::ToolCalls),
            ("function_call", FinishReason::ToolCalls),
            ("tool_use", FinishReason::ToolCalls),
            ("content_filter", FinishReason::ContentFilter),
            ("refusal", FinishReason::ContentFilter),
            ("sensitive", FinishReason::ContentFilter),
            ("pause_turn", FinishReason::Other("pause_turn".into())),
        ] {
            assert_eq!(FinishReason::from_provider(word), want, "{word}");
        }
    }

    #[test]
    fn an_unknown_reason_is_kept_but_bounded() {
        let long = "ü".repeat(500);
        let FinishReason::Other(kept) = FinishReason::from_provider(&long) else {
            panic!("an unknown word is Other");
        };
        assert_eq!(kept.chars().count(), FinishReason::MAX_OTHER_CHARS);
        assert!(long.starts_with(&*kept));
    }
}
