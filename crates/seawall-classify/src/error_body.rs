//! What an upstream error body says, in either wire format, parsed leniently.

use std::time::Duration;

use serde_json::Value;

use seawall_core::Provider;

/// The longest text kept from a non-JSON body for the error message.
const MAX_TEXT: usize = 200;

/// The fields of an upstream error body.
///
/// Understands OpenAI's `{"error":{"message","type","param","code"}}` (also Azure OpenAI,
/// DeepSeek, vLLM, and an array around it), Anthropic's
/// `{"type":"error","error":{"type","message"},"request_id"}`, the flat
/// `{"object":"error","message","type","code"}` of older vLLM, `{"error":"text"}`,
/// `{"detail": ...}` and `{"message": ...}`, the first of an `{"errors": [...]}` list
/// (Cloudflare, GraphQL-style APIs), and Google's error model (Gemini): its `status`
/// name, and in its `details` a `google.rpc.RetryInfo`'s delay, a `google.rpc.QuotaFailure`
/// naming a per-day quota and a `google.rpc.ErrorInfo`'s reason. A message that is not a
/// string is kept as text: a list of strings joined, an object as its compact JSON (Mistral's
/// validation errors), cut at 200 characters. A body that is not JSON (HTML from a proxy, plain
/// text, truncated JSON, invalid UTF-8) still yields what can be found: `"type"`/`"code"`/
/// `"message"` string fields of truncated JSON, an HTML `<title>`, or the first 200 characters
/// of text.
///
/// ```
/// use seawall_classify::ProviderError;
/// use seawall_core::Provider;
///
/// let e = ProviderError::parse(br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}"#);
/// assert_eq!(e.error_type(), Some("overloaded_error"));
/// assert_eq!(e.provider(), Provider::Anthropic);
/// assert_eq!(e.request_id(), Some("req_1"));
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ProviderError {
    error_type: Option<String>,
    code: Option<String>,
    message: Option<String>,
    param: Option<String>,
    inner_code: Option<String>,
    /// Google's canonical status name (`INVALID_ARGUMENT`) and its `ErrorInfo` reason
    /// (`API_KEY_INVALID`): names like the code and type, where Google puts them.
    google_status: Option<String>,
    reason: Option<String>,
    request_id: Option<String>,
    status: Option<u16>,
    retry_delay: Option<Duration>,
    daily_quota: bool,
    provider: Provider,
    json: bool,
}

impl std::fmt::Debug for ProviderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Messages can quote a key ("Incorrect API key provided: sk-..."), and a hostile or
        // odd upstream can put one in any field: every text is redacted.
        fn shown(v: &Option<String>) -> Option<std::borrow::Cow<'_, str>> {
            v.as_deref().map(seawall_core::redact)
        }
        f.debug_struct("ProviderError")
            .field("error_type", &shown(&self.error_type))
            .field("code", &shown(&self.code))
            .field("message", &shown(&self.message))
            .field("param", &shown(&self.param))
            .field("inner_code", &shown(&self.inner_code))
            .field("google_status", &shown(&self.google_status))
            .field("reason", &shown(&self.reason))
            .field("request_id", &shown(&self.request_id))
            .field("status", &self.status)
            .field("retry_delay", &self.retry_delay)
            .field("daily_quota", &self.daily_quota)
            .field("provider", &self.provider)
            .finish()
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A message as text whatever its shape: a string or number as it is, a list of strings
/// joined (NestJS-style servers), any other object or list as its compact JSON (Mistral's
/// validation `{"detail": [...]}`), at most [`MAX_TEXT`] characters.
fn message_text(v: &Value) -> Option<String> {
    match v {
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_string) => {
            let parts: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
            Some(collapse(&parts.join("; ")))
        }
        Value::Array(items) if items.is_empty() => None,
        Value::Object(o) if o.is_empty() => None,
        Value::Array(_) | Value::Object(_) => Some(collapse(&v.to_string())),
        other => text(other),
    }
}

impl ProviderError {
    /// Parses an error body (possibly truncated); never fails.
    pub fn parse(body: &[u8]) -> ProviderError {
        let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
        let trimmed = body.trim_ascii();
        if trimmed.is_empty() {
            return ProviderError::default();
        }
        if let Ok(v) = serde_json::from_slice::<Value>(trimmed) {
            return ProviderError::from_value(&v);
        }
        let mut e = ProviderError::default();
        if trimmed.starts_with(b"{") || trimmed.starts_with(b"[") {
            // Truncated or broken JSON: pick out the string fields we care about.
            e.error_type = string_field(trimmed, "type").filter(|t| t != "error");
            e.code = string_field(trimmed, "code");
            e.message = string_field(trimmed, "message");
            if e.error_type.is_some() || e.code.is_some() || e.message.is_some() {
                e.provider = guess_provider(trimmed);
                return e;
            }
        }
        let lossy = String::from_utf8_lossy(trimmed);
        e.message = Some(summarize_text(&lossy));
        e
    }

    /// An error whose body could not be read, described by `message` alone.
    pub(crate) fn unread(message: String) -> ProviderError {
        ProviderError {
            message: Some(message),
            ..ProviderError::default()
        }
    }

    /// Reads an already parsed JSON value (an error body, or the payload of an SSE error event).
    pub fn from_value(v: &Value) -> ProviderError {
        let v = match v {
            Value::Array(items) => items.first().unwrap_or(&Value::Null),
            other => other,
        };
        let mut e = ProviderError {
            json: true,
            ..ProviderError::default()
        };
        let Value::Object(top) = v else {
            e.message = text(v);
            return e;
        };
        e.request_id = top.get("request_id").and_then(text);
        let anthropic_shape = top.get("type").and_then(Value::as_str) == Some("error");
        let error = top.get("error");
        let object = match error {
            Some(Value::Object(err)) => Some(err),
            // Cloudflare's and GraphQL-style APIs: `{"errors": [{"message", "code"}], ...}`.
            None | Some(Value::Null) => top
                .get("errors")
                .and_then(Value::as_array)
                .and_then(|a| a.first())
                .and_then(Value::as_object),
            Some(_) => None,
        };
        match (object, error) {
            (Some(err), _) => {
                e.error_type = err.get("type").and_then(text);
                e.code = err.get("code").and_then(text);
                e.message = err.get("message").and_then(message_text);
                e.param = err.get("param").and_then(text);
                match err.get("status") {
                    Some(Value::String(s)) if !s.is_empty() => {
                        e.google_status = Some(s.clone());
                    }
                    Some(s) => e.status = s.as_u64().and_then(|s| u16::try_from(s).ok()),
                    None => {}
                }
                e.inner_code = err
                    .get("innererror")
                    .and_then(|i| i.get("code"))
                    .and_then(text);
                if let Some(Value::Array(details)) = err.get("details") {
                    e.read_google_details(details);
                }
                e.provider = if anthropic_shape {
                    Provider::Anthropic
                } else {
                    Provider::OpenAi
                };
            }
            (None, Some(other)) if !other.is_null() => {
                e.message = message_text(other);
                e.provider = Provider::OpenAi;
            }
            _ => {
                // Flat shapes: vLLM's {"object":"error",...}, the Responses API's error event
                // {"type":"error","code","message"}, FastAPI's {"detail":...}.
                e.error_type = top.get("type").and_then(text).filter(|t| t != "error");
                e.code = top.get("code").and_then(text);
                e.param = top.get("param").and_then(text);
                e.message = top.get("message").and_then(message_text).or_else(|| {
                    match top.get("detail")? {
                        Value::Object(d) => d.get("message").and_then(text),
                        Value::Array(_) => Some("request validation failed".to_owned()),
                        d => text(d),
                    }
                });
                if top.get("object").and_then(Value::as_str) == Some("error") {
                    e.provider = Provider::OpenAi;
                }
            }
        }
        e
    }

    /// The provider's error type (`invalid_request_error`, `overloaded_error`, ...).
    pub fn error_type(&self) -> Option<&str> {
        self.error_type.as_deref()
    }

    /// The provider's error code (`insufficient_quota`, `context_length_exceeded`, `"429"`).
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The message, or the text summary of a non-JSON body.
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }

    /// OpenAI's `param`.
    pub fn param(&self) -> Option<&str> {
        self.param.as_deref()
    }

    /// Azure OpenAI's `innererror.code` (`ResponsibleAIPolicyViolation`).
    pub fn inner_code(&self) -> Option<&str> {
        self.inner_code.as_deref()
    }

    /// Anthropic's body `request_id`.
    pub fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }

    /// The HTTP status the error object names in a numeric `status` field (Azure OpenAI and
    /// some routers put one there), which may differ from the response's own status.
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// The delay a `google.rpc.RetryInfo` in the error's `details` asks for (Gemini's 429s:
    /// `{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "33s"}`).
    pub fn retry_delay(&self) -> Option<Duration> {
        self.retry_delay
    }

    /// Whether a `google.rpc.QuotaFailure` in the error's `details` names a per-day quota
    /// (Gemini's `quotaId` `GenerateRequestsPerDayPerProjectPerModel-FreeTier`, say): it does
    /// not come back until the day turns, whatever delay the error suggests.
    pub fn daily_quota(&self) -> bool {
        self.daily_quota
    }

    /// Google's `google.rpc.ErrorInfo` reason (`API_KEY_INVALID`: Gemini answers a bad key with a
    /// `400 INVALID_ARGUMENT` that only this names).
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// Reads Google's error details: the retry delay, whether a per-day quota ran out, and the
    /// error info's reason. Other entries (help links) and malformed ones are skipped.
    fn read_google_details(&mut self, details: &[Value]) {
        for d in details {
            let kind = d.get("@type").and_then(Value::as_str).unwrap_or("");
            if kind.ends_with("google.rpc.RetryInfo") {
                // A protobuf `Duration` in JSON ("33s", "1.250s") is a Go duration in seconds,
                // its unit required: read as every hint is, clamped to a day.
                self.retry_delay = d
                    .get("retryDelay")
                    .and_then(Value::as_str)
                    .filter(|s| s.ends_with('s'))
                    .and_then(crate::hints::parse_go_duration);
            } else if kind.ends_with("google.rpc.QuotaFailure") {
                let per_day = |v: &Value| {
                    ["quotaId", "quotaMetric"].iter().any(|k| {
                        v.get(k)
                            .and_then(Value::as_str)
                            .is_some_and(|s| s.contains("PerDay") || s.contains("per_day"))
                    })
                };
                if let Some(Value::Array(vs)) = d.get("violations") {
                    self.daily_quota |= vs.iter().any(per_day);
                }
            } else if kind.ends_with("google.rpc.ErrorInfo") && self.reason.is_none() {
                self.reason = d.get("reason").and_then(text);
            }
        }
    }

    /// Which wire format the body looked like.
    pub fn provider(&self) -> Provider {
        self.provider
    }

    /// Whether the body was valid JSON.
    pub fn is_json(&self) -> bool {
        self.json
    }

    /// Whether nothing at all was found.
    pub fn is_empty(&self) -> bool {
        self.error_type.is_none() && self.code.is_none() && self.message.is_none()
    }

    /// The type, code, inner code, Google's status name and reason, for matching names.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        [
            &self.error_type,
            &self.code,
            &self.inner_code,
            &self.google_status,
            &self.reason,
        ]
        .into_iter()
        .filter_map(|s| s.as_deref())
    }
}

fn guess_provider(body: &[u8]) -> Provider {
    let has = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
    if has(b"\"request_id\"") || has(b"_error\"") && has(b"\"type\":\"error\"") {
        Provider::Anthropic
    } else if has(b"\"error\"") {
        Provider::OpenAi
    } else {
        Provider::Unknown
    }
}

/// Finds the first `"key": "value"` in (possibly truncated) JSON and decodes the value.
pub(crate) fn string_field(body: &[u8], key: &str) -> Option<String> {
    let start = value_start(body, key, b'"')?;
    let mut de = serde_json::Deserializer::from_slice(&body[start..]).into_iter::<String>();
    de.next()?.ok().filter(|s| !s.is_empty())
}

/// Finds `"key"` followed by `:` and a value starting with `open`; returns the value's offset.
/// Keys inside JSON strings are escaped (`\"key\"`), so a match preceded by a backslash is
/// skipped.
pub(crate) fn value_start(body: &[u8], key: &str, open: u8) -> Option<usize> {
    find_key(body, key, open, false)
}

/// Like [`value_start`], for the last occurrence.
pub(crate) fn last_value_start(body: &[u8], key: &str, open: u8) -> Option<usize> {
    find_key(body, key, open, true)
}

fn find_key(body: &[u8], key: &str, open: u8, last: bool) -> Option<usize> {
    let k = key.as_bytes();
    let n = k.len() + 2;
    if body.len() < n {
        return None;
    }
    let check = |i: usize| -> Option<usize> {
        let w = &body[i..i + n];
        if w[0] != b'"' || w[n - 1] != b'"' || &w[1..n - 1] != k {
            return None;
        }
        if i > 0 && body[i - 1] == b'\\' {
            return None;
        }
        let mut j = i + n;
        while body.get(j)?.is_ascii_whitespace() {
            j += 1;
        }
        if body[j] != b':' {
            return None;
        }
        j += 1;
        while body.get(j)?.is_ascii_whitespace() {
            j += 1;
        }
        (body[j] == open).then_some(j)
    };
    let range = 0..=body.len() - n;
    if last {
        range.rev().find_map(check)
    } else {
        range.into_iter().find_map(check)
    }
}

/// A one-line summary of a non-JSON body: an HTML page's `<title>`, else the first characters
/// of the text with whitespace collapsed.
fn summarize_text(text: &str) -> String {
    let mut end = text.len().min(4096);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let head = &text[..end];
    // ASCII lowering keeps byte offsets, so they index `head` too.
    let lower = head.to_ascii_lowercase();
    if lower.trim_start().starts_with('<') || lower.contains("<html") {
        if let (Some(a), Some(b)) = (lower.find("<title>"), lower.find("</title>")) {
            let start = a + "<title>".len();
            if b > start {
                let title = collapse(&head[start..b]);
                if !title.is_empty() {
                    return format!("non-JSON (HTML) error body: {title}");
                }
            }
        }
        return "non-JSON (HTML) error body".to_owned();
    }
    let c = collapse(text);
    if c.is_empty() {
        return String::new();
    }
    format!("non-JSON error body: {c}")
}

/// `text` on one line, control characters dropped, cut at [`MAX_TEXT`] characters.
///
/// Credentials are [redacted](seawall_core::redact) before the cut: a key that the cut would
/// split keeps too little of its shape to be recognised afterwards (`...desk-proj-AbCd…`), and
/// its first characters would be shown.
fn collapse(text: &str) -> String {
    let text = seawall_core::redact(text);
    let mut out = String::new();
    for word in text.split_whitespace() {
        if out.chars().count() >= MAX_TEXT {
            break;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.extend(word.chars().filter(|c| !c.is_control()));
    }
    if out.chars().count() > MAX_TEXT {
        out = out.chars().take(MAX_TEXT).collect();
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_shape() {
        let e = ProviderError::parse(
            br#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
        );
        assert_eq!(e.error_type(), Some("insufficient_quota"));
        assert_eq!(e.code(), Some("insufficient_quota"));
        assert_eq!(e.param(), None);
        assert_eq!(e.provider(), Provider::OpenAi);
        assert!(e.is_json());
    }

    #[test]
    fn azure_and_vllm_shapes() {
        let e = ProviderError::parse(
            br#"{"error":{"message":"filtered","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation"}}}"#,
        );
        assert_eq!(e.code(), Some("content_filter"));
        assert_eq!(e.inner_code(), Some("ResponsibleAIPolicyViolation"));
        assert_eq!(e.param(), Some("prompt"));
        let e = ProviderError::parse(
            br#"{"object":"error","message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","param":null,"code":400}"#,
        );
        assert_eq!(e.error_type(), Some("BadRequestError"));
        assert_eq!(e.code(), Some("400"));
        let e = ProviderError::parse(br#"[{"error":{"code":429,"message":"slow down"}}]"#);
        assert_eq!(e.code(), Some("429"));
        let e = ProviderError::parse(br#"{"error":"model 'x' not found"}"#);
        assert_eq!(e.message(), Some("model 'x' not found"));
        let e = ProviderError::parse(br#"{"detail":"Not Found"}"#);
        assert_eq!(e.message(), Some("Not Found"));
    }

    #[test]
    fn truncated_json_keeps_leading_fields() {
        let mut body =
            br#"{"error":{"message":"boom","type":"server_error","code":null,"extra":""#.to_vec();
        body.extend(std::iter::repeat_n(b'x', 1000));
        let e = ProviderError::parse(&body);
        assert_eq!(e.error_type(), Some("server_error"));
        assert_eq!(e.message(), Some("boom"));
        assert!(!e.is_json());
    }

    #[test]
    fn html_text_and_empty() {
        let e = ProviderError::parse(
            b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>",
        );
        assert_eq!(
            e.message(),
            Some("non-JSON (HTML) error body: 502 Bad Gateway")
        );
        let e = ProviderError::parse(b"upstream connect error or disconnect/reset before headers");
        assert!(
            e.message()
                .unwrap()
                .starts_with("non-JSON error body: upstream")
        );
        assert!(ProviderError::parse(b"  \n ").is_empty());
        let e = ProviderError::parse(b"\xff\xfe\x00bad\xc3");
        assert!(e.message().unwrap().contains("bad"));
    }

    #[test]
    fn debug_redacts_keys() {
        let e = ProviderError::parse(
            br#"{"error":{"message":"Incorrect API key provided: sk-proj-abcdef123456","code":"invalid_api_key"}}"#,
        );
        assert!(!format!("{e:?}").contains("abcdef123456"));
    }

    #[test]
    fn debug_redacts_a_key_in_any_field() {
        let e = ProviderError::parse(
            br#"{"error":{"message":"m","type":"sk-proj-TypeSecret0123456789ab","param":"sk-proj-ParamSecret0123456789","code":"sk-proj-CodeSecret0123456789ab","innererror":{"code":"sk-proj-InnerSecret012345678"}},"request_id":"sk-proj-IdSecret0123456789abc"}"#,
        );
        let shown = format!("{e:?}");
        for secret in [
            "TypeSecret",
            "ParamSecret",
            "CodeSecret",
            "InnerSecret",
            "IdSecret",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert_eq!(e.param(), Some("sk-proj-ParamSecret0123456789"));
    }

    /// Text that, after `shift` characters of its own, is cut at [`MAX_TEXT`] characters,
    /// with a key glued to a word (`desk-proj-...`, as a concatenated message leaves one)
    /// starting `before_cut` characters before the cut.
    fn key_across_the_cut(shift: usize, before_cut: usize) -> String {
        let secret = "sk-proj-GluedSecret0123456789abcdefghij";
        let lead = MAX_TEXT - shift - before_cut - " de".len();
        format!("{} de{secret} {}", "x".repeat(lead), "tail ".repeat(40))
    }

    #[test]
    fn a_key_the_length_limit_would_cut_is_redacted_whole() {
        for before_cut in [10, 16, 20, 27] {
            // Plain text, a list of strings joined, and an object's JSON: each cut at 200.
            let bodies = [
                key_across_the_cut(0, before_cut).into_bytes(),
                serde_json::json!({"error": {"message": [key_across_the_cut(0, before_cut), "more"]}})
                    .to_string()
                    .into_bytes(),
                serde_json::json!({"error": {"message": {"msg": key_across_the_cut(r#"{"msg":""#.len(), before_cut)}}})
                    .to_string()
                    .into_bytes(),
            ];
            for body in bodies {
                let e = ProviderError::parse(&body);
                let message = e.message().unwrap_or_default();
                // Still cut, and at the limit.
                assert!(message.ends_with('…'), "{message}");
                assert!(message.chars().count() <= "non-JSON error body: ".len() + MAX_TEXT + 1);
                assert!(!message.contains("GluedSecre"), "{before_cut}: {message}");
                let error = seawall_core::LlmError::new(
                    seawall_core::FailureClass::InvalidRequest,
                    message,
                );
                assert!(!format!("{error} {error:?}").contains("GluedSecre"));
            }
        }
    }

    #[test]
    fn key_search_skips_escaped_keys() {
        let body = br#"{"content":"say \"model\": \"fake\"","model":"real"}"#;
        let at = value_start(body, "model", b'"').unwrap();
        assert_eq!(&body[at..at + 6], br#""real""#);
        assert_eq!(string_field(body, "model").as_deref(), Some("real"));
        assert_eq!(string_field(b"\"model\"", "model"), None);
        assert_eq!(string_field(b"\"model\" :", "model"), None);
    }
}
