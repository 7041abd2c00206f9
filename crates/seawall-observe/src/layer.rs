//! The observe layer's configuration: which recorder receives the records and which
//! configuration version they are stamped with, shared by every service the layer makes.

use std::fmt;
use std::sync::Arc;

use seawall_core::ConfigError;
use tower_layer::Layer;

use crate::record::{NoopRecorder, Recorder};
use crate::service::Observe;

/// Applies [`Observe`] to a service: one record per logical call.
///
/// Every service this layer makes shares its recorder.
///
/// ```
/// use std::sync::Arc;
/// use seawall_observe::{ObserveLayer, Summary};
///
/// let summary = Arc::new(Summary::new());
/// let layer = ObserveLayer::builder()
///     .shared_recorder(summary.clone())
///     .config_version("v42")
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), seawall_observe::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct ObserveLayer {
    recorder: Arc<dyn Recorder>,
    config_version: Option<Arc<str>>,
}

impl ObserveLayer {
    /// A layer that only fills its `tracing` span (no recorder, no configuration version).
    pub fn new() -> Self {
        ObserveLayer {
            recorder: Arc::new(NoopRecorder),
            config_version: None,
        }
    }

    /// A builder starting from the defaults of [`new`](Self::new).
    pub fn builder() -> ObserveBuilder {
        ObserveBuilder {
            recorder: Arc::new(NoopRecorder),
            config_version: None,
        }
    }

    /// The configuration version every record is tagged with, if any.
    pub fn config_version(&self) -> Option<&str> {
        self.config_version.as_deref()
    }
}

impl Default for ObserveLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ObserveLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObserveLayer")
            .field("config_version", &self.config_version)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Observe::from_parts(inner, self.recorder.clone(), self.config_version.clone())
    }
}

/// Settings of an [`ObserveLayer`]: by default no recorder (only the `tracing` span) and no
/// configuration version.
#[derive(Clone)]
pub struct ObserveBuilder {
    recorder: Arc<dyn Recorder>,
    config_version: Option<Arc<str>>,
}

impl ObserveBuilder {
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

    /// Checks the settings and builds the layer. An empty configuration version is refused:
    /// it would tag records with nothing to compare.
    pub fn build(self) -> Result<ObserveLayer, ConfigError> {
        if self.config_version.as_deref() == Some("") {
            return Err(ConfigError::new("config_version", "must not be empty"));
        }
        Ok(ObserveLayer {
            recorder: self.recorder,
            config_version: self.config_version,
        })
    }
}

impl fmt::Debug for ObserveBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObserveBuilder")
            .field("config_version", &self.config_version)
            .finish_non_exhaustive()
    }
}
