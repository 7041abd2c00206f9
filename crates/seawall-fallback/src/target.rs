//! Fallback targets: where a request goes when the primary path has failed.

use std::fmt;
use std::sync::Arc;

use seawall_core::{LlmError, LlmRequest, redact};
use tower::ServiceExt;
use tower::util::BoxCloneSyncService;
use tower_service::Service;

type Rewrite<Req> = Arc<dyn Fn(&mut Req) -> Result<(), LlmError> + Send + Sync>;

pub(crate) enum Route<Req, Resp> {
    /// The service the layer wraps (the primary path, with its own retry/breaker stack).
    Primary,
    /// Another service: another provider's transport with its own stack of layers.
    Service(BoxCloneSyncService<Req, Resp, LlmError>),
}

impl<Req, Resp> Clone for Route<Req, Resp> {
    fn clone(&self) -> Self {
        match self {
            Route::Primary => Route::Primary,
            Route::Service(s) => Route::Service(s.clone()),
        }
    }
}

/// One alternative in a fallback chain.
///
/// A target is either a rewrite of the caller's request sent to the *same* service the layer
/// wraps (another model with [`Target::model`], another API key with [`Target::rewrite`]), or
/// the request sent to *another* service ([`Target::service`]): another provider's transport
/// with its own stack of layers. Both kinds can take a model and a rewrite, and both kinds mix
/// in one chain.
///
/// Names and models are shown in errors, logs and the [`ServedBy`](seawall_core::ServedBy)
/// extension; they pass through [`redact`] when the target is built, and a rewrite closure
/// (which may hold an API key) is never printed.
///
/// ```
/// use bytes::Bytes;
/// use http::{HeaderValue, Request, Response};
/// use seawall_core::LlmError;
/// use seawall_fallback::Target;
///
/// type Resp = Response<http_body_util::Full<Bytes>>;
///
/// // The same service, a smaller model.
/// let mini: Target<Request<Bytes>, Resp> = Target::model("gpt-4o-mini");
/// // The same service and model, the organisation's backup key.
/// let backup_key: Target<Request<Bytes>, Resp> = Target::rewrite("backup-key", |req: &mut Request<Bytes>| {
///     let key = HeaderValue::from_static("Bearer sk-backup-0000000000");
///     req.headers_mut().insert(http::header::AUTHORIZATION, key);
///     Ok::<(), LlmError>(())
/// });
/// assert_eq!(mini.name(), "gpt-4o-mini");
/// assert!(!format!("{backup_key:?}").contains("sk-backup"));
/// ```
pub struct Target<Req, Resp> {
    name: Arc<str>,
    model: Option<Arc<str>>,
    rewrite: Option<Rewrite<Req>>,
    route: Route<Req, Resp>,
}

impl<Req, Resp> Target<Req, Resp> {
    /// The same service, with the request's model switched to `model` (through
    /// [`LlmRequest::set_model`]). The target is named after the model.
    pub fn model(model: impl AsRef<str>) -> Self {
        let model: Arc<str> = redact(model.as_ref()).into();
        Target {
            name: model.clone(),
            model: Some(model),
            rewrite: None,
            route: Route::Primary,
        }
    }

    /// The same service, with the request changed by `rewrite` (another API key through
    /// [`LlmRequest::headers_mut`], another endpoint, ...). An `Err` from the rewrite skips
    /// this target; the error is listed with the targets tried.
    pub fn rewrite<F>(name: impl AsRef<str>, rewrite: F) -> Self
    where
        F: Fn(&mut Req) -> Result<(), LlmError> + Send + Sync + 'static,
    {
        Target {
            name: redact(name.as_ref()).into(),
            model: None,
            rewrite: Some(Arc::new(rewrite)),
            route: Route::Primary,
        }
    }

    /// Another service: another provider's transport with its own stack of layers. Its
    /// response type must be the primary's; for HTTP stacks whose body types differ, map each
    /// stack's responses through [`box_response`](crate::box_response).
    pub fn service<S>(name: impl AsRef<str>, service: S) -> Self
    where
        S: Service<Req, Response = Resp> + Clone + Send + Sync + 'static,
        S::Error: Into<LlmError>,
        S::Future: Send + 'static,
        Req: 'static,
        Resp: 'static,
    {
        Target {
            name: redact(name.as_ref()).into(),
            model: None,
            rewrite: None,
            route: Route::Service(BoxCloneSyncService::new(
                service.map_err(Into::<LlmError>::into),
            )),
        }
    }

    /// Also switches the request's model to `model` before it is sent.
    pub fn with_model(mut self, model: impl AsRef<str>) -> Self {
        self.model = Some(redact(model.as_ref()).into());
        self
    }

    /// Also changes the request with `rewrite` (after the model switch, if any). Replaces an
    /// earlier rewrite.
    pub fn with_rewrite<F>(mut self, rewrite: F) -> Self
    where
        F: Fn(&mut Req) -> Result<(), LlmError> + Send + Sync + 'static,
    {
        self.rewrite = Some(Arc::new(rewrite));
        self
    }

    /// Renames the target (the name shown in [`ServedBy`](seawall_core::ServedBy) and errors).
    pub fn with_name(mut self, name: impl AsRef<str>) -> Self {
        self.name = redact(name.as_ref()).into();
        self
    }

    /// The target's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model the target switches to, if it does.
    pub fn model_name(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// Whether the target sends to the service the layer wraps (rather than another one).
    pub fn uses_primary(&self) -> bool {
        matches!(self.route, Route::Primary)
    }

    pub(crate) fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    pub(crate) fn model_arc(&self) -> Option<&Arc<str>> {
        self.model.as_ref()
    }

    pub(crate) fn route(&self) -> &Route<Req, Resp> {
        &self.route
    }

    /// Applies the model switch and the rewrite to a copy of the caller's request.
    pub(crate) fn prepare(&self, req: &mut Req) -> Result<(), LlmError>
    where
        Req: LlmRequest,
    {
        if let Some(model) = &self.model {
            req.set_model(model)?;
        }
        if let Some(rewrite) = &self.rewrite {
            rewrite(req)?;
        }
        req.prepare();
        Ok(())
    }
}

impl<Req, Resp> Clone for Target<Req, Resp> {
    fn clone(&self) -> Self {
        Target {
            name: self.name.clone(),
            model: self.model.clone(),
            rewrite: self.rewrite.clone(),
            route: self.route.clone(),
        }
    }
}

impl<Req, Resp> fmt::Debug for Target<Req, Resp> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("model", &self.model)
            .field("rewrite", &self.rewrite.is_some())
            .field(
                "route",
                &match self.route {
                    Route::Primary => "primary",
                    Route::Service(_) => "service",
                },
            )
            .finish()
    }
}
