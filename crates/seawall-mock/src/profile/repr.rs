//! How a profile is written in TOML: durations as text or seconds, counts as a number or a
//! range, delays as a duration or a table, statuses as one or a list.

use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};

use super::{Count, Delay, LogNormal};

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

fn duration_from_secs(x: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(x).map_err(|_| format!("invalid duration {x} (seconds)"))
}

#[derive(Deserialize)]
#[serde(untagged)]
enum DurRepr {
    Text(String),
    Int(u64),
    Float(f64),
}

impl DurRepr {
    fn into_duration(self) -> Result<Duration, String> {
        match self {
            DurRepr::Text(s) => parse_duration(&s),
            DurRepr::Int(n) => Ok(Duration::from_secs(n)),
            DurRepr::Float(x) => duration_from_secs(x),
        }
    }
}

fn format_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

pub(super) mod dur {
    use super::*;

    pub(in crate::profile) fn serialize<S: Serializer>(
        d: &Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    pub(in crate::profile) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Duration, D::Error> {
        DurRepr::deserialize(d)?
            .into_duration()
            .map_err(de::Error::custom)
    }
}

pub(super) mod opt_dur {
    use super::*;

    pub(in crate::profile) fn serialize<S: Serializer>(
        d: &Option<Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    pub(in crate::profile) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Option::<DurRepr>::deserialize(d)?
            .map(DurRepr::into_duration)
            .transpose()
            .map_err(de::Error::custom)
    }
}

pub(super) fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u16>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        One(u16),
        Many(Vec<u16>),
    }
    Ok(match Repr::deserialize(d)? {
        Repr::One(s) => vec![s],
        Repr::Many(v) => v,
    })
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            One(u32),
            Range([u32; 2]),
        }
        Ok(
            match Repr::deserialize(d).map_err(|_| {
                de::Error::custom("expected a count (40) or an inclusive range ([20, 80])")
            })? {
                Repr::One(n) => Count::fixed(n),
                Repr::Range([min, max]) => Count::range(min, max),
            },
        )
    }
}

impl Serialize for Count {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.min == self.max {
            s.serialize_u32(self.min)
        } else {
            [self.min, self.max].serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for Delay {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Table {
            #[serde(default, with = "opt_dur")]
            fixed: Option<Duration>,
            #[serde(default)]
            uniform: Option<[DurRepr; 2]>,
            #[serde(default)]
            lognormal: Option<LogNormal>,
            #[serde(default, with = "opt_dur")]
            max: Option<Duration>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Plain(DurRepr),
            Table(Table),
        }
        let repr = Repr::deserialize(d).map_err(|_| {
            de::Error::custom(
                "expected a duration (\"250ms\") or a table { fixed, uniform, lognormal, max }",
            )
        })?;
        match repr {
            Repr::Plain(p) => p
                .into_duration()
                .map(Delay::fixed)
                .map_err(de::Error::custom),
            Repr::Table(t) => {
                let uniform = match t.uniform {
                    Some([lo, hi]) => Some((
                        lo.into_duration().map_err(de::Error::custom)?,
                        hi.into_duration().map_err(de::Error::custom)?,
                    )),
                    None => None,
                };
                Ok(Delay {
                    fixed: t.fixed.unwrap_or_default(),
                    uniform,
                    lognormal: t.lognormal,
                    max: t.max,
                })
            }
        }
    }
}

impl Serialize for Delay {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        if self.uniform.is_none() && self.lognormal.is_none() && self.max.is_none() {
            return s.serialize_str(&format_duration(self.fixed));
        }
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("fixed", &format_duration(self.fixed))?;
        if let Some((lo, hi)) = self.uniform {
            m.serialize_entry("uniform", &[format_duration(lo), format_duration(hi)])?;
        }
        if let Some(l) = &self.lognormal {
            m.serialize_entry("lognormal", l)?;
        }
        if let Some(max) = self.max {
            m.serialize_entry("max", &format_duration(max))?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use crate::Profile;

    #[test]
    fn a_profile_survives_a_round_trip_through_toml() {
        for name in Profile::builtin_names() {
            let p = Profile::builtin(name).unwrap();
            let text = toml::to_string(&p).unwrap();
            assert_eq!(Profile::from_toml(&text).unwrap(), p, "{name}:\n{text}");
        }
    }
}
