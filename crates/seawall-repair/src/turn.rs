//! Building a repair turn: the original request with the failed answer and the complaint
//! appended to its conversation.
//!
//! Both wire formats keep the conversation in a `messages` array of `{role, content}` turns
//! whose `content` may be a plain string, so one shape serves both: the previous answer as an
//! `assistant` turn, then a `user` turn with the complaint. Everything else in the body
//! (model, sampling, Anthropic's top-level `system`, tools) is left as the caller wrote it.
//!
//! Each repair turn is built from the *original* request, with only the latest answer and
//! its complaint: the prompt of the second repair is no longer than the first one's, and the
//! model is not shown a growing pile of its own mistakes.

use bytes::Bytes;
use http::Request;
use seawall_core::{LlmRequest, RequestMeta};
use serde_json::{Map, Value};

/// The placeholder the template's complaint goes in.
pub const ERROR_PLACEHOLDER: &str = "{error}";

/// The default repair message; [`ERROR_PLACEHOLDER`] is replaced by the validator's text.
pub const DEFAULT_TEMPLATE: &str = "Your previous answer could not be used: {error}\n\
     Answer again, with this fixed. Reply with the corrected answer only.";

/// The original request with `answer` (when it holds text) and the complaint appended.
///
/// The request's extensions (the call context, the deadline, an idempotency mark) come
/// along; the parsed request facts are dropped and parsed again, since the longer prompt
/// costs more input tokens (a budget or a token-rate limit must see them).
pub(crate) fn repair_request(
    original: &Request<Bytes>,
    answer: &str,
    complaint: &str,
    template: &str,
) -> Result<Request<Bytes>, &'static str> {
    let mut body: Value =
        serde_json::from_slice(original.body()).map_err(|_| "the request body is not JSON")?;
    let messages = body
        .get_mut("messages")
        .and_then(Value::as_array_mut)
        .ok_or("the request has no `messages` array")?;
    // An empty assistant turn is refused by Anthropic; the complaint alone says enough.
    if !answer.is_empty() {
        messages.push(turn("assistant", answer.to_owned()));
    }
    messages.push(turn("user", template.replace(ERROR_PLACEHOLDER, complaint)));
    let bytes = serde_json::to_vec(&body).map_err(|_| "the request body cannot be written")?;
    let mut req = original.clone();
    let len = bytes.len();
    *req.body_mut() = Bytes::from(bytes);
    if req.headers().contains_key(http::header::CONTENT_LENGTH) {
        req.headers_mut()
            .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
    }
    req.extensions_mut().remove::<RequestMeta>();
    req.prepare();
    Ok(req)
}

fn turn(role: &str, content: String) -> Value {
    let mut m = Map::with_capacity(2);
    m.insert("role".to_owned(), Value::from(role));
    m.insert("content".to_owned(), Value::from(content));
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_answer_and_the_complaint_are_appended_and_system_is_untouched() {
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 100,
            "system": [{"type": "text", "text": "Reply in JSON."}],
            "messages": [{"role": "user", "content": "Where is Oslo?"}]});
        let original = Request::post("http://x/v1/messages")
            .header("content-length", body.to_string().len())
            .body(Bytes::from(body.to_string()))
            .unwrap();
        let req =
            repair_request(&original, "Oslo is in Norway.", "not JSON", "Fix: {error}").unwrap();
        let sent: Value = serde_json::from_slice(req.body()).unwrap();
        assert_eq!(sent["system"], body["system"]);
        assert_eq!(sent["max_tokens"], 100);
        assert_eq!(
            sent["messages"],
            json!([{"role": "user", "content": "Where is Oslo?"},
                   {"role": "assistant", "content": "Oslo is in Norway."},
                   {"role": "user", "content": "Fix: not JSON"}])
        );
        assert_eq!(
            req.headers()["content-length"],
            req.body().len().to_string().as_str()
        );
        assert!(req.estimated_input_tokens() > 0, "parsed again");
    }

    #[test]
    fn an_empty_answer_adds_only_the_complaint() {
        let original = Request::post("http://x/v1/chat/completions")
            .body(Bytes::from(
                r#"{"messages":[{"role":"user","content":"hi"}]}"#,
            ))
            .unwrap();
        let req = repair_request(&original, "", "empty", DEFAULT_TEMPLATE).unwrap();
        let sent: Value = serde_json::from_slice(req.body()).unwrap();
        assert_eq!(sent["messages"].as_array().unwrap().len(), 2);
        assert_eq!(sent["messages"][1]["role"], "user");
    }

    #[test]
    fn a_body_without_messages_cannot_be_repaired() {
        for body in ["not json", r#"{"prompt": "hi"}"#, "[]"] {
            let original = Request::post("http://x/v1/chat/completions")
                .body(Bytes::from(body))
                .unwrap();
            assert!(repair_request(&original, "a", "b", DEFAULT_TEMPLATE).is_err());
        }
    }
}
