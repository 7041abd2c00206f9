//! What the layers need to know about a request, through one small trait.
//!
//! A breaker needs a key, a gate and a budget need a token estimate, a retry layer needs to know
//! whether the request is idempotent, a fallback needs to switch the model. [`LlmRequest`]
//! exposes exactly that. It is implemented for `http::Request<Bytes>` carrying OpenAI- or
//! Anthropic-style JSON, and a user's own typed request implements it in a few lines.
//!
//! For HTTP requests the JSON body is parsed once, by [`LlmRequest::prepare`], into a
//! [`RequestMeta`] kept in the request's extensions; every later read (in every layer, on every
//! attempt) is an extension lookup, never a second parse.
//!
//! The trait comes first here, then the small types it speaks in and its implementation for
//! HTTP requests; reading the JSON body lives in the `wire` submodule beside it.

use std::sync::Arc;

use bytes::Bytes;
use http::{Extensions, Request};
use serde_json::Value;

use crate::class::FailureClass;
use crate::context::CallContext;
use crate::deadline::Deadline;
use crate::error::LlmError;

mod keep;
mod wire;

pub use keep::KeptRequest;
pub use wire::{PROMPT_FIELDS, RequestMeta};

/// What the layers read from (and change in) a request.
///
/// A user's own request type implements it in a few lines:
///
/// ```
/// use seawall_core::{LlmError, LlmRequest};
///
/// #[derive(Clone)]
/// struct Ask { model: String, prompt: String, max_tokens: u32 }
///
/// impl LlmRequest for Ask {
///     fn model(&self) -> Option<&str> { Some(&self.model) }
///     fn max_output_tokens(&self) -> Option<u32> { Some(self.max_tokens) }
///     fn estimated_input_tokens(&self) -> u32 { (self.prompt.len() / 4) as u32 }
///     fn set_model(&mut self, model: &str) -> Result<(), LlmError> {
///         self.model = model.to_owned();
///         Ok(())
///     }
/// }
/// let ask = Ask { model: "gpt-4o".into(), prompt: "hi there".into(), max_tokens: 10 };
/// assert_eq!(ask.estimated_tokens(), 12);
/// assert_eq!(ask.state_key(), Some("gpt-4o"));
/// ```
pub trait LlmRequest {
    /// Parses and caches whatever the other methods read. Every seawall layer calls it at the
    /// start of `call`; it must be cheap when already done. The default does nothing.
    fn prepare(&mut self) {}

    /// The model asked for.
    fn model(&self) -> Option<&str>;

    /// The model asked for, as a shared string, for a layer that keeps the name for the whole
    /// call (an observer's record, a fallback's [`ServedBy`](crate::ServedBy)). The default
    /// copies [`model`](Self::model); an HTTP request hands out the copy its
    /// [`prepare`](Self::prepare) made, so keeping the name allocates nothing.
    fn model_shared(&self) -> Option<Arc<str>> {
        self.model().map(Arc::from)
    }

    /// The most output tokens the request allows, if it says.
    fn max_output_tokens(&self) -> Option<u32>;

    /// An estimate of the prompt's text tokens (non-text parts are [`media_parts`]).
    ///
    /// [`media_parts`]: LlmRequest::media_parts
    fn estimated_input_tokens(&self) -> u32;

    /// How many answers the upstream generates and bills, each up to
    /// [`max_output_tokens`](LlmRequest::max_output_tokens) (OpenAI's `n` and `best_of`).
    /// The default is 1.
    fn choices(&self) -> u32 {
        1
    }

    /// The prompt's images, audio and files, which a [`PartEstimate`] turns into tokens.
    /// The default is none.
    fn media_parts(&self) -> MediaParts {
        MediaParts::default()
    }

    /// The most output tokens the upstream may bill: the maximum output tokens times the
    /// [`choices`](LlmRequest::choices); `None` if the request sets no maximum.
    fn max_billed_output_tokens(&self) -> Option<u64> {
        self.sizes().max_billed_output_tokens()
    }

    /// Estimated input (text, and non-text parts at the [default](PartEstimate::DEFAULT)
    /// estimate) plus the most output tokens that may be billed; a request that sets no
    /// maximum output adds none, so a limiter must decide what to reserve for it.
    fn estimated_tokens(&self) -> u64 {
        let sizes = self.sizes();
        sizes
            .input_tokens(&PartEstimate::DEFAULT)
            .saturating_add(sizes.max_billed_output_tokens().unwrap_or(0))
    }

    /// The four sizes above at once, for a layer that prices or rate-limits the request by
    /// them all. The default calls each method; an HTTP request reads them from its
    /// [`RequestMeta`] in one look (each method above is one look of its own).
    fn sizes(&self) -> RequestSizes {
        RequestSizes {
            max_output_tokens: self.max_output_tokens(),
            estimated_input_tokens: self.estimated_input_tokens(),
            choices: self.choices(),
            media: self.media_parts(),
        }
    }

    /// Whether the response is streamed.
    fn is_streaming(&self) -> bool {
        false
    }

    /// The service tier the request asks for (OpenAI's `service_tier`), if it names one that
    /// is billed apart. The default says none; an HTTP request's is read with the rest of its
    /// body, once ([`RequestMeta::service_tier`]).
    fn service_tier(&self) -> Option<ServiceTier> {
        None
    }

    /// [`prepare`](Self::prepare)s the request and reads what most layers read at the start of
    /// `call`: its [`sizes`](Self::sizes) and whether it [streams](Self::is_streaming). The
    /// default calls the three; an HTTP request reads them from its [`RequestMeta`] in one
    /// look (three otherwise, each a lookup in the request's extensions).
    fn prepared(&mut self) -> Prepared {
        self.prepare();
        Prepared {
            sizes: self.sizes(),
            streaming: self.is_streaming(),
            provider: Provider::Unknown,
        }
    }

    /// Whether a retry after an outcome that may have been billed is acceptable.
    fn is_idempotent(&self) -> bool {
        false
    }

    /// The key of per-provider/model state (breakers, rate limits). Defaults to the model.
    fn state_key(&self) -> Option<&str> {
        self.model()
    }

    /// Switches the model, for a fallback.
    fn set_model(&mut self, model: &str) -> Result<(), LlmError> {
        let _ = model;
        Err(LlmError::new(
            FailureClass::InvalidRequest,
            "this request type cannot switch models",
        ))
    }

    /// Sets the maximum output tokens, for a budget that fills in a default.
    fn set_max_output_tokens(&mut self, max: u32) -> Result<(), LlmError> {
        let _ = max;
        Err(LlmError::new(
            FailureClass::InvalidRequest,
            "this request type cannot set max output tokens",
        ))
    }

    /// The request's extensions, if it has any (HTTP requests do).
    fn extensions(&self) -> Option<&Extensions> {
        None
    }

    /// The request's extensions, mutably.
    fn extensions_mut(&mut self) -> Option<&mut Extensions> {
        None
    }

    /// The request's headers, mutably, if it has any (for an `Idempotency-Key` or an
    /// attempt-number header).
    fn headers_mut(&mut self) -> Option<&mut http::HeaderMap> {
        None
    }

    /// A copy of the request, for a layer that may send it again (a retry's next attempt, a
    /// fallback's target): [`KeptRequest::get`] gives a request equal to this one. The
    /// default clones it; an HTTP request keeps its parts so that a copy that is never sent
    /// (the usual case: the call succeeds) costs no allocation.
    fn keep(&self) -> KeptRequest<Self>
    where
        Self: Sized + Clone,
    {
        KeptRequest::whole(self.clone())
    }

    /// The per-call context an observing layer put in the extensions, if any.
    fn call_context(&self) -> Option<&Arc<CallContext>> {
        self.extensions()?.get()
    }

    /// The caller's [`Deadline`], from the extensions (where [`prepare`](Self::prepare)
    /// puts the one a timeout header asks for), if any.
    fn deadline(&self) -> Option<Deadline> {
        self.extensions()?.get().copied()
    }
}

/// A service tier billed at its own prices: OpenAI's `"service_tier"` of a request. `auto`
/// and `default` (and a request that names none) are the standard prices; `auto` runs at the
/// tier the project is set to, standard unless changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceTier {
    /// `"priority"`: faster, billed above the standard prices.
    Priority,
    /// `"flex"`: slower and may be refused when busy, billed below them.
    Flex,
}

impl ServiceTier {
    /// The tier `name` (`"priority"`, `"flex"`) names; `None` for the standard ones and any
    /// other.
    pub fn from_name(name: &str) -> Option<ServiceTier> {
        match name {
            "priority" => Some(ServiceTier::Priority),
            "flex" => Some(ServiceTier::Flex),
            _ => None,
        }
    }
}

/// Which wire format a request or response speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Provider {
    /// OpenAI and OpenAI-compatible APIs (Azure OpenAI, DeepSeek, vLLM, ...).
    OpenAi,
    /// Anthropic's Messages API.
    Anthropic,
    /// Not known.
    #[default]
    Unknown,
}

impl Provider {
    /// Guesses the provider from a request's path and headers.
    pub fn detect(uri: &http::Uri, headers: &http::HeaderMap) -> Provider {
        let path = uri.path();
        const ANTHROPIC_VERSION: http::HeaderName =
            http::HeaderName::from_static("anthropic-version");
        // The path first: even a header lookup compares names.
        if path.ends_with("/messages") || crate::header(headers, &ANTHROPIC_VERSION).is_some() {
            Provider::Anthropic
        } else if path.ends_with("/completions")
            || path.ends_with("/responses")
            || path.ends_with("/embeddings")
        {
            Provider::OpenAi
        } else {
            Provider::Unknown
        }
    }
}

/// The header that makes a request idempotent as [`Idempotent`] does.
pub(crate) const IDEMPOTENCY_KEY: http::HeaderName =
    http::HeaderName::from_static("idempotency-key");

/// Marks a request as idempotent (safe to retry after a 504 or a lost connection: the
/// upstream either deduplicates it or the caller accepts paying twice). Insert it into the
/// request's extensions; a request with an `Idempotency-Key` header counts too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Idempotent;

/// Says that a fallback target stands by for this request: if a layer below refuses it at
/// once, the fallback layer above sends it elsewhere.
///
/// A layer that would hold a call for long may then refuse it instead of holding it: the
/// concurrency gate does so when a key's request or token rate, or the upstream's pause,
/// would hold the call longer than its standby wait. Waiting seconds for the primary's rate
/// while the backup has room is the wrong trade for a caller who configured a backup.
///
/// The fallback layer inserts it into the primary's request when its chain has a target for
/// a gate's refusal, and into each target's request but the last one's; a request without
/// it is held as usual. Remove it (or leave the fallback out) to make every call wait.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standby;

impl Standby {
    /// Whether `req` carries the marker.
    pub fn is_on<R: LlmRequest + ?Sized>(req: &R) -> bool {
        req.extensions()
            .is_some_and(|e| e.get::<Standby>().is_some())
    }

    /// Inserts the marker into `req`'s extensions (`on`), or removes it. A request type
    /// without extensions is left as it is.
    pub fn set<R: LlmRequest + ?Sized>(req: &mut R, on: bool) {
        if let Some(ext) = req.extensions_mut() {
            if on {
                ext.insert(Standby);
            } else {
                ext.remove::<Standby>();
            }
        }
    }
}

/// What [`LlmRequest::prepared`] reads at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Prepared {
    /// [`LlmRequest::sizes`].
    pub sizes: RequestSizes,
    /// [`LlmRequest::is_streaming`].
    pub streaming: bool,
    /// The wire the request speaks, when it says ([`RequestMeta::provider`]); `Unknown` for
    /// a request type that does not.
    pub provider: Provider,
}

/// What [`LlmRequest::sizes`] reads: the sizes a request is priced and rate-limited by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestSizes {
    /// [`LlmRequest::max_output_tokens`].
    pub max_output_tokens: Option<u32>,
    /// [`LlmRequest::estimated_input_tokens`].
    pub estimated_input_tokens: u32,
    /// [`LlmRequest::choices`].
    pub choices: u32,
    /// [`LlmRequest::media_parts`].
    pub media: MediaParts,
}

impl RequestSizes {
    /// The most output tokens the upstream may bill: the maximum output tokens times the
    /// choices; `None` if the request sets no maximum.
    pub fn max_billed_output_tokens(&self) -> Option<u64> {
        let max = u64::from(self.max_output_tokens?);
        Some(max.saturating_mul(u64::from(self.choices.max(1))))
    }

    /// The estimated input: the text's tokens and the media parts' at `parts`.
    pub fn input_tokens(&self, parts: &PartEstimate) -> u64 {
        u64::from(self.estimated_input_tokens).saturating_add(parts.tokens(&self.media))
    }
}

/// The non-text parts of a prompt, counted by kind (see [`RequestMeta::parse`] for what
/// counts as which). A [`PartEstimate`] turns them into tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MediaParts {
    /// Images.
    pub images: u32,
    /// Audio parts whose length is not known.
    pub audio: u32,
    /// Seconds of the audio parts whose length is known (WAV, from its header), rounded up
    /// per part; those parts are not in `audio`.
    pub audio_seconds: u32,
    /// Files and documents (PDFs and the like), and raw data of an unknown kind.
    pub files: u32,
}

impl MediaParts {
    fn add(&mut self, o: MediaParts) {
        self.images = self.images.saturating_add(o.images);
        self.audio = self.audio.saturating_add(o.audio);
        self.audio_seconds = self.audio_seconds.saturating_add(o.audio_seconds);
        self.files = self.files.saturating_add(o.files);
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        *self == MediaParts::default()
    }
}

/// How many input tokens a budget or a token-rate limit counts for each non-text part.
///
/// The tokens a provider bills for an image, an audio clip or a PDF depend on its pixels,
/// its seconds or its pages, which seawall does not decode; so each part is counted at a
/// fixed, configurable estimate. The defaults aim to be an upper bound for a typical part,
/// since an estimate below the bill lets spend pass a limit:
///
/// - **image: 1,600 tokens.** Anthropic bills about width × height / 750 tokens and scales
///   images down to about 1.15 megapixels, so at most about 1,600; OpenAI's high-detail
///   images are 85 + 170 per 512-pixel tile, at most 1,445 for 8 tiles. (Some models bill
///   images at a multiple of that: `gpt-4o-mini` counts about 33× as many tokens per tile.
///   Raise it for them.)
/// - **audio: 32 tokens a second** when the length is known (a WAV clip's header gives its
///   byte rate), the highest documented rate (Gemini's; OpenAI's audio models bill about 10);
///   else **2,000 tokens a part**, about a minute at that rate (compressed formats such as
///   MP3 are not decoded, so longer clips need a higher value).
/// - **file: 10,000 tokens**, a few PDF pages at Anthropic's documented 1,500 to 3,000
///   tokens a page (text plus an image of each page). Raise it for long documents.
///
/// ```
/// use seawall_core::{MediaParts, PartEstimate};
/// let parts = MediaParts { images: 2, files: 1, ..MediaParts::default() };
/// assert_eq!(PartEstimate::default().tokens(&parts), 2 * 1_600 + 10_000);
/// assert_eq!(PartEstimate::default().per_image(85).tokens(&parts), 2 * 85 + 10_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartEstimate {
    image: u32,
    audio: u32,
    audio_second: u32,
    file: u32,
}

impl PartEstimate {
    /// The defaults: 1,600 tokens an image, 32 a second of audio (2,000 an audio part of
    /// unknown length), 10,000 a file.
    pub const DEFAULT: PartEstimate = PartEstimate {
        image: 1_600,
        audio: 2_000,
        audio_second: 32,
        file: 10_000,
    };

    /// Sets the tokens counted per image.
    pub const fn per_image(mut self, tokens: u32) -> Self {
        self.image = tokens;
        self
    }

    /// Sets the tokens counted per audio part of unknown length.
    pub const fn per_audio(mut self, tokens: u32) -> Self {
        self.audio = tokens;
        self
    }

    /// Sets the tokens counted per second of audio of known length.
    pub const fn per_audio_second(mut self, tokens: u32) -> Self {
        self.audio_second = tokens;
        self
    }

    /// Sets the tokens counted per file or document.
    pub const fn per_file(mut self, tokens: u32) -> Self {
        self.file = tokens;
        self
    }

    /// The input tokens counted for `parts`.
    pub fn tokens(&self, parts: &MediaParts) -> u64 {
        u64::from(parts.images) * u64::from(self.image)
            + u64::from(parts.audio) * u64::from(self.audio)
            + u64::from(parts.audio_seconds) * u64::from(self.audio_second)
            + u64::from(parts.files) * u64::from(self.file)
    }
}

impl Default for PartEstimate {
    fn default() -> Self {
        PartEstimate::DEFAULT
    }
}

fn meta(req: &Request<Bytes>) -> Option<&RequestMeta> {
    req.extensions().get::<RequestMeta>()
}

impl RequestMeta {
    /// [`LlmRequest::sizes`] of the request these facts are of.
    fn sizes(&self) -> RequestSizes {
        RequestSizes {
            max_output_tokens: self.max_output_tokens,
            estimated_input_tokens: self.estimated_input_tokens,
            choices: self.choices.max(1),
            media: self.media,
        }
    }

    /// [`LlmRequest::prepared`] of the request these facts are of.
    fn prepared(&self) -> Prepared {
        Prepared {
            sizes: self.sizes(),
            streaming: self.stream,
            provider: self.provider,
        }
    }
}

/// Keeps a request's parsed facts in its extensions (`prepare`'s work).
fn insert_meta(req: &mut Request<Bytes>, m: RequestMeta) {
    // The layers after this add a few values of their own (a call context, a queue time,
    // ...): one table with room for them all.
    crate::response::reserve_extensions(req.extensions_mut());
    req.extensions_mut().insert(m);
    // A timeout header becomes a deadline once, here, so every layer sees one instant.
    if req.extensions().get::<Deadline>().is_none() {
        if let Some(d) = Deadline::from_headers(req.headers()) {
            req.extensions_mut().insert(d);
        }
    }
}

fn rewrite_body(req: &mut Request<Bytes>, field: &str, value: Value) -> Result<(), LlmError> {
    let mut body: Value = serde_json::from_slice(req.body()).map_err(|e| {
        LlmError::new(
            FailureClass::InvalidRequest,
            format!("request body is not JSON: {e}"),
        )
    })?;
    let Some(map) = body.as_object_mut() else {
        return Err(LlmError::new(
            FailureClass::InvalidRequest,
            "request body is not a JSON object",
        ));
    };
    map.insert(field.to_owned(), value);
    let bytes = serde_json::to_vec(&body).map_err(|e| {
        LlmError::new(
            FailureClass::InvalidRequest,
            format!("cannot write request body: {e}"),
        )
    })?;
    let len = bytes.len();
    *req.body_mut() = Bytes::from(bytes);
    if req.headers().contains_key(http::header::CONTENT_LENGTH) {
        req.headers_mut()
            .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
    }
    Ok(())
}

/// OpenAI- or Anthropic-style JSON over HTTP.
impl LlmRequest for Request<Bytes> {
    fn prepare(&mut self) {
        if meta(self).is_none() {
            insert_meta(self, RequestMeta::parse(self));
        }
    }

    fn prepared(&mut self) -> Prepared {
        if let Some(m) = meta(self) {
            return m.prepared();
        }
        let m = RequestMeta::parse(self);
        let prepared = m.prepared();
        insert_meta(self, m);
        prepared
    }

    fn model(&self) -> Option<&str> {
        meta(self)?.model.as_deref()
    }

    fn model_shared(&self) -> Option<Arc<str>> {
        meta(self)?.model.clone()
    }

    fn max_output_tokens(&self) -> Option<u32> {
        meta(self)?.max_output_tokens
    }

    fn estimated_input_tokens(&self) -> u32 {
        meta(self).map_or(0, |m| m.estimated_input_tokens)
    }

    fn choices(&self) -> u32 {
        meta(self).map_or(1, |m| m.choices.max(1))
    }

    fn media_parts(&self) -> MediaParts {
        meta(self).map_or_else(MediaParts::default, |m| m.media)
    }

    fn sizes(&self) -> RequestSizes {
        // Without a parse, what the methods above say without one.
        meta(self).map_or(
            RequestSizes {
                choices: 1,
                ..RequestSizes::default()
            },
            RequestMeta::sizes,
        )
    }

    fn is_streaming(&self) -> bool {
        meta(self).is_some_and(|m| m.stream)
    }

    fn service_tier(&self) -> Option<ServiceTier> {
        meta(self)?.service_tier
    }

    fn is_idempotent(&self) -> bool {
        self.extensions().get::<Idempotent>().is_some()
            || self.headers().contains_key(IDEMPOTENCY_KEY)
    }

    fn state_key(&self) -> Option<&str> {
        meta(self)?.key.as_deref()
    }

    /// Rewrites the body's `model` field, and the deployment segment of an Azure OpenAI path
    /// (`/openai/deployments/{name}/...`).
    fn set_model(&mut self, model: &str) -> Result<(), LlmError> {
        rewrite_body(self, "model", Value::from(model))?;
        let path = self.uri().path();
        if let Some(rest) = path
            .find("/deployments/")
            .map(|i| (i + "/deployments/".len(), path))
        {
            let (start, path) = rest;
            let end = path[start..].find('/').map_or(path.len(), |e| start + e);
            let mut new = String::with_capacity(path.len() + model.len());
            new.push_str(&path[..start]);
            new.push_str(model);
            new.push_str(&path[end..]);
            if let Some(q) = self.uri().query() {
                new.push('?');
                new.push_str(q);
            }
            let mut parts = self.uri().clone().into_parts();
            parts.path_and_query = Some(new.parse().map_err(|_| {
                LlmError::new(
                    FailureClass::InvalidRequest,
                    "model name is not a valid path segment",
                )
            })?);
            *self.uri_mut() = http::Uri::from_parts(parts).map_err(|_| {
                LlmError::new(
                    FailureClass::InvalidRequest,
                    "cannot rebuild the request URI",
                )
            })?;
        }
        self.extensions_mut().remove::<RequestMeta>();
        self.prepare();
        Ok(())
    }

    /// Writes `max_tokens` (the field both OpenAI and Anthropic read) into the body.
    fn set_max_output_tokens(&mut self, max: u32) -> Result<(), LlmError> {
        rewrite_body(self, "max_tokens", Value::from(max))?;
        if let Some(m) = self.extensions_mut().get_mut::<RequestMeta>() {
            m.max_output_tokens = Some(max);
        }
        Ok(())
    }

    fn keep(&self) -> KeptRequest<Self> {
        keep::keep_http(self)
    }

    fn extensions(&self) -> Option<&Extensions> {
        Some(Request::extensions(self))
    }

    fn extensions_mut(&mut self) -> Option<&mut Extensions> {
        Some(Request::extensions_mut(self))
    }

    fn headers_mut(&mut self) -> Option<&mut http::HeaderMap> {
        Some(Request::headers_mut(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const CHAT: &str = "https://api.openai.com/v1/chat/completions";

    pub(super) fn req(uri: &str, body: &str) -> Request<Bytes> {
        let mut r = Request::post(uri)
            .header("content-length", body.len())
            .body(Bytes::from(body.to_owned()))
            .unwrap();
        r.prepare();
        r
    }

    #[test]
    fn an_openai_request_names_its_billed_service_tier_and_others_name_none() {
        let tier = |uri: &str, body: &str| req(uri, body).service_tier();
        let chat = |t: &str| format!(r#"{{"model":"gpt-5","service_tier":{t},"messages":[]}}"#);
        assert_eq!(
            tier(CHAT, &chat(r#""priority""#)),
            Some(ServiceTier::Priority)
        );
        assert_eq!(tier(CHAT, &chat(r#""flex""#)), Some(ServiceTier::Flex));
        // Escaped, as serde reads it.
        assert_eq!(tier(CHAT, &chat(r#""fl\u0065x""#)), Some(ServiceTier::Flex));
        for standard in [r#""auto""#, r#""default""#, "null", r#""scale""#, "7"] {
            assert_eq!(tier(CHAT, &chat(standard)), None, "{standard}");
        }
        assert_eq!(tier(CHAT, r#"{"model":"gpt-5","messages":[]}"#), None);
        assert_eq!(tier(CHAT, "not json"), None);
        // Anthropic's `service_tier` (priority capacity) is not a price of its own.
        let messages = r#"{"model":"claude-sonnet-4-5","max_tokens":5,"service_tier":"priority","messages":[]}"#;
        assert_eq!(
            tier("https://api.anthropic.com/v1/messages", messages),
            None
        );
    }

    #[test]
    fn prepared_reads_in_one_look_what_prepare_and_the_three_accessors_read() {
        let bodies = [
            (
                CHAT,
                r#"{"model":"gpt-4o","max_tokens":50,"n":3,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
            ),
            (
                "https://api.anthropic.com/v1/messages",
                r#"{"model":"claude","max_tokens":9,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"AAAA"}}]}]}"#,
            ),
            ("https://example.com/v1/other", "not json"),
        ];
        for (uri, body) in bodies {
            let raw = || {
                Request::post(uri)
                    .body(Bytes::from(body.to_owned()))
                    .unwrap()
            };
            // Unprepared: `prepared` prepares it, as `prepare` does.
            let mut fresh = raw();
            let got = fresh.prepared();
            let mut expected = raw();
            expected.prepare();
            let want = Prepared {
                sizes: expected.sizes(),
                streaming: expected.is_streaming(),
                provider: meta(&expected).unwrap().provider,
            };
            assert_eq!(got, want, "{body}");
            assert_eq!(meta(&fresh), meta(&expected), "{body}");
            // Prepared already: the same facts, read again.
            assert_eq!(fresh.prepared(), want, "{body}");
        }
        // A request type of the user's: the default reads its accessors, and knows no wire.
        struct Ask;
        impl LlmRequest for Ask {
            fn model(&self) -> Option<&str> {
                Some("m")
            }
            fn max_output_tokens(&self) -> Option<u32> {
                Some(7)
            }
            fn estimated_input_tokens(&self) -> u32 {
                5
            }
            fn is_streaming(&self) -> bool {
                true
            }
            fn set_model(&mut self, _: &str) -> Result<(), LlmError> {
                Ok(())
            }
        }
        let got = Ask.prepared();
        assert_eq!(
            (got.sizes, got.streaming, got.provider),
            (Ask.sizes(), true, Provider::Unknown)
        );
    }

    #[test]
    fn openai_request_meta() {
        let r = req(
            "https://api.openai.com/v1/chat/completions",
            r#"{"model":"gpt-4o-mini","max_completion_tokens":256,"stream":true,
               "messages":[{"role":"user","content":"Say hello to the whole wide world"}]}"#,
        );
        assert_eq!(r.model(), Some("gpt-4o-mini"));
        assert_eq!(r.model_shared().as_deref(), Some("gpt-4o-mini"));
        assert_eq!(r.max_output_tokens(), Some(256));
        assert!(r.is_streaming());
        assert!(!LlmRequest::is_idempotent(&r));
        assert_eq!(r.state_key(), Some("api.openai.com/gpt-4o-mini"));
        // "user" + 33 chars of content = 37 chars -> 10 tokens, plus 4 per text part.
        assert_eq!(r.estimated_input_tokens(), 10 + 8);
        assert_eq!(meta(&r).unwrap().provider, Provider::OpenAi);
    }

    #[test]
    fn an_anthropic_version_header_marks_the_wire_format_among_few_or_many_headers() {
        let uri: http::Uri = "https://gateway.example/v1/chat/completions"
            .parse()
            .unwrap();
        for others in [0, 3, 20] {
            let mut headers = http::HeaderMap::new();
            for i in 0..others {
                let name = http::HeaderName::try_from(format!("x-extra-{i}")).unwrap();
                headers.insert(name, http::HeaderValue::from_static("1"));
            }
            assert_eq!(
                Provider::detect(&uri, &headers),
                Provider::OpenAi,
                "{others}"
            );
            headers.insert(
                "anthropic-version",
                http::HeaderValue::from_static("2023-06-01"),
            );
            assert_eq!(
                Provider::detect(&uri, &headers),
                Provider::Anthropic,
                "{others}"
            );
        }
    }

    #[test]
    fn anthropic_request_meta_and_model_switch() {
        let mut r = req(
            "https://api.anthropic.com/v1/messages",
            r#"{"model":"claude-sonnet-4-5","max_tokens":1024,"system":"be brief",
               "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#,
        );
        assert_eq!(meta(&r).unwrap().provider, Provider::Anthropic);
        assert_eq!(r.max_output_tokens(), Some(1024));
        r.extensions_mut().insert(Idempotent);
        assert!(LlmRequest::is_idempotent(&r));
        r.set_model("claude-haiku-4-5").unwrap();
        assert_eq!(r.model(), Some("claude-haiku-4-5"));
        let body: Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(body["model"], "claude-haiku-4-5");
        assert_eq!(
            r.headers()["content-length"],
            r.body().len().to_string().as_str()
        );
        r.set_max_output_tokens(77).unwrap();
        assert_eq!(r.max_output_tokens(), Some(77));
    }

    #[test]
    fn azure_deployment_path_follows_the_model() {
        let mut r = req(
            "https://x.openai.azure.com/openai/deployments/gpt4/chat/completions?api-version=2024-10-21",
            r#"{"model":"gpt4","messages":[]}"#,
        );
        r.set_model("gpt4o-large").unwrap();
        assert_eq!(
            r.uri().path_and_query().unwrap().as_str(),
            "/openai/deployments/gpt4o-large/chat/completions?api-version=2024-10-21"
        );
    }

    #[test]
    fn non_json_body_gives_empty_meta_and_clear_error_on_rewrite() {
        let mut r = req("http://localhost/v1/chat/completions", "\u{0}not json");
        assert_eq!(r.model(), None);
        assert_eq!(r.estimated_tokens(), 0);
        let err = r.set_model("m").unwrap_err();
        assert_eq!(err.class(), FailureClass::InvalidRequest);
    }

    #[test]
    fn estimated_tokens_count_parts_at_the_default_estimate() {
        let r = req(
            CHAT,
            r#"{"max_tokens":10,"messages":[{"content":[{"type":"image_url","image_url":{"url":"http://x/a.png"}}]}]}"#,
        );
        assert_eq!(r.media_parts().images, 1);
        assert_eq!(
            r.estimated_tokens(),
            u64::from(r.estimated_input_tokens()) + 1_600 + 10
        );
    }

    #[test]
    fn unprepared_request_reads_nothing() {
        let r = Request::new(Bytes::from_static(br#"{"model":"m"}"#));
        assert_eq!(r.model(), None);
    }
}
