//! A usage object's counts as the provider wrote them, and the one reading of them into a
//! [`Usage`].
//!
//! Providers count the same tokens in different shapes: OpenAI's `prompt_tokens` include the
//! cached ones (`prompt_tokens_details.cached_tokens`), Anthropic's `input_tokens` leave out the
//! cache reads and the cache writes (`cache_read_input_tokens`, `cache_creation_input_tokens`,
//! of which `cache_creation.ephemeral_1h_input_tokens` are kept for an hour), the Responses API
//! says `input_tokens` with `input_tokens_details`, DeepSeek `prompt_cache_hit_tokens`, and some
//! OpenAI-compatible servers count a thinking model's thought tokens in `total_tokens` but not
//! in `completion_tokens`. Anthropic also splits a stream's usage over two events.
//!
//! The classifier (which reads an answer's usage for the budget and the call record), the
//! cache (which stores it with the answer and reports it on a hit) and the continuation layer
//! (which sums the usage of the attempts that made one answer) each read usage objects in
//! their own way (serde, a byte scan, a `Value`), so what they read is gathered here as a
//! [`ReportedUsage`] and turned into a [`Usage`] by one rule, [`ReportedUsage::to_usage`]:
//! whichever layer reads an answer, its usage comes out the same.

use crate::json_scan::{JsonCursor, JsonKind, Seen};
use crate::response::Usage;

/// The counts of one usage object, as reported (each `None` when absent or `null`).
///
/// Fill it with [`scan`](Self::scan), serde (it implements `Deserialize`),
/// [`from_json`](Self::from_json) or [`from_members`](Self::from_members); merge the usage of
/// later events with [`merge`](Self::merge); read it with [`to_usage`](Self::to_usage).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(from = "UsageWire")]
#[non_exhaustive]
pub struct ReportedUsage {
    /// OpenAI's `prompt_tokens` (the cached ones included).
    pub prompt_tokens: Option<u64>,
    /// Anthropic's and the Responses API's `input_tokens` (for Anthropic, without the cache
    /// reads and writes).
    pub input_tokens: Option<u64>,
    /// `completion_tokens`, else `output_tokens`.
    pub output_tokens: Option<u64>,
    /// Anthropic's `cache_read_input_tokens`.
    pub cache_read_input_tokens: Option<u64>,
    /// Anthropic's `cache_creation_input_tokens`.
    pub cache_creation_input_tokens: Option<u64>,
    /// Anthropic's `cache_creation.ephemeral_1h_input_tokens`: the writes kept for an hour,
    /// part of `cache_creation_input_tokens`.
    pub cache_creation_1h_input_tokens: Option<u64>,
    /// `prompt_tokens_details.cached_tokens`, else `input_tokens_details.cached_tokens`, else
    /// DeepSeek's `prompt_cache_hit_tokens`.
    pub cached_tokens: Option<u64>,
    /// `total_tokens`.
    pub total_tokens: Option<u64>,
}

impl ReportedUsage {
    /// Reads the members through `count` (a member's count) and `nested` (the count `member`
    /// of the object `key`): the one list of the names providers use, for readers of a
    /// document tree.
    pub fn from_members(
        count: impl Fn(&str) -> Option<u64>,
        nested: impl Fn(&str, &str) -> Option<u64>,
    ) -> ReportedUsage {
        let cached = |k: &str| nested(k, "cached_tokens");
        ReportedUsage {
            prompt_tokens: count("prompt_tokens"),
            input_tokens: count("input_tokens"),
            output_tokens: count("completion_tokens").or_else(|| count("output_tokens")),
            cache_read_input_tokens: count("cache_read_input_tokens"),
            cache_creation_input_tokens: count("cache_creation_input_tokens"),
            cache_creation_1h_input_tokens: nested("cache_creation", "ephemeral_1h_input_tokens"),
            cached_tokens: cached("prompt_tokens_details")
                .or_else(|| cached("input_tokens_details"))
                .or_else(|| count("prompt_cache_hit_tokens")),
            total_tokens: count("total_tokens"),
        }
    }

    /// Reads a usage object of a JSON tree: a member of another type counts as absent.
    pub fn from_json(v: &serde_json::Value) -> Option<ReportedUsage> {
        let m = v.as_object()?;
        let count = |k: &str| m.get(k).and_then(serde_json::Value::as_u64);
        let nested = |k: &str, member: &str| {
            m.get(k)
                .and_then(|d| d.get(member))
                .and_then(serde_json::Value::as_u64)
        };
        Some(ReportedUsage::from_members(count, nested))
    }

    /// Reads the usage object whose `{` is next, as the `Deserialize` impl reads it: `None`
    /// ("not sure", let serde decide) on anything else, a repeated member, or a count serde
    /// might read otherwise. Members of the object are at nesting `depth + 1`.
    pub fn scan(c: &mut JsonCursor<'_>, depth: u32) -> Option<ReportedUsage> {
        if c.kind()? != JsonKind::Object {
            return None;
        }
        let mut seen = Seen::default();
        let (mut completion, mut output) = (None, None);
        let (mut prompt_detail, mut input_detail, mut hit) = (None, None, None);
        let mut u = ReportedUsage::default();
        c.object(|s, name| {
            let (bit, slot) = match name {
                b"prompt_tokens" => (0, &mut u.prompt_tokens),
                b"input_tokens" => (1, &mut u.input_tokens),
                b"completion_tokens" => (2, &mut completion),
                b"output_tokens" => (3, &mut output),
                b"cache_read_input_tokens" => (4, &mut u.cache_read_input_tokens),
                b"cache_creation_input_tokens" => (5, &mut u.cache_creation_input_tokens),
                b"prompt_cache_hit_tokens" => (6, &mut hit),
                b"total_tokens" => (7, &mut u.total_tokens),
                b"prompt_tokens_details" => {
                    seen.first(8)?;
                    prompt_detail = details(s, b"cached_tokens", depth + 1)?;
                    return Some(());
                }
                b"input_tokens_details" => {
                    seen.first(9)?;
                    input_detail = details(s, b"cached_tokens", depth + 1)?;
                    return Some(());
                }
                b"cache_creation" => {
                    seen.first(10)?;
                    u.cache_creation_1h_input_tokens =
                        details(s, b"ephemeral_1h_input_tokens", depth + 1)?;
                    return Some(());
                }
                _ => return s.skip_ignored(depth + 1),
            };
            seen.first(bit)?;
            *slot = s.count_or_null()?;
            Some(())
        })?;
        u.output_tokens = completion.or(output);
        u.cached_tokens = prompt_detail.or(input_detail).or(hit);
        Some(u)
    }

    /// Whether it holds any count of input or output (an object without one is no usage).
    pub fn has_counts(&self) -> bool {
        self.prompt_tokens.is_some() || self.input_tokens.is_some() || self.output_tokens.is_some()
    }

    /// Takes in the counts of a later report of the same answer: a count it gives replaces
    /// the earlier one (Anthropic's `message_delta` repeats cumulative counts; vLLM may repeat
    /// its usage in every chunk).
    pub fn merge(&mut self, newer: ReportedUsage) {
        let keep = |old: &mut Option<u64>, new: Option<u64>| {
            if new.is_some() {
                *old = new;
            }
        };
        keep(&mut self.prompt_tokens, newer.prompt_tokens);
        keep(&mut self.input_tokens, newer.input_tokens);
        keep(&mut self.output_tokens, newer.output_tokens);
        keep(
            &mut self.cache_read_input_tokens,
            newer.cache_read_input_tokens,
        );
        keep(
            &mut self.cache_creation_input_tokens,
            newer.cache_creation_input_tokens,
        );
        keep(
            &mut self.cache_creation_1h_input_tokens,
            newer.cache_creation_1h_input_tokens,
        );
        keep(&mut self.cached_tokens, newer.cached_tokens);
        keep(&mut self.total_tokens, newer.total_tokens);
    }

    /// The counts as seawall's [`Usage`]: the input includes the cached tokens and the cache
    /// writes (billed at their own prices), and the output includes whatever `total_tokens`
    /// holds beyond the input ([`Usage::normalized`]).
    pub fn to_usage(self) -> Usage {
        let (input, cached) = if let Some(p) = self.prompt_tokens {
            (p, self.cached_tokens.unwrap_or(0))
        } else if self.cache_read_input_tokens.is_some()
            || self.cache_creation_input_tokens.is_some()
        {
            let read = self.cache_read_input_tokens.unwrap_or(0);
            let input = self
                .input_tokens
                .unwrap_or(0)
                .saturating_add(read)
                .saturating_add(self.cache_creation_input_tokens.unwrap_or(0));
            (input, read)
        } else {
            (
                self.input_tokens.unwrap_or(0),
                self.cached_tokens.unwrap_or(0),
            )
        };
        Usage {
            input_tokens: input,
            output_tokens: self.output_tokens.unwrap_or(0),
            cached_input_tokens: cached,
            cache_write_input_tokens: self.cache_creation_input_tokens.unwrap_or(0),
            cache_write_1h_input_tokens: self.cache_creation_1h_input_tokens.unwrap_or(0),
        }
        .normalized(self.total_tokens)
    }
}

/// The count `member` of a details object, or `None` inside for `null` or its absence.
// The outer `None`: not sure (serde decides); the inner one: no count.
#[allow(clippy::option_option)]
fn details(c: &mut JsonCursor<'_>, member: &[u8], depth: u32) -> Option<Option<u64>> {
    if c.null()? {
        return Some(None);
    }
    if c.kind()? != JsonKind::Object {
        return None;
    }
    let mut seen = Seen::default();
    let mut count = None;
    c.object(|s, name| {
        if name != member {
            return s.skip_ignored(depth + 1);
        }
        seen.first(0)?;
        count = s.count_or_null()?;
        Some(())
    })?;
    Some(count)
}

/// A usage object as serde reads it, then gathered as [`ReportedUsage::scan`] gathers it.
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct UsageWire {
    prompt_tokens: Option<u64>,
    input_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_creation: Option<CacheCreation>,
    prompt_tokens_details: Option<Details>,
    input_tokens_details: Option<Details>,
    prompt_cache_hit_tokens: Option<u64>,
    total_tokens: Option<u64>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct Details {
    cached_tokens: Option<u64>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct CacheCreation {
    ephemeral_1h_input_tokens: Option<u64>,
}

impl From<UsageWire> for ReportedUsage {
    fn from(w: UsageWire) -> ReportedUsage {
        let cached = |d: &Option<Details>| d.as_ref().and_then(|d| d.cached_tokens);
        ReportedUsage {
            prompt_tokens: w.prompt_tokens,
            input_tokens: w.input_tokens,
            output_tokens: w.completion_tokens.or(w.output_tokens),
            cache_read_input_tokens: w.cache_read_input_tokens,
            cache_creation_input_tokens: w.cache_creation_input_tokens,
            cache_creation_1h_input_tokens: w
                .cache_creation
                .and_then(|c| c.ephemeral_1h_input_tokens),
            cached_tokens: cached(&w.prompt_tokens_details)
                .or(cached(&w.input_tokens_details))
                .or(w.prompt_cache_hit_tokens),
            total_tokens: w.total_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn read(text: &str) -> Usage {
        serde_json::from_str::<ReportedUsage>(text)
            .unwrap()
            .to_usage()
    }

    #[test]
    fn every_providers_shape_reads_into_one_usage() {
        let usage = |input, output, cached, written, hour| Usage {
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: cached,
            cache_write_input_tokens: written,
            cache_write_1h_input_tokens: hour,
        };
        let rows = [
            // OpenAI: the cached tokens are part of the prompt's.
            (
                r#"{"prompt_tokens":50,"completion_tokens":10,"total_tokens":60,"prompt_tokens_details":{"cached_tokens":20}}"#,
                usage(50, 10, 20, 0, 0),
            ),
            // Anthropic: the cache's reads and writes beside the input.
            (
                r#"{"input_tokens":20,"cache_creation_input_tokens":3000,"cache_read_input_tokens":200,"cache_creation":{"ephemeral_5m_input_tokens":1000,"ephemeral_1h_input_tokens":2000},"output_tokens":7}"#,
                usage(3220, 7, 200, 3000, 2000),
            ),
            // The Responses API.
            (
                r#"{"input_tokens":36,"input_tokens_details":{"cached_tokens":6},"output_tokens":3,"total_tokens":39}"#,
                usage(36, 3, 6, 0, 0),
            ),
            // DeepSeek.
            (
                r#"{"prompt_tokens":50,"completion_tokens":10,"prompt_cache_hit_tokens":30,"prompt_cache_miss_tokens":20}"#,
                usage(50, 10, 30, 0, 0),
            ),
            // A thinking model's thoughts in the total only.
            (
                r#"{"prompt_tokens":50,"completion_tokens":10,"total_tokens":90}"#,
                usage(50, 40, 0, 0, 0),
            ),
        ];
        for (text, want) in rows {
            assert_eq!(read(text), want, "{text}");
            let v: Value = serde_json::from_str(text).unwrap();
            assert_eq!(ReportedUsage::from_json(&v).unwrap().to_usage(), want);
            let scanned = ReportedUsage::scan(&mut JsonCursor::new(text), 0).unwrap();
            assert_eq!(scanned.to_usage(), want, "{text}");
        }
    }

    #[test]
    fn a_later_report_replaces_the_counts_it_gives_and_keeps_the_others() {
        let mut u: ReportedUsage = serde_json::from_str(
            r#"{"input_tokens":20,"cache_read_input_tokens":200,"output_tokens":1}"#,
        )
        .unwrap();
        u.merge(serde_json::from_str(r#"{"output_tokens":7}"#).unwrap());
        assert_eq!(
            (u.input_tokens, u.cache_read_input_tokens, u.output_tokens),
            (Some(20), Some(200), Some(7))
        );
        assert!(u.has_counts() && !ReportedUsage::default().has_counts());
    }

    fn count() -> impl Strategy<Value = Value> {
        prop_oneof![
            6 => (0u64..100_000).prop_map(Value::from),
            1 => any::<u64>().prop_map(Value::from),
            1 => Just(Value::Null),
            1 => Just(json!(-1)),
            1 => Just(json!(1.5)),
            1 => Just(json!("7")),
        ]
    }

    fn details(member: &'static str) -> impl Strategy<Value = Value> {
        prop_oneof![
            3 => (count(), count()).prop_map(move |(c, other)| json!({member: c, "other": other})),
            1 => Just(Value::Null),
            // Not an object. (An array is left out: serde's derive reads a struct from one,
            // by position, which no provider sends.)
            1 => Just(json!("x")),
        ]
    }

    /// A usage object's text: generated members in any order, sometimes one twice.
    fn usage_text() -> impl Strategy<Value = String> {
        let names = [
            "prompt_tokens",
            "input_tokens",
            "completion_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "prompt_cache_hit_tokens",
            "total_tokens",
            "prompt_tokens_details",
            "input_tokens_details",
            "cache_creation",
            "unknown",
        ];
        let member = (
            0..names.len(),
            count(),
            details("cached_tokens"),
            details("ephemeral_1h_input_tokens"),
        )
            .prop_map(move |(i, c, d, e)| {
                let value = match names[i] {
                    "prompt_tokens_details" | "input_tokens_details" => d,
                    "cache_creation" => e,
                    _ => c,
                };
                format!("{}:{}", Value::from(names[i]), value)
            });
        prop::collection::vec(member, 0..8).prop_map(|m| format!("{{{}}}", m.join(",")))
    }

    proptest! {
        /// The scan reads what serde reads, or is unsure; a tree reads the same where serde can.
        #[test]
        fn the_scan_and_serde_and_a_tree_read_the_same_counts(text in usage_text()) {
            let serde = serde_json::from_str::<ReportedUsage>(&text).ok();
            if let Some(scanned) = ReportedUsage::scan(&mut JsonCursor::new(&text), 0) {
                prop_assert_eq!(Some(scanned), serde, "{}", text);
            }
            if let Some(serde) = serde {
                let tree: Value = serde_json::from_str(&text).unwrap();
                prop_assert_eq!(ReportedUsage::from_json(&tree), Some(serde), "{}", text);
            }
        }
    }
}
