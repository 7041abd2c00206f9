//! Prices per model, and the arithmetic that turns tokens into [`Usd`].

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use seawall_core::{ModelMap, ServiceTier, TableFormat, Usage, read_table_file};
use serde::Deserialize;

use crate::money::Usd;
use seawall_core::ConfigError;

const TOKENS_PER_PRICE_UNIT: u128 = 1_000_000;

/// A model's prices, per million tokens: input, output, cached input and cache writes, and
/// optionally other prices for prompts past a long-context threshold.
///
/// A call's cost is `other input × input + cached input × cached_input + cache writes ×
/// cache_write_input + hour-long cache writes × cache_write_1h_input + output × output`,
/// summed exactly in nano-dollar-per-million units and rounded *up* to the next nano-dollar
/// once. Cached input defaults to the input price (no discount) until set; cache writes
/// (Anthropic's `cache_creation_input_tokens`, which only a provider that bills them reports)
/// default to Anthropic's prices: 1.25 times the input price for its five-minute cache, 2
/// times for the writes its usage reports as kept for an hour
/// (`cache_creation.ephemeral_1h_input_tokens`).
///
/// Some models bill a whole call at higher prices once its prompt passes a size: Gemini 2.5
/// Pro above 200,000 input tokens, Claude Sonnet's one-million-token window above 200,000
/// input tokens (cache reads and writes counted in). [`with_long_context`](Self::with_long_context)
/// gives such a model its second set of prices, used for every token of a call whose input
/// is above the threshold, in its reservation (by the estimated input) and in its cost (by
/// the reported input).
///
/// ```
/// use seawall_budget::{Price, Usd};
/// use seawall_core::Usage;
///
/// // $2.50 in, $10 out, $1.25 cached, per million tokens.
/// let p = Price::per_million(Usd::from_cents(250), Usd::from_dollars(10))
///     .with_cached_input(Usd::from_cents(125));
/// let used = Usage { input_tokens: 1_000, output_tokens: 200, cached_input_tokens: 400, ..Usage::default() };
/// // 600 × 2.5 + 400 × 1.25 + 200 × 10 = 4000 $/M = $0.004
/// assert_eq!(p.cost(&used), Usd::from_micros(4_000));
/// // 100 of the 600 written to the cache, at 1.25 × 2.5: 500 × 2.5 + 100 × 3.125 + ... = $0.0040625
/// let written = Usage { cache_write_input_tokens: 100, ..used };
/// assert_eq!(p.cost(&written), Usd::from_nanos(4_062_500));
/// // 40 of those 100 kept for an hour, at 2 × 2.5: 0.0040625 + 40 × (5 - 3.125) / 1M = $0.0041375
/// let hour = Usage { cache_write_1h_input_tokens: 40, ..written };
/// assert_eq!(p.cost(&hour), Usd::from_nanos(4_137_500));
/// // The estimate assumes no cache: 1000 × 2.5 + 500 × 10 = $0.0075
/// assert_eq!(p.estimate(1_000, 500), Usd::from_micros(7_500));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Price {
    rates: Rates,
    /// The prices of calls whose input is above a number of tokens.
    long: Option<LongContext>,
}

/// One set of prices per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Rates {
    input: Usd,
    output: Usd,
    cached_input: Usd,
    cache_write_input: Usd,
    cache_write_1h_input: Usd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct LongContext {
    above_input_tokens: u64,
    rates: Rates,
}

impl Price {
    /// Input and output prices per million tokens; cached input costs the input price, a
    /// cache write 1.25 times it, an hour-long cache write 2 times.
    pub const fn per_million(input: Usd, output: Usd) -> Price {
        Price {
            rates: Rates {
                input,
                output,
                cached_input: input,
                cache_write_input: input.percent(125),
                cache_write_1h_input: input.percent(200),
            },
            long: None,
        }
    }

    /// [`Price::per_million`] from dollar floats (`2.5`, `10.0`); negative, NaN or infinite
    /// values are an error.
    pub fn per_million_f64(input: f64, output: f64) -> Result<Price, ConfigError> {
        Ok(Price::per_million(
            Usd::from_f64(input)?,
            Usd::from_f64(output)?,
        ))
    }

    /// Sets the price of cached input tokens, per million.
    pub const fn with_cached_input(mut self, cached_input: Usd) -> Price {
        self.rates.cached_input = cached_input;
        self
    }

    /// Sets the price of input tokens written to the provider's cache, per million (1.25
    /// times the input price until set).
    pub const fn with_cache_write_input(mut self, cache_write_input: Usd) -> Price {
        self.rates.cache_write_input = cache_write_input;
        self
    }

    /// Sets the price of input tokens written to the provider's cache for an hour, per
    /// million (2 times the input price until set).
    pub const fn with_cache_write_1h_input(mut self, cache_write_1h_input: Usd) -> Price {
        self.rates.cache_write_1h_input = cache_write_1h_input;
        self
    }

    /// The input price per million tokens.
    pub const fn input(&self) -> Usd {
        self.rates.input
    }

    /// The output price per million tokens.
    pub const fn output(&self) -> Usd {
        self.rates.output
    }

    /// The cached-input price per million tokens.
    pub const fn cached_input(&self) -> Usd {
        self.rates.cached_input
    }

    /// The cache-write price per million tokens.
    pub const fn cache_write_input(&self) -> Usd {
        self.rates.cache_write_input
    }

    /// The hour-long cache-write price per million tokens.
    pub const fn cache_write_1h_input(&self) -> Usd {
        self.rates.cache_write_1h_input
    }

    /// Bills every token of a call whose input is above `above_input_tokens` at `long`'s
    /// prices (its own long-context prices, if any, are not used).
    pub const fn with_long_context(mut self, above_input_tokens: u64, long: Price) -> Price {
        self.long = Some(LongContext {
            above_input_tokens,
            rates: long.rates,
        });
        self
    }

    /// The long-context threshold and prices, if set.
    pub const fn long_context(&self) -> Option<(u64, Price)> {
        match self.long {
            Some(l) => Some((
                l.above_input_tokens,
                Price {
                    rates: l.rates,
                    long: None,
                },
            )),
            None => None,
        }
    }

    /// The prices of a call with `input_tokens` of input.
    fn rates(&self, input_tokens: u64) -> &Rates {
        match &self.long {
            Some(l) if input_tokens > l.above_input_tokens => &l.rates,
            _ => &self.rates,
        }
    }

    /// The most an attempt can cost: every input token uncached, every allowed output token
    /// used. Input is counted at the input price: a call that writes its prompt to the
    /// provider's cache settles that part at the cache-write price, above its estimate.
    pub fn estimate(&self, input_tokens: u64, max_output_tokens: u64) -> Usd {
        let r = self.rates(input_tokens);
        price_units(&[(input_tokens, r.input), (max_output_tokens, r.output)])
    }

    /// What the usage an upstream reported costs. `cached_input_tokens` and
    /// `cache_write_input_tokens` are part of `input_tokens`, `cache_write_1h_input_tokens`
    /// part of the writes (as [`Usage`] says); counts above what they are part of are clamped.
    pub fn cost(&self, usage: &Usage) -> Usd {
        self.rates(usage.input_tokens).cost(usage)
    }

    /// The prices without their long-context part, and the threshold of that part: what a
    /// budget's guard keeps of a price (the whole of it is a lookup away when a call's input
    /// passes the threshold).
    pub(crate) fn base(&self) -> (Rates, Option<u64>) {
        (self.rates, self.long.map(|l| l.above_input_tokens))
    }
}

impl Rates {
    /// What `usage` costs at these prices ([`Price::cost`]).
    pub(crate) fn cost(&self, usage: &Usage) -> Usd {
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        let written = usage
            .cache_write_input_tokens
            .min(usage.input_tokens - cached);
        let hour = usage.cache_write_1h_input_tokens.min(written);
        price_units(&[
            (usage.input_tokens - cached - written, self.input),
            (cached, self.cached_input),
            (written - hour, self.cache_write_input),
            (hour, self.cache_write_1h_input),
            (usage.output_tokens, self.output),
        ])
    }
}

/// Sum of tokens × price-per-million, in nano-dollars, rounded up once.
fn price_units(parts: &[(u64, Usd)]) -> Usd {
    let sum: u128 = parts
        .iter()
        .map(|(tokens, price)| u128::from(*tokens) * u128::from(price.as_nanos()))
        .sum();
    let nanos = sum.div_ceil(TOKENS_PER_PRICE_UNIT);
    Usd::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Prices by model name, with an optional default for models it does not list.
///
/// A name ending in `*` is a prefix pattern (`"claude-sonnet-4-5*"` also prices the dated
/// snapshot `claude-sonnet-4-5-20250929`); an exact name wins over a pattern, and the longest
/// matching pattern over shorter ones (a [`ModelMap`], as the context guard's windows). A model the table cannot price, or a request without a
/// model, gets the default price if there is one, and is rejected otherwise.
///
/// Load it from TOML or JSON with the same shape:
///
/// ```
/// use seawall_budget::{PriceTable, Usd};
///
/// let table = PriceTable::from_toml_str(r#"
///     ## USD per million tokens
///     [models."gpt-4o"]
///     input = 2.50
///     output = 10.00
///     cached_input = 1.25
///
///     [models."claude-sonnet-4-5*"]
///     input = "3.00"          # strings are parsed exactly
///     output = "15.00"
///     cached_input = "0.30"
///
///     [default]
///     input = 5
///     output = 20
/// "#).unwrap();
/// assert_eq!(table.get("gpt-4o").unwrap().output(), Usd::from_dollars(10));
/// assert_eq!(table.get("claude-sonnet-4-5-20250929").unwrap().input(), Usd::from_dollars(3));
/// assert_eq!(table.get("mystery").unwrap().input(), Usd::from_dollars(5));
/// ```
#[derive(Debug, Clone, Default)]
pub struct PriceTable {
    models: ModelMap<Price>,
    default: Option<Price>,
    /// Prices of OpenAI's priority and flex tiers, by model; empty unless set.
    priority: ModelMap<Price>,
    flex: ModelMap<Price>,
}

impl PriceTable {
    /// An empty table without a default: every model is rejected until priced.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the price of `model` (a name, or a prefix pattern ending in `*`).
    pub fn insert(&mut self, model: &str, price: Price) -> &mut Self {
        self.models.insert(model, price);
        self
    }

    /// [`PriceTable::insert`], by value.
    pub fn with(mut self, model: &str, price: Price) -> Self {
        self.insert(model, price);
        self
    }

    /// Sets (or with `None` removes) the price of models the table does not list.
    pub fn set_default(&mut self, price: Option<Price>) -> &mut Self {
        self.default = price;
        self
    }

    /// [`PriceTable::set_default`], by value.
    pub fn with_default(mut self, price: Price) -> Self {
        self.default = Some(price);
        self
    }

    /// Sets the price of `model` (a name or a pattern) for requests that ask for `tier`
    /// (OpenAI's `"service_tier": "priority"` or `"flex"`). A request for a tier its model has
    /// no price for is priced as any other; a table with no tier prices never reads a
    /// request's tier.
    pub fn insert_tier(&mut self, model: &str, tier: ServiceTier, price: Price) -> &mut Self {
        match tier {
            ServiceTier::Priority => self.priority.insert(model, price),
            ServiceTier::Flex => self.flex.insert(model, price),
        };
        self
    }

    /// [`PriceTable::insert_tier`], by value.
    pub fn with_tier(mut self, model: &str, tier: ServiceTier, price: Price) -> Self {
        self.insert_tier(model, tier, price);
        self
    }

    /// The price of `model` for requests that ask for `tier`, if the table sets one.
    pub fn get_tier(&self, model: &str, tier: ServiceTier) -> Option<Price> {
        self.tier(tier).get(model).copied()
    }

    fn tier(&self, tier: ServiceTier) -> &ModelMap<Price> {
        match tier {
            ServiceTier::Priority => &self.priority,
            ServiceTier::Flex => &self.flex,
        }
    }

    /// Whether any tier has a price: only then is a request's tier read.
    pub(crate) fn has_tiers(&self) -> bool {
        !(self.priority.is_empty() && self.flex.is_empty())
    }

    /// The default price, if set.
    pub fn default_price(&self) -> Option<Price> {
        self.default
    }

    /// The price of `model`: exact name, else the longest matching pattern, else the default.
    pub fn get(&self, model: &str) -> Option<Price> {
        self.lookup(Some(model)).map(|(p, _)| p)
    }

    /// The number of names and patterns listed (the default not counted).
    pub fn len(&self) -> usize {
        self.models.len()
    }

    /// Whether no model is listed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The price of `model` in `tier` (and that tier), else of `model`, else the default
    /// (without cloning the table's copy of the name).
    pub(crate) fn price_of(
        &self,
        model: Option<&str>,
        tier: Option<ServiceTier>,
    ) -> Option<(Price, Option<ServiceTier>)> {
        if let (Some(tier), Some(model)) = (tier, model) {
            if let Some(price) = self.tier(tier).get(model) {
                return Some((*price, Some(tier)));
            }
        }
        match model.and_then(|m| self.models.get(m)) {
            Some(price) => Some((*price, None)),
            None => self.default.map(|p| (p, None)),
        }
    }

    /// The price and, when the table lists the exact name, its shared copy of the name (so a
    /// call need not allocate one).
    pub(crate) fn lookup(&self, model: Option<&str>) -> Option<(Price, Option<Arc<str>>)> {
        let Some(model) = model else {
            return self.default.map(|p| (p, None));
        };
        match self.models.lookup(model) {
            Some((price, name)) => Some((*price, name.cloned())),
            None => self.default.map(|p| (p, None)),
        }
    }

    /// Parses a TOML table: `[models."name"]` sections with `input`, `output` and optional
    /// `cached_input`, `cache_write_input` and `cache_write_1h_input` (dollars per million
    /// tokens, as numbers or exact decimal strings), an optional `long_context` table of the
    /// same prices with `above_input_tokens` (see [`Price::with_long_context`]), optional
    /// `priority` and `flex` tables of the same shape (OpenAI's service tiers, see
    /// [`insert_tier`](Self::insert_tier)), and an optional `[default]` section of the same
    /// shape without tiers. Unknown keys are an error.
    pub fn from_toml_str(text: &str) -> Result<PriceTable, ConfigError> {
        let file: PriceFile = toml::from_str(text)
            .map_err(|e| ConfigError::new("prices", "invalid price table (TOML)").with_source(e))?;
        file.into_table()
    }

    /// Parses a JSON table of the same shape as the TOML one:
    /// `{"models": {"gpt-4o": {"input": 2.5, "output": 10}}, "default": {...}}`.
    pub fn from_json_str(text: &str) -> Result<PriceTable, ConfigError> {
        let file: PriceFile = serde_json::from_str(text)
            .map_err(|e| ConfigError::new("prices", "invalid price table (JSON)").with_source(e))?;
        file.into_table()
    }

    /// Reads a `.toml` or `.json` price file (chosen by the extension).
    pub fn from_file(path: impl AsRef<Path>) -> Result<PriceTable, ConfigError> {
        let path = path.as_ref();
        let (text, format) = read_table_file(path, "prices", "price table")?;
        let parsed = match format {
            TableFormat::Toml => Self::from_toml_str(&text),
            TableFormat::Json => Self::from_json_str(&text),
        };
        parsed.map_err(|e| {
            ConfigError::new("prices", format!("price table {}", path.display())).with_source(e)
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceFile {
    #[serde(default)]
    models: BTreeMap<String, FilePrice>,
    #[serde(default)]
    default: Option<FilePrice>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePrice {
    input: Amount,
    output: Amount,
    #[serde(default)]
    cached_input: Option<Amount>,
    #[serde(default)]
    cache_write_input: Option<Amount>,
    #[serde(default)]
    cache_write_1h_input: Option<Amount>,
    /// Only in a `long_context` table: the input size it starts above.
    #[serde(default)]
    above_input_tokens: Option<u64>,
    #[serde(default)]
    long_context: Option<Box<FilePrice>>,
    /// The model's prices for OpenAI's priority and flex tiers.
    #[serde(default)]
    priority: Option<Box<FilePrice>>,
    #[serde(default)]
    flex: Option<Box<FilePrice>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Amount {
    Number(f64),
    Text(String),
}

impl Amount {
    fn to_usd(&self, model: &str, field: &str) -> Result<Usd, ConfigError> {
        match self {
            Amount::Number(n) => Usd::from_f64(*n),
            Amount::Text(t) => t.parse(),
        }
        .map_err(|e| ConfigError::new("prices", format!("model {model:?}, {field}")).with_source(e))
    }
}

impl FilePrice {
    fn to_price(&self, model: &str) -> Result<Price, ConfigError> {
        let invalid = |what: &str| ConfigError::new("prices", format!("model {model:?}: {what}"));
        if self.above_input_tokens.is_some() {
            return Err(invalid(
                "above_input_tokens belongs in its long_context table",
            ));
        }
        let price = self.rates(model)?;
        let Some(long) = &self.long_context else {
            return Ok(price);
        };
        let Some(above) = long.above_input_tokens else {
            return Err(invalid("long_context needs above_input_tokens"));
        };
        if long.long_context.is_some() || long.has_tiers() {
            return Err(invalid("long_context cannot hold another one, or tiers"));
        }
        Ok(price.with_long_context(above, long.rates(model)?))
    }

    fn has_tiers(&self) -> bool {
        self.priority.is_some() || self.flex.is_some()
    }

    /// The tiers' prices: each a price as `to_price` reads it, without tiers of its own.
    fn tiers(&self, model: &str) -> Result<Vec<(ServiceTier, Price)>, ConfigError> {
        let mut out = Vec::new();
        for (tier, name, p) in [
            (ServiceTier::Priority, "priority", &self.priority),
            (ServiceTier::Flex, "flex", &self.flex),
        ] {
            let Some(p) = p else { continue };
            if p.has_tiers() {
                return Err(ConfigError::new(
                    "prices",
                    format!("model {model:?}: the {name} table cannot hold tiers of its own"),
                ));
            }
            out.push((tier, p.to_price(model)?));
        }
        Ok(out)
    }

    /// The table's prices, without a long-context part.
    fn rates(&self, model: &str) -> Result<Price, ConfigError> {
        let input = self.input.to_usd(model, "input")?;
        let mut price = Price::per_million(input, self.output.to_usd(model, "output")?);
        if let Some(c) = &self.cached_input {
            price = price.with_cached_input(c.to_usd(model, "cached_input")?);
        }
        if let Some(w) = &self.cache_write_input {
            price = price.with_cache_write_input(w.to_usd(model, "cache_write_input")?);
        }
        if let Some(w) = &self.cache_write_1h_input {
            price = price.with_cache_write_1h_input(w.to_usd(model, "cache_write_1h_input")?);
        }
        Ok(price)
    }
}

impl PriceFile {
    fn into_table(self) -> Result<PriceTable, ConfigError> {
        let mut table = PriceTable::new();
        for (model, p) in &self.models {
            if model.is_empty() || model == "*" {
                return Err(ConfigError::new(
                    "prices",
                    format!("model name {model:?} is empty; use [default] for unlisted models"),
                ));
            }
            table.insert(model, p.to_price(model)?);
            for (tier, price) in p.tiers(model)? {
                table.insert_tier(model, tier, price);
            }
        }
        if let Some(d) = &self.default {
            if d.has_tiers() {
                return Err(ConfigError::new(
                    "prices",
                    "the default price cannot have tiers: list the models that do",
                ));
            }
            table.set_default(Some(d.to_price("default")?));
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: u64, output: u64, cached: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: cached,
            cache_write_input_tokens: 0,
            cache_write_1h_input_tokens: 0,
        }
    }

    #[test]
    fn cost_per_model_is_exact() {
        let table = PriceTable::new()
            .with(
                "gpt-4o",
                Price::per_million(Usd::from_cents(250), Usd::from_dollars(10))
                    .with_cached_input(Usd::from_cents(125)),
            )
            .with(
                "gpt-4o-mini",
                Price::per_million_f64(0.15, 0.60)
                    .unwrap()
                    .with_cached_input(Usd::from_f64(0.075).unwrap()),
            )
            .with(
                "tiny",
                Price::per_million(Usd::from_nanos(100_000), Usd::ZERO)
                    .with_cached_input(Usd::from_nanos(50_000)),
            )
            .with(
                "claude-haiku-4-5",
                Price::per_million(Usd::from_dollars(1), Usd::from_dollars(5))
                    .with_cached_input(Usd::from_cents(10)),
            );
        let cases = [
            // 1M in, 1M out: exactly the two prices.
            ("gpt-4o", usage(1_000_000, 1_000_000, 0), 12_500_000_000),
            // 1,000 in of which 1,000 cached, 10 out: 1000 × 1.25 + 10 × 10 = 1350 $/M.
            ("gpt-4o", usage(1_000, 10, 1_000), 1_350_000),
            // 7 tokens × $0.15/M = 1.05 micro-dollars = 1050 nano.
            ("gpt-4o-mini", usage(7, 0, 0), 1_050),
            // 1 cached token × $0.075/M = 75 nano-dollars.
            ("gpt-4o-mini", usage(1, 0, 1), 75),
            // $0.0001/M is 0.1 nano-dollar a token: 11 tokens are 1.1, charged 2.
            ("tiny", usage(11, 0, 0), 2),
            // 3 × 0.1 + 3 × 0.05 = 0.45 nano-dollars: summed first, then rounded up once.
            ("tiny", usage(6, 0, 3), 1),
            (
                "claude-haiku-4-5",
                usage(2_000, 300, 1_500),
                500_000 + 150_000 + 1_500_000,
            ),
        ];
        for (model, u, nanos) in cases {
            let cost = table.get(model).unwrap().cost(&u);
            assert_eq!(cost.as_nanos(), nanos, "{model} {u:?}");
        }
    }

    #[test]
    fn cache_writes_cost_one_and_a_quarter_input_and_hour_long_ones_twice_unless_set() {
        // Anthropic's Sonnet: $3 in, $15 out, $0.30 cache reads; writes $3.75 and $6 by default.
        let p = Price::per_million(Usd::from_dollars(3), Usd::from_dollars(15))
            .with_cached_input(Usd::from_cents(30));
        assert_eq!(p.cache_write_input(), Usd::from_cents(375));
        assert_eq!(p.cache_write_1h_input(), Usd::from_dollars(6));
        // 100k prompt tokens: 90k written to the cache, 10k read from it, none else; 500 out.
        let written = Usage {
            input_tokens: 100_000,
            output_tokens: 500,
            cached_input_tokens: 10_000,
            cache_write_input_tokens: 90_000,
            cache_write_1h_input_tokens: 0,
        };
        // 90k × 3.75 + 10k × 0.30 + 500 × 15 = 337,500 + 3,000 + 7,500 $/M = $0.348
        assert_eq!(p.cost(&written), Usd::from_micros(348_000));
        // Every write kept for an hour, at twice the input price:
        // 90k × 6 + 3,000 + 7,500 = $0.5505.
        let hour = Usage {
            cache_write_1h_input_tokens: 90_000,
            ..written
        };
        assert_eq!(p.cost(&hour), Usd::from_micros(550_500));
        // A third of them: 60k × 3.75 + 30k × 6 + 10,500 = $0.4155.
        let third = Usage {
            cache_write_1h_input_tokens: 30_000,
            ..written
        };
        assert_eq!(p.cost(&third), Usd::from_micros(415_500));
        // Prices set apart.
        let set = p
            .with_cache_write_input(Usd::from_dollars(4))
            .with_cache_write_1h_input(Usd::from_dollars(7));
        // 60k × 4 + 30k × 7 + 10,500 = $0.4605.
        assert_eq!(set.cost(&third), Usd::from_micros(460_500));
        // Writes above the input, and hour-long writes above the writes, are clamped.
        let over = Usage {
            cache_write_input_tokens: 1_000_000,
            cache_write_1h_input_tokens: 5_000_000,
            ..written
        };
        assert_eq!(p.cost(&over), Usd::from_micros(550_500));
        // From a table file.
        let table = PriceTable::from_toml_str(
            "[models.\"claude-sonnet-4-5\"]\ninput = 3\noutput = 15\ncached_input = 0.3\ncache_write_input = 4\ncache_write_1h_input = 7\n",
        )
        .unwrap();
        assert_eq!(table.get("claude-sonnet-4-5"), Some(set));
    }

    #[test]
    fn a_call_above_the_long_context_threshold_pays_the_long_prices_for_every_token() {
        // Gemini 2.5 Pro: $1.25 / $10, and $2.50 / $15 for prompts above 200,000 tokens.
        let long = Price::per_million(Usd::from_cents(250), Usd::from_dollars(15));
        let p = Price::per_million(Usd::from_cents(125), Usd::from_dollars(10))
            .with_long_context(200_000, long);
        assert_eq!(p.long_context(), Some((200_000, long)));
        // At the threshold: 200,000 × 1.25 + 1,000 × 10 = $0.26.
        assert_eq!(p.cost(&usage(200_000, 1_000, 0)), Usd::from_micros(260_000));
        assert_eq!(p.estimate(200_000, 1_000), Usd::from_micros(260_000));
        // One token above: 200,001 × 2.5 + 1,000 × 15 = $0.5150025, reserved and charged.
        assert_eq!(
            p.cost(&usage(200_001, 1_000, 0)),
            Usd::from_nanos(515_002_500)
        );
        assert_eq!(p.estimate(200_001, 1_000), Usd::from_nanos(515_002_500));

        // Claude Sonnet's one-million window: cache reads and writes count toward the
        // threshold and have long prices of their own.
        let sonnet = Price::per_million(Usd::from_dollars(3), Usd::from_dollars(15))
            .with_cached_input(Usd::from_cents(30))
            .with_long_context(
                200_000,
                Price::per_million(Usd::from_dollars(6), Usd::from_cents(2_250))
                    .with_cached_input(Usd::from_cents(60)),
            );
        // 250k in: 200k read from the cache, 40k written (10k of them for an hour), 10k
        // else; 100 out. 10k × 6 + 200k × 0.6 + 30k × 7.5 + 10k × 12 + 100 × 22.5 = $0.52725.
        let u = Usage {
            cache_write_input_tokens: 40_000,
            cache_write_1h_input_tokens: 10_000,
            ..usage(250_000, 100, 200_000)
        };
        assert_eq!(sonnet.cost(&u), Usd::from_micros(527_250));

        // From a table file, and what a table file may not say.
        let table = PriceTable::from_toml_str(
            "[models.\"gemini-2.5-pro\"]\ninput = 1.25\noutput = 10\n\
             [models.\"gemini-2.5-pro\".long_context]\nabove_input_tokens = 200000\ninput = 2.5\noutput = 15\n",
        )
        .unwrap();
        assert_eq!(table.get("gemini-2.5-pro"), Some(p));
        for bad in [
            "[models.m]\ninput = 1\noutput = 1\nabove_input_tokens = 5\n",
            "[models.m]\ninput = 1\noutput = 1\n[models.m.long_context]\ninput = 2\noutput = 2\n",
            "[models.m]\ninput = 1\noutput = 1\n[models.m.long_context]\nabove_input_tokens = 5\ninput = 2\noutput = 2\n\
             [models.m.long_context.long_context]\nabove_input_tokens = 9\ninput = 3\noutput = 3\n",
        ] {
            let err = PriceTable::from_toml_str(bad).unwrap_err();
            assert!(
                format!("{err:#}").contains("above_input_tokens")
                    || format!("{err:#}").contains("long_context"),
                "{err:#}"
            );
        }
    }

    #[test]
    fn cached_above_input_is_clamped_and_huge_usage_saturates() {
        let p = Price::per_million(Usd::from_dollars(1), Usd::from_dollars(2))
            .with_cached_input(Usd::ZERO);
        assert_eq!(p.cost(&usage(10, 0, 50)), Usd::ZERO);
        assert_eq!(p.cost(&usage(u64::MAX, u64::MAX, 0)), Usd::MAX);
    }

    #[test]
    fn exact_beats_pattern_and_longest_pattern_wins() {
        let a = Price::per_million(Usd::from_dollars(1), Usd::from_dollars(1));
        let b = Price::per_million(Usd::from_dollars(2), Usd::from_dollars(2));
        let c = Price::per_million(Usd::from_dollars(3), Usd::from_dollars(3));
        let t = PriceTable::new()
            .with("gpt-4o*", a)
            .with("gpt-4o-mini*", b)
            .with("gpt-4o-mini", c);
        assert_eq!(t.get("gpt-4o-2024-08-06"), Some(a));
        assert_eq!(t.get("gpt-4o-mini-2024-07-18"), Some(b));
        assert_eq!(t.get("gpt-4o-mini"), Some(c));
        assert_eq!(t.get("o3"), None);
        assert_eq!(t.lookup(None), None);
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn json_and_toml_agree() {
        let toml = PriceTable::from_toml_str(
            "[models.m]\ninput = 0.15\noutput = \"0.60\"\ncached_input = 0.075\n",
        )
        .unwrap();
        let json = PriceTable::from_json_str(
            r#"{"models":{"m":{"input":"0.15","output":0.6,"cached_input":0.075}}}"#,
        )
        .unwrap();
        assert_eq!(toml.get("m"), json.get("m"));
        assert_eq!(
            toml.get("m").unwrap().cached_input(),
            Usd::from_nanos(75_000_000)
        );
        assert_eq!(toml.default_price(), None);
    }

    #[test]
    fn tier_prices_come_from_the_models_priority_and_flex_tables() {
        let table = PriceTable::from_toml_str(
            "[models.\"gpt-5*\"]\ninput = 1.25\noutput = 10\n\
             [models.\"gpt-5*\".priority]\ninput = 2.5\noutput = 20\n\
             [models.\"gpt-5*\".flex]\ninput = 0.625\noutput = 5\ncached_input = 0.0625\n",
        )
        .unwrap();
        let standard = Price::per_million(Usd::from_cents(125), Usd::from_dollars(10));
        assert_eq!(table.get("gpt-5-mini"), Some(standard));
        assert_eq!(
            table.get_tier("gpt-5-mini", ServiceTier::Priority),
            Some(Price::per_million(
                Usd::from_cents(250),
                Usd::from_dollars(20)
            ))
        );
        let flex = table.get_tier("gpt-5", ServiceTier::Flex).unwrap();
        assert_eq!(flex.cached_input(), Usd::from_nanos(62_500_000));
        assert!(table.has_tiers());
        let flex_tier = Some(ServiceTier::Flex);
        assert_eq!(
            table.price_of(Some("gpt-5"), flex_tier),
            Some((flex, flex_tier))
        );
        assert_eq!(table.price_of(Some("gpt-5"), None), Some((standard, None)));
        // No price for the model and no default: none, whatever the tier.
        assert_eq!(table.price_of(Some("o3"), flex_tier), None);
        assert!(!PriceTable::new().with("m", standard).has_tiers());
        for bad in [
            "[default]\ninput = 1\noutput = 1\n[default.priority]\ninput = 2\noutput = 2\n",
            "[models.m]\ninput = 1\noutput = 1\n[models.m.priority]\ninput = 2\noutput = 2\n\
             [models.m.priority.flex]\ninput = 3\noutput = 3\n",
        ] {
            let err = format!("{:#}", PriceTable::from_toml_str(bad).unwrap_err());
            assert!(err.contains("tiers"), "{err}");
        }
    }

    #[test]
    fn bad_files_give_clear_errors() {
        for (text, needle) in [
            ("[models.m]\ninput = -1\noutput = 1\n", "model \"m\", input"),
            ("[models.m]\ninput = 1\n", "output"),
            ("[models.m]\ninput = 1\noutput = 1\nouput = 2\n", "ouput"),
            ("[models.m]\ninput = \"1,5\"\noutput = 1\n", "1,5"),
            ("[models.\"\"]\ninput = 1\noutput = 1\n", "empty"),
            ("[default]\ninput = nan\noutput = 1\n", "default"),
            ("models = 3", "invalid price table"),
        ] {
            let err = PriceTable::from_toml_str(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?} -> {err}");
        }
        let err = PriceTable::from_json_str("{").unwrap_err().to_string();
        assert!(err.contains("JSON"), "{err}");
        let err = PriceTable::from_file("/nonexistent/prices.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read"), "{err}");
    }

    #[test]
    fn file_by_extension() {
        let dir = std::env::temp_dir().join(format!("seawall-budget-price-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let toml = dir.join("p.toml");
        std::fs::write(&toml, "[models.a]\ninput = 1\noutput = 2\n").unwrap();
        let json = dir.join("p.JSON");
        std::fs::write(&json, r#"{"models":{"a":{"input":1,"output":2}}}"#).unwrap();
        let txt = dir.join("p.txt");
        std::fs::write(&txt, "").unwrap();
        assert_eq!(
            PriceTable::from_file(&toml).unwrap().get("a"),
            PriceTable::from_file(&json).unwrap().get("a")
        );
        let err = PriceTable::from_file(&txt).unwrap_err().to_string();
        assert!(err.contains(".toml or .json"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    proptest::proptest! {
        /// The estimate is an upper bound of the cost of any usage within its bounds, and both
        /// agree with a naive rational computation, with long-context prices (at least the
        /// others, as providers' are) above a threshold anywhere.
        #[test]
        fn estimate_bounds_cost(
            pin in 0u64..100_000_000_000, pout in 0u64..100_000_000_000, pcache in 0u64..100_000_000_000,
            more in (0u64..100_000_000_000, 0u64..100_000_000_000, 0u64..100_000_000_000),
            above in proptest::option::of(0u64..2_000_000),
            est_in in 0u64..2_000_000, max_out in 0u64..200_000,
            used_in in 0u64..2_000_000, used_out in 0u64..200_000, cached in 0u64..2_000_000,
        ) {
            let pcache = pcache.min(pin);
            let base = Price::per_million(Usd::from_nanos(pin), Usd::from_nanos(pout))
                .with_cached_input(Usd::from_nanos(pcache));
            let (lin, lout, lcache) = (pin + more.0, pout + more.1, (pcache + more.2).min(pin + more.0));
            let long = Price::per_million(Usd::from_nanos(lin), Usd::from_nanos(lout))
                .with_cached_input(Usd::from_nanos(lcache));
            let p = match above {
                Some(above) => base.with_long_context(above, long),
                None => base,
            };
            let used_in = used_in.min(est_in);
            let used_out = used_out.min(max_out);
            let u = usage(used_in, used_out, cached);
            let cost = p.cost(&u);
            proptest::prop_assert!(cost <= p.estimate(est_in, max_out));
            let (pin, pout, pcache) = match above {
                Some(above) if used_in > above => (lin, lout, lcache),
                _ => (pin, pout, pcache),
            };
            let c = cached.min(used_in);
            let exact = u128::from(used_in - c) * u128::from(pin)
                + u128::from(c) * u128::from(pcache)
                + u128::from(used_out) * u128::from(pout);
            proptest::prop_assert_eq!(u128::from(cost.as_nanos()), exact.div_ceil(1_000_000));
        }

        /// Cache writes, and the hour-long ones among them, are each priced once at their own
        /// price, whatever the counts (above the input, above the writes), as a naive rational
        /// computation of the clamped counts prices them.
        #[test]
        fn cache_writes_are_priced_once_each_at_their_own_price(
            prices in proptest::array::uniform5(0u64..100_000_000_000),
            used_in in 0u64..2_000_000, used_out in 0u64..200_000,
            cached in 0u64..3_000_000, written in 0u64..3_000_000, hour in 0u64..3_000_000,
        ) {
            let [pin, pout, pcache, pwrite, phour] = prices;
            let p = Price::per_million(Usd::from_nanos(pin), Usd::from_nanos(pout))
                .with_cached_input(Usd::from_nanos(pcache))
                .with_cache_write_input(Usd::from_nanos(pwrite))
                .with_cache_write_1h_input(Usd::from_nanos(phour));
            let u = Usage {
                cache_write_input_tokens: written,
                cache_write_1h_input_tokens: hour,
                ..usage(used_in, used_out, cached)
            };
            let c = cached.min(used_in);
            let w = written.min(used_in - c);
            let h = hour.min(w);
            let exact = u128::from(used_in - c - w) * u128::from(pin)
                + u128::from(c) * u128::from(pcache)
                + u128::from(w - h) * u128::from(pwrite)
                + u128::from(h) * u128::from(phour)
                + u128::from(used_out) * u128::from(pout);
            proptest::prop_assert_eq!(u128::from(p.cost(&u).as_nanos()), exact.div_ceil(1_000_000));
        }
    }
}
