//! The one server-sent-events line splitter and event assembler of seawall.
//!
//! The classifier and the stream layer both read SSE bodies, each for its own facts (usage,
//! errors and finish reasons; first token and keep-alives). How bytes become lines and lines
//! become events is the same for both, and it is where upstreams and proxies differ in the
//! details, so it lives here once and follows the HTML spec for server-sent events:
//!
//! - a line ends with LF, CR or CRLF, and a CR at the end of one chunk and an LF at the start of
//!   the next are one ending;
//! - a UTF-8 byte order mark before the first line is skipped;
//! - a line starting with `:` is a comment (`: keep-alive`);
//! - `field:value` and `field: value` are the same (one optional space after the colon), and a
//!   line without a colon is a field with an empty value;
//! - the `data:` lines of one event are joined with `\n`, and the event is handed on when a
//!   blank line ends it, with the last `event:` name;
//! - `id:` and `retry:` are read and dropped (no layer reconnects); other field names are
//!   handed on, since a stream full of them is likely not SSE at all.
//!
//! Memory is bounded: a line or an event's data longer than the decoder's limit is dropped, and
//! the event it belongs to is marked oversized, so a hostile or broken upstream cannot make a
//! reader buffer without end. A line's length is its bytes without its ending (and without
//! the byte order mark of the first), whatever the line is (a `data:`, an `event:`, a
//! comment) and however the chunks cut it: a line held across chunks and a line read whole
//! from one meet the same limit, so the chunking of a stream never changes what it says.

use std::ops::ControlFlow;

/// The UTF-8 byte order mark, skipped before the first line.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// What the decoder hands on, in stream order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseItem<'a> {
    /// A blank line ended an event that had at least one `data:` line, or whose data outgrew
    /// the limit.
    Event(SseEvent<'a>),
    /// The current line or event data just outgrew the limit (once per event, as it happens):
    /// for a reader that must react before the event ends (it is not a keep-alive, whatever
    /// it is).
    Overflow,
    /// A field other than `event`, `data`, `id` and `retry`.
    OtherField {
        /// The field name.
        name: &'a [u8],
        /// Its value (after the optional space).
        value: &'a [u8],
    },
}

/// One assembled event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    /// The last `event:` name of the event (empty when it had none).
    pub name: &'a [u8],
    /// The `data:` lines joined with `\n`, untrimmed (empty when oversized).
    pub data: &'a [u8],
    /// The event's data or one of its lines outgrew the limit and was dropped.
    pub oversized: bool,
}

/// Splits SSE bytes into lines and assembles events across chunk boundaries.
///
/// ```
/// use std::ops::ControlFlow;
/// use seawall_core::{SseDecoder, SseItem};
///
/// let mut decoder = SseDecoder::new(1 << 16);
/// let mut events = Vec::new();
/// for chunk in [&b"\xEF\xBB\xBFevent: delta\r\ndata:{\"a\":"[..], b"\r\ndata: 1}\r", b"\n\r\n"] {
///     let _ = decoder.feed(chunk, |item| {
///         if let SseItem::Event(e) = item {
///             events.push((e.name.to_vec(), e.data.to_vec()));
///         }
///         ControlFlow::<()>::Continue(())
///     });
/// }
/// assert_eq!(events, [(b"delta".to_vec(), b"{\"a\":\n1}".to_vec())]);
/// ```
#[derive(Debug)]
pub struct SseDecoder {
    /// The longest line, and the longest event data, kept.
    max: usize,
    /// The incomplete last line.
    partial: Vec<u8>,
    /// The current line outgrew the limit: its bytes are dropped until it ends.
    skipping: bool,
    /// The last chunk ended with a CR: an LF starting the next one belongs to it.
    after_cr: bool,
    /// The first line was read (a byte order mark before it is skipped).
    started: bool,
    /// The current event's name.
    name: Vec<u8>,
    /// The current event's data, its lines joined with `\n`.
    data: Vec<u8>,
    /// The current event has a `data:` line (its data may still be empty).
    has_data: bool,
    /// The current event outgrew the limit.
    oversized: bool,
}

impl Default for SseDecoder {
    /// A decoder that keeps lines and event data up to 1 MiB.
    fn default() -> Self {
        SseDecoder::new(1 << 20)
    }
}

impl SseDecoder {
    /// A decoder that keeps lines and event data up to `max` bytes.
    pub fn new(max: usize) -> Self {
        SseDecoder {
            max,
            partial: Vec::new(),
            skipping: false,
            after_cr: false,
            started: false,
            name: Vec::new(),
            data: Vec::new(),
            has_data: false,
            oversized: false,
        }
    }

    /// The longest line, and the longest event data, kept.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The bytes of the incomplete last line held for the next chunk.
    pub fn pending_line(&self) -> &[u8] {
        &self.partial
    }

    /// The data of the event not yet ended by a blank line, if it has a `data:` line.
    pub fn pending_data(&self) -> Option<&[u8]> {
        (self.has_data && !self.oversized).then_some(&self.data[..])
    }

    /// Reads one chunk, handing each item to `on_item`. A `Break` stops reading there and is
    /// returned (the rest of the chunk is dropped: the reader is done with the stream).
    pub fn feed<B>(
        &mut self,
        chunk: &[u8],
        mut on_item: impl FnMut(SseItem<'_>) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        if chunk.is_empty() {
            // An empty chunk between a CR and its LF must not part them.
            return ControlFlow::Continue(());
        }
        let mut rest = chunk;
        if std::mem::take(&mut self.after_cr) && rest.first() == Some(&b'\n') {
            rest = &rest[1..];
        }
        while let Some(at) = memchr::memchr2(b'\n', b'\r', rest) {
            let piece = &rest[..at];
            let cr = rest[at] == b'\r';
            let crlf = cr && rest.get(at + 1) == Some(&b'\n');
            self.after_cr = cr && at + 1 == rest.len();
            rest = &rest[at + 1 + usize::from(crlf)..];
            if std::mem::take(&mut self.skipping) {
                // The end of an overlong line, already dropped.
                continue;
            }
            if self.partial.is_empty() {
                self.line(piece, &mut on_item)?;
            } else if self.partial.len() + piece.len() > self.held(&self.partial, piece) {
                self.partial.clear();
                self.drop_line(&mut on_item)?;
            } else {
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(piece);
                let flow = self.line(&line, &mut on_item);
                line.clear();
                self.partial = line;
                flow?;
            }
        }
        if !self.skipping && !rest.is_empty() {
            if self.partial.len() + rest.len() > self.held(&self.partial, rest) {
                self.partial = Vec::new();
                self.skipping = true;
                self.drop_line(&mut on_item)?;
            } else {
                self.partial.extend_from_slice(rest);
            }
        }
        ControlFlow::Continue(())
    }

    /// The stream ended: reads the incomplete last line, then hands on the event not yet ended
    /// by a blank line (a stream cut right after its last `data:` line still says what it
    /// said).
    pub fn finish<B>(
        &mut self,
        mut on_item: impl FnMut(SseItem<'_>) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        self.after_cr = false;
        if !std::mem::take(&mut self.skipping) && !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(&line, &mut on_item)?;
        }
        self.dispatch(&mut on_item)
    }

    /// How many bytes of the line that starts with `a` then `b` may be held: the limit, and a
    /// byte order mark more for a first line that opens with one (or may yet), since `line`
    /// holds a line to the limit without it.
    fn held(&self, a: &[u8], b: &[u8]) -> usize {
        let bom = !self.started && a.iter().chain(b).zip(BOM).all(|(x, y)| x == y);
        if bom {
            self.max.saturating_add(BOM.len())
        } else {
            self.max
        }
    }

    /// Drops the line being held, which outgrew the limit: it was read all the same (a byte
    /// order mark after it is text, as when `line` drops it).
    fn drop_line<B>(
        &mut self,
        on_item: &mut impl FnMut(SseItem<'_>) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        self.started = true;
        self.overflow(on_item)
    }

    fn overflow<B>(
        &mut self,
        on_item: &mut impl FnMut(SseItem<'_>) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        self.data = Vec::new();
        if std::mem::replace(&mut self.oversized, true) {
            return ControlFlow::Continue(());
        }
        on_item(SseItem::Overflow)
    }

    fn line<B>(
        &mut self,
        line: &[u8],
        on_item: &mut impl FnMut(SseItem<'_>) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        let line = if std::mem::replace(&mut self.started, true) {
            line
        } else {
            line.strip_prefix(BOM).unwrap_or(line)
        };
        if line.len() > self.max {
            return self.overflow(on_item);
        }
        if line.is_empty() {
            return self.dispatch(on_item);
        }
        let (name, value) = match memchr::memchr(b':', line) {
            // A comment.
            Some(0) => return ControlFlow::Continue(()),
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match name {
            b"data" => {
                if self.oversized {
                    return ControlFlow::Continue(());
                }
                if self.data.len() + value.len() + 1 > self.max {
                    return self.overflow(on_item);
                }
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => {
                self.name.clear();
                self.name.extend_from_slice(value);
            }
            b"id" | b"retry" => {}
            _ => return on_item(SseItem::OtherField { name, value }),
        }
        ControlFlow::Continue(())
    }

    fn dispatch<B>(
        &mut self,
        on_item: &mut impl FnMut(SseItem<'_>) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        let has_data = std::mem::take(&mut self.has_data);
        let oversized = std::mem::take(&mut self.oversized);
        if !has_data && !oversized {
            self.name.clear();
            self.data.clear();
            return ControlFlow::Continue(());
        }
        let name = std::mem::take(&mut self.name);
        let data = std::mem::take(&mut self.data);
        let flow = on_item(SseItem::Event(SseEvent {
            name: &name,
            data: &data,
            oversized,
        }));
        self.name = name;
        self.name.clear();
        self.data = data;
        self.data.clear();
        flow
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Everything a decoder hands on for `chunks`, then for the end of the stream.
    fn items(max: usize, chunks: &[&[u8]]) -> Vec<String> {
        let mut d = SseDecoder::new(max);
        let mut out = Vec::new();
        let mut push = |item: SseItem<'_>| {
            out.push(match item {
                SseItem::Event(e) => format!(
                    "event {}|{}|{}",
                    String::from_utf8_lossy(e.name),
                    String::from_utf8_lossy(e.data),
                    e.oversized
                ),
                SseItem::Overflow => "overflow".to_owned(),
                SseItem::OtherField { name, value } => format!(
                    "field {}={}",
                    String::from_utf8_lossy(name),
                    String::from_utf8_lossy(value)
                ),
            });
            ControlFlow::<()>::Continue(())
        };
        for c in chunks {
            let _ = d.feed(c, &mut push);
        }
        let _ = d.finish(&mut push);
        out
    }

    #[test]
    fn data_lines_are_joined_and_a_blank_line_ends_the_event() {
        assert_eq!(
            items(1024, &[b"event: e\ndata: a\ndata:b\nid: 7\nretry: 9\n\n"]),
            ["event e|a\nb|false"]
        );
    }

    #[test]
    fn comments_and_events_without_data_hand_on_nothing() {
        assert!(items(1024, &[b": keep-alive\n\nevent: ping\n\n\n\n"]).is_empty());
        // An empty `data:` line is still data: the event is handed on, empty.
        assert_eq!(items(1024, &[b"data:\n\n"]), ["event ||false"]);
    }

    #[test]
    fn the_name_is_reset_after_each_event() {
        assert_eq!(
            items(1024, &[b"event: a\ndata: 1\n\ndata: 2\n\n"]),
            ["event a|1|false", "event |2|false"]
        );
    }

    #[test]
    fn unknown_fields_and_lines_without_a_colon_are_handed_on() {
        assert_eq!(
            items(1024, &[b"{\"not\": \"sse\"}\nplain\n"]),
            ["field {\"not\"=\"sse\"}", "field plain="]
        );
    }

    #[test]
    fn an_overlong_line_is_dropped_and_marks_its_event_oversized() {
        let mut long = b"data: ".to_vec();
        long.extend(std::iter::repeat_n(b'x', 100));
        // Cut into chunks, so the line outgrows the limit while it is held.
        let (a, b) = long.split_at(50);
        assert_eq!(
            items(64, &[a, b, b"\n\ndata: ok\n\n"]),
            ["overflow", "event ||true", "event |ok|false"]
        );
        let mut d = SseDecoder::new(64);
        let _ = d.feed(&long, |_| ControlFlow::<()>::Continue(()));
        assert!(d.pending_line().is_empty(), "an overlong line is not kept");
    }

    #[test]
    fn a_first_line_past_the_limit_is_the_first_line_however_it_is_cut() {
        // The mark after it is not the stream's opening mark: it is kept, as the field's name.
        let whole: &[u8] = b"data: 12345678901\n\xEF\xBB\xBFx: y\n\n";
        let expected = items(16, &[whole]);
        assert_eq!(expected, ["overflow", "field \u{feff}x=y", "event ||true"]);
        let bytes: Vec<&[u8]> = whole.chunks(1).collect();
        assert_eq!(items(16, &bytes), expected);
        for cut in 0..=whole.len() {
            let (a, b) = whole.split_at(cut);
            assert_eq!(items(16, &[a, b]), expected, "cut at {cut}");
        }
    }

    #[test]
    fn overlong_event_data_is_dropped_once() {
        let line = [b"data: ".as_slice(), &[b'y'; 40], b"\n"].concat();
        let chunk = [line.as_slice(), &line, &line, b"\n"].concat();
        assert_eq!(items(64, &[&chunk]), ["overflow", "event ||true"]);
    }

    #[test]
    fn the_end_reads_the_last_line_and_event() {
        assert_eq!(items(1024, &[b"data: [DONE]"]), ["event |[DONE]|false"]);
        let mut d = SseDecoder::new(1024);
        let _ = d.feed(b"data: [DONE]\n", |_| ControlFlow::<()>::Continue(()));
        assert_eq!(d.pending_data(), Some(&b"[DONE]"[..]));
    }

    #[test]
    fn an_empty_chunk_between_a_cr_and_its_lf_keeps_them_one_ending() {
        assert_eq!(
            items(1024, &[b"event: e\r", b"", b"\ndata: 1\n\n"]),
            ["event e|1|false"]
        );
    }

    #[test]
    fn a_break_stops_reading() {
        let mut d = SseDecoder::new(1024);
        let mut seen = 0;
        let flow = d.feed(b"data: 1\n\ndata: 2\n\n", |_| {
            seen += 1;
            ControlFlow::Break("stop")
        });
        assert_eq!(flow, ControlFlow::Break("stop"));
        assert_eq!(seen, 1);
    }

    /// Lines on both sides of a 16-byte limit: a `data:` line of 16 bytes and one of 17, an
    /// `event:` line past it, a comment past it, a line of 5, each in an event of its own.
    const NEAR_LIMIT: &[u8] = b"data: 1234567890\n\ndata: 12345678901\n\nevent: abcdefghijklmnop\ndata: x\n\n: a long keep-alive comment\ndata: ok\n\ndata:\n\n";

    const STREAM: &[u8] = b": keep-alive\n\nevent: first\ndata: {\"a\":\ndata: 1}\n\nid: 3\ndata:two\n\nx-vendor: y\nevent: ping\ndata: {}\n\ndata: [DONE]\n\n";

    /// The items of `whole` cut into `chunks` are those of `whole` read at once, which are
    /// `expected`.
    fn reframed_as_whole(
        max: usize,
        chunks: &[Vec<u8>],
        whole: &[u8],
        expected: &[&str],
    ) -> Result<(), TestCaseError> {
        let chunks: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        prop_assert_eq!(items(max, &chunks), items(max, &[whole]));
        prop_assert_eq!(items(max, &[whole]), expected);
        Ok(())
    }

    proptest! {
        /// A line longer than the limit is dropped, and marks its event oversized, whether it
        /// came whole in one chunk or was held across several, whatever field it is.
        #[test]
        fn a_line_past_the_limit_is_dropped_however_the_chunks_cut_it(
            chunks in seawall_test_support::reframed_sse(NEAR_LIMIT),
        ) {
            reframed_as_whole(16, &chunks, NEAR_LIMIT, &[
                "event |1234567890|false",
                "overflow",
                "event ||true",
                "overflow",
                "event ||true",
                "overflow",
                "event ||true",
                "event ||false",
            ])?;
        }

        /// However the bytes are cut into chunks, whatever the line endings (LF, CR, CRLF, or
        /// a mix) and with or without a byte order mark, the decoder hands on the same items.
        #[test]
        fn any_split_and_any_line_endings_give_the_same_items(
            chunks in seawall_test_support::reframed_sse(STREAM),
        ) {
            reframed_as_whole(1024, &chunks, STREAM, &[
                "event first|{\"a\":\n1}|false",
                "event |two|false",
                "field x-vendor=y",
                "event ping|{}|false",
                "event |[DONE]|false",
            ])?;
        }
    }
}
