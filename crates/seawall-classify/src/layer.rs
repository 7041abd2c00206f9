//! [`ClassifyLayer`] and its [`ClassifyBuilder`]: the classifier's configuration.

use seawall_core::ConfigError;
use tower_layer::Layer;

use crate::classifier::AutoClassifier;
use crate::service::{Classify, DEFAULT_ERROR_BODY_LIMIT};

/// Puts a [`Classify`] next to an HTTP transport, turning statuses, headers, error bodies,
/// in-stream errors and transport errors into [`LlmError`](seawall_core::LlmError)s.
///
/// Defaults: the [`AutoClassifier`] (OpenAI-compatible and Anthropic), and error bodies read up
/// to 64 KiB (the rest is dropped unread).
///
/// ```
/// use seawall_classify::{ClassifyLayer, StatusClassifier};
///
/// let layer = ClassifyLayer::builder()
///     .classifier(StatusClassifier)
///     .error_body_limit(16 * 1024)
///     .build()?;
/// assert_eq!(layer.error_body_limit(), 16 * 1024);
/// # Ok::<(), seawall_classify::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ClassifyLayer<C = AutoClassifier> {
    classifier: C,
    error_body_limit: usize,
}

impl ClassifyLayer {
    /// A layer with the defaults: the [`AutoClassifier`] and a 64 KiB error-body limit.
    pub fn new() -> Self {
        ClassifyLayer {
            classifier: AutoClassifier,
            error_body_limit: DEFAULT_ERROR_BODY_LIMIT,
        }
    }

    /// A builder starting from the defaults.
    pub fn builder() -> ClassifyBuilder {
        ClassifyBuilder {
            classifier: AutoClassifier,
            error_body_limit: DEFAULT_ERROR_BODY_LIMIT,
        }
    }
}

impl<C> ClassifyLayer<C> {
    /// The classifier.
    pub fn classifier(&self) -> &C {
        &self.classifier
    }

    /// The error-body limit in bytes.
    pub fn error_body_limit(&self) -> usize {
        self.error_body_limit
    }
}

impl Default for ClassifyLayer<AutoClassifier> {
    fn default() -> Self {
        ClassifyLayer::new()
    }
}

impl<S, C: Clone> Layer<S> for ClassifyLayer<C> {
    type Service = Classify<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Classify::from_parts(inner, self.classifier.clone(), self.error_body_limit)
    }
}

/// Settings of a [`ClassifyLayer`]; every setting starts at the default documented on its
/// method, and [`build`](Self::build) checks them.
#[derive(Debug, Clone, Copy)]
pub struct ClassifyBuilder<C = AutoClassifier> {
    classifier: C,
    error_body_limit: usize,
}

impl<C> ClassifyBuilder<C> {
    /// Classifies with `classifier` instead of the [`AutoClassifier`].
    pub fn classifier<C2>(self, classifier: C2) -> ClassifyBuilder<C2> {
        ClassifyBuilder {
            classifier,
            error_body_limit: self.error_body_limit,
        }
    }

    /// The most bytes of an error body read before classifying (default 64 KiB, at least 1).
    pub fn error_body_limit(mut self, bytes: usize) -> Self {
        self.error_body_limit = bytes;
        self
    }

    /// Checks the settings and builds the layer. An error-body limit of 0 is refused: the
    /// classifier would never see the provider's error code.
    pub fn build(self) -> Result<ClassifyLayer<C>, ConfigError> {
        if self.error_body_limit == 0 {
            return Err(ConfigError::new(
                "error_body_limit",
                "must be at least 1 byte",
            ));
        }
        Ok(ClassifyLayer {
            classifier: self.classifier,
            error_body_limit: self.error_body_limit,
        })
    }
}
