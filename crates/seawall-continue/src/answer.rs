//! A complete (non-streamed) answer: its text, its finish reason, and joining a
//! continuation's answer to it.

use seawall_core::FinishReason;
use serde_json::Value;

use crate::request::Wire;

/// The answer's finish reason, as the provider said it.
pub(crate) fn finish(wire: Wire, v: &Value) -> Option<FinishReason> {
    let word = match wire {
        Wire::OpenAi => v.pointer("/choices/0/finish_reason"),
        Wire::Anthropic => v.get("stop_reason"),
    }?;
    Some(FinishReason::from_provider(word.as_str()?))
}

/// The answer's text, when it is only text (a tool call, a thinking block or reasoning text
/// cannot be continued by a prefill).
pub(crate) fn text(wire: Wire, v: &Value) -> Option<String> {
    match wire {
        Wire::OpenAi => {
            let message = v.pointer("/choices/0/message")?;
            if message.get("tool_calls").is_some_and(|t| !t.is_null())
                || message.get("function_call").is_some_and(|t| !t.is_null())
            {
                return None;
            }
            // Reasoning: a follow-up would reason again (`events::OaDelta::unsupported`).
            if ["reasoning_content", "reasoning"]
                .iter()
                .any(|k| message.get(*k).is_some_and(crate::events::says_something))
            {
                return None;
            }
            match message.get("content") {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Null) | None => Some(String::new()),
                Some(_) => None,
            }
        }
        Wire::Anthropic => {
            v.get("content")?
                .as_array()?
                .iter()
                .try_fold(String::new(), |mut acc, block| {
                    (block.get("type")?.as_str()? == "text").then_some(())?;
                    acc.push_str(block.get("text")?.as_str()?);
                    Some(acc)
                })
        }
    }
}

/// Appends `more` (the continuation's text, already trimmed) to `answer`'s text, adds the
/// continuation's usage to its usage and takes the continuation's finish reason.
pub(crate) fn append(wire: Wire, answer: &mut Value, next: &Value, more: &str) {
    match wire {
        Wire::OpenAi => {
            if let Some(message) = answer.pointer_mut("/choices/0/message") {
                let old = message.get("content").and_then(Value::as_str).unwrap_or("");
                let joined = format!("{old}{more}");
                message["content"] = Value::from(joined);
            }
            if let (Some(choice), Some(reason)) = (
                answer.pointer_mut("/choices/0"),
                next.pointer("/choices/0/finish_reason"),
            ) {
                choice["finish_reason"] = reason.clone();
            }
        }
        Wire::Anthropic => {
            if let Some(blocks) = answer.get_mut("content").and_then(Value::as_array_mut) {
                match blocks.last_mut().and_then(|b| b.get_mut("text")) {
                    Some(Value::String(s)) => s.push_str(more),
                    _ => blocks.push(serde_json::json!({"type": "text", "text": more})),
                }
            }
            for field in ["stop_reason", "stop_sequence"] {
                if let (Some(a), Some(n)) = (answer.as_object_mut(), next.get(field)) {
                    a.insert(field.into(), n.clone());
                }
            }
        }
    }
    if let (Some(a), Some(u)) = (answer.as_object_mut(), next.get("usage")) {
        let sum = a.entry("usage").or_insert(Value::Null);
        crate::usage::add(sum, u);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn anthropic_answers_join_text_usage_and_stop_reason() {
        let mut a = json!({"content": [{"type": "text", "text": "the storm"}],
                           "stop_reason": "max_tokens", "usage": {"input_tokens": 5, "output_tokens": 2}});
        let n = json!({"content": [{"type": "text", "text": " passes"}],
                       "stop_reason": "end_turn", "stop_sequence": null,
                       "usage": {"input_tokens": 7, "output_tokens": 1}});
        assert_eq!(finish(Wire::Anthropic, &a), Some(FinishReason::Length));
        let more = text(Wire::Anthropic, &n).unwrap();
        append(Wire::Anthropic, &mut a, &n, &more);
        assert_eq!(text(Wire::Anthropic, &a).unwrap(), "the storm passes");
        assert_eq!(finish(Wire::Anthropic, &a), Some(FinishReason::Stop));
        assert_eq!(a["usage"], json!({"input_tokens": 12, "output_tokens": 3}));
    }

    #[test]
    fn tool_calls_reasoning_and_other_blocks_are_not_text() {
        let tool = json!({"choices": [{"message": {"content": null, "tool_calls": [{}]}}]});
        assert_eq!(text(Wire::OpenAi, &tool), None);
        let thinking = json!({"content": [{"type": "thinking", "thinking": "hm"}]});
        assert_eq!(text(Wire::Anthropic, &thinking), None);
        for k in ["reasoning_content", "reasoning"] {
            let reasoned = json!({"choices": [{"message": {"content": "so", k: "hm"}}]});
            assert_eq!(text(Wire::OpenAi, &reasoned), None);
            let empty = json!({"choices": [{"message": {"content": "so", k: ""}}]});
            assert_eq!(text(Wire::OpenAi, &empty).as_deref(), Some("so"));
            let null = json!({"choices": [{"message": {"content": "so", k: null}}]});
            assert_eq!(text(Wire::OpenAi, &null).as_deref(), Some("so"));
        }
        assert_eq!(text(Wire::OpenAi, &json!({"choices": "x"})), None);
    }
}
