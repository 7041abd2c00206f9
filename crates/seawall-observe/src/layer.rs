//! The observe layer's configuration: which recorder receives the records and which
//! configuration version they are stamped with, shared by every service the layer makes.

use std::sync::Arc;

use tower_layer::Layer;

use crate::record::{NoopRecorder, Recorder};
use crate::service::Observe;

/// Applies [`Observe`] to a service: one record per logical call.
///
/// Every service this layer makes shares its recorder.
#[derive(Clone)]
pub struct ObserveLayer {
    recorder: Arc<dyn Recorder>,
    config_version: Option<Arc<str>>,
}

impl ObserveLayer {
    /// A layer that only fills its `tracing` span (no recorder).
    pub fn new() -> Self {
        ObserveLayer {
            recorder: Arc::new(NoopRecorder),
            config_version: None,
        }
    }

    /// Sends every record to `recorder` as well (combine several with a tuple).
    pub fn recorder(mut self, recorder: impl Recorder) -> Self {
        self.recorder = Arc::new(recorder);
        self
    }

    /// Sends every record to a shared recorder (to read it back, e.g. a [`Summary`](crate::Summary)).
    pub fn shared_recorder(mut self, recorder: Arc<dyn Recorder>) -> Self {
        self.recorder = recorder;
        self
    }

    /// Tags every record with a configuration version, to compare deployments.
    pub fn config_version(mut self, version: impl Into<Arc<str>>) -> Self {
        self.config_version = Some(version.into());
        self
    }
}

impl Default for ObserveLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for ObserveLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObserveLayer")
            .field("config_version", &self.config_version)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Observe::new(inner, self.recorder.clone(), self.config_version.clone())
    }
}
