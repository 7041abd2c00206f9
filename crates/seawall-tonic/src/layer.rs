//! [`GrpcClassifyLayer`]: the gRPC counterpart of `ClassifyLayer`, next to a tonic client.

use tower_layer::Layer;

use crate::service::GrpcClassify;

/// Wraps a `Service<Req, Error = tonic::Status>` (a tonic client method behind
/// `tower::service_fn`, say) so that its errors are classified [`LlmError`]s
/// ([`classify_status`]) and its responses are [`GrpcResponse`]s, which seawall's retry,
/// breaker and observe layers can sit outside of. See the [crate docs](crate) for a stack.
///
/// [`LlmError`]: seawall_core::LlmError
/// [`classify_status`]: crate::classify_status
/// [`GrpcResponse`]: crate::GrpcResponse
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcClassifyLayer {
    _private: (),
}

impl GrpcClassifyLayer {
    /// The layer. It has no settings: the classification rules are in [`classify_status`].
    ///
    /// [`classify_status`]: crate::classify_status
    pub fn new() -> Self {
        GrpcClassifyLayer::default()
    }
}

impl<S> Layer<S> for GrpcClassifyLayer {
    type Service = GrpcClassify<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcClassify::new(inner)
    }
}
