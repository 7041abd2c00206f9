//! The events of a stream, and the finish reason of a whole answer, read from their bytes in
//! one pass of core's [`JsonCursor`], without serde and without laying the document out:
//! every chunk of a streamed answer passes through here, and the layer needs only a few of
//! its fields (the text, the finish reason, a tool call's presence, the usage once).
//!
//! Like every scan in seawall it never decides alone: an event is read here only when it is
//! well-formed JSON that serde's derive reads the same way, members it does not know skipped
//! as the derive skips them (`IgnoredAny`), every field it knows there at most once with the
//! type it expects. Anything else (a repeated field, a `null` where the derive wants a number,
//! damage) answers `None`, and the derive reads it as it always has. Tests hold the two to the
//! same reading on generated, damaged and cut events.
//!
//! Why a cursor and not a tape: a tape lays out every value of the event before the layer
//! looks at three of them; the cursor checks each byte once as it walks and keeps only the
//! spans it needs (a few hundred instructions an event instead of several thousand).

use std::borrow::Cow;
use std::sync::LazyLock;

use memchr::memmem::Finder;

use seawall_core::FinishReason;
use seawall_core::json_scan::{JsonCursor, JsonKind, JsonStr, Seen as Once, TextShape};
use serde_json::Value;

use crate::events::{Kind, Seen};
use crate::request::Wire;

/// A cursor over `text`, which every method below reads through.
type Cur<'a> = JsonCursor<'a>;

/// A string or `null` (`None` inside); anything else is left to serde.
// The outer `None`: not sure (serde decides); the inner one: `null`.
#[allow(clippy::option_option)]
fn text<'a>(c: &mut Cur<'a>) -> Option<Option<Cow<'a, str>>> {
    if c.null()? {
        return Some(None);
    }
    let s = c.string()?;
    c.decoded(s).map(Some)
}

/// Any value but `null`, built (only usage and stop sequences, once or twice per stream).
// The outer `None`: not sure (serde decides); the inner one: `null`.
#[allow(clippy::option_option)]
fn value(c: &mut Cur<'_>, depth: u32) -> Option<Option<Value>> {
    if c.null()? {
        return Some(None);
    }
    let mut end = c.clone();
    end.skip(depth)?;
    let raw = c.bytes(JsonStr {
        start: c.pos(),
        end: end.pos(),
        escaped: false,
    });
    *c = end;
    serde_json::from_slice(raw).ok().map(Some)
}

/// A member serde's derive does not know (or does not keep): skipped as it skips one.
fn ignored(c: &mut Cur<'_>, depth: u32) -> Option<()> {
    c.skip_ignored(depth)
}

/// An `Option<IgnoredAny>` member: whether it is there and not `null`.
fn present(c: &mut Cur<'_>, depth: u32) -> Option<bool> {
    if c.null()? {
        return Some(false);
    }
    ignored(c, depth)?;
    Some(true)
}

/// The kind of the next value, which must be an object (serde's derive also reads a struct
/// from an array: left to it) or `null` (`Some(false)`).
fn object_or_null(c: &mut Cur<'_>) -> Option<bool> {
    match c.kind()? {
        JsonKind::Null => c.null().map(|_| false),
        JsonKind::Object => Some(true),
        _ => None,
    }
}

/// The longest a remembered prefix may be.
const MEMO_MAX: usize = 1024;

/// What an event's leading members were read as, for the next events that repeat them byte
/// for byte.
///
/// The events of one stream start alike: an OpenAI chunk repeats its id, object, creation
/// time, model and system fingerprint (two thirds of a content chunk's bytes), an Anthropic
/// delta its type and index. Reading JSON left to right is deterministic, so an event whose
/// bytes start with the prefix an earlier event was read through is, at the end of that
/// prefix, in the same state: the members it skipped there were checked then, and the few
/// it keeps (`Keep`: the id, the model, the type...) are read again from where they are. The
/// prefix ends after a top-level `,`, before the first member the reader reads deeply
/// (`Stop`), and is at most [`MEMO_MAX`] bytes. One memo per stream and wire format.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    prefix: Vec<u8>,
    /// The kept members inside the prefix: their name's span and their value's start.
    keep: [(u32, u32, u32); MEMO_KEEP],
    kept: usize,
    /// The shape of the stream's text deltas.
    pub(crate) template: Template,
}

/// Text deltas read in full in a row without matching a template, after which a stream is no
/// longer searched for one (until a delta matches again).
const TEMPLATE_TRIES: u8 = 4;

/// The shape of a stream's text deltas, learnt from one read in full: the bytes around its
/// text up to the end of the top-level member holding it (a [`TextShape`]: an OpenAI chunk's
/// `choices`, an Anthropic event's `delta`).
///
/// The text deltas of a stream differ only in their text (and, in OpenAI's chunks, an
/// `obfuscation` padding after the choices). A delta that starts with the head, continues with
/// a valid JSON string that is not empty, then the member's end, then only members the derive
/// ignores (and one `null` usage, for OpenAI) and the object's end, is what the learnt one
/// was with another text: the derive would read it as the same kind, with the same id, model,
/// creation time and index (their bytes are in the head), and this text. The learning walk
/// admits only deltas whose head holds nothing else the derive reads, one choice at index 0
/// with no finish reason and a delta of its content alone (OpenAI), or a `text_delta` (Anthropic).
/// Two comparisons of bytes and a scan of the text and what follows, instead of the event's
/// walk.
#[derive(Debug, Default)]
pub(crate) struct Template {
    shape: TextShape,
    anthropic: bool,
    /// The spans of the id and the model in the head (plain strings), the creation time, the
    /// index.
    id: Option<(usize, usize)>,
    model: Option<(usize, usize)>,
    created: Option<u64>,
    index: Option<u64>,
    tries: u8,
}

impl Template {
    /// `data` read by the learnt shape; `None` when it is not of it (it is then read in full).
    pub(crate) fn read<'a>(&mut self, data: &'a [u8], anthropic: bool) -> Option<Seen<'a>> {
        if self.anthropic != anthropic {
            return None;
        }
        let (c, s, tail) = self.shape.split(data)?;
        let text = c.decoded(s)?;
        tail_ignored(tail, anthropic)?;
        let borrowed = |span: Option<(usize, usize)>| match span {
            Some((a, b)) => std::str::from_utf8(data.get(a..b)?)
                .ok()
                .map(|t| Some(Cow::Borrowed(t))),
            None => Some(None),
        };
        let seen = Seen {
            kind: Kind::Content,
            text: Some(text),
            id: borrowed(self.id)?,
            model: borrowed(self.model)?,
            created: self.created,
            index: self.index,
            ..Seen::default()
        };
        self.tries = 0;
        Some(seen)
    }

    /// Learns the shape of `data`, a text delta just read in full; keeps the shape it has if
    /// `data` is not one it can learn.
    pub(crate) fn learn(&mut self, data: &[u8], anthropic: bool) {
        if self.tries >= TEMPLATE_TRIES {
            return;
        }
        self.tries += 1;
        let learnt = if anthropic {
            learn_anthropic(data)
        } else {
            learn_openai(data)
        };
        if let Some(t) = learnt {
            *self = Template {
                tries: self.tries,
                ..t
            };
        }
    }
}

/// The shape of an OpenAI chunk whose one choice (index 0, no finish reason) has a delta of
/// its content alone, and whose members before the choices are the id, creation time and
/// model (each once) and members the derive ignores.
fn learn_openai(data: &[u8]) -> Option<Template> {
    let t = std::str::from_utf8(data).ok()?;
    let mut c = JsonCursor::new(t);
    let mut tpl = Template::default();
    let mut once = Once::default();
    c.eat(b'{')?;
    loop {
        c.ws();
        match c.key()? {
            name @ (b"id" | b"model") => {
                once.first(u32::from(name == b"model"))?;
                let s = c.string()?;
                c.plain(s)?;
                let span = Some((s.start, s.end));
                if name == b"id" {
                    tpl.id = span;
                } else {
                    tpl.model = span;
                }
            }
            b"created" => {
                once.first(2)?;
                tpl.created = c.count_or_null()?;
            }
            b"choices" => break,
            b"usage" | b"error" => return None,
            _ => ignored(&mut c, 1)?,
        }
        c.eat(b',')?;
    }
    c.eat(b'[')?;
    c.eat(b'{')?;
    let mut once = Once::default();
    let mut text = None;
    loop {
        c.ws();
        match c.key()? {
            b"index" => {
                once.first(0)?;
                (c.count()? == 0).then_some(())?;
            }
            b"finish_reason" => {
                once.first(1)?;
                c.null()?.then_some(())?;
            }
            b"delta" => {
                once.first(2)?;
                c.eat(b'{')?;
                c.ws();
                (c.key()? == b"content").then_some(())?;
                c.ws();
                text = Some(c.string()?);
                c.eat(b'}')?;
            }
            _ => ignored(&mut c, 3)?,
        }
        if !more(&mut c)? {
            break;
        }
    }
    c.eat(b']')?;
    tpl.fit(data, text?, c.pos())
}

/// The shape of an Anthropic `content_block_delta` of type `text_delta`, whose members before
/// its delta are its type and index (each once) and members the derive ignores.
fn learn_anthropic(data: &[u8]) -> Option<Template> {
    let t = std::str::from_utf8(data).ok()?;
    let mut c = JsonCursor::new(t);
    let mut tpl = Template {
        anthropic: true,
        ..Template::default()
    };
    let mut once = Once::default();
    c.eat(b'{')?;
    loop {
        c.ws();
        match c.key()? {
            b"type" => {
                once.first(0)?;
                word(&mut c, "content_block_delta")?;
            }
            b"index" => {
                once.first(1)?;
                tpl.index = c.count_or_null()?;
            }
            b"delta" => break,
            b"content_block" | b"message" | b"usage" => return None,
            _ => ignored(&mut c, 1)?,
        }
        c.eat(b',')?;
    }
    once.has(0).then_some(())?;
    c.eat(b'{')?;
    let mut inner = Once::default();
    let mut text = None;
    loop {
        c.ws();
        match c.key()? {
            b"type" => {
                inner.first(0)?;
                word(&mut c, "text_delta")?;
            }
            b"text" => {
                inner.first(1)?;
                text = Some(c.string()?);
            }
            b"stop_reason" | b"stop_sequence" => return None,
            _ => ignored(&mut c, 2)?,
        }
        if !more(&mut c)? {
            break;
        }
    }
    inner.has(0).then_some(())?;
    tpl.fit(data, text?, c.pos())
}

/// The string `w`, unescaped, next.
fn word(c: &mut Cur<'_>, w: &str) -> Option<()> {
    let s = c.string()?;
    (c.plain(s)? == w).then_some(())
}

/// After a member: `true` past the `,` before another, `false` past the object's `}`.
fn more(c: &mut Cur<'_>) -> Option<bool> {
    c.ws();
    if c.peek()? == b',' {
        c.eat(b',')?;
        return Some(true);
    }
    c.eat(b'}')?;
    Some(false)
}

impl Template {
    /// Cuts `data` around its text `text` (a span of it), the member holding it ending at
    /// `member_end`.
    fn fit(mut self, data: &[u8], text: JsonStr, member_end: usize) -> Option<Template> {
        self.shape = TextShape::around(data, text.start - 1..text.end + 1, member_end)?;
        Some(self)
    }
}

/// Whether `tail` is only members the derive ignores (and, for OpenAI, one `null` usage),
/// then the object's end.
fn tail_ignored(tail: &str, anthropic: bool) -> Option<()> {
    let mut c = JsonCursor::new(tail);
    let mut usage = false;
    c.rest_of_object(|c, name| {
        let known = if anthropic {
            matches!(
                name,
                b"type" | b"index" | b"delta" | b"content_block" | b"message" | b"usage"
            )
        } else {
            matches!(name, b"id" | b"created" | b"model" | b"choices" | b"error")
        };
        if known {
            return None;
        }
        if name == b"usage" {
            (!usage && c.null()?).then_some(())?;
            usage = true;
            return Some(());
        }
        ignored(c, 1)
    })?;
    c.at_end().then_some(())
}

/// The most kept members a prefix holds.
const MEMO_KEEP: usize = 4;

/// What the reader does with a top-level member.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Member {
    /// Not read (checked and skipped): a prefix may pass over it.
    Skip,
    /// Read shallowly (a string or a number): a prefix may hold it, it is read again.
    Keep,
    /// Read deeply: a prefix ends before it.
    Stop,
}

/// Walks the top-level object of `t`, handing each member to `member` as `JsonCursor::object`
/// does, but starting after the prefix `memo` holds when `t` starts with it, and remembering
/// the prefix of `t` for the next event. `None` when not sure (or not an object).
fn root<'a>(
    t: &'a str,
    memo: &mut Memo,
    class: impl Fn(&[u8]) -> Member,
    mut member: impl FnMut(&mut Cur<'a>, &'a [u8]) -> Option<()>,
) -> Option<()> {
    let b = t.as_bytes();
    let mut keep = [(0u32, 0u32, 0u32); MEMO_KEEP];
    let mut kept = 0;
    let resumed = !memo.prefix.is_empty() && b.starts_with(&memo.prefix);
    let base = if resumed {
        for &(ns, ne, vs) in &memo.keep[..memo.kept] {
            let name = b.get(ns as usize..ne as usize)?;
            member(&mut JsonCursor::new(t.get(vs as usize..)?), name)?;
        }
        keep = memo.keep;
        kept = memo.kept;
        memo.prefix.len()
    } else {
        let mut c = JsonCursor::new(t);
        c.eat(b'{')?;
        c.ws();
        if c.peek()? == b'}' {
            c.eat(b'}')?;
            return c.at_end().then_some(());
        }
        c.pos()
    };
    // Positions in `c` are from `base`.
    let mut c = JsonCursor::new(t.get(base..)?);
    let mut open = true;
    // Where the prefix to remember ends, and the kept members inside it.
    let mut end = None;
    let mut kept_in_end = kept;
    loop {
        c.ws();
        let name_start = base + c.pos() + 1;
        let name = c.key()?;
        c.ws();
        let value_start = base + c.pos();
        member(&mut c, name)?;
        match class(name) {
            Member::Skip => {}
            Member::Keep if open && kept < MEMO_KEEP => {
                // Member names are unescaped (`key` refuses others): their bytes are theirs.
                let span = |n: usize| u32::try_from(n).ok();
                keep[kept] = (
                    span(name_start)?,
                    span(name_start + name.len())?,
                    span(value_start)?,
                );
                kept += 1;
            }
            Member::Keep | Member::Stop => open = false,
        }
        c.ws();
        match c.peek()? {
            b',' => {
                c.eat(b',')?;
                if open {
                    end = Some(base + c.pos());
                    kept_in_end = kept;
                }
            }
            b'}' => {
                c.eat(b'}')?;
                break;
            }
            _ => return None,
        }
    }
    if !c.at_end() {
        return None;
    }
    match end {
        Some(end) if end <= MEMO_MAX && !(resumed && end == memo.prefix.len()) => {
            memo.prefix.clear();
            memo.prefix.extend_from_slice(b.get(..end)?);
            memo.keep = keep;
            memo.kept = kept_in_end;
        }
        _ => {}
    }
    Some(())
}

/// An OpenAI chunk, as `events::openai`'s derive reads it; `None` when not sure.
pub(crate) fn openai<'a>(data: &'a [u8], memo: &mut Memo) -> Option<Seen<'a>> {
    let t = std::str::from_utf8(data).ok()?;
    let mut once = Once::default();
    let mut seen = Seen::default();
    let mut error = false;
    // The first choice read: the one that counts (every one is read: a bad one fails the
    // chunk).
    let mut first: Option<Choice<'_>> = None;
    let class = |name: &[u8]| match name {
        b"id" | b"created" | b"model" => Member::Keep,
        b"choices" | b"usage" | b"error" => Member::Stop,
        _ => Member::Skip,
    };
    root(t, memo, class, |c, name| {
        match name {
            b"id" => {
                once.first(0)?;
                seen.id = text(c)?;
            }
            b"created" => {
                once.first(1)?;
                seen.created = c.count_or_null()?;
            }
            b"model" => {
                once.first(2)?;
                seen.model = text(c)?;
            }
            b"choices" => {
                once.first(3)?;
                if c.null()? {
                    return Some(());
                }
                c.array(|c| {
                    let read = choice(c)?;
                    first.get_or_insert(read);
                    Some(())
                })?;
            }
            b"usage" => {
                once.first(4)?;
                seen.usage = value(c, 1)?;
            }
            b"error" => {
                once.first(5)?;
                error = present(c, 1)?;
            }
            _ => ignored(c, 1)?,
        }
        Some(())
    })?;
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
type Choice<'a> = (u64, bool, Option<Cow<'a, str>>, Option<Cow<'a, str>>);

fn choice<'a>(c: &mut Cur<'a>) -> Option<Choice<'a>> {
    if c.kind()? != JsonKind::Object {
        return None;
    }
    let mut once = Once::default();
    let (mut index, mut unsupported, mut content, mut finish) = (0, false, None, None);
    c.object(|c, name| {
        match name {
            b"index" => {
                once.first(0)?;
                index = c.count()?;
            }
            b"finish_reason" => {
                once.first(1)?;
                finish = text(c)?;
            }
            b"delta" => {
                once.first(2)?;
                if !object_or_null(c)? {
                    return Some(());
                }
                let mut inner = Once::default();
                c.object(|c, name| {
                    match name {
                        b"content" => {
                            inner.first(0)?;
                            content = text(c)?;
                        }
                        b"tool_calls" | b"function_call" => {
                            inner.first(if name == b"tool_calls" { 1 } else { 2 })?;
                            unsupported |= present(c, 4)?;
                        }
                        // Reasoning text: not continued (`events::OaDelta::unsupported`).
                        // Any other shape than a string or `null` is left to serde.
                        b"reasoning_content" | b"reasoning" => {
                            inner.first(if name == b"reasoning" { 4 } else { 3 })?;
                            unsupported |= text(c)?.is_some_and(|r| !r.is_empty());
                        }
                        _ => ignored(c, 4)?,
                    }
                    Some(())
                })?;
            }
            _ => ignored(c, 3)?,
        }
        Some(())
    })?;
    Some((index, unsupported, content, finish))
}

/// An Anthropic event's `data` (its name is not `error`), as `events::anthropic`'s derive
/// reads it; `None` when not sure.
pub(crate) fn anthropic<'a>(data: &'a [u8], memo: &mut Memo) -> Option<Seen<'a>> {
    let t = std::str::from_utf8(data).ok()?;
    let mut once = Once::default();
    let mut seen = Seen::default();
    let mut kind = None;
    let (mut delta_kind, mut delta_text) = (None, None);
    let mut block_kind = None;
    let mut message_usage = None;
    let mut message_model = None;
    let mut usage = None;
    let (mut stop_reason, mut stop_sequence) = (None, None);
    let class = |name: &[u8]| match name {
        b"type" | b"index" => Member::Keep,
        b"delta" | b"content_block" | b"message" | b"usage" => Member::Stop,
        _ => Member::Skip,
    };
    root(t, memo, class, |c, name| {
        match name {
            b"type" => {
                once.first(0)?;
                let s = c.string()?;
                kind = Some(c.decoded(s)?);
            }
            b"index" => {
                once.first(1)?;
                seen.index = c.count_or_null()?;
            }
            b"delta" => {
                once.first(2)?;
                if !object_or_null(c)? {
                    return Some(());
                }
                let mut inner = Once::default();
                c.object(|c, name| {
                    match name {
                        b"type" => {
                            inner.first(0)?;
                            delta_kind = text(c)?;
                        }
                        b"text" => {
                            inner.first(1)?;
                            delta_text = text(c)?;
                        }
                        b"stop_reason" => {
                            inner.first(2)?;
                            stop_reason = text(c)?;
                        }
                        b"stop_sequence" => {
                            inner.first(3)?;
                            stop_sequence = value(c, 2)?;
                        }
                        _ => ignored(c, 2)?,
                    }
                    Some(())
                })?;
            }
            b"content_block" => {
                once.first(3)?;
                if !object_or_null(c)? {
                    return Some(());
                }
                let mut inner = Once::default();
                c.object(|c, name| {
                    if name == b"type" {
                        inner.first(0)?;
                        let s = c.string()?;
                        block_kind = Some(c.decoded(s)?);
                    } else {
                        ignored(c, 2)?;
                    }
                    Some(())
                })?;
                // `type` is required.
                block_kind.as_ref()?;
            }
            b"message" => {
                once.first(4)?;
                if !object_or_null(c)? {
                    return Some(());
                }
                let mut inner = Once::default();
                c.object(|c, name| {
                    match name {
                        b"model" => {
                            inner.first(0)?;
                            message_model = text(c)?;
                        }
                        b"usage" => {
                            inner.first(1)?;
                            message_usage = value(c, 2)?;
                        }
                        _ => ignored(c, 2)?,
                    }
                    Some(())
                })?;
            }
            b"usage" => {
                once.first(5)?;
                usage = value(c, 1)?;
            }
            _ => ignored(c, 1)?,
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

/// What [`may_be_length`] looks for: a `\u` escape, and each word
/// [`FinishReason::from_provider`] reads as [`FinishReason::Length`] (`length`, `max_tokens`,
/// `max_output_tokens`, `model_context_window_exceeded`) as a whole JSON string (`"max_` for
/// the two that start alike). A test holds the list to core's.
static MARKERS: LazyLock<[Finder<'static>; 4]> = LazyLock::new(|| {
    [
        Finder::new("\\u"),
        Finder::new("\"length\""),
        Finder::new("\"max_"),
        Finder::new("\"model_context_window_exceeded\""),
    ]
});

/// Whether a whole answer may have finished with `length`; `false` only when it surely did
/// not: when it holds none of those words as a whole string and no `\u` escape (which
/// could spell one). Its finish reason, if the answer is valid JSON at all, is one of its
/// strings, written as it reads unless escaped (and a letter or `_` is escaped only by `\u`);
/// an answer that is not valid JSON is not continued either way, so nothing else is checked.
/// This marker scan settles nearly every answer in a few searches over its bytes.
pub(crate) fn may_be_length(data: &[u8]) -> bool {
    MARKERS.iter().any(|m| m.find(data).is_some())
}

/// A whole (non-streamed) answer's finish reason, as `answer::finish` reads it from the
/// answer parsed into a `serde_json::Value` (`None` inside when it has none); the outer `None`
/// when not sure, and the answer is then parsed.
///
/// Only the finish reason is read: every other value is checked and skipped, nothing is
/// built. Members repeated are read as a `Value` reads them (the last one wins).
// The outer `None`: not sure (serde decides); the inner one: no finish reason.
#[allow(clippy::option_option)]
pub(crate) fn answer_finish(wire: Wire, data: &[u8]) -> Option<Option<FinishReason>> {
    let t = std::str::from_utf8(data).ok()?;
    let mut c = JsonCursor::new(t);
    if c.kind()? != JsonKind::Object {
        // A `Value` that is not an object has no finish reason: parsed (rare) to be sure it
        // is valid at all, which changes nothing either way but keeps this scan simple.
        return None;
    }
    let mut word: Option<JsonStr> = None;
    c.object(|c, name| {
        match (wire, name) {
            (Wire::Anthropic, b"stop_reason") => {
                word = None;
                if c.kind()? == JsonKind::String {
                    word = Some(c.string()?);
                } else {
                    c.skip(1)?;
                }
            }
            (Wire::OpenAi, b"choices") => {
                word = None;
                match c.kind()? {
                    JsonKind::Array => {}
                    // A pointer reads `/choices/0` from an object too (its member `"0"`).
                    JsonKind::Object => return None,
                    _ => return c.skip(1),
                }
                let mut n = 0;
                c.array(|c| {
                    n += 1;
                    if n > 1 || c.kind()? != JsonKind::Object {
                        return c.skip(2);
                    }
                    c.object(|c, name| {
                        if name == b"finish_reason" {
                            word = None;
                            if c.kind()? == JsonKind::String {
                                word = Some(c.string()?);
                                return Some(());
                            }
                        }
                        c.skip(3)
                    })
                })?;
            }
            _ => c.skip(1)?,
        }
        Some(())
    })?;
    if !c.at_end() {
        return None;
    }
    match word {
        None => Some(None),
        Some(s) => Some(Some(FinishReason::from_provider(&c.decoded(s)?))),
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;

    use bytes::Bytes;
    use proptest::prelude::*;
    use seawall_core::{SseDecoder, SseItem};

    use super::*;
    use crate::events::{self, Framer};

    const TEXTS: &[&str] = &[
        "Hello",
        " world",
        "",
        "caf\u{e9}",
        "\\\"q\\\"",
        "a\\nb",
        "\\u00e9t\\u00e9",
        "\\ud83d\\ude00",
        "{\\\"finish_reason\\\":\\\"length\\\"}",
    ];
    const OPENAI_FINISH: &[&str] = &["\"stop\"", "\"length\"", "\"tool_calls\"", "null"];
    const ANTHROPIC_FINISH: &[&str] = &["\"end_turn\"", "\"max_tokens\"", "\"tool_use\"", "null"];

    /// An OpenAI stream as servers send it: a role chunk, a chunk per text, maybe a tool
    /// call, the finish chunk, the usage chunk, `[DONE]`.
    fn openai_stream(texts: &[&str], tool: bool, finish: &str) -> String {
        let head = r#""id":"chatcmpl-1","object":"chat.completion.chunk","created":1732000000,"model":"gpt-4o","system_fingerprint":"fp_1","#;
        let mut s = format!(
            "data: {{{head}\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
        );
        for t in texts {
            s += &format!(
                "data: {{{head}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
            );
        }
        if tool {
            s += &format!(
                "data: {{{head}\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":0,\"function\":{{\"arguments\":\"{{}}\"}}}}]}},\"finish_reason\":null}}]}}\n\n"
            );
        }
        s += &format!(
            "data: {{{head}\"choices\":[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":{finish}}}],\"usage\":null}}\n\n"
        );
        s += &format!(
            "data: {{{head}\"choices\":[],\"usage\":{{\"prompt_tokens\":17,\"completion_tokens\":40,\"total_tokens\":57,\"completion_tokens_details\":{{\"reasoning_tokens\":0}}}}}}\n\n"
        );
        s + "data: [DONE]\n\n"
    }

    /// An Anthropic stream: `message_start`, a text block (or a tool block), a `ping`,
    /// `message_delta`, `message_stop`.
    fn anthropic_stream(texts: &[&str], tool: bool, finish: &str) -> String {
        let mut s = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":17,\"output_tokens\":1}}}\n\n".to_owned();
        s += "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
        s += "event: ping\ndata: {\"type\": \"ping\"}\n\n";
        for t in texts {
            s += &format!(
                "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{t}\"}}}}\n\n"
            );
        }
        s += "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n";
        if tool {
            s += "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}}\n\n";
            s += "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n";
        }
        s += &format!(
            "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":{finish},\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":40}}}}\n\n"
        );
        s + "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
    }

    /// Each event of `sse` (framed as the layer frames a stream), read by the layer and by
    /// serde's derive alone; panics where they differ. Returns how many events the scan was
    /// sure of, and how many there were.
    fn read_both(anthropic: bool, sse: &[u8], split: usize) -> (usize, usize) {
        let mut framer = Framer::default();
        let mut events = Vec::new();
        let data = Bytes::copy_from_slice(sse);
        framer.push(&data.slice(..split), |e| events.push(e));
        framer.push(&data.slice(split..), |e| events.push(e));
        let (mut sure, mut all) = (0, 0);
        // One memo for the stream, as the layer has; the scan alone with a fresh one.
        let mut memo = Memo::default();
        for raw in events {
            let mut decoder = SseDecoder::default();
            let _ = decoder.feed(&raw, |item| {
                if let SseItem::Event(e) = item {
                    all += 1;
                    if anthropic {
                        if e.name != b"error" {
                            sure += usize::from(
                                super::anthropic(e.data, &mut Memo::default()).is_some(),
                            );
                            assert_eq!(
                                events::anthropic(e.name, e.data, &mut memo),
                                events::anthropic_serde(e.data),
                                "{}",
                                String::from_utf8_lossy(e.data)
                            );
                        }
                    } else if e.data.trim_ascii() != b"[DONE]" {
                        sure += usize::from(super::openai(e.data, &mut Memo::default()).is_some());
                        assert_eq!(
                            events::openai(e.data, &mut memo),
                            events::openai_serde(e.data),
                            "{}",
                            String::from_utf8_lossy(e.data)
                        );
                    }
                }
                ControlFlow::<()>::Continue(())
            });
        }
        (sure, all)
    }

    #[test]
    fn the_events_of_usual_streams_are_all_read_by_the_scan() {
        let texts = ["Hello", ",", " world", "caf\u{e9}", "a\\nb"];
        let o = openai_stream(&texts, false, "\"stop\"");
        // Every event but `[DONE]` (which is not JSON).
        assert_eq!(read_both(false, o.as_bytes(), 0), (8, 9));
        let a = anthropic_stream(&texts, false, "\"end_turn\"");
        assert_eq!(read_both(true, a.as_bytes(), 0), (11, 11));
    }

    /// The words core's `FinishReason::from_provider` reads as `Length`.
    const LENGTH_WORDS: [&str; 4] = [
        "length",
        "max_tokens",
        "max_output_tokens",
        "model_context_window_exceeded",
    ];

    #[test]
    fn the_length_words_are_the_ones_core_reads_as_length() {
        for word in LENGTH_WORDS {
            assert_eq!(FinishReason::from_provider(word), FinishReason::Length);
            let answer = format!(r#"{{"finish_reason":"{word}"}}"#);
            assert!(may_be_length(answer.as_bytes()), "{answer}");
        }
        for (answer, may) in [
            (
                &br#"{"finish_reason":"stop","content":"the length"}"#[..],
                false,
            ),
            (
                br#"{"content":"say \"length\"","finish_reason":"stop"}"#,
                false,
            ),
            (br#"{"content":"a\\","finish_reason":"length"}"#, true),
            (br#"{"stop_reason":"max_tokens"}"#, true),
            (br#"{"stop_reason":"end_turn","x":"\u0041"}"#, true),
            (br#"{"stop_reason":"end_turn"}\"#, false),
        ] {
            assert_eq!(
                may_be_length(answer),
                may,
                "{}",
                String::from_utf8_lossy(answer)
            );
        }
    }

    #[test]
    fn text_deltas_of_one_shape_are_read_by_it() {
        for anthropic in [false, true] {
            let sse = if anthropic {
                anthropic_stream(&["Hello", " wor", "ld"], false, "\"end_turn\"")
            } else {
                openai_stream(&["Hello", " wor", "ld"], false, "\"stop\"")
            };
            read_both(anthropic, sse.as_bytes(), 0);
            let mut memo = Memo::default();
            let deltas: Vec<&str> = sse
                .split("\n\n")
                .filter_map(|e| e.split("data: ").nth(1))
                .filter(|d| d.contains("ello") || d.contains("wor") || d.contains("\"ld\""))
                .collect();
            assert_eq!(deltas.len(), 3);
            fn read<'a>(anthropic: bool, memo: &mut Memo, d: &'a str) -> Seen<'a> {
                if anthropic {
                    events::anthropic(b"content_block_delta", d.as_bytes(), memo)
                } else {
                    events::openai(d.as_bytes(), memo)
                }
            }
            let first = read(anthropic, &mut memo, deltas[0]);
            // Learnt from the first; the next read by it, the same as the full reading.
            let second = memo
                .template
                .read(deltas[1].as_bytes(), anthropic)
                .expect("shape");
            assert_eq!(second, read(anthropic, &mut Memo::default(), deltas[1]));
            assert_eq!(second.text.as_deref(), Some(" wor"));
            assert_eq!((second.id, second.model), (first.id, first.model));
            // A shape longer than a template keeps is not learnt.
            let pad = format!("{{\"pad\":\"{}\",", "x".repeat(5000));
            let long = deltas[0].replacen('{', &pad, 1);
            let mut fresh = Memo::default();
            let _ = read(anthropic, &mut fresh, &long);
            assert!(fresh.template.read(long.as_bytes(), anthropic).is_none());
            // Another member the derive reads after the text's: read in full.
            let other = deltas[2].replacen('}', ",\"id\":\"x\"}", 1);
            let other = if anthropic {
                deltas[2].replace("}}", "},\"usage\":{}}")
            } else {
                other
            };
            assert!(
                memo.template.read(other.as_bytes(), anthropic).is_none(),
                "{other}"
            );
        }
    }

    #[test]
    fn a_finish_word_inside_a_text_is_text() {
        let data = br#"{"choices":[{"index":0,"delta":{"content":"{\"finish_reason\":\"length\"}"},"finish_reason":null}]}"#;
        let seen = openai(data, &mut Memo::default()).expect("plain");
        assert_eq!(seen.kind, Kind::Content);
        assert_eq!(seen.text.as_deref(), Some(r#"{"finish_reason":"length"}"#));
    }

    #[test]
    fn the_leading_members_of_a_stream_are_read_once() {
        let o = openai_stream(&["Hello", " world"], false, "\"stop\"");
        let mut memo = Memo::default();
        let events: Vec<&str> = o
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .collect();
        let first = openai(events[0].as_bytes(), &mut memo).unwrap();
        // The id, object, created, model and fingerprint.
        assert!(
            memo.prefix.ends_with(br#""system_fingerprint":"fp_1","#),
            "{:?}",
            String::from_utf8_lossy(&memo.prefix)
        );
        assert_eq!(memo.kept, 3);
        let second = openai(events[1].as_bytes(), &mut memo).unwrap();
        assert_eq!(
            (second.id, second.model, second.created),
            (first.id, first.model, first.created)
        );
        assert_eq!(second.text.as_deref(), Some("Hello"));
        // A different id: read whole, and remembered instead.
        let other = events[2].replace("chatcmpl-1", "chatcmpl-2");
        let third = openai(other.as_bytes(), &mut memo).unwrap();
        assert_eq!(third.id.as_deref(), Some("chatcmpl-2"));
        assert!(memo.prefix.starts_with(br#"{"id":"chatcmpl-2""#));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// An event read after another, whose leading members the memo holds, is read as
        /// serde reads it however it differs from the first (a byte changed, added or cut
        /// anywhere, the leading members included).
        #[test]
        fn an_event_read_through_a_remembered_prefix_is_read_as_serde_reads_it(
            anthropic in any::<bool>(),
            which in any::<prop::sample::Index>(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            mode in 0u8..3,
        ) {
            let sse = if anthropic {
                anthropic_stream(&["Hi", "caf\u{e9}"], true, "\"max_tokens\"")
            } else {
                openai_stream(&["Hi", "caf\u{e9}"], true, "\"length\"")
            };
            let events: Vec<Vec<u8>> = sse
                .split("\n\n")
                .filter_map(|e| e.split("data: ").nth(1))
                .filter(|d| *d != "[DONE]")
                .map(|d| d.as_bytes().to_vec())
                .collect();
            let mut memo = Memo::default();
            for e in &events {
                let _ = if anthropic { super::anthropic(e, &mut memo) } else { super::openai(e, &mut memo) };
            }
            let mut data = which.get(&events).clone();
            match mode {
                0 => data.truncate(at.index(data.len() + 1)),
                1 => { let i = at.index(data.len()); data[i] = byte; }
                _ => { let i = at.index(data.len() + 1); data.insert(i, byte); }
            }
            if anthropic {
                if let Some(s) = super::anthropic(&data, &mut memo) {
                    prop_assert_eq!(s, events::anthropic_serde(&data));
                }
            } else if let Some(s) = super::openai(&data, &mut memo) {
                prop_assert_eq!(s, events::openai_serde(&data));
            }
        }

        /// Text deltas read by the shape learnt from an earlier one are read as serde's
        /// derive reads them, whatever members come before and after the text (ones the
        /// derive reads among them), with a byte changed or not.
        #[test]
        fn text_deltas_read_by_their_shape_read_as_serde_reads_them(
            anthropic in any::<bool>(),
            head in proptest::collection::vec((0usize..8, 0usize..6), 0..3),
            events in proptest::collection::vec(
                (proptest::sample::select(TEXTS), proptest::collection::vec((0usize..8, 0usize..6), 0..3)),
                1..6,
            ),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            damage in any::<bool>(),
        ) {
            const KEYS: [&str; 8] = ["id", "model", "created", "usage", "obfuscation", "index", "type", "x"];
            const VALUES: [&str; 6] = ["null", "\"a\"", "7", "{}", "\"content_block_delta\"", "{\"prompt_tokens\":1}"];
            let member = |&(k, v): &(usize, usize)| format!("\"{}\":{}", KEYS[k], VALUES[v]);
            let head: Vec<String> = head.iter().map(member).collect();
            let mut sse = String::new();
            for (text, tail) in &events {
                let core = if anthropic {
                    format!("\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{text}\"}}")
                } else {
                    format!("\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"finish_reason\":null}}]")
                };
                let members: Vec<String> = head
                    .iter()
                    .cloned()
                    .chain([core])
                    .chain(tail.iter().map(member))
                    .collect();
                sse += &format!("data: {{{}}}\n\n", members.join(","));
            }
            let mut data = sse.into_bytes();
            if damage {
                let i = at.index(data.len());
                data[i] = byte;
            }
            read_both(anthropic, &data, 0);
        }

        /// The splice decides (pass on, hold, continue, resume) and builds its follow-up
        /// request from what each event is read as, and nothing else: the lean reading gives
        /// every event of generated streams in both formats (cut at any point, split into two
        /// frames anywhere, or with a byte changed) the same reading as serde's derive, the
        /// full reading the layer had before, so it reaches the same decisions and requests.
        #[test]
        fn the_lean_reading_reads_every_event_of_a_cut_stream_as_the_full_reading(
            anthropic in any::<bool>(),
            texts in proptest::collection::vec(proptest::sample::select(TEXTS), 0..6),
            tool in any::<bool>(),
            finish in 0usize..4,
            cut in any::<prop::sample::Index>(),
            split in any::<prop::sample::Index>(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            damage in any::<bool>(),
        ) {
            let sse = if anthropic {
                anthropic_stream(&texts, tool, ANTHROPIC_FINISH[finish])
            } else {
                openai_stream(&texts, tool, OPENAI_FINISH[finish])
            };
            let mut data = sse.into_bytes();
            data.truncate(cut.index(data.len() + 1));
            if damage && !data.is_empty() {
                let i = at.index(data.len());
                data[i] = byte;
            }
            let split = split.index(data.len() + 1);
            read_both(anthropic, &data, split);
        }
    }
}
