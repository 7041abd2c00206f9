//! The request body read by a byte scan instead of serde's visitors.
//!
//! Every call pays for reading its request once, in the outermost layer, and the visitor path
//! costs a call through serde's `Deserializer` and `Visitor` layers per token: for a small
//! chat request about as much as all of a policy layer's own work. The scan walks the body on
//! [`JsonCursor`] and builds the same [`Wire`], with the same [`TextCount`] rules (the same
//! functions: [`TextCount::add`], [`TextCount::classify`], [`Kind::of`], [`wav_seconds`]), so
//! only the walk is new.
//!
//! As everywhere the cursor is used, the scan never decides alone: it answers `None` on
//! whatever it is not sure serde reads the same way (an escaped member name, a number that is
//! not a plain count, a surrogate escape, nesting deeper than the cursor's bound, damage), and
//! the caller then reads the body with serde as before. A property test holds the two to the
//! same result on generated and damaged bodies.

use std::borrow::Cow;

use crate::json_scan::{JsonCursor, JsonKind, JsonStr};

use super::{Kind, Loose, TextCount, Wire, wav_seconds};

/// The fields of a request body, as serde's visitor reads them; `None` when not sure.
pub(super) fn wire(text: &str) -> Option<Wire<'_>> {
    let mut s = JsonCursor::new(text);
    if s.kind()? != JsonKind::Object {
        return None;
    }
    let mut w = Wire::default();
    s.object(|s, name| {
        match name {
            b"model" => w.model = loose(s)?.str(),
            b"max_tokens" | b"max_completion_tokens" | b"max_output_tokens" => {
                w.max_output = w.max_output.max(loose(s)?.count());
            }
            b"n" | b"best_of" => w.choices = w.choices.max(loose(s)?.count()),
            b"stream" => w.stream = loose(s)?.bool(),
            b"service_tier" => w.service_tier = loose(s)?.service_tier(),
            b"messages" | b"system" | b"prompt" | b"input" | b"instructions" | b"suffix"
            | b"tools" | b"functions" | b"tool_choice" | b"response_format" | b"text" => {
                text_count(s, 1, &mut w.text)?;
            }
            _ => s.skip_ignored(1)?,
        }
        Some(())
    })?;
    s.at_end().then_some(w)
}

/// A value as [`Loose`] reads it. Numbers other than plain counts (a sign, a fraction, an
/// exponent, more digits than a `u64` surely holds) and escaped strings are left to serde.
fn loose<'a>(s: &mut JsonCursor<'a>) -> Option<Loose<'a>> {
    Some(match s.kind()? {
        JsonKind::String => {
            let span = s.string()?;
            Loose::Str(Cow::Borrowed(s.plain(span)?))
        }
        JsonKind::Number => Loose::U64(s.count()?),
        JsonKind::Bool => Loose::Bool(s.boolean()?),
        JsonKind::Null => {
            s.null()?;
            Loose::Other
        }
        // Serde skips the members and elements of these without reading their numbers.
        JsonKind::Object | JsonKind::Array => {
            s.skip_ignored(1)?;
            Loose::Other
        }
    })
}

/// Adds a value's [`TextCount`], as its serde visitor counts it, into `into`; gives back the
/// kind it names, which only a string can (for its object's `type`). Counts are sums, so an
/// array's elements go straight into `into`: only an object, classified when it closes, needs
/// a count of its own.
fn text_count(s: &mut JsonCursor<'_>, depth: u32, into: &mut TextCount) -> Option<Kind> {
    if depth >= crate::json_scan::MAX_DEPTH {
        return None;
    }
    match s.kind()? {
        JsonKind::String => {
            let span = s.string()?;
            let t = match s.plain(span) {
                Some(text) => TextCount::of_str(text),
                None => escaped(s, span)?,
            };
            into.add(t);
            return Some(t.kind);
        }
        JsonKind::Array => {
            s.array(|s| text_count(s, depth + 1, into).map(|_| ()))?;
        }
        JsonKind::Object => {
            let mut t = TextCount::default();
            let mut kind = Kind::Text;
            s.object(|s, name| {
                let k = text_count(s, depth + 1, &mut t)?;
                if name == b"type" {
                    kind = k;
                }
                Some(())
            })?;
            into.add(t.classify(kind));
        }
        // Serde reads these numbers whole (it refuses one out of an `f64`'s range): only the
        // numbers any reading accepts are taken here.
        JsonKind::Number => s.number()?,
        JsonKind::Bool => {
            s.boolean()?;
        }
        JsonKind::Null => {
            s.null()?;
        }
    }
    Some(Kind::Text)
}

/// A string with escapes, counted as its decoded text. It is decoded only when it may be a
/// part's `type` (short, and every escape a `\uXXXX`: the others decode to characters no tag
/// has) or WAV data: a prompt with a newline is counted without a copy.
// Out of line: inlined, it crowds the registers of the walk that every string takes.
#[inline(never)]
fn escaped(s: &JsonCursor<'_>, span: JsonStr) -> Option<TextCount> {
    let raw = s.raw(span)?;
    let (extra, only_unicode) = escapes(raw);
    let maybe_tag = only_unicode && raw.len() <= TAG_BYTES;
    let maybe_wav = raw.len() >= WAV_HEAD && decodes_to_riff(raw);
    if !maybe_tag && !maybe_wav {
        // Each escape the cursor lets through decodes to one character.
        let chars = raw.chars().count() - extra;
        return Some(TextCount::of_decoded(chars, Kind::Text, None));
    }
    Some(TextCount::of_str(&s.decoded(span)?))
}

/// The longest escaped string that may decode to one of [`Kind::of`]'s tags: 11 characters,
/// each at most a 6-byte `\uXXXX`.
const TAG_BYTES: usize = 66;

/// WAV data shorter than this is not read by [`wav_seconds`] (its header's base64).
const WAV_HEAD: usize = 44;

/// The bytes an escaped string's escapes take beyond the one character each decodes to, and
/// whether every escape is a `\uXXXX`.
fn escapes(raw: &str) -> (usize, bool) {
    let b = raw.as_bytes();
    let (mut extra, mut only_unicode, mut i) = (0, true, 0);
    while let Some(at) = b.get(i..).and_then(|rest| memchr::memchr(b'\\', rest)) {
        let esc = i + at;
        let len = if b.get(esc + 1) == Some(&b'u') { 6 } else { 2 };
        only_unicode &= len == 6;
        extra += len - 1;
        i = esc + len;
    }
    (extra, only_unicode)
}

/// Whether an escaped string's decoded text starts with `UklGR` (base64 of `RIFF`).
fn decodes_to_riff(raw: &str) -> bool {
    let want = b"UklGR";
    let b = raw.as_bytes();
    let (mut i, mut n) = (0, 0);
    while n < want.len() {
        let c = match b.get(i) {
            Some(b'\\') if b.get(i + 1) == Some(&b'u') => {
                let hex = b
                    .get(i + 2..i + 6)
                    .and_then(|h| std::str::from_utf8(h).ok());
                i += 6;
                hex.and_then(|h| u8::from_str_radix(h, 16).ok())
            }
            Some(b'\\') => {
                // `\/`, `\"`, `\\` decode to themselves; `\n` and the like to controls.
                i += 2;
                b.get(i - 1)
                    .copied()
                    .filter(|c| matches!(c, b'/' | b'"' | b'\\'))
            }
            Some(&c) => {
                i += 1;
                Some(c)
            }
            None => None,
        };
        if c != Some(want[n]) {
            return false;
        }
        n += 1;
    }
    true
}

impl TextCount {
    /// What a string counts for, as the serde visitor's `visit_str` counts it.
    pub(super) fn of_str(s: &str) -> TextCount {
        // Most prompt text is ASCII, checked a word at a time; `chars().count()` of a short
        // string goes a byte at a time.
        let chars = if s.is_ascii() {
            s.len()
        } else {
            s.chars().count()
        };
        TextCount::of_decoded(chars, Kind::of(s), wav_seconds(s))
    }

    fn of_decoded(chars: usize, kind: Kind, wav_seconds: Option<u32>) -> TextCount {
        TextCount {
            chars,
            parts: 1,
            kind,
            wav_seconds,
            ..TextCount::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Whenever the scan reads a body, serde reads it too, to the same fields.
    fn agree(text: &str) {
        if let Some(scanned) = wire(text) {
            let Ok(expected) = serde_json::from_str::<Wire<'_>>(text) else {
                panic!("the scan read a body serde refuses: {text}");
            };
            assert_eq!(scanned, expected, "{text}");
        }
    }

    /// A WAV header and `seconds` of 8 kHz 16-bit silence, in base64.
    fn wav(seconds: usize) -> String {
        use base64::Engine as _;
        let mut wav = Vec::new();
        wav.extend_from_slice(b"RIFF\0\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0");
        wav.extend_from_slice(&8_000u32.to_le_bytes());
        wav.extend_from_slice(&16_000u32.to_le_bytes());
        wav.extend_from_slice(b"\x02\0\x10\0data\0\0\0\0");
        wav.resize(44 + 16_000 * seconds, 0);
        base64::engine::general_purpose::STANDARD.encode(&wav)
    }

    #[test]
    fn the_usual_requests_are_scanned_with_serdes_fields() {
        let wav = wav(1);
        // The same WAV data with its slashes escaped, as some encoders write them.
        let escaped_wav = wav.replace('/', "\\/");
        let bodies = [
            r#"{"model":"gpt-4o","max_tokens":256,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello to the whole wide world."}]}"#.to_owned(),
            r#"{"model":"claude-sonnet-4","max_tokens":1024,"system":"Be brief.\nNo lists.","messages":[{"role":"user","content":[{"type":"text","text":"What is \"this\"?"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]}],"stream":true}"#.to_owned(),
            r#"{"model":"gpt-4.1","input":[{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_file","file_id":"file-1"}]}],"max_output_tokens":500,"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}}}"#.to_owned(),
            format!(r#"{{"model":"gpt-4o-audio","n":2,"messages":[{{"role":"user","content":[{{"type":"input_audio","input_audio":{{"data":"{wav}","format":"wav"}}}}]}}]}}"#),
            format!(r#"{{"messages":[{{"content":[{{"input_audio":{{"data":"{escaped_wav}"}},"type":"input_audio"}}]}}]}}"#),
            r#" { "model" : "m" , "stream" : false , "tools" : [ ] , "temperature" : 0.7 } "#.to_owned(),
        ];
        for body in &bodies {
            assert!(wire(body).is_some(), "not scanned: {body}");
            agree(body);
        }
        // Read through its escapes: one second of sound and its header, bounded from above.
        let escaped = wire(&bodies[4]).unwrap();
        assert_eq!(escaped.text.media.audio_seconds, 2);
    }

    #[test]
    fn escaped_text_is_counted_as_its_decoded_characters_without_serde() {
        let body = r#"{"system":"a\nb\u00e9\"c\\d","messages":[{"type":"\u0069mage","x":"y"}]}"#;
        let w = wire(body).expect("scanned");
        // `a`, newline, `b`, `é`, `"`, `c`, `\`, `d`: 8 characters in one piece of text.
        assert_eq!((w.text.chars, w.text.parts), (8, 1));
        // `\u0069mage` is `image`: the object is one image, its strings not text.
        assert_eq!(w.text.media.images, 1);
        agree(body);
    }

    #[test]
    fn what_the_scan_is_not_sure_of_is_left_to_serde() {
        for body in [
            r#"{"mod\u0065l":"m"}"#,
            r#"{"model":"m\u00e9"}"#,
            r#"{"max_tokens":1e5}"#,
            r#"{"max_tokens":-1}"#,
            r#"{"max_tokens":100000.0}"#,
            r#"{"max_tokens":18446744073709551616}"#,
            r#"{"messages":[1e400]}"#,
            r#"{"messages":"\ud83d\ude00"}"#,
            r#"["model","m"]"#,
            r#"{"model":"m"} x"#,
            r#"{"model":"m",}"#,
        ] {
            assert!(wire(body).is_none(), "{body}");
        }
    }

    /// A JSON string's text as it is written in a body: plain, with escapes, or a tag.
    fn string() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-zA-Z0-9 _./é-]{0,12}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            "[a-z\n\t\"\\\\/]{0,8}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            prop::sample::select(vec![
                "image_url",
                "input_image",
                "image",
                "input_audio",
                "file",
                "input_file",
                "document",
                "base64",
                "url",
                "text",
                "user",
                "priority",
                "flex",
                "100",
                " 7 ",
                "12.5",
                "-3",
            ])
            .prop_map(|s| format!("\"{s}\"")),
            prop::sample::select(vec![
                r#""\u0069mage""#,
                r#""imag\u0065_url""#,
                r#""fl\u0065x""#,
                r#""\/\/""#,
                r#""a\u00e9b""#,
                r#""\ud83d\ude00""#,
                r#""\x""#,
                r#""\u12""#,
                r#""UklGR\/""#,
            ])
            .prop_map(str::to_owned),
            (0usize..3).prop_map(|s| format!("\"{}\"", wav(s))),
            (0usize..2).prop_map(|s| format!("\"{}\"", wav(s).replace('/', "\\/"))),
        ]
    }

    /// A number as a body may write one, in and out of what the scan reads.
    fn number() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<u32>().prop_map(|n| n.to_string()),
            prop::sample::select(vec![
                "0",
                "-0",
                "-3",
                "1.5",
                "1e5",
                "1E+2",
                "100000.0",
                "18446744073709551615",
                "18446744073709551616",
                "123456789012345678901234",
                "1e400",
                "-1e400",
                "0.000001",
            ])
            .prop_map(str::to_owned),
        ]
    }

    fn value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            string(),
            number(),
            prop::sample::select(vec!["true", "false", "null"]).prop_map(str::to_owned),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec((key(), inner), 0..4).prop_map(|m| {
                    let members: Vec<String> =
                        m.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        })
    }

    fn key() -> impl Strategy<Value = String> {
        let mut names = vec![
            "model",
            "max_tokens",
            "max_completion_tokens",
            "max_output_tokens",
            "n",
            "best_of",
            "stream",
            "service_tier",
            "type",
            "source",
            "data",
            "content",
            "role",
            "metadata",
            "temperature",
            "mod\\u0065l",
        ];
        names.extend(crate::request::PROMPT_FIELDS);
        prop::sample::select(names).prop_map(|k| format!("\"{k}\""))
    }

    /// A request body: an object of such members, with or without whitespace around tokens.
    fn body() -> impl Strategy<Value = String> {
        (prop::collection::vec((key(), value()), 0..8), any::<bool>()).prop_map(|(m, spaced)| {
            let sep = if spaced { " , " } else { "," };
            let colon = if spaced { " :\n" } else { ":" };
            let members: Vec<String> = m
                .into_iter()
                .map(|(k, v)| format!("{k}{colon}{v}"))
                .collect();
            format!("{{{}}}", members.join(sep))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn the_scan_reads_generated_bodies_as_serde_does(body in body()) {
            agree(&body);
        }

        #[test]
        fn the_scan_reads_damaged_bodies_as_serde_does(
            body in body(),
            at in any::<prop::sample::Index>(),
            junk in prop::sample::select(vec!["", "}", "]", ",", "\"", "\\", "x", "\u{1}", " ", "{"]),
        ) {
            let at = at.index(body.len() + 1);
            if let (Some(head), Some(tail)) = (body.get(..at), body.get(at..)) {
                agree(&format!("{head}{junk}"));
                agree(&format!("{head}{junk}{tail}"));
            }
        }
    }
}
