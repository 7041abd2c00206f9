//! The error of a rejected configuration.

use std::borrow::Cow;
use std::fmt;

/// A configuration value was out of range. Raised when a builder is built, or when a
/// [`RetryHandle`](crate::RetryHandle) is given a bad value; never a panic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    message: Cow<'static, str>,
}

impl ConfigError {
    pub(crate) fn new(message: impl Into<Cow<'static, str>>) -> Self {
        ConfigError {
            message: message.into(),
        }
    }

    /// What was wrong, in words.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid retry configuration: {}", self.message)
    }
}

impl std::error::Error for ConfigError {}
