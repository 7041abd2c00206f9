//! Where requests go and which credentials they carry: the upstream configurations every
//! transport shares.
//!
//! They live in core, not in a transport crate, because seawall has more than one transport
//! (its own hyper client, a user's `reqwest::Client`, a custom one) and a provider's base URL,
//! credential headers and environment variables are the same fact for all of them.

use std::fmt;
use std::sync::Arc;

use crate::{ConfigError, FailureClass, LlmError};
use http::header::{AUTHORIZATION, CONTENT_TYPE, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, Uri};

/// The variable an environment lookup reads is missing (or empty).
const NOT_SET: &str = "the environment variable is not set (or is empty)";

fn missing(var: &'static str) -> ConfigError {
    ConfigError::new(var, NOT_SET)
}

fn bad_base_url(why: impl Into<String>) -> ConfigError {
    ConfigError::new("base_url", why.into())
}

fn bad_header(name: &str) -> ConfigError {
    ConfigError::new("header", format!("{name:?} is not a valid header"))
}

fn bad_api_key() -> ConfigError {
    ConfigError::new("api_key", "empty, or not valid in an HTTP header")
}

/// An API key. Its `Debug` shows `ApiKey([REDACTED])`; it has no `Display`.
///
/// ```
/// use seawall_core::upstream::ApiKey;
/// let key = ApiKey::new("sk-proj-0123456789abcdef").unwrap();
/// assert_eq!(format!("{key:?}"), "ApiKey([REDACTED])");
/// assert!(ApiKey::new("  ").is_err());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(Arc<str>);

impl ApiKey {
    /// A key; surrounding whitespace (a trailing newline from a file, say) is trimmed.
    pub fn new(key: impl AsRef<str>) -> Result<Self, ConfigError> {
        let key = key.as_ref().trim();
        if key.is_empty() || HeaderValue::from_str(key).is_err() {
            return Err(bad_api_key());
        }
        Ok(ApiKey(key.into()))
    }

    /// The key itself, for a header the transport does not set.
    pub fn expose(&self) -> &str {
        &self.0
    }

    fn header(&self, prefix: &str) -> HeaderValue {
        let mut v = HeaderValue::from_str(&format!("{prefix}{}", self.0))
            .unwrap_or_else(|_| HeaderValue::from_static(""));
        v.set_sensitive(true);
        v
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([REDACTED])")
    }
}

/// A base URL and the headers every request to it carries (credentials, API version).
///
/// The transport resolves a relative request URI (`/chat/completions`) against the base URL
/// (`https://api.openai.com/v1` gives `https://api.openai.com/v1/chat/completions`) and adds
/// these headers, unless the request already has them. A request with an absolute URI to another
/// origin gets none of them: credentials never leave for a host they were not configured for.
#[derive(Clone)]
pub struct Upstream {
    scheme: Scheme,
    authority: Authority,
    base_path: Box<str>,
    headers: HeaderMap,
    /// `name=value` pairs every request carries in its query (Azure's `api-version`).
    query: Option<Box<str>>,
    /// Azure's deployment paths: `/chat/completions` goes to `/deployments/{model}/chat/completions`.
    deployments: bool,
}

impl Upstream {
    /// An upstream at `base_url`, which must be an absolute `http://` or `https://` URL
    /// without a query (a trailing `/` is ignored).
    pub fn new(base_url: &str) -> Result<Self, ConfigError> {
        let uri: Uri = base_url
            .trim()
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad_base_url(e.to_string()))?;
        let scheme = uri
            .scheme()
            .filter(|s| **s == Scheme::HTTP || **s == Scheme::HTTPS)
            .cloned()
            .ok_or_else(|| bad_base_url("the scheme must be http or https"))?;
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| bad_base_url("no host"))?;
        if authority.as_str().contains('@') {
            return Err(bad_base_url(
                "credentials in the URL are not supported; use an API key",
            ));
        }
        if uri.query().is_some() {
            return Err(bad_base_url("a query is not supported in a base URL"));
        }
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Ok(Upstream {
            scheme,
            authority,
            base_path: uri.path().trim_end_matches('/').into(),
            headers,
            query: None,
            deployments: false,
        })
    }

    /// Adds `Authorization: Bearer <key>` (OpenAI and compatible servers).
    pub fn with_bearer(mut self, key: &ApiKey) -> Self {
        self.headers.insert(AUTHORIZATION, key.header("Bearer "));
        self
    }

    /// Adds a header whose value is a credential (`x-api-key`, Azure's `api-key`): marked
    /// sensitive, never shown by `Debug`.
    pub fn with_key_header(mut self, name: &str, key: &ApiKey) -> Result<Self, ConfigError> {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad_header(name))?;
        self.headers.insert(name, key.header(""));
        Ok(self)
    }

    /// Adds a plain header (`anthropic-version`, `OpenAI-Organization`, ...).
    pub fn with_header(mut self, name: &str, value: &str) -> Result<Self, ConfigError> {
        let bad = || bad_header(name);
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
        let value = HeaderValue::from_str(value).map_err(|_| bad())?;
        self.headers.insert(name, value);
        Ok(self)
    }

    /// Adds `name=value` to the query of every request (Azure's `api-version`), unless the
    /// request's own query names it. Both must be plain URL characters (letters, digits,
    /// `-._~`).
    pub fn with_query(mut self, name: &str, value: &str) -> Result<Self, ConfigError> {
        let plain = |t: &str| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
        };
        if !plain(name) || !plain(value) {
            return Err(ConfigError::new(
                "query",
                format!("{name:?}={value:?} is not a plain query parameter"),
            ));
        }
        let pair = format!("{name}={value}");
        self.query = Some(match self.query.take() {
            Some(q) => format!("{q}&{pair}").into(),
            None => pair.into(),
        });
        Ok(self)
    }

    /// Routes by deployment, as Azure OpenAI's deployment API does: a relative request to
    /// `/chat/completions`, `/completions`, `/embeddings`, `/audio/...` or
    /// `/images/generations` goes to `/deployments/{model}/...`, where `{model}` is the
    /// request body's `model` (the deployment name). So fallback by model works as on any
    /// other upstream: the fallback model is another deployment.
    pub fn with_deployment_routing(mut self) -> Self {
        self.deployments = true;
        self
    }

    /// The base URL.
    pub fn base_url(&self) -> String {
        format!("{}://{}{}", self.scheme, self.authority, self.base_path)
    }

    /// The headers every request to this upstream carries.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// Whether `uri` points at this upstream's origin.
    pub fn same_origin(&self, uri: &Uri) -> bool {
        let port = |a: &Authority| {
            a.port_u16().unwrap_or(if self.scheme == Scheme::HTTPS {
                443
            } else {
                80
            })
        };
        uri.scheme() == Some(&self.scheme)
            && uri.authority().is_some_and(|a| {
                a.host().eq_ignore_ascii_case(self.authority.host())
                    && port(a) == port(&self.authority)
            })
    }

    /// Joins a relative request URI onto the base URL, adding the upstream's query
    /// parameters (see [`with_query`](Self::with_query)).
    pub fn join(&self, uri: &Uri) -> Result<Uri, http::Error> {
        self.join_at(uri, None)
    }

    /// [`join`](Self::join), under `/deployments/{deployment}` when one is given.
    fn join_at(&self, uri: &Uri, deployment: Option<&str>) -> Result<Uri, http::Error> {
        let pq = uri.path_and_query().map_or("/", PathAndQuery::as_str);
        let sep = if pq.starts_with('/') { "" } else { "/" };
        let mut joined = match deployment {
            Some(d) => format!("{}/deployments/{d}{sep}{pq}", self.base_path),
            None => format!("{}{sep}{pq}", self.base_path),
        };
        if let Some(extra) = &self.query {
            let own = uri.query().unwrap_or("");
            for pair in extra.split('&') {
                let name = pair.split('=').next().unwrap_or(pair);
                let named = own.split('&').any(|p| p.split('=').next() == Some(name));
                if !named {
                    joined.push(if joined.contains('?') { '&' } else { '?' });
                    joined.push_str(pair);
                }
            }
        }
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(joined)
            .build()
    }
}

/// Points a request's head at `upstream`, as every transport does before sending.
///
/// A relative URI (`/chat/completions`) is joined onto the base URL; the upstream's headers are
/// added unless the request already has them. An absolute URI to the upstream's origin gets
/// the headers too; one to another origin gets none of them, so credentials never leave for a
/// host they were not configured for. A relative URI without an upstream is an
/// `InvalidRequest` error.
///
/// With [deployment routing](Upstream::with_deployment_routing), the deployment is the
/// model of the request's [`RequestMeta`](crate::RequestMeta) when a layer has parsed it, or
/// else the body's `model`; a missing model, or one that is not a plain deployment name
/// (letters, digits, `-`, `_`, `.`), is an `InvalidRequest` error: a model name never
/// becomes a path of its own choosing.
pub fn route(
    upstream: Option<&Upstream>,
    parts: &mut http::request::Parts,
    body: &[u8],
) -> Result<(), LlmError> {
    let upstream = match (upstream, parts.uri.authority().is_some()) {
        (Some(up), false) => {
            let deployment = match up.deployments && is_deployment_path(parts.uri.path()) {
                true => Some(deployment(parts, body)?),
                false => None,
            };
            parts.uri = up.join_at(&parts.uri, deployment.as_deref()).map_err(|e| {
                LlmError::new(
                    FailureClass::InvalidRequest,
                    format!("cannot join the request path onto the base URL: {e}"),
                )
            })?;
            Some(up)
        }
        (Some(up), true) => Some(up).filter(|up| up.same_origin(&parts.uri)),
        (None, false) => {
            return Err(LlmError::new(
                FailureClass::InvalidRequest,
                "a relative request URI needs a transport with an upstream base URL",
            ));
        }
        (None, true) => None,
    };
    if let Some(up) = upstream {
        for (name, value) in up.headers() {
            if !parts.headers.contains_key(name) {
                parts.headers.insert(name.clone(), value.clone());
            }
        }
    }
    Ok(())
}

/// The OpenAI API paths that Azure serves per deployment.
fn is_deployment_path(path: &str) -> bool {
    let path = path.trim_start_matches('/');
    [
        "chat/completions",
        "completions",
        "embeddings",
        "images/generations",
    ]
    .contains(&path)
        || path.starts_with("audio/")
}

/// The deployment a request names: its model.
fn deployment(parts: &http::request::Parts, body: &[u8]) -> Result<String, LlmError> {
    #[derive(serde::Deserialize)]
    struct Model<'a> {
        #[serde(borrow)]
        model: Option<std::borrow::Cow<'a, str>>,
    }
    let model: Option<String> = match parts.extensions.get::<crate::RequestMeta>() {
        Some(meta) => meta.model.as_deref().map(str::to_owned),
        None => serde_json::from_slice::<Model<'_>>(body)
            .ok()
            .and_then(|m| m.model)
            .map(|m| m.into_owned()),
    };
    let plain = |m: &str| {
        !m.is_empty()
            && m.len() <= 64
            && m.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && !m.starts_with('.')
    };
    match model {
        Some(m) if plain(&m) => Ok(m),
        Some(_) => Err(LlmError::from_static(
            FailureClass::InvalidRequest,
            "the model is not a valid deployment name (letters, digits, '-', '_', '.')",
        )),
        None => Err(LlmError::from_static(
            FailureClass::InvalidRequest,
            "a deployment-routed upstream needs the request's model (the deployment name)",
        )),
    }
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // HeaderMap's Debug prints `Sensitive` for values marked sensitive; names are kept.
        f.debug_struct("Upstream")
            .field("base_url", &self.base_url())
            .field("headers", &self.headers)
            .finish()
    }
}

/// Reads a variable, treating an empty value as unset.
fn var(lookup: &mut impl FnMut(&str) -> Option<String>, name: &str) -> Option<String> {
    lookup(name).filter(|v| !v.trim().is_empty())
}

/// An OpenAI or OpenAI-compatible endpoint (Azure OpenAI with a key header, DeepSeek, vLLM,
/// the seawall chaos upstream, ...).
///
/// ```
/// use seawall_core::upstream::{ApiKey, OpenAiConfig};
/// let cfg = OpenAiConfig::new(ApiKey::new("sk-test-0123456789").unwrap())
///     .with_base_url("https://api.deepseek.com/v1");
/// let up = cfg.upstream().unwrap();
/// assert_eq!(up.base_url(), "https://api.deepseek.com/v1");
/// assert!(!format!("{cfg:?}").contains("0123456789"));
/// ```
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    api_key: ApiKey,
    base_url: String,
    organization: Option<String>,
    project: Option<String>,
}

impl OpenAiConfig {
    /// The default base URL.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.openai.com/v1";

    /// A configuration for `api.openai.com` with this key.
    pub fn new(api_key: ApiKey) -> Self {
        OpenAiConfig {
            api_key,
            base_url: Self::DEFAULT_BASE_URL.to_owned(),
            organization: None,
            project: None,
        }
    }

    /// Reads `OPENAI_API_KEY` (required), `OPENAI_BASE_URL` (default
    /// `https://api.openai.com/v1`, as in OpenAI's SDKs: request paths are relative to it, e.g.
    /// `/chat/completions`), `OPENAI_ORG_ID` and `OPENAI_PROJECT_ID` (optional).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) with another source of variables.
    pub fn from_lookup(
        mut lookup: impl FnMut(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let key = var(&mut lookup, "OPENAI_API_KEY").ok_or_else(|| missing("OPENAI_API_KEY"))?;
        let mut cfg = OpenAiConfig::new(ApiKey::new(key)?);
        if let Some(url) = var(&mut lookup, "OPENAI_BASE_URL") {
            cfg.base_url = url;
        }
        cfg.organization = var(&mut lookup, "OPENAI_ORG_ID");
        cfg.project = var(&mut lookup, "OPENAI_PROJECT_ID");
        // Checked now, so a bad variable fails at start-up, not at the first call.
        cfg.upstream()?;
        Ok(cfg)
    }

    /// Gemini's OpenAI-compatible endpoint, from the variables Google's SDKs read:
    /// `GEMINI_API_KEY` (or else `GOOGLE_API_KEY`), and `GEMINI_BASE_URL` (default
    /// [`GEMINI_BASE_URL`](Self::GEMINI_BASE_URL)). Request paths are OpenAI's
    /// (`/chat/completions`), with Gemini model names.
    pub fn gemini_from_env() -> Result<Self, ConfigError> {
        Self::gemini_from_lookup(|name| std::env::var(name).ok())
    }

    /// [`gemini_from_env`](Self::gemini_from_env) with another source of variables.
    pub fn gemini_from_lookup(
        mut lookup: impl FnMut(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let key = var(&mut lookup, "GEMINI_API_KEY")
            .or_else(|| var(&mut lookup, "GOOGLE_API_KEY"))
            .ok_or_else(|| missing("GEMINI_API_KEY"))?;
        let base = var(&mut lookup, "GEMINI_BASE_URL");
        let cfg = OpenAiConfig::new(ApiKey::new(key)?)
            .with_base_url(base.as_deref().unwrap_or(Self::GEMINI_BASE_URL));
        cfg.upstream()?;
        Ok(cfg)
    }

    /// Gemini's OpenAI-compatible base URL.
    pub const GEMINI_BASE_URL: &'static str =
        "https://generativelanguage.googleapis.com/v1beta/openai";

    /// Any OpenAI-compatible server, from `{PREFIX}_API_KEY` (required) and
    /// `{PREFIX}_BASE_URL` (default `default_base_url`): the variables such providers'
    /// own docs use, e.g. `("DEEPSEEK", "https://api.deepseek.com")`,
    /// `("GROQ", "https://api.groq.com/openai/v1")`, `("MISTRAL", "https://api.mistral.ai/v1")`,
    /// `("OPENROUTER", "https://openrouter.ai/api/v1")`, or a self-hosted vLLM as
    /// `("VLLM", "http://127.0.0.1:8000/v1")`.
    ///
    /// ```
    /// use seawall_core::upstream::OpenAiConfig;
    /// let env = |name: &str| match name {
    ///     "DEEPSEEK_API_KEY" => Some("sk-deepseek-0123456789".to_owned()),
    ///     _ => None,
    /// };
    /// let cfg = OpenAiConfig::compatible_from_lookup("DEEPSEEK", "https://api.deepseek.com", env)
    ///     .unwrap();
    /// assert_eq!(cfg.base_url(), "https://api.deepseek.com");
    /// ```
    pub fn compatible_from_env(prefix: &str, default_base_url: &str) -> Result<Self, ConfigError> {
        Self::compatible_from_lookup(prefix, default_base_url, |name| std::env::var(name).ok())
    }

    /// [`compatible_from_env`](Self::compatible_from_env) with another source of variables.
    pub fn compatible_from_lookup(
        prefix: &str,
        default_base_url: &str,
        mut lookup: impl FnMut(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let key_var = format!("{prefix}_API_KEY");
        let key = var(&mut lookup, &key_var)
            .ok_or_else(|| ConfigError::new("api_key", format!("{key_var}: {NOT_SET}")))?;
        let base = var(&mut lookup, &format!("{prefix}_BASE_URL"));
        let cfg = OpenAiConfig::new(ApiKey::new(key)?)
            .with_base_url(base.as_deref().unwrap_or(default_base_url));
        cfg.upstream()?;
        Ok(cfg)
    }

    /// Sets the base URL.
    pub fn with_base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into();
        self
    }

    /// Sets the `OpenAI-Organization` header.
    pub fn with_organization(mut self, org: impl Into<String>) -> Self {
        self.organization = Some(org.into());
        self
    }

    /// Sets the `OpenAI-Project` header.
    pub fn with_project(mut self, project: impl Into<String>) -> Self {
        self.project = Some(project.into());
        self
    }

    /// The base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The upstream: base URL plus `Authorization: Bearer` (and organization / project).
    pub fn upstream(&self) -> Result<Upstream, ConfigError> {
        let mut up = Upstream::new(&self.base_url)?.with_bearer(&self.api_key);
        if let Some(org) = &self.organization {
            up = up.with_header("openai-organization", org)?;
        }
        if let Some(p) = &self.project {
            up = up.with_header("openai-project", p)?;
        }
        Ok(up)
    }
}

/// Anthropic's Messages API.
///
/// ```
/// use seawall_core::upstream::{AnthropicConfig, ApiKey};
/// let up = AnthropicConfig::new(ApiKey::new("sk-ant-0123456789").unwrap()).upstream().unwrap();
/// assert_eq!(up.headers()["anthropic-version"], "2023-06-01");
/// assert!(up.headers()["x-api-key"].is_sensitive());
/// ```
#[derive(Debug, Clone)]
pub struct AnthropicConfig {
    api_key: ApiKey,
    base_url: String,
    version: String,
}

impl AnthropicConfig {
    /// The default base URL. As in Anthropic's SDKs, request paths include the API version:
    /// `/v1/messages`.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.anthropic.com";

    /// The default `anthropic-version` header.
    pub const DEFAULT_VERSION: &'static str = "2023-06-01";

    /// A configuration for `api.anthropic.com` with this key.
    pub fn new(api_key: ApiKey) -> Self {
        AnthropicConfig {
            api_key,
            base_url: Self::DEFAULT_BASE_URL.to_owned(),
            version: Self::DEFAULT_VERSION.to_owned(),
        }
    }

    /// Reads `ANTHROPIC_API_KEY` (required) and `ANTHROPIC_BASE_URL` (default
    /// `https://api.anthropic.com`).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) with another source of variables.
    pub fn from_lookup(
        mut lookup: impl FnMut(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let key =
            var(&mut lookup, "ANTHROPIC_API_KEY").ok_or_else(|| missing("ANTHROPIC_API_KEY"))?;
        let mut cfg = AnthropicConfig::new(ApiKey::new(key)?);
        if let Some(url) = var(&mut lookup, "ANTHROPIC_BASE_URL") {
            cfg.base_url = url;
        }
        cfg.upstream()?;
        Ok(cfg)
    }

    /// Sets the base URL.
    pub fn with_base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into();
        self
    }

    /// Sets the `anthropic-version` header.
    pub fn with_version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// The base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The upstream: base URL plus `x-api-key` and `anthropic-version`.
    pub fn upstream(&self) -> Result<Upstream, ConfigError> {
        Upstream::new(&self.base_url)?
            .with_key_header("x-api-key", &self.api_key)?
            .with_header("anthropic-version", &self.version)
    }
}

/// Azure OpenAI, from the variables its users already set for the official SDKs:
/// `AZURE_OPENAI_ENDPOINT` (`https://{resource}.openai.azure.com`), `AZURE_OPENAI_API_KEY`
/// (sent as `api-key`) or else `AZURE_OPENAI_AD_TOKEN` (a Microsoft Entra ID token, sent as
/// `Authorization: Bearer`), and `OPENAI_API_VERSION`.
///
/// Two API shapes, chosen by the API version:
///
/// - **with an API version** (what `AzureOpenAI` in the official SDKs requires), the
///   deployment API: `{endpoint}/openai/deployments/{model}/chat/completions?api-version=..`,
///   where `{model}` is the request body's `model`, used as the deployment name;
/// - **without one**, the v1 API: `{endpoint}/openai/v1/chat/completions`, with the deployment
///   name in the body's `model`, as on OpenAI.
///
/// Either way the stack sends OpenAI's request paths (`/chat/completions`) and falls back by
/// model to another deployment.
///
/// ```
/// use seawall_core::upstream::AzureOpenAiConfig;
/// let env = |name: &str| match name {
///     "AZURE_OPENAI_ENDPOINT" => Some("https://contoso.openai.azure.com/".to_owned()),
///     "AZURE_OPENAI_API_KEY" => Some("0123456789abcdef".to_owned()),
///     "OPENAI_API_VERSION" => Some("2024-10-21".to_owned()),
///     _ => None,
/// };
/// let up = AzureOpenAiConfig::from_lookup(env).unwrap().upstream().unwrap();
/// assert_eq!(up.base_url(), "https://contoso.openai.azure.com/openai");
/// assert!(up.headers()["api-key"].is_sensitive());
/// ```
#[derive(Debug, Clone)]
pub struct AzureOpenAiConfig {
    endpoint: String,
    credential: AzureCredential,
    api_version: Option<String>,
}

#[derive(Debug, Clone)]
enum AzureCredential {
    Key(ApiKey),
    Token(ApiKey),
}

impl AzureOpenAiConfig {
    /// A resource's endpoint with an API key, on the v1 API (no API version).
    pub fn new(endpoint: impl Into<String>, api_key: ApiKey) -> Self {
        AzureOpenAiConfig {
            endpoint: endpoint.into(),
            credential: AzureCredential::Key(api_key),
            api_version: None,
        }
    }

    /// Reads the variables above from the environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) with another source of variables.
    pub fn from_lookup(
        mut lookup: impl FnMut(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let endpoint = var(&mut lookup, "AZURE_OPENAI_ENDPOINT")
            .ok_or_else(|| missing("AZURE_OPENAI_ENDPOINT"))?;
        let credential = match var(&mut lookup, "AZURE_OPENAI_API_KEY") {
            Some(key) => AzureCredential::Key(ApiKey::new(key)?),
            None => AzureCredential::Token(ApiKey::new(
                var(&mut lookup, "AZURE_OPENAI_AD_TOKEN")
                    .ok_or_else(|| missing("AZURE_OPENAI_API_KEY"))?,
            )?),
        };
        let cfg = AzureOpenAiConfig {
            endpoint,
            credential,
            api_version: var(&mut lookup, "OPENAI_API_VERSION"),
        };
        cfg.upstream()?;
        Ok(cfg)
    }

    /// Uses the deployment API with this `api-version` (e.g. `2024-10-21`).
    pub fn with_api_version(mut self, version: impl Into<String>) -> Self {
        self.api_version = Some(version.into());
        self
    }

    /// Authenticates with a Microsoft Entra ID token instead of the key.
    pub fn with_ad_token(mut self, token: ApiKey) -> Self {
        self.credential = AzureCredential::Token(token);
        self
    }

    /// The upstream: the base URL of the API shape, the credential header, and for the
    /// deployment API the `api-version` query and deployment routing.
    pub fn upstream(&self) -> Result<Upstream, ConfigError> {
        let endpoint = self.endpoint.trim().trim_end_matches('/');
        let up = match &self.api_version {
            Some(v) => Upstream::new(&format!("{endpoint}/openai"))?
                .with_query("api-version", v)?
                .with_deployment_routing(),
            None => Upstream::new(&format!("{endpoint}/openai/v1"))?,
        };
        match &self.credential {
            AzureCredential::Key(key) => up.with_key_header("api-key", key),
            AzureCredential::Token(token) => Ok(up.with_bearer(token)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl FnMut(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn openai_from_env_defaults_and_overrides() {
        let cfg =
            OpenAiConfig::from_lookup(env(&[("OPENAI_API_KEY", "sk-abc123456789\n")])).unwrap();
        assert_eq!(cfg.base_url(), "https://api.openai.com/v1");
        let up = cfg.upstream().unwrap();
        assert_eq!(up.headers()["authorization"], "Bearer sk-abc123456789");
        assert!(up.headers()["authorization"].is_sensitive());

        let cfg = OpenAiConfig::from_lookup(env(&[
            ("OPENAI_API_KEY", "k"),
            ("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1/"),
            ("OPENAI_ORG_ID", "org-1"),
        ]))
        .unwrap();
        let up = cfg.upstream().unwrap();
        assert_eq!(up.base_url(), "http://127.0.0.1:8080/v1");
        assert_eq!(up.headers()["openai-organization"], "org-1");
    }

    #[test]
    fn missing_or_bad_variables_are_clear_errors() {
        assert_eq!(
            OpenAiConfig::from_lookup(env(&[])).unwrap_err(),
            missing("OPENAI_API_KEY")
        );
        assert_eq!(
            AnthropicConfig::from_lookup(env(&[("ANTHROPIC_API_KEY", "")])).unwrap_err(),
            missing("ANTHROPIC_API_KEY")
        );
        let err = AnthropicConfig::from_lookup(env(&[
            ("ANTHROPIC_API_KEY", "k"),
            ("ANTHROPIC_BASE_URL", "ftp://x"),
        ]))
        .unwrap_err();
        assert_eq!(err.field(), "base_url", "{err}");
        assert_eq!(ApiKey::new("a\u{7}b").unwrap_err(), bad_api_key());
        for bad in [
            "",
            "not a url",
            "/v1",
            "https://u:p@host/v1",
            "https://h/v1?x=1",
        ] {
            assert!(Upstream::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn anthropic_headers_and_debug_hide_the_key() {
        let cfg =
            AnthropicConfig::from_lookup(env(&[("ANTHROPIC_API_KEY", "sk-ant-secret-42424242")]))
                .unwrap();
        let up = cfg.upstream().unwrap();
        assert_eq!(up.headers()["x-api-key"], "sk-ant-secret-42424242");
        assert!(up.headers()["x-api-key"].is_sensitive());
        assert_eq!(up.headers()["anthropic-version"], "2023-06-01");
        for shown in [format!("{cfg:?}"), format!("{up:?}"), format!("{:#?}", up)] {
            assert!(!shown.contains("42424242"), "{shown}");
        }
        assert!(format!("{up:?}").contains("x-api-key"));
    }

    #[test]
    fn join_and_origin() {
        let up = Upstream::new("https://api.openai.com/v1").unwrap();
        let j = up.join(&"/chat/completions?x=1".parse().unwrap()).unwrap();
        assert_eq!(j, "https://api.openai.com/v1/chat/completions?x=1");
        assert!(up.same_origin(&"https://API.openai.com/other".parse().unwrap()));
        assert!(!up.same_origin(&"http://api.openai.com/v1".parse().unwrap()));
        assert!(!up.same_origin(&"https://api.openai.com:8443/v1".parse().unwrap()));
        assert!(up.same_origin(&"https://api.openai.com:443/v1".parse().unwrap()));
        assert!(!up.same_origin(&"https://evil.example/v1".parse().unwrap()));
        let root = Upstream::new("http://localhost:3000").unwrap();
        assert_eq!(
            root.join(&"/v1/messages".parse().unwrap()).unwrap(),
            "http://localhost:3000/v1/messages"
        );
    }
}

#[cfg(test)]
mod provider_tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl FnMut(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn routed(up: &Upstream, path: &str, body: &str) -> Result<http::request::Parts, LlmError> {
        let (mut parts, ()) = http::Request::post(path).body(()).unwrap().into_parts();
        route(Some(up), &mut parts, body.as_bytes())?;
        Ok(parts)
    }

    #[test]
    fn azure_with_an_api_version_routes_by_deployment_with_the_version_in_the_query() {
        let cfg = AzureOpenAiConfig::from_lookup(env(&[
            ("AZURE_OPENAI_ENDPOINT", "https://contoso.openai.azure.com/"),
            ("AZURE_OPENAI_API_KEY", "azure-secret-0123456789"),
            ("OPENAI_API_VERSION", "2024-10-21"),
        ]))
        .unwrap();
        let up = cfg.upstream().unwrap();
        let parts = routed(&up, "/chat/completions", r#"{"model":"gpt-4o-prod"}"#).unwrap();
        assert_eq!(
            parts.uri,
            "https://contoso.openai.azure.com/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(parts.headers["api-key"], "azure-secret-0123456789");
        assert!(!parts.headers.contains_key(AUTHORIZATION));
        // A path Azure does not serve per deployment keeps its place; a request's own
        // api-version wins over the configured one.
        let parts = routed(&up, "/files?api-version=2025-01-01", "").unwrap();
        assert_eq!(
            parts.uri,
            "https://contoso.openai.azure.com/openai/files?api-version=2025-01-01"
        );
        // A model from a layer's parse wins over the body (it is the same model, parsed once).
        let (mut parts, ()) = http::Request::post("/embeddings")
            .body(())
            .unwrap()
            .into_parts();
        let meta = crate::RequestMeta {
            model: Some("embed-small".into()),
            ..crate::RequestMeta::default()
        };
        parts.extensions.insert(meta);
        route(Some(&up), &mut parts, b"not json").unwrap();
        assert!(
            parts
                .uri
                .path()
                .ends_with("/deployments/embed-small/embeddings")
        );
        for shown in [format!("{cfg:?}"), format!("{up:?}")] {
            assert!(!shown.contains("0123456789"), "{shown}");
        }
    }

    #[test]
    fn azure_deployment_names_cannot_steer_the_path() {
        let up = AzureOpenAiConfig::new(
            "https://contoso.openai.azure.com",
            ApiKey::new("k-0123456789").unwrap(),
        )
        .with_api_version("2024-10-21")
        .upstream()
        .unwrap();
        for body in [
            r#"{"model":"../../admin"}"#,
            r#"{"model":"a/b"}"#,
            r#"{"model":"x?api-version=1"}"#,
            r#"{"model":"x#y"}"#,
            r#"{"model":""}"#,
            r#"{"messages":[]}"#,
            "not json",
        ] {
            let err = routed(&up, "/chat/completions", body).unwrap_err();
            assert_eq!(err.class(), FailureClass::InvalidRequest, "{body}");
        }
    }

    #[test]
    fn azure_without_an_api_version_uses_the_v1_api_and_an_entra_token_is_a_bearer() {
        let cfg = AzureOpenAiConfig::from_lookup(env(&[
            ("AZURE_OPENAI_ENDPOINT", "https://contoso.openai.azure.com"),
            ("AZURE_OPENAI_AD_TOKEN", "eyJ-entra-token"),
        ]))
        .unwrap();
        let up = cfg.upstream().unwrap();
        let parts = routed(&up, "/chat/completions", r#"{"model":"gpt-4o-prod"}"#).unwrap();
        assert_eq!(
            parts.uri,
            "https://contoso.openai.azure.com/openai/v1/chat/completions"
        );
        assert_eq!(parts.headers[AUTHORIZATION], "Bearer eyJ-entra-token");
        assert!(parts.headers[AUTHORIZATION].is_sensitive());
        assert_eq!(
            AzureOpenAiConfig::from_lookup(env(&[("AZURE_OPENAI_ENDPOINT", "https://x")]))
                .unwrap_err(),
            missing("AZURE_OPENAI_API_KEY")
        );
        assert_eq!(
            AzureOpenAiConfig::from_lookup(env(&[("AZURE_OPENAI_API_KEY", "k")])).unwrap_err(),
            missing("AZURE_OPENAI_ENDPOINT")
        );
        let bad_version = AzureOpenAiConfig::new("https://x", ApiKey::new("k").unwrap())
            .with_api_version("2024-10-21&evil=1");
        assert_eq!(bad_version.upstream().unwrap_err().field(), "query");
    }

    #[test]
    fn gemini_and_other_compatible_servers_come_from_their_own_variables() {
        let cfg = OpenAiConfig::gemini_from_lookup(env(&[("GOOGLE_API_KEY", "AIza-0123456789")]))
            .unwrap();
        let up = cfg.upstream().unwrap();
        let parts = routed(&up, "/chat/completions", "{}").unwrap();
        assert_eq!(
            parts.uri,
            "https://generativelanguage.googleapis.com/v1beta/openai/chat/completions"
        );
        assert_eq!(parts.headers[AUTHORIZATION], "Bearer AIza-0123456789");
        // GEMINI_API_KEY wins over GOOGLE_API_KEY, as in Google's SDKs.
        let cfg = OpenAiConfig::gemini_from_lookup(env(&[
            ("GOOGLE_API_KEY", "AIza-google"),
            ("GEMINI_API_KEY", "AIza-gemini"),
        ]))
        .unwrap();
        assert_eq!(
            cfg.upstream().unwrap().headers()[AUTHORIZATION],
            "Bearer AIza-gemini"
        );
        assert_eq!(
            OpenAiConfig::gemini_from_lookup(env(&[])).unwrap_err(),
            missing("GEMINI_API_KEY")
        );

        let vllm = OpenAiConfig::compatible_from_lookup(
            "VLLM",
            "http://127.0.0.1:8000/v1",
            env(&[
                ("VLLM_API_KEY", "token-abc"),
                ("VLLM_BASE_URL", "http://gpu-1:8000/v1"),
            ]),
        )
        .unwrap();
        assert_eq!(vllm.base_url(), "http://gpu-1:8000/v1");
        let err = OpenAiConfig::compatible_from_lookup(
            "GROQ",
            "https://api.groq.com/openai/v1",
            env(&[]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("GROQ_API_KEY"), "{err}");
    }
}
