//! The fallback layer's configuration: the target lists, the last resorts and the limits that
//! every service made by one layer shares.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use seawall_core::{ConfigError, Dispositions, LlmError};
use tower_layer::Layer;

use crate::cache::{Cache, Replay, RequestKey, ResponseCache};
use crate::service::Fallback;
use crate::state::{Shared, debug_shared};
use crate::target::Target;

/// Sends a request to the next target of a fallback chain when the primary path has failed
/// for good, and answers from a cache or a degraded response as a last resort.
///
/// Build it with [`FallbackLayer::builder`], or [`FallbackLayer::new`] for a plain chain. All
/// services the layer makes share one configuration (and one cache).
///
/// Defaults: no targets, at most 3 fallbacks per call, no overall deadline, no cache, no
/// degraded response, and the fallback lists chosen by
/// [`Dispositions::default`].
pub struct FallbackLayer<Req, Resp> {
    shared: Arc<Shared<Req, Resp>>,
}

impl<Req, Resp> FallbackLayer<Req, Resp> {
    /// A layer with a regular fallback chain and the defaults otherwise.
    pub fn new(targets: impl IntoIterator<Item = Target<Req, Resp>>) -> Self {
        FallbackLayer {
            shared: Arc::new(Shared::with_targets(targets)),
        }
    }

    /// A builder with the defaults.
    pub fn builder() -> FallbackBuilder<Req, Resp> {
        FallbackBuilder {
            shared: Shared::new(),
        }
    }

    /// The regular chain (availability failures: overload, server errors, quota, auth,
    /// circuit open, ...).
    pub fn targets(&self) -> &[Target<Req, Resp>] {
        &self.shared.regular
    }

    /// The larger-context models, for `ContextLengthExceeded`.
    pub fn larger_context_targets(&self) -> &[Target<Req, Resp>] {
        &self.shared.larger_context
    }

    /// The content-policy list, for `ContentFiltered`.
    pub fn content_policy_targets(&self) -> &[Target<Req, Resp>] {
        &self.shared.content_policy
    }

    /// The most targets tried after the primary in one call.
    pub fn max_fallbacks(&self) -> usize {
        self.shared.max_fallbacks
    }

    /// The overall deadline of a call, if set.
    pub fn deadline(&self) -> Option<Duration> {
        self.shared.deadline
    }

    /// The number of cached responses and their total size in bytes (zeros without a cache).
    pub fn cache_usage(&self) -> (usize, usize) {
        self.shared.cache.as_ref().map_or((0, 0), |c| c.usage())
    }
}

impl<Req, Resp> Clone for FallbackLayer<Req, Resp> {
    fn clone(&self) -> Self {
        FallbackLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<Req, Resp> fmt::Debug for FallbackLayer<Req, Resp> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_shared(&self.shared, f.debug_struct("FallbackLayer"))
    }
}

/// Wrapping a service clones it once when some target is routed to it, for those targets'
/// [spare](seawall_core::Spare).
impl<S: Clone, Req, Resp> Layer<S> for FallbackLayer<Req, Resp> {
    type Service = Fallback<S, Req, Resp>;

    fn layer(&self, inner: S) -> Self::Service {
        Fallback::from_shared(inner, self.shared.clone())
    }
}

/// Builds a [`FallbackLayer`].
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use seawall_fallback::{FallbackLayer, ResponseCache, Target};
///
/// let layer: FallbackLayer<Request<Bytes>, Response<Full<Bytes>>> = FallbackLayer::builder()
///     .target(Target::model("gpt-4o-mini"))
///     .larger_context(Target::model("gpt-4.1"))
///     .max_fallbacks(2)
///     .deadline(Duration::from_secs(60))
///     .cache(ResponseCache::new(Duration::from_secs(300)))
///     .degraded(|_req, _err| Response::new(Full::from("{\"degraded\":true}")))
///     .build()?;
/// assert_eq!(layer.max_fallbacks(), 2);
/// # Ok::<(), seawall_fallback::ConfigError>(())
/// ```
pub struct FallbackBuilder<Req, Resp> {
    shared: Shared<Req, Resp>,
}

impl<Req, Resp> FallbackBuilder<Req, Resp> {
    /// Appends a target to the regular chain, tried in order for failures whose disposition
    /// is [`Fallback::Yes`](seawall_core::Fallback::Yes).
    pub fn target(mut self, target: Target<Req, Resp>) -> Self {
        self.shared.regular.push(target);
        self
    }

    /// Appends targets to the regular chain.
    pub fn targets(mut self, targets: impl IntoIterator<Item = Target<Req, Resp>>) -> Self {
        self.shared.regular.extend(targets);
        self
    }

    /// Appends a larger-context model, tried in order for failures whose disposition is
    /// [`Fallback::LargerContext`](seawall_core::Fallback::LargerContext) (`ContextLengthExceeded`).
    pub fn larger_context(mut self, target: Target<Req, Resp>) -> Self {
        self.shared.larger_context.push(target);
        self
    }

    /// Appends a target to the content-policy list, tried for failures whose disposition is
    /// [`Fallback::ContentPolicy`](seawall_core::Fallback::ContentPolicy) (`ContentFiltered`). Without one, filtered requests fail.
    pub fn content_policy(mut self, target: Target<Req, Resp>) -> Self {
        self.shared.content_policy.push(target);
        self
    }

    /// The most targets tried after the primary in one call (default 3; 0 leaves only the
    /// last resort).
    pub fn max_fallbacks(mut self, n: usize) -> Self {
        self.shared.max_fallbacks = n;
        self
    }

    /// The overall deadline of a call, from `call` to a response: no target is started after
    /// it, and a target still running at it is cancelled. The primary gets all of it, so give
    /// the inner retry layer a smaller time budget to leave room for fallbacks. A caller's
    /// [`Deadline`](seawall_core::Deadline) on the request bounds the chain the same way, and
    /// the earlier of the two wins; a call that arrives past the caller's deadline starts no
    /// target at all.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.shared.deadline = Some(deadline);
        self
    }

    /// Overrides which failure classes fall back, and to which list.
    pub fn dispositions(mut self, dispositions: Dispositions) -> Self {
        self.shared.dispositions = dispositions;
        self
    }

    /// Keeps the last good response to each identical, non-streaming request, to answer with
    /// when every target has failed.
    pub fn cache(mut self, cache: ResponseCache) -> Self
    where
        Req: RequestKey,
        Resp: Replay + Send + 'static,
    {
        self.shared.cache = Some(Box::new(Cache::<Resp::Snapshot>::new(cache)));
        self
    }

    /// The static degraded response, built from the request and the final error, to answer
    /// with when every target has failed and no cached answer is there.
    pub fn degraded<F>(mut self, degraded: F) -> Self
    where
        F: Fn(&Req, &LlmError) -> Resp + Send + Sync + 'static,
    {
        self.shared.degraded = Some(Box::new(degraded));
        self
    }

    /// Builds the layer. Every combination is accepted today (a zero deadline leaves only
    /// the last resort); the `Result` is the one every seawall builder returns.
    pub fn build(mut self) -> Result<FallbackLayer<Req, Resp>, ConfigError> {
        self.shared.finish();
        Ok(FallbackLayer {
            shared: Arc::new(self.shared),
        })
    }
}

impl<Req, Resp> fmt::Debug for FallbackBuilder<Req, Resp> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_shared(&self.shared, f.debug_struct("FallbackBuilder"))
    }
}
