//! The events of a stream read from their bytes, without serde's derive: every chunk of a
//! streamed answer passes through here, and the derive (a call per token through its layers,
//! a vector of choices, a `Value` for each usage) cost more than the rest of the layer's work
//! per chunk.
//!
//! Like every scan in seawall it never decides alone: an event is read here only when it is
//! laid out on a [`JsonTape`] (well-formed JSON that serde reads as the same value) and every
//! field the derive knows is there at most once with the type it expects. Anything else (a
//! repeated field, a `null` where the derive wants a number, damage) answers `None`, and the
//! derive reads it as it always has. A test holds the two to the same reading on generated
//! and damaged events.

use serde_json::Value;

use seawall_core::json_scan::{JsonKind, JsonNode, JsonTape, Seen as Once};

use crate::events::{Kind, Seen};

/// A string or `null` (`None` inside); anything else is left to serde.
// The outer `None`: not sure (serde decides); the inner one: `null`.
#[allow(clippy::option_option)]
fn text<'a>(v: JsonNode<'_, 'a>) -> Option<Option<std::borrow::Cow<'a, str>>> {
    match v.kind() {
        JsonKind::Null => Some(None),
        _ => v.str().map(Some),
    }
}

/// Any value but `null`, built (only usage and stop sequences, once or twice per stream).
// The outer `None`: not sure (serde decides); the inner one: `null`.
#[allow(clippy::option_option)]
fn value(v: JsonNode<'_, '_>) -> Option<Option<Value>> {
    match v.kind() {
        JsonKind::Null => Some(None),
        _ => serde_json::from_str(v.raw()).ok().map(Some),
    }
}

/// An object (serde's derive also reads a struct from an array: left to it).
fn object<'t, 'a>(v: JsonNode<'t, 'a>) -> Option<JsonNode<'t, 'a>> {
    (v.kind() == JsonKind::Object).then_some(v)
}

/// An OpenAI chunk, as `events::openai`'s derive reads it; `None` when not sure.
pub(crate) fn openai(data: &[u8]) -> Option<Seen<'_>> {
    let mut tape = JsonTape::new();
    let root = object(tape.read(std::str::from_utf8(data).ok()?)?)?;
    let mut once = Once::default();
    let mut seen = Seen::default();
    let mut error = false;
    let mut choices = None;
    root.members(|name, v| {
        match name {
            "id" => {
                once.first(0)?;
                seen.id = text(v)?;
            }
            "created" => {
                once.first(1)?;
                seen.created = match v.kind() {
                    JsonKind::Null => None,
                    _ => Some(v.u64()?),
                };
            }
            "model" => {
                once.first(2)?;
                seen.model = text(v)?;
            }
            "choices" => {
                once.first(3)?;
                choices = match v.kind() {
                    JsonKind::Null => None,
                    JsonKind::Array => Some(v),
                    _ => return None,
                };
            }
            "usage" => {
                once.first(4)?;
                seen.usage = value(v)?;
            }
            "error" => {
                once.first(5)?;
                error = v.kind() != JsonKind::Null;
            }
            _ => {}
        }
        Some(())
    })?;
    // Every choice is read (a bad one fails the chunk); the first is the one that counts.
    let mut first = None;
    let mut bad = false;
    if let Some(choices) = choices {
        choices.each_child(|c| match choice(c) {
            Some(read) => {
                first.get_or_insert(read);
            }
            None => bad = true,
        });
    }
    if bad {
        return None;
    }
    if error {
        seen.kind = Kind::Error;
        return Some(seen);
    }
    let Some((index, unsupported, content, finish)) = first else {
        if seen.usage.is_some() {
            seen.kind = Kind::Usage;
        }
        return Some(seen);
    };
    if index != 0 || unsupported {
        seen.kind = Kind::Unsupported;
        return Some(seen);
    }
    seen.text = content.filter(|c| !c.is_empty());
    seen.finish = finish;
    seen.kind = if seen.finish.is_some() {
        Kind::Finish
    } else if seen.text.is_some() {
        Kind::Content
    } else {
        Kind::Head
    };
    Some(seen)
}

/// A choice read: its index, whether its delta is a tool or function call, its text and its
/// finish reason.
type Choice<'a> = (
    u64,
    bool,
    Option<std::borrow::Cow<'a, str>>,
    Option<std::borrow::Cow<'a, str>>,
);

fn choice<'a>(c: JsonNode<'_, 'a>) -> Option<Choice<'a>> {
    let mut once = Once::default();
    let (mut index, mut unsupported, mut content, mut finish) = (0, false, None, None);
    object(c)?.members(|name, v| {
        match name {
            "index" => {
                once.first(0)?;
                index = v.u64()?;
            }
            "finish_reason" => {
                once.first(1)?;
                finish = text(v)?;
            }
            "delta" => {
                once.first(2)?;
                if v.kind() == JsonKind::Null {
                    return Some(());
                }
                let mut inner = Once::default();
                object(v)?.members(|name, v| {
                    match name {
                        "content" => {
                            inner.first(0)?;
                            content = text(v)?;
                        }
                        "tool_calls" | "function_call" => {
                            inner.first(if name == "tool_calls" { 1 } else { 2 })?;
                            unsupported |= v.kind() != JsonKind::Null;
                        }
                        _ => {}
                    }
                    Some(())
                })?;
            }
            _ => {}
        }
        Some(())
    })?;
    Some((index, unsupported, content, finish))
}

/// An Anthropic event's `data` (its name is not `error`), as `events::anthropic`'s derive
/// reads it; `None` when not sure.
pub(crate) fn anthropic(data: &[u8]) -> Option<Seen<'_>> {
    let mut tape = JsonTape::new();
    let root = object(tape.read(std::str::from_utf8(data).ok()?)?)?;
    let mut once = Once::default();
    let mut seen = Seen::default();
    let mut kind = None;
    let (mut delta_kind, mut delta_text) = (None, None);
    let mut block_kind = None;
    let mut message_usage = None;
    let mut message_model = None;
    let mut usage = None;
    let (mut stop_reason, mut stop_sequence) = (None, None);
    root.members(|name, v| {
        match name {
            "type" => {
                once.first(0)?;
                kind = Some(v.str()?);
            }
            "index" => {
                once.first(1)?;
                seen.index = match v.kind() {
                    JsonKind::Null => None,
                    _ => Some(v.u64()?),
                };
            }
            "delta" => {
                once.first(2)?;
                if v.kind() == JsonKind::Null {
                    return Some(());
                }
                let mut inner = Once::default();
                object(v)?.members(|name, v| {
                    match name {
                        "type" => {
                            inner.first(0)?;
                            delta_kind = text(v)?;
                        }
                        "text" => {
                            inner.first(1)?;
                            delta_text = text(v)?;
                        }
                        "stop_reason" => {
                            inner.first(2)?;
                            stop_reason = text(v)?;
                        }
                        "stop_sequence" => {
                            inner.first(3)?;
                            stop_sequence = value(v)?;
                        }
                        _ => {}
                    }
                    Some(())
                })?;
            }
            "content_block" => {
                once.first(3)?;
                if v.kind() == JsonKind::Null {
                    return Some(());
                }
                let mut inner = Once::default();
                object(v)?.members(|name, v| {
                    if name == "type" {
                        inner.first(0)?;
                        block_kind = Some(v.str()?);
                    }
                    Some(())
                })?;
                // `type` is required.
                block_kind.as_ref()?;
            }
            "message" => {
                once.first(4)?;
                if v.kind() == JsonKind::Null {
                    return Some(());
                }
                let mut inner = Once::default();
                object(v)?.members(|name, v| {
                    match name {
                        "model" => {
                            inner.first(0)?;
                            message_model = text(v)?;
                        }
                        "usage" => {
                            inner.first(1)?;
                            message_usage = value(v)?;
                        }
                        _ => {}
                    }
                    Some(())
                })?;
            }
            "usage" => {
                once.first(5)?;
                usage = value(v)?;
            }
            _ => {}
        }
        Some(())
    })?;
    // `type` is required.
    let kind = kind?;
    seen.kind = match &*kind {
        "message_start" => {
            seen.model = message_model;
            seen.usage = message_usage;
            Kind::Head
        }
        "content_block_start" => match block_kind.as_deref() {
            Some("text") => Kind::Head,
            _ => Kind::Unsupported,
        },
        "content_block_delta" => match (delta_kind.as_deref(), delta_text) {
            (Some("text_delta"), Some(t)) => {
                seen.text = Some(t);
                Kind::Content
            }
            _ => Kind::Unsupported,
        },
        "content_block_stop" => Kind::BlockStop,
        "message_delta" => {
            seen.finish = stop_reason;
            seen.stop_sequence = stop_sequence;
            seen.usage = usage;
            Kind::Finish
        }
        "message_stop" => Kind::Done,
        "error" => Kind::Error,
        _ => Kind::Other,
    };
    Some(seen)
}
