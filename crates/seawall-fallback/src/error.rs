//! The final error of a fallback chain: a short message for the user, the full story for the
//! operator.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use seawall_core::{FailureClass, LlmError};

/// One target the chain tried, with the error it ended in.
#[derive(Debug)]
pub struct Tried {
    target: Arc<str>,
    model: Option<Arc<str>>,
    error: LlmError,
}

impl Tried {
    pub(crate) fn new(target: Arc<str>, model: Option<Arc<str>>, error: LlmError) -> Self {
        Tried {
            target,
            model,
            error,
        }
    }

    pub(crate) fn into_error(self) -> LlmError {
        self.error
    }

    /// The target's name (`"primary"`, or the name configured for the primary, first).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The model the request asked this target for, if known.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The failure class of this target's attempt.
    pub fn class(&self) -> FailureClass {
        self.error.class()
    }

    /// The full error of this target (redacted, like every [`LlmError`]).
    pub fn error(&self) -> &LlmError {
        &self.error
    }
}

/// The technical detail behind a failed fallback chain: every target tried, in order, with
/// its class and error.
///
/// The layer returns an [`LlmError`] whose class, status and provider code are those of the
/// last target's error and whose message is a short, user-facing summary (see
/// [`FallbackError::user_message`]); this detail is its source, reachable with
/// [`FallbackError::of`]. Names, models and messages are redacted: no credentials.
///
/// ```
/// # use seawall_core::{FailureClass, LlmError};
/// # use seawall_fallback::FallbackError;
/// fn explain(err: &LlmError) -> String {
///     match FallbackError::of(err) {
///         Some(detail) => detail
///             .tried()
///             .iter()
///             .map(|t| format!("{}={}", t.target(), t.class()))
///             .collect::<Vec<_>>()
///             .join(", "),
///         None => err.to_string(),
///     }
/// }
/// let plain = LlmError::new(FailureClass::InvalidRequest, "bad field");
/// assert_eq!(explain(&plain), "invalid_request: bad field");
/// ```
#[derive(Debug)]
pub struct FallbackError {
    tried: Vec<Tried>,
    deadline: bool,
}

impl FallbackError {
    pub(crate) fn new(tried: Vec<Tried>, deadline: bool) -> Self {
        FallbackError { tried, deadline }
    }

    /// The detail of a chain's final error, if `err` is one.
    pub fn of(err: &LlmError) -> Option<&FallbackError> {
        err.source_ref()?.downcast_ref::<FallbackError>()
    }

    /// Every target tried, the primary first.
    pub fn tried(&self) -> &[Tried] {
        &self.tried
    }

    /// Whether the chain stopped because the overall deadline passed.
    pub fn deadline_passed(&self) -> bool {
        self.deadline
    }

    /// The class of the chain's outcome: `DeadlineExceeded` when the deadline stopped it,
    /// else the last target's class.
    pub fn class(&self) -> FailureClass {
        match (self.deadline, self.tried.last()) {
            (true, _) | (false, None) => FailureClass::DeadlineExceeded,
            (false, Some(t)) => t.class(),
        }
    }

    /// A short message fit to show an end user: what went wrong, without provider codes,
    /// target names or request details.
    pub fn user_message(&self) -> &'static str {
        user_message(self.class())
    }

    /// Builds the `LlmError` the layer returns: the last error's class, status, codes, hints
    /// and attempt history, the user-facing message, and `self` as the source.
    pub(crate) fn into_llm_error(self) -> LlmError {
        let class = self.class();
        let err = match self.tried.last().map(Tried::error) {
            Some(last) => last.clone_with(class, user_message(class)),
            None => LlmError::new(class, user_message(class)),
        };
        err.with_source(self)
    }
}

fn user_message(class: FailureClass) -> &'static str {
    match class {
        FailureClass::ContextLengthExceeded => {
            "The request is too long for every model available to answer it."
        }
        FailureClass::ContentFiltered => {
            "The request was declined by the content policy of every model available."
        }
        FailureClass::DeadlineExceeded => "No model answered in time. Please try again later.",
        FailureClass::InvalidRequest => "The request was rejected as invalid.",
        FailureClass::BudgetExceeded => "The spending limit for AI requests has been reached.",
        _ => "The AI service is temporarily unavailable. Please try again later.",
    }
}

impl fmt::Display for FallbackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fallback chain failed after {} target", self.tried.len())?;
        if self.tried.len() != 1 {
            f.write_str("s")?;
        }
        if self.deadline {
            f.write_str(" (deadline passed)")?;
        }
        for (i, t) in self.tried.iter().enumerate() {
            f.write_str(if i == 0 { ": " } else { "; " })?;
            f.write_str(&t.target)?;
            if let Some(m) = &t.model {
                write!(f, " [{m}]")?;
            }
            write!(f, " -> {}", t.error)?;
        }
        Ok(())
    }
}

impl StdError for FallbackError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.tried
            .last()
            .map(|t| &t.error as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_error_keeps_last_details_and_a_user_message() {
        let tried = vec![
            Tried::new(
                "primary".into(),
                Some("gpt-4o".into()),
                LlmError::new(FailureClass::Overloaded, "busy")
                    .with_status(http::StatusCode::from_u16(529).unwrap()),
            ),
            Tried::new(
                "backup".into(),
                None,
                LlmError::new(
                    FailureClass::QuotaExhausted,
                    "You exceeded your quota, key sk-proj-abcdefghijkl",
                )
                .with_status(http::StatusCode::TOO_MANY_REQUESTS)
                .with_code("insufficient_quota")
                .with_request_id("req_1"),
            ),
        ];
        let err = FallbackError::new(tried, false).into_llm_error();
        assert_eq!(err.class(), FailureClass::QuotaExhausted);
        assert_eq!(err.status(), Some(http::StatusCode::TOO_MANY_REQUESTS));
        assert_eq!(err.code(), Some("insufficient_quota"));
        assert_eq!(err.request_id(), Some("req_1"));
        assert_eq!(
            err.message(),
            "The AI service is temporarily unavailable. Please try again later."
        );
        let detail = FallbackError::of(&err).unwrap();
        let classes: Vec<_> = detail.tried().iter().map(Tried::class).collect();
        assert_eq!(
            classes,
            [FailureClass::Overloaded, FailureClass::QuotaExhausted]
        );
        let text = format!("{err} {err:?} {detail}");
        assert!(
            text.contains("primary [gpt-4o] -> overloaded (HTTP 529)"),
            "{text}"
        );
        assert!(!text.contains("abcdefghijkl"), "{text}");
    }

    #[test]
    fn deadline_wins_the_class() {
        let tried = vec![Tried::new(
            "primary".into(),
            None,
            LlmError::new(FailureClass::Overloaded, "busy"),
        )];
        let err = FallbackError::new(tried, true).into_llm_error();
        assert_eq!(err.class(), FailureClass::DeadlineExceeded);
        assert!(FallbackError::of(&err).unwrap().deadline_passed());
        assert!(err.message().contains("in time"));
    }
}
