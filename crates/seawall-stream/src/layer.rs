//! [`StreamTimeoutLayer`] and its [`StreamTimeoutBuilder`]: the stream timeouts'
//! configuration.

use std::time::Duration;

use seawall_core::ConfigError;
use tower_layer::Layer;

use crate::config::StreamTimeouts;
use crate::service::StreamTimeout;

/// Applies [`StreamTimeouts`] and the commit point to a service's responses.
///
/// The configuration is plain data: the layer holds no shared state, so cloning it (or
/// calling [`Layer::layer`] many times) is free.
///
/// ```
/// use std::time::Duration;
/// use seawall_stream::StreamTimeoutLayer;
///
/// let layer = StreamTimeoutLayer::builder()
///     .first_token(Duration::from_secs(20))
///     .idle(Duration::from_secs(10))
///     .build()?;
/// assert_eq!(layer.config().first_token(), Some(Duration::from_secs(20)));
/// # Ok::<(), seawall_stream::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamTimeoutLayer {
    config: StreamTimeouts,
}

impl StreamTimeoutLayer {
    /// A layer with the defaults listed on [`StreamTimeouts`].
    pub fn new() -> Self {
        StreamTimeoutLayer {
            config: StreamTimeouts::new(),
        }
    }

    /// A builder starting from the defaults listed on [`StreamTimeouts`].
    pub fn builder() -> StreamTimeoutBuilder {
        StreamTimeoutBuilder {
            config: StreamTimeouts::new(),
        }
    }

    /// The timeouts it enforces.
    pub fn config(&self) -> &StreamTimeouts {
        &self.config
    }
}

impl<S> Layer<S> for StreamTimeoutLayer {
    type Service = StreamTimeout<S>;

    fn layer(&self, inner: S) -> StreamTimeout<S> {
        StreamTimeout::from_config(inner, self.config)
    }
}

/// Settings of a [`StreamTimeoutLayer`]. Every setting starts at the default listed on
/// [`StreamTimeouts`]; `None` switches a timeout off.
#[derive(Debug, Clone, Copy)]
pub struct StreamTimeoutBuilder {
    config: StreamTimeouts,
}

impl StreamTimeoutBuilder {
    /// Replaces every setting with `timeouts` (e.g. [`StreamTimeouts::none`]).
    pub fn timeouts(mut self, timeouts: StreamTimeouts) -> Self {
        self.config = timeouts;
        self
    }

    /// The attempt timeout: the longest wait for the response head (default 300 s).
    pub fn attempt(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.config = self.config.with_attempt(timeout);
        self
    }

    /// The time-to-first-token timeout of a streamed response (default 60 s); see
    /// [`StreamTimeouts::with_first_token`].
    pub fn first_token(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.config = self.config.with_first_token(timeout);
        self
    }

    /// The longest gap between two body frames once content flows (default 30 s).
    pub fn idle(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.config = self.config.with_idle(timeout);
        self
    }

    /// The total deadline of an attempt, from the call to the end of its body (default none).
    pub fn total(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.config = self.config.with_total(timeout);
        self
    }

    /// How many bytes of content-free frames are held before the commit point (default
    /// 64 KiB).
    pub fn max_buffer(mut self, bytes: usize) -> Self {
        self.config = self.config.with_max_buffer(bytes);
        self
    }

    /// Builds the layer. Every combination is accepted today (a zero timeout fires at once,
    /// a huge one never); the `Result` is the one every seawall builder returns.
    pub fn build(self) -> Result<StreamTimeoutLayer, ConfigError> {
        Ok(StreamTimeoutLayer {
            config: self.config,
        })
    }
}
