//! One typed request (not HTTP) for the layers' tests: exact token counts, a model name that
//! may be a slice of a shared buffer, idempotency, an observer's context and extensions.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

use http::Extensions;
use seawall_core::{CallContext, LlmError, LlmRequest, MediaParts};

/// How long a flood model name is: 64 KiB.
pub const NAME_LEN: usize = 64 * 1024;

/// A model name: a slice of a shared buffer, so that a flood of long, distinct names costs no
/// allocation per request.
#[derive(Clone)]
pub struct Name {
    buf: Arc<str>,
    at: Range<usize>,
}

impl Name {
    /// Name `i` of the buffer [`long_names`] made: its [`NAME_LEN`] bytes from counter `i`.
    pub fn long(names: &Arc<str>, i: usize) -> Name {
        Name {
            buf: names.clone(),
            at: i * 16..i * 16 + NAME_LEN,
        }
    }
}

impl From<&str> for Name {
    fn from(name: &str) -> Name {
        Name {
            buf: Arc::from(name),
            at: 0..name.len(),
        }
    }
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.buf[self.at.clone()]
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.len() > 64 {
            write!(f, "{:?}... ({} bytes)", &self[..64], self.len())
        } else {
            fmt::Debug::fmt(&**self, f)
        }
    }
}

/// `n` distinct model names of [`NAME_LEN`] bytes in one buffer: the counter 0, 1, 2, ... in
/// 16 hex digits, end to end; [`Name::long`] picks name `i`.
pub fn long_names(n: usize) -> Arc<str> {
    let mut s = String::with_capacity(n * 16 + NAME_LEN);
    for i in 0..(n + NAME_LEN / 16) as u64 {
        s.push_str(&format!("{i:016x}"));
    }
    s.into()
}

/// A typed request with explicit token counts, so the arithmetic in tests is exact.
///
/// The default is the request a test that does not care sends: model `test-model`, one input
/// token, no output cap, not idempotent, no context.
#[derive(Debug, Clone)]
pub struct Ask {
    /// The model (and the key of per-model state).
    pub model: Option<Name>,
    /// The estimated input tokens.
    pub input: u32,
    /// The maximum output tokens.
    pub max: Option<u32>,
    /// Whether a retry after a possibly billed outcome is acceptable.
    pub idempotent: bool,
    /// An observer's per-call context, when not in the extensions.
    pub context: Option<Arc<CallContext>>,
    /// The extensions.
    pub ext: Extensions,
    /// A number the test gives the request, to tell calls apart in what an upstream saw.
    pub id: usize,
    /// Answers asked for (`n`); 0 counts as 1.
    pub choices: u32,
    /// The images, audio and files of the request.
    pub media: MediaParts,
}

impl Default for Ask {
    fn default() -> Self {
        Ask {
            model: Some(Name::from("test-model")),
            input: 1,
            max: None,
            idempotent: false,
            context: None,
            ext: Extensions::new(),
            id: 0,
            choices: 1,
            media: MediaParts::default(),
        }
    }
}

/// The tenant of a request, as an extension.
#[derive(Debug, Clone)]
pub struct Tenant(pub Arc<str>);

impl Ask {
    /// A request for `model` with `input` tokens in and at most `max` out.
    pub fn new(model: &str, input: u32, max: u32) -> Ask {
        Ask {
            model: Some(model.into()),
            input,
            max: Some(max),
            ..Ask::default()
        }
    }

    /// A request for `model` and nothing else: no tokens in, no output cap.
    pub fn named(model: impl Into<Name>) -> Ask {
        Ask {
            model: Some(model.into()),
            input: 0,
            ..Ask::default()
        }
    }

    /// Request number `id` for model `m`, with no tokens in and no output cap.
    pub fn numbered(id: usize) -> Ask {
        Ask {
            id,
            ..Ask::named("m")
        }
    }

    /// The same request for `model`.
    pub fn key(mut self, model: &str) -> Ask {
        self.model = Some(model.into());
        self
    }

    /// The same request with `input` tokens in and at most `max` out.
    pub fn tokens(mut self, input: u32, max: u32) -> Ask {
        self.input = input;
        self.max = Some(max);
        self
    }

    /// Marks the request as the tenant `t`'s.
    pub fn tenant(mut self, t: &str) -> Ask {
        self.ext.insert(Tenant(t.into()));
        self
    }
}

/// The tenant a request carries as a [`Tenant`] extension: a key function for per-tenant
/// state.
pub fn tenant_key(req: &Ask) -> Option<String> {
    req.ext.get::<Tenant>().map(|t| t.0.to_string())
}

impl LlmRequest for Ask {
    fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }
    fn max_output_tokens(&self) -> Option<u32> {
        self.max
    }
    fn estimated_input_tokens(&self) -> u32 {
        self.input
    }
    fn is_idempotent(&self) -> bool {
        self.idempotent
    }
    fn choices(&self) -> u32 {
        self.choices.max(1)
    }
    fn media_parts(&self) -> MediaParts {
        self.media
    }
    fn set_max_output_tokens(&mut self, max: u32) -> Result<(), LlmError> {
        self.max = Some(max);
        Ok(())
    }
    fn extensions(&self) -> Option<&Extensions> {
        Some(&self.ext)
    }
    fn extensions_mut(&mut self) -> Option<&mut Extensions> {
        Some(&mut self.ext)
    }
    fn call_context(&self) -> Option<&Arc<CallContext>> {
        self.context.as_ref().or_else(|| self.ext.get())
    }
}
