//! The layer, its builder, and the one choice a deployment makes: how an OpenAI-compatible
//! server is asked to go on.

use std::sync::Arc;

use seawall_core::ConfigError;
use tower_layer::Layer;

use crate::service::Continue;

/// How a follow-up request asks the model to go on from the partial answer, which it always
/// carries as the assistant's last turn.
///
/// The Anthropic Messages API always uses [`Prefill`](Self::Prefill); the OpenAI wire uses the
/// layer's [`openai_style`](ContinueBuilder::openai_style), [`Instruction`](Self::Instruction)
/// by default since plain OpenAI has no continuation support.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContinuationStyle {
    /// The assistant's turn is last and the answer continues it: Anthropic's prefill, and
    /// servers that continue a final assistant message by themselves (llama.cpp). A prefill
    /// sent to Anthropic never ends in whitespace (Anthropic refuses one): the trailing
    /// whitespace is left out of the request, and dropped from the start of the continuation
    /// if the model writes it again.
    Prefill,
    /// vLLM (and SGLang): `"continue_final_message": true` with
    /// `"add_generation_prompt": false`.
    ContinueFinalMessage,
    /// DeepSeek (beta endpoint) and Mistral: `"prefix": true` on the last assistant message.
    Prefix,
    /// Any chat model, plain OpenAI included: an extra user turn asks the model to go on
    /// exactly where it stopped without repeating anything ([`ContinueBuilder::instruction`]).
    /// A model that is only asked may start by repeating the last words it gave: when the
    /// continuation starts with a tail of the text delivered (from a word boundary, within
    /// the last 256 bytes), that overlap is dropped.
    Instruction,
}

/// The default instruction of [`ContinuationStyle::Instruction`].
///
/// Every follow-up pays for it as input, on top of the prompt again and the text so far, so
/// it says only what a model needs (where to start, no repeats, no preamble) in about 24
/// tokens as seawall estimates a prompt (characters / 4, plus 4 per text part): 30 for the
/// wording before it, about 60 for a first one that said the same at length. With output
/// priced at four times input, resuming costs less than giving the call up once the broken
/// stream had sent about 16 tokens (the two turns a follow-up adds, roles included, come to
/// about 40 tokens beside the text so far); each token of instruction moves that point later.
/// A stream that breaks earlier is still resumed: the caller has its first words.
pub const DEFAULT_INSTRUCTION: &str =
    "Continue exactly where you stopped, even mid-word. No repetition, no commentary.";

/// The default bound on follow-up requests per call.
pub const DEFAULT_MAX_CONTINUATIONS: u32 = 3;

/// The settings every service of one layer shares.
#[derive(Debug)]
pub(crate) struct Config {
    pub(crate) max_continuations: u32,
    pub(crate) on_length: bool,
    pub(crate) resume: bool,
    pub(crate) restart_within: u32,
    pub(crate) openai_style: ContinuationStyle,
    pub(crate) instruction: Arc<str>,
    pub(crate) max_text_bytes: usize,
    pub(crate) max_body_bytes: usize,
}

impl Config {
    /// Whether any call may be followed up: if not, the services keep no spare.
    pub(crate) fn continues(&self) -> bool {
        self.max_continuations > 0 && (self.on_length || self.resume)
    }
}

/// Applies [`Continue`]: an answer cut by `max_tokens` is continued, and a stream cut after
/// its first token is resumed, by follow-up requests that carry the partial answer as the
/// assistant's last turn, so the caller gets one answer.
///
/// ```
/// use seawall_continue::{ContinuationStyle, ContinueLayer};
///
/// let layer = ContinueLayer::builder()
///     .max_continuations(2)
///     .openai_style(ContinuationStyle::ContinueFinalMessage) // a vLLM upstream
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), seawall_core::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct ContinueLayer {
    config: Arc<Config>,
}

impl ContinueLayer {
    /// A layer with the defaults: up to [`DEFAULT_MAX_CONTINUATIONS`] follow-ups per call,
    /// continuation on `length` and resumption of cut streams both on, the
    /// [`Instruction`](ContinuationStyle::Instruction) style on the OpenAI wire.
    pub fn new() -> Self {
        ContinueBuilder::default()
            .build()
            .expect("the defaults are valid")
    }

    /// A builder starting from the defaults of [`ContinueLayer::new`].
    pub fn builder() -> ContinueBuilder {
        ContinueBuilder::default()
    }

    pub(crate) fn config(&self) -> &Arc<Config> {
        &self.config
    }
}

impl Default for ContinueLayer {
    fn default() -> Self {
        ContinueLayer::new()
    }
}

/// Wrapping a service clones it once, for the follow-ups' [spare](seawall_core::Spare).
impl<S: Clone> Layer<S> for ContinueLayer {
    type Service = Continue<S>;

    fn layer(&self, inner: S) -> Continue<S> {
        Continue::from_config(inner, self.config.clone())
    }
}

/// The settings as one thread's services and calls share them.
///
/// Every call that may be continued keeps the settings until its answer ends. Cloned from the
/// layer's one `Arc` for each call, that would write its count, a cache line every thread
/// calling through the layer writes, twice per call; the services of one thread share a
/// handle of their own instead, made once per thread (see `seawall_core::ThreadBound`).
pub(crate) type LocalConfig = Arc<seawall_core::ThreadBound<Config>>;

/// Settings of a [`ContinueLayer`]; [`build`](Self::build) checks them.
#[derive(Debug, Clone)]
pub struct ContinueBuilder {
    max_continuations: u32,
    on_length: bool,
    resume: bool,
    restart_within: u32,
    openai_style: ContinuationStyle,
    instruction: Arc<str>,
    max_text_bytes: usize,
    max_body_bytes: usize,
}

impl Default for ContinueBuilder {
    fn default() -> Self {
        ContinueBuilder {
            max_continuations: DEFAULT_MAX_CONTINUATIONS,
            on_length: true,
            resume: true,
            restart_within: 0,
            openai_style: ContinuationStyle::Instruction,
            instruction: Arc::from(DEFAULT_INSTRUCTION),
            max_text_bytes: 1 << 20,
            max_body_bytes: 8 << 20,
        }
    }
}

impl ContinueBuilder {
    /// The most follow-up requests one call makes, continuations and resumptions together
    /// (default [`DEFAULT_MAX_CONTINUATIONS`]; 0 turns the layer off).
    pub fn max_continuations(mut self, n: u32) -> Self {
        self.max_continuations = n;
        self
    }

    /// Whether an answer that finished with `length` (`max_tokens`) is continued (default
    /// on).
    pub fn on_length(mut self, yes: bool) -> Self {
        self.on_length = yes;
        self
    }

    /// Whether a stream cut after its first token (a `StreamInterrupted` body error) is
    /// resumed (default on). Off, the caller gets the error, as without the layer.
    pub fn resume(mut self, yes: bool) -> Self {
        self.resume = yes;
        self
    }

    /// Holds a stream's first `tokens` tokens of text back from the caller (default 0: none),
    /// so that a stream cut before they all came is **asked again from the start** rather
    /// than resumed: nothing of it reached the caller, so nothing can be duplicated.
    ///
    /// Why: a resumption pays for a follow-up's prompt, which carries the prompt again, the
    /// text so far and the turns that ask to go on (about 40 tokens with the default
    /// [`Instruction`](ContinuationStyle::Instruction) style, fewer with a prefill); a restart
    /// pays for the cut attempt's text again, as output. With output priced `r` times input,
    /// a restart is the cheaper for a stream cut within about `40 / (r - 1)` tokens: 13 at
    /// `r` = 4. What it costs: the caller's first token comes when the stream has sent
    /// `tokens` tokens (or finished), not at its first, about `tokens` times the model's time
    /// per token later. Set it where spend matters more than the time to the first token.
    ///
    /// Tokens are estimated from the text's bytes (4 a token, as seawall estimates a prompt).
    /// The stream is let through at once when its answer is one the layer cannot continue (a
    /// tool call, a thinking block), and after 64 KiB held whatever it holds. Restarts count
    /// against [`max_continuations`](Self::max_continuations) with the follow-ups, and in
    /// the call record's `restarts`; they need [`resume`](Self::resume) on. The report of the
    /// answer (usage, in the call record) counts every attempt; the caller's stream is the
    /// restarted attempt's, its usage that attempt's own. The record's time to the first
    /// token stays the upstream's (from the final attempt's start), the time held not in it.
    pub fn restart_within(mut self, tokens: u32) -> Self {
        self.restart_within = tokens;
        self
    }

    /// How requests on the OpenAI wire ask to go on (default
    /// [`Instruction`](ContinuationStyle::Instruction)). Requests to the Anthropic Messages
    /// API always use [`Prefill`](ContinuationStyle::Prefill).
    pub fn openai_style(mut self, style: ContinuationStyle) -> Self {
        self.openai_style = style;
        self
    }

    /// The user turn of the [`Instruction`](ContinuationStyle::Instruction) style (default
    /// [`DEFAULT_INSTRUCTION`]).
    pub fn instruction(mut self, text: impl Into<Arc<str>>) -> Self {
        self.instruction = text.into();
        self
    }

    /// The longest partial answer, in bytes of text, that is continued (default 1 MiB): the
    /// layer keeps the text delivered so far to send it back, and a longer one is not kept.
    pub fn max_text_bytes(mut self, n: usize) -> Self {
        self.max_text_bytes = n;
        self
    }

    /// The largest non-streamed answer read to look for a `length` finish (default 8 MiB);
    /// a larger one is passed through as it is.
    pub fn max_body_bytes(mut self, n: usize) -> Self {
        self.max_body_bytes = n;
        self
    }

    /// Checks the settings and builds the layer.
    pub fn build(self) -> Result<ContinueLayer, ConfigError> {
        if self.instruction.trim().is_empty() {
            return Err(ConfigError::new("instruction", "must not be empty"));
        }
        if self.max_text_bytes == 0 {
            return Err(ConfigError::new("max_text_bytes", "must be at least 1"));
        }
        if self.max_body_bytes == 0 {
            return Err(ConfigError::new("max_body_bytes", "must be at least 1"));
        }
        Ok(ContinueLayer {
            config: Arc::new(Config {
                max_continuations: self.max_continuations,
                on_length: self.on_length,
                resume: self.resume,
                restart_within: self.restart_within,
                openai_style: self.openai_style,
                instruction: self.instruction,
                max_text_bytes: self.max_text_bytes,
                max_body_bytes: self.max_body_bytes,
            }),
        })
    }
}
