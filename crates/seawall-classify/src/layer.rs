//! [`ClassifyLayer`].

use tower_layer::Layer;

use crate::classifier::AutoClassifier;
use crate::service::Classify;

/// The default error-body limit: 64 KiB.
pub const DEFAULT_ERROR_BODY_LIMIT: usize = 64 * 1024;

/// Puts a [`Classify`] next to an HTTP transport, turning statuses, headers, error bodies,
/// in-stream errors and transport errors into [`LlmError`](seawall_core::LlmError)s.
///
/// Defaults: the [`AutoClassifier`] (OpenAI-compatible and Anthropic), and error bodies read up
/// to 64 KiB (the rest is dropped unread).
#[derive(Debug, Clone, Copy)]
pub struct ClassifyLayer<C = AutoClassifier> {
    classifier: C,
    error_body_limit: usize,
}

impl<C> ClassifyLayer<C> {
    /// A layer classifying with `classifier`.
    pub fn new(classifier: C) -> Self {
        ClassifyLayer {
            classifier,
            error_body_limit: DEFAULT_ERROR_BODY_LIMIT,
        }
    }

    /// Sets the most bytes of an error body read before classifying (default 64 KiB).
    pub fn with_error_body_limit(mut self, bytes: usize) -> Self {
        self.error_body_limit = bytes;
        self
    }

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
        ClassifyLayer::new(AutoClassifier)
    }
}

impl<S, C: Clone> Layer<S> for ClassifyLayer<C> {
    type Service = Classify<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Classify::new(inner, self.classifier.clone()).with_error_body_limit(self.error_body_limit)
    }
}
