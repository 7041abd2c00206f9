//! [`RepairLayer`] and its [`RepairBuilder`]: the validator and the repair settings.

use std::fmt;
use std::sync::Arc;

use seawall_core::ConfigError;
use tower_layer::Layer;

use crate::answer::{Answer, Validator};
use crate::service::Repair;
use crate::turn::{DEFAULT_TEMPLATE, ERROR_PLACEHOLDER};

/// The default number of repair turns after the first answer.
pub const DEFAULT_MAX_REPAIRS: u32 = 2;

/// The default largest answer body read and validated: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

/// The settings every clone of one layer's services shares.
pub(crate) struct Shared {
    pub(crate) validator: Validator,
    pub(crate) max_repairs: u32,
    pub(crate) template: Box<str>,
    pub(crate) max_body_bytes: usize,
}

/// Applies a [`Repair`]: answers that fail `validator` get a repair turn that shows the
/// model its answer and what was wrong with it.
///
/// Defaults: [`DEFAULT_MAX_REPAIRS`] (2) repair turns, the message
/// [`DEFAULT_TEMPLATE`](crate::DEFAULT_TEMPLATE), and answers up to
/// [`DEFAULT_MAX_BODY_BYTES`] (1 MiB) read and validated.
///
/// ```
/// use seawall_repair::{RepairLayer, require_fields};
///
/// let layer = RepairLayer::builder(require_fields(&["city", "country"]))
///     .max_repairs(1)
///     .template("That did not work: {error}. Reply with the JSON object only.")
///     .build()?;
/// assert_eq!(layer.max_repairs(), 1);
/// # Ok::<(), seawall_repair::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RepairLayer {
    shared: Arc<Shared>,
}

impl RepairLayer {
    /// A layer with `validator` and the defaults.
    pub fn new<F>(validator: F) -> Self
    where
        F: Fn(&Answer<'_>) -> Result<(), String> + Send + Sync + 'static,
    {
        RepairLayer {
            shared: Arc::new(Shared {
                validator: Arc::new(validator),
                max_repairs: DEFAULT_MAX_REPAIRS,
                template: DEFAULT_TEMPLATE.into(),
                max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            }),
        }
    }

    /// A builder with `validator`, starting from the defaults.
    pub fn builder<F>(validator: F) -> RepairBuilder
    where
        F: Fn(&Answer<'_>) -> Result<(), String> + Send + Sync + 'static,
    {
        RepairBuilder {
            validator: Arc::new(validator),
            max_repairs: DEFAULT_MAX_REPAIRS,
            template: DEFAULT_TEMPLATE.into(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }

    /// The most repair turns after the first answer.
    pub fn max_repairs(&self) -> u32 {
        self.shared.max_repairs
    }

    /// The repair message's template.
    pub fn template(&self) -> &str {
        &self.shared.template
    }

    /// The largest answer body read and validated, in bytes.
    pub fn max_body_bytes(&self) -> usize {
        self.shared.max_body_bytes
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl fmt::Debug for RepairLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RepairLayer")
            .field("max_repairs", &self.shared.max_repairs)
            .field("max_body_bytes", &self.shared.max_body_bytes)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for RepairLayer {
    type Service = Repair<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Repair::from_shared(inner, self.shared.clone())
    }
}

/// Settings of a [`RepairLayer`]; every setting starts at the default documented on its
/// method, and [`build`](Self::build) checks them.
#[derive(Clone)]
pub struct RepairBuilder {
    validator: Validator,
    max_repairs: u32,
    template: Box<str>,
    max_body_bytes: usize,
}

impl fmt::Debug for RepairBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RepairBuilder")
            .field("max_repairs", &self.max_repairs)
            .field("template", &self.template)
            .field("max_body_bytes", &self.max_body_bytes)
            .finish_non_exhaustive()
    }
}

impl RepairBuilder {
    /// The most repair turns after the first answer (default 2). 0 validates without
    /// repairing: an invalid answer fails the call with `ContentInvalid` at once.
    pub fn max_repairs(mut self, turns: u32) -> Self {
        self.max_repairs = turns;
        self
    }

    /// The repair message, the user turn that follows the failed answer; `{error}` is
    /// replaced by the validator's text (default [`DEFAULT_TEMPLATE`](crate::DEFAULT_TEMPLATE)).
    pub fn template(mut self, template: impl Into<String>) -> Self {
        self.template = template.into().into_boxed_str();
        self
    }

    /// The largest answer body read and validated, in bytes (default 1 MiB, at least 1). A
    /// larger answer is passed through unvalidated: see the [crate docs](crate).
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    /// Checks the settings and builds the layer. A template without `{error}` is refused
    /// (the model would not learn what was wrong), and so is a body limit of 0.
    pub fn build(self) -> Result<RepairLayer, ConfigError> {
        if !self.template.contains(ERROR_PLACEHOLDER) {
            return Err(ConfigError::new(
                "template",
                "must contain `{error}`, where the validation error goes",
            ));
        }
        if self.max_body_bytes == 0 {
            return Err(ConfigError::new(
                "max_body_bytes",
                "must be at least 1 byte",
            ));
        }
        Ok(RepairLayer {
            shared: Arc::new(Shared {
                validator: self.validator,
                max_repairs: self.max_repairs,
                template: self.template,
                max_body_bytes: self.max_body_bytes,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate_json;

    #[test]
    fn a_template_without_the_placeholder_is_refused() {
        let err = RepairLayer::builder(validate_json())
            .template("Try again.")
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "template");
        let err = RepairLayer::builder(validate_json())
            .max_body_bytes(0)
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "max_body_bytes");
    }

    #[test]
    fn defaults() {
        let layer = RepairLayer::new(validate_json());
        assert_eq!(layer.max_repairs(), DEFAULT_MAX_REPAIRS);
        assert_eq!(layer.template(), DEFAULT_TEMPLATE);
        assert_eq!(layer.max_body_bytes(), DEFAULT_MAX_BODY_BYTES);
        assert!(format!("{layer:?}").contains("max_repairs"));
    }
}
