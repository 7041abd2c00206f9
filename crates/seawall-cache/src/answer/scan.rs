//! A complete JSON answer recognised by a plain byte scan, without building it.
//!
//! A miss stores its answer when the body ends. Building the answer's parts with serde's
//! derive (a call per token through `Deserializer` and `Visitor` layers, every string copied)
//! was the largest part of a miss after the key, and a hit served in the form the answer came
//! in (the usual case) needs none of it: it replays the raw body. So the body is only scanned
//! here for what deciding to store it needs (one choice of plain text, a natural finish, the
//! usage), and its parts are parsed later, once, if a hit in the other form (a stream) or a
//! caller asks for them.
//!
//! Like the key's scanner, it never decides anything alone: it says yes only to bodies it is
//! sure `serde_json` reads as a cacheable answer with the same usage (well-formed JSON, no
//! duplicate known fields, no escaped keys, no surrogate escapes, plain integers for counts,
//! nesting below 64 levels), and gives up with `None` on everything else: errors, tool calls,
//! several choices, unusual spellings. The serde path then decides, and says why not. A test
//! holds the two to the same verdict and usage on generated and damaged bodies.
//!
//! The walking itself is core's [`JsonCursor`], which the classifier reads answers and events
//! with too, and the usage is core's [`ReportedUsage`] reading, the classifier's too; only the
//! answer's shape (which members are stored, which refuse) is here.

use seawall_core::json_scan::{JsonCursor, JsonKind, Seen};
use seawall_core::{FinishReason, ReportedUsage, Usage};

use super::Wire;

/// What the scan found in a body it is sure is a cacheable answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    /// The usage, as the serde path reads it.
    pub(crate) usage: Usage,
}

/// The facts of `body`, a complete JSON answer of `wire` that serde would accept and store;
/// `None` when the scan is not sure (serde then decides).
pub(crate) fn answer(wire: Wire, body: &[u8]) -> Option<Facts> {
    // Valid UTF-8 throughout (stricter than serde, which skips unknown strings unchecked:
    // the doubtful bodies go to serde). Outside strings, non-ASCII is a syntax error anyway.
    let mut s = JsonCursor::new(std::str::from_utf8(body).ok()?);
    let usage = match wire {
        Wire::OpenAiChat => openai(&mut s)?,
        Wire::AnthropicMessages => anthropic(&mut s)?,
    };
    s.at_end().then_some(Facts { usage })
}

/// Whether a finish word is one whose answer is stored: a natural stop or the token limit.
fn storable_finish(word: &[u8]) -> bool {
    let Ok(word) = std::str::from_utf8(word) else {
        return false;
    };
    matches!(
        FinishReason::from_provider(word),
        FinishReason::Stop | FinishReason::Length
    )
}

/// `null`, `""` or `[]`: a member that says nothing, as serde's reading of it says (the
/// answer module's `carries`); anything else is left to serde.
fn empty(c: &mut JsonCursor<'_>) -> Option<()> {
    match c.kind()? {
        JsonKind::Null => c.null().map(drop),
        JsonKind::String => c.string()?.is_empty().then_some(()),
        JsonKind::Array => (c.array(|_| None)? == 0).then_some(()),
        _ => None,
    }
}

/// A string or `null`.
fn text(c: &mut JsonCursor<'_>) -> Option<()> {
    if c.null()? {
        return Some(());
    }
    c.string().map(|_| ())
}

/// A Chat Completions body.
fn openai(c: &mut JsonCursor<'_>) -> Option<Usage> {
    const ID: u32 = 0;
    const CREATED: u32 = 1;
    const MODEL: u32 = 2;
    const CHOICES: u32 = 3;
    const USAGE: u32 = 4;
    let mut seen = Seen::default();
    let mut usage = Usage::default();
    c.object(|s, name| match name {
        b"id" => {
            seen.first(ID)?;
            text(s)
        }
        b"model" => {
            seen.first(MODEL)?;
            text(s)
        }
        b"created" => {
            seen.first(CREATED)?;
            s.count_or_null().map(|_| ())
        }
        b"choices" => {
            seen.first(CHOICES)?;
            // Exactly one choice.
            (s.array(openai_choice)? == 1).then_some(())
        }
        b"usage" => {
            seen.first(USAGE)?;
            if !s.null()? {
                usage = ReportedUsage::scan(s, 1)?.to_usage();
            }
            Some(())
        }
        _ => s.skip_ignored(1),
    })?;
    seen.has(CHOICES).then_some(usage)
}

fn openai_choice(c: &mut JsonCursor<'_>) -> Option<()> {
    const MESSAGE: u32 = 0;
    const LOGPROBS: u32 = 1;
    const FINISH: u32 = 2;
    let mut seen = Seen::default();
    c.object(|s, name| match name {
        b"message" => {
            seen.first(MESSAGE)?;
            openai_message(s)
        }
        b"logprobs" => {
            seen.first(LOGPROBS)?;
            // Log probabilities are not replayed: only `null` is stored.
            s.null()?.then_some(())
        }
        b"finish_reason" => {
            seen.first(FINISH)?;
            let word = s.string()?;
            (!word.escaped && storable_finish(s.bytes(word))).then_some(())
        }
        _ => s.skip_ignored(2),
    })?;
    (seen.has(MESSAGE) && seen.has(FINISH)).then_some(())
}

fn openai_message(c: &mut JsonCursor<'_>) -> Option<()> {
    const CONTENT: u32 = 0;
    const TOOL_CALLS: u32 = 1;
    const FUNCTION_CALL: u32 = 2;
    const REFUSAL: u32 = 3;
    const AUDIO: u32 = 4;
    const ANNOTATIONS: u32 = 5;
    const REASONING_CONTENT: u32 = 6;
    const REASONING: u32 = 7;
    let mut seen = Seen::default();
    c.object(|s, name| {
        let bit = match name {
            b"content" => {
                seen.first(CONTENT)?;
                return s.string().map(|_| ());
            }
            b"tool_calls" => TOOL_CALLS,
            b"function_call" => FUNCTION_CALL,
            b"refusal" => REFUSAL,
            b"audio" => AUDIO,
            b"annotations" => ANNOTATIONS,
            b"reasoning_content" => REASONING_CONTENT,
            b"reasoning" => REASONING,
            _ => return s.skip_ignored(3),
        };
        seen.first(bit)?;
        if bit >= ANNOTATIONS {
            // Citations and reasoning a replay would lose: only their empty forms are stored
            // (OpenAI sends `"annotations": []` with every answer); any other is left to serde.
            return empty(s);
        }
        // Anything but plain text: only `null` (or absent) is stored.
        s.null()?.then_some(())
    })?;
    seen.has(CONTENT).then_some(())
}

/// A Messages body.
fn anthropic(c: &mut JsonCursor<'_>) -> Option<Usage> {
    const ID: u32 = 0;
    const TYPE: u32 = 1;
    const MODEL: u32 = 2;
    const CONTENT: u32 = 3;
    const STOP: u32 = 4;
    const USAGE: u32 = 5;
    let mut seen = Seen::default();
    let mut usage = Usage::default();
    c.object(|s, name| match name {
        b"id" => {
            seen.first(ID)?;
            text(s)
        }
        b"model" => {
            seen.first(MODEL)?;
            text(s)
        }
        b"type" => {
            seen.first(TYPE)?;
            let kind = s.string()?;
            (!kind.escaped && s.bytes(kind) == b"message").then_some(())
        }
        b"content" => {
            seen.first(CONTENT)?;
            // No block, or one text block.
            (s.array(anthropic_block)? <= 1).then_some(())
        }
        b"stop_reason" => {
            seen.first(STOP)?;
            let word = s.string()?;
            (!word.escaped && storable_finish(s.bytes(word))).then_some(())
        }
        b"usage" => {
            seen.first(USAGE)?;
            if !s.null()? {
                usage = ReportedUsage::scan(s, 1)?.to_usage();
            }
            Some(())
        }
        _ => s.skip_ignored(1),
    })?;
    (seen.has(TYPE) && seen.has(STOP)).then_some(usage)
}

fn anthropic_block(c: &mut JsonCursor<'_>) -> Option<()> {
    let mut seen = Seen::default();
    c.object(|s, name| match name {
        b"type" => {
            seen.first(0)?;
            let kind = s.string()?;
            (!kind.escaped && s.bytes(kind) == b"text").then_some(())
        }
        b"text" => {
            seen.first(1)?;
            text(s)
        }
        // Citations a replay would lose: only none is stored.
        b"citations" => {
            seen.first(2)?;
            empty(s)
        }
        _ => s.skip_ignored(3),
    })?;
    seen.has(0).then_some(())
}

#[cfg(test)]
mod tests {
    use super::super::{Answer, NotCacheable, json_answer, natural_end};
    use super::*;
    use crate::key::fast::spelling::{Rng, write};
    use bytes::Bytes;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    /// Both paths' verdicts on `body`: the scan's facts (if sure) and serde's answer, if it
    /// is stored.
    fn both(wire: Wire, body: &[u8]) -> (Option<Facts>, Result<Answer, NotCacheable>) {
        let raw = Bytes::copy_from_slice(body);
        (
            answer(wire, body),
            json_answer(wire, raw).and_then(natural_end),
        )
    }

    /// The scan says yes only where serde stores the answer, with the same usage, and the
    /// answer it keeps (parsed later from the raw body) is serde's.
    fn agree(wire: Wire, body: &[u8]) -> Result<(), TestCaseError> {
        let (fast, serde) = both(wire, body);
        let text = String::from_utf8_lossy(body);
        if let Some(facts) = fast {
            let Ok(serde) = serde else {
                return Err(TestCaseError::fail(format!("serde refuses: {text}")));
            };
            prop_assert!(
                matches!(
                    serde.finish_reason(),
                    FinishReason::Stop | FinishReason::Length
                ),
                "{}",
                text
            );
            prop_assert_eq!(facts.usage, serde.usage(), "{}", text);
            let lazy = Answer::of_raw(wire, Bytes::copy_from_slice(body), facts.usage);
            prop_assert_eq!(&lazy, &serde, "{}", text);
            prop_assert_eq!(
                lazy.render(crate::Format::Sse {
                    include_usage: true
                }),
                serde.render(crate::Format::Sse {
                    include_usage: true
                })
            );
        }
        Ok(())
    }

    fn text() -> impl Strategy<Value = String> {
        "[ a-z\"\\\\/\n\u{0}-\u{1f}\u{7f}é€😀]{0,16}"
    }

    /// Any JSON value, for unknown members and wrong types.
    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z_]{0,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A member that is mostly `good`, sometimes absent (`None`), `null` or anything.
    fn member(good: impl Strategy<Value = Value> + 'static) -> BoxedStrategy<Option<Value>> {
        prop_oneof![
            8 => good.prop_map(Some),
            1 => Just(None),
            1 => Just(Some(Value::Null)),
            1 => value().prop_map(Some),
        ]
        .boxed()
    }

    fn count() -> impl Strategy<Value = Value> {
        prop_oneof![
            8 => (0u64..100_000).prop_map(Value::from),
            1 => any::<u64>().prop_map(Value::from),
            1 => Just(json!(-1)),
            1 => Just(json!(1.5)),
        ]
    }

    fn finish() -> impl Strategy<Value = Value> {
        prop_oneof![
            4 => Just(json!("stop")),
            2 => Just(json!("length")),
            1 => Just(json!("end_turn")),
            1 => Just(json!("max_tokens")),
            1 => Just(json!("stop_sequence")),
            1 => Just(json!("tool_calls")),
            1 => Just(json!("tool_use")),
            1 => Just(json!("content_filter")),
            1 => text().prop_map(Value::String),
        ]
    }

    /// An object of the `known` members (each present or not) and a few unknown ones.
    fn object(known: Vec<(&'static str, BoxedStrategy<Option<Value>>)>) -> BoxedStrategy<Value> {
        let (names, values): (Vec<_>, Vec<_>) = known.into_iter().unzip();
        (
            values,
            prop::collection::btree_map("[a-z_]{1,8}", value(), 0..3),
        )
            .prop_map(move |(values, extra)| {
                let mut map: serde_json::Map<String, Value> = extra.into_iter().collect();
                for (name, v) in names.iter().zip(values) {
                    match v {
                        Some(v) => map.insert((*name).to_owned(), v),
                        None => map.remove(*name),
                    };
                }
                Value::Object(map)
            })
            .boxed()
    }

    fn none_or(v: impl Strategy<Value = Value> + 'static) -> BoxedStrategy<Option<Value>> {
        prop_oneof![
            6 => Just(None),
            3 => Just(Some(Value::Null)),
            1 => v.prop_map(Some),
        ]
        .boxed()
    }

    fn openai() -> BoxedStrategy<Value> {
        let message = object(vec![
            ("role", member(Just(json!("assistant")))),
            ("content", member(text().prop_map(Value::String))),
            ("tool_calls", none_or(value())),
            ("function_call", none_or(value())),
            ("refusal", none_or(text().prop_map(Value::String))),
            ("audio", none_or(value())),
            (
                "annotations",
                none_or(prop_oneof![Just(json!([])), Just(json!("")), value()]),
            ),
            (
                "reasoning_content",
                none_or(prop_oneof![Just(json!("")), text().prop_map(Value::String)]),
            ),
            (
                "reasoning",
                none_or(prop_oneof![Just(json!("")), Just(json!([])), value()]),
            ),
        ]);
        let choice = object(vec![
            ("index", member(Just(json!(0)))),
            ("message", member(message)),
            ("logprobs", none_or(value())),
            ("finish_reason", member(finish())),
        ]);
        let details = object(vec![
            ("cached_tokens", member(count())),
            ("audio_tokens", member(count())),
        ]);
        let usage = object(vec![
            ("prompt_tokens", member(count())),
            ("completion_tokens", member(count())),
            ("total_tokens", member(count())),
            ("prompt_tokens_details", member(details)),
            // DeepSeek's count of cached prompt tokens.
            ("prompt_cache_hit_tokens", none_or(count())),
        ]);
        object(vec![
            ("id", member(text().prop_map(Value::String))),
            ("object", member(Just(json!("chat.completion")))),
            ("created", member(count())),
            ("model", member(text().prop_map(Value::String))),
            (
                "choices",
                member(prop_oneof![
                    6 => choice.clone().prop_map(|c| json!([c])),
                    1 => Just(json!([])),
                    1 => prop::collection::vec(choice, 2..3).prop_map(Value::Array),
                ]),
            ),
            ("usage", member(usage)),
            ("error", none_or(value())),
        ])
    }

    fn anthropic() -> BoxedStrategy<Value> {
        let block = object(vec![
            (
                "type",
                member(prop_oneof![
                    4 => Just(json!("text")),
                    1 => Just(json!("tool_use")),
                    1 => Just(json!("thinking")),
                ]),
            ),
            ("text", member(text().prop_map(Value::String))),
            (
                "citations",
                none_or(prop_oneof![Just(json!([])), Just(json!("")), value()]),
            ),
        ]);
        let creation = object(vec![
            ("ephemeral_5m_input_tokens", member(count())),
            ("ephemeral_1h_input_tokens", member(count())),
        ]);
        let usage = object(vec![
            ("input_tokens", member(count())),
            ("output_tokens", member(count())),
            ("cache_read_input_tokens", member(count())),
            ("cache_creation_input_tokens", member(count())),
            ("cache_creation", none_or(creation)),
        ]);
        object(vec![
            ("id", member(text().prop_map(Value::String))),
            (
                "type",
                member(prop_oneof![
                    6 => Just(json!("message")),
                    1 => Just(json!("error")),
                ]),
            ),
            ("role", member(Just(json!("assistant")))),
            ("model", member(text().prop_map(Value::String))),
            (
                "content",
                member(prop_oneof![
                    6 => block.clone().prop_map(|b| json!([b])),
                    1 => Just(json!([])),
                    1 => prop::collection::vec(block, 2..3).prop_map(Value::Array),
                ]),
            ),
            ("stop_reason", member(finish())),
            ("stop_sequence", none_or(text().prop_map(Value::String))),
            ("usage", member(usage)),
        ])
    }

    fn wire_and_body() -> impl Strategy<Value = (Wire, Value)> {
        prop_oneof![
            openai().prop_map(|b| (Wire::OpenAiChat, b)),
            anthropic().prop_map(|b| (Wire::AnthropicMessages, b)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3_000))]

        #[test]
        fn the_scan_takes_exactly_what_serde_stores_when_plainly_written(
            (wire, body) in wire_and_body(),
        ) {
            // serde_json's own writing: no escaped keys, no surrogates, so the scan is sure
            // of every body serde stores, but those with an array where a struct goes (which
            // serde's derive reads as the struct's fields in order).
            let text = serde_json::to_string(&body).unwrap();
            let (fast, serde) = both(wire, text.as_bytes());
            let struct_as_array = [
                "/choices/0",
                "/choices/0/message",
                "/usage",
                "/usage/prompt_tokens_details",
                "/content/0",
            ]
            .iter()
            .any(|at| body.pointer(at).is_some_and(Value::is_array));
            prop_assert_eq!(fast.is_some(), serde.is_ok() && !struct_as_array, "{}", text);
            agree(wire, text.as_bytes())?;
        }

        #[test]
        fn the_scan_never_takes_what_serde_would_not_store(
            (wire, body) in wire_and_body(),
            seed in 1u64..,
        ) {
            let mut out = String::new();
            write(&body, &mut Rng(seed), false, &mut out);
            agree(wire, out.as_bytes())?;
        }

        #[test]
        fn a_damaged_body_is_never_stored_by_the_scan_alone(
            (wire, body) in wire_and_body(),
            seed in 1u64..,
            cuts in prop::collection::vec((any::<prop::sample::Index>(), 0usize..14), 1..4),
        ) {
            let mut out = String::new();
            write(&body, &mut Rng(seed), true, &mut out);
            let mut bytes = out.into_bytes();
            for (at, what) in cuts {
                let i = at.index(bytes.len() + 1);
                let junk: &[u8] = [
                    &b"\""[..], b"\\", b",", b":", b"{", b"}", b"[", b"]", b"-", b"e",
                    b"\\u", b"\xff", br#","id":"x""#, br#","choices":[]"#,
                ][what];
                if what % 2 == 0 && i < bytes.len() {
                    bytes.remove(i);
                } else {
                    bytes.splice(i..i, junk.iter().copied());
                }
            }
            agree(wire, &bytes)?;
        }
    }

    const OPENAI: &str = r#"{"id":"c1","object":"chat.completion","created":17,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi \"there\"\n","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":12,"total_tokens":32,"prompt_tokens_details":{"cached_tokens":4}}}"#;

    const ANTHROPIC: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"hey"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"cache_read_input_tokens":5,"output_tokens":2}}"#;

    #[test]
    fn the_scan_reads_the_usage_of_both_formats() {
        let facts = answer(Wire::OpenAiChat, OPENAI.as_bytes()).expect("sure");
        assert_eq!(
            facts.usage,
            Usage {
                input_tokens: 20,
                output_tokens: 12,
                cached_input_tokens: 4,
                cache_write_input_tokens: 0,
                cache_write_1h_input_tokens: 0,
            }
        );
        agree(Wire::OpenAiChat, OPENAI.as_bytes()).unwrap();
        let facts = answer(Wire::AnthropicMessages, ANTHROPIC.as_bytes()).expect("sure");
        assert_eq!(
            facts.usage,
            Usage {
                input_tokens: 8,
                output_tokens: 2,
                cached_input_tokens: 5,
                cache_write_input_tokens: 0,
                cache_write_1h_input_tokens: 0,
            }
        );
        agree(Wire::AnthropicMessages, ANTHROPIC.as_bytes()).unwrap();
    }

    #[test]
    fn what_the_scan_leaves_to_serde() {
        let openai = [
            // Duplicate known fields (serde refuses them), an escaped key, a surrogate.
            OPENAI.replace(r#""model":"m""#, r#""model":"m","model":"n""#),
            OPENAI.replace(r#""id""#, r#""\u0069d""#),
            OPENAI.replace("hi ", r"\ud83d\ude00 "),
            // Counts serde does not read as a `u64`, a float `created`.
            OPENAI.replace(r#""prompt_tokens":20"#, r#""prompt_tokens":20.0"#),
            OPENAI.replace(r#""prompt_tokens":20"#, r#""prompt_tokens":020"#),
            OPENAI.replace(r#""created":17"#, r#""created":1e1"#),
            // Not stored: a tool call, log probabilities, a filter, an error, no choice.
            OPENAI.replace(r#""refusal":null"#, r#""tool_calls":[]"#),
            OPENAI.replace(r#""logprobs":null"#, r#""logprobs":{}"#),
            OPENAI.replace(
                r#""finish_reason":"stop""#,
                r#""finish_reason":"content_filter""#,
            ),
            OPENAI.replace(r#""finish_reason":"stop""#, r#""finish_reason":null"#),
            OPENAI.replace(r#""content":"hi \"there\"\n""#, r#""content":null"#),
            r#"{"error":{"message":"overloaded"}}"#.to_owned(),
            OPENAI.replace(r#""choices":[{"#, r#""choices":[{"index":1},{"#),
            // Trailing bytes, a cut body, deep nesting.
            format!("{OPENAI}x"),
            OPENAI[..OPENAI.len() - 1].to_owned(),
            OPENAI.replace(
                r#""object""#,
                &format!(r#""x":{}1{},"object""#, "[".repeat(80), "]".repeat(80)),
            ),
        ];
        for body in &openai {
            assert!(
                answer(Wire::OpenAiChat, body.as_bytes()).is_none(),
                "{body}"
            );
            agree(Wire::OpenAiChat, body.as_bytes()).unwrap();
        }
        let anthropic = [
            ANTHROPIC.replace(r#""type":"message""#, r#""type":"error""#),
            ANTHROPIC.replace(r#""end_turn""#, r#""tool_use""#),
            ANTHROPIC.replace(r#""type":"text""#, r#""type":"thinking""#),
            ANTHROPIC.replace(r#""usage":{"#, r#""usage":{"input_tokens":1,"#),
        ];
        for body in &anthropic {
            assert!(
                answer(Wire::AnthropicMessages, body.as_bytes()).is_none(),
                "{body}"
            );
            agree(Wire::AnthropicMessages, body.as_bytes()).unwrap();
        }
        // Well-formed but odd spellings the scan still takes: escapes in values, unknown
        // members repeated, whitespace everywhere.
        let odd = OPENAI
            .replace(r#""object""#, r#""x":1,"x":[true,{"y":-0.5e-3}], "object""#)
            .replace(',', " ,\n\t");
        assert!(answer(Wire::OpenAiChat, odd.as_bytes()).is_some(), "{odd}");
        agree(Wire::OpenAiChat, odd.as_bytes()).unwrap();
    }

    #[test]
    fn a_scanned_answer_is_parsed_only_when_its_parts_are_asked_for() {
        let raw = Bytes::from_static(OPENAI.as_bytes());
        let facts = answer(Wire::OpenAiChat, &raw).expect("sure");
        let lazy = Answer::of_raw(Wire::OpenAiChat, raw.clone(), facts.usage);
        // Served as it came: the raw body, nothing parsed.
        assert_eq!(lazy.render(crate::Format::Json), raw);
        assert!(lazy.lazy.get().is_none());
        assert_eq!(lazy.text(), "hi \"there\"\n");
        assert_eq!(lazy.finish_reason(), FinishReason::Stop);
        assert!(lazy.lazy.get().is_some());
    }
}
