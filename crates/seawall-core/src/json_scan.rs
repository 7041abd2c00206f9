//! A JSON byte cursor for the hot paths that read a few fields of an answer or an event.
//!
//! Reading the usage, the finish reason or the model of an answer with serde costs a call per
//! token through the `Deserializer` and `Visitor` layers, and with `serde_json::Value` an
//! allocation per string, array and object, for fields nobody looks at. Most answers and
//! stream events are small and plain, so the layers walk them here byte by byte instead,
//! keeping only the spans they need.
//!
//! The cursor never decides anything alone. It only reads JSON it is sure `serde_json` reads
//! the same way, and every method answers `None` ("not sure") on anything else: a syntax
//! error, an escaped member name, a surrogate escape, a number a `u64` or an `f64` might not
//! hold, nesting deeper than [`MAX_DEPTH`]. Callers then give up and let their serde path
//! decide, and their tests hold the two to the same result on generated and damaged inputs.
//! The cursor reads a `&str`, so the whole input is known to be UTF-8, as serde checks every
//! string it builds.

/// Deeper values are left to serde (which stops at 128 levels).
pub const MAX_DEPTH: u32 = 64;

/// The longest run of integer digits read as sure: any such number is finite as an `f64`.
const MAX_DIGITS: usize = 18;

/// A JSON string's span inside the input: its content (between the quotes), and whether it
/// has escapes (its content then differs from its bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JsonStr {
    /// The first byte after the opening quote.
    pub start: usize,
    /// The closing quote.
    pub end: usize,
    /// Whether the string has a `\` escape.
    pub escaped: bool,
}

impl JsonStr {
    /// Whether the string is empty once decoded.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// The kind of the next value, from its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsonKind {
    /// `{`
    Object,
    /// `[`
    Array,
    /// `"`
    String,
    /// `true` or `false`
    Bool,
    /// `null`
    Null,
    /// A number.
    Number,
}

/// A cursor over the bytes of one JSON document. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct JsonCursor<'a> {
    text: &'a str,
    b: &'a [u8],
    i: usize,
}

/// The length of the leading run of `b` that a JSON string holds as it is (up to the first
/// quote, backslash or control character), and whether its bytes are all ASCII. Public so that
/// every byte scanner of JSON strings (the cursor's, the cache key's canonical form) shares
/// this one test.
///
/// Sixteen bytes at a time, in the CPU's vector registers (SSE2 on x86-64, NEON on aarch64),
/// through the `wide` crate, which reaches them without `unsafe` in this workspace: three
/// byte comparisons and two masks per sixteen bytes, against about twice the instructions of
/// the word-at-a-time test (`plain_prefix_words`) that reads the last fifteen. Strings are
/// most of a request's bytes (the prompt) and of an answer's (its text), so this one loop is
/// what keying, reading and classifying them cost per byte. (No crate searches for this set of
/// bytes: `memchr` finds up to three given bytes, not "any byte below 0x20".)
#[inline]
pub fn plain_prefix(b: &[u8]) -> (usize, bool) {
    use wide::u8x16;
    let mut i = 0;
    let mut high = 0;
    while let Some(chunk) = b.get(i..i + 16) {
        let v = u8x16::new(chunk.try_into().unwrap_or([0; 16]));
        // A byte below 0x20 is its own minimum with 0x1f.
        let special = v.cmp_eq(u8x16::splat(b'"'))
            | v.cmp_eq(u8x16::splat(b'\\'))
            | v.min(u8x16::splat(0x1f)).cmp_eq(v);
        // One bit a byte (sixteen bits).
        let special = special.move_mask() as u32;
        // The top bit of each byte: set on every byte of a multi-byte UTF-8 sequence.
        let top = v.move_mask() as u32;
        if special != 0 {
            let n = special.trailing_zeros();
            let before = top & ((1 << n) - 1);
            return (i + n as usize, (high | before) == 0);
        }
        high |= top;
        i += 16;
    }
    let (n, ascii) = plain_prefix_words(&b[i..]);
    (i + n, high == 0 && ascii)
}

/// [`plain_prefix`] a word (eight bytes) at a time, each word's bytes tested at once as
/// `memchr` does, then byte by byte: for the last fifteen bytes of the input, and the
/// reference the vector test is held to.
fn plain_prefix_words(b: &[u8]) -> (usize, bool) {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_le_bytes([0x80; 8]);
    // The top bit of each zero byte of `v` (and maybe of bytes above one: the lowest set bit
    // is always exact).
    let zeros = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let mut i = 0;
    let mut high = 0;
    while let Some(word) = b.get(i..i + 8) {
        let v = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
        // A byte below 0x20: `v - 0x20` borrows into its top bit while `v`'s is clear.
        let special = zeros(v ^ (ONES * u64::from(b'"')))
            | zeros(v ^ (ONES * u64::from(b'\\')))
            | (v.wrapping_sub(ONES * 0x20) & !v & HIGH);
        if special != 0 {
            let n = (special.trailing_zeros() / 8) as usize;
            // The bytes before the special one (the low ones, little-endian).
            let before = if n == 0 {
                0
            } else {
                v & (u64::MAX >> (64 - 8 * n))
            };
            return (i + n, (high | before) & HIGH == 0);
        }
        high |= v;
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            break;
        }
        high |= u64::from(c);
        i += 1;
    }
    (i, high & HIGH == 0)
}

/// [`plain_prefix`]'s length alone (the cursor reads a `&str`: UTF-8 is known).
#[inline]
fn plain_run(b: &[u8]) -> usize {
    plain_prefix(b).0
}

/// The most bytes a [`TextShape`] keeps.
pub const TEXT_SHAPE_MAX: usize = 4096;

/// The bytes around one JSON string of a document: from the document's start through the
/// string's opening quote, and from its closing quote to the end of the value holding it. It
/// finds the same string again in documents that differ from the learnt one only there (a
/// stream's content events differ in their text), with two comparisons of bytes instead of a
/// walk of the document. What the rest of such a document may hold, and so whether it reads as
/// the learnt one did, is the caller's to check. At most [`TEXT_SHAPE_MAX`] bytes: a string
/// behind kilobytes of other members is not worth remembering.
///
/// ```
/// use seawall_core::json_scan::TextShape;
///
/// let doc = br#"{"delta":{"text":"Hi"},"n":1}"#;
/// // The string `"Hi"` spans bytes 17..21; the `delta` member's value ends at byte 22.
/// let shape = TextShape::around(doc, 17..21, 22).unwrap();
/// let (c, text, tail) = shape.split(br#"{"delta":{"text":"there"},"n":2}"#).unwrap();
/// assert_eq!(c.plain(text), Some("there"));
/// assert_eq!(tail, r#","n":2}"#);
/// assert!(shape.split(br#"{"delta":{"text":""},"n":2}"#).is_none()); // an empty string
/// ```
#[derive(Clone, Debug, Default)]
pub struct TextShape {
    head: Vec<u8>,
    after: String,
}

impl TextShape {
    /// The shape of `doc` around its string at `string` (its bytes, quotes included) inside a
    /// value ending at `end`; `None` past [`TEXT_SHAPE_MAX`] or when `doc` has no such bytes.
    pub fn around(doc: &[u8], string: std::ops::Range<usize>, end: usize) -> Option<TextShape> {
        let head = doc.get(..string.start.checked_add(1)?)?;
        let after = std::str::from_utf8(doc.get(string.end..end)?).ok()?;
        (head.len() + after.len() <= TEXT_SHAPE_MAX).then(|| TextShape {
            head: head.to_vec(),
            after: after.to_owned(),
        })
    }

    /// Where `doc` has this shape with a string that is not empty: a cursor just past the
    /// string (to decode it), the string, and what follows the value holding it. `None`
    /// otherwise, or when the shape holds nothing.
    pub fn split<'a>(&self, doc: &'a [u8]) -> Option<(JsonCursor<'a>, JsonStr, &'a str)> {
        if self.head.is_empty() || !doc.starts_with(&self.head) {
            return None;
        }
        // From the opening quote (ASCII: a character starts there).
        let from_quote = std::str::from_utf8(doc.get(self.head.len() - 1..)?).ok()?;
        let mut c = JsonCursor::new(from_quote);
        let s = c.string()?;
        if s.is_empty() {
            return None;
        }
        let tail = from_quote.get(c.pos()..)?.strip_prefix(&*self.after)?;
        Some((c, s, tail))
    }
}

/// Known members seen so far in one object, to refuse repeats: serde's derive rejects a
/// repeated field, and `serde_json::Value` keeps the last, so a repeat is left to serde.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen(u64);

impl Seen {
    /// Marks member `bit` (below 64) as seen; `None` if it already was.
    pub fn first(&mut self, bit: u32) -> Option<()> {
        let mask = 1u64.checked_shl(bit)?;
        if self.0 & mask != 0 {
            return None;
        }
        self.0 |= mask;
        Some(())
    }

    /// Whether member `bit` was seen.
    pub fn has(&self, bit: u32) -> bool {
        1u64.checked_shl(bit).is_some_and(|m| self.0 & m != 0)
    }
}

impl<'a> JsonCursor<'a> {
    /// A cursor at the start of `text`.
    pub fn new(text: &'a str) -> Self {
        JsonCursor {
            text,
            b: text.as_bytes(),
            i: 0,
        }
    }

    /// The position of the cursor.
    #[inline]
    pub fn pos(&self) -> usize {
        self.i
    }

    /// The next byte, if any.
    #[inline]
    pub fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// Skips JSON whitespace (space, tab, CR, LF).
    #[inline]
    pub fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.i += 1;
        }
    }

    /// Whether only whitespace is left.
    #[inline]
    pub fn at_end(&mut self) -> bool {
        self.ws();
        self.i == self.b.len()
    }

    /// Skips whitespace and takes `c`.
    #[inline]
    pub fn eat(&mut self, c: u8) -> Option<()> {
        self.ws();
        (self.peek()? == c).then(|| self.i += 1)
    }

    #[inline]
    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i.checked_add(word.len())?;
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// The kind of the next value (after whitespace).
    #[inline]
    pub fn kind(&mut self) -> Option<JsonKind> {
        self.ws();
        Some(match self.peek()? {
            b'{' => JsonKind::Object,
            b'[' => JsonKind::Array,
            b'"' => JsonKind::String,
            b't' | b'f' => JsonKind::Bool,
            b'n' => JsonKind::Null,
            b'-' | b'0'..=b'9' => JsonKind::Number,
            _ => return None,
        })
    }

    /// Takes a `null` if one is next (after whitespace): `Some(true)`; `Some(false)` if
    /// something else is next.
    #[inline]
    pub fn null(&mut self) -> Option<bool> {
        self.ws();
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Some(true);
        }
        Some(false)
    }

    /// A `true` or `false`.
    #[inline]
    pub fn boolean(&mut self) -> Option<bool> {
        self.ws();
        if self.peek()? == b't' {
            self.literal(b"true")?;
            return Some(true);
        }
        self.literal(b"false")?;
        Some(false)
    }

    /// The bytes of a string's span (its raw content: escapes are not decoded).
    #[inline]
    pub fn bytes(&self, s: JsonStr) -> &'a [u8] {
        &self.b[s.start..s.end]
    }

    /// The raw text of a string's span, escapes as written (not decoded).
    #[inline]
    pub fn raw(&self, s: JsonStr) -> Option<&'a str> {
        // Both ends are next to an ASCII quote: character boundaries.
        self.text.get(s.start..s.end)
    }

    /// The text of a string without escapes; `None` for an escaped one.
    #[inline]
    pub fn plain(&self, s: JsonStr) -> Option<&'a str> {
        if s.escaped {
            return None;
        }
        self.raw(s)
    }

    /// The text of a string: borrowed when it has no escapes, decoded by serde (the rare
    /// case, a copy) when it has.
    pub fn decoded(&self, s: JsonStr) -> Option<std::borrow::Cow<'a, str>> {
        if !s.escaped {
            return self.raw(s).map(std::borrow::Cow::Borrowed);
        }
        // With its quotes: a JSON string serde decodes.
        let quoted = self
            .text
            .get(s.start.checked_sub(1)?..s.end.checked_add(1)?)?;
        serde_json::from_str::<String>(quoted)
            .ok()
            .map(std::borrow::Cow::Owned)
    }

    /// A string whose `"` is next (after whitespace), its escapes checked as serde checks them
    /// (surrogate escapes, paired or not, are left to serde).
    #[inline]
    pub fn string(&mut self) -> Option<JsonStr> {
        self.ws();
        if self.peek()? != b'"' {
            return None;
        }
        let start = self.i + 1;
        // Most strings (every member name, most values) have no escape: found here, inline,
        // by one run to the closing quote; the rest are read out of line.
        let end = start + plain_run(self.b.get(start..)?);
        if self.b.get(end) == Some(&b'"') {
            self.i = end + 1;
            return Some(JsonStr {
                start,
                end,
                escaped: false,
            });
        }
        self.i = end;
        self.string_rest(start)
    }

    /// The rest of a string from its first escape or control character at the cursor.
    #[inline(never)]
    fn string_rest(&mut self, start: usize) -> Option<JsonStr> {
        let mut escaped = false;
        loop {
            self.i += plain_run(&self.b[self.i..]);
            match self.peek()? {
                b'"' => {
                    let end = self.i;
                    self.i += 1;
                    return Some(JsonStr {
                        start,
                        end,
                        escaped,
                    });
                }
                b'\\' => {
                    escaped = true;
                    self.i += 1;
                    match self.peek()? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 1,
                        b'u' => {
                            let hex = self.b.get(self.i + 1..self.i + 5)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            let hex = std::str::from_utf8(hex).ok()?;
                            let code = u16::from_str_radix(hex, 16).ok()?;
                            if (0xD800..=0xDFFF).contains(&code) {
                                return None;
                            }
                            self.i += 5;
                        }
                        _ => return None,
                    }
                }
                // A control character: serde refuses it.
                _ => return None,
            }
        }
    }

    /// A member's name whose `"` is next, unescaped (an escaped name is left to serde), and
    /// its `:`.
    #[inline]
    pub fn key(&mut self) -> Option<&'a [u8]> {
        let s = self.string()?;
        if s.escaped {
            return None;
        }
        self.eat(b':')?;
        Some(self.bytes(s))
    }

    /// The members of an object whose `{` is next, each handed to `member` with its name;
    /// `member` reads the value.
    pub fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>,
    ) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        self.ws();
        let name = self.key()?;
        member(self, name)?;
        self.rest_of_object(member)
    }

    /// The rest of an object after one of its members: each further member handed to
    /// `member` with its name, then the object's `}`.
    pub fn rest_of_object(
        &mut self,
        mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>,
    ) -> Option<()> {
        loop {
            self.ws();
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.ws();
                    let name = self.key()?;
                    member(self, name)?;
                }
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// The elements of an array whose `[` is next; gives back how many.
    pub fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<usize> {
        self.eat(b'[')?;
        self.ws();
        if self.peek()? == b']' {
            self.i += 1;
            return Some(0);
        }
        let mut n = 0;
        loop {
            element(self)?;
            n += 1;
            self.ws();
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(n);
                }
                _ => return None,
            }
        }
    }

    /// An unsigned integer as serde reads a `u64`: digits only, no sign, no leading zero, no
    /// fraction or exponent, no overflow.
    pub fn count(&mut self) -> Option<u64> {
        self.ws();
        let start = self.i;
        let mut n: u64 = 0;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            self.i += 1;
        }
        let len = self.i - start;
        if len == 0 || (len > 1 && self.b[start] == b'0') {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = self.peek() {
            return None;
        }
        Some(n)
    }

    /// A count, or `None` inside for a `null`.
    pub fn count_or_null(&mut self) -> Option<Option<u64>> {
        if self.null()? {
            return Some(None);
        }
        self.count().map(Some)
    }

    /// A number of JSON's grammar that any serde reading accepts: no exponent, and at most
    /// 18 integer digits (so it is finite as an `f64` too).
    pub fn number(&mut self) -> Option<()> {
        self.ws();
        if self.peek()? == b'-' {
            self.i += 1;
        }
        let start = self.i;
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.i - start > MAX_DIGITS {
            return None;
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            let start = self.i;
            self.digits();
            if self.i == start {
                return None;
            }
        }
        match self.peek() {
            Some(b'e' | b'E') => None,
            _ => Some(()),
        }
    }

    #[inline]
    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
    }

    /// Any JSON value, checked and skipped; `depth` is the nesting of the value.
    pub fn skip(&mut self, depth: u32) -> Option<()> {
        self.skip_value(depth, false)
    }

    /// Any JSON value, skipped as a serde derive skips a member it does not know
    /// (`IgnoredAny`): like [`skip`](Self::skip), but a number only has to follow JSON's
    /// grammar, since its value is never computed (an exponent or any count of digits).
    pub fn skip_ignored(&mut self, depth: u32) -> Option<()> {
        self.skip_value(depth, true)
    }

    fn skip_value(&mut self, depth: u32, ignored: bool) -> Option<()> {
        match self.kind()? {
            JsonKind::Object => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                self.object(|s, _| s.skip_value(depth + 1, ignored))
            }
            JsonKind::Array => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                self.array(|s| s.skip_value(depth + 1, ignored)).map(|_| ())
            }
            JsonKind::String => self.string().map(|_| ()),
            JsonKind::Bool => self.boolean().map(|_| ()),
            JsonKind::Null => self.literal(b"null"),
            JsonKind::Number if ignored => self.any_number(),
            JsonKind::Number => self.number(),
        }
    }

    /// A number of JSON's grammar: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn any_number(&mut self) -> Option<()> {
        if self.peek()? == b'-' {
            self.i += 1;
        }
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.some_digits()?;
        }
        Some(())
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.i;
        self.digits();
        (self.i > start).then_some(())
    }
}

/// One value of a [`JsonTape`]: where it is, its member name (inside an object), its kind,
/// and where its subtree ends on the tape.
#[derive(Clone, Copy, Debug)]
struct Node {
    /// The member name's span (without quotes); empty for an element or the root.
    key: (u32, u32),
    /// The value's span, from its first byte to just after its last.
    span: (u32, u32),
    /// The tape index just after this value's subtree: its next sibling, if any.
    next: u32,
    kind: JsonKind,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            key: (0, 0),
            span: (0, 0),
            next: 0,
            kind: JsonKind::Null,
        }
    }
}

/// The most values a [`JsonTape`] holds; a larger document is left to serde.
pub const TAPE_NODES: usize = 64;

/// A small JSON document checked in one pass and laid out flat, without allocating: every
/// value's span, kind and member name, in document order, so that looking a member up is a
/// walk over its siblings, not another pass over the bytes. For the events of a stream, a few
/// hundred bytes each, read for a few fields.
///
/// Like [`JsonCursor`], it only takes documents it is sure `serde_json` reads as the same
/// value (and more than [`TAPE_NODES`] values are refused): its lookups answer as
/// `serde_json::Value`'s do, the last of repeated members winning.
#[derive(Clone, Debug)]
pub struct JsonTape<'a> {
    text: &'a str,
    nodes: [Node; TAPE_NODES],
    len: usize,
}

impl Default for JsonTape<'_> {
    fn default() -> Self {
        JsonTape::new()
    }
}

impl<'a> JsonTape<'a> {
    /// An empty tape, to [`read`](Self::read) a document into (in place: a tape is over a
    /// kilobyte, not worth moving).
    pub fn new() -> Self {
        JsonTape {
            text: "",
            nodes: [Node::default(); TAPE_NODES],
            len: 0,
        }
    }

    /// Reads the document `text`; `None` when not sure (or too large). Its root on success.
    pub fn read(&mut self, text: &'a str) -> Option<JsonNode<'_, 'a>> {
        self.text = text;
        self.len = 0;
        let mut s = JsonCursor::new(text);
        self.value(&mut s, (0, 0), 0)?;
        s.at_end().then(|| self.root())
    }

    fn value(&mut self, s: &mut JsonCursor<'a>, key: (u32, u32), depth: u32) -> Option<()> {
        let at = self.len;
        if at == TAPE_NODES || depth >= MAX_DEPTH {
            return None;
        }
        self.len += 1;
        let kind = s.kind()?;
        let start = u32::try_from(s.pos()).ok()?;
        match kind {
            JsonKind::Object => {
                s.eat(b'{')?;
                s.ws();
                if s.peek()? == b'}' {
                    s.i += 1;
                } else {
                    loop {
                        s.ws();
                        let name = s.string()?;
                        if name.escaped {
                            return None;
                        }
                        s.eat(b':')?;
                        let key = (
                            u32::try_from(name.start).ok()?,
                            u32::try_from(name.end).ok()?,
                        );
                        self.value(s, key, depth + 1)?;
                        s.ws();
                        match s.peek()? {
                            b',' => s.i += 1,
                            b'}' => {
                                s.i += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
            }
            JsonKind::Array => {
                s.array(|s| self.value(s, (0, 0), depth + 1))?;
            }
            JsonKind::String => {
                s.string()?;
            }
            JsonKind::Bool => {
                s.boolean()?;
            }
            JsonKind::Null => {
                s.null()?;
            }
            JsonKind::Number => s.number()?,
        }
        self.nodes[at] = Node {
            key,
            span: (start, u32::try_from(s.pos()).ok()?),
            next: u32::try_from(self.len).ok()?,
            kind,
        };
        Some(())
    }

    /// The root value.
    pub fn root(&self) -> JsonNode<'_, 'a> {
        JsonNode { tape: self, i: 0 }
    }
}

/// A value of a [`JsonTape`].
#[derive(Clone, Copy, Debug)]
pub struct JsonNode<'t, 'a> {
    tape: &'t JsonTape<'a>,
    i: usize,
}

impl<'t, 'a> JsonNode<'t, 'a> {
    fn node(&self) -> &'t Node {
        &self.tape.nodes[self.i]
    }

    /// Its kind.
    pub fn kind(&self) -> JsonKind {
        self.node().kind
    }

    /// Its member name, inside an object (never escaped: the tape refuses escaped names);
    /// empty for an element or the root.
    pub fn key(&self) -> &'a str {
        let (start, end) = self.node().key;
        self.tape
            .text
            .get(start as usize..end as usize)
            .unwrap_or("")
    }

    /// Hands each member of an object to `f` with its name, stopping at the first `None`
    /// (which it returns); `None` too when it is not an object.
    pub fn members(
        &self,
        mut f: impl FnMut(&'a str, JsonNode<'t, 'a>) -> Option<()>,
    ) -> Option<()> {
        if self.kind() != JsonKind::Object {
            return None;
        }
        let end = self.node().next as usize;
        let mut c = self.i + 1;
        while c < end {
            let child = JsonNode {
                tape: self.tape,
                i: c,
            };
            f(child.key(), child)?;
            c = self.tape.nodes[c].next as usize;
        }
        Some(())
    }

    /// Where its bytes start and end in the document.
    pub fn span(&self) -> (usize, usize) {
        let (start, end) = self.node().span;
        (start as usize, end as usize)
    }

    /// Its bytes in the document.
    pub fn raw(&self) -> &'a str {
        let (start, end) = self.node().span;
        self.tape
            .text
            .get(start as usize..end as usize)
            .unwrap_or("")
    }

    /// Hands each child (the members of an object, the elements of an array) to `f`.
    pub fn each_child(&self, mut f: impl FnMut(JsonNode<'t, 'a>)) {
        let end = self.node().next as usize;
        let mut c = self.i + 1;
        while c < end {
            f(JsonNode {
                tape: self.tape,
                i: c,
            });
            c = self.tape.nodes[c].next as usize;
        }
    }

    /// The member `key` of an object (the last of that name, as `serde_json::Value` keeps
    /// it); `None` for anything else.
    pub fn get(&self, key: &str) -> Option<JsonNode<'t, 'a>> {
        let [found] = self.get_many([key]);
        found
    }

    /// The members `keys` of an object, as [`get`](Self::get) finds each, in one walk over
    /// its members; all `None` for anything else.
    pub fn get_many<const N: usize>(&self, keys: [&str; N]) -> [Option<JsonNode<'t, 'a>>; N] {
        let mut found = [None; N];
        if self.kind() != JsonKind::Object {
            return found;
        }
        let (text, nodes) = (self.tape.text.as_bytes(), &self.tape.nodes);
        let (mut c, end) = (self.i + 1, self.node().next as usize);
        while let Some(n) = nodes.get(c).filter(|_| c < end) {
            let (start, stop) = (n.key.0 as usize, n.key.1 as usize);
            for (key, slot) in keys.iter().zip(found.iter_mut()) {
                // Lengths first: most members differ in length from a name asked for.
                if stop - start == key.len() && text.get(start..stop) == Some(key.as_bytes()) {
                    *slot = Some(JsonNode {
                        tape: self.tape,
                        i: c,
                    });
                }
            }
            c = n.next as usize;
        }
        found
    }

    /// Whether it is an empty array or object.
    pub fn is_empty(&self) -> bool {
        self.node().next as usize == self.i + 1
    }

    /// The text of a string (escapes decoded by serde, the rare case); `None` for anything
    /// else.
    pub fn str(&self) -> Option<std::borrow::Cow<'a, str>> {
        if self.kind() != JsonKind::String {
            return None;
        }
        let raw = self.raw();
        let inner = raw.get(1..raw.len().saturating_sub(1))?;
        if inner.contains('\\') {
            return serde_json::from_str::<String>(raw)
                .ok()
                .map(std::borrow::Cow::Owned);
        }
        Some(std::borrow::Cow::Borrowed(inner))
    }

    /// A non-negative integer that fits a `u64` (as `serde_json` reads one: no sign,
    /// fraction or exponent); `None` for anything else.
    pub fn u64(&self) -> Option<u64> {
        let raw = self.raw();
        if self.kind() != JsonKind::Number || !raw.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        raw.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_run_ends_at_the_first_quote_backslash_or_control_character() {
        for (text, len, ascii) in [
            ("", 0, true),
            ("abc", 3, true),
            ("abcdefghij\"x", 10, true),
            ("abcdefg\\hij", 7, true),
            ("ab\ncdefghij", 2, true),
            ("ab\u{1f}", 2, true),
            ("\"abcdefghij", 0, true),
            ("abcdefgh\"", 8, true),
            ("é\"abcdefgh", 2, false),
            ("abcdefgé\"", 9, false),
            ("abc\"é", 3, true),
            ("abcdefghijklmnop\u{7f}é", 19, false),
            // Across the sixteen-byte blocks and into the last fifteen bytes.
            ("abcdefghijklmno\"", 15, true),
            ("abcdefghijklmnop\"", 16, true),
            ("abcdefghijklmnopq\\", 17, true),
            ("é123456789abcdefghijklmnopqrstu\n", 32, false),
            ("0123456789abcdef0123456789abcdefé\"", 34, false),
            ("0123456789abcdef0123456789abcdef\"é", 32, true),
        ] {
            assert_eq!(plain_prefix(text.as_bytes()), (len, ascii), "{text:?}");
        }
    }

    /// The plain run as its definition says, a byte at a time.
    fn plain_prefix_bytes(b: &[u8]) -> (usize, bool) {
        let n = b
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
            .unwrap_or(b.len());
        (n, b[..n].is_ascii())
    }

    proptest::proptest! {
        /// Bytes drawn mostly from the ones the test tells apart (the specials, the edges of
        /// the control range and of ASCII), at every length across two vector blocks.
        #[test]
        fn the_vector_test_finds_the_run_a_byte_at_a_time_would(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![
                    8 => proptest::sample::select(b"a ~\x20\x7f".to_vec()),
                    1 => proptest::sample::select(b"\"\\\x00\x1f\x80\xc3\xff".to_vec()),
                ],
                0..72,
            ),
        ) {
            let want = plain_prefix_bytes(&bytes);
            proptest::prop_assert_eq!(plain_prefix(&bytes), want);
            proptest::prop_assert_eq!(plain_prefix_words(&bytes), want);
        }
    }

    fn skips(doc: &str) -> bool {
        let mut c = JsonCursor::new(doc);
        c.skip(0).is_some() && c.at_end()
    }

    #[test]
    fn plain_documents_are_read_as_serde_reads_them() {
        for doc in [
            r#"{"a":[1,2.5,-3,true,false,null,"x\n\u00e9"],"b":{}}"#,
            r#"{"a long member name, past eight bytes: clé":{"é":"ü"},"":0}"#,
            " [ ] ",
            r#""""#,
            "0",
        ] {
            assert!(skips(doc), "{doc}");
            assert!(serde_json::from_str::<serde_json::Value>(doc).is_ok());
        }
    }

    #[test]
    fn doubtful_documents_are_left_to_serde() {
        for doc in [
            r#"{"a":1"#,
            r#"{"a":01}"#,
            r#"{"a":1e400}"#,
            r#"{"\u0061":1}"#,
            r#"{"a\"b":1}"#,
            "{\"a\u{1}\":1}",
            "{\"a\nb\":1}",
            r#"["\ud800"]"#,
            "[\"\u{1}\"]",
            "[1,]",
            "nul",
            "99999999999999999999999",
        ] {
            assert!(!skips(doc), "{doc}");
        }
    }

    #[test]
    fn counts_are_plain_u64s() {
        let count = |s: &str| JsonCursor::new(s).count();
        assert_eq!(count("42"), Some(42));
        assert_eq!(count("18446744073709551615"), Some(u64::MAX));
        assert_eq!(count("18446744073709551616"), None);
        assert_eq!(count("-1"), None);
        assert_eq!(count("1.0"), None);
        assert_eq!(count("007"), None);
    }

    #[test]
    fn a_member_seen_twice_is_refused() {
        let mut seen = Seen::default();
        assert!(seen.first(3).is_some());
        assert!(seen.first(3).is_none());
        assert!(seen.has(3) && !seen.has(2));
        assert!(seen.first(64).is_none());
    }

    #[test]
    fn a_tape_finds_the_last_of_repeated_members() {
        let doc = r#"{"a":{"b":[1,{"c":"x"}],"b":2},"d":null}"#;
        let mut tape = JsonTape::new();
        let root = tape.read(doc).unwrap();
        let a = root.get("a").unwrap();
        assert_eq!(a.get("b").unwrap().raw(), "2");
        assert_eq!(root.get("d").unwrap().kind(), JsonKind::Null);
        assert!(root.get("b").is_none());
        let mut n = 0;
        root.each_child(|_| n += 1);
        assert_eq!(n, 2);
        let big = format!("[{}0]", "0,".repeat(TAPE_NODES));
        assert!(JsonTape::new().read(&big).is_none());
    }

    #[test]
    fn members_read_in_one_walk_are_those_each_lookup_finds() {
        let doc = r#"{"type":"x","usage":1,"choices":[],"usage":2,"ab":3,"ba":4}"#;
        let mut tape = JsonTape::new();
        let root = tape.read(doc).unwrap();
        let names = ["usage", "missing", "ba", "type", "ab", "choices", "usage"];
        let many = root.get_many(names);
        for (name, found) in names.iter().zip(many) {
            assert_eq!(
                found.map(|n| n.raw()),
                root.get(name).map(|n| n.raw()),
                "{name}"
            );
        }
        assert_eq!(many[0].unwrap().raw(), "2");
        assert!(many[1].is_none());
        let list = root.get("choices").unwrap();
        assert!(
            list.get_many(["type"])[0].is_none(),
            "an array has no members"
        );
    }

    #[test]
    fn deep_nesting_is_left_to_serde() {
        let deep = format!("{}{}", "[".repeat(70), "]".repeat(70));
        assert!(!skips(&deep));
        let shallow = format!("{}{}", "[".repeat(60), "]".repeat(60));
        assert!(skips(&shallow));
    }
}
