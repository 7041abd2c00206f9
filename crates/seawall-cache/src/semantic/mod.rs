//! The semantic cache (opt-in): an answer is reused when a new prompt is close enough in
//! meaning to one whose answer is stored.
//!
//! # What must be identical, and what may be close
//!
//! Only the prompt's *text* may differ: the text of the messages (`content` strings and text
//! parts) and of the system prompt, after the [normalisation hook](crate::CacheBuilder::normalize).
//! Everything else must be identical, since it changes the answer as surely as the words do:
//! the model, the sampling parameters, the tools, the response format, the path and API
//! version, the tenant, and the conversation's shape (its roles, its number of messages and
//! parts, any image). So each request has a *context key*: the exact cache's key computed with
//! the text taken out (in a domain of its own), and the search looks only among the entries of
//! the request's context. Two questions to two models, or at two temperatures, never meet.
//!
//! # The flow
//!
//! The exact lookup comes first (a digest and a map lookup, no parsing beyond the key's). On
//! an exact miss, the call that would go upstream (the single-flight leader, or a call without
//! a flight) first embeds its prompt's text and searches the index. A hit is served like an
//! exact hit (the caller's wire format and stream mode, usage as cached, cost 0), marked
//! [`CacheStatus::Semantic`](crate::CacheStatus::Semantic) with its score (`x-seawall-cache:
//! semantic(0.973)`), and so are the identical calls waiting on the leader. A miss goes
//! upstream, and its answer, once complete and stored, is indexed under the prompt's vector.
//! A semantic hit creates no entry: an answer is only ever reused for prompts close to the
//! prompt it answered, never along a chain of near-duplicates drifting away from it.
//!
//! A failing embedder makes the call a plain miss (logged at `warn` under the target
//! `seawall::cache`); it never fails the call. The bypass rules are the exact cache's: a
//! bypassed request (`no-store`, `no-cache`, above the temperature threshold, time-sensitive,
//! an unkeyable body) neither searches nor is indexed, and neither does a prompt whose text
//! is longer than [the limit](crate::CacheBuilder::semantic_max_text_bytes) (16 KiB).
//!
//! # The threshold, and its floor
//!
//! A hit needs a cosine similarity of at least the threshold: 0.95 by default, never below
//! [0.80](crate::CacheBuilder::SEMANTIC_THRESHOLD_FLOOR). The floor is chosen, not measured
//! on one model (similarity scales differ between embedding models): 0.8 is already as
//! loose as the looser defaults of semantic caches in use (the LangChain wrapper of Redis
//! LangCache defaults to a normalised distance of 0.2), and below it general-purpose sentence
//! embeddings put questions that merely share a topic and a phrasing ("the capital of
//! France", "the capital of Spain") as close as true paraphrases. A threshold below it would
//! trade wrong answers for hit rate; the builder refuses it rather than let it be configured
//! by mistake. The default stays well above it, since a wrong answer costs more than a call;
//! tune upwards for a model whose paraphrases score higher.
//!
//! # The index
//!
//! In memory, exact (see [`SemanticIndex`] for why brute force is the right search at the
//! sizes a process holds, with the figures), bounded like the [`MemoryStore`](crate::MemoryStore)
//! (10,000 entries by default, the oldest going first), each entry expiring with the answer
//! it points to. It holds the answer's key, not the answer: the answer stays in the store,
//! once, and a semantic hit reads it there (an entry whose answer is gone is dropped).

mod embedder;
mod index;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use seawall_core::ConfigError;
use serde_json::Value;

pub use embedder::{EmbedError, EmbedFuture, Embedder, OpenAiEmbedder};
pub use index::SemanticIndex;

use crate::answer::Answer;
use crate::key::CacheKey;
use crate::layer::{CacheBuilder, CacheLayer};
use crate::service::Shared;

/// The log target of the semantic cache's warnings.
const TARGET: &str = "seawall::cache";

/// The semantic settings of a [`CacheBuilder`].
#[derive(Clone)]
pub(crate) struct Settings {
    embedder: Option<Arc<dyn Embedder>>,
    threshold: f32,
    max_entries: usize,
    max_text: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            embedder: None,
            threshold: CacheBuilder::DEFAULT_SEMANTIC_THRESHOLD,
            max_entries: crate::MemoryStore::DEFAULT_MAX_ENTRIES,
            max_text: CacheBuilder::DEFAULT_SEMANTIC_MAX_TEXT,
        }
    }
}

impl Settings {
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let t = self.threshold;
        if !(CacheBuilder::SEMANTIC_THRESHOLD_FLOOR..=1.0).contains(&t) {
            return Err(ConfigError::new(
                "semantic_threshold",
                format!(
                    "must be between {} and 1 (got {t}): below, prompts that only share a topic \
                     would be served each other's answers",
                    CacheBuilder::SEMANTIC_THRESHOLD_FLOOR
                ),
            ));
        }
        if self.max_text == 0 {
            return Err(ConfigError::new(
                "semantic_max_text_bytes",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    pub(crate) fn build(self) -> Option<Semantic> {
        Some(Semantic {
            embedder: self.embedder?,
            index: SemanticIndex::new(self.max_entries),
            threshold: self.threshold,
            max_text: self.max_text,
        })
    }
}

/// The semantic cache of one layer.
pub(crate) struct Semantic {
    embedder: Arc<dyn Embedder>,
    index: SemanticIndex,
    threshold: f32,
    max_text: usize,
}

/// Searches that cost more multiply-adds than this (256 entries of dimension 1,024) run on
/// tokio's blocking pool rather than on the task's worker thread, which they would hold for
/// more than the few tens of microseconds a task should run between two awaits.
const INLINE_WORK: usize = 256 * 1024;

impl Semantic {
    /// The best entry of `context` at least as close to `vector` as the threshold.
    async fn find(&self, context: &CacheKey, vector: &[f32]) -> Option<(CacheKey, f32)> {
        let threshold = self.threshold;
        if self.index.work(context) > INLINE_WORK {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let (index, context, vector) = (self.index.clone(), *context, vector.to_vec());
                let search = rt.spawn_blocking(move || index.search(&context, &vector, threshold));
                // A search that panicked (it does not) finds nothing.
                return search.await.ok().flatten();
            }
        }
        self.index.search(context, vector, threshold)
    }
}

impl CacheBuilder {
    /// The semantic cache's default threshold of cosine similarity.
    pub const DEFAULT_SEMANTIC_THRESHOLD: f32 = 0.95;

    /// The lowest threshold accepted (see [`semantic_threshold`](Self::semantic_threshold)).
    pub const SEMANTIC_THRESHOLD_FLOOR: f32 = 0.80;

    /// The default limit on the text embedded (see
    /// [`semantic_max_text_bytes`](Self::semantic_max_text_bytes)): 16 KiB.
    pub const DEFAULT_SEMANTIC_MAX_TEXT: usize = 16 * 1024;

    /// Turns the semantic cache on: on an exact miss, a prompt close enough in meaning to one
    /// whose answer is stored (same model, parameters, tools, tenant and conversation shape;
    /// see the [crate docs](crate#semantic-cache-opt-in)) is served that answer, marked
    /// `semantic(score)`. `embedder` maps the prompts' text to vectors
    /// ([`OpenAiEmbedder`] calls an embeddings endpoint through a seawall stack).
    pub fn semantic(mut self, embedder: impl Embedder) -> Self {
        self.semantic.embedder = Some(Arc::new(embedder));
        self
    }

    /// The least cosine similarity a semantic hit needs (default 0.95); [`build`](Self::build)
    /// refuses one below [`SEMANTIC_THRESHOLD_FLOOR`](Self::SEMANTIC_THRESHOLD_FLOOR) (0.80),
    /// above 1, or NaN.
    pub fn semantic_threshold(mut self, threshold: f32) -> Self {
        self.semantic.threshold = threshold;
        self
    }

    /// The most prompts the semantic index holds (default 10,000, the in-memory store's
    /// default bound); the oldest go first.
    pub fn semantic_max_entries(mut self, entries: usize) -> Self {
        self.semantic.max_entries = entries;
        self
    }

    /// Prompts whose text is longer than this (in bytes; default 16 KiB, about 4,000 tokens,
    /// at least 1) skip the semantic cache (the exact cache still serves them). Embedding
    /// models take a few thousand tokens at most, and a long prompt (a document pasted in, a
    /// retrieval context) is one whose details matter: close in meaning is not close enough.
    pub fn semantic_max_text_bytes(mut self, bytes: usize) -> Self {
        self.semantic.max_text = bytes;
        self
    }
}

impl CacheLayer {
    /// The semantic index, when the semantic cache is on.
    pub fn semantic_index(&self) -> Option<&SemanticIndex> {
        self.shared().semantic.as_ref().map(|s| &s.index)
    }
}

/// What a call needs to index its answer under its prompt's vector once it is stored.
pub(crate) struct Ticket {
    context: CacheKey,
    vector: Vec<f32>,
}

impl Ticket {
    /// Indexes the answer just stored under `key`.
    pub(crate) fn index(self, shared: &Shared, key: &CacheKey) {
        if let Some(semantic) = &shared.semantic {
            if !semantic
                .index
                .insert(&self.context, key, &self.vector, shared.ttl)
            {
                tracing::debug!(
                    target: TARGET,
                    dimension = self.vector.len(),
                    "prompt not indexed: its vector's dimension differs from its context's"
                );
            }
        }
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("context", &self.context)
            .field("dimension", &self.vector.len())
            .finish()
    }
}

/// How a search ended.
pub(crate) enum Searched {
    /// A stored answer to a prompt close enough, with its score.
    Found { answer: Arc<Answer>, score: f32 },
    /// Nothing close enough: the call goes upstream, and its answer is indexed with the
    /// ticket (none when the prompt could not be embedded).
    NotFound(Option<Ticket>),
}

/// The future of a search.
pub(crate) type SearchFuture = Pin<Box<dyn Future<Output = Searched> + Send>>;

/// An entry whose answer is gone from the store is dropped and the search made again, at
/// most this many times.
const MAX_STALE: usize = 3;

/// The search for `req` (which missed the exact cache), or `None` when the semantic cache is
/// off or the request has no text to embed.
pub(crate) fn search(shared: &Arc<Shared>, req: &Request<Bytes>) -> Option<SearchFuture> {
    let max_text = shared.semantic.as_ref()?.max_text;
    let heads = crate::service::Heads::of(req.headers());
    let partition = shared.partition.of(req, &heads);
    let mut text = String::new();
    let context = shared
        .keys
        .context_key(req, partition.as_deref(), |tree| text = take_text(tree))
        .ok()?;
    if text.is_empty() || text.len() > max_text {
        return None;
    }
    let shared = shared.clone();
    Some(Box::pin(async move {
        let Some(semantic) = &shared.semantic else {
            return Searched::NotFound(None);
        };
        let vector = match semantic.embedder.embed(&text).await {
            Ok(v) if index::normalised(&v).is_some() => v,
            Ok(_) => {
                tracing::warn!(
                    target: TARGET,
                    "the embedder gave an empty, zero or non-finite vector; a plain miss"
                );
                return Searched::NotFound(None);
            }
            Err(e) => {
                tracing::warn!(target: TARGET, error = %e, "embedding failed; a plain miss");
                return Searched::NotFound(None);
            }
        };
        for _ in 0..MAX_STALE {
            let Some((key, score)) = semantic.find(&context, &vector).await else {
                break;
            };
            match shared.store.get(&key).await {
                Ok(Some(answer)) => return Searched::Found { answer, score },
                Ok(None) => semantic.index.remove(&context, &key),
                Err(e) => {
                    tracing::debug!(target: TARGET, error = %e, "cache lookup failed; a miss");
                    break;
                }
            }
        }
        Searched::NotFound(Some(Ticket { context, vector }))
    }))
}

/// Takes the prompt's text out of a request body: the system prompt's and each message's
/// `content` (a string, or the `text` of its text parts), in order, one per line. Each string
/// taken is left empty in place, so the body's shape stays in the context key.
fn take_text(tree: &mut Value) -> String {
    let mut out = String::new();
    let Some(body) = tree.as_object_mut() else {
        return out;
    };
    if let Some(system) = body.get_mut("system") {
        take_content(system, &mut out);
    }
    if let Some(Value::Array(messages)) = body.get_mut("messages") {
        for message in messages {
            if let Some(content) = message.get_mut("content") {
                take_content(content, &mut out);
            }
        }
    }
    out
}

fn take_content(content: &mut Value, out: &mut String) {
    let mut take = |s: &mut String| {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&std::mem::take(s));
    };
    match content {
        Value::String(s) => take(s),
        Value::Array(parts) => {
            for part in parts {
                match part {
                    Value::String(s) => take(s),
                    Value::Object(p) if p.get("type").and_then(Value::as_str) == Some("text") => {
                        if let Some(Value::String(s)) = p.get_mut("text") {
                            take(s);
                        }
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_text_of_system_and_messages_is_taken_and_the_shape_kept() {
        let mut body = json!({
            "model": "m",
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "user", "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}
                ]}
            ],
            "tools": [{"type": "function", "function": {"name": "f", "description": "text"}}]
        });
        assert_eq!(take_text(&mut body), "Be brief.\nHi\nWhat is this?");
        assert_eq!(body["messages"][1]["content"][0]["text"], "");
        assert_eq!(body["messages"][0]["role"], "user");
        // What is not the prompt's text stays, so it stays in the context key.
        assert_eq!(
            body["messages"][1]["content"][1]["image_url"]["url"],
            "https://x/cat.png"
        );
        assert_eq!(body["tools"][0]["function"]["description"], "text");
    }

    #[test]
    fn the_threshold_must_be_between_the_floor_and_one() {
        let check = |t: f32| {
            Settings {
                threshold: t,
                ..Settings::default()
            }
            .check()
        };
        assert!(check(0.95).is_ok() && check(0.80).is_ok() && check(1.0).is_ok());
        for t in [0.79, 1.01, f32::NAN, -1.0, f32::INFINITY] {
            let e = check(t).unwrap_err();
            assert!(e.to_string().contains("semantic_threshold"), "{e}");
        }
    }
}
