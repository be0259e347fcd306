//! Human units used in scenario files and fault profiles: durations (`"500ms"`, `"2m"`) and
//! ratios (`"40%"` or `0.4`).
//!
//! Range checks happen inside `Deserialize`, so a bad value is reported by the TOML parser with its
//! exact line and column. Nothing downstream re-validates.

use std::fmt;
use std::time::Duration;

use schemars::JsonSchema;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A non-negative duration written as a human string: `"250ms"`, `"1.5s"`, `"2m"`, `"1h 30m"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub const ZERO: HumanDuration = HumanDuration(Duration::ZERO);

    pub fn from_millis(ms: u64) -> Self {
        HumanDuration(Duration::from_millis(ms))
    }

    pub fn as_millis_u64(&self) -> u64 {
        self.0.as_millis() as u64
    }
}

impl From<HumanDuration> for Duration {
    fn from(d: HumanDuration) -> Duration {
        d.0
    }
}

/// The longest duration any setting takes: a week. Anything longer is a typo, and would overflow
/// the clock arithmetic of whoever waits for it. Settings with a tighter meaning (a provider's
/// latency, a callback delay: a day) say so where they are validated.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Parses `"500ms"`, `"2s"`, `"1.5s"`, `"2m"`, `"1h 30m"`; rejects negatives, garbage and anything
/// longer than [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = parse_unbounded(s)?;
    if d > MAX_DURATION {
        return Err(format!(
            "duration `{}` is too long: at most 7 days",
            s.trim()
        ));
    }
    Ok(d)
}

fn parse_unbounded(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!(
            "duration `{s}` is negative; durations must be >= 0"
        ));
    }
    // humantime does not take fractions ("1.5s"); handle the common single-unit fractional form.
    if let Some((num, unit)) = split_fraction(t) {
        let scale = match unit {
            "ms" => 1e-3,
            "s" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            _ => return Err(format!("invalid duration `{s}`: unknown unit `{unit}`")),
        };
        return Duration::try_from_secs_f64(num * scale)
            .map_err(|_| format!("duration `{}` is too long: at most 7 days", s.trim()));
    }
    humantime::parse_duration(t).map_err(|e| {
        format!("invalid duration `{s}` ({e}); write e.g. \"500ms\", \"2s\", \"1m 30s\"")
    })
}

fn split_fraction(t: &str) -> Option<(f64, &str)> {
    let idx = t.find(|c: char| c.is_ascii_alphabetic())?;
    let (num, unit) = t.split_at(idx);
    if !num.contains('.') {
        return None;
    }
    let n: f64 = num.trim().parse().ok()?;
    Some((n, unit.trim()))
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration such as \"500ms\", \"2s\" or \"1m\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                parse_duration(v).map(HumanDuration).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<HumanDuration, E> {
                Err(E::custom(format!(
                    "bare number {v} is ambiguous as a duration; write \"{v}ms\" or \"{v}s\""
                )))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<HumanDuration, E> {
                self.visit_i64(v as i64)
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(self.0).to_string())
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl JsonSchema for HumanDuration {
    fn schema_name() -> String {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        let mut s = schemars::schema::SchemaObject {
            instance_type: Some(schemars::schema::InstanceType::String.into()),
            ..Default::default()
        };
        s.string().pattern =
            Some(r"^\s*[0-9]+(\.[0-9]+)?\s*[a-z]+(\s*[0-9]+\s*[a-z]+)*\s*$".into());
        s.metadata().description =
            Some("A duration such as \"500ms\", \"2s\", \"1.5s\", \"2m\" or \"1m 30s\".".into());
        s.into()
    }
}

/// A share in `0..=1`, written `0.4` or `"40%"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct Ratio(pub f64);

impl Ratio {
    pub const ZERO: Ratio = Ratio(0.0);

    pub fn new(v: f64) -> Result<Ratio, String> {
        if !(0.0..=1.0).contains(&v) || v.is_nan() {
            return Err(format!(
                "{} is out of range: a share must be between 0 and 1 (0% and 100%)",
                pretty_share(v)
            ));
        }
        Ok(Ratio(v))
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

fn pretty_share(v: f64) -> String {
    format!("{v} ({}%)", (v * 1000.0).round() / 10.0)
}

/// Parses `"40%"`, `"2.5%"` or `"0.4"` into a [`Ratio`].
pub fn parse_ratio(s: &str) -> Result<Ratio, String> {
    let t = s.trim();
    let v = if let Some(p) = t.strip_suffix('%') {
        p.trim()
            .parse::<f64>()
            .map_err(|_| format!("invalid percentage `{s}`; write e.g. \"40%\" or 0.4"))?
            / 100.0
    } else {
        t.parse::<f64>()
            .map_err(|_| format!("invalid share `{s}`; write e.g. \"40%\" or 0.4"))?
    };
    Ratio::new(v)
}

impl<'de> Deserialize<'de> for Ratio {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Ratio;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a share such as 0.4 or \"40%\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Ratio, E> {
                parse_ratio(v).map_err(E::custom)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Ratio, E> {
                Ratio::new(v).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Ratio, E> {
                Ratio::new(v as f64).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Ratio, E> {
                Ratio::new(v as f64).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for Ratio {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0)
    }
}

impl JsonSchema for Ratio {
    fn schema_name() -> String {
        "Ratio".into()
    }
    fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        let num = schemars::schema::SchemaObject {
            instance_type: Some(schemars::schema::InstanceType::Number.into()),
            number: Some(Box::new(schemars::schema::NumberValidation {
                minimum: Some(0.0),
                maximum: Some(1.0),
                ..Default::default()
            })),
            ..Default::default()
        };
        let mut pct = schemars::schema::SchemaObject {
            instance_type: Some(schemars::schema::InstanceType::String.into()),
            ..Default::default()
        };
        pct.string().pattern = Some(r"^\s*(100(\.0+)?|[0-9]{1,2}(\.[0-9]+)?)\s*%\s*$".into());
        let mut s = schemars::schema::SchemaObject::default();
        s.subschemas().any_of = Some(vec![num.into(), pct.into()]);
        s.metadata().description =
            Some("A share: a number in 0..=1 or a percentage \"40%\".".into());
        s.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let cases: &[(&str, Result<u64, ()>)] = &[
            ("500ms", Ok(500)),
            ("2s", Ok(2000)),
            ("1.5s", Ok(1500)),
            ("2m", Ok(120_000)),
            ("1m 30s", Ok(90_000)),
            ("0s", Ok(0)),
            ("-1s", Err(())),
            ("fast", Err(())),
            ("10", Err(())),
            ("7d", Ok(7 * 24 * 3600 * 1000)),
            ("8d", Err(())),
            ("300000000000y", Err(())),
            ("100000000000000000000.5s", Err(())),
            ("1e300.5s", Err(())),
        ];
        for (input, want) in cases {
            let got = parse_duration(input)
                .map(|d| d.as_millis() as u64)
                .map_err(|_| ());
            assert_eq!(&got, want, "input {input:?}");
        }
    }

    #[test]
    fn ratios() {
        let cases: &[(&str, Option<f64>)] = &[
            ("40%", Some(0.4)),
            ("0.4", Some(0.4)),
            ("100%", Some(1.0)),
            ("0%", Some(0.0)),
            ("140%", None),
            ("-5%", None),
            ("1.2", None),
            ("lots", None),
        ];
        for (input, want) in cases {
            let got = parse_ratio(input).ok().map(|r| (r.0 * 1e6).round() / 1e6);
            assert_eq!(&got, want, "input {input:?}");
        }
    }
}
