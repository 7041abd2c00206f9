//! The words request bodies repeat, written as one byte each in the canonical form.
//!
//! SHA-256 costs by the 64-byte block, and most of a short chat request's canonical form is
//! the same few names: `messages`, `model`, and each message's `role` and `content`, each
//! written as a tag, a length and its text. Written as one byte (`0x80` and the word's place
//! in [`WORDS`]), the bench's small request takes two blocks instead of four, and a
//! conversation saves a block every few messages.
//!
//! The one-byte forms cannot be confused with anything else written: every other value
//! starts with an ASCII tag (`s`, `i`, `{`, ...), and each word has its own byte. A word is
//! found by a perfect hash of its packed bytes (two multiplications and a shift give its
//! slot; one comparison with the word in that slot decides), so a string costs a few
//! instructions and one load whether it is a word or not; the seven words of 16 to 23 bytes
//! (`max_completion_tokens`, `additionalProperties`, ...) are compared byte for byte with
//! the string of their length, and a longer string is none. The table is built at compile
//! time, and hash constants that sent two words to one slot would fail the build. Why not a
//! crate: a perfect-hash crate (`phf`) keys by string and hashes it with SipHash, which costs
//! more than the bytes saved for a name of a few bytes.
//!
//! Members are put in the order of their written keys, so among words the order is the
//! list's: it follows the order in which the common clients write their fields (`messages`
//! before `model`, a message's `role` before its `content`, a tool call's `id`, `type`,
//! `function`), so their objects are usually in order already and are not copied to be
//! sorted.

/// The words, in the order their one-byte forms sort: word `i` is written as `0x80 + i`.
/// Each is 1 to 23 bytes long; the few over 15 are found by their length (see [`word`]).
pub(super) const WORDS: [&str; 93] = [
    // Top level first, and the members of messages, parts, tools and schemas, in clients' order.
    "messages",
    "model",
    "role",
    "content",
    "id",
    "type",
    "text",
    "image_url",
    "url",
    "detail",
    "function",
    "name",
    "description",
    "parameters",
    "arguments",
    "properties",
    "items",
    "enum",
    "required",
    "additionalProperties",
    "tool_calls",
    "tool_call_id",
    "tool_use_id",
    "source",
    "media_type",
    "data",
    "input",
    "input_schema",
    "cache_control",
    // The other top-level fields, alphabetically (as the OpenAI and Anthropic SDKs write them).
    "audio",
    "best_of",
    "format",
    "frequency_penalty",
    "function_call",
    "functions",
    "include_usage",
    "instructions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "reasoning",
    "reasoning_effort",
    "effort",
    "response_format",
    "seed",
    "service_tier",
    "stop",
    "stop_sequences",
    "store",
    "stream",
    "stream_options",
    "system",
    "temperature",
    "thinking",
    "budget_tokens",
    "tool_choice",
    "tools",
    "top_k",
    "top_logprobs",
    "top_p",
    "web_search_options",
    "strict",
    "schema",
    "json_schema",
    // Common values.
    "user",
    "assistant",
    "tool",
    "developer",
    "object",
    "string",
    "integer",
    "number",
    "boolean",
    "array",
    "auto",
    "none",
    "json_object",
    "image",
    "base64",
    "tool_use",
    "tool_result",
    "ephemeral",
    "refusal",
    "input_text",
    "output_text",
    "input_image",
];

/// The one-byte form of word `i`.
const FIRST: u8 = 0x80;

/// The perfect hash's multipliers: with them, the 86 words of up to 15 bytes fall in 86
/// different slots of 256 (found by a search; the table's construction checks it).
const M_LO: u64 = 0x9d3a_2ae1_124e_494d;
const M_HI: u64 = 0xdeb6_f38e_d776_7aad;

/// The longest word packed and hashed; longer ones are found by their length.
const PACKS: usize = 15;

/// The longest word.
const LONGEST: usize = 23;

/// By hash slot: the packed word in that slot (`(0, 0)`, which no text packs to, for none),
/// and its one-byte form. The two are read side by side, not one after the other: from a
/// table out of the nearest cache, as it usually is between requests, that is one wait
/// instead of two.
const SLOTS: &([(u64, u64); 256], [u8; 256]) = &{
    let mut packed = [(0, 0); 256];
    let mut words = [0u8; 256];
    let mut i = 0;
    while i < WORDS.len() {
        let w = WORDS[i].as_bytes();
        if w.len() > PACKS {
            i += 1;
            continue;
        }
        let (lo, hi) = pack_slowly(w);
        let slot = slot(lo, hi);
        assert!(
            words[slot] == 0,
            "two words share a slot: change the multipliers"
        );
        packed[slot] = (lo, hi);
        words[slot] = FIRST + i as u8;
        i += 1;
    }
    (packed, words)
};

/// The words of 16 to 23 bytes by length: up to two each (0 for none). A name that long is
/// rare, and a string that long rarely a name, so they are compared byte for byte.
const LONG: [[u8; 2]; LONGEST - PACKS] = {
    let mut long = [[0u8; 2]; LONGEST - PACKS];
    let mut i = 0;
    while i < WORDS.len() {
        let n = WORDS[i].len();
        assert!(n > 0 && n <= LONGEST, "a word of 1 to 23 bytes");
        if n > PACKS {
            let at = &mut long[n - PACKS - 1];
            let free = if at[0] == 0 { 0 } else { 1 };
            assert!(at[free] == 0, "at most two long words of a length");
            at[free] = FIRST + i as u8;
        }
        i += 1;
    }
    long
};

const fn slot(lo: u64, hi: u64) -> usize {
    ((lo.wrapping_mul(M_LO) ^ hi.wrapping_mul(M_HI)) >> 56) as usize
}

/// The one-byte form of `text`, if it is one of the [`WORDS`].
#[inline]
pub(super) fn word(text: &[u8]) -> Option<u8> {
    let Some((lo, hi)) = pack(text) else {
        // A prompt's text is longer than any word: it costs this one comparison.
        return if text.len() > LONGEST {
            None
        } else {
            long_word(text)
        };
    };
    let slot = slot(lo, hi);
    (SLOTS.0[slot] == (lo, hi)).then_some(SLOTS.1[slot])
}

/// A word of 16 to 23 bytes.
#[cold]
fn long_word(text: &[u8]) -> Option<u8> {
    let candidates = LONG.get(text.len().checked_sub(PACKS + 1)?)?;
    candidates
        .iter()
        .copied()
        .find(|&w| w != 0 && WORDS[usize::from(w - FIRST)].as_bytes() == text)
}

/// The one-byte form of a word of the list (checked at compile time).
pub(super) const fn token(w: &str) -> u8 {
    let mut i = 0;
    while i < WORDS.len() {
        if eq(WORDS[i].as_bytes(), w.as_bytes()) {
            return FIRST + i as u8;
        }
        i += 1;
    }
    panic!("not one of the words")
}

const fn eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A text of 1 to 15 bytes (`None` for any other) as two words: its first eight bytes
/// (little-endian, zeros after its end), and the rest with the length in the top byte (the
/// length tells `a` from `a\0`). Read in at most two overlapping loads, not byte by byte.
#[inline]
fn pack(t: &[u8]) -> Option<(u64, u64)> {
    let n = t.len();
    let (lo, rest) = match n {
        8..=15 => {
            let lo = u64::from_le_bytes(t.get(..8)?.try_into().ok()?);
            let tail = u64::from_le_bytes(t.get(n - 8..)?.try_into().ok()?);
            // The tail's last `n - 8` bytes are the text's bytes 8 and on.
            (lo, tail.checked_shr(8 * (16 - n) as u32).unwrap_or(0))
        }
        4..=7 => {
            let a = u32::from_le_bytes(t.get(..4)?.try_into().ok()?);
            let b = u32::from_le_bytes(t.get(n - 4..)?.try_into().ok()?);
            (u64::from(a) | u64::from(b) << (8 * (n - 4)), 0)
        }
        1..=3 => {
            let at = |i: usize| u64::from(t[i]) << (8 * i);
            (at(0) | at(n / 2) | at(n - 1), 0)
        }
        _ => return None,
    };
    Some((lo, rest | (n as u64) << 56))
}

/// [`pack`], a byte at a time, for the compile-time tables and as the reference.
const fn pack_slowly(t: &[u8]) -> (u64, u64) {
    assert!(!t.is_empty() && t.len() <= PACKS);
    let (mut lo, mut hi) = (0u64, 0u64);
    let mut i = 0;
    while i < t.len() {
        if i < 8 {
            lo |= (t[i] as u64) << (8 * i);
        } else {
            hi |= (t[i] as u64) << (8 * (i - 8));
        }
        i += 1;
    }
    (lo, hi | (t.len() as u64) << 56)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_word_is_found_as_its_own_byte_and_the_bytes_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for (i, w) in WORDS.iter().enumerate() {
            assert_eq!(word(w.as_bytes()), Some(FIRST + i as u8), "{w}");
            assert!(seen.insert(*w), "{w} twice");
        }
        assert_eq!(token("content"), FIRST + 3);
    }

    #[test]
    fn near_words_are_not_words() {
        for w in WORDS {
            let b = w.as_bytes();
            let mut near: Vec<Vec<u8>> = vec![
                b[..b.len() - 1].to_vec(),
                [b, b"\0"].concat(),
                [b"\0", b].concat(),
                [b, b"s"].concat(),
                w.to_uppercase().into_bytes(),
            ];
            for i in 0..b.len() {
                let mut c = b.to_vec();
                c[i] ^= 1;
                near.push(c);
            }
            for n in near {
                if !WORDS.iter().any(|w| w.as_bytes() == n) {
                    assert_eq!(word(&n), None, "{:?}", String::from_utf8_lossy(&n));
                }
            }
        }
        assert_eq!(word(b""), None);
        for n in [16, 17, 23, 24, 200] {
            assert_eq!(word("a".repeat(n).as_bytes()), None);
        }
    }

    proptest! {
        #[test]
        fn packing_by_loads_packs_what_a_byte_loop_packs(t in proptest::collection::vec(any::<u8>(), 1..16)) {
            prop_assert_eq!(pack(&t), Some(pack_slowly(&t)));
        }

        #[test]
        fn a_text_is_a_word_exactly_when_it_is_on_the_list(t in "[a-z_P]{1,24}") {
            let expect = WORDS.iter().position(|w| *w == t).map(|i| FIRST + i as u8);
            prop_assert_eq!(word(t.as_bytes()), expect);
        }
    }
}
