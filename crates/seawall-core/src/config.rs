//! [`ConfigError`]: the one error every seawall builder returns for a value it refuses, so a
//! caller handles a bad retry setting, a bad breaker window and a bad price table the same way.

use std::borrow::Cow;
use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// A setting a builder refused: which one, and why.
///
/// Every builder of the workspace checks its values in `build()` and returns this error rather
/// than panicking or silently clamping. It names the setting (the builder method or field, such
/// as `max_attempts`) and the reason, and prints as
/// "invalid `max_attempts`: must be at least 1".
///
/// ```
/// use seawall_core::ConfigError;
///
/// let err = ConfigError::new("max_attempts", "must be at least 1");
/// assert_eq!(err.field(), "max_attempts");
/// assert_eq!(err.reason(), "must be at least 1");
/// assert_eq!(err.to_string(), "invalid `max_attempts`: must be at least 1");
/// ```
#[derive(Debug, Clone)]
pub struct ConfigError {
    field: Cow<'static, str>,
    reason: Cow<'static, str>,
    source: Option<Arc<dyn Error + Send + Sync>>,
}

impl ConfigError {
    /// `field` was refused because of `reason` (a phrase that reads after the field's name).
    pub fn new(field: impl Into<Cow<'static, str>>, reason: impl Into<Cow<'static, str>>) -> Self {
        ConfigError {
            field: field.into(),
            reason: reason.into(),
            source: None,
        }
    }

    /// Attaches the lower-level error that made the value unusable (a parse or I/O error).
    /// Its message is printed after the reason, and [`Error::source`] returns it.
    pub fn with_source(mut self, source: impl Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The refused setting, as its builder method names it.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// Why it was refused.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.reason)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl PartialEq for ConfigError {
    /// Two errors are equal when they name the same setting for the same reason.
    fn eq(&self, other: &Self) -> bool {
        self.field == other.field && self.reason == other.reason
    }
}

impl Eq for ConfigError {}

impl Error for ConfigError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_field_then_the_reason_then_the_source() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let err = ConfigError::new("prices", "cannot read prices.toml").with_source(io);
        assert_eq!(
            err.to_string(),
            "invalid `prices`: cannot read prices.toml: no such file"
        );
        assert!(err.source().is_some());
    }

    #[test]
    fn errors_compare_by_field_and_reason() {
        assert_eq!(
            ConfigError::new("jitter", "must be in [0, 1)"),
            ConfigError::new("jitter", "must be in [0, 1)")
        );
        assert_ne!(
            ConfigError::new("jitter", "must be in [0, 1)"),
            ConfigError::new("probes", "must be in [0, 1)")
        );
    }
}
