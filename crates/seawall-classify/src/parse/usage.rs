//! Usage as the providers report it, in every shape both parsers meet: OpenAI's
//! `prompt_tokens` with cached-token details, Anthropic's `input_tokens` with cache reads and
//! writes counted apart (and split over two events), the Responses API's and DeepSeek's
//! variants, and servers whose `total_tokens` holds output that `completion_tokens` leaves
//! out (a thinking model's thought tokens). Read once here into one [`Usage`].

use seawall_core::Usage;

use super::scan::View;

/// Raw usage fields, merged as events arrive (Anthropic splits usage over `message_start` and
/// `message_delta`; vLLM may repeat cumulative usage in every chunk).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct RawUsage {
    /// OpenAI `prompt_tokens` (cached tokens included).
    pub(super) prompt: Option<u64>,
    /// Anthropic / Responses API `input_tokens`.
    pub(super) input: Option<u64>,
    pub(super) output: Option<u64>,
    /// Anthropic `cache_read_input_tokens` (not included in `input_tokens`).
    pub(super) cache_read: Option<u64>,
    /// Anthropic `cache_creation_input_tokens` (not included in `input_tokens`).
    pub(super) cache_creation: Option<u64>,
    /// Anthropic `cache_creation.ephemeral_1h_input_tokens`: the writes kept for an hour,
    /// part of `cache_creation_input_tokens`.
    pub(super) cache_creation_1h: Option<u64>,
    /// OpenAI `prompt_tokens_details.cached_tokens`, Responses API
    /// `input_tokens_details.cached_tokens`, DeepSeek `prompt_cache_hit_tokens`.
    pub(super) cached_detail: Option<u64>,
    /// OpenAI and the Responses API's `total_tokens`.
    pub(super) total: Option<u64>,
}

impl RawUsage {
    /// Reads a usage object, from a `Value` or the bytes of one ([`View`]).
    pub(super) fn from_value<'a, V: View<'a>>(v: V) -> Option<RawUsage> {
        if !v.is_object() {
            return None;
        }
        let n = |k: &str| v.get(k).and_then(V::as_u64);
        let nested =
            |k: &str, member: &str| v.get(k).and_then(|d| d.get(member)).and_then(V::as_u64);
        let detail = |k: &str| nested(k, "cached_tokens");
        let raw = RawUsage {
            prompt: n("prompt_tokens"),
            input: n("input_tokens"),
            output: n("completion_tokens").or_else(|| n("output_tokens")),
            cache_read: n("cache_read_input_tokens"),
            cache_creation: n("cache_creation_input_tokens"),
            cache_creation_1h: nested("cache_creation", "ephemeral_1h_input_tokens"),
            cached_detail: detail("prompt_tokens_details")
                .or_else(|| detail("input_tokens_details"))
                .or_else(|| n("prompt_cache_hit_tokens")),
            total: n("total_tokens"),
        };
        (raw.prompt.is_some() || raw.input.is_some() || raw.output.is_some()).then_some(raw)
    }

    pub(super) fn merge(&mut self, newer: RawUsage) {
        let keep = |old: &mut Option<u64>, new: Option<u64>| {
            if new.is_some() {
                *old = new;
            }
        };
        keep(&mut self.prompt, newer.prompt);
        keep(&mut self.input, newer.input);
        keep(&mut self.output, newer.output);
        keep(&mut self.cache_read, newer.cache_read);
        keep(&mut self.cache_creation, newer.cache_creation);
        keep(&mut self.cache_creation_1h, newer.cache_creation_1h);
        keep(&mut self.cached_detail, newer.cached_detail);
        keep(&mut self.total, newer.total);
    }

    pub(super) fn to_usage(self) -> Usage {
        let (input, cached) = if let Some(p) = self.prompt {
            (p, self.cached_detail.unwrap_or(0))
        } else if self.cache_read.is_some() || self.cache_creation.is_some() {
            let read = self.cache_read.unwrap_or(0);
            let input = self
                .input
                .unwrap_or(0)
                .saturating_add(read)
                .saturating_add(self.cache_creation.unwrap_or(0));
            (input, read)
        } else {
            (self.input.unwrap_or(0), self.cached_detail.unwrap_or(0))
        };
        // Anthropic's cache writes, billed above the input price, are part of the input; the
        // total's output beyond `completion_tokens` is output (`Usage::normalized`).
        Usage {
            input_tokens: input,
            output_tokens: self.output.unwrap_or(0),
            cached_input_tokens: cached,
            cache_write_input_tokens: self.cache_creation.unwrap_or(0),
            cache_write_1h_input_tokens: self.cache_creation_1h.unwrap_or(0),
        }
        .normalized(self.total)
    }
}

#[derive(serde::Deserialize, Default, Clone, Copy)]
#[serde(default)]
pub(super) struct UsageWire {
    prompt_tokens: Option<u64>,
    input_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_creation: Option<CacheCreationWire>,
    prompt_tokens_details: Option<DetailsWire>,
    input_tokens_details: Option<DetailsWire>,
    prompt_cache_hit_tokens: Option<u64>,
    total_tokens: Option<u64>,
}

#[derive(serde::Deserialize, Default, Clone, Copy)]
#[serde(default)]
pub(super) struct DetailsWire {
    cached_tokens: Option<u64>,
}

#[derive(serde::Deserialize, Default, Clone, Copy)]
#[serde(default)]
pub(super) struct CacheCreationWire {
    ephemeral_1h_input_tokens: Option<u64>,
}

impl UsageWire {
    /// The same reading as [`RawUsage::from_value`], from the typed fields.
    pub(super) fn raw(self) -> Option<RawUsage> {
        let detail = |d: Option<DetailsWire>| d.and_then(|d| d.cached_tokens);
        let raw = RawUsage {
            prompt: self.prompt_tokens,
            input: self.input_tokens,
            output: self.completion_tokens.or(self.output_tokens),
            cache_read: self.cache_read_input_tokens,
            cache_creation: self.cache_creation_input_tokens,
            cache_creation_1h: self
                .cache_creation
                .and_then(|c| c.ephemeral_1h_input_tokens),
            cached_detail: detail(self.prompt_tokens_details)
                .or(detail(self.input_tokens_details))
                .or(self.prompt_cache_hit_tokens),
            total: self.total_tokens,
        };
        (raw.prompt.is_some() || raw.input.is_some() || raw.output.is_some()).then_some(raw)
    }
}
