//! The [`Classifier`] trait and the built-in classifiers.

use std::time::SystemTime;

use http::{HeaderMap, StatusCode};
use seawall_core::{BoxError, FailureClass, LlmError};

use crate::error_body::ProviderError;
use crate::hints;

/// Turns a failed HTTP response (or a transport error) into an [`LlmError`].
///
/// [`ClassifyLayer`](crate::ClassifyLayer) calls it for every response whose status is a
/// failure, with the head and at most the layer's error-body limit of the body. Implement it to
/// teach seawall about an upstream of your own; [`ErrorResponse::decorate`] attaches the
/// standard hints (retry delay, `x-should-retry`, rate limits, request id), and the built-in
/// classifiers can be reused for the cases you do not handle:
///
/// ```
/// use seawall_classify::{AutoClassifier, Classifier, ErrorResponse};
/// use seawall_core::{FailureClass, LlmError};
///
/// /// Our gateway answers 499 when its own queue is full: that is an overload.
/// #[derive(Clone, Copy, Debug)]
/// struct Gateway;
///
/// impl Classifier for Gateway {
///     fn classify_response(&self, response: &ErrorResponse<'_>) -> LlmError {
///         if response.status().as_u16() == 499 {
///             return response.decorate(LlmError::new(FailureClass::Overloaded, "gateway queue full"));
///         }
///         AutoClassifier.classify_response(response)
///     }
/// }
///
/// let headers = http::HeaderMap::new();
/// let r = ErrorResponse::new(http::StatusCode::from_u16(499).unwrap(), &headers, b"");
/// assert_eq!(Gateway.classify_response(&r).class(), FailureClass::Overloaded);
/// ```
pub trait Classifier {
    /// Classifies a response whose status [`is_failure`](Classifier::is_failure).
    fn classify_response(&self, response: &ErrorResponse<'_>) -> LlmError;

    /// Classifies an error of the inner service (connect failure, timeout, reset, ...). The
    /// default reads the error's source chain with [`classify_transport_error`](crate::classify_transport_error).
    fn classify_transport_error(&self, error: BoxError) -> LlmError {
        crate::transport::classify_transport_error(error)
    }

    /// Whether a response head is a failure to classify. The default: any status outside
    /// 2xx, and a 2xx whose content type is `text/html`. No LLM API answers with a web page:
    /// one that says 200 comes from something in between (a proxy's block page, a captive
    /// portal, a wrong base URL), and handing it on as an answer would only fail later, in the
    /// caller's parser, past every retry and fallback. It is classified as any HTML error
    /// body is, by its title (`ServerError` when that names nothing).
    fn is_failure(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        !status.is_success() || is_web_page(headers)
    }
}

/// Whether a response's content type is `text/html`.
fn is_web_page(headers: &HeaderMap) -> bool {
    seawall_core::header(headers, &http::header::CONTENT_TYPE)
        .is_some_and(|v| seawall_core::is_media_type(v.as_bytes(), "text/html"))
}

/// A failed response as a [`Classifier`] sees it: status, headers, and the first bytes of the
/// body (up to the layer's error-body limit).
#[derive(Clone, Copy)]
pub struct ErrorResponse<'a> {
    status: StatusCode,
    headers: &'a HeaderMap,
    body: &'a [u8],
    truncated: bool,
    now: SystemTime,
}

impl<'a> ErrorResponse<'a> {
    /// A response received now.
    pub fn new(status: StatusCode, headers: &'a HeaderMap, body: &'a [u8]) -> Self {
        ErrorResponse {
            status,
            headers,
            body,
            truncated: false,
            now: SystemTime::now(),
        }
    }

    /// Marks the body as cut at the limit.
    pub fn with_truncated(mut self, truncated: bool) -> Self {
        self.truncated = truncated;
        self
    }

    /// Sets the wall-clock time of receipt, the reference for HTTP-dates and RFC 3339 resets
    /// when the response has no `Date` header (for tests).
    pub fn with_now(mut self, now: SystemTime) -> Self {
        self.now = now;
        self
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The body, at most the error-body limit of it.
    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// Whether the body was longer than the limit (the rest was dropped unread).
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }

    /// When the response was received.
    pub fn now(&self) -> SystemTime {
        self.now
    }

    /// Parses the body.
    pub fn provider_error(&self) -> ProviderError {
        ProviderError::parse(self.body)
    }

    /// Attaches what the headers (and the error's message) say to `err`: the status, the
    /// request id, the server's retry delay (`retry-after-ms`, `x-ms-retry-after-ms`,
    /// `retry-after`, else "try again in ..." in the message), `x-should-retry`, and the
    /// rate-limit snapshot of both wire formats.
    pub fn decorate(&self, err: LlmError) -> LlmError {
        self.decorate_with(err, Dialect::Auto)
    }

    fn decorate_with(&self, mut err: LlmError, dialect: Dialect) -> LlmError {
        err = err.with_status(self.status);
        if let Some(id) = hints::request_id(self.headers) {
            err = err.with_request_id(id);
        }
        // A delay already on the error (from the body's structure) beats the message's words.
        let delay = hints::retry_after_from_headers(self.headers, self.now).or_else(|| {
            (err.retry_after().is_none()
                && dialect != Dialect::Anthropic
                && dialect != Dialect::Status)
                .then(|| hints::retry_after_from_message(err.message()))
                .flatten()
        });
        if let Some(d) = delay {
            err = err.with_retry_after(d);
        }
        if let Some(s) = hints::should_retry(self.headers) {
            err = err.with_should_retry(s);
        }
        if let Some(snap) = hints::rate_limits(self.headers, self.now) {
            err = err.with_rate_limit(snap);
        }
        err
    }
}

impl std::fmt::Debug for ErrorResponse<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values and the body are left out: they may carry credentials.
        f.debug_struct("ErrorResponse")
            .field("status", &self.status.as_u16())
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("body_len", &self.body.len())
            .field("truncated", &self.truncated)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Auto,
    OpenAi,
    Anthropic,
    Status,
}

/// The default: understands both OpenAI-compatible and Anthropic error bodies and headers,
/// whichever the response carries. Use it when one stack talks to both, or when unsure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AutoClassifier;

/// OpenAI and OpenAI-compatible APIs: OpenAI, Azure OpenAI, DeepSeek, vLLM-style servers.
///
/// Reads `{"error":{"message","type","param","code"}}` (and the flat vLLM shape), `retry-after-ms`,
/// `x-ms-retry-after-ms`, `retry-after`, "Please try again in 1.4s" / "Please retry after 6
/// seconds" in the message, and `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenAiClassifier;

/// Anthropic's Messages API: `{"type":"error","error":{"type","message"},"request_id"}`,
/// `retry-after`, `request-id`, and `anthropic-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnthropicClassifier;

/// Status only: the class comes from the HTTP status alone (unknown 4xx: `InvalidRequest`,
/// unknown 5xx: `ServerError`); the body is only used for the message. The standard headers
/// (`retry-after`, `x-should-retry`, request id, rate limits) are still read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatusClassifier;

impl Classifier for AutoClassifier {
    fn classify_response(&self, response: &ErrorResponse<'_>) -> LlmError {
        classify_with(response, Dialect::Auto)
    }
}

impl Classifier for OpenAiClassifier {
    fn classify_response(&self, response: &ErrorResponse<'_>) -> LlmError {
        classify_with(response, Dialect::OpenAi)
    }
}

impl Classifier for AnthropicClassifier {
    fn classify_response(&self, response: &ErrorResponse<'_>) -> LlmError {
        classify_with(response, Dialect::Anthropic)
    }
}

impl Classifier for StatusClassifier {
    fn classify_response(&self, response: &ErrorResponse<'_>) -> LlmError {
        classify_with(response, Dialect::Status)
    }
}

fn classify_with(response: &ErrorResponse<'_>, dialect: Dialect) -> LlmError {
    let status = response.status;
    let coding = seawall_core::content_coding(response.headers);
    let parsed = match coding {
        // Compressed bytes are no message: the status and the headers decide.
        Some(coding) => {
            let named = coding.len() <= 16
                && coding
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-');
            ProviderError::unread(format!(
                "HTTP {} {} (its body in the `{}` content coding, not read: decompress below \
                 the classifier)",
                status.as_u16(),
                status.canonical_reason().unwrap_or("(unknown status)"),
                if named { coding } else { "unknown" },
            ))
        }
        None => response.provider_error(),
    };
    let class = if dialect == Dialect::Status || coding.is_some() {
        class_of_status(status.as_u16())
    } else {
        class_of(status.as_u16(), &parsed)
    };
    let err = error_from(class, Some(status), &parsed, dialect != Dialect::Status);
    let err = response.decorate_with(err, dialect);
    // A limit of a long window (a day, a week, a month, a plan's hours of use) named in words,
    // with no hint of when to come back (in the body's details, its words or the headers: the
    // error's own delay, read once above; OpenRouter's `free-models-per-day`, Z.ai's "Usage
    // limit reached for 5 hour"), is not over within any call's retries. A hint (Groq's "try
    // again in 6s" for its rolling day) keeps it a rate limit.
    if class == FailureClass::RateLimited
        && status == StatusCode::TOO_MANY_REQUESTS
        && dialect != Dialect::Status
        && err.retry_after().is_none()
        && names_a_long_window(parsed.message())
    {
        return err.with_class(FailureClass::QuotaExhausted);
    }
    err
}

/// Builds the error of a class from a parsed body: message (or the status's reason), code,
/// type, body request id, and the delay of Google's `google.rpc.RetryInfo` (a header's hint,
/// added later, still wins; the message's "retry in" only counts without it).
pub(crate) fn error_from(
    class: FailureClass,
    status: Option<StatusCode>,
    parsed: &ProviderError,
    with_names: bool,
) -> LlmError {
    // A message of only blanks or control bytes (a body of NULs, say) says nothing.
    let readable = parsed
        .message()
        .filter(|m| m.chars().any(|c| !c.is_whitespace() && !c.is_control()));
    let message = match (readable, status) {
        (Some(m), _) => m.to_owned(),
        (None, Some(s)) => format!(
            "HTTP {} {}{}",
            s.as_u16(),
            s.canonical_reason().unwrap_or("(unknown status)"),
            if parsed.is_empty() && !parsed.is_json() {
                " with an empty body"
            } else {
                ""
            }
        ),
        (None, None) => "upstream error".to_owned(),
    };
    let mut err = LlmError::new(class, message);
    if with_names {
        if let Some(c) = parsed.code() {
            err = err.with_code(c);
        }
        if let Some(t) = parsed.error_type() {
            err = err.with_error_type(t);
        }
        if let Some(d) = parsed.retry_delay() {
            err = err.with_retry_after(d);
        }
    }
    if let Some(id) = parsed.request_id() {
        err = err.with_request_id(id);
    }
    err
}

fn contains_any(haystack: &str, needles: &[&str]) -> bool {
    needles.iter().any(|n| haystack.contains(n))
}

const QUOTA_NAMES: &[&str] = &[
    "insufficient_quota",
    "enforced_spend_limit_reached",
    "billing_hard_limit_reached",
    "billing_not_active",
    "billing_error",
    "insufficient_balance",
    "insufficient_funds",
    "payment_required",
    // Moonshot's (sent with a 403 or a 429), DashScope's (with a 400).
    "exceeded_current_quota_error",
    "arrearage",
    // A LiteLLM proxy's budget for the key, team or user (with a 400 or a 429).
    "budget_exceeded",
];
const QUOTA_PHRASES: &[&str] = &[
    "exceeded your current quota",
    "insufficient balance",
    "insufficient_quota",
    "credit balance is too low",
    "spend limit",
    "billing hard limit",
    "account is not active",
    "api usage limit",
    // Moonshot: "organization ... exceeded current quota".
    "exceeded current quota",
    // Z.ai (code 1113): "Your account is in arrears, please recharge"; gateways' "overdue
    // account"; Zhipu's Chinese for the same: "欠费" (in arrears), "余额不足" (balance too low).
    "in arrears",
    "overdue account",
    "overdue payment",
    "欠费",
    "余额不足",
    "insufficient account balance",
    // SiliconFlow's 403 (code 30011): "Your paid balance is insufficient".
    "balance is insufficient",
    // xAI's 429 "used all available credits or reached its monthly spending limit"; Fireworks'
    // 412 "suspended, possibly due to reaching the monthly spending limit".
    "spending limit",
    "used all available credits",
    // A LiteLLM proxy's "Budget has been exceeded!", "End User=x over budget", "exceeded budget
    // for model=...".
    "budget has been exceeded",
    "over budget",
    "exceeded budget",
    // OpenRouter's 403 for a key past its own spend cap: "Key limit exceeded (monthly limit)".
    "key limit exceeded",
];
/// A limit of a long window: of the day ("free-models-per-day", "requests per day"), or of a
/// plan's hours, week or month of use (Z.ai's 429 codes 1308 and 1310: "Usage limit reached for
/// 5 hour", "Weekly/Monthly Limit Exhausted", and in Chinese "已达到 5 小时的使用上限"; Ollama's
/// cloud: "reached your session usage limit"). Their reset times are written in the provider's
/// own zone, or not at all, so they are not read as a delay.
const LONG_WINDOW_PHRASES: &[&str] = &[
    "per-day",
    "per day",
    "daily limit",
    "daily quota",
    "usage limit reached",
    "session usage limit",
    "weekly limit",
    "monthly limit",
    "使用上限",
];

fn names_a_long_window(message: Option<&str>) -> bool {
    message.is_some_and(|m| contains_any(&m.to_ascii_lowercase(), LONG_WINDOW_PHRASES))
}
/// A 400 that refuses the caller, not the request: Gemini's free tier or the API itself not
/// served where the caller is (`FAILED_PRECONDITION`), OpenAI's models that an organization
/// must be verified to use or to stream. Another provider or model may serve it.
const CALLER_PHRASES: &[&str] = &[
    "location is not supported",
    "not available in your country",
    "organization must be verified",
];
/// An account locked or restricted by the provider, which Z.ai sends as a 429 (its codes 1112
/// and 1121: "Your account has been locked"; "已被锁定" in Chinese; 1313): no wait unlocks it,
/// another key or provider may serve.
const LOCKED_PHRASES: &[&str] = &[
    "has been locked",
    "account is locked",
    "已被锁定",
    // Z.ai's 429 code 1313: access limited under its fair usage policy until the user asks.
    "does not comply with the fair usage policy",
];
/// A 400 (or an odd 4xx) that refuses the key: xAI's "Incorrect API key provided" with a code
/// that names only the argument, Cohere's 498 "invalid api token".
const KEY_PHRASES: &[&str] = &[
    "incorrect api key",
    "invalid api key",
    "invalid api token",
    "api key not valid",
];
const CONTEXT_NAMES: &[&str] = &[
    "context_length_exceeded",
    "request_too_large",
    "model_context_window_exceeded",
    // llama.cpp's server.
    "exceed_context_size_error",
];
/// The words each provider and server puts in a prompt-too-long error whose code says nothing
/// (`400`, `invalid_request_error`, `BadRequestError`, `INVALID_ARGUMENT`). Each phrase speaks
/// of the prompt or the model's window, never of a field, so a field's length error (`'name'
/// ... maximum length 64`) stays an invalid request.
const CONTEXT_PHRASES: &[&str] = &[
    // OpenAI, Azure, DeepSeek, Mistral, vLLM's older servers.
    "maximum context length",
    "context length exceeded",
    "context_length_exceeded",
    // Anthropic, Fireworks.
    "prompt is too long",
    // OpenAI's Responses API.
    "context window",
    "exceed context limit",
    // Ollama.
    "exceeds the context",
    // Bedrock.
    "input is too long",
    // Gemini: "The input token count (N) exceeds the maximum number of tokens allowed (M)."
    "exceeds the maximum number of tokens allowed",
    // llama.cpp: "request (N tokens) exceeds the available context size (M tokens)".
    "exceeds the available context size",
    // vLLM: "Prompt length of N is longer than the maximum model length of M", "The decoder
    // prompt (length N) is longer than ...", "The prompt (total length N) is too long to fit
    // into the model (context length M)".
    "longer than the maximum model length",
    "too long to fit into the model",
    // SGLang: "The input (N tokens) is longer than the model's context length (M tokens).",
    // "Input length (N tokens) exceeds the maximum allowed length (M tokens)."
    "longer than the model's context length",
    "tokens) exceeds the maximum allowed length",
    // LM Studio: "... is greater than the context length".
    "greater than the context length",
    // Text Generation Inference: "`inputs` tokens + `max_new_tokens` must be <= N", "`inputs`
    // must have less than N tokens".
    "`inputs` tokens + `max_new_tokens` must be",
    "`inputs` must have less than",
    // xAI: "This model's maximum prompt length is N but the request contains M tokens."
    "maximum prompt length",
    // Cohere: "too many tokens: total number of tokens in the prompt cannot exceed N",
    // "too many tokens: size limit exceeded by N tokens".
    "too many tokens: total number of tokens",
    "too many tokens: size limit exceeded",
    // Kimi: "Your request exceeded model token limit: N (requested: M)".
    "exceeded model token limit",
    // Z.ai (code 1261): "Prompt too long".
    "prompt too long",
    // DashScope: "Range of input length should be [1, N]" (the input, not a parameter's range).
    "range of input length should be",
    // Groq and OpenAI's older wording: "Please reduce the length of the messages or completion".
    "reduce the length of the messages",
    // OpenRouter's providers: "Input length N exceeds the maximum allowed input length of M".
    "maximum allowed input length",
    // GitHub Copilot: "prompt token count of N exceeds the limit of M".
    "prompt token count of",
    // Bedrock: "Too many input tokens. Max input tokens: N" (its throttling says "too many
    // tokens", which stays a rate limit).
    "too many input tokens",
];
/// OpenAI's words for one request over the key's per-minute token limit, sent with a 429.
const TOO_LARGE_PHRASE: &str = "request too large";
const CONTENT_NAMES: &[&str] = &[
    "content_policy_violation",
    "content_filter",
    "content_filtered",
    "moderation_blocked",
    "responsibleaipolicyviolation",
    "invalid_prompt",
    // DashScope's: "Input data may contain inappropriate content."
    "data_inspection_failed",
];
const CONTENT_PHRASES: &[&str] = &[
    "content management policy",
    "content policy",
    "content_policy",
    "safety system",
    "content filter",
    "flagged as potentially violating",
    // OpenRouter's 403 for a model that requires moderation: "... your input was flagged".
    "requires moderation",
    "input was flagged",
    "inappropriate content",
    // Z.ai (code 1301): "potentially unsafe or sensitive content"; "敏感内容" in Chinese.
    "unsafe or sensitive content",
    "敏感内容",
];
const OVERLOADED_NAMES: &[&str] = &[
    "overloaded_error",
    "overloaded",
    "server_overloaded",
    "engine_overloaded",
    // Moonshot's, sent with a 429.
    "engine_overloaded_error",
    "service_unavailable",
    "service_unavailable_error",
];
/// The words of an overload or of capacity run out, whatever the status: Mistral's 429 "Service
/// tier capacity exceeded for this model", Cloudflare's 429 "Capacity temporarily exceeded",
/// Groq's 498 "Flex Tier Capacity Exceeded", Google's "No capacity available for model".
const OVERLOADED_PHRASES: &[&str] = &[
    "overloaded",
    "capacity exceeded",
    "capacity temporarily exceeded",
    "at capacity",
    "no capacity available",
];
const TIMEOUT_NAMES: &[&str] = &["timeout_error", "timeout", "gateway_timeout"];

fn generic_name_class(name: &str) -> Option<FailureClass> {
    use FailureClass::*;
    Some(match name {
        "rate_limit_exceeded"
        | "rate_limit_error"
        | "rate_limited"
        | "too_many_requests"
        | "requests"
        | "tokens" => RateLimited,
        "api_error"
        | "server_error"
        | "internal_error"
        | "internal_server_error"
        | "internalservererror" => ServerError,
        "authentication_error"
        | "invalid_api_key"
        | "invalid_authentication"
        | "unauthorized"
        | "authenticationerror"
        // Google's: its status name, and the reason of a bad key's `400 INVALID_ARGUMENT`.
        | "unauthenticated"
        | "api_key_invalid" => Authentication,
        "permission_error"
        | "permission_denied"
        | "forbidden"
        | "unsupported_country_region_territory"
        | "permissiondeniederror"
        | "api_key_service_blocked" => PermissionDenied,
        "not_found_error" | "not_found" | "model_not_found" | "deploymentnotfound"
        | "notfounderror"
        // Groq's retired models: another model serves the call.
        | "model_decommissioned" => NotFound,
        "invalid_request_error"
        | "invalid_request"
        | "bad_request"
        | "badrequesterror"
        | "invalid_value"
        | "unprocessable_entity" => InvalidRequest,
        "conflict" | "conflict_error" => Conflict,
        "request_timeout" => RequestTimeout,
        // Google's status names, for an error object met without its HTTP status (in a stream).
        "resource_exhausted" => RateLimited,
        "unavailable" => Overloaded,
        "deadline_exceeded" => UpstreamTimeout,
        "internal" => ServerError,
        "invalid_argument" | "failed_precondition" => InvalidRequest,
        n => match n.parse::<u16>() {
            Ok(code @ 400..=599) => class_of_status(code),
            _ => return None,
        },
    })
}

/// The class of a status alone (the status-only classifier, and the base of the others).
///
/// Unknown 4xx: `InvalidRequest`; unknown 5xx (and nonsense codes of 600 and above):
/// `ServerError`; unexpected 1xx/2xx/3xx (redirects are not followed, so the base URL is
/// wrong): `InvalidRequest`. 424 (Failed Dependency) is the exception among the 4xx: the
/// request was fine and what it depended on failed. Amazon Bedrock answers it when the model
/// itself failed (`ModelErrorException`) or its stream broke (`ModelStreamErrorException`,
/// documented as "Retry your request"), so it is a `ServerError`.
pub fn class_of_status(status: u16) -> FailureClass {
    use FailureClass::*;
    match status {
        401 => Authentication,
        402 => QuotaExhausted,
        403 => PermissionDenied,
        404 => NotFound,
        408 => RequestTimeout,
        409 => Conflict,
        413 => ContextLengthExceeded,
        424 => ServerError,
        429 => RateLimited,
        503 | 529 => Overloaded,
        504 | 524 => UpstreamTimeout,
        500..=599 => ServerError,
        s if s >= 600 => ServerError,
        _ => InvalidRequest,
    }
}

struct Signals {
    quota: bool,
    /// A name (or words) refusing the caller's key, region or model rather than the request:
    /// `Authentication`, `PermissionDenied` or `NotFound`.
    access: Option<FailureClass>,
    /// The quota signal is a code or type, not just words in the message.
    quota_named: bool,
    context: bool,
    /// One request larger than the key's whole per-minute token limit: no wait lets it through.
    too_large: bool,
    /// The account is locked.
    locked: bool,
    content: bool,
    overloaded: bool,
    timeout: bool,
    generic: Option<FailureClass>,
}

impl Signals {
    fn of(e: &ProviderError) -> Signals {
        let names: Vec<String> = e.names().map(|n| n.to_ascii_lowercase()).collect();
        let has = |list: &[&str]| names.iter().any(|n| list.contains(&n.as_str()));
        let msg = e.message().unwrap_or("").to_ascii_lowercase();
        let quota_named = has(QUOTA_NAMES);
        let locked = contains_any(&msg, LOCKED_PHRASES);
        Signals {
            quota: quota_named || contains_any(&msg, QUOTA_PHRASES),
            access: names
                .iter()
                .filter_map(|n| generic_name_class(n))
                .find(|c| {
                    matches!(
                        c,
                        FailureClass::Authentication
                            | FailureClass::PermissionDenied
                            | FailureClass::NotFound
                    )
                })
                .or_else(|| contains_any(&msg, KEY_PHRASES).then_some(FailureClass::Authentication))
                .or_else(|| {
                    (locked || contains_any(&msg, CALLER_PHRASES))
                        .then_some(FailureClass::PermissionDenied)
                }),
            quota_named,
            context: has(CONTEXT_NAMES) || contains_any(&msg, CONTEXT_PHRASES),
            too_large: msg.contains(TOO_LARGE_PHRASE),
            locked,
            content: has(CONTENT_NAMES) || contains_any(&msg, CONTENT_PHRASES),
            overloaded: has(OVERLOADED_NAMES) || contains_any(&msg, OVERLOADED_PHRASES),
            timeout: has(TIMEOUT_NAMES),
            generic: names.iter().find_map(|n| generic_name_class(n)),
        }
    }
}

/// Whether the error's body says when to come back: Google's `RetryInfo`, or a delay in its
/// words ("Please retry in 33s").
fn says_when(e: &ProviderError) -> bool {
    e.retry_delay().is_some()
        || hints::retry_after_from_message(e.message().unwrap_or("")).is_some()
}

/// The class of a failed response from its status and parsed body (the README's table).
///
/// A 2xx status means an error object inside a successful answer (an error event in a stream,
/// or a `200` whose JSON body is `{"error": ...}`): the class is that of the HTTP status the
/// object names (a numeric `status` or `code` from 400 to 599), else it comes from the body's
/// words alone (unknown: `ServerError`).
pub fn class_of(status: u16, e: &ProviderError) -> FailureClass {
    use FailureClass::*;
    if (200..=299).contains(&status) {
        let named = e
            .status()
            .or_else(|| e.code().and_then(|c| c.parse::<u16>().ok()));
        if let Some(named @ 400..=599) = named {
            return class_of(named, e);
        }
    }
    let s = Signals::of(e);
    match status {
        // A per-window quota ("You exceeded your current quota ... Please retry in 33s", or
        // the delay in Google's `RetryInfo`) says when to come back: that is a rate limit. A
        // named quota code is final, and so is a quota of the day (Google's `QuotaFailure`
        // naming a per-day quota), whatever delay comes with it.
        429 if s.quota_named || e.daily_quota() => QuotaExhausted,
        429 if s.quota && !says_when(e) => QuotaExhausted,
        // A locked account (Z.ai's 429s) is not over within any wait; another key may serve.
        429 if s.locked && !says_when(e) => PermissionDenied,
        // OpenAI's 429 for one request over the key's tokens per minute ("Request too large for
        // gpt-4o ... on tokens per min (TPM): Limit 30000, Requested 50000"): the 413 Groq sends
        // for the same thing. Retried, it is refused again however long the wait; a smaller
        // request, or a model or key with more room, serves it.
        429 if s.too_large => ContextLengthExceeded,
        // The provider's capacity, not the caller's rate (Moonshot's `engine_overloaded_error`,
        // OpenAI's older "That model is currently overloaded"), unless a rate limit's own code
        // says otherwise.
        429 if s.overloaded && s.generic != Some(RateLimited) => Overloaded,
        // A spent quota or balance sent as a 403 (Moonshot's `exceeded_current_quota_error`, a
        // gateway's "overdue account"): as final as a 402.
        403 if s.quota => QuotaExhausted,
        // A router's moderation refusing the prompt (OpenRouter's 403): the key is fine, and
        // the same prompt would be refused again.
        403 if s.content => ContentFiltered,
        401 | 402 | 403 | 404 | 408 | 409 | 413 | 429 => class_of_status(status),
        400..=499 => {
            if s.quota {
                QuotaExhausted
            } else if s.context {
                ContextLengthExceeded
            } else if s.content {
                ContentFiltered
            } else if let Some(access) = s.access {
                // A 400 whose names say the key, the region or the model is refused (Gemini's
                // bad key, a router's `model_not_found`): another key, provider or model may
                // serve it, as after a 401, 403 or 404.
                access
            } else if status == 400 || status == 422 {
                InvalidRequest
            } else if s.overloaded {
                // An odd status whose words say the provider is at capacity (Groq's 498).
                Overloaded
            } else {
                // Else the status's own class (`InvalidRequest`, or a 424's `ServerError`).
                s.generic.unwrap_or_else(|| class_of_status(status))
            }
        }
        // A spent balance sent as a server error (MiniMax's 500 "insufficient balance (1008)"):
        // no retry pays it.
        500..=599 if s.quota => QuotaExhausted,
        503 | 529 | 504 | 524 => class_of_status(status),
        500..=599 => {
            if s.overloaded {
                Overloaded
            } else if s.timeout {
                UpstreamTimeout
            } else {
                ServerError
            }
        }
        200..=299 => {
            if s.quota {
                QuotaExhausted
            } else if s.context {
                ContextLengthExceeded
            } else if s.content {
                ContentFiltered
            } else if s.overloaded {
                Overloaded
            } else if s.timeout {
                UpstreamTimeout
            } else {
                s.generic.unwrap_or(ServerError)
            }
        }
        other => class_of_status(other),
    }
}
