//! [`ContextWindows`]: how many tokens each model takes, loaded like the budget's price table.

use std::collections::BTreeMap;
use std::path::Path;

use seawall_core::{ConfigError, ModelMap, TableFormat, read_table_file};
use serde::Deserialize;

/// A model's limits, in tokens.
///
/// - `context`: the window the prompt and the maximum output must fit in together (OpenAI
///   and Anthropic count both against it: 100,000 prompt tokens and `max_tokens` 30,000 do
///   not fit in 128,000);
/// - `max_output`: the most output tokens the model accepts as its output bound;
/// - `max_input`: a bound on the prompt alone, for providers that state one (Gemini).
///
/// ```
/// use seawall_guard::ModelLimits;
/// let l = ModelLimits::new(128_000).with_max_output(16_384);
/// assert_eq!((l.context(), l.max_output(), l.max_input()), (128_000, Some(16_384), None));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModelLimits {
    context: u32,
    max_output: Option<u32>,
    max_input: Option<u32>,
}

impl ModelLimits {
    /// A window of `context` tokens, with no separate output or input bound.
    pub const fn new(context: u32) -> Self {
        ModelLimits {
            context,
            max_output: None,
            max_input: None,
        }
    }

    /// Sets the most output tokens the model accepts.
    pub const fn with_max_output(mut self, tokens: u32) -> Self {
        self.max_output = Some(tokens);
        self
    }

    /// Sets a bound on the prompt alone.
    pub const fn with_max_input(mut self, tokens: u32) -> Self {
        self.max_input = Some(tokens);
        self
    }

    /// The window, in tokens.
    pub const fn context(&self) -> u32 {
        self.context
    }

    /// The most output tokens, if bounded apart.
    pub const fn max_output(&self) -> Option<u32> {
        self.max_output
    }

    /// The most prompt tokens, if bounded apart.
    pub const fn max_input(&self) -> Option<u32> {
        self.max_input
    }

    /// The most prompt tokens this window takes with room for `output` more.
    pub(crate) fn input_room(&self, output: u64) -> u64 {
        let room = u64::from(self.context).saturating_sub(output);
        self.max_input.map_or(room, |m| room.min(u64::from(m)))
    }

    fn check(&self, model: &str) -> Result<Self, ConfigError> {
        let bad = |what: &str| {
            Err(ConfigError::new(
                "context_windows",
                format!("model {model:?}: {what}"),
            ))
        };
        if self.context == 0 {
            return bad("`context` must be at least 1 token");
        }
        if self.max_output == Some(0) || self.max_input == Some(0) {
            return bad("`max_output` and `max_input` must be at least 1 token");
        }
        if self.max_output.is_some_and(|m| m > self.context) {
            return bad("`max_output` is larger than `context`");
        }
        Ok(*self)
    }
}

/// Context windows by model name, with an optional default for models it does not list.
///
/// Names match as in the budget's price table ([`ModelMap`]): a name ending in `*` is a prefix
/// pattern (`"claude-sonnet-4*"` covers `claude-sonnet-4-5-20250929`); an exact name wins over
/// a pattern, and the longest matching pattern over shorter ones. **A model the table does not
/// know is not checked**: its requests pass through unchanged (recorded as `skipped`), unless
/// a default is set. `crates/seawall-guard/context_windows.example.toml` lists the common
/// models.
///
/// ```
/// use seawall_guard::{ContextWindows, ModelLimits};
///
/// let windows = ContextWindows::from_toml_str(r#"
///     [models."gpt-4o*"]
///     context = 128000
///     max_output = 16384
///
///     [models."claude-sonnet-4*"]
///     context = 200000
/// "#).unwrap();
/// assert_eq!(windows.get("gpt-4o-2024-08-06").unwrap().max_output(), Some(16_384));
/// assert_eq!(windows.get("claude-sonnet-4-5").unwrap().context(), 200_000);
/// assert_eq!(windows.get("mystery"), None);
/// let windows = windows.with_default(ModelLimits::new(8_192));
/// assert_eq!(windows.get("mystery").unwrap().context(), 8_192);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ContextWindows {
    models: ModelMap<ModelLimits>,
    default: Option<ModelLimits>,
}

impl ContextWindows {
    /// An empty table without a default: no model is checked until listed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the limits of `model` (a name, or a prefix pattern ending in `*`).
    pub fn insert(&mut self, model: &str, limits: ModelLimits) -> &mut Self {
        self.models.insert(model, limits);
        self
    }

    /// [`ContextWindows::insert`], by value.
    pub fn with(mut self, model: &str, limits: ModelLimits) -> Self {
        self.insert(model, limits);
        self
    }

    /// Sets (or with `None` removes) the limits of models the table does not list.
    pub fn set_default(&mut self, limits: Option<ModelLimits>) -> &mut Self {
        self.default = limits;
        self
    }

    /// [`ContextWindows::set_default`], by value.
    pub fn with_default(mut self, limits: ModelLimits) -> Self {
        self.default = Some(limits);
        self
    }

    /// The limits of `model`: exact name, else the longest matching pattern, else the default.
    pub fn get(&self, model: &str) -> Option<ModelLimits> {
        self.models.get(model).copied().or(self.default)
    }

    /// The number of names and patterns listed (the default not counted).
    pub fn len(&self) -> usize {
        self.models.len()
    }

    /// Whether no model is listed.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// Parses a TOML table: `[models."name"]` sections with `context` and optional
    /// `max_output` and `max_input` (tokens), and an optional `[default]` section of the same
    /// shape. Unknown keys, zero and negative sizes are errors.
    pub fn from_toml_str(text: &str) -> Result<ContextWindows, ConfigError> {
        let file: WindowFile = toml::from_str(text).map_err(|e| {
            ConfigError::new("context_windows", "invalid context windows (TOML)").with_source(e)
        })?;
        file.into_table()
    }

    /// Parses a JSON table of the same shape as the TOML one:
    /// `{"models": {"gpt-4o": {"context": 128000, "max_output": 16384}}, "default": {...}}`.
    pub fn from_json_str(text: &str) -> Result<ContextWindows, ConfigError> {
        let file: WindowFile = serde_json::from_str(text).map_err(|e| {
            ConfigError::new("context_windows", "invalid context windows (JSON)").with_source(e)
        })?;
        file.into_table()
    }

    /// Reads a `.toml` or `.json` file (chosen by the extension).
    pub fn from_file(path: impl AsRef<Path>) -> Result<ContextWindows, ConfigError> {
        let path = path.as_ref();
        let (text, format) = read_table_file(path, "context_windows", "context windows")?;
        match format {
            TableFormat::Toml => Self::from_toml_str(&text),
            TableFormat::Json => Self::from_json_str(&text),
        }
        .map_err(|e| {
            ConfigError::new(
                "context_windows",
                format!("context windows {}", path.display()),
            )
            .with_source(e)
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WindowFile {
    #[serde(default)]
    models: BTreeMap<String, FileLimits>,
    #[serde(default)]
    default: Option<FileLimits>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLimits {
    context: u32,
    #[serde(default)]
    max_output: Option<u32>,
    #[serde(default)]
    max_input: Option<u32>,
}

impl FileLimits {
    fn limits(&self, model: &str) -> Result<ModelLimits, ConfigError> {
        ModelLimits {
            context: self.context,
            max_output: self.max_output,
            max_input: self.max_input,
        }
        .check(model)
    }
}

impl WindowFile {
    fn into_table(self) -> Result<ContextWindows, ConfigError> {
        let mut table = ContextWindows::new();
        for (model, l) in &self.models {
            if model.is_empty() || model == "*" {
                return Err(ConfigError::new(
                    "context_windows",
                    format!("model name {model:?} is empty; use [default] for unlisted models"),
                ));
            }
            table.insert(model, l.limits(model)?);
        }
        if let Some(d) = &self.default {
            table.set_default(Some(d.limits("default")?));
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_file_loads_and_knows_the_common_models() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/context_windows.example.toml");
        let w = ContextWindows::from_file(path).unwrap();
        for (model, context) in [
            ("gpt-4o", 128_000),
            ("gpt-4o-mini-2024-07-18", 128_000),
            ("gpt-4.1", 1_047_576),
            ("gpt-4.1-mini", 1_047_576),
            ("o3", 200_000),
            ("o4-mini", 200_000),
            ("claude-sonnet-4-5-20250929", 200_000),
            ("claude-opus-4-1", 200_000),
            ("claude-haiku-4-5", 200_000),
            ("deepseek-chat", 128_000),
        ] {
            assert_eq!(w.get(model).map(|l| l.context()), Some(context), "{model}");
        }
        assert_eq!(w.get("gpt-4o-mini").unwrap().max_output(), Some(16_384));
        assert_eq!(w.get("claude-opus-4-1").unwrap().max_output(), Some(32_000));
        assert_eq!(w.get("claude-opus-4-5").unwrap().max_output(), Some(64_000));
        assert_eq!(
            w.get("gemini-2.5-flash").unwrap().max_input(),
            Some(1_048_576)
        );
        assert_eq!(w.get("llama-3"), None);
    }

    #[test]
    fn json_and_toml_agree() {
        let t = ContextWindows::from_toml_str(
            "[models.m]\ncontext = 1000\nmax_output = 10\n[default]\ncontext = 5\n",
        )
        .unwrap();
        let j = ContextWindows::from_json_str(
            r#"{"models":{"m":{"context":1000,"max_output":10}},"default":{"context":5}}"#,
        )
        .unwrap();
        assert_eq!(t.get("m"), j.get("m"));
        assert_eq!(t.get("other"), Some(ModelLimits::new(5)));
        assert_eq!(j.get("other"), Some(ModelLimits::new(5)));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn bad_files_give_clear_errors() {
        for (text, needle) in [
            ("[models.m]\ncontext = 0\n", "at least 1"),
            ("[models.m]\ncontext = -5\n", "TOML"),
            ("[models.m]\ncontext = 99999999999\n", "TOML"),
            ("[models.m]\ncontext = 10\nmax_output = 20\n", "larger than"),
            ("[models.m]\ncontext = 10\nmax_output = 0\n", "at least 1"),
            ("[models.m]\ncontxt = 10\n", "TOML"),
            ("[models.\"*\"]\ncontext = 10\n", "empty"),
            ("models = 3", "TOML"),
        ] {
            let err = ContextWindows::from_toml_str(text).unwrap_err();
            let shown = format!("{err}");
            assert!(shown.contains(needle), "{text:?} -> {shown}");
        }
        assert!(
            ContextWindows::from_json_str("{")
                .unwrap_err()
                .to_string()
                .contains("JSON")
        );
        let err = ContextWindows::from_file("/nonexistent/w.yaml").unwrap_err();
        assert!(err.to_string().contains("cannot read"), "{err}");
    }
}
