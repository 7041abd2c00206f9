//! Tables keyed by model name, as the budget's prices and the guard's context windows are.
//!
//! Both tables answer "what do we know about this model?" for names that arrive in request
//! bodies, where a dated snapshot (`claude-sonnet-4-5-20250929`) or a variant
//! (`gpt-4o-2024-08-06`) should find the entry written for its family. [`ModelMap`] is that
//! lookup, once: exact names, and patterns ending in `*` that match by prefix, the longest
//! pattern first. [`read_table_file`] reads such a table's file, TOML or JSON by extension;
//! each table parses its own shape.
//!
//! The exact names are hashed with `foldhash`, not the standard library's SipHash: the table
//! is built from configuration and only looked up with the names requests bring, so a hostile
//! name can cost one probe but can never grow a bucket, and a lookup is on every call's path
//! (SipHash was most of the budget's price lookup).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::config::ConfigError;

/// Values by model name: exact names, and prefix patterns ending in `*`.
///
/// An exact name wins over a pattern, and the longest matching pattern over shorter ones.
///
/// ```
/// use seawall_core::ModelMap;
///
/// let mut m = ModelMap::new();
/// m.insert("gpt-4o*", 1).insert("gpt-4o-mini*", 2).insert("gpt-4o-mini", 3);
/// assert_eq!(m.get("gpt-4o-2024-08-06"), Some(&1));
/// assert_eq!(m.get("gpt-4o-mini-2024-07-18"), Some(&2));
/// assert_eq!(m.get("gpt-4o-mini"), Some(&3));
/// assert_eq!(m.get("o3"), None);
/// ```
#[derive(Debug, Clone)]
pub struct ModelMap<V> {
    exact: HashMap<Arc<str>, V, foldhash::fast::RandomState>,
    // Longest pattern first.
    prefixes: Vec<(Arc<str>, V)>,
}

impl<V> Default for ModelMap<V> {
    fn default() -> Self {
        ModelMap {
            exact: HashMap::default(),
            prefixes: Vec::new(),
        }
    }
}

impl<V> ModelMap<V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the value of `model`: a name, or a prefix pattern ending in `*`. A second insert
    /// of the same name or pattern replaces the first.
    pub fn insert(&mut self, model: &str, value: V) -> &mut Self {
        match model.strip_suffix('*') {
            Some(prefix) => {
                self.prefixes.retain(|(p, _)| &**p != prefix);
                self.prefixes.push((prefix.into(), value));
                self.prefixes
                    .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
            }
            None => {
                self.exact.insert(model.into(), value);
            }
        }
        self
    }

    /// The value of `model`: its exact name, else the longest matching pattern.
    pub fn get(&self, model: &str) -> Option<&V> {
        self.lookup(model).map(|(v, _)| v)
    }

    /// [`get`](Self::get), with the map's shared copy of the name when the name matched
    /// exactly (so a caller that keeps the name need not allocate one).
    pub fn lookup(&self, model: &str) -> Option<(&V, Option<&Arc<str>>)> {
        if let Some((name, v)) = self.exact.get_key_value(model) {
            return Some((v, Some(name)));
        }
        self.prefixes
            .iter()
            .find(|(prefix, _)| model.starts_with(&**prefix))
            .map(|(_, v)| (v, None))
    }

    /// The number of names and patterns.
    pub fn len(&self) -> usize {
        self.exact.len() + self.prefixes.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The two formats a table file may be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableFormat {
    /// A `.toml` file.
    Toml,
    /// A `.json` file.
    Json,
}

/// Reads a table file, and tells its format by its extension (`.toml` or `.json`, in any
/// case). Errors name `field` (the setting, such as `prices`) and `what` with the path ("cannot
/// read price table /etc/prices.toml").
pub fn read_table_file(
    path: &Path,
    field: &'static str,
    what: &str,
) -> Result<(String, TableFormat), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(field, format!("cannot read {what} {}", path.display())).with_source(e)
    })?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("toml") => Ok((text, TableFormat::Toml)),
        Some("json") => Ok((text, TableFormat::Json)),
        _ => Err(ConfigError::new(
            field,
            format!("{what} {} must end in .toml or .json", path.display()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_beats_pattern_and_the_longest_pattern_wins() {
        let mut m = ModelMap::new();
        m.insert("claude-*", "any")
            .insert("claude-opus-4*", "opus4");
        m.insert("claude-opus-4*", "opus4 again");
        assert_eq!(m.get("claude-opus-4-1-20250805"), Some(&"opus4 again"));
        assert_eq!(m.get("claude-haiku"), Some(&"any"));
        assert_eq!(m.len(), 2);
        m.insert("claude-haiku", "exact");
        let (v, name) = m.lookup("claude-haiku").unwrap();
        assert_eq!((*v, name.map(|n| &**n)), ("exact", Some("claude-haiku")));
        assert_eq!(m.lookup("claude-x").unwrap().1, None);
        assert!(ModelMap::<u8>::new().is_empty());
    }

    #[test]
    fn table_files_by_extension() {
        let dir = std::env::temp_dir().join(format!("seawall-core-table-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, want) in [
            ("t.toml", Some(TableFormat::Toml)),
            ("t.JSON", Some(TableFormat::Json)),
            ("t.yaml", None),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, "x").unwrap();
            let got = read_table_file(&path, "tables", "table");
            match want {
                Some(f) => assert_eq!(got.unwrap(), ("x".to_owned(), f)),
                None => assert!(got.unwrap_err().to_string().contains(".toml or .json")),
            }
        }
        let err = read_table_file(&dir.join("missing.toml"), "tables", "table").unwrap_err();
        assert!(err.to_string().contains("cannot read table"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
