//! Reading an OpenAI- or Anthropic-style request body: one pass that takes the model, the
//! output bound and the stream flag, and counts the prompt's text and its non-text parts
//! without copying them.
//!
//! The pass is a byte scan (the `scan` submodule) for the bodies it is sure to read as serde
//! does; a borrowing serde deserializer, the reference, reads the rest. Both build the same
//! [`Wire`] by the same counting rules ([`TextCount`]), and a property test holds them to the
//! same result.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{MediaParts, Provider, ServiceTier};

mod scan;

/// The fields of a request body whose text the model reads, and which the prompt's estimate
/// counts ([`RequestMeta::parse`]): what a request asks, as opposed to how it is sent.
///
/// The parser matches the same names as a pattern, which compiles to a few length and byte
/// comparisons on a path every request takes; a test checks that the two agree.
pub const PROMPT_FIELDS: [&str; 11] = [
    "messages",
    "system",
    "prompt",
    "input",
    "instructions",
    "suffix",
    "tools",
    "functions",
    "tool_choice",
    "response_format",
    "text",
];

/// What seawall parsed out of an HTTP request body, cached in the request's extensions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMeta {
    /// The wire format.
    pub provider: Provider,
    /// The `model` field.
    pub model: Option<Arc<str>>,
    /// The largest of `max_tokens`, `max_completion_tokens` and `max_output_tokens`, per
    /// answer. `None` when no field gives a usable bound (see [`RequestMeta::parse`]).
    pub max_output_tokens: Option<u32>,
    /// How many answers the upstream generates and bills: `n`, or `best_of` where larger; at
    /// least 1.
    pub choices: u32,
    /// A rough estimate of the prompt's text tokens (characters / 4, plus 4 per piece of
    /// text). Images, audio and files are not in it: they are counted in `media`.
    pub estimated_input_tokens: u32,
    /// The prompt's non-text parts, by kind.
    pub media: MediaParts,
    /// `"stream": true`.
    pub stream: bool,
    /// The OpenAI `service_tier` billed apart (`"priority"`, `"flex"`); `None` for the
    /// standard tiers, any other value, and an Anthropic request (whose field chooses
    /// capacity, not a price).
    pub service_tier: Option<ServiceTier>,
    /// The key for per-provider/model state: `host/model`.
    pub key: Option<Arc<str>>,
}

impl RequestMeta {
    /// Parses an HTTP request. A body that is not JSON gives an empty meta (no model, no
    /// estimate) rather than an error: the upstream, not seawall, rejects bad requests.
    ///
    /// One pass over the body (a byte scan; a typed, borrowing deserializer for what the scan
    /// is not sure of): the prompt's text is counted as it goes by, never copied; the model
    /// and key strings are shared with the thread's earlier requests that named the same ones,
    /// so a usual call allocates nothing here.
    ///
    /// What is read, and how odd values are taken (never a panic):
    ///
    /// - **Output bound**: the largest of `max_tokens`, `max_completion_tokens` and
    ///   `max_output_tokens`, since upstreams differ in which one wins. A field may be an
    ///   integer, an integral float (`1e5`, `100000.0`) or a numeric string (`"100000"`), as
    ///   upstreams accept. A fraction is rounded up (still a bound); a value above `u32::MAX`
    ///   is clamped to it. A negative, non-numeric or non-finite value bounds nothing and is
    ///   ignored; if no field is left, `max_output_tokens` is `None`: the request's output is
    ///   unbounded, and a budget applies its policy for that.
    /// - **Choices**: `n` and `best_of` (OpenAI) make the upstream generate, and bill, that
    ///   many answers; `choices` is the larger, read like the output bound, at least 1.
    ///   Anthropic has neither; a body that sets them anyway has them counted, which can only
    ///   overestimate.
    /// - **Text**: every string in `messages`, `system`, `prompt`, `input`, `instructions`,
    ///   `suffix`, `tools`, `functions`, `tool_choice`, `response_format` and `text` (the
    ///   Responses API's output format, whose JSON schema the model reads).
    /// - **Non-text parts**: an object whose `type` is `image_url`, `input_image` or `image`
    ///   is one image; `input_audio` one audio part (counted by its seconds when its data is
    ///   WAV, whose header gives its byte rate); `file`, `input_file`, or a `document`
    ///   with a `base64`, `url` or `file` source, one file. None of their strings (base64
    ///   data, URLs) counts as text: a 1 MB image is not 250,000 tokens of prose. A `document`
    ///   with a `text` source is text.
    pub fn parse(req: &Request<Bytes>) -> RequestMeta {
        let provider = Provider::detect(req.uri(), req.headers());
        // UTF-8 checked once for the whole body, not once per string read (a dozen calls of
        // the checker for a small chat request, each costing more than the string); a body
        // that is not UTF-8 is read as bytes, to the same result. The byte scan reads the
        // usual body; serde reads what the scan is not sure of.
        let wire: Wire<'_> = match std::str::from_utf8(req.body()) {
            Ok(text) => {
                scan::wire(text).unwrap_or_else(|| serde_json::from_str(text).unwrap_or_default())
            }
            Err(_) => serde_json::from_slice(req.body()).unwrap_or_default(),
        };
        let host = host(req.uri()).unwrap_or("upstream");
        let (model, key) = match wire.model.as_deref() {
            Some(m) => {
                let (model, key) = names::shared(host, m);
                (Some(model), Some(key))
            }
            None => (None, None),
        };
        let max_output_tokens = wire.max_output.map(clamp_u32);
        let text = wire.text;
        let estimate = text
            .chars
            .div_ceil(4)
            .saturating_add(text.parts.saturating_mul(4));
        let mut media = text.media;
        // Raw data no enclosing part claimed (an unknown kind of part): priced as a file.
        media.files = media.files.saturating_add(text.opaque);
        RequestMeta {
            provider,
            model,
            max_output_tokens,
            choices: wire.choices.map_or(1, clamp_u32).max(1),
            estimated_input_tokens: estimate.min(u32::MAX as usize) as u32,
            media,
            stream: wire.stream.unwrap_or(false),
            service_tier: wire
                .service_tier
                .filter(|_| provider != Provider::Anthropic),
            key,
        }
    }
}

/// The URI's host, as [`Uri::host`](http::Uri::host) finds it. That splits the authority
/// at `@` and `:` with a generic character search (about 400 instructions, a tenth of reading
/// a small request); an authority with neither is its host.
fn host(uri: &http::Uri) -> Option<&str> {
    let authority = uri.authority()?;
    let text = authority.as_str();
    // A byte loop: an authority is a few dozen bytes, less than `memchr`'s set-up.
    if !text.bytes().any(|b| b == b'@' || b == b':') {
        return Some(text);
    }
    Some(authority.host())
}

fn clamp_u32(n: u64) -> u32 {
    n.min(u64::from(u32::MAX)) as u32
}

/// The model name and the state key (`host/model`) of a request, shared between the
/// requests that name the same ones.
///
/// Every call of an application names one of a handful of models on one or two hosts, and
/// building the two strings anew cost three allocations per call (the name, the formatted
/// key, its shared copy). Each thread keeps the last few pairs it built and hands out clones
/// of them: a reference count each, no allocation. Only short names are kept (a request is
/// untrusted input: a megabyte of model name is built for its one call and dropped), and at
/// most [`KEPT`](names::KEPT) pairs, replaced in turn, so what a thread keeps stays small
/// whatever the requests name.
mod names {
    use std::cell::RefCell;
    use std::sync::Arc;

    /// Pairs kept per thread.
    pub(super) const KEPT: usize = 8;

    /// The pairs a thread built last, and which one the next new pair replaces.
    struct Kept {
        pairs: Vec<(Arc<str>, Arc<str>)>,
        next: usize,
    }

    thread_local! {
        static KEPT_PAIRS: RefCell<Kept> = const {
            RefCell::new(Kept { pairs: Vec::new(), next: 0 })
        };
    }

    /// Whether `key` is exactly `host/model`.
    fn is_key_of(key: &str, host: &str, model: &str) -> bool {
        key.len() == host.len() + 1 + model.len()
            && key.starts_with(host)
            && key.as_bytes()[host.len()] == b'/'
            && key.ends_with(model)
    }

    /// The model name and its state key, `bound_key("{host}/{model}")`.
    pub(super) fn shared(host: &str, model: &str) -> (Arc<str>, Arc<str>) {
        // A key that `bound_key` would cut is built every time (it is never kept, so
        // `is_key_of` only ever compares keys that were not cut).
        if host.len() + 1 + model.len() > crate::MAX_KEY_LEN {
            return build(host, model);
        }
        let found = KEPT_PAIRS.try_with(|kept| {
            let mut kept = kept.borrow_mut();
            if let Some((m, k)) = kept
                .pairs
                .iter()
                .find(|(m, k)| **m == *model && is_key_of(k, host, model))
            {
                return (m.clone(), k.clone());
            }
            let pair = build(host, model);
            let kept = &mut *kept;
            if kept.pairs.len() < KEPT {
                kept.pairs.push(pair.clone());
            } else {
                kept.pairs[kept.next] = pair.clone();
                kept.next = (kept.next + 1) % KEPT;
            }
            pair
        });
        // The thread is exiting (its locals are gone): build them as before.
        found.unwrap_or_else(|_| build(host, model))
    }

    fn build(host: &str, model: &str) -> (Arc<str>, Arc<str>) {
        let key = Arc::from(crate::bound_key(&format!("{host}/{model}")));
        (Arc::from(model), key)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_same_names_are_shared_not_built_again() {
            let (m1, k1) = shared("api.openai.com", "gpt-4o");
            let (m2, k2) = shared("api.openai.com", "gpt-4o");
            assert_eq!((&*m1, &*k1), ("gpt-4o", "api.openai.com/gpt-4o"));
            assert!(Arc::ptr_eq(&m1, &m2) && Arc::ptr_eq(&k1, &k2));
        }

        #[test]
        fn another_host_or_model_gets_its_own_key() {
            let (_, k) = shared("a.example", "gpt-4o");
            let (_, other_host) = shared("b.example", "gpt-4o");
            let (m, other_model) = shared("a.example", "gpt-4o-mini");
            assert_eq!(&*k, "a.example/gpt-4o");
            assert_eq!(&*other_host, "b.example/gpt-4o");
            assert_eq!(
                (&*m, &*other_model),
                ("gpt-4o-mini", "a.example/gpt-4o-mini")
            );
            // A host and model that join to the same text are still told apart by the model.
            let (m, k) = shared("a.example/gpt", "4o");
            assert_eq!((&*m, &*k), ("4o", "a.example/gpt/4o"));
        }

        #[test]
        fn a_thread_keeps_a_bounded_number_of_names() {
            for i in 0..3 * KEPT {
                let (m, k) = shared("h", &format!("model-{i}"));
                assert_eq!(&*k, format!("h/{m}"));
            }
            KEPT_PAIRS.with(|kept| assert_eq!(kept.borrow().pairs.len(), KEPT));
        }

        #[test]
        fn a_long_key_is_bounded_as_before_and_not_kept() {
            let model = "m".repeat(crate::MAX_KEY_LEN);
            let (m, k) = shared("h", &model);
            assert_eq!(&*m, model);
            assert_eq!(&*k, &*crate::bound_key(&format!("h/{model}")));
            KEPT_PAIRS.with(|kept| assert!(kept.borrow().pairs.iter().all(|(m, _)| m.len() < 100)));
        }
    }
}

/// The fields of an OpenAI- or Anthropic-style request body that seawall reads.
#[derive(Debug, Default, PartialEq)]
struct Wire<'a> {
    model: Option<Cow<'a, str>>,
    max_output: Option<u64>,
    choices: Option<u64>,
    stream: Option<bool>,
    service_tier: Option<ServiceTier>,
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
                        "max_tokens" | "max_completion_tokens" | "max_output_tokens" => {
                            // `None < Some`: the largest bound wins, an unusable one adds none.
                            w.max_output = w.max_output.max(m.next_value::<Loose<'a>>()?.count());
                        }
                        "n" | "best_of" => {
                            w.choices = w.choices.max(m.next_value::<Loose<'a>>()?.count());
                        }
                        "stream" => w.stream = m.next_value::<Loose<'a>>()?.bool(),
                        "service_tier" => {
                            w.service_tier = m.next_value::<Loose<'a>>()?.service_tier();
                        }
                        "messages" | "system" | "prompt" | "input" | "instructions" | "suffix"
                        | "tools" | "functions" | "tool_choice" | "response_format" | "text" => {
                            let t: TextCount = m.next_value()?;
                            w.text.add(t);
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
    I64(i64),
    F64(f64),
    Bool(bool),
    Other,
}

impl<'a> Loose<'a> {
    fn service_tier(self) -> Option<ServiceTier> {
        ServiceTier::from_name(&self.str()?)
    }

    fn str(self) -> Option<Cow<'a, str>> {
        match self {
            Loose::Str(s) => Some(s),
            _ => None,
        }
    }
    /// A count of tokens or answers, as upstreams accept one: an integer, an integral float
    /// or a numeric string. A fraction rounds up; negative, non-finite and non-numeric
    /// values give `None`.
    fn count(self) -> Option<u64> {
        let f = match self {
            Loose::U64(n) => return Some(n),
            Loose::I64(n) => return u64::try_from(n).ok(),
            Loose::F64(f) => f,
            Loose::Str(s) => {
                let s = s.trim();
                if let Ok(n) = s.parse::<u64>() {
                    return Some(n);
                }
                s.parse::<f64>().ok()?
            }
            Loose::Bool(_) | Loose::Other => return None,
        };
        // `as` saturates: 1e300 becomes u64::MAX, later clamped to u32::MAX.
        (f.is_finite() && f >= 0.0).then(|| f.ceil() as u64)
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
            fn visit_i64<E>(self, n: i64) -> Result<Loose<'a>, E> {
                Ok(Loose::I64(n))
            }
            fn visit_f64<E>(self, f: f64) -> Result<Loose<'a>, E> {
                Ok(Loose::F64(f))
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

/// What the `type` of a content object makes of it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Text, or anything else seawall does not price apart.
    #[default]
    Text,
    Image,
    Audio,
    File,
    /// A document: a file if its source is raw data, else text.
    Document,
    /// Raw data whose kind the enclosing object says (Anthropic's `source`).
    Data,
}

impl Kind {
    fn of(tag: &str) -> Kind {
        match tag {
            "image_url" | "input_image" | "image" => Kind::Image,
            "input_audio" => Kind::Audio,
            "file" | "input_file" => Kind::File,
            "document" => Kind::Document,
            "base64" | "url" => Kind::Data,
            _ => Kind::Text,
        }
    }
}

/// The length of base64 WAV data, from the byte rate in its header: whole seconds, rounded
/// up. `None` for anything else (other formats, a header it cannot read).
fn wav_seconds(b64: &str) -> Option<u32> {
    use base64::Engine as _;
    // "RIFF" encodes as "UklGR": anything else is skipped without decoding.
    let head = b64.get(..44).filter(|h| h.starts_with("UklGR"))?;
    let mut h = [0u8; 33];
    base64::engine::general_purpose::STANDARD
        .decode_slice(head, &mut h)
        .ok()?;
    if &h[8..16] != b"WAVEfmt " {
        return None;
    }
    let byte_rate = u32::from_le_bytes([h[28], h[29], h[30], h[31]]);
    if byte_rate == 0 {
        return None;
    }
    // Base64 carries 3 bytes in 4 characters; the header is part of it, a bound from above.
    let bytes = (b64.trim_end_matches('=').len() as u64 * 3) / 4;
    Some(clamp_u32(bytes.div_ceil(u64::from(byte_rate))))
}

/// Counts the characters and the pieces of text in any JSON value, and its non-text parts,
/// without keeping them.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct TextCount {
    chars: usize,
    parts: usize,
    media: MediaParts,
    /// Raw data not yet claimed by an enclosing image, audio or file part.
    opaque: u32,
    /// The kind a string value names, when used as a `type`.
    kind: Kind,
    /// Seconds of WAV data found inside, if any (an audio part's length).
    wav_seconds: Option<u32>,
}

impl TextCount {
    fn add(&mut self, o: TextCount) {
        self.chars = self.chars.saturating_add(o.chars);
        self.parts = self.parts.saturating_add(o.parts);
        self.media.add(o.media);
        self.opaque = self.opaque.saturating_add(o.opaque);
        self.wav_seconds = match (self.wav_seconds, o.wav_seconds) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, b) => a.or(b),
        };
    }

    /// One part of a kind, which claims everything inside it: its base64 data, its URL.
    fn part(media: MediaParts) -> TextCount {
        TextCount {
            media,
            ..TextCount::default()
        }
    }

    /// What an object whose `type` names `kind`, holding `self`, counts for.
    fn classify(self, kind: Kind) -> TextCount {
        let one = MediaParts::default();
        match kind {
            Kind::Text => self,
            Kind::Image => TextCount::part(MediaParts { images: 1, ..one }),
            Kind::Audio => TextCount::part(match self.wav_seconds {
                Some(s) => MediaParts {
                    audio_seconds: s,
                    ..one
                },
                None => MediaParts { audio: 1, ..one },
            }),
            Kind::File => TextCount::part(MediaParts { files: 1, ..one }),
            Kind::Document if self.opaque > 0 || self.media.files > 0 => {
                TextCount::part(MediaParts { files: 1, ..one })
            }
            Kind::Document => self,
            Kind::Data => TextCount {
                opaque: 1,
                ..TextCount::default()
            },
        }
    }
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
                Ok(TextCount::of_str(s))
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
                    t.add(e);
                }
                Ok(t)
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<TextCount, M::Error> {
                let mut t = TextCount::default();
                let mut kind = Kind::Text;
                while let Some(k) = m.next_key::<Loose<'de>>()? {
                    let e: TextCount = m.next_value()?;
                    if matches!(&k, Loose::Str(k) if k == "type") {
                        kind = e.kind;
                    }
                    t.add(e);
                }
                // Classified once the whole object is seen: `type` may come after the data.
                Ok(t.classify(kind))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LlmRequest;
    use crate::PartEstimate;
    use crate::request::meta;
    use crate::request::tests::{CHAT, req};

    #[test]
    fn every_prompt_field_and_no_other_is_counted_as_text() {
        let estimate = |field: &str| {
            let body = format!(r#"{{"model":"m","{field}":"abcdefgh"}}"#);
            req("http://localhost/v1/chat/completions", &body).estimated_input_tokens()
        };
        for field in PROMPT_FIELDS {
            // 8 chars -> 2 tokens, plus 4 for the piece of text.
            assert_eq!(estimate(field), 6, "{field}");
        }
        for field in ["metadata", "user", "stop", "seed", "store"] {
            assert_eq!(estimate(field), 0, "{field}");
        }
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
    fn a_body_with_bytes_that_are_not_utf8_is_read_as_far_as_serde_reads_it() {
        // Invalid UTF-8 in a value nothing reads: serde skips it, so the rest is read.
        let mut body = br#"{"model":"gpt-4o","note":"x"#.to_vec();
        body.push(0xff);
        body.extend_from_slice(
            br#"","max_tokens":7,"messages":[{"role":"user","content":"abcd"}]}"#,
        );
        let mut r = Request::post(CHAT).body(Bytes::from(body)).unwrap();
        r.prepare();
        assert_eq!(r.model(), Some("gpt-4o"));
        assert_eq!(r.max_output_tokens(), Some(7));
        // "user" + "abcd": 8 chars -> 2 tokens, plus 4 per text part.
        assert_eq!(r.estimated_input_tokens(), 2 + 8);
        // In a string that is read, it makes the body unreadable: an empty meta, no panic.
        let mut body = br#"{"model":"gpt-4"#.to_vec();
        body.push(0xff);
        body.extend_from_slice(br#"o","max_tokens":7}"#);
        let mut r = Request::post(CHAT).body(Bytes::from(body)).unwrap();
        r.prepare();
        assert_eq!(r.model(), None);
        assert_eq!(r.max_output_tokens(), None);
    }

    #[test]
    fn the_host_is_found_as_the_uri_finds_it() {
        for uri in [
            "https://api.openai.com/v1/chat/completions",
            "http://user:secret@example.com:8080/v1",
            "http://user@example.com/v1",
            "http://example.com:443/v1",
            "http://[::1]:8080/v1",
            "http://[::1]/v1",
            "/v1/chat/completions",
        ] {
            let uri: http::Uri = uri.parse().unwrap();
            assert_eq!(host(&uri), uri.host(), "{uri}");
        }
    }

    fn meta_of(uri: &str, body: &str) -> RequestMeta {
        meta(&req(uri, body)).cloned().unwrap()
    }

    #[test]
    fn n_and_best_of_multiply_the_billed_output() {
        let r = req(CHAT, r#"{"model":"gpt-4o","n":128,"max_tokens":16384}"#);
        assert_eq!(r.choices(), 128);
        assert_eq!(r.max_billed_output_tokens(), Some(128 * 16_384));
        assert_eq!(r.estimated_tokens(), 128 * 16_384);
        let r = req(
            "http://h/v1/completions",
            r#"{"model":"m","prompt":"","n":2,"best_of":5,"max_tokens":10}"#,
        );
        assert_eq!(r.choices(), 5);
        assert_eq!(r.max_billed_output_tokens(), Some(50));
        // Absent, zero or unusable: one answer.
        for body in [
            r#"{"max_tokens":10}"#,
            r#"{"n":0,"max_tokens":10}"#,
            r#"{"n":-3,"max_tokens":10}"#,
            r#"{"n":"x","max_tokens":10}"#,
        ] {
            assert_eq!(
                req(CHAT, body).max_billed_output_tokens(),
                Some(10),
                "{body}"
            );
        }
        // Absurd values saturate instead of overflowing.
        let r = req(CHAT, r#"{"n":1e30,"max_tokens":1e30}"#);
        assert_eq!(
            r.max_billed_output_tokens(),
            Some(u64::from(u32::MAX) * u64::from(u32::MAX))
        );
    }

    #[test]
    fn the_largest_max_output_field_wins() {
        for body in [
            r#"{"max_tokens":100,"max_completion_tokens":5000}"#,
            r#"{"max_completion_tokens":5000,"max_tokens":100}"#,
            r#"{"max_output_tokens":5000,"max_tokens":"100"}"#,
        ] {
            assert_eq!(req(CHAT, body).max_output_tokens(), Some(5000), "{body}");
        }
    }

    #[test]
    fn max_output_accepts_integral_floats_and_numeric_strings() {
        for (v, want) in [
            ("1e5", Some(100_000)),
            ("100000.0", Some(100_000)),
            (r#""100000""#, Some(100_000)),
            (r#"" 64 ""#, Some(64)),
            (r#""1e3""#, Some(1_000)),
            // A fraction is rounded up: still a bound.
            ("10.2", Some(11)),
            // Beyond u32: clamped.
            ("1e300", Some(u32::MAX)),
            ("99999999999", Some(u32::MAX)),
            // Bounds nothing: unbounded.
            ("-1", None),
            ("-0.5", None),
            (r#""-5""#, None),
            (r#""NaN""#, None),
            (r#""inf""#, None),
            (r#""lots""#, None),
            ("null", None),
            ("true", None),
            ("[5]", None),
        ] {
            let body = format!(r#"{{"model":"m","max_tokens":{v}}}"#);
            assert_eq!(req(CHAT, &body).max_output_tokens(), want, "{v}");
        }
    }

    proptest::proptest! {
        /// `sizes` reads in one look exactly what the four methods read one by one, parsed
        /// or not, whatever the request asks for.
        #[test]
        fn sizes_in_one_look_are_the_methods_answers(
            max in proptest::option::of(0u64..5_000_000_000),
            n in proptest::option::of(0u64..8),
            text in "[a-z ]{0,40}",
            images in 0usize..3,
            prepared in proptest::bool::ANY,
        ) {
            let mut fields = vec![r#""model":"gpt-4o""#.to_owned()];
            if let Some(max) = max {
                fields.push(format!(r#""max_tokens":{max}"#));
            }
            if let Some(n) = n {
                fields.push(format!(r#""n":{n}"#));
            }
            let mut parts = vec![format!(r#"{{"type":"text","text":"{text}"}}"#)];
            parts.extend((0..images).map(|_| {
                r#"{"type":"image_url","image_url":{"url":"https://x/y.png"}}"#.to_owned()
            }));
            fields.push(format!(
                r#""messages":[{{"role":"user","content":[{}]}}]"#,
                parts.join(",")
            ));
            let body = format!("{{{}}}", fields.join(","));
            let r = if prepared {
                req(CHAT, &body)
            } else {
                Request::post(CHAT).body(Bytes::from(body)).unwrap()
            };
            let sizes = r.sizes();
            proptest::prop_assert_eq!(sizes.max_output_tokens, r.max_output_tokens());
            proptest::prop_assert_eq!(sizes.estimated_input_tokens, r.estimated_input_tokens());
            proptest::prop_assert_eq!(sizes.choices, r.choices());
            proptest::prop_assert_eq!(sizes.media, r.media_parts());
            // What the sizes derive, against the same figures from the methods one by one.
            let billed = r
                .max_output_tokens()
                .map(|m| u64::from(m) * u64::from(r.choices()));
            proptest::prop_assert_eq!(sizes.max_billed_output_tokens(), billed);
            proptest::prop_assert_eq!(r.max_billed_output_tokens(), billed);
            let input = u64::from(r.estimated_input_tokens())
                + PartEstimate::DEFAULT.tokens(&r.media_parts());
            proptest::prop_assert_eq!(sizes.input_tokens(&PartEstimate::DEFAULT), input);
            proptest::prop_assert_eq!(r.estimated_tokens(), input + billed.unwrap_or(0));
        }

        /// Whatever number (or numeric string) a max-output field holds, the parse never
        /// panics, and the bound it keeps is at least the value asked for, up to `u32::MAX`.
        #[test]
        fn any_numeric_max_output_is_bounded_from_above_or_unbounded(
            f in proptest::num::f64::ANY,
            quoted in proptest::bool::ANY,
        ) {
            let v = if f.is_finite() { format!("{f:?}") } else { format!("{f}") };
            let v = if quoted || !f.is_finite() { format!("\"{v}\"") } else { v };
            let body = format!(r#"{{"max_completion_tokens":{v}}}"#);
            let got = req(CHAT, &body).max_output_tokens();
            if f.is_finite() && f >= 0.0 {
                let got = got.unwrap();
                proptest::prop_assert!(f64::from(got) >= f.min(f64::from(u32::MAX)), "{} -> {}", v, got);
            } else if f < 0.0 && f.ceil() < 0.0 {
                proptest::prop_assert_eq!(got, None);
            }
        }
    }

    #[test]
    fn base64_images_are_parts_not_text() {
        let data = "A".repeat(400_000);
        // Chat Completions: an image part with a data: URL, with "type" last.
        let m = meta_of(
            CHAT,
            &format!(
                r#"{{"model":"gpt-4o","max_tokens":10,"messages":[{{"role":"user","content":[
                {{"type":"text","text":"what is it"}},
                {{"image_url":{{"url":"data:image/png;base64,{data}","detail":"high"}},"type":"image_url"}}]}}]}}"#
            ),
        );
        assert_eq!(
            m.media,
            MediaParts {
                images: 1,
                audio: 0,
                audio_seconds: 0,
                files: 0
            }
        );
        // "user", "text", "what is it": 18 chars -> 5 tokens, plus 4 for each of 3 parts.
        assert_eq!(m.estimated_input_tokens, 5 + 12);

        // Anthropic: a base64 image and a base64 PDF; a text document stays text.
        let m = meta_of(
            "https://api.anthropic.com/v1/messages",
            &format!(
                r#"{{"model":"claude","max_tokens":10,"messages":[{{"role":"user","content":[
                {{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{data}"}}}},
                {{"type":"document","source":{{"data":"{data}","media_type":"application/pdf","type":"base64"}}}},
                {{"type":"document","source":{{"type":"text","media_type":"text/plain","data":"abcdefgh"}}}}]}}]}}"#
            ),
        );
        assert_eq!(
            m.media,
            MediaParts {
                images: 1,
                audio: 0,
                audio_seconds: 0,
                files: 1
            }
        );
        assert!(
            m.estimated_input_tokens < 100,
            "{}",
            m.estimated_input_tokens
        );
    }

    #[test]
    fn audio_files_and_responses_parts_are_counted_by_kind() {
        let data = "UklGR".repeat(10_000);
        let m = meta_of(
            CHAT,
            &format!(
                r#"{{"model":"gpt-4o-audio","messages":[{{"role":"user","content":[
                {{"type":"input_audio","input_audio":{{"data":"{data}","format":"wav"}}}},
                {{"type":"file","file":{{"file_data":"data:application/pdf;base64,{data}","filename":"a.pdf"}}}}]}}]}}"#
            ),
        );
        assert_eq!(
            m.media,
            MediaParts {
                images: 0,
                audio: 1,
                audio_seconds: 0,
                files: 1
            }
        );
        assert!(
            m.estimated_input_tokens < 50,
            "{}",
            m.estimated_input_tokens
        );

        let m = meta_of(
            "https://api.openai.com/v1/responses",
            &format!(
                r#"{{"model":"gpt-4.1","instructions":"{long}","input":[{{"role":"user","content":[
                {{"type":"input_image","image_url":"data:image/jpeg;base64,{data}"}},
                {{"type":"input_image","file_id":"file-1"}},
                {{"type":"input_file","filename":"x.pdf","file_data":"{data}"}}]}}]}}"#,
                long = "x".repeat(4_000)
            ),
        );
        assert_eq!(
            m.media,
            MediaParts {
                images: 2,
                audio: 0,
                audio_seconds: 0,
                files: 1
            }
        );
        // The instructions are text: 4,000 chars -> 1,000 tokens.
        assert!(
            m.estimated_input_tokens >= 1_000,
            "{}",
            m.estimated_input_tokens
        );
        assert!(
            m.estimated_input_tokens < 1_100,
            "{}",
            m.estimated_input_tokens
        );
        let r = req(
            "https://api.openai.com/v1/responses",
            r#"{"model":"m","max_output_tokens":5,"input":"hi","n":1}"#,
        );
        assert_eq!(r.media_parts(), MediaParts::default());
    }

    #[test]
    fn wav_audio_is_counted_by_its_seconds() {
        use base64::Engine as _;
        // 16-bit mono at 8 kHz: 16,000 bytes a second; 2.5 s of silence after the header.
        let mut wav = Vec::new();
        wav.extend_from_slice(b"RIFF\0\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0");
        wav.extend_from_slice(&8_000u32.to_le_bytes());
        wav.extend_from_slice(&16_000u32.to_le_bytes());
        wav.extend_from_slice(b"\x02\0\x10\0data\0\0\0\0");
        wav.resize(44 + 40_000, 0);
        let data = base64::engine::general_purpose::STANDARD.encode(&wav);
        let audio = |data: &str| {
            let body = format!(
                r#"{{"messages":[{{"role":"user","content":[{{"type":"input_audio",
                "input_audio":{{"data":"{data}","format":"wav"}}}}]}}]}}"#
            );
            meta_of(CHAT, &body).media
        };
        let m = audio(&data);
        assert_eq!((m.audio_seconds, m.audio), (3, 0));
        assert_eq!(PartEstimate::DEFAULT.tokens(&m), 3 * 32);
        // Not WAV (or a header it cannot read): one part of unknown length.
        let m = audio("SUQzBAAAAAAAI1RTU0UAAAAPAAADTGF2ZjU4Ljc2LjEwMAAAAAAAAAAAAAAA");
        assert_eq!((m.audio_seconds, m.audio), (0, 1));
        let m = audio("UklGRgAA");
        assert_eq!((m.audio_seconds, m.audio), (0, 1));
    }
}
