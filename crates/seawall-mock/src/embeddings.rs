//! OpenAI's embeddings API (`POST .../embeddings`), minimal and deterministic: enough for a
//! client of the endpoint (a semantic cache's embedder) to be tested against the real server.
//!
//! Each input gets a unit vector drawn from a hash of its text: the same text always gets the
//! same vector, different texts get unrelated (nearly orthogonal) ones. The vectors carry no
//! meaning; a test that needs near-duplicates to be close uses an embedder of its own. The
//! server errors of the profile (bursts, outage windows) apply to these calls too, so a client
//! can be tested through retries and breakers; limits, quota and billing do not.

use bytes::Bytes;
use serde::Deserialize;

use crate::rng::{FNV_START, Rng, fnv1a};
use crate::wire::Failure;

/// The dimension when the request does not ask for one: `text-embedding-3-small`'s.
const DEFAULT_DIMENSIONS: usize = 1536;

/// The largest dimension served.
const MAX_DIMENSIONS: usize = 8192;

/// An embeddings request, parsed.
#[derive(Debug)]
pub(crate) struct EmbeddingsRequest {
    pub(crate) model: String,
    inputs: Vec<String>,
    dimensions: usize,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Input {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct Raw {
    model: Option<String>,
    input: Option<Input>,
    dimensions: Option<u64>,
}

/// Parses a request body. `Err` is the 400 to send.
pub(crate) fn parse(body: &[u8]) -> Result<EmbeddingsRequest, Failure> {
    let raw: Raw = serde_json::from_slice(body).map_err(|_| Failure::BadJson)?;
    let model = raw.model.ok_or(Failure::Missing("model"))?;
    let inputs = match raw.input.ok_or(Failure::Missing("input"))? {
        Input::One(s) => vec![s],
        Input::Many(v) if !v.is_empty() => v,
        Input::Many(_) => return Err(Failure::Missing("input")),
    };
    let dimensions = match raw.dimensions {
        None => DEFAULT_DIMENSIONS,
        Some(d) if (1..=MAX_DIMENSIONS as u64).contains(&d) => d as usize,
        Some(_) => return Err(Failure::Missing("dimensions")),
    };
    Ok(EmbeddingsRequest {
        model,
        inputs,
        dimensions,
    })
}

impl EmbeddingsRequest {
    /// The answer body: one unit vector per input, in OpenAI's list shape.
    pub(crate) fn render(&self) -> Bytes {
        let data: Vec<serde_json::Value> = self
            .inputs
            .iter()
            .enumerate()
            .map(|(i, text)| {
                serde_json::json!({
                    "object": "embedding",
                    "index": i,
                    "embedding": vector(text, self.dimensions),
                })
            })
            .collect();
        let tokens: usize = self.inputs.iter().map(|t| t.len().div_ceil(4)).sum();
        let body = serde_json::json!({
            "object": "list",
            "data": data,
            "model": self.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        });
        Bytes::from(body.to_string())
    }
}

/// A unit vector of `dimensions` drawn from the text's FNV-1a hash.
fn vector(text: &str, dimensions: usize) -> Vec<f32> {
    let mut rng = Rng::new(fnv1a(FNV_START, text.as_bytes()));
    let mut v: Vec<f32> = (0..dimensions)
        .map(|_| (rng.next_f64() * 2.0 - 1.0) as f32)
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn the_same_text_gets_the_same_unit_vector_and_another_text_a_distant_one() {
        let a = vector("What is the capital of France?", 256);
        assert_eq!(a, vector("What is the capital of France?", 256));
        assert!((dot(&a, &a) - 1.0).abs() < 1e-4);
        let b = vector("What is the capital of Spain?", 256);
        assert!(dot(&a, &b).abs() < 0.3, "{}", dot(&a, &b));
    }

    #[test]
    fn a_request_without_input_or_with_a_silly_dimension_is_refused() {
        assert!(matches!(
            parse(br#"{"model":"e"}"#),
            Err(Failure::Missing("input"))
        ));
        assert!(matches!(
            parse(br#"{"input":"x"}"#),
            Err(Failure::Missing("model"))
        ));
        assert!(parse(br#"{"model":"e","input":"x","dimensions":0}"#).is_err());
        let ok = parse(br#"{"model":"e","input":["a","b"],"dimensions":8}"#).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&ok.render()).unwrap();
        assert_eq!(v["data"].as_array().unwrap().len(), 2);
        assert_eq!(v["data"][1]["embedding"].as_array().unwrap().len(), 8);
    }
}
