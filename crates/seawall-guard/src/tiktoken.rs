//! [`TiktokenEstimate`]: exact prompt counts for OpenAI models (the `tiktoken` feature).

use bytes::Bytes;
use http::Request;
use seawall_core::{LlmRequest, PROMPT_FIELDS, PartEstimate};
use serde_json::Value;

use crate::estimate::{CharEstimate, TokenEstimator};

/// OpenAI's chat framing, as OpenAI's cookbook counts it: 3 tokens per message, and 3 that
/// prime the reply.
const PER_MESSAGE: u64 = 3;
const REPLY_PRIMING: u64 = 3;

/// Counts the prompt's text with the model's own tiktoken encoding (`o200k_base` for the
/// GPT-4o, GPT-4.1, GPT-5 and o-series families, `cl100k_base` for GPT-4 and GPT-3.5), plus
/// OpenAI's per-message framing; images, audio and files at a [`PartEstimate`]. Models
/// tiktoken does not know (Claude, Gemini, DeepSeek, ...) get the [`CharEstimate`].
///
/// Exact for the text of chat messages; tool definitions and structured-output schemas are
/// counted as the text of their strings, which is close but not OpenAI's own rendering.
/// It parses the body again and encodes every string, so it costs microseconds per kilobyte
/// of prompt where the default costs nothing (the guard's bench has both), and the first call
/// for each encoding loads it (tens of milliseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TiktokenEstimate {
    parts: PartEstimate,
}

impl TiktokenEstimate {
    /// Exact text counts; non-text parts at the default [`PartEstimate`].
    pub const fn new() -> Self {
        TiktokenEstimate {
            parts: PartEstimate::DEFAULT,
        }
    }

    /// Counts non-text parts at `parts` instead.
    pub const fn parts(mut self, parts: PartEstimate) -> Self {
        self.parts = parts;
        self
    }
}

impl TokenEstimator for TiktokenEstimate {
    fn prompt_tokens(&self, req: &Request<Bytes>) -> u64 {
        let fallback = || CharEstimate::new().parts(self.parts).prompt_tokens(req);
        let Some(bpe) = req.model().and_then(|m| tiktoken_rs::bpe_for_model(m).ok()) else {
            return fallback();
        };
        let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(req.body()) else {
            return fallback();
        };
        let mut tokens = 0u64;
        for field in PROMPT_FIELDS {
            if let Some(v) = body.get(field) {
                tokens = tokens.saturating_add(text_tokens(bpe, v));
            }
        }
        if let Some(Value::Array(messages)) = body.get("messages") {
            tokens = tokens
                .saturating_add(PER_MESSAGE.saturating_mul(messages.len() as u64))
                .saturating_add(REPLY_PRIMING);
        }
        tokens.saturating_add(self.parts.tokens(&req.media_parts()))
    }
}

/// The tokens of every string in `v`, skipping the non-text parts (their base64 data and URLs
/// are not prose; the part estimate counts them).
fn text_tokens(bpe: &tiktoken_rs::CoreBPE, v: &Value) -> u64 {
    match v {
        Value::String(s) => bpe.count_ordinary(s) as u64,
        Value::Array(a) => a.iter().map(|e| text_tokens(bpe, e)).sum(),
        Value::Object(o) => {
            let media = match o.get("type").and_then(Value::as_str) {
                Some(
                    "image_url" | "input_image" | "image" | "input_audio" | "file" | "input_file",
                ) => true,
                Some("document") => {
                    o.get("source")
                        .and_then(|s| s.get("type"))
                        .and_then(Value::as_str)
                        != Some("text")
                }
                _ => false,
            };
            if media {
                0
            } else {
                o.values().map(|e| text_tokens(bpe, e)).sum()
            }
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(body: &str) -> Request<Bytes> {
        let mut r = Request::post("https://api.openai.com/v1/chat/completions")
            .body(Bytes::from(body.to_owned()))
            .unwrap();
        r.prepare();
        r
    }

    #[test]
    fn openai_models_are_counted_with_their_encoding() {
        // "hello world" is 2 tokens in o200k_base; "user" 1; 3 per message and 3 for the reply.
        let r =
            prepared(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hello world"}]}"#);
        assert_eq!(TiktokenEstimate::new().prompt_tokens(&r), 2 + 1 + 3 + 3);
        // An image's data is not text: one part at the part estimate.
        let data = "A".repeat(10_000);
        let r = prepared(&format!(
            r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":[{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{data}"}}}}]}}]}}"#
        ));
        assert_eq!(TiktokenEstimate::new().prompt_tokens(&r), 1 + 3 + 3 + 1_600);
    }

    #[test]
    fn other_models_get_the_character_estimate() {
        let r = prepared(
            r#"{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"hello world"}]}"#,
        );
        assert_eq!(
            TiktokenEstimate::new().prompt_tokens(&r),
            CharEstimate::new().prompt_tokens(&r)
        );
    }
}
