//! The two wire formats: request parsing, error bodies, complete answers and SSE events.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::StatusCode;
use seawall_core::PROMPT_FIELDS;
use serde::Serialize;
use serde_json::Value;

use crate::rng::{FNV_START, fnv1a};

/// Which API a request speaks, from its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    OpenAi,
    Anthropic,
}

/// What the upstream needs from a request body, parsed once.
#[derive(Debug)]
pub(crate) struct ChatRequest {
    pub(crate) model: String,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) max_tokens: Option<u32>,
    /// Answers generated and billed: OpenAI's `n`, or `best_of` where larger; at least 1.
    pub(crate) choices: u32,
    pub(crate) input_tokens: u32,
    /// The request asks to go on from a partial answer (see [`Continuation`]).
    pub(crate) continuation: Option<Continuation>,
    /// Its fingerprints, when the upstream draws by request.
    pub(crate) key: Option<RequestKey>,
}

/// A request that asks the model to go on from a partial answer it gave before: the answer's
/// words so far, read from the last assistant message.
///
/// The mock's answers are a deterministic walk through a fixed list of words (the first word
/// says where the walk starts), so it can answer the remainder of the answer it would have
/// given: prefix + continuation is the uncut answer, word for word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Continuation {
    /// Words in the partial answer.
    pub(crate) words: u32,
    /// Where the partial answer's walk starts, when its first word is one of the mock's.
    pub(crate) offset: Option<u32>,
    /// Asked by an instruction (a user turn after the partial answer), not by a prefill: the
    /// mock, like a model that is only asked, repeats the last word before going on.
    pub(crate) overlap: bool,
}

impl Continuation {
    /// The index, in the answer's walk, of the first word the continuation sends.
    pub(crate) fn start(&self) -> u32 {
        self.words - u32::from(self.overlap && self.words > 0)
    }
}

/// Every way a request can fail, rendered per provider by [`Failure::render`].
#[derive(Debug)]
pub(crate) enum Failure {
    NotFound,
    MethodNotAllowed,
    BadJson,
    Missing(&'static str),
    /// A request the API refuses as invalid, with its message.
    Invalid(&'static str),
    InvalidKey,
    ContextLength {
        window: u32,
        tokens: u32,
    },
    Quota,
    RateLimited(RateLimited),
    /// One request over the key's whole tokens per minute: OpenAI refuses it with a 429 that
    /// no wait lifts.
    TooLarge {
        limit: u32,
        requested: u64,
    },
    Server(u16),
}

#[derive(Debug)]
pub(crate) struct RateLimited {
    pub(crate) tokens: bool,
    pub(crate) limit: u32,
    pub(crate) used: u64,
    pub(crate) requested: u64,
    pub(crate) wait: Duration,
}

impl Failure {
    pub(crate) fn status(&self, wire: Wire) -> StatusCode {
        let code = match self {
            Failure::NotFound => 404,
            Failure::MethodNotAllowed => 405,
            Failure::BadJson
            | Failure::Missing(_)
            | Failure::Invalid(_)
            | Failure::ContextLength { .. } => 400,
            Failure::InvalidKey => 401,
            Failure::Quota if wire == Wire::Anthropic => 400,
            Failure::Quota | Failure::RateLimited(_) | Failure::TooLarge { .. } => 429,
            Failure::Server(s) => *s,
        };
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The provider's JSON error body, fields in the providers' order.
    pub(crate) fn render(&self, wire: Wire, model: &str, request_id: &str) -> Bytes {
        let text = match wire {
            Wire::OpenAi => {
                let (message, kind, param, code) = self.openai(model);
                serde_json::to_string(&OpenAiError {
                    error: OpenAiErrorBody {
                        message: &message,
                        kind,
                        param,
                        code,
                    },
                })
            }
            Wire::Anthropic => {
                let (kind, message) = self.anthropic();
                serde_json::to_string(&AnthropicError {
                    kind: "error",
                    error: AnthropicErrorBody {
                        kind,
                        message: &message,
                    },
                    request_id,
                })
            }
        };
        Bytes::from(text.unwrap_or_default())
    }

    fn openai(
        &self,
        model: &str,
    ) -> (
        String,
        &'static str,
        Option<&'static str>,
        Option<&'static str>,
    ) {
        match self {
            Failure::NotFound => ("Invalid URL.".into(), "invalid_request_error", None, None),
            Failure::MethodNotAllowed => {
                ("Method not allowed.".into(), "invalid_request_error", None, None)
            }
            Failure::BadJson => (
                "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)".into(),
                "invalid_request_error",
                None,
                None,
            ),
            Failure::Missing(field) => (
                format!("you must provide a {field} parameter"),
                "invalid_request_error",
                Some(field),
                None,
            ),
            Failure::Invalid(message) => {
                ((*message).into(), "invalid_request_error", None, None)
            }
            Failure::InvalidKey => (
                "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.".into(),
                "invalid_request_error",
                None,
                Some("invalid_api_key"),
            ),
            Failure::ContextLength { window, tokens } => (
                format!(
                    "This model's maximum context length is {window} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages."
                ),
                "invalid_request_error",
                Some("messages"),
                Some("context_length_exceeded"),
            ),
            Failure::Quota => (
                "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.".into(),
                "insufficient_quota",
                None,
                Some("insufficient_quota"),
            ),
            Failure::RateLimited(r) => {
                let what = if r.tokens {
                    "tokens per min (TPM)"
                } else {
                    "requests per min (RPM)"
                };
                (
                    format!(
                        "Rate limit reached for {model} in organization org-seawall-mock on {what}: Limit {}, Used {}, Requested {}. Please try again in {}. Visit https://platform.openai.com/account/rate-limits to learn more.",
                        r.limit,
                        r.used,
                        r.requested,
                        go_duration(r.wait)
                    ),
                    if r.tokens { "tokens" } else { "requests" },
                    None,
                    Some("rate_limit_exceeded"),
                )
            }
            Failure::TooLarge { limit, requested } => (
                format!(
                    "Request too large for {model} in organization org-seawall-mock on tokens per min (TPM): Limit {limit}, Requested {requested}. The input or output tokens must be reduced in order to run successfully. Visit https://platform.openai.com/account/rate-limits to learn more."
                ),
                "tokens",
                None,
                Some("rate_limit_exceeded"),
            ),
            Failure::Server(s) => {
                let message = match s {
                    500 => "The server had an error while processing your request. Sorry about that!",
                    502 => "Bad gateway.",
                    503 => "The server is overloaded or not ready yet.",
                    504 => "Gateway timeout.",
                    529 => "The server is overloaded.",
                    _ => "The upstream failed.",
                };
                let kind = if *s == 504 { "timeout_error" } else { "server_error" };
                (message.into(), kind, None, None)
            }
        }
    }

    fn anthropic(&self) -> (&'static str, String) {
        match self {
            Failure::NotFound => ("not_found_error", "Not found".into()),
            Failure::MethodNotAllowed => ("invalid_request_error", "Method not allowed".into()),
            Failure::BadJson => (
                "invalid_request_error",
                "The request body is not valid JSON".into(),
            ),
            Failure::Missing(field) => ("invalid_request_error", format!("{field}: Field required")),
            Failure::Invalid(message) => ("invalid_request_error", (*message).into()),
            Failure::InvalidKey => ("authentication_error", "invalid x-api-key".into()),
            Failure::ContextLength { window, tokens } => (
                "invalid_request_error",
                format!("prompt is too long: {tokens} tokens > {window} maximum"),
            ),
            Failure::Quota => (
                "invalid_request_error",
                "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.".into(),
            ),
            Failure::RateLimited(r) => {
                let what = if r.tokens { "tokens" } else { "requests" };
                (
                    "rate_limit_error",
                    format!(
                        "This request would exceed your organization's rate limit of {} {what} per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response headers for current usage.",
                        r.limit
                    ),
                )
            }
            // Not sent on this wire (its requests over the limit wait for a full bucket).
            Failure::TooLarge { limit, .. } => (
                "rate_limit_error",
                format!(
                    "This request would exceed your organization's rate limit of {limit} tokens per minute."
                ),
            ),
            Failure::Server(s) => match s {
                529 => ("overloaded_error", "Overloaded".into()),
                504 => ("timeout_error", "Request timed out".into()),
                502 => ("api_error", "Bad gateway".into()),
                503 => ("api_error", "Service unavailable".into()),
                _ => ("api_error", "Internal server error".into()),
            },
        }
    }
}

#[derive(Serialize)]
struct OpenAiError<'a> {
    error: OpenAiErrorBody<'a>,
}

#[derive(Serialize)]
struct OpenAiErrorBody<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

#[derive(Serialize)]
struct AnthropicError<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    error: AnthropicErrorBody<'a>,
    request_id: &'a str,
}

#[derive(Serialize)]
struct AnthropicErrorBody<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    message: &'a str,
}

/// A proxy's HTML error page, as a CDN sends it when the origin is down.
pub(crate) const HTML_502: &str = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>cloudflare</center>\r\n</body>\r\n</html>\r\n";

/// Fingerprints of what a chat request asks, whatever other fields (streaming, options) ride
/// along: its prompt fields, and those with its model.
fn request_key(map: &serde_json::Map<String, Value>) -> RequestKey {
    let mut prompt = FNV_START;
    for k in PROMPT_FIELDS {
        if let Some(v) = map.get(k) {
            prompt = fnv1a(prompt, k.as_bytes());
            prompt = fnv1a(prompt, v.to_string().as_bytes());
        }
    }
    let model = map.get("model").map(Value::to_string).unwrap_or_default();
    RequestKey {
        prompt,
        call: fnv1a(prompt, model.as_bytes()),
    }
}

/// A request's fingerprints.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestKey {
    /// The prompt alone: the same at every model and provider.
    pub(crate) prompt: u64,
    /// The prompt and the model.
    pub(crate) call: u64,
}

/// Parses a chat request, with its fingerprints when `keyed` ([`Draws::Request`]). `Err` is
/// the 400 to send.
///
/// [`Draws::Request`]: crate::Draws::Request
pub(crate) fn parse_request(wire: Wire, body: &[u8], keyed: bool) -> Result<ChatRequest, Failure> {
    let value: Value = serde_json::from_slice(body).map_err(|_| Failure::BadJson)?;
    let Value::Object(map) = &value else {
        return Err(Failure::BadJson);
    };
    let model = map
        .get("model")
        .and_then(Value::as_str)
        .ok_or(Failure::Missing("model"))?
        .to_owned();
    let Some(Value::Array(messages)) = map.get("messages") else {
        return Err(Failure::Missing("messages"));
    };
    let continuation = continuation(wire, map, messages)?;
    let max_tokens = ["max_tokens", "max_completion_tokens"]
        .iter()
        .find_map(|k| map.get(*k).and_then(Value::as_u64))
        .map(|n| n.min(u64::from(u32::MAX)) as u32);
    if wire == Wire::Anthropic && max_tokens.is_none() {
        return Err(Failure::Missing("max_tokens"));
    }
    let choices = ["n", "best_of"]
        .iter()
        .filter_map(|k| map.get(*k).and_then(Value::as_u64))
        .max()
        .map_or(1, |n| n.clamp(1, u64::from(u32::MAX)) as u32);
    let stream = map.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = map
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    // The estimate seawall-core's RequestMeta makes: characters / 4, plus 4 per text part.
    let (mut chars, mut parts) = (0usize, 0usize);
    for (k, v) in map {
        if PROMPT_FIELDS.contains(&k.as_str()) {
            count_text(v, &mut chars, &mut parts);
        }
    }
    let input_tokens = (chars.div_ceil(4) + 4 * parts).min(u32::MAX as usize) as u32;
    let key = keyed.then(|| request_key(map));
    Ok(ChatRequest {
        model,
        stream,
        include_usage,
        max_tokens,
        choices,
        input_tokens,
        continuation,
        key,
    })
}

/// What Anthropic answers to a prefill that ends in whitespace.
pub(crate) const TRAILING_WHITESPACE: &str =
    "messages: final assistant content cannot end with trailing whitespace";

/// What vLLM answers when `continue_final_message` is asked with the default
/// `add_generation_prompt: true`.
pub(crate) const BOTH_PROMPTS: &str =
    "Cannot set both `continue_final_message` and `add_generation_prompt` to True.";

/// Whether the request asks to go on from a partial answer, and how:
///
/// - Anthropic: the last message is the assistant's (a prefill); one ending in whitespace is
///   refused, as Anthropic does;
/// - OpenAI wire: the last message is the assistant's with `"prefix": true` (DeepSeek,
///   Mistral), or the body says `"continue_final_message": true` (vLLM; refused unless
///   `"add_generation_prompt": false`, as vLLM does);
/// - OpenAI wire, by instruction: a user message saying "continue" right after an assistant
///   message. The mock then repeats the partial answer's last word before going on, as a model
///   that is only asked may do, so a client's overlap trimming is exercised.
///
/// An assistant message last without any of these is answered as a new turn, like OpenAI.
fn continuation(
    wire: Wire,
    map: &serde_json::Map<String, Value>,
    messages: &[Value],
) -> Result<Option<Continuation>, Failure> {
    fn role(m: &Value) -> &str {
        m.get("role").and_then(Value::as_str).unwrap_or("")
    }
    let Some(last) = messages.last() else {
        return Ok(None);
    };
    let (partial, overlap) = match (wire, role(last)) {
        (Wire::Anthropic, "assistant") => {
            let text = message_text(last);
            if text.ends_with(char::is_whitespace) {
                return Err(Failure::Invalid(TRAILING_WHITESPACE));
            }
            (text, false)
        }
        (Wire::OpenAi, "assistant") => {
            let prefix = last.get("prefix").and_then(Value::as_bool) == Some(true);
            let flag = |k: &str| map.get(k).and_then(Value::as_bool);
            if !prefix && flag("continue_final_message") != Some(true) {
                return Ok(None);
            }
            if !prefix && flag("add_generation_prompt") != Some(false) {
                return Err(Failure::Invalid(BOTH_PROMPTS));
            }
            (message_text(last), false)
        }
        (Wire::OpenAi, "user") if messages.len() >= 2 => {
            let before = &messages[messages.len() - 2];
            let asks = message_text(last).to_ascii_lowercase().contains("continue");
            if role(before) != "assistant" || !asks {
                return Ok(None);
            }
            (message_text(before), true)
        }
        _ => return Ok(None),
    };
    let mut words = partial.split_whitespace();
    let Some(first) = words.next() else {
        return Ok(None);
    };
    let count = u32::try_from(words.count() + 1).unwrap_or(u32::MAX - 1);
    let offset = WORDS.iter().position(|w| *w == first).map(|i| i as u32);
    Ok(Some(Continuation {
        words: count,
        offset,
        overlap,
    }))
}

/// A message's text: its `content` string, or its text blocks joined.
fn message_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

fn count_text(v: &Value, chars: &mut usize, parts: &mut usize) {
    match v {
        Value::String(s) => {
            *chars += s.chars().count();
            *parts += 1;
        }
        Value::Array(a) => a.iter().for_each(|v| count_text(v, chars, parts)),
        Value::Object(o) => o.values().for_each(|v| count_text(v, chars, parts)),
        _ => {}
    }
}

const WORDS: [&str; 32] = [
    "the", "storm", "passes", "over", "a", "quiet", "harbor", "and", "every", "wave", "breaks",
    "on", "stone", "while", "ships", "wait", "for", "calm", "water", "under", "grey", "clouds",
    "near", "old", "lights", "that", "guide", "them", "home", "through", "long", "nights",
];

/// The text of token `i` of an answer whose words start at `offset`.
///
/// Token 0 is `WORDS[offset]`, so a continuation finds its answer's walk again from the first
/// word it is shown; later tokens step by a SplitMix64 draw of their index, so the text never
/// repeats itself with a short period. A periodic text would let a continuation's overlap
/// (the tail the model says again) match a whole period further back than it really is, and
/// trim words that were never delivered.
pub(crate) fn token_text(offset: u32, i: u32) -> &'static str {
    let step = if i == 0 {
        0
    } else {
        crate::rng::Rng::new(u64::from(i)).next_u64() as usize
    };
    WORDS[(offset as usize).wrapping_add(step) % WORDS.len()]
}

/// `finish_reason` / `stop_reason`.
pub(crate) fn finish_reason(wire: Wire, truncated: bool) -> &'static str {
    match (wire, truncated) {
        (Wire::OpenAi, false) => "stop",
        (Wire::OpenAi, true) => "length",
        (Wire::Anthropic, false) => "end_turn",
        (Wire::Anthropic, true) => "max_tokens",
    }
}

/// Facts shared by every body of one answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) wire: Wire,
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) input_tokens: u32,
    /// Tokens of each answer (the body carries one; usage bills all of them).
    pub(crate) output_tokens: u32,
    /// How many answers were generated and billed.
    pub(crate) choices: u32,
    pub(crate) truncated: bool,
    pub(crate) word_offset: u32,
    /// The index in the walk of the first word sent (past 0 for a continuation).
    pub(crate) first_word: u32,
    /// The first word sent has a space before it (it continues a prefill).
    pub(crate) lead_first: bool,
}

impl Answer {
    /// The output tokens billed for `tokens` of each answer: every answer is billed.
    pub(crate) fn billed_output(&self, tokens: u32) -> u64 {
        u64::from(tokens) * u64::from(self.choices)
    }

    /// Token `i` of this answer: the space before it and its word.
    pub(crate) fn token(&self, i: u32) -> (&'static str, &'static str) {
        let lead = if i > 0 || self.lead_first { " " } else { "" };
        (lead, token_text(self.word_offset, self.first_word + i))
    }

    /// The whole text of this answer.
    pub(crate) fn text(&self) -> String {
        let mut s = String::with_capacity(self.output_tokens as usize * 7);
        for i in 0..self.output_tokens {
            let (lead, word) = self.token(i);
            s.push_str(lead);
            s.push_str(word);
        }
        s
    }

    /// The complete (non-streamed) JSON answer, fields in the providers' order.
    pub(crate) fn complete_json(&self) -> Bytes {
        let text = self.text();
        let reason = finish_reason(self.wire, self.truncated);
        let (i, o) = (self.input_tokens, self.billed_output(self.output_tokens));
        let mut out = String::with_capacity(256 + text.len() + self.model.len());
        let model = Value::from(self.model.as_str());
        let text = Value::from(text);
        let _ = match self.wire {
            Wire::OpenAi => write!(
                out,
                "{{\"id\":\"{}\",\"object\":\"chat.completion\",\"created\":{},\"model\":{model},\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":{text},\"refusal\":null}},\"logprobs\":null,\"finish_reason\":\"{reason}\"}}],\"usage\":{{\"prompt_tokens\":{i},\"completion_tokens\":{o},\"total_tokens\":{}}},\"system_fingerprint\":null}}",
                self.id,
                self.created,
                u64::from(i) + o
            ),
            Wire::Anthropic => write!(
                out,
                "{{\"id\":\"{}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":{model},\"content\":[{{\"type\":\"text\",\"text\":{text}}}],\"stop_reason\":\"{reason}\",\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{i},\"output_tokens\":{o}}}}}",
                self.id
            ),
        };
        Bytes::from(out)
    }

    /// A complete answer with nothing in it (usage: the prompt, no output).
    pub(crate) fn empty_json(&self) -> Bytes {
        let i = self.input_tokens;
        let model = Value::from(self.model.as_str());
        Bytes::from(match self.wire {
            Wire::OpenAi => format!(
                "{{\"id\":\"{}\",\"object\":\"chat.completion\",\"created\":{},\"model\":{model},\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null}},\"logprobs\":null,\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":{i},\"completion_tokens\":0,\"total_tokens\":{i}}}}}",
                self.id, self.created
            ),
            Wire::Anthropic => format!(
                "{{\"id\":\"{}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":{model},\"content\":[],\"stop_reason\":\"end_turn\",\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{i},\"output_tokens\":0}}}}",
                self.id
            ),
        })
    }

    /// A stream with nothing in it: the opening event, the finish reason, the finish marker.
    pub(crate) fn empty_stream(&self) -> Bytes {
        let mut buf = BytesMut::new();
        match self.wire {
            Wire::OpenAi => {
                let prefix = self.openai_chunk_prefix();
                put_openai_choice(
                    &mut buf,
                    &prefix,
                    "{\"role\":\"assistant\",\"content\":\"\"}",
                    "null",
                    false,
                );
                put_openai_choice(&mut buf, &prefix, "{}", "\"stop\"", false);
                buf.put_slice(OPENAI_DONE);
            }
            Wire::Anthropic => {
                buf.put_slice(&self.anthropic_message_start());
                let _ = write!(
                    ByteWriter(&mut buf),
                    "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":0}}}}\n\n"
                );
                buf.put_slice(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
            }
        }
        buf.freeze()
    }

    /// An error object in a 200: a whole JSON body, or the first event of a stream.
    pub(crate) fn error_200(&self, stream: bool) -> Bytes {
        let object: &[u8] = match self.wire {
            Wire::OpenAi => OPENAI_ERROR_OBJECT,
            Wire::Anthropic => ANTHROPIC_ERROR_OBJECT,
        };
        if !stream {
            return Bytes::from_static(object);
        }
        let mut buf = BytesMut::new();
        if self.wire == Wire::Anthropic {
            buf.put_slice(b"event: error\n");
        }
        buf.put_slice(b"data: ");
        buf.put_slice(object);
        buf.put_slice(b"\n\n");
        buf.freeze()
    }

    /// The start of every OpenAI chunk, up to the `choices` key: `data: {"id":...,"model":...,`.
    pub(crate) fn openai_chunk_prefix(&self) -> Bytes {
        let mut s = String::with_capacity(96 + self.model.len());
        let _ = write!(
            s,
            "data: {{\"id\":\"{}\",\"object\":\"chat.completion.chunk\",\"created\":{},\"model\":{},\"system_fingerprint\":null,",
            self.id,
            self.created,
            Value::from(self.model.as_str())
        );
        Bytes::from(s)
    }

    pub(crate) fn anthropic_message_start(&self) -> Bytes {
        Bytes::from(format!(
            "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"{}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":{},\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{},\"output_tokens\":1}}}}}}\n\n",
            self.id,
            Value::from(self.model.as_str()),
            self.input_tokens
        ))
    }
}

/// Appends one OpenAI chunk whose choice has `delta` (raw JSON) and `finish_reason` (raw JSON).
pub(crate) fn put_openai_choice(
    buf: &mut BytesMut,
    prefix: &[u8],
    delta: &str,
    finish: &str,
    usage_null: bool,
) {
    buf.put_slice(prefix);
    buf.put_slice(b"\"choices\":[{\"index\":0,\"delta\":");
    buf.put_slice(delta.as_bytes());
    buf.put_slice(b",\"logprobs\":null,\"finish_reason\":");
    buf.put_slice(finish.as_bytes());
    buf.put_slice(if usage_null {
        b"}],\"usage\":null}\n\n"
    } else {
        b"}]}\n\n"
    });
}

pub(crate) fn put_openai_content(
    buf: &mut BytesMut,
    prefix: &[u8],
    lead: &str,
    text: &str,
    usage_null: bool,
) {
    buf.put_slice(prefix);
    buf.put_slice(b"\"choices\":[{\"index\":0,\"delta\":{\"content\":\"");
    buf.put_slice(lead.as_bytes());
    buf.put_slice(text.as_bytes());
    buf.put_slice(b"\"},\"logprobs\":null,\"finish_reason\":null}]");
    buf.put_slice(if usage_null {
        b",\"usage\":null}\n\n"
    } else {
        b"}\n\n"
    });
}

pub(crate) fn put_openai_usage(buf: &mut BytesMut, prefix: &[u8], input: u32, output: u64) {
    buf.put_slice(prefix);
    let _ = write!(
        ByteWriter(buf),
        "\"choices\":[],\"usage\":{{\"prompt_tokens\":{input},\"completion_tokens\":{output},\"total_tokens\":{}}}}}\n\n",
        u64::from(input) + output
    );
}

pub(crate) const OPENAI_DONE: &[u8] = b"data: [DONE]\n\n";

/// What an OpenAI-compatible router sends in a 200 when its provider failed.
const OPENAI_ERROR_OBJECT: &[u8] = b"{\"error\":{\"message\":\"Upstream provider is overloaded\",\"code\":503,\"metadata\":{\"provider_name\":\"mock\"}}}";

const ANTHROPIC_ERROR_OBJECT: &[u8] =
    b"{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}";

pub(crate) const OPENAI_STREAM_ERROR: &[u8] = b"data: {\"error\":{\"message\":\"The server had an error while processing your request. Sorry about that!\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n";

pub(crate) const ANTHROPIC_BLOCK_START: &[u8] = b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";

pub(crate) fn put_anthropic_delta(buf: &mut BytesMut, lead: &str, text: &str) {
    buf.put_slice(b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"");
    buf.put_slice(lead.as_bytes());
    buf.put_slice(text.as_bytes());
    buf.put_slice(b"\"}}\n\n");
}

pub(crate) fn put_anthropic_end(buf: &mut BytesMut, stop_reason: &str, output: u64) {
    buf.put_slice(
        b"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    );
    let _ = write!(
        ByteWriter(buf),
        "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{stop_reason}\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{output}}}}}\n\n"
    );
    buf.put_slice(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
}

pub(crate) const ANTHROPIC_STREAM_ERROR: &[u8] = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";

pub(crate) const ANTHROPIC_PING: &[u8] = b"event: ping\ndata: {\"type\":\"ping\"}\n\n";

pub(crate) const COMMENT_KEEPALIVE: &[u8] = b": keep-alive\n\n";

pub(crate) const BLANK_KEEPALIVE: &[u8] = b"\n";

struct ByteWriter<'a>(&'a mut BytesMut);

impl std::fmt::Write for ByteWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.put_slice(s.as_bytes());
        Ok(())
    }
}

/// A Go `time.Duration` string at millisecond resolution (rounded up), as OpenAI sends in
/// `x-ratelimit-reset-*` and in "Please try again in ...": `0s`, `12ms`, `1.5s`, `6m0s`,
/// `1h2m3s`.
pub(crate) fn go_duration(d: Duration) -> String {
    let ms = d.as_nanos().div_ceil(1_000_000);
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, rem) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rem) = (rem / 60_000, rem % 60_000);
    let (s, frac) = (rem / 1000, rem % 1000);
    let mut out = String::new();
    if h > 0 {
        let _ = write!(out, "{h}h");
    }
    if h > 0 || m > 0 {
        let _ = write!(out, "{m}m");
    }
    if frac == 0 {
        let _ = write!(out, "{s}s");
    } else {
        let f = format!("{frac:03}");
        let _ = write!(out, "{s}.{}s", f.trim_end_matches('0'));
    }
    out
}

/// An RFC 3339 UTC timestamp with second resolution.
pub(crate) fn rfc3339(unix_secs: u64) -> String {
    let t = i64::try_from(unix_secs)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(Duration::ZERO), "0s");
        assert_eq!(go_duration(Duration::from_micros(11_200)), "12ms");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(1)), "1ms");
        assert_eq!(go_duration(Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(Duration::from_secs(360)), "6m0s");
        assert_eq!(go_duration(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(go_duration(Duration::from_millis(59_991)), "59.991s");
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(4_102_444_799), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn prompt_estimate_matches_core() {
        use bytes::Bytes;
        use seawall_core::LlmRequest;
        let body = r#"{"model":"m","messages":[{"role":"user","content":"Say hello to the whole wide world"}],"system":"be brief"}"#;
        let ours = parse_request(Wire::OpenAi, body.as_bytes(), false).unwrap();
        let mut req = http::Request::post("http://x/v1/chat/completions")
            .body(Bytes::from(body))
            .unwrap();
        req.prepare();
        assert_eq!(ours.input_tokens, req.estimated_input_tokens());
    }

    #[test]
    fn n_and_best_of_set_the_answers_billed() {
        let parse = |body: &str| {
            parse_request(Wire::OpenAi, body.as_bytes(), false)
                .unwrap()
                .choices
        };
        assert_eq!(parse(r#"{"model":"m","messages":[]}"#), 1);
        assert_eq!(parse(r#"{"model":"m","messages":[],"n":0}"#), 1);
        assert_eq!(parse(r#"{"model":"m","messages":[],"n":3}"#), 3);
        assert_eq!(parse(r#"{"model":"m","messages":[],"n":2,"best_of":5}"#), 5);
    }

    #[test]
    fn bad_requests() {
        assert!(matches!(
            parse_request(Wire::OpenAi, b"{not json", false),
            Err(Failure::BadJson)
        ));
        assert!(matches!(
            parse_request(Wire::OpenAi, br#"{"messages":[]}"#, false),
            Err(Failure::Missing("model"))
        ));
        assert!(matches!(
            parse_request(Wire::Anthropic, br#"{"model":"c","messages":[]}"#, false),
            Err(Failure::Missing("max_tokens"))
        ));
        let ok = parse_request(
            Wire::OpenAi,
            br#"{"model":"g","messages":[],"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":9}"#,
            false,
        )
        .unwrap();
        assert!(ok.stream && ok.include_usage);
        assert_eq!(ok.max_tokens, Some(9));
    }

    #[test]
    fn an_answers_text_has_no_short_period_and_starts_at_its_offset() {
        for offset in 0..WORDS.len() as u32 {
            assert_eq!(token_text(offset, 0), WORDS[offset as usize]);
            let text: Vec<&str> = (0..512).map(|i| token_text(offset, i)).collect();
            for period in 1..=128 {
                assert!(
                    (0..512 - period).any(|i| text[i] != text[i + period]),
                    "offset {offset}: the text repeats every {period} words"
                );
            }
        }
    }
}
