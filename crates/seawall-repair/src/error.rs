//! [`ContentInvalid`]: why the repair layer gave up, answer by answer.
//!
//! The caller gets an [`LlmError`] of class [`FailureClass::ContentInvalid`], like every other
//! failure of the stack, so the layers around it and the code that handles errors need
//! nothing new. What went wrong with each answer is its source: the operator reading the log
//! wants every turn's complaint, not only the last one, to tell a model that never learns from
//! one that was close.

use std::error::Error as StdError;
use std::fmt;

use seawall_core::{FailureClass, LlmError, redact};

/// The longest validation error kept per answer, in bytes: a validator may quote the whole
/// answer, and the error must stay a log line.
pub const MAX_ERROR_LEN: usize = 1024;

/// Every answer's validation error, oldest first: the first answer's, then one per repair
/// turn. The source of the [`LlmError`] the layer returns when it gives up.
///
/// The texts are redacted (see [`seawall_core::redact`]) and each is cut to
/// [`MAX_ERROR_LEN`] bytes, so no credential a model echoed reaches a log.
///
/// ```
/// use seawall_core::{FailureClass, LlmError};
/// use seawall_repair::ContentInvalid;
///
/// # fn handle(err: LlmError) {
/// if let Some(invalid) = ContentInvalid::of(&err) {
///     for (turn, text) in invalid.errors().iter().enumerate() {
///         eprintln!("answer {}: {text}", turn + 1);
///     }
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentInvalid {
    errors: Vec<Box<str>>,
}

impl ContentInvalid {
    pub(crate) fn new() -> Self {
        ContentInvalid { errors: Vec::new() }
    }

    pub(crate) fn push(&mut self, error: &str) {
        self.errors.push(cut(&redact(error), MAX_ERROR_LEN).into());
    }

    /// The validation error of each answer, oldest first.
    pub fn errors(&self) -> &[Box<str>] {
        &self.errors
    }

    /// The detail behind an error the repair layer returned, if `err` is one.
    pub fn of(err: &LlmError) -> Option<&ContentInvalid> {
        err.source_ref()?.downcast_ref()
    }

    /// The error the layer returns: class [`FailureClass::ContentInvalid`], the last
    /// answer's complaint as its message, and this list as its source.
    pub(crate) fn into_error(self, request_id: Option<&str>) -> LlmError {
        let last = self.errors.last().map_or("", |e| &**e);
        let message = format!(
            "{} answer{} failed validation; the last: {last}",
            self.errors.len(),
            if self.errors.len() == 1 { "" } else { "s" }
        );
        let mut err = LlmError::new(FailureClass::ContentInvalid, message);
        if let Some(id) = request_id {
            err = err.with_request_id(id);
        }
        err.with_source(self)
    }
}

impl fmt::Display for ContentInvalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "every answer failed validation:")?;
        for (i, e) in self.errors.iter().enumerate() {
            write!(f, " [{}] {e}", i + 1)?;
        }
        Ok(())
    }
}

impl StdError for ContentInvalid {}

/// `s` cut to at most `max` bytes, at a character boundary, ending with `…` when cut.
pub(crate) fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + 3);
    out.push_str(&s[..end]);
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_redacted_and_bounded() {
        let mut e = ContentInvalid::new();
        e.push("the answer quoted Authorization: Bearer sk-proj-abcdefghijklmnop1234");
        e.push(&"é".repeat(4000));
        assert!(!e.errors()[0].contains("abcdefghijklmnop1234"), "{e}");
        assert!(e.errors()[1].len() <= MAX_ERROR_LEN && e.errors()[1].ends_with('…'));
        let err = e.into_error(Some("req_1"));
        assert_eq!(err.class(), FailureClass::ContentInvalid);
        assert_eq!(err.request_id(), Some("req_1"));
        assert!(err.message().starts_with("2 answers failed validation"));
        assert_eq!(ContentInvalid::of(&err).map(|c| c.errors().len()), Some(2));
    }
}
