//! The models the gateway serves, priced for its budget and listed for `GET /v1/models`.
//!
//! One table per upstream is both the budget's price table and the model list, so the list
//! never offers a model the budget would refuse as unpriced. Each API lists only its own
//! upstream's models: the gateway does not translate between the formats, so a Claude model
//! is of no use to an OpenAI client and the other way round.

use std::sync::Arc;

use seawall::budget::{Price, PriceTable};
use seawall::core::BoxError;
use serde_json::{Value, json};

use super::errors::Dialect;

/// A model with its price in dollars per million tokens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Priced {
    pub(crate) id: &'static str,
    pub(crate) display_name: &'static str,
    pub(crate) input: f64,
    pub(crate) output: f64,
}

/// The OpenAI models served through `/v1/chat/completions`.
pub(crate) const OPENAI_MODELS: &[Priced] = &[
    Priced {
        id: "gpt-4o",
        display_name: "GPT-4o",
        input: 2.5,
        output: 10.0,
    },
    Priced {
        id: "gpt-4o-mini",
        display_name: "GPT-4o mini",
        input: 0.15,
        output: 0.6,
    },
];

/// The Claude models served through `/v1/messages`.
pub(crate) const ANTHROPIC_MODELS: &[Priced] = &[
    Priced {
        id: "claude-sonnet-4-5",
        display_name: "Claude Sonnet 4.5",
        input: 3.0,
        output: 15.0,
    },
    Priced {
        id: "claude-haiku-4-5",
        display_name: "Claude Haiku 4.5",
        input: 1.0,
        output: 5.0,
    },
];

/// The budget's price table for `models`.
pub(crate) fn price_table(models: &[Priced]) -> Result<PriceTable, BoxError> {
    let mut table = PriceTable::new();
    for m in models {
        table.insert(m.id, Price::per_million_f64(m.input, m.output)?);
    }
    Ok(table)
}

/// A model as listed: its id and the name shown to people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Model {
    pub(crate) id: String,
    pub(crate) display_name: String,
}

/// The priced models plus the fallback model (named by its id when it has no entry).
pub(crate) fn served(models: &[Priced], fallback: &str) -> Arc<[Model]> {
    let mut list: Vec<Model> = models
        .iter()
        .map(|m| Model {
            id: m.id.to_owned(),
            display_name: m.display_name.to_owned(),
        })
        .collect();
    if !list.iter().any(|m| m.id == fallback) {
        list.push(Model {
            id: fallback.to_owned(),
            display_name: fallback.to_owned(),
        });
    }
    list.into()
}

/// One model in `dialect`'s format. The release date is unknown to the gateway; Anthropic's
/// API documents the epoch for that case, and OpenAI's `created` takes it the same way.
pub(crate) fn model_json(model: &Model, dialect: Dialect) -> Value {
    match dialect {
        Dialect::OpenAi => json!({
            "id": model.id,
            "object": "model",
            "created": 0,
            "owned_by": "openai",
        }),
        Dialect::Anthropic => json!({
            "type": "model",
            "id": model.id,
            "display_name": model.display_name,
            "created_at": "1970-01-01T00:00:00Z",
        }),
    }
}

/// The whole list in `dialect`'s format: one page, since the list is short.
pub(crate) fn list_json(models: &[Model], dialect: Dialect) -> Value {
    let data: Vec<Value> = models.iter().map(|m| model_json(m, dialect)).collect();
    match dialect {
        Dialect::OpenAi => json!({ "object": "list", "data": data }),
        Dialect::Anthropic => json!({
            "data": data,
            "has_more": false,
            "first_id": models.first().map(|m| &m.id),
            "last_id": models.last().map(|m| &m.id),
        }),
    }
}
