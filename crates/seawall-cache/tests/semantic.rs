//! The semantic cache end to end, on paused time, with a deterministic test embedder (a bag of
//! content words): near-duplicates hit, other questions, models, parameters and tenants miss,
//! the bypass rules hold, a failing embedder is a plain miss, entries expire and are bounded,
//! and no answer is ever served below the threshold. `OpenAiEmbedder` is tested against the
//! chaos upstream over loopback.

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body_util::Full;
use seawall_cache::{
    CacheBuilder, CacheLayer, CacheStatus, EmbedError, EmbedFuture, Embedder, MemoryStore,
    OpenAiEmbedder,
};
use seawall_core::{CallContext, FailureClass, LlmError};
use serde_json::{Value, json};
use tower::{Layer, Service, ServiceExt};

// ---- the test embedder ---------------------------------------------------------------------

const DIMENSION: usize = 512;

/// Words that carry no meaning of their own here.
const STOP: [&str; 12] = [
    "what", "whats", "is", "the", "of", "a", "an", "please", "tell", "me", "s", "about",
];

/// A bag of content words, hashed into 512 buckets: "What is the capital of France?" and
/// "what's the capital of France" get the same vector, "... of Spain?" a distant one.
#[derive(Clone, Default)]
struct Words {
    calls: Arc<AtomicUsize>,
    /// Fail every call.
    failing: bool,
    /// Wait this long (virtual time) before answering.
    delay: Duration,
    /// Pad the vectors with zeros to this length (a large index at little cost).
    pad: usize,
}

fn words_vector(text: &str) -> Vec<f32> {
    let mut v = vec![0.0f32; DIMENSION];
    let lower = text.to_lowercase().replace('\'', "");
    for word in lower.split(|c: char| !c.is_alphanumeric()) {
        if word.is_empty() || STOP.contains(&word) {
            continue;
        }
        let h = word.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        v[(h % DIMENSION as u64) as usize] += 1.0;
    }
    v
}

impl Embedder for Words {
    fn embed(&self, text: &str) -> EmbedFuture {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut v = words_vector(text);
        v.resize(v.len().max(self.pad), 0.0);
        let (failing, delay) = (self.failing, self.delay);
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if failing {
                return Err(EmbedError::Call(LlmError::new(
                    FailureClass::Overloaded,
                    "embeddings overloaded",
                )));
            }
            Ok(v)
        })
    }
}

impl Words {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let n = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn semantic(embedder: &Words) -> CacheBuilder {
    CacheLayer::builder(MemoryStore::new()).semantic(embedder.clone())
}

const SYSTEM: &str = "Answer in one word.";

fn ask(text: &str) -> Value {
    json!({"model": "gpt-4o-mini", "temperature": 0,
           "messages": [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": text}]})
}

const FRANCE: &str = "What is the capital of France?";
const FRANCE_AGAIN: &str = "what's the capital of France";

/// The score in an `x-seawall-cache: semantic(0.973)` header.
fn score(header: &str) -> Option<f32> {
    header
        .strip_prefix("semantic(")?
        .strip_suffix(')')?
        .parse()
        .ok()
}

// ---- what hits and what misses -----------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_near_duplicate_is_served_the_stored_answer_marked_semantic() {
    let (up, words) = (Up::plain(), Words::default());
    let layer = semantic(&words).build().unwrap();
    let svc = stack(layer.clone(), &up);
    let (status, _, original) = fetch(&svc, openai(&ask(FRANCE))).await;
    assert_eq!(status, "miss");
    assert_eq!(
        layer.semantic_index().unwrap().len(),
        1,
        "the answer is indexed"
    );

    // The near-duplicate, streamed: the same answer, replayed as SSE, without an upstream call.
    let mut body = ask(FRANCE_AGAIN);
    body["stream"] = json!(true);
    let context = Arc::new(CallContext::default());
    let mut req = openai(&body);
    req.extensions_mut().insert(context.clone());
    let resp = send(&svc, req).await.unwrap();
    let marked = *resp.extensions().get::<CacheStatus>().unwrap();
    assert!(matches!(marked, CacheStatus::Semantic(s) if s >= 0.95));
    let (status, ctype, replay) = read(resp).await;
    // The header says what the call record says (`semantic(0.973)`).
    assert_eq!(status, marked.to_string());
    assert_eq!(up.calls(), 1, "a semantic hit makes no upstream call");
    let s = score(&status).unwrap_or_else(|| panic!("a semantic status: {status}"));
    assert!((0.95..=1.0).contains(&s), "{s}");
    assert_eq!(ctype, "text/event-stream");
    assert_eq!(answer_text(&replay), answer_text(&original));
    // The call record says so, with nothing spent.
    let facts = context.update(|f| f.clone());
    assert!(matches!(facts.cache, Some(CacheStatus::Semantic(s)) if s >= 0.95));
    assert_eq!(facts.cost_usd, Some(0.0));
    // A semantic hit indexes nothing: answers never drift along chains of near-duplicates.
    assert_eq!(layer.semantic_index().unwrap().len(), 1);
    assert_eq!(words.calls(), 2);

    // The exact request is still an exact hit, without embedding.
    assert_eq!(fetch(&svc, openai(&ask(FRANCE))).await.0, "hit");
    assert_eq!(words.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_call_record_says_semantic_with_the_score_the_header_says() {
    let (observe, records) = recorded();
    let (up, words) = (Up::plain(), Words::default());
    let svc = observe.layer(stack(semantic(&words).build().unwrap(), &up));
    let mut headers = Vec::new();
    for text in [FRANCE, FRANCE_AGAIN] {
        let resp = svc.clone().oneshot(openai(&ask(text))).await.unwrap();
        headers.push(
            resp.headers()[seawall_cache::CACHE_HEADER]
                .to_str()
                .unwrap()
                .to_owned(),
        );
        http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap();
    }
    let records = records.lock().unwrap();
    let [miss, hit] = &records[..] else {
        panic!("two records: {records:?}");
    };
    assert_eq!(miss.cache, Some(CacheStatus::Miss));
    assert!(matches!(hit.cache, Some(CacheStatus::Semantic(s)) if s >= 0.95));
    assert_eq!((hit.attempts, hit.cost_usd), (0, Some(0.0)));
    assert!(
        hit.to_json()
            .contains(&format!(r#""cache":"{}""#, headers[1])),
        "{} vs {}",
        hit.to_json(),
        headers[1]
    );
}

#[tokio::test(start_paused = true)]
async fn near_duplicates_hit_without_single_flight_and_in_anthropic_messages_too() {
    let (up, words) = (Up::plain(), Words::default());
    let svc = stack(semantic(&words).single_flight(false).build().unwrap(), &up);
    fetch(&svc, openai(&ask(FRANCE))).await;
    assert!(
        fetch(&svc, openai(&ask(FRANCE_AGAIN)))
            .await
            .0
            .starts_with("semantic(")
    );

    let anthropic_ask = |text: &str| {
        json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "system": SYSTEM,
               "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]})
    };
    let (_, _, original) = fetch(&svc, anthropic(&anthropic_ask(FRANCE))).await;
    let mut again = anthropic_ask(FRANCE_AGAIN);
    again["stream"] = json!(true);
    let (status, _, replay) = fetch(&svc, anthropic(&again)).await;
    assert!(status.starts_with("semantic("), "{status}");
    assert_eq!(answer_text(&replay), answer_text(&original));
    // An OpenAI request never meets an Anthropic answer (another path, another context).
    assert_eq!(up.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_different_question_misses() {
    let (up, words) = (Up::plain(), Words::default());
    let svc = stack(semantic(&words).build().unwrap(), &up);
    fetch(&svc, openai(&ask(FRANCE))).await;
    for other in [
        "What is the capital of Spain?",
        "What is the population of France?",
    ] {
        assert_eq!(fetch(&svc, openai(&ask(other))).await.0, "miss", "{other}");
    }
    assert_eq!(up.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn another_model_parameters_tenant_or_conversation_shape_misses() {
    let (up, words) = (Up::plain(), Words::default());
    let svc = stack(semantic(&words).max_temperature(2.0).build().unwrap(), &up);
    fetch(&svc, openai(&ask(FRANCE))).await;
    let mut model = ask(FRANCE_AGAIN);
    model["model"] = json!("gpt-4o");
    let mut temperature = ask(FRANCE_AGAIN);
    temperature["temperature"] = json!(0.7);
    let mut tools = ask(FRANCE_AGAIN);
    tools["response_format"] = json!({"type": "json_object"});
    let mut turns = ask(FRANCE_AGAIN);
    turns["messages"]
        .as_array_mut()
        .unwrap()
        .insert(1, json!({"role": "user", "content": "Hello"}));
    for (what, body) in [
        ("model", model),
        ("temperature", temperature),
        ("response format", tools),
        ("one more message", turns),
    ] {
        assert_eq!(fetch(&svc, openai(&body)).await.0, "miss", "{what}");
    }
    let mut tenant = openai(&ask(FRANCE_AGAIN));
    tenant
        .headers_mut()
        .insert("authorization", "Bearer sk-other".parse().unwrap());
    assert_eq!(fetch(&svc, tenant).await.0, "miss", "another tenant");
    assert_eq!(up.calls(), 6);
    // The same question in the original context still hits.
    assert!(
        fetch(&svc, openai(&ask(FRANCE_AGAIN)))
            .await
            .0
            .starts_with("semantic(")
    );
}

#[tokio::test(start_paused = true)]
async fn time_sensitive_prompts_always_miss_and_are_never_indexed() {
    let (up, words) = (Up::plain(), Words::default());
    let layer = semantic(&words)
        .bypass_when(|req: &Request<Bytes>| {
            std::str::from_utf8(req.body()).is_ok_and(|b| b.contains("today"))
        })
        .build()
        .unwrap();
    let svc = stack(layer.clone(), &up);
    for text in ["What is the weather today?", "what's the weather today"] {
        assert_eq!(fetch(&svc, openai(&ask(text))).await.0, "bypass");
    }
    assert_eq!(up.calls(), 2);
    assert_eq!(words.calls(), 0, "a bypassed request is not embedded");
    assert!(layer.semantic_index().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn no_store_and_no_cache_neither_search_nor_index() {
    let (up, words) = (Up::plain(), Words::default());
    let layer = semantic(&words).build().unwrap();
    let svc = stack(layer.clone(), &up);
    let mut no_store = openai(&ask(FRANCE));
    no_store
        .headers_mut()
        .insert("cache-control", "no-store".parse().unwrap());
    assert_eq!(fetch(&svc, no_store).await.0, "bypass");
    assert!(layer.semantic_index().unwrap().is_empty());

    fetch(&svc, openai(&ask(FRANCE))).await;
    let mut no_cache = openai(&ask(FRANCE_AGAIN));
    no_cache
        .headers_mut()
        .insert("cache-control", "no-cache".parse().unwrap());
    assert_eq!(fetch(&svc, no_cache).await.0, "bypass");
    assert_eq!(up.calls(), 3);
    assert_eq!(words.calls(), 1, "only the plain miss was embedded");
    assert_eq!(layer.semantic_index().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unkeyable_body_is_neither_embedded_nor_indexed() {
    let (up, words) = (Up::plain(), Words::default());
    let layer = semantic(&words).max_body_bytes(64).build().unwrap();
    let svc = stack(layer.clone(), &up);
    assert_eq!(fetch(&svc, openai(&ask(FRANCE))).await.0, "bypass");
    assert_eq!(words.calls(), 0);
    assert!(layer.semantic_index().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_prompt_longer_than_the_text_limit_skips_the_semantic_cache_only() {
    let (up, words) = (Up::plain(), Words::default());
    let layer = semantic(&words)
        .semantic_max_text_bytes(100)
        .build()
        .unwrap();
    let svc = stack(layer.clone(), &up);
    let long = format!("{FRANCE} {}", "Context. ".repeat(20));
    assert_eq!(fetch(&svc, openai(&ask(&long))).await.0, "miss");
    assert_eq!(words.calls(), 0, "not embedded");
    assert!(layer.semantic_index().unwrap().is_empty());
    assert_eq!(fetch(&svc, openai(&ask(&long))).await.0, "hit");
    // A short one is still searched and indexed.
    fetch(&svc, openai(&ask(FRANCE))).await;
    assert_eq!(
        (words.calls(), layer.semantic_index().unwrap().len()),
        (1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_failing_embedder_is_a_plain_miss_and_the_call_is_answered() {
    let log = seawall_test_support::global_log();
    let up = Up::plain();
    let words = Words {
        failing: true,
        ..Words::default()
    };
    let layer = semantic(&words).build().unwrap();
    let svc = stack(layer.clone(), &up);
    for text in [FRANCE, FRANCE_AGAIN] {
        let (status, _, body) = fetch(&svc, openai(&ask(text))).await;
        assert_eq!(status, "miss");
        assert!(!answer_text(&body).is_empty(), "the call is answered");
    }
    assert_eq!((up.calls(), words.calls()), (2, 2));
    assert!(layer.semantic_index().unwrap().is_empty());
    // The exact cache still works.
    assert_eq!(fetch(&svc, openai(&ask(FRANCE))).await.0, "hit");
    let text = log.text();
    assert!(
        text.contains("seawall::cache") && text.contains("embedding failed"),
        "{text}"
    );
}

// ---- single flight -------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn identical_calls_waiting_on_a_semantic_leader_are_served_its_answer_and_score() {
    let up = Up::plain();
    let words = Words {
        delay: Duration::from_millis(50),
        ..Words::default()
    };
    let svc = stack(semantic(&words).build().unwrap(), &up);
    fetch(&svc, openai(&ask(FRANCE))).await;
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { fetch(&svc, openai(&ask(FRANCE_AGAIN))).await })
        })
        .collect();
    let mut scores = Vec::new();
    for c in calls {
        let (status, _, _) = c.await.unwrap();
        scores.push(score(&status).unwrap_or_else(|| panic!("semantic, not {status}")));
    }
    // The very same score: the leader's, handed over.
    assert!(scores.windows(2).all(|w| w[0].to_bits() == w[1].to_bits()));
    assert_eq!(up.calls(), 1);
    assert_eq!(words.calls(), 2, "the leader embeds once for all");
}

#[tokio::test(start_paused = true)]
async fn a_near_duplicate_hits_in_a_context_too_large_to_search_inline() {
    // 40 entries of dimension 8192: more work than a search does on the task's thread.
    let up = Up::plain();
    let words = Words {
        pad: 8192,
        ..Words::default()
    };
    let layer = semantic(&words).build().unwrap();
    let svc = stack(layer.clone(), &up);
    for i in 0..39 {
        fetch(
            &svc,
            openai(&ask(&format!("Tell me about harbor number {i}"))),
        )
        .await;
    }
    fetch(&svc, openai(&ask(FRANCE))).await;
    assert_eq!(layer.semantic_index().unwrap().len(), 40);
    let (status, _, _) = fetch(&svc, openai(&ask(FRANCE_AGAIN))).await;
    assert!(status.starts_with("semantic("), "{status}");
    assert_eq!(
        fetch(&svc, openai(&ask("What is the capital of Peru?")))
            .await
            .0,
        "miss"
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_dropped_while_embedding_hands_the_search_to_a_waiter() {
    let up = Up::plain();
    let words = Words {
        delay: Duration::from_millis(50),
        ..Words::default()
    };
    let svc = stack(semantic(&words).build().unwrap(), &up);
    fetch(&svc, openai(&ask(FRANCE))).await;
    let leader = {
        let svc = svc.clone();
        tokio::spawn(async move { fetch(&svc, openai(&ask(FRANCE_AGAIN))).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waiter = {
        let svc = svc.clone();
        tokio::spawn(async move { fetch(&svc, openai(&ask(FRANCE_AGAIN))).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    leader.abort();
    let (status, _, _) = waiter.await.unwrap();
    assert!(status.starts_with("semantic("), "{status}");
    assert_eq!(up.calls(), 1);
    assert_eq!(
        words.calls(),
        3,
        "the waiter embedded again after the leader went away"
    );
}

// ---- expiry, bound, threshold --------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn index_entries_expire_with_their_answers() {
    let (up, words) = (Up::plain(), Words::default());
    let svc = stack(
        semantic(&words)
            .ttl(Duration::from_secs(60))
            .build()
            .unwrap(),
        &up,
    );
    fetch(&svc, openai(&ask(FRANCE))).await;
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(
        fetch(&svc, openai(&ask(FRANCE_AGAIN)))
            .await
            .0
            .starts_with("semantic(")
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(fetch(&svc, openai(&ask(FRANCE_AGAIN))).await.0, "miss");
    assert_eq!(up.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_index_is_bounded_and_drops_the_oldest() {
    let (up, words) = (Up::plain(), Words::default());
    let layer = semantic(&words).semantic_max_entries(2).build().unwrap();
    let svc = stack(layer.clone(), &up);
    for text in [FRANCE, "Capital of Spain?", "Capital of Italy?"] {
        fetch(&svc, openai(&ask(text))).await;
    }
    assert_eq!(layer.semantic_index().unwrap().len(), 2);
    assert_eq!(fetch(&svc, openai(&ask(FRANCE_AGAIN))).await.0, "miss");
    assert!(
        fetch(&svc, openai(&ask("what's the capital of Italy")))
            .await
            .0
            .starts_with("semantic(")
    );
}

#[test]
fn the_builder_refuses_a_threshold_below_the_floor_above_one_or_nan_and_no_text() {
    let words = Words::default();
    for t in [0.5, 0.79, 1.0001, f32::NAN] {
        let e = semantic(&words).semantic_threshold(t).build().unwrap_err();
        assert!(e.to_string().contains("semantic_threshold"), "{e}");
    }
    for t in [CacheBuilder::SEMANTIC_THRESHOLD_FLOOR, 0.95, 1.0] {
        semantic(&words).semantic_threshold(t).build().unwrap();
    }
    let e = semantic(&words)
        .semantic_max_text_bytes(0)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("semantic_max_text_bytes"), "{e}");
    assert!(
        CacheLayer::new(MemoryStore::new())
            .semantic_index()
            .is_none()
    );
}

// ---- no answer below the threshold (property) -----------------------------------------------

/// An upstream that answers each prompt with the prompt's own last message, so a test can
/// tell which prompt an answer was stored for.
#[derive(Clone)]
struct Echo;

impl Service<Request<Bytes>> for Echo {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Full<Bytes>>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        let body: Value = serde_json::from_slice(req.body()).unwrap();
        let prompt = body["messages"][1]["content"].as_str().unwrap().to_owned();
        let answer = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
            "model": body["model"], "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": prompt}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}});
        let mut resp = Response::new(Full::new(Bytes::from(answer.to_string())));
        resp.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        std::future::ready(Ok(resp))
    }
}

const VOCABULARY: [&str; 5] = ["sea", "storm", "harbor", "ship", "light"];

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Prompts are bags of five words, so their similarities spread over the whole range;
    /// whatever is stored and asked, every semantic answer scores at least the threshold, as
    /// reported and as recomputed from the prompt it answered.
    #[test]
    fn no_answer_is_ever_served_below_the_threshold(
        prompts in proptest::collection::vec(
            proptest::collection::vec(0..VOCABULARY.len(), 1..6), 2..24),
        threshold in proptest::prop_oneof![proptest::strategy::Just(0.95f32), 0.80f32..=1.0],
    ) {
        let rt = seawall_test_support::paused_runtime();
        rt.block_on(async {
            let words = Words::default();
            let layer = semantic(&words).semantic_threshold(threshold).build().unwrap();
            let svc = layer.layer(Echo);
            for p in &prompts {
                let text: Vec<&str> = p.iter().map(|&i| VOCABULARY[i]).collect();
                let text = text.join(" ");
                let resp = svc.clone().oneshot(openai(&ask(&text))).await.unwrap();
                let status = *resp.extensions().get::<CacheStatus>().unwrap();
                let body = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap();
                let answered = answer_text(std::str::from_utf8(&body.to_bytes()).unwrap());
                match status {
                    CacheStatus::Semantic(score) => {
                        assert!(score >= threshold, "{score} < {threshold}");
                        // What was embedded: the system prompt and the question.
                        let embedded = |q: &str| words_vector(&format!("{SYSTEM}\n{q}"));
                        let real = cosine(&embedded(&text), &embedded(&answered));
                        assert!(real >= f64::from(threshold) - 1e-5, "{text:?} got {answered:?}: {real}");
                    }
                    CacheStatus::Hit => assert_eq!(answered, text),
                    CacheStatus::Miss => assert_eq!(answered, text),
                    CacheStatus::Bypass => panic!("nothing here bypasses"),
                }
            }
        });
    }
}

// ---- OpenAiEmbedder over loopback ------------------------------------------------------------

type Classified = seawall_classify::Classify<seawall_http::HttpTransport>;

async fn loopback(profile: seawall_mock::Profile) -> Classified {
    let (addr, _) = seawall_test_support::start_mock(profile).await;
    let upstream = seawall_http::Upstream::new(&format!("http://{addr}/v1")).unwrap();
    let transport = seawall_http::HttpTransport::new()
        .unwrap()
        .with_upstream(upstream);
    seawall_classify::ClassifyLayer::new().layer(transport)
}

#[tokio::test]
async fn the_openai_embedder_gets_vectors_from_the_mock_over_loopback() {
    let embedder =
        OpenAiEmbedder::new(loopback(Default::default()).await, "text-embedding-3-small")
            .dimensions(256);
    let a = embedder.embed(FRANCE).await.unwrap();
    assert_eq!(a.len(), 256);
    assert_eq!(a, embedder.embed(FRANCE).await.unwrap(), "deterministic");
    let b = embedder
        .embed("What is the capital of Spain?")
        .await
        .unwrap();
    assert!(cosine(&a, &b) < 0.5);
    // The mock's default is 1536: expecting another length is a clear error.
    let strict =
        OpenAiEmbedder::new(loopback(Default::default()).await, "e").expect_dimensions(256);
    let e = strict.embed(FRANCE).await.unwrap_err();
    assert!(matches!(e, EmbedError::BadAnswer(_)));
    assert!(
        e.to_string().contains("1536 dimensions, 256 expected"),
        "{e}"
    );
}

#[tokio::test]
async fn the_openai_embedder_feeds_the_cache_over_loopback() {
    let embedder =
        OpenAiEmbedder::new(loopback(Default::default()).await, "text-embedding-3-small");
    let layer = CacheLayer::builder(MemoryStore::new())
        .semantic(embedder)
        .build()
        .unwrap();
    let up = Up::plain();
    let svc = stack(layer.clone(), &up);
    assert_eq!(fetch(&svc, openai(&ask(FRANCE))).await.0, "miss");
    assert_eq!(layer.semantic_index().unwrap().len(), 1);
}

#[tokio::test]
async fn an_embeddings_outage_is_an_error_of_the_stack_not_a_panic() {
    let outage = seawall_mock::Profile::default().error(seawall_mock::ErrorRule::outage(
        503,
        Duration::ZERO,
        Duration::from_secs(3600),
    ));
    let embedder = OpenAiEmbedder::new(loopback(outage).await, "e");
    match embedder.embed(FRANCE).await {
        Err(EmbedError::Call(e)) => assert_eq!(e.status().map(|s| s.as_u16()), Some(503)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn embedding_calls_are_retried_by_the_stack_they_go_through() {
    // The embeddings endpoint is down for the first 3 seconds; the retry layer waits out the
    // overload (5 s at least after a 503) and the second attempt gets the vector.
    let up = Up::new(
        seawall_mock::Profile::default().error(seawall_mock::ErrorRule::outage(
            503,
            Duration::ZERO,
            Duration::from_secs(3),
        )),
    );
    let stack = seawall_retry::BackoffRetryLayer::new()
        .layer(seawall_classify::ClassifyLayer::new().layer(up.clone()));
    let embedder = OpenAiEmbedder::new(stack, "e")
        .uri(http::Uri::from_static("http://mock/v1/embeddings"))
        .dimensions(64);
    let v = embedder.embed(FRANCE).await.unwrap();
    assert_eq!(v.len(), 64);
    assert_eq!(up.calls(), 2);
    assert_eq!(up.mock.stats().server_errors, 1);
}

/// A service answering every request with `status` and `body`.
fn answering(
    status: u16,
    body: &'static str,
) -> impl Service<Request<Bytes>, Response = Response<Full<Bytes>>, Error = LlmError, Future = impl Send>
+ Clone
+ Send
+ Sync
+ 'static {
    tower::service_fn(move |_req: Request<Bytes>| async move {
        let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
        Ok::<_, LlmError>(resp)
    })
}

#[tokio::test]
async fn bad_embeddings_answers_are_clear_errors() {
    for (status, body, says) in [
        (200, "<html>oops</html>", "not a list of embeddings"),
        (200, r#"{"data":[]}"#, "`data` is empty"),
        (
            200,
            r#"{"data":[{"embedding":[1e39, 0.5]}]}"#,
            "not a finite f32",
        ),
        (200, r#"{"data":[{"embedding":[0, 0, 0]}]}"#, "zero vector"),
        (
            200,
            r#"{"object":"list","data":[{"embedding":[NaN]}]}"#,
            "not a list",
        ),
    ] {
        let e = OpenAiEmbedder::new(answering(status, body), "e")
            .embed("x")
            .await
            .unwrap_err();
        assert!(matches!(e, EmbedError::BadAnswer(_)), "{body}: {e:?}");
        assert!(e.to_string().contains(says), "{body}: {e}");
    }
    let e = OpenAiEmbedder::new(answering(404, "{}"), "e")
        .embed("x")
        .await
        .unwrap_err();
    assert!(matches!(e, EmbedError::Status(s) if s == 404), "{e:?}");
}
