//! [`ContextGuardLayer`] and its [`ContextGuardBuilder`].

use std::sync::Arc;

use seawall_core::ConfigError;
use tower_layer::Layer;

use crate::estimate::TokenEstimator;
use crate::policy::ContextPolicy;
use crate::service::{ContextGuard, Guard};
use crate::windows::ContextWindows;

/// Puts a [`ContextGuard`] in front of a service: each request is checked against its
/// model's context window before it is sent.
///
/// Defaults: [`ContextPolicy::Refuse`], counted by the
/// [`CharEstimate`](crate::CharEstimate). Every service the layer makes, and every clone,
/// shares one table and one estimator.
///
/// ```
/// use seawall_guard::{ContextGuardLayer, ContextPolicy, ContextWindows, ModelLimits};
///
/// let windows = ContextWindows::new().with("gpt-4o*", ModelLimits::new(128_000));
/// let layer = ContextGuardLayer::builder(windows)
///     .policy(ContextPolicy::lower_max_tokens(256))
///     .build()?;
/// assert_eq!(layer.policy(), ContextPolicy::LowerMaxTokens { floor: 256 });
/// # Ok::<(), seawall_core::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ContextGuardLayer {
    guard: Arc<Guard>,
}

impl ContextGuardLayer {
    /// A layer over `windows` with the defaults: refuse what does not fit.
    pub fn new(windows: ContextWindows) -> Self {
        ContextGuardLayer {
            guard: Arc::new(Guard::new(windows)),
        }
    }

    /// A builder over `windows`, starting from the defaults.
    pub fn builder(windows: ContextWindows) -> ContextGuardBuilder {
        ContextGuardBuilder {
            guard: Guard::new(windows),
        }
    }

    /// The policy.
    pub fn policy(&self) -> ContextPolicy {
        self.guard.policy
    }

    /// The table of context windows.
    pub fn windows(&self) -> &ContextWindows {
        &self.guard.windows
    }
}

impl<S> Layer<S> for ContextGuardLayer {
    type Service = ContextGuard<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ContextGuard::from_shared(inner, self.guard.clone())
    }
}

/// Settings of a [`ContextGuardLayer`]; every setting starts at the default documented on its
/// method, and [`build`](Self::build) checks them.
#[derive(Debug)]
pub struct ContextGuardBuilder {
    guard: Guard,
}

impl ContextGuardBuilder {
    /// What to do with a request that does not fit (default [`ContextPolicy::Refuse`]).
    pub fn policy(mut self, policy: ContextPolicy) -> Self {
        self.guard.policy = policy;
        self
    }

    /// Counts prompts with `estimator` instead of the [`CharEstimate`](crate::CharEstimate).
    pub fn estimator(mut self, estimator: impl TokenEstimator) -> Self {
        self.guard.estimator = Arc::new(estimator);
        self
    }

    /// Checks the settings and builds the layer. A [`ContextPolicy::LowerMaxTokens`] floor of
    /// 0 is refused: an answer of no tokens is not worth a call.
    pub fn build(self) -> Result<ContextGuardLayer, ConfigError> {
        if self.guard.policy == (ContextPolicy::LowerMaxTokens { floor: 0 }) {
            return Err(ConfigError::new(
                "policy",
                "the `LowerMaxTokens` floor must be at least 1 token",
            ));
        }
        Ok(ContextGuardLayer {
            guard: Arc::new(self.guard),
        })
    }
}
