//! The checks serde cannot make: ranges, probabilities, statuses and error windows.

use super::{Count, Delay, KeyBy, Profile, ProfileError};

impl Profile {
    /// Checks the values serde cannot: ranges, probabilities, statuses, windows.
    pub fn validate(&self) -> Result<(), ProfileError> {
        fn prob(name: &str, p: f64) -> Result<(), ProfileError> {
            if (0.0..=1.0).contains(&p) {
                Ok(())
            } else {
                Err(ProfileError::new(format!(
                    "{name} must be between 0 and 1, got {p}"
                )))
            }
        }
        fn count(name: &str, c: Count) -> Result<(), ProfileError> {
            if c.min <= c.max {
                Ok(())
            } else {
                Err(ProfileError::new(format!(
                    "{name}: range [{}, {}] is empty",
                    c.min, c.max
                )))
            }
        }
        fn delay(name: &str, d: &Delay) -> Result<(), ProfileError> {
            if let Some((lo, hi)) = d.uniform
                && lo > hi
            {
                return Err(ProfileError::new(format!("{name}.uniform: range is empty")));
            }
            if let Some(l) = d.lognormal
                && !(l.sigma.is_finite() && l.sigma >= 0.0 && l.sigma <= 10.0)
            {
                return Err(ProfileError::new(format!(
                    "{name}.lognormal.sigma must be between 0 and 10, got {}",
                    l.sigma
                )));
            }
            Ok(())
        }
        for (name, n) in [
            ("limits.rpm", self.limits.rpm),
            ("limits.tpm", self.limits.tpm),
        ] {
            if n == Some(0) {
                return Err(ProfileError::new(format!(
                    "{name} must be positive (leave it out for no limit)"
                )));
            }
        }
        for (k, l) in &self.limits.keys {
            if l.rpm == Some(0) || l.tpm == Some(0) {
                let shown = if self.limits.key_by == KeyBy::Model {
                    k.as_str()
                } else {
                    "<key>"
                };
                return Err(ProfileError::new(format!(
                    "limits.keys.{shown}: limits must be positive"
                )));
            }
        }
        delay("latency.head", &self.latency.head)?;
        delay("latency.first_token", &self.latency.first_token)?;
        delay("latency.per_token", &self.latency.per_token)?;
        count("output.tokens", self.output.tokens)?;
        prob(
            "stream.keepalive.probability",
            self.stream.keepalive.probability,
        )?;
        if self.stream.keepalive.probability > 0.0 && self.stream.keepalive.interval.is_zero() {
            return Err(ProfileError::new(
                "stream.keepalive.interval must be positive",
            ));
        }
        prob("stream.cut.probability", self.stream.cut.probability)?;
        count("stream.cut.after_tokens", self.stream.cut.after_tokens)?;
        prob("stream.error.probability", self.stream.error.probability)?;
        count("stream.error.after_tokens", self.stream.error.after_tokens)?;
        prob("malformed.probability", self.malformed.probability)?;
        if self.malformed.probability > 0.0 && self.malformed.kinds.is_empty() {
            return Err(ProfileError::new("malformed.kinds is empty"));
        }
        for (i, r) in self.errors.iter().enumerate() {
            let at = format!("errors[{i}]");
            prob(&format!("{at}.probability"), r.probability)?;
            if r.status.is_empty() {
                return Err(ProfileError::new(format!("{at}.status is empty")));
            }
            if let Some(s) = r.status.iter().find(|s| !(400..=599).contains(*s)) {
                return Err(ProfileError::new(format!(
                    "{at}.status {s} is not an error status (400-599)"
                )));
            }
            if let (Some(s), Some(e)) = (r.start, r.end)
                && e <= s
            {
                return Err(ProfileError::new(format!("{at}: end is not after start")));
            }
            if r.period.is_some() && r.end.is_none() {
                return Err(ProfileError::new(format!("{at}: period needs an end")));
            }
            if let (Some(p), Some(e)) = (r.period, r.end)
                && p < e.saturating_sub(r.start.unwrap_or_default())
            {
                return Err(ProfileError::new(format!(
                    "{at}: period is shorter than the window"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::Profile;

    #[test]
    fn bad_profiles_are_clear_errors() {
        let cases = [
            ("sede = 1", "unknown field `sede`"),
            ("[limits]\nrpm = \"fast\"", "rpm"),
            ("[limits]\nrpm = 0", "limits.rpm must be positive"),
            ("[limits]\nkey_by = \"ip\"", "key_by"),
            ("[latency]\nhead = \"soon\"", "invalid duration \"soon\""),
            (
                "[stream.cut]\nprobability = 1.5",
                "stream.cut.probability must be between 0 and 1",
            ),
            (
                "[output]\ntokens = [9, 3]",
                "output.tokens: range [9, 3] is empty",
            ),
            ("[output]\ntokens = \"many\"", "expected a count"),
            ("[[errors]]\nstatus = 200", "not an error status"),
            (
                "[[errors]]\nstart = \"9s\"\nend = \"3s\"",
                "end is not after start",
            ),
            ("[[errors]]\nperiod = \"9s\"", "period needs an end"),
            (
                "[[errors]]\nstart = 0\nend = \"10s\"\nperiod = \"5s\"",
                "period is shorter than the window",
            ),
            (
                "[latency]\nfirst_token = { lognormal = { median = \"1s\", sigma = -1 } }",
                "sigma",
            ),
        ];
        for (text, want) in cases {
            let err = Profile::from_toml(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
        let err = Profile::load("/no/such/profile.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read /no/such/profile.toml"), "{err}");
    }
}
