//! The one error of building a budget: a bad price, a bad budget, an unreadable file.

use std::fmt;

/// A configuration problem found while building a [`CostBudgetLayer`](crate::CostBudgetLayer)
/// or loading a [`PriceTable`](crate::PriceTable). Never a panic: every bad value ends here,
/// with a message that names it.
#[derive(Debug)]
pub struct ConfigError {
    message: Box<str>,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl ConfigError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        ConfigError {
            message: message.into().into_boxed_str(),
            source: None,
        }
    }

    pub(crate) fn with_source(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ConfigError {
            message: message.into().into_boxed_str(),
            source: Some(Box::new(source)),
        }
    }

    /// What is wrong, in one line.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
