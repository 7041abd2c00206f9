//! What the events of one stream repeat, remembered so that the next events are not read in
//! full: the leading members the reading never asks for ([`Memo`]), and the shape of a content
//! event whose only change from one event to the next is its text ([`Template`]).
//!
//! Both rest on one fact: JSON read left to right is deterministic, so bytes identical to those
//! of an event already read are read the same way again. Both are checked by the tests below
//! and the SSE parser's, which hold a stream read with them to serde's reading of every event,
//! whole and damaged.

use seawall_core::json_scan::{JsonCursor, JsonKind, JsonNode, TextShape};

use super::sse::EventName;

/// The longest prefix [`Memo`] remembers.
pub(super) const MEMO_MAX: usize = 1024;
/// Events read in full in a row without a prefix to resume from, after which a stream's
/// events are no longer searched for one.
pub(super) const MEMO_TRIES: u8 = 4;
/// The largest scratch buffer a stream keeps between events (a larger one, grown by a rare
/// large event, is let go).
pub(super) const MEMO_SCRATCH_KEEP: usize = 16 * 1024;

/// The leading members of an event that the reading never looks at, remembered for the
/// next events of the stream that repeat them byte for byte.
///
/// An OpenAI chunk starts with its id, object, creation time, model and system fingerprint:
/// about half of a content chunk's bytes, the same in every chunk of a stream, and none of
/// them read here once the model is known. Reading JSON left to right is deterministic, so an
/// event whose bytes start with a prefix that an earlier event was read through (ending after
/// a top-level `,`) is, at that point, where the earlier one was: its members there were
/// checked then and are not among those the reading asks for (`skippable`). The rest is read
/// as an object of its own (`{` and the rest: one copy of a hundred bytes, instead of laying
/// out the repeated half again). The tests hold a stream read this way to the serde reading.
#[derive(Debug, Default)]
pub(super) struct Memo {
    pub(super) prefix: Vec<u8>,
    /// `{` and the rest of the event being read.
    pub(super) scratch: String,
    pub(super) tries: u8,
}

impl Memo {
    /// The length of the remembered prefix if `data` starts with it.
    pub(super) fn resumes(&self, data: &[u8]) -> Option<usize> {
        (!self.prefix.is_empty() && data.starts_with(&self.prefix)).then_some(self.prefix.len())
    }

    /// Remembers the leading members of `text` (an object the scan read) that the reading
    /// does not look at, up to [`MEMO_MAX`] bytes.
    pub(super) fn learn(&mut self, text: &str, model_known: bool) {
        self.prefix.clear();
        if self.tries >= MEMO_TRIES {
            return;
        }
        self.tries += 1;
        let mut c = JsonCursor::new(text);
        let mut end = 0;
        let mut walk = || -> Option<()> {
            c.eat(b'{')?;
            loop {
                let name = c.key()?;
                if !skippable(name, model_known) || (name == b"object" && !plain_object(&c)) {
                    return Some(());
                }
                c.skip(1)?;
                c.eat(b',')?;
                if c.pos() > MEMO_MAX {
                    return Some(());
                }
                end = c.pos();
            }
        };
        let _ = walk();
        self.prefix.extend_from_slice(&text.as_bytes()[..end]);
    }
}

/// Whether the `object` member whose value is next names an ordinary object, not `"error"`:
/// an event whose `object` is `"error"` is an error (vLLM's), so that member is read, never
/// left in a prefix. A value the cursor cannot read plainly counts as an error, to be sure.
fn plain_object(c: &JsonCursor<'_>) -> bool {
    let mut c = c.clone();
    c.string()
        .and_then(|s| c.decoded(s))
        .is_some_and(|v| v != "error")
}

/// Whether the reading of an event never looks at a top-level member of this name (the
/// model only until the report has one: it is kept from the first event that gives it).
fn skippable(name: &[u8], model_known: bool) -> bool {
    match name {
        b"type" | b"error" | b"choices" | b"usage" | b"response" | b"message" | b"delta"
        | b"content_block" => false,
        b"model" => model_known,
        _ => true,
    }
}

/// Content events read in full in a row without a template to match, after which a stream is
/// no longer searched for one (until an event matches again).
pub(super) const TEMPLATE_TRIES: u8 = 4;

/// The shape of a stream's content events, learnt from one read in full: the bytes around its
/// text up to the end of the top-level member that holds it (a [`TextShape`], at most
/// [`TEXT_SHAPE_MAX`](seawall_core::json_scan::TEXT_SHAPE_MAX) bytes).
///
/// A content event (an OpenAI chunk whose one choice's delta is only its `content`, an
/// Anthropic `content_block_delta` with a `text`, a Responses `*.delta` event) does nothing but
/// mark the stream as known and, when its text is not empty, record one event of content; its
/// only part that changes from one event to the next is that text (and, in OpenAI's chunks, an
/// `obfuscation` padding after the choices). So an event that starts with the head, continues
/// with a valid JSON string that is not empty, then the member's end, then only top-level
/// members the reading never asks for (or a `null` usage) and the object's end, is read as the
/// learnt one was: its JSON is the learnt event's with another text. No tree is laid out for
/// it: the check is two comparisons of bytes and a scan of the text and of what follows.
#[derive(Debug, Default)]
pub(super) struct Template {
    shape: TextShape,
    name: EventName,
    pub(super) tries: u8,
}

impl Template {
    /// Whether `data`, an event named `name`, is a content event of the learnt shape with a
    /// text that is not empty. `false` when not sure: the event is then read in full.
    pub(super) fn matches(&self, name: EventName, data: &[u8], model_known: bool) -> bool {
        name == self.name
            && self
                .shape
                .split(data)
                .is_some_and(|(_, _, tail)| tail_is_unread(tail, model_known))
    }

    /// Learns the shape of `root` (an event named `name` just read in full, whose byte `k` of
    /// the text it was read from is byte `to_event(k)` of `data`) if it is a content event;
    /// keeps the shape it has otherwise.
    pub(super) fn learn(
        &mut self,
        name: EventName,
        root: JsonNode<'_, '_>,
        data: &[u8],
        to_event: impl Fn(usize) -> usize,
        model_known: bool,
    ) {
        if self.tries >= TEMPLATE_TRIES {
            return;
        }
        self.tries += 1;
        if matches!(name, EventName::Error | EventName::Finish) {
            return;
        }
        let Some((text, member)) = content_text(root, model_known) else {
            return;
        };
        let (open, close) = text.span();
        let end = to_event(member.span().1);
        if let Some(shape) = TextShape::around(data, to_event(open)..to_event(close), end) {
            self.shape = shape;
            self.name = name;
        }
    }
}

/// The text of a content event and the top-level member holding it; `None` for any other
/// event, or one whose members before that one include any the reading asks for.
fn content_text<'t, 'a>(
    root: JsonNode<'t, 'a>,
    model_known: bool,
) -> Option<(JsonNode<'t, 'a>, JsonNode<'t, 'a>)> {
    let is = |n: &JsonNode<'_, '_>, kind| n.kind() == kind;
    let [ty, error, choices, usage] = root.get_many(["type", "error", "choices", "usage"]);
    if error.is_some() || usage.is_some_and(|u| !is(&u, JsonKind::Null)) {
        return None;
    }
    let ty = match ty {
        Some(t) => Some(t.str()?),
        None => None,
    };
    let (text, member) = match ty.as_deref() {
        // An OpenAI chat chunk: one choice, whose delta holds only its content.
        None => {
            let choices = choices.filter(|c| is(c, JsonKind::Array))?;
            let mut only = None;
            let mut n = 0;
            choices.each_child(|c| {
                n += 1;
                only = Some(c);
            });
            let choice = only.filter(|c| n == 1 && is(c, JsonKind::Object))?;
            let [delta, text, finish] = choice.get_many(["delta", "text", "finish_reason"]);
            if text.is_some() || finish.is_some_and(|f| !is(&f, JsonKind::Null)) {
                return None;
            }
            let mut members = 0;
            delta?.members(|_, _| {
                members += 1;
                Some(())
            })?;
            let content = delta?.get("content").filter(|_| members == 1)?;
            (content, choices)
        }
        // An Anthropic text delta: its text is the one member of the delta the reading asks for.
        Some("content_block_delta") => {
            let delta = root.get("delta")?;
            let [text, json, thinking, signature] =
                delta.get_many(["text", "partial_json", "thinking", "signature"]);
            if json.is_some() || thinking.is_some() || signature.is_some() {
                return None;
            }
            (text?, delta)
        }
        // A Responses delta (its text is the `delta` member itself).
        Some(t) if t.starts_with("response.") && t.ends_with(".delta") => {
            if root.get("response").is_some() {
                return None;
            }
            let delta = root.get("delta")?;
            (delta, delta)
        }
        _ => return None,
    };
    if !is(&text, JsonKind::String) {
        return None;
    }
    // The members before the one holding the text are in the head, read again as they are:
    // none may be one the reading asks for (but the type, which the head fixes).
    let start = member.span().0;
    root.members(|name, m| {
        let before = m.span().0 < start;
        let fixed = name == "type" || skippable(name.as_bytes(), model_known);
        (!before || fixed).then_some(())
    })?;
    Some((text, member))
}

/// Whether `tail` is only top-level members the reading never asks for (or a `null` usage,
/// read as none) and the object's end.
fn tail_is_unread(tail: &str, model_known: bool) -> bool {
    let mut c = JsonCursor::new(tail);
    c.rest_of_object(|c, name| match name {
        b"usage" => c.null()?.then_some(()),
        _ if skippable(name, model_known) => c.skip(1),
        _ => None,
    })
    .is_some()
        && c.at_end()
}
