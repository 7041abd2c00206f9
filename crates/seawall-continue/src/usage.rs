//! Summing the usage of the attempts that made one answer, in the wire's own fields, so the
//! caller's final usage (in the body) and the call record's are the whole answer's.

use seawall_core::{ReportedUsage, Usage};
use serde_json::{Map, Value};

use crate::request::Wire;

/// Adds `b` into `a`, field by field: numbers are added, objects (token details) recursed
/// into, fields only `b` has are copied.
pub(crate) fn add(a: &mut Value, b: &Value) {
    let Value::Object(bm) = b else { return };
    if !a.is_object() {
        *a = Value::Object(Map::new());
    }
    let Value::Object(am) = a else { return };
    for (k, vb) in bm {
        match am.get_mut(k) {
            Some(va) if va.is_u64() && vb.is_u64() => {
                let sum = va
                    .as_u64()
                    .unwrap_or(0)
                    .saturating_add(vb.as_u64().unwrap_or(0));
                *va = Value::from(sum);
            }
            Some(va) if va.is_object() && vb.is_object() => add(va, vb),
            Some(_) => {}
            None => {
                am.insert(k.clone(), vb.clone());
            }
        }
    }
}

/// Overlays `newer` on `older`: Anthropic reports usage in `message_start` and again,
/// cumulative, in `message_delta`; the later value of a field replaces the earlier one.
pub(crate) fn overlay(older: &mut Option<Value>, newer: &Value) {
    let Value::Object(nm) = newer else { return };
    let o = older.get_or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(om) = o {
        for (k, v) in nm {
            if !v.is_null() {
                om.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The usage of an attempt that was cut before it said: its prompt (estimated, unless the
/// attempt reported it) and one output token per content delta it delivered.
pub(crate) fn estimate(wire: Wire, reported: Option<Value>, input: u64, deltas: u64) -> Value {
    let mut u = match reported {
        Some(v @ Value::Object(_)) => v,
        _ => Value::Object(Map::new()),
    };
    let Value::Object(m) = &mut u else {
        return u;
    };
    match wire {
        Wire::OpenAi => {
            let prompt = m
                .get("prompt_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(input);
            m.insert("prompt_tokens".into(), Value::from(prompt));
            m.insert("completion_tokens".into(), Value::from(deltas));
            m.insert(
                "total_tokens".into(),
                Value::from(prompt.saturating_add(deltas)),
            );
        }
        Wire::Anthropic => {
            m.entry("input_tokens")
                .or_insert_with(|| Value::from(input));
            let out = m.get("output_tokens").and_then(Value::as_u64).unwrap_or(0);
            m.insert("output_tokens".into(), Value::from(out.max(deltas)));
        }
    }
    u
}

/// The summed wire usage as seawall's [`Usage`], read as the classifier reads it (core's
/// [`ReportedUsage`]); `None` without an output count.
pub(crate) fn to_core(v: &Value) -> Option<Usage> {
    let reported = ReportedUsage::from_json(v)?;
    reported.output_tokens?;
    Some(reported.to_usage())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn usages_add_field_by_field_with_their_details() {
        let mut a = json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                           "prompt_tokens_details": {"cached_tokens": 2}});
        add(
            &mut a,
            &json!({"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27,
                            "prompt_tokens_details": {"cached_tokens": 1}, "extra": 1}),
        );
        assert_eq!(
            a,
            json!({"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42,
                   "prompt_tokens_details": {"cached_tokens": 3}, "extra": 1})
        );
        let core = to_core(&a).unwrap();
        assert_eq!(
            (
                core.input_tokens,
                core.output_tokens,
                core.cached_input_tokens
            ),
            (30, 12, 3)
        );
    }

    #[test]
    fn anthropic_cache_reads_and_writes_add_up_across_attempts_into_the_core_usage() {
        let mut a = json!({"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100,
                           "cache_creation_input_tokens": 50,
                           "cache_creation": {"ephemeral_5m_input_tokens": 20, "ephemeral_1h_input_tokens": 30}});
        add(
            &mut a,
            &json!({"input_tokens": 12, "output_tokens": 7, "cache_read_input_tokens": 150,
                    "cache_creation_input_tokens": 0,
                    "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}}),
        );
        let core = to_core(&a).unwrap();
        assert_eq!(
            (
                core.input_tokens,
                core.output_tokens,
                core.cached_input_tokens,
                core.cache_write_input_tokens,
                core.cache_write_1h_input_tokens,
            ),
            (22 + 250 + 50, 12, 250, 50, 30)
        );
    }

    #[test]
    fn a_cut_attempt_counts_its_deltas_and_its_prompt() {
        let e = estimate(Wire::OpenAi, None, 40, 5);
        assert_eq!(
            e,
            json!({"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45})
        );
        let e = estimate(
            Wire::Anthropic,
            Some(json!({"input_tokens": 12, "output_tokens": 1})),
            40,
            5,
        );
        assert_eq!(e, json!({"input_tokens": 12, "output_tokens": 5}));
    }

    #[test]
    fn hostile_usage_values_are_ignored_not_trusted() {
        let mut a = json!({"output_tokens": u64::MAX});
        add(&mut a, &json!({"output_tokens": 3, "input_tokens": "many"}));
        assert_eq!(a["output_tokens"], u64::MAX);
        add(&mut a, &json!([1, 2]));
        assert_eq!(to_core(&json!({"input_tokens": 1})), None);
    }
}
