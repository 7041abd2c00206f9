//! Reading a profile: from TOML text, from a file, or one of the shipped profiles by name.

use std::path::Path;

use super::{Profile, ProfileError};

/// The profiles shipped in `crates/seawall-mock/profiles/`, by name.
const BUILTIN: &[(&str, &str)] = &[
    ("calm", include_str!("../../profiles/calm.toml")),
    ("storm", include_str!("../../profiles/storm.toml")),
    ("outage", include_str!("../../profiles/outage.toml")),
    (
        "flaky-streams",
        include_str!("../../profiles/flaky-streams.toml"),
    ),
    ("deepseek", include_str!("../../profiles/deepseek.toml")),
    ("example", include_str!("../../profiles/example.toml")),
];

impl Profile {
    /// Parses and validates a TOML profile.
    pub fn from_toml(text: &str) -> Result<Profile, ProfileError> {
        let p: Profile = toml::from_str(text).map_err(|e| ProfileError::new(e.to_string()))?;
        p.validate()?;
        Ok(p)
    }

    /// Reads a TOML profile from a file.
    pub fn load(path: impl AsRef<Path>) -> Result<Profile, ProfileError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ProfileError::new(format!("cannot read {}: {e}", path.display())))?;
        Profile::from_toml(&text)
            .map_err(|e| ProfileError::new(format!("{}: {}", path.display(), e.message.trim_end())))
    }

    /// A shipped profile by name: `calm`, `storm`, `outage`, `flaky-streams`, `deepseek`,
    /// `example`.
    pub fn builtin(name: &str) -> Option<Profile> {
        let (_, text) = BUILTIN.iter().find(|(n, _)| *n == name)?;
        Profile::from_toml(text).ok()
    }

    /// The names of the shipped profiles.
    pub fn builtin_names() -> impl Iterator<Item = &'static str> {
        BUILTIN.iter().map(|(n, _)| *n)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Count, Delay, ErrorRule, KeepAliveStyle, KeyBy, KeyLimits, LogNormal};

    #[test]
    fn every_shipped_profile_parses() {
        for name in Profile::builtin_names() {
            assert!(Profile::builtin(name).is_some(), "{name}");
        }
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/profiles");
        let mut files = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                Profile::load(&path).unwrap_or_else(|e| panic!("{e}"));
                let stem = path.file_stem().unwrap().to_str().unwrap();
                assert!(Profile::builtin(stem).is_some(), "{stem} is not shipped");
                files += 1;
            }
        }
        assert_eq!(files, BUILTIN.len());
    }

    #[test]
    fn the_example_profile_sets_every_field() {
        let p = Profile::builtin("example").unwrap();
        assert_eq!(p.seed, 42);
        assert_eq!(p.limits.key_by, KeyBy::ApiKey);
        assert_eq!((p.limits.rpm, p.limits.tpm), (Some(60), Some(40_000)));
        assert_eq!(
            p.limits.keys["sk-small"],
            KeyLimits::new(Some(5), Some(2000))
        );
        assert_eq!(p.quota.tokens, Some(1_000_000));
        assert_eq!(p.quota.exhausted_keys, ["sk-broke"]);
        assert_eq!(p.context.window, Some(8192));
        assert_eq!(p.context.models["gpt-4o"], 128_000);
        assert_eq!(p.latency.head, Delay::fixed(Duration::from_millis(20)));
        let ft = p.latency.first_token;
        assert_eq!(ft.fixed, Duration::from_millis(100));
        assert_eq!(ft.max, Some(Duration::from_secs(10)));
        assert_eq!(
            ft.lognormal,
            Some(LogNormal {
                median: Duration::from_millis(300),
                sigma: 0.5
            })
        );
        assert_eq!(
            p.latency.per_token.uniform,
            Some((Duration::from_millis(5), Duration::from_millis(25)))
        );
        assert_eq!(p.output.tokens, Count::range(20, 80));
        assert!(!p.output.always_include_usage);
        assert_eq!(p.stream.keepalive.probability, 0.3);
        assert_eq!(p.stream.keepalive.interval, Duration::from_secs(1));
        assert_eq!(p.stream.keepalive.style, KeepAliveStyle::Comment);
        assert_eq!(p.stream.cut.after_tokens, Count::range(1, 30));
        assert!(!p.stream.cut.abort);
        assert_eq!(p.stream.error.probability, 0.02);
        assert_eq!(p.malformed.kinds.len(), 2);
        assert_eq!(p.auth.invalid_keys, ["sk-revoked"]);
        let r = &p.errors[0];
        assert_eq!(r.status, [503, 529]);
        assert_eq!(r.start, Some(Duration::from_secs(30)));
        assert_eq!(r.end, Some(Duration::from_secs(45)));
        assert_eq!(r.period, Some(Duration::from_secs(120)));
        assert_eq!(r.probability, 0.9);
        assert_eq!(r.models, ["gpt-4o"]);
        assert_eq!(r.retry_after, Some(Duration::from_secs(5)));
        assert_eq!(r.should_retry, Some(true));
        assert_eq!(p.errors[1], ErrorRule::random(500, 0.01));
    }
}
