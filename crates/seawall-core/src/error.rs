//! [`LlmError`]: the one error every seawall layer speaks.
//!
//! A layer decides from the error's [`FailureClass`]; the rest (status, the provider's code and
//! type, the server's retry hint, the rate-limit snapshot, the request id, the attempt history)
//! is there for the next layer and for the human reading the log. The error is boxed, so a
//! `Result<Response, LlmError>` stays one pointer wide on the success path.
//!
//! Credentials never reach `Display`, `Debug` or the `source()` chain: messages are
//! length-bounded and passed through [`redact`] when the error is built, and `source()` hands
//! reporters (`{:#}` chains, tracing's error fields) a redacted copy of the underlying errors,
//! while [`LlmError::source_ref`] keeps the originals for downcasting.
//!
//! [`redact`] is a `regex`, not a hand-written scanner. Credentials come in many shapes
//! (`Authorization: Bearer ...`, `"x-api-key": "..."`, `?key=AIza...`, `user:pass@host`,
//! provider key prefixes, JWTs), and a list of patterns states each of them in one line where
//! a scanner grows a branch, and an edge case, per shape. The `regex` crate also guarantees
//! what a scanner has to be proven to do: matching in time linear in the input (it has no
//! backtracking), and no panic on any input. The patterns are compiled once per process, three
//! ways: all as one pattern, which tells in one pass whether a text holds a credential at all
//! (the common case: no); as a set, which tells which shapes it holds; and each on its own,
//! which finds where. Searching the shapes one by one, rather than the one pattern for matches,
//! is what finds a key inside or just after another shape's match (one search finds matches
//! that do not overlap), and what keeps the time linear: the one pattern's rival partial
//! matches can outlive many short matches, each search scanning on to where they end (a 64 KiB
//! error body of glued tokens took 0.2 s that way).

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use http::StatusCode;
use regex::{Regex, RegexSet};

use crate::circuit::Circuit;
use crate::class::FailureClass;
use crate::ratelimit::RateLimitSnapshot;

/// A type-erased error, as tower uses.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// The longest message an [`LlmError`] keeps, in bytes. Longer ones are cut at a character
/// boundary and end with `…`.
pub const MAX_MESSAGE_LEN: usize = 1024;

/// One failed attempt in the history carried by the final error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    /// The attempt's class.
    pub class: FailureClass,
    /// The HTTP status, if a response head arrived.
    pub status: Option<StatusCode>,
    /// How long the attempt took.
    pub elapsed: Duration,
    /// How long the retry layer waited after it (zero for the last attempt).
    pub delay: Duration,
}

/// Why the retry layer stopped retrying, recorded on the final error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GiveUp {
    /// The class (or `x-should-retry: false`) forbids a retry.
    NotRetryable,
    /// The per-class or global attempt cap was reached.
    AttemptsExhausted,
    /// The shared retry budget was spent.
    RetryBudget,
    /// The server asked for a longer wait than the configured cap.
    HintTooLong,
    /// The next wait would cross the caller's total time budget.
    DeadlineTooClose,
    /// Retries were switched off at run time.
    Disabled,
    /// A fallback stands by for the request ([`Standby`](crate::Standby)) and the next wait
    /// was longer than the retry layer's standby wait: the fallback answers sooner.
    Standby,
}

impl GiveUp {
    /// A stable snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            GiveUp::NotRetryable => "not_retryable",
            GiveUp::AttemptsExhausted => "attempts_exhausted",
            GiveUp::RetryBudget => "retry_budget",
            GiveUp::HintTooLong => "hint_too_long",
            GiveUp::DeadlineTooClose => "deadline_too_close",
            GiveUp::Disabled => "disabled",
            GiveUp::Standby => "standby",
        }
    }
}

/// The error of every seawall layer.
///
/// ```
/// use std::time::Duration;
/// use seawall_core::{FailureClass, LlmError};
///
/// let err = LlmError::new(FailureClass::RateLimited, "Rate limit reached for requests")
///     .with_status(http::StatusCode::TOO_MANY_REQUESTS)
///     .with_code("rate_limit_exceeded")
///     .with_retry_after(Duration::from_millis(1200));
/// assert_eq!(err.class(), FailureClass::RateLimited);
/// assert_eq!(err.retry_after(), Some(Duration::from_millis(1200)));
/// assert!(err.to_string().starts_with("rate_limited"));
/// ```
pub struct LlmError {
    inner: Box<Inner>,
}

struct Inner {
    class: FailureClass,
    status: Option<StatusCode>,
    code: Option<Box<str>>,
    error_type: Option<Box<str>>,
    message: Box<str>,
    retry_after: Option<Duration>,
    should_retry: Option<bool>,
    rate_limit: Option<RateLimitSnapshot>,
    request_id: Option<Box<str>>,
    attempts: Vec<Attempt>,
    give_up: Option<GiveUp>,
    source: Option<BoxError>,
    /// The source chain as `source()` shows it, redacted; built on first use.
    shown_source: OnceLock<RedactedSource>,
    /// The breaker the failed attempt went through (see [`crate::circuit`]).
    circuit: Option<Arc<dyn Circuit>>,
}

fn bounded(s: &str) -> Box<str> {
    let redacted = redact(s);
    if redacted.len() <= MAX_MESSAGE_LEN {
        return redacted.into();
    }
    let mut end = MAX_MESSAGE_LEN - '…'.len_utf8();
    while !redacted.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + 3);
    out.push_str(&redacted[..end]);
    out.push('…');
    out.into()
}

/// An identifier from the upstream (an error's code or type, a request id) as a record or an
/// error may show it: credentials [redacted](redact), at most 128 bytes (identifiers are
/// short; a long one is noise or an attack), cut at a character boundary.
///
/// ```
/// assert_eq!(&*seawall_core::shown_id("req_abc"), "req_abc");
/// assert!(!seawall_core::shown_id("req_sk-proj-0123456789abcdefghijklmn").contains("0123456789"));
/// assert_eq!(seawall_core::shown_id(&"x".repeat(500)).len(), 128);
/// ```
pub fn shown_id(s: &str) -> Box<str> {
    const MAX: usize = 128;
    let s = redact(s);
    let mut end = s.len().min(MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].into()
}

impl LlmError {
    /// A new error of `class` with a message (redacted and bounded to [`MAX_MESSAGE_LEN`]).
    pub fn new(class: FailureClass, message: impl AsRef<str>) -> Self {
        LlmError {
            inner: Box::new(Inner {
                class,
                status: None,
                code: None,
                error_type: None,
                message: bounded(message.as_ref()),
                retry_after: None,
                should_retry: None,
                rate_limit: None,
                request_id: None,
                attempts: Vec::new(),
                give_up: None,
                source: None,
                shown_source: OnceLock::new(),
                circuit: None,
            }),
        }
    }

    /// A new error with a fixed message, for a layer's own rejections on a hot path (a circuit
    /// breaker refusing calls, say). A `'static` message is the program's own text and holds no
    /// credential, so it skips the redaction scan of [`new`](Self::new); it is still bounded.
    pub fn from_static(class: FailureClass, message: &'static str) -> Self {
        let mut err = LlmError::new(class, "");
        err.inner.message = if message.len() <= MAX_MESSAGE_LEN {
            message.into()
        } else {
            bounded(message)
        };
        err
    }

    /// Sets the HTTP status.
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.inner.status = Some(status);
        self
    }

    /// Sets the provider's error code (`insufficient_quota`, `context_length_exceeded`, ...).
    pub fn with_code(mut self, code: impl AsRef<str>) -> Self {
        self.inner.code = Some(shown_id(code.as_ref()));
        self
    }

    /// Sets the provider's error type (`rate_limit_error`, `overloaded_error`, ...).
    pub fn with_error_type(mut self, error_type: impl AsRef<str>) -> Self {
        self.inner.error_type = Some(shown_id(error_type.as_ref()));
        self
    }

    /// Sets the server's requested delay before a retry.
    pub fn with_retry_after(mut self, delay: Duration) -> Self {
        self.inner.retry_after = Some(delay);
        self
    }

    /// Records the server's `x-should-retry` directive.
    pub fn with_should_retry(mut self, should_retry: bool) -> Self {
        self.inner.should_retry = Some(should_retry);
        self
    }

    /// Attaches the rate-limit snapshot of the response.
    pub fn with_rate_limit(mut self, snapshot: RateLimitSnapshot) -> Self {
        self.inner.rate_limit = Some(snapshot);
        self
    }

    /// Sets the upstream request id.
    pub fn with_request_id(mut self, id: impl AsRef<str>) -> Self {
        self.inner.request_id = Some(shown_id(id.as_ref()));
        self
    }

    /// Keeps the underlying error (a transport error, say) as the source.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.inner.source = Some(source.into());
        self.inner.shown_source = OnceLock::new();
        self
    }

    /// Replaces the class, keeping everything else.
    pub fn with_class(mut self, class: FailureClass) -> Self {
        self.inner.class = class;
        self
    }

    /// A copy of this error with another class and message: status, codes, hints, request id,
    /// attempt history and give-up reason are kept; the source is not (it cannot be cloned),
    /// so a caller that wraps this error sets its own with [`with_source`](Self::with_source).
    ///
    /// Every field is named here, so a field added to the error later is either copied or
    /// deliberately left out, never dropped by accident in the layers that rebuild errors.
    ///
    /// ```
    /// # use seawall_core::{FailureClass, LlmError};
    /// let inner = LlmError::new(FailureClass::Overloaded, "busy").with_request_id("req_1");
    /// let outer = inner.clone_with(FailureClass::ServerError, "every model failed");
    /// assert_eq!(outer.class(), FailureClass::ServerError);
    /// assert_eq!(outer.request_id(), Some("req_1"));
    /// ```
    pub fn clone_with(&self, class: FailureClass, message: impl AsRef<str>) -> LlmError {
        let Inner {
            class: _,
            status,
            code,
            error_type,
            message: _,
            retry_after,
            should_retry,
            rate_limit,
            request_id,
            attempts,
            give_up,
            source: _,
            shown_source: _,
            // The breaker of one attempt is for the retry of that attempt only.
            circuit: _,
        } = &*self.inner;
        let mut copy = LlmError::new(class, message);
        let inner = &mut *copy.inner;
        inner.status = *status;
        inner.code.clone_from(code);
        inner.error_type.clone_from(error_type);
        inner.retry_after = *retry_after;
        inner.should_retry = *should_retry;
        inner.rate_limit.clone_from(rate_limit);
        inner.request_id.clone_from(request_id);
        inner.attempts.clone_from(attempts);
        inner.give_up = *give_up;
        copy
    }

    /// The failure class.
    pub fn class(&self) -> FailureClass {
        self.inner.class
    }

    /// The HTTP status, if a response head arrived.
    pub fn status(&self) -> Option<StatusCode> {
        self.inner.status
    }

    /// The provider's error code.
    pub fn code(&self) -> Option<&str> {
        self.inner.code.as_deref()
    }

    /// The provider's error type.
    pub fn error_type(&self) -> Option<&str> {
        self.inner.error_type.as_deref()
    }

    /// The message, redacted and bounded.
    pub fn message(&self) -> &str {
        &self.inner.message
    }

    /// The server's requested delay before a retry (`retry-after-ms`, `retry-after`, "try again
    /// in 1.2s", ...), if it gave one.
    pub fn retry_after(&self) -> Option<Duration> {
        self.inner.retry_after
    }

    /// The best wait the server told us about: its explicit retry hint, else the reset of an
    /// exhausted rate-limit window.
    pub fn retry_hint(&self) -> Option<Duration> {
        self.inner
            .retry_after
            .or_else(|| self.inner.rate_limit.as_ref()?.exhausted_until())
    }

    /// The server's `x-should-retry` directive, which beats the class default either way.
    pub fn should_retry(&self) -> Option<bool> {
        self.inner.should_retry
    }

    /// The rate-limit snapshot of the response, if it had one.
    pub fn rate_limit(&self) -> Option<&RateLimitSnapshot> {
        self.inner.rate_limit.as_ref()
    }

    /// The upstream request id.
    pub fn request_id(&self) -> Option<&str> {
        self.inner.request_id.as_deref()
    }

    /// The earlier attempts of the logical call, oldest first (filled by the retry layer).
    pub fn attempts(&self) -> &[Attempt] {
        &self.inner.attempts
    }

    /// Appends to the attempt history.
    pub fn push_attempt(&mut self, attempt: Attempt) {
        self.inner.attempts.push(attempt);
    }

    /// Replaces the attempt history.
    pub fn set_attempts(&mut self, attempts: Vec<Attempt>) {
        self.inner.attempts = attempts;
    }

    /// Why the retry layer stopped, if it saw this error.
    pub fn give_up(&self) -> Option<GiveUp> {
        self.inner.give_up
    }

    /// Records why the retry layer stopped.
    pub fn set_give_up(&mut self, reason: GiveUp) {
        self.inner.give_up = Some(reason);
    }

    /// Attaches the circuit breaker the failed attempt went through, for a retry layer outside
    /// that would wait before sending the call back through it (see [`Circuit`]). Not shown
    /// by `Debug` or `Display`, and not kept by [`clone_with`](Self::clone_with).
    pub fn set_circuit(&mut self, circuit: Arc<dyn Circuit>) {
        self.inner.circuit = Some(circuit);
    }

    /// Takes out the circuit breaker attached with [`set_circuit`](Self::set_circuit).
    pub fn take_circuit(&mut self) -> Option<Arc<dyn Circuit>> {
        self.inner.circuit.take()
    }

    /// The underlying error itself, for downcasting. Its own text is not redacted: print
    /// this error, or walk its [`source`](StdError::source) chain, which is the redacted
    /// view of the same errors.
    pub fn source_ref(&self) -> Option<&(dyn StdError + Send + Sync + 'static)> {
        self.inner.source.as_deref()
    }

    /// Turns any boxed error into an `LlmError`: an `LlmError` inside is unwrapped; anything
    /// else becomes `Disconnected` (an unknown transport failure may have reached the
    /// upstream, so it is retried only when the request is idempotent). Use a classifier
    /// from `seawall-classify` for a finer answer.
    pub fn from_boxed(err: BoxError) -> Self {
        match err.downcast::<LlmError>() {
            Ok(e) => *e,
            Err(other) => {
                let text = other.to_string();
                LlmError::new(FailureClass::Disconnected, text).with_source(other)
            }
        }
    }
}

impl From<BoxError> for LlmError {
    fn from(err: BoxError) -> Self {
        LlmError::from_boxed(err)
    }
}

impl From<std::convert::Infallible> for LlmError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

impl fmt::Display for LlmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.write_str(i.class.as_str())?;
        match (i.status, i.code.as_deref().or(i.error_type.as_deref())) {
            (Some(s), Some(c)) => write!(f, " (HTTP {}, {c})", s.as_u16())?,
            (Some(s), None) => write!(f, " (HTTP {})", s.as_u16())?,
            (None, Some(c)) => write!(f, " ({c})")?,
            (None, None) => {}
        }
        if !i.message.is_empty() {
            write!(f, ": {}", i.message)?;
        }
        if let Some(d) = i.retry_after {
            write!(f, "; retry after {d:?}")?;
        }
        if !i.attempts.is_empty() {
            write!(f, "; after {} attempts", i.attempts.len() + 1)?;
        }
        Ok(())
    }
}

/// How many errors of a source chain are shown; a longer chain is cut (and a cyclic one
/// ends).
const MAX_CHAIN: usize = 16;

/// A source chain as the world sees it: each error's `Display` text, redacted and bounded
/// like a message, with `source()` leading to the next one.
///
/// `source()` hands out a reference, so the redacted chain must live somewhere: it is built
/// once, when first asked for, and kept next to the original (which stays available to
/// [`LlmError::source_ref`] for downcasting).
struct RedactedSource {
    text: Box<str>,
    next: Option<Box<RedactedSource>>,
}

impl RedactedSource {
    /// The redacted chain from `error` on, `depth` links already shown before it.
    fn of(error: &(dyn StdError + 'static), depth: usize) -> Self {
        RedactedSource {
            text: bounded(&error.to_string()),
            next: error
                .source()
                .filter(|_| depth + 1 < MAX_CHAIN)
                .map(|next| Box::new(RedactedSource::of(next, depth + 1))),
        }
    }

    fn links(&self) -> impl Iterator<Item = &RedactedSource> {
        std::iter::successors(Some(self), |s| s.next.as_deref())
    }
}

impl fmt::Display for RedactedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for RedactedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.links().map(|s| &s.text))
            .finish()
    }
}

impl StdError for RedactedSource {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.next.as_deref().map(|s| s as &(dyn StdError + 'static))
    }
}

impl LlmError {
    fn shown_source(&self) -> Option<&RedactedSource> {
        let source = self.inner.source.as_deref()?;
        Some(
            self.inner
                .shown_source
                .get_or_init(|| RedactedSource::of(source, 0)),
        )
    }
}

impl fmt::Debug for LlmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        let mut d = f.debug_struct("LlmError");
        d.field("class", &i.class)
            .field("status", &i.status.map(|s| s.as_u16()))
            .field("code", &i.code)
            .field("error_type", &i.error_type)
            .field("message", &i.message)
            .field("retry_after", &i.retry_after)
            .field("should_retry", &i.should_retry)
            .field("rate_limit", &i.rate_limit)
            .field("request_id", &i.request_id);
        if !i.attempts.is_empty() {
            d.field("attempts", &i.attempts);
        }
        if let Some(g) = i.give_up {
            d.field("give_up", &g);
        }
        if let Some(s) = self.shown_source() {
            d.field("source", s);
        }
        d.finish()
    }
}

/// The source is the redacted view of the underlying error and its own sources, so error
/// reporters that walk the chain (`anyhow`'s `{:#}`, tracing's error fields) print no
/// credential. [`LlmError::source_ref`] gives the underlying error for downcasting.
impl StdError for LlmError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.shown_source().map(|s| s as &(dyn StdError + 'static))
    }
}

/// What a credential is replaced with.
const REDACTED: &str = "[REDACTED]";

/// A character of a credential value: anything but whitespace, a quote, a backslash (an
/// escaped quote) or a delimiter of queries, lists, JSON and markup.
const VALUE_CHAR: &str = r#"[^\s"'\\&,;<>()\[\]{}]"#;

/// The shapes of credentials. Each has exactly one capture group: the secret itself, so the
/// words around it (`Authorization: Bearer`, `?key=`) stay readable.
fn secret_shapes() -> Vec<String> {
    [
        // `name: value`, `name=value`, `"name": "value"` in headers, queries, JSON and env
        // assignments, with auth schemes before the value (none, one, or one twice). The name
        // is one of the words below, alone or as the last part of a `-`/`_` compound
        // (`x-api-key`, `OPENAI_API_KEY`, `client_secret`, `access_token`), so `monkey=` or
        // `max_tokens:` do not match.
        &*format!(
            r#"(?i)(?-u:\b)(?:[a-z0-9]+[-_])*(?:apikey|key|secret|password|passwd|token|authorization|auth|sig|signature|credentials?)\\?["']?\s*[:=]\s*\\?["']?\s*(?:(?:bearer|basic|token|digest)\s+)*({VALUE_CHAR}+)"#
        ),
        // A bare bearer token, and a Basic credential (base64, written `Basic` as the scheme).
        // A scheme written twice (`Bearer Bearer sk-...`, a common client mistake that error
        // messages echo) is still a scheme, not the value.
        &*format!(r"(?i:(?-u:\b)bearer(?:\s+bearer)*)\s+({VALUE_CHAR}+)"),
        r"(?-u:\b)Basic\s+([A-Za-z0-9+/]{8,}={0,2})",
        // The user and password of a URL: `https://user:pass@host`, whatever comes before
        // the `://` (glued to the text before it, `0https://...`, or taken into an earlier
        // match, the scheme is no longer a word).
        r"://([^\s/?#@]+)@",
        // Keys recognisable by their shape wherever they appear: OpenAI and Anthropic
        // (`sk-`, `sk-proj-`, `sk-ant-api03-`), Groq, xAI, Hugging Face, GitHub, Perplexity
        // (`pplx-`), Fireworks (`fw_`), Cerebras (`csk-`), NVIDIA (`nvapi-`), Replicate
        // (`r8_`), the `sk_` keys of other APIs, Google (`AIza`), AWS access key ids, and JWTs
        // (`eyJ...`, as bearer tokens often are). A short prefix counts only at the start of
        // a word (`task-list`, `ask-me`, `laughs_` are words). Glued to the text before it,
        // as a truncated or concatenated message leaves a key (`...messsk-proj-...`), `sk-`
        // counts when a random-looking run follows (16 characters without a hyphen, after at
        // most three short segments such as `proj-` or `ant-api03-`; hyphenated words such
        // as `desk-size-...` have no such run), and a prefix no word contains (`gsk_`,
        // `pplx-`) counts as it is.
        &*format!(r"(?-u:\b)(?i:sk-)({VALUE_CHAR}{{6,}})"),
        r"(?i:sk-)((?:[A-Za-z0-9_]*-){0,3}[A-Za-z0-9_]{16,}[A-Za-z0-9_-]*)",
        r"((?:gsk_|xai-|github_pat_)[A-Za-z0-9_]{16,})",
        r"(?-u:\b)((?:hf_|gh[pousr]_)[A-Za-z0-9_]{16,})",
        r"((?:pplx-|nvapi-)[A-Za-z0-9_-]{16,})",
        r"(?-u:\b)((?:fw_|csk-|r8_|sk_)[A-Za-z0-9_-]{16,})",
        r"(AIza[0-9A-Za-z_-]{20,})",
        r"(?-u:\b)(AKIA[0-9A-Z]{16})",
        r"(eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*)",
    ]
    .map(String::from)
    .into()
}

/// All the shapes as one pattern: whether a text holds any credential, in the one pass the
/// common case (none) pays for.
fn any_secret() -> &'static Regex {
    static ANY: LazyLock<Regex> = LazyLock::new(|| {
        // The patterns are constants of this crate: `secret_patterns_compile` checks them.
        let one = secret_shapes()
            .iter()
            // A group per shape keeps its flags (`(?i)`) to itself.
            .map(|shape| format!("(?:{shape})"))
            .collect::<Vec<_>>()
            .join("|");
        Regex::new(&one).unwrap_or_else(|e| unreachable!("secret pattern: {e}"))
    });
    &ANY
}

/// All the shapes as a set: which of them a text holds, in one pass.
fn shape_set() -> &'static RegexSet {
    static SET: LazyLock<RegexSet> = LazyLock::new(|| {
        RegexSet::new(secret_shapes()).unwrap_or_else(|e| unreachable!("secret pattern: {e}"))
    });
    &SET
}

/// Each shape on its own: where each finds its secrets.
fn each_shape() -> &'static [Regex] {
    static EACH: LazyLock<Vec<Regex>> = LazyLock::new(|| {
        secret_shapes()
            .iter()
            .map(|shape| Regex::new(shape).unwrap_or_else(|e| unreachable!("secret pattern: {e}")))
            .collect()
    });
    &EACH
}

/// Replaces credentials in `text` with `[REDACTED]`: API keys of the usual shapes (`sk-...`,
/// `AIza...`, JWTs, ...), bearer and Basic credentials, the values of `api-key`, `key`,
/// `token`, `secret`, `password` and `authorization` in headers, query strings and JSON, and
/// the user and password of URLs. A key is found glued to the text before it, with what is
/// glued after it (`.part`, `-part`), and inside the name of a `name: value` pair.
///
/// It runs in time linear in the length of `text` and never panics. Text without a
/// credential is returned borrowed.
///
/// ```
/// use seawall_core::redact;
/// let s = redact("Incorrect API key provided: sk-proj-abcdef123456. See https://x/?api-key=s3cr3t&v=1");
/// assert!(!s.contains("abcdef123456") && !s.contains("s3cr3t"));
/// assert!(s.contains("v=1"));
/// let s = redact(r#"{"headers": {"Authorization": "Bearer eyJhbGciOi.eyJzdWIiOi.c2ln"}}"#);
/// assert_eq!(s, r#"{"headers": {"Authorization": "Bearer [REDACTED]"}}"#);
/// ```
pub fn redact(text: &str) -> Cow<'_, str> {
    // The common case, no credential, takes the fast matcher and allocates nothing.
    if !any_secret().is_match(text) {
        return Cow::Borrowed(text);
    }
    // Each shape the text holds is searched on its own, and what they find is hidden
    // together (the module docs say why).
    let shapes = each_shape();
    let mut spans: Vec<(usize, usize)> = shape_set()
        .matches(text)
        .iter()
        .flat_map(|i| shapes[i].captures_iter(text))
        .filter_map(|caps| caps.get(1).map(|m| (m.start(), m.end())))
        .collect();
    if spans.is_empty() {
        return Cow::Borrowed(text);
    }
    spans.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (start, end) in spans {
        // A span inside what is already hidden is part of it (and each byte is looked at by
        // `glued_tail` once).
        if end <= last {
            continue;
        }
        if start >= last {
            out.push_str(&text[last..start]);
            out.push_str(REDACTED);
        }
        last = glued_tail(text, end);
    }
    out.push_str(&text[last..]);
    Cow::Owned(out)
}

/// Where a secret ending at `end` really ends: past the `.part`s and `-part`s glued to it.
/// Each shape has its own alphabet and stops at the first character outside it, while what
/// is dotted or hyphenated straight onto a key (`AIza....part`, a JWT's `.payload.signature`
/// after a shape that took its first part) may be more of a credential, of a shape no pattern
/// knows. It goes with the key (a word hyphenated to a key too: more is hidden, never less).
fn glued_tail(text: &str, mut end: usize) -> usize {
    let b = text.as_bytes();
    while let Some(b'.' | b'-') = b.get(end) {
        let run = b[end + 1..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-'))
            .count();
        if run == 0 {
            break;
        }
        end += 1 + run;
    }
    end
}

/// A shared name (a model the upstream named, a budget key) with its credentials
/// [redacted](redact): the same `Arc` when it holds none.
///
/// A record is made on every call, and the names in it are the same few, each one `Arc` per
/// thread (see [`shared_name`](crate::shared_name)), so the last name found clean is
/// remembered by pointer and the check is a comparison on the call path.
///
/// ```
/// use std::sync::Arc;
/// let name: Arc<str> = Arc::from("gpt-4o-2024-08-06");
/// assert!(Arc::ptr_eq(&seawall_core::redact_shared(name.clone()), &name));
/// let odd: Arc<str> = Arc::from("gpt-4o?key=AIzaSyNameSecret0123456789abcdefgh");
/// assert!(!seawall_core::redact_shared(odd).contains("NameSecret"));
/// ```
pub fn redact_shared(name: Arc<str>) -> Arc<str> {
    thread_local! {
        static LAST_CLEAN: std::cell::RefCell<Option<Arc<str>>> = const { std::cell::RefCell::new(None) };
    }
    let known = LAST_CLEAN
        .try_with(|last| {
            last.borrow()
                .as_ref()
                .is_some_and(|l| Arc::ptr_eq(l, &name))
        })
        .unwrap_or(false);
    if known {
        return name;
    }
    match redact(&name) {
        Cow::Owned(clean) => clean.into(),
        Cow::Borrowed(_) => {
            let _ = LAST_CLEAN.try_with(|last| *last.borrow_mut() = Some(name.clone()));
            name
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A breaker that never refuses.
    struct NeverOpens;

    impl Circuit for NeverOpens {
        fn refusal_at(self: Arc<Self>, _at: tokio::time::Instant) -> crate::circuit::Refusal {
            Box::pin(std::future::pending())
        }
    }

    #[test]
    fn a_circuit_is_taken_out_once_and_never_shown() {
        let mut err = LlmError::new(FailureClass::Overloaded, "busy");
        err.set_circuit(Arc::new(NeverOpens));
        assert!(!format!("{err:?}").contains("circuit"));
        assert!(err.take_circuit().is_some());
        assert!(err.take_circuit().is_none());
    }

    #[test]
    fn message_is_bounded_at_a_char_boundary() {
        let long = "é".repeat(5000);
        let e = LlmError::new(FailureClass::ServerError, &long);
        assert!(e.message().len() <= MAX_MESSAGE_LEN);
        assert!(e.message().ends_with('…'));
    }

    #[test]
    fn clone_with_keeps_every_field_but_class_message_and_source() {
        let snapshot = RateLimitSnapshot {
            requests: crate::ratelimit::RateLimitWindow {
                limit: Some(60),
                remaining: Some(0),
                reset_after: Some(Duration::from_secs(7)),
            },
            ..RateLimitSnapshot::default()
        };
        let attempt = Attempt {
            class: FailureClass::Overloaded,
            status: Some(StatusCode::SERVICE_UNAVAILABLE),
            elapsed: Duration::from_millis(40),
            delay: Duration::from_millis(250),
        };
        let mut original = LlmError::new(FailureClass::Overloaded, "busy")
            .with_status(StatusCode::SERVICE_UNAVAILABLE)
            .with_code("overloaded")
            .with_error_type("overloaded_error")
            .with_retry_after(Duration::from_secs(3))
            .with_should_retry(true)
            .with_rate_limit(snapshot)
            .with_request_id("req_42")
            .with_source(std::io::Error::other("inner"));
        original.set_attempts(vec![attempt, attempt]);
        original.set_give_up(GiveUp::AttemptsExhausted);
        original.set_circuit(Arc::new(NeverOpens));

        let copy = original.clone_with(FailureClass::ServerError, "summary");
        // Named field by field, so a field added later must be added here too.
        let Inner {
            class,
            status,
            code,
            error_type,
            message,
            retry_after,
            should_retry,
            rate_limit,
            request_id,
            attempts,
            give_up,
            source,
            shown_source: _,
            circuit,
        } = &*copy.inner;
        assert_eq!(*class, FailureClass::ServerError);
        assert_eq!(&**message, "summary");
        assert_eq!(*status, original.status());
        assert_eq!(code.as_deref(), original.code());
        assert_eq!(error_type.as_deref(), original.error_type());
        assert_eq!(*retry_after, original.retry_after());
        assert_eq!(*should_retry, original.should_retry());
        assert_eq!(rate_limit.as_ref(), original.rate_limit());
        assert_eq!(request_id.as_deref(), original.request_id());
        assert_eq!(attempts.as_slice(), original.attempts());
        assert_eq!(*give_up, original.give_up());
        assert!(
            source.is_none(),
            "a source is not cloneable; the caller sets its own"
        );
        assert!(
            circuit.is_none(),
            "an attempt's breaker is for the retry of that attempt only"
        );
        // And every optional field above was set, so the comparisons were not `None == None`.
        assert!(status.is_some() && code.is_some() && error_type.is_some());
        assert!(retry_after.is_some() && should_retry.is_some() && rate_limit.is_some());
        assert!(request_id.is_some() && give_up.is_some() && attempts.len() == 2);
    }

    #[test]
    fn display_and_debug_never_show_credentials() {
        #[derive(Debug)]
        struct Transport;
        impl fmt::Display for Transport {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("GET https://h/v1?api-key=topsecret1 failed, Authorization: Bearer sk-ant-api03-zzzzzzzz")
            }
        }
        impl StdError for Transport {}
        let e = LlmError::new(
            FailureClass::Authentication,
            "Incorrect API key provided: sk-proj-0123456789abcdef",
        )
        .with_code("invalid_api_key x-api-key: hunter2hunter2")
        .with_source(Transport);
        let shown = format!("{e} {e:?} {e:#?}");
        assert_hidden(
            &shown,
            &[
                "0123456789abcdef",
                "topsecret1",
                "zzzzzzzz",
                "hunter2hunter2",
            ],
        );
        assert!(shown.contains("[REDACTED]"));
    }

    /// `shown` holds none of `secrets`.
    fn assert_hidden(shown: &str, secrets: &[&str]) {
        for secret in secrets {
            assert!(!shown.contains(secret), "{secret} shown in {shown}");
        }
    }

    #[test]
    fn a_token_glued_after_another_shape_is_redacted_whole() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiPayloadSecret0.c2lnbmF0dXJlSignatureSecret";
        for text in [
            format!("task-{jwt} more"),
            format!("see gsk_abcdefghijklmnopqrstu.{jwt}"),
            "x AIzaSyAbcdefghijklmnop0123456.PartTwoSecret.PartThreeSecret rest".to_owned(),
            "ghs_abcdefghijklmnop_xai-PartTwoSecret0123456789".to_owned(),
            "sk_______________https://user:PartTwoSecret@host/v1".to_owned(),
        ] {
            let out = redact(&text);
            assert_hidden(
                &out,
                &[
                    "PayloadSecret",
                    "SignatureSecret",
                    "PartTwoSecret",
                    "PartThreeSecret",
                ],
            );
            assert!(out.contains("[REDACTED]"), "{out}");
        }
        // A sentence after a key is not part of it.
        assert_eq!(
            redact("key AIzaSyAbcdefghijklmnop0123456. Next sentence."),
            "key [REDACTED]. Next sentence."
        );
    }

    #[test]
    fn a_key_inside_another_match_or_after_a_repeated_scheme_is_redacted() {
        for (text, hidden) in [
            // The name rule takes `x-api...-key` whole, the key in it included.
            (
                "x-apiAIzaSyNameSecret0123456789abcdefgh-key: value",
                &["NameSecret", "value"][..],
            ),
            (
                "my_sk-proj-NameSecret0123456789abcdef_token=value",
                &["NameSecret", "value"],
            ),
            // A scheme written twice (a common client mistake) is not the value.
            (
                "Authorization: Bearer Bearer TwiceSecret0123456789",
                &["TwiceSecret"],
            ),
            (
                "header was Bearer Bearer TwiceSecret0123456789 (check your client)",
                &["TwiceSecret"],
            ),
            (
                "authorization=bearer  BEARER TwiceSecret0123456789",
                &["TwiceSecret"],
            ),
        ] {
            assert_hidden(&redact(text), hidden);
        }
    }

    #[test]
    fn redact_leaves_ordinary_text_alone() {
        for s in [
            "Rate limit reached. Please try again in 1.2s",
            "monkey=banana; task-list",
            "ask-me anything",
            "the task_queue_worker_pool setting, a desk-size-dependent-layout-engine flag",
            r#"{"max_tokens": 4096, "model": "gpt-4o"}"#,
            "authentication (HTTP 401, invalid_api_key)",
            "This model's maximum context length is 8192 tokens",
            "Read more at https://platform.openai.com/docs/guides/error-codes",
            "The Basic plan does not include this model",
        ] {
            assert!(matches!(redact(s), Cow::Borrowed(_)), "{s}");
        }
    }

    #[test]
    fn retry_hint_falls_back_to_rate_limit_reset() {
        let mut snap = RateLimitSnapshot::default();
        snap.tokens.remaining = Some(0);
        snap.tokens.reset_after = Some(Duration::from_secs(4));
        let e = LlmError::new(FailureClass::RateLimited, "").with_rate_limit(snap);
        assert_eq!(e.retry_hint(), Some(Duration::from_secs(4)));
        let e = e.with_retry_after(Duration::from_secs(1));
        assert_eq!(e.retry_hint(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn boxed_llm_error_round_trips() {
        let boxed: BoxError = Box::new(LlmError::new(FailureClass::Overloaded, "busy"));
        assert_eq!(LlmError::from(boxed).class(), FailureClass::Overloaded);
        let other: BoxError = "weird".into();
        assert_eq!(LlmError::from(other).class(), FailureClass::Disconnected);
    }

    #[test]
    fn from_static_keeps_the_message() {
        let e = LlmError::from_static(FailureClass::CircuitOpen, "circuit breaker is open");
        assert_eq!(e.class(), FailureClass::CircuitOpen);
        assert_eq!(e.message(), "circuit breaker is open");
        assert_eq!(e.to_string(), "circuit_open: circuit breaker is open");
    }

    #[test]
    fn error_is_one_pointer() {
        assert_eq!(
            std::mem::size_of::<LlmError>(),
            std::mem::size_of::<usize>()
        );
    }

    #[test]
    fn secret_patterns_compile() {
        for shape in secret_shapes() {
            assert!(Regex::new(&shape).is_ok(), "{shape}");
        }
        assert!(RegexSet::new(secret_shapes()).is_ok());
        assert!(any_secret().is_match("sk-proj-abcdefghijklmnop0123"));
    }

    #[test]
    fn redact_keeps_the_words_around_a_secret() {
        assert_eq!(
            redact("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig"),
            "Authorization: Bearer [REDACTED]"
        );
        assert_eq!(
            redact("authorization: Basic dXNlcjpwYXNzd29yZA=="),
            "authorization: Basic [REDACTED]"
        );
        assert_eq!(
            redact(r#"{"x-api-key": "abc123def456", "model": "claude"}"#),
            r#"{"x-api-key": "[REDACTED]", "model": "claude"}"#
        );
        assert_eq!(
            redact(
                "GET https://bob:hunter22@proxy.example/v1?key=AIzaSyA-0123456789abcdefghijklmnopqrs&alt=sse"
            ),
            "GET https://[REDACTED]@proxy.example/v1?key=[REDACTED]&alt=sse"
        );
    }

    #[derive(Debug)]
    struct Leaky(&'static str, Option<Box<Leaky>>);

    impl fmt::Display for Leaky {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl StdError for Leaky {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_deref().map(|s| s as &(dyn StdError + 'static))
        }
    }

    #[test]
    fn source_chain_is_redacted_at_every_link() {
        let inner = Leaky("proxy said: x-api-key: sk-ant-api03-innersecret", None);
        let outer = Leaky(
            "connect to https://u:outersecret@h failed",
            Some(Box::new(inner)),
        );
        let e = LlmError::new(FailureClass::Connect, "could not connect").with_source(outer);
        let mut shown = Vec::new();
        let mut next = e.source();
        while let Some(s) = next {
            shown.push(format!("{s} {s:?}"));
            next = s.source();
        }
        assert_eq!(shown.len(), 2, "{shown:?}");
        let all = shown.join("\n");
        assert!(
            !all.contains("innersecret") && !all.contains("outersecret"),
            "{all}"
        );
        assert!(all.contains("proxy said: x-api-key: [REDACTED]"), "{all}");
    }

    #[test]
    fn source_ref_still_downcasts_to_the_original() {
        let e = LlmError::new(FailureClass::Connect, "x").with_source(Leaky("key=abcdefgh", None));
        let original = e.source_ref().and_then(|s| s.downcast_ref::<Leaky>());
        assert_eq!(original.map(|l| l.0), Some("key=abcdefgh"));
        // Replacing the source replaces what `source()` shows.
        let e = e.with_source(Leaky("second", None));
        assert_eq!(e.source().map(|s| s.to_string()).as_deref(), Some("second"));
    }

    #[test]
    fn a_long_source_chain_is_cut() {
        let mut chain = Leaky("0", None);
        for _ in 0..40 {
            chain = Leaky("link", Some(Box::new(chain)));
        }
        let e = LlmError::new(FailureClass::Connect, "x").with_source(chain);
        let links = std::iter::successors(e.source(), |&s| s.source()).count();
        assert_eq!(links, MAX_CHAIN);
    }

    use proptest::strategy::Strategy;

    proptest::proptest! {
        #[test]
        fn redact_never_panics_and_removes_keys(prefix in ".{0,40}", key in "[A-Za-z0-9]{8,40}") {
            let text = format!("{prefix} sk-{key} tail");
            let out = redact(&text);
            proptest::prop_assert!(!out.contains(&key));
            let _ = bounded(&text);
        }

        #[test]
        fn redact_never_panics_on_any_text(text in "\\PC{0,300}") {
            let out = redact(&text);
            proptest::prop_assert!(out.len() <= text.len() + REDACTED.len() * (text.len() / 2 + 1));
        }

        #[test]
        fn redact_removes_credentials_in_any_surroundings(
            prefix in "[ -~]{0,30}",
            // A header's, JSON's or query's value after a space; or a URL's password, its
            // scheme glued to whatever came before it (`0https://`, `_redis://`).
            (before, after) in proptest::prop_oneof![
                " (Authorization: (Bearer|Basic) |x-api-key: |\"api_key\": \"|api-key=|\\?key=)"
                    .prop_map(|name: String| (name, String::new())),
                "(https|http|redis|rediss|postgres)://[A-Za-z0-9._-]{1,12}:"
                    .prop_map(|user: String| (user, "@host.example".to_owned())),
            ],
            secret in "[A-Za-z0-9]{12,40}",
            suffix in "([\"&,; \n/][ -~]{0,30})?",
        ) {
            let text = format!("{prefix}{before}{secret}{after}{suffix}");
            let out = redact(&text);
            proptest::prop_assert!(!out.contains(&secret), "{} -> {}", text, out);
        }
    }
}
