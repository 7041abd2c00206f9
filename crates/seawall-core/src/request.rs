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

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;
use http::{Extensions, Request};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::class::FailureClass;
use crate::context::CallContext;
use crate::error::LlmError;

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
        if headers.contains_key("anthropic-version") || path.ends_with("/messages") {
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

/// Marks a request as idempotent (safe to retry after a 504 or a lost connection: the
/// upstream either deduplicates it or the caller accepts paying twice). Insert it into the
/// request's extensions; a request with an `Idempotency-Key` header counts too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Idempotent;

/// What seawall parsed out of an HTTP request body, cached in the request's extensions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMeta {
    /// The wire format.
    pub provider: Provider,
    /// The `model` field.
    pub model: Option<Arc<str>>,
    /// `max_tokens`, `max_completion_tokens` or `max_output_tokens`.
    pub max_output_tokens: Option<u32>,
    /// A rough estimate of the prompt's tokens (characters of text / 4).
    pub estimated_input_tokens: u32,
    /// `"stream": true`.
    pub stream: bool,
    /// The key for per-provider/model state: `host/model`.
    pub key: Option<Arc<str>>,
}

impl RequestMeta {
    /// Parses an HTTP request. A body that is not JSON gives an empty meta (no model, no
    /// estimate) rather than an error: the upstream, not seawall, rejects bad requests.
    ///
    /// One pass of a typed, borrowing deserializer: the prompt's text is counted as it goes
    /// by, never copied, so the only allocations are the model and key strings.
    pub fn parse(req: &Request<Bytes>) -> RequestMeta {
        let provider = Provider::detect(req.uri(), req.headers());
        let wire: Wire<'_> = serde_json::from_slice(req.body()).unwrap_or_default();
        let model: Option<Arc<str>> = wire.model.as_deref().map(Arc::from);
        let max_output_tokens = wire
            .max_tokens
            .or(wire.max_completion_tokens)
            .or(wire.max_output_tokens)
            .map(|n| n.min(u64::from(u32::MAX)) as u32);
        let text = wire.text;
        let estimate = text.chars.div_ceil(4) + 4 * text.parts;
        let key = model.as_ref().map(|m| {
            Arc::from(crate::bound_key(&format!(
                "{}/{m}",
                req.uri().host().unwrap_or("upstream")
            )))
        });
        RequestMeta {
            provider,
            model,
            max_output_tokens,
            estimated_input_tokens: estimate.min(u32::MAX as usize) as u32,
            stream: wire.stream.unwrap_or(false),
            key,
        }
    }
}

/// The fields of an OpenAI- or Anthropic-style request body that seawall reads.
#[derive(Default)]
struct Wire<'a> {
    model: Option<Cow<'a, str>>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    max_output_tokens: Option<u64>,
    stream: Option<bool>,
    text: TextCount,
}

impl<'de: 'a, 'a> Deserialize<'de> for Wire<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Wire<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Wire<'a>, M::Error> {
                let mut w = Wire::default();
                while let Some(k) = m.next_key::<Loose<'de>>()? {
                    let Loose::Str(k) = k else {
                        m.next_value::<IgnoredAny>()?;
                        continue;
                    };
                    match &*k {
                        "model" => w.model = m.next_value::<Loose<'a>>()?.str(),
                        "max_tokens" => w.max_tokens = m.next_value::<Loose<'a>>()?.u64(),
                        "max_completion_tokens" => {
                            w.max_completion_tokens = m.next_value::<Loose<'a>>()?.u64()
                        }
                        "max_output_tokens" => {
                            w.max_output_tokens = m.next_value::<Loose<'a>>()?.u64()
                        }
                        "stream" => w.stream = m.next_value::<Loose<'a>>()?.bool(),
                        "messages" | "system" | "prompt" | "input" | "tools" | "functions" => {
                            let t: TextCount = m.next_value()?;
                            w.text.chars += t.chars;
                            w.text.parts += t.parts;
                        }
                        _ => {
                            m.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(w)
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

/// Any JSON value, keeping only the scalars seawall reads: a field of an unexpected type is
/// skipped instead of failing the whole body.
enum Loose<'a> {
    Str(Cow<'a, str>),
    U64(u64),
    Bool(bool),
    Other,
}

impl<'a> Loose<'a> {
    fn str(self) -> Option<Cow<'a, str>> {
        match self {
            Loose::Str(s) => Some(s),
            _ => None,
        }
    }
    fn u64(self) -> Option<u64> {
        match self {
            Loose::U64(n) => Some(n),
            _ => None,
        }
    }
    fn bool(self) -> Option<bool> {
        match self {
            Loose::Bool(b) => Some(b),
            _ => None,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Loose<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Loose<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Loose<'a>, E> {
                Ok(Loose::Str(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Loose<'a>, E> {
                Ok(Loose::Str(Cow::Owned(s.to_owned())))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Loose<'a>, E> {
                Ok(Loose::U64(n))
            }
            fn visit_bool<E>(self, b: bool) -> Result<Loose<'a>, E> {
                Ok(Loose::Bool(b))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Loose<'a>, E> {
                Ok(Loose::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Loose<'a>, E> {
                Ok(Loose::Other)
            }
            fn visit_unit<E>(self) -> Result<Loose<'a>, E> {
                Ok(Loose::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Loose<'a>, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Loose::Other)
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Loose<'a>, M::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Loose::Other)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// Counts the characters and the pieces of text in any JSON value, without keeping them.
#[derive(Debug, Default, Clone, Copy)]
struct TextCount {
    chars: usize,
    parts: usize,
}

impl<'de> Deserialize<'de> for TextCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TextCount;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, s: &str) -> Result<TextCount, E> {
                Ok(TextCount {
                    chars: s.chars().count(),
                    parts: 1,
                })
            }
            fn visit_bool<E>(self, _: bool) -> Result<TextCount, E> {
                Ok(TextCount::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<TextCount, E> {
                Ok(TextCount::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<TextCount, E> {
                Ok(TextCount::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<TextCount, E> {
                Ok(TextCount::default())
            }
            fn visit_unit<E>(self) -> Result<TextCount, E> {
                Ok(TextCount::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<TextCount, A::Error> {
                let mut t = TextCount::default();
                while let Some(e) = a.next_element::<TextCount>()? {
                    t.chars += e.chars;
                    t.parts += e.parts;
                }
                Ok(t)
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<TextCount, M::Error> {
                let mut t = TextCount::default();
                while m.next_key::<IgnoredAny>()?.is_some() {
                    let e: TextCount = m.next_value()?;
                    t.chars += e.chars;
                    t.parts += e.parts;
                }
                Ok(t)
            }
        }
        d.deserialize_any(V)
    }
}

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

    /// The most output tokens the request allows, if it says.
    fn max_output_tokens(&self) -> Option<u32>;

    /// An estimate of the prompt's tokens.
    fn estimated_input_tokens(&self) -> u32;

    /// Estimated input plus maximum output tokens: what a token-rate limiter or a budget
    /// reserves.
    fn estimated_tokens(&self) -> u64 {
        u64::from(self.estimated_input_tokens()) + u64::from(self.max_output_tokens().unwrap_or(0))
    }

    /// Whether the response is streamed.
    fn is_streaming(&self) -> bool {
        false
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

    /// The per-call context an observing layer put in the extensions, if any.
    fn call_context(&self) -> Option<&Arc<CallContext>> {
        self.extensions()?.get()
    }
}

fn meta(req: &Request<Bytes>) -> Option<&RequestMeta> {
    req.extensions().get::<RequestMeta>()
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
            let m = RequestMeta::parse(self);
            self.extensions_mut().insert(m);
        }
    }

    fn model(&self) -> Option<&str> {
        meta(self)?.model.as_deref()
    }

    fn max_output_tokens(&self) -> Option<u32> {
        meta(self)?.max_output_tokens
    }

    fn estimated_input_tokens(&self) -> u32 {
        meta(self).map_or(0, |m| m.estimated_input_tokens)
    }

    fn is_streaming(&self) -> bool {
        meta(self).is_some_and(|m| m.stream)
    }

    fn is_idempotent(&self) -> bool {
        self.extensions().get::<Idempotent>().is_some()
            || self.headers().contains_key("idempotency-key")
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

    fn req(uri: &str, body: &str) -> Request<Bytes> {
        let mut r = Request::post(uri)
            .header("content-length", body.len())
            .body(Bytes::from(body.to_owned()))
            .unwrap();
        r.prepare();
        r
    }

    #[test]
    fn openai_request_meta() {
        let r = req(
            "https://api.openai.com/v1/chat/completions",
            r#"{"model":"gpt-4o-mini","max_completion_tokens":256,"stream":true,
               "messages":[{"role":"user","content":"Say hello to the whole wide world"}]}"#,
        );
        assert_eq!(r.model(), Some("gpt-4o-mini"));
        assert_eq!(r.max_output_tokens(), Some(256));
        assert!(r.is_streaming());
        assert!(!LlmRequest::is_idempotent(&r));
        assert_eq!(r.state_key(), Some("api.openai.com/gpt-4o-mini"));
        // "user" + 33 chars of content = 37 chars -> 10 tokens, plus 4 per text part.
        assert_eq!(r.estimated_input_tokens(), 10 + 8);
        assert_eq!(meta(&r).unwrap().provider, Provider::OpenAi);
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
    fn fields_of_unexpected_types_are_skipped_not_fatal() {
        let r = req(
            "http://localhost/v1/chat/completions",
            r#"{"model":5,"max_tokens":"lots","stream":"yes","max_completion_tokens":64,
               "extra":{"a":[1,{"b":null}]},"messages":[{"role":"user","content":"abcd"}]}"#,
        );
        assert_eq!(r.model(), None);
        assert_eq!(r.max_output_tokens(), Some(64));
        assert!(!r.is_streaming());
        // "user" + "abcd": 8 chars -> 2 tokens, plus 4 per text part.
        assert_eq!(r.estimated_input_tokens(), 2 + 8);
    }

    #[test]
    fn escaped_text_counts_its_characters() {
        let r = req(
            "http://localhost/v1/messages",
            r#"{"model":"m\u00e9","system":"\"quoted\"\n","messages":[]}"#,
        );
        assert_eq!(r.model(), Some("m\u{e9}"));
        // `"quoted"` and a newline: 9 chars -> 3 tokens, plus 4 for the one text part.
        assert_eq!(r.estimated_input_tokens(), 3 + 4);
    }

    #[test]
    fn unprepared_request_reads_nothing() {
        let r = Request::new(Bytes::from_static(br#"{"model":"m"}"#));
        assert_eq!(r.model(), None);
    }
}
