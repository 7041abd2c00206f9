//! The layer.

use tower_layer::Layer;

use crate::config::StreamTimeouts;
use crate::service::StreamTimeout;

/// Applies [`StreamTimeouts`] and the commit point to a service's responses.
///
/// The configuration is plain data: the layer holds no shared state, so cloning it (or
/// calling [`Layer::layer`] many times) is free.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamTimeoutLayer {
    config: StreamTimeouts,
}

impl StreamTimeoutLayer {
    /// A layer enforcing `config`.
    pub fn new(config: StreamTimeouts) -> Self {
        StreamTimeoutLayer { config }
    }

    /// The timeouts it enforces.
    pub fn config(&self) -> &StreamTimeouts {
        &self.config
    }
}

impl<S> Layer<S> for StreamTimeoutLayer {
    type Service = StreamTimeout<S>;

    fn layer(&self, inner: S) -> StreamTimeout<S> {
        StreamTimeout::new(inner, self.config)
    }
}
