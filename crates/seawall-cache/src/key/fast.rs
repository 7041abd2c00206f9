//! The canonical form written straight from the body's bytes, without serde.
//!
//! Keying a request is most of what a hit costs, and going through serde's generic visitor
//! (a call per token, through `Deserializer` and `Visitor` layers) costs about as much as
//! parsing the body into a tree. This scanner writes the same canonical form into the same
//! [`Canon`] in one plain loop over the bytes.
//!
//! It never decides anything on its own: it handles the bodies requests actually carry
//! (objects, arrays, strings with any escapes, integers, short decimals) and gives up, with
//! `None`, on anything it is not sure to read exactly as `serde_json` does: invalid or unusual
//! JSON, lone surrogates, numbers whose value `serde_json` might round differently (digits
//! that pass 2^53, about 16 of them; exponents beyond 10^22), deep nesting, an unusual `stream_options`.
//! The caller then runs the general path, which decides. So for every body the fast path
//! either writes exactly the bytes the general path would, or nothing (a test checks this
//! against the general path on generated bodies).

use seawall_core::json_scan::plain_prefix;

use super::{Canon, Field, Member, leb128, leb128_len, words};

/// The one-byte form of `stream_options`' one member.
const INCLUDE_USAGE: u8 = words::token("include_usage");

/// Deeper bodies are left to the general path (which stops at 128 levels).
const MAX_DEPTH: u32 = 64;

/// Below 2^53 every integer is exact in an `f64`; times or divided by an exact power of ten
/// (up to 10^22), the result is correctly rounded, so it is the same whoever computes it.
const EXACT: u64 = 1 << 53;

const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// Writes the canonical form of `body` into `canon` (freshly reset), or gives up.
pub(super) fn canonical(body: &[u8], canon: &mut Canon) -> Option<()> {
    let mut s = Scan {
        b: body,
        i: 0,
        canon,
    };
    s.ws();
    if s.peek()? != b'{' {
        return None;
    }
    s.canon.object = true;
    s.object(0)?;
    s.ws();
    (s.i == body.len()).then_some(())
}

/// Appends `body[at..at + len]` to `buf`. Most runs in a request are short (a key, a role, a
/// model name): one of up to 16 bytes is copied as 16, as one vector move, and the extra
/// bytes cut off again, instead of a call to `memcpy` whose setup costs more than the copy.
fn copy_short(buf: &mut Vec<u8>, body: &[u8], at: usize, len: usize) {
    match body.get(at..at + 16) {
        Some(chunk) if len <= 16 => {
            let end = buf.len() + len;
            buf.extend_from_slice(chunk);
            buf.truncate(end);
        }
        _ => buf.extend_from_slice(&body[at..at + len]),
    }
}

struct Scan<'a, 'c> {
    b: &'a [u8],
    i: usize,
    canon: &'c mut Canon,
}

impl Scan<'_, '_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.i += 1;
        }
    }

    /// Skips whitespace and takes `c`, or gives up.
    fn eat(&mut self, c: u8) -> Option<()> {
        self.ws();
        (self.peek()? == c).then(|| self.i += 1)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    fn value(&mut self, depth: u32) -> Option<()> {
        self.ws();
        match self.peek()? {
            b'{' => self.object(depth),
            b'[' => self.array(depth),
            b'"' => self.string().map(drop),
            b't' => {
                self.literal(b"true")?;
                self.canon.buf.push(b't');
                Some(())
            }
            b'f' => {
                self.literal(b"false")?;
                self.canon.buf.push(b'f');
                Some(())
            }
            b'n' => {
                self.literal(b"null")?;
                self.canon.buf.push(b'n');
                Some(())
            }
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// An `Option<bool>` (a top-level `stream`, `include_usage`): `null` is `false`.
    fn flag(&mut self) -> Option<bool> {
        self.ws();
        match self.peek()? {
            b't' => self.literal(b"true").map(|()| true),
            b'f' => self.literal(b"false").map(|()| false),
            b'n' => self.literal(b"null").map(|()| false),
            _ => None,
        }
    }

    /// Reads a key into `canon.buf` as a string and gives back its one-byte form if it is
    /// one of the words (0 if not).
    fn key(&mut self) -> Option<u8> {
        self.ws();
        if self.peek()? != b'"' {
            return None;
        }
        self.string()
    }

    /// An object whose `{` is next.
    fn object(&mut self, depth: u32) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.i += 1;
        let top = depth == 0;
        self.canon.buf.push(b'{');
        let start = self.canon.buf.len();
        let base = self.canon.members.len();
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
        } else {
            loop {
                let member = self.canon.buf.len();
                let word = self.key()?;
                let field = if top { Field::of(word) } else { Field::Other };
                self.eat(b':')?;
                match field {
                    Field::Stream => {
                        self.canon.buf.truncate(member);
                        self.canon.facts.stream = self.flag()?;
                    }
                    Field::StreamOptions => {
                        self.canon.buf.truncate(member);
                        self.canon.facts.include_usage = self.stream_options()?;
                    }
                    field => {
                        let key_end = self.canon.buf.len();
                        self.canon.number = None;
                        self.value(depth + 1)?;
                        self.canon.fact(field);
                        let end = self.canon.buf.len();
                        self.canon.members.push(Member {
                            start: member,
                            key_end,
                            end,
                        });
                    }
                }
                self.ws();
                match self.peek()? {
                    b',' => self.i += 1,
                    b'}' => {
                        self.i += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.canon.close_object(start, base);
        Some(())
    }

    /// `stream_options`: `null`, or an object of at most one `include_usage` flag. Anything
    /// else (other members, which serde ignores, or the sequence form) is the general path's.
    fn stream_options(&mut self) -> Option<bool> {
        self.ws();
        match self.peek()? {
            b'n' => self.literal(b"null").map(|()| false),
            b'{' => {
                self.i += 1;
                self.ws();
                if self.peek()? == b'}' {
                    self.i += 1;
                    return Some(false);
                }
                // The key is read into the buffer's tail, then dropped.
                let mark = self.canon.buf.len();
                let is_flag = self.key()? == INCLUDE_USAGE;
                self.canon.buf.truncate(mark);
                if !is_flag {
                    return None;
                }
                self.eat(b':')?;
                let flag = self.flag()?;
                self.eat(b'}')?;
                Some(flag)
            }
            _ => None,
        }
    }

    /// An array whose `[` is next.
    fn array(&mut self, depth: u32) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.i += 1;
        self.canon.buf.push(b'[');
        self.ws();
        if self.peek()? == b']' {
            self.i += 1;
        } else {
            loop {
                self.value(depth + 1)?;
                self.ws();
                match self.peek()? {
                    b',' => self.i += 1,
                    b']' => {
                        self.i += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.canon.buf.push(b']');
        Some(())
    }

    /// A string whose `"` is next, written as `Canon::str` does: one of the words as its one
    /// byte (given back), any other as its tag, its length, its text unescaped (0 given back).
    fn string(&mut self) -> Option<u8> {
        self.i += 1;
        // One byte is kept for the length, which is not known until the closing quote; a
        // length of 128 or more (its LEB128 takes more bytes) moves the text up.
        self.canon.buf.extend_from_slice(&[b's', 0]);
        let text = self.canon.buf.len();
        loop {
            // A run of plain bytes, checked as UTF-8 at once. No byte of a multi-byte UTF-8
            // sequence is a quote or a backslash, so runs split only between characters.
            let run = self.i;
            let (len, ascii) = plain_prefix(&self.b[run..]);
            self.i += len;
            let plain = &self.b[run..self.i];
            if !ascii {
                std::str::from_utf8(plain).ok()?;
            }
            copy_short(&mut self.canon.buf, self.b, run, len);
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    break;
                }
                b'\\' => {
                    let esc = *self.b.get(self.i + 1)?;
                    self.i += 2;
                    let byte = match esc {
                        b'"' => b'"',
                        b'\\' => b'\\',
                        b'/' => b'/',
                        b'b' => 0x08,
                        b'f' => 0x0c,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'u' => {
                            let c = self.unicode()?;
                            let mut utf8 = [0; 4];
                            let c = c.encode_utf8(&mut utf8);
                            self.canon.buf.extend_from_slice(c.as_bytes());
                            continue;
                        }
                        _ => return None,
                    };
                    self.canon.buf.push(byte);
                }
                // A control character: not JSON.
                _ => return None,
            }
        }
        let buf = &mut self.canon.buf;
        let len = buf.len() - text;
        if let Some(word) = words::word(&buf[text..]) {
            buf.truncate(text - 2);
            buf.push(word);
            return Some(word);
        }
        if len < 0x80 {
            buf[text - 1] = len as u8;
            return Some(0);
        }
        let extra = leb128_len(len as u64) - 1;
        buf.resize(buf.len() + extra, 0);
        buf.copy_within(text..text + len, text + extra);
        let mut at = text - 1;
        leb128(len as u64, |b| {
            buf[at] = b;
            at += 1;
        });
        Some(0)
    }

    /// The character of a `\u` escape whose four hex digits are next (a surrogate pair as
    /// one character); a lone surrogate gives up.
    fn unicode(&mut self) -> Option<char> {
        let first = self.hex4()?;
        let code = match first {
            0xD800..=0xDBFF => {
                if self.b.get(self.i..self.i + 2)? != b"\\u" {
                    return None;
                }
                self.i += 2;
                let low = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return None;
                }
                0x10000 + ((first - 0xD800) << 10) + (low - 0xDC00)
            }
            0xDC00..=0xDFFF => return None,
            c => c,
        };
        char::from_u32(code)
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.b.get(self.i..self.i + 4)?;
        let mut n = 0;
        for &d in digits {
            n = n * 16 + char::from(d).to_digit(16)?;
        }
        self.i += 4;
        Some(n)
    }

    /// A number, written by value as the general path writes it.
    fn number(&mut self) -> Option<()> {
        let negative = self.peek()? == b'-';
        if negative {
            self.i += 1;
        }
        let mut significand: u64 = 0;
        match self.peek()? {
            b'0' => {
                self.i += 1;
                // No leading zeros in JSON.
                if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    return None;
                }
            }
            b'1'..=b'9' => {
                while let Some(c @ b'0'..=b'9') = self.peek() {
                    // Up to 15 digits: exact, and far from `i64`'s bounds.
                    if significand >= EXACT / 10 {
                        return None;
                    }
                    significand = significand * 10 + u64::from(c - b'0');
                    self.i += 1;
                }
            }
            _ => return None,
        }
        let mut exponent: i32 = 0;
        let mut float = false;
        if self.peek() == Some(b'.') {
            float = true;
            self.i += 1;
            let digits = self.i;
            while let Some(c @ b'0'..=b'9') = self.peek() {
                if significand >= EXACT / 10 {
                    return None;
                }
                significand = significand * 10 + u64::from(c - b'0');
                exponent -= 1;
                self.i += 1;
            }
            if self.i == digits {
                return None;
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            float = true;
            self.i += 1;
            let minus = match self.peek()? {
                b'-' => {
                    self.i += 1;
                    true
                }
                b'+' => {
                    self.i += 1;
                    false
                }
                _ => false,
            };
            let digits = self.i;
            let mut e: i32 = 0;
            while let Some(c @ b'0'..=b'9') = self.peek() {
                if e >= 1000 {
                    return None;
                }
                e = e * 10 + i32::from(c - b'0');
                self.i += 1;
            }
            if self.i == digits {
                return None;
            }
            exponent += if minus { -e } else { e };
        }
        if !float {
            let v = i128::from(significand);
            self.canon.int(if negative { -v } else { v });
            return Some(());
        }
        let pow = *POW10.get(exponent.unsigned_abs() as usize)?;
        let magnitude = significand as f64;
        let v = if exponent >= 0 {
            magnitude * pow
        } else {
            magnitude / pow
        };
        self.canon.float(if negative { -v } else { v });
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{BodyFacts, Canon, general};
    use super::spelling::{Rng, write};
    use proptest::prelude::*;
    use serde_json::Value;

    /// The canonical form and facts of `body` by both paths: the fast one, if it did not give
    /// up, and the general one, if the body is keyable.
    type Written = (Vec<u8>, BodyFacts);

    fn both(body: &[u8]) -> (Option<Written>, Option<Written>) {
        let mut canon = Canon::default();
        let fast = super::canonical(body, &mut canon)
            .filter(|()| canon.object)
            .map(|()| (canon.buf.clone(), canon.facts));
        let mut canon = Canon::default();
        let general = general(body, &mut canon)
            .ok()
            .filter(|()| canon.object)
            .map(|()| (canon.buf.clone(), canon.facts));
        (fast, general)
    }

    /// The fast path writes what the general one writes, or gives up.
    fn agree(body: &[u8]) -> Result<(), TestCaseError> {
        let (fast, general) = both(body);
        if let Some(fast) = fast {
            prop_assert_eq!(Some(fast), general, "{}", String::from_utf8_lossy(body));
        }
        Ok(())
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("stream".to_owned()),
            Just("stream_options".to_owned()),
            Just("include_usage".to_owned()),
            Just("temperature".to_owned()),
            Just("n".to_owned()),
            Just("best_of".to_owned()),
            "[a-z_\"\\\\/\n\u{0}-\u{1f}é😀]{0,6}",
            // The words written as one byte, whatever their spelling (escapes).
            prop::sample::select(&super::super::words::WORDS[..]).prop_map(str::to_owned),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1_000_000i64..1_000_000, 0u32..8)
                .prop_map(|(m, e)| Value::from(m as f64 / 10f64.powi(e as i32))),
            any::<f64>().prop_map(Value::from),
            "[ a-z\"\\\\/\n\u{0}-\u{1f}\u{7f}é€😀]{0,16}".prop_map(Value::String),
            prop::sample::select(&super::super::words::WORDS[..]).prop_map(Value::from),
            // Around 128 bytes, where a length's LEB128 grows to two bytes.
            "[ a-z\"\\\\/\n\u{0}-\u{1f}é😀]{100,140}".prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map(key(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A request body: an object with the fields the policy reads among others.
    fn body() -> impl Strategy<Value = Value> {
        prop::collection::btree_map(key(), value(), 0..8)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn the_fast_path_writes_what_the_general_path_writes(body in body(), seed in 1u64..) {
            let mut out = String::new();
            write(&body, &mut Rng(seed), false, &mut out);
            agree(out.as_bytes())?;
        }

        #[test]
        fn the_fast_path_keys_every_plainly_written_body_itself(body in body()) {
            // serde_json's own writing (no spelling games): the fast path takes every keyable
            // body, unless a number has more digits than it reads exactly or `stream_options`
            // has more than its flag.
            let text = serde_json::to_string(&body).unwrap();
            let (fast, general) = both(text.as_bytes());
            let long_number = text
                .split(|c: char| !(c.is_ascii_digit() || ".eE+-".contains(c)))
                .any(|t| {
                    let digits = t.chars().filter(char::is_ascii_digit).count();
                    digits > 15 || (digits > 0 && t.contains(['e', 'E']))
                });
            let odd_options = body.get("stream_options").is_some_and(|o| match o {
                Value::Null => false,
                Value::Object(m) => m.iter().any(|(k, v)| k != "include_usage" || !(v.is_boolean() || v.is_null())),
                _ => true,
            });
            prop_assert!(fast.is_some() || general.is_none() || long_number || odd_options, "{}", text);
            prop_assert_eq!(fast.is_some().then_some(general.clone()).flatten(), fast);
        }

        #[test]
        fn keys_do_not_depend_on_order_whitespace_escapes_or_number_spelling(
            body in body(),
            seed in 1u64..,
        ) {
            let plain = serde_json::to_string(&body).unwrap();
            let mut spelled = String::new();
            write(&body, &mut Rng(seed), true, &mut spelled);
            // The canonical form only: which number a nonsensical `temperature` object gives
            // depends on its members' order, as it always did.
            let (a, b) = (both(plain.as_bytes()), both(spelled.as_bytes()));
            prop_assert_eq!(a.1.map(|w| w.0), b.1.map(|w| w.0));
            if let (Some(a), Some(b)) = (a.0, b.0) {
                prop_assert_eq!(a.0, b.0);
            }
        }

        #[test]
        fn a_damaged_body_is_never_read_differently(
            body in body(),
            seed in 1u64..,
            cuts in prop::collection::vec((any::<prop::sample::Index>(), 0usize..12), 1..4),
        ) {
            let mut bytes = Vec::new();
            let mut out = String::new();
            write(&body, &mut Rng(seed), true, &mut out);
            bytes.extend_from_slice(out.as_bytes());
            for (at, what) in cuts {
                let i = at.index(bytes.len() + 1);
                let junk: &[u8] = [
                    &b"\""[..], b"\\", b",", b":", b"{", b"}", b"[", b"]", b"-", b"e", b"\\u", b"\xff",
                ][what];
                if what % 2 == 0 && i < bytes.len() {
                    bytes.remove(i);
                } else {
                    bytes.splice(i..i, junk.iter().copied());
                }
            }
            agree(&bytes)?;
        }
    }

    #[test]
    fn a_string_is_its_tag_its_length_in_leb128_and_its_text() {
        for len in [0, 1, 127, 128, 129, 16_383, 16_384] {
            let text = "a".repeat(len);
            // Escapes make the raw string longer than its text: one `\n` in place of the
            // last `a`, so the unescaped length is still `len`.
            let raw = match len {
                0 => String::new(),
                _ => format!("{}\\n", &text[1..]),
            };
            let body = format!(r#"{{"k":"{raw}"}}"#);
            let (fast, _) = both(body.as_bytes());
            let (fast, _) = fast.expect("the fast path reads it");
            agree(body.as_bytes()).unwrap();
            let width = if len < 128 {
                1
            } else if len < 16_384 {
                2
            } else {
                3
            };
            // `{`, the key (`s`, 1, `k`), the value's tag, its length, its text, `}`.
            assert_eq!(fast.len(), 1 + 3 + 1 + width + len + 1, "{len}");
            assert_eq!(&fast[4..5], b"s");
            let mut expect = Vec::new();
            super::super::leb128(len as u64, |b| expect.push(b));
            assert_eq!(super::super::leb128_len(len as u64), width);
            assert_eq!(&fast[5..5 + width], &expect[..], "{len}");
        }
    }

    #[test]
    fn what_the_fast_path_leaves_to_the_general_path() {
        for body in [
            r#"{"a":1.00000000000000001}"#,
            r#"{"a":1e300}"#,
            r#"{"a":"\ud800"}"#,
            r#"{"stream_options":{"include_usage":true,"x":1}}"#,
            r#"{"stream":"yes"}"#,
            r#"[1]"#,
            r#"{"a":01}"#,
            r#"{"a":1,}"#,
        ] {
            let (fast, _) = both(body.as_bytes());
            assert!(fast.is_none(), "{body}");
            agree(body.as_bytes()).unwrap();
        }
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(100), "]".repeat(100));
        assert!(both(deep.as_bytes()).0.is_none());
        assert!(both(deep.as_bytes()).1.is_some());
    }

    #[test]
    fn the_fast_path_reads_the_policy_facts() {
        let (fast, general) = both(
            br#"{"stream":true,"stream_options":{"include_usage":true},"temperature":0.7,"n":3}"#,
        );
        let facts = fast.expect("the fast path reads it").1;
        assert_eq!(Some(facts), general.map(|g| g.1));
        assert!(facts.stream && facts.include_usage);
        assert_eq!((facts.temperature, facts.choices), (Some(0.7), 3));
    }
}

/// JSON written with random but equivalent spellings (whitespace, member order, escapes,
/// number forms), for the property tests of the scanners here and of the answer's.
#[cfg(test)]
pub(crate) mod spelling {
    use serde_json::Value;

    /// A tiny deterministic generator for the writer's choices.
    pub(crate) struct Rng(pub(crate) u64);

    impl Rng {
        pub(crate) fn next(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Writes `v` as JSON with the spelling `rng` picks: whitespace, member order, escapes,
    /// and (with `spell_numbers`) other spellings of the same number.
    pub(crate) fn write(v: &Value, rng: &mut Rng, spell_numbers: bool, out: &mut String) {
        let ws = |rng: &mut Rng, out: &mut String| {
            for _ in 0..rng.next(3) {
                out.push([' ', '\n', '\t', '\r'][rng.next(4) as usize]);
            }
        };
        ws(rng, out);
        match v {
            Value::Object(map) => {
                let mut members: Vec<_> = map.iter().collect();
                for i in (1..members.len()).rev() {
                    members.swap(i, rng.next(i as u64 + 1) as usize);
                }
                out.push('{');
                for (i, (k, v)) in members.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    ws(rng, out);
                    string(k, rng, out);
                    ws(rng, out);
                    out.push(':');
                    write(v, rng, spell_numbers, out);
                }
                ws(rng, out);
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(v, rng, spell_numbers, out);
                }
                ws(rng, out);
                out.push(']');
            }
            Value::String(s) => string(s, rng, out),
            Value::Number(n) => {
                let plain = n.to_string();
                let spelled = match (spell_numbers, n.as_i64()) {
                    (true, Some(i)) if i.unsigned_abs() < 1 << 40 => match rng.next(4) {
                        0 => format!("{i}.0"),
                        1 => format!("{i}e0"),
                        2 => format!("{i}0E-1"),
                        _ => plain,
                    },
                    // Up to 15 significant digits only: beyond that, serde_json (without its
                    // `float_roundtrip` feature) may round `4.120938383184362e15` and
                    // `4120938383184362.0` to neighbouring doubles, so they are two numbers to
                    // either path, and two keys (a miss, never a wrong answer).
                    (true, None)
                        if n.is_f64()
                            && plain.chars().filter(char::is_ascii_digit).count() <= 15
                            && rng.next(2) == 0 =>
                    {
                        // `12.5` as `1.25e1` or `125e-1`: the same decimal, the same value.
                        let f = n.as_f64().unwrap_or(0.0);
                        format!("{f:e}")
                    }
                    _ => plain,
                };
                out.push_str(&spelled);
            }
            other => out.push_str(&other.to_string()),
        }
        ws(rng, out);
    }

    /// A JSON string of `s`, each character escaped or not as `rng` picks.
    pub(crate) fn string(s: &str, rng: &mut Rng, out: &mut String) {
        use std::fmt::Write;
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' if rng.next(2) == 0 => out.push_str("\\n"),
                '/' if rng.next(2) == 0 => out.push_str("\\/"),
                c if (c as u32) < 0x20 || rng.next(4) == 0 => {
                    let mut units = [0; 2];
                    for u in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{:04X}", u);
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}
