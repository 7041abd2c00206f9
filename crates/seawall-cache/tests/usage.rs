//! A hit reports the usage its answer was made with, read as the classifier read it on the
//! miss: Anthropic's cache reads and writes, DeepSeek's cached prompt tokens, thought tokens
//! counted only in `total_tokens`. And a replay in the other form (a stream served from a JSON
//! answer, or the reverse) says the same counts in its wire's own fields.

mod common;

use common::{Fixed, anthropic, anthropic_body, events, openai, openai_body, recorded};
use http::Request;
use http_body_util::BodyExt;
use seawall_cache::{CacheLayer, CacheStatus, MemoryStore};
use seawall_classify::ClassifyLayer;
use seawall_core::Usage;
use seawall_observe::CallRecord;
use serde_json::Value;
use tower::{Layer, ServiceExt};

const ANTHROPIC_CACHE_WRITES: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"The sea is wide."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":20,"cache_creation_input_tokens":3000,"cache_read_input_tokens":200,"cache_creation":{"ephemeral_5m_input_tokens":1000,"ephemeral_1h_input_tokens":2000},"output_tokens":7}}"#;

/// The same answer streamed: the prompt's counts in `message_start`, the cumulative counts
/// (the input's again, as newer versions of the API send them) in `message_delta`.
const ANTHROPIC_STREAM: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":20,\"cache_creation_input_tokens\":3000,\"cache_read_input_tokens\":200,\"cache_creation\":{\"ephemeral_5m_input_tokens\":1000,\"ephemeral_1h_input_tokens\":2000},\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"The sea is wide.\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":20,\"cache_creation_input_tokens\":3000,\"cache_read_input_tokens\":200,\"output_tokens\":7}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// A thinking model behind an OpenAI-compatible API that counts its thoughts in the total only.
const THOUGHTS_IN_TOTAL: &str = r#"{"id":"c1","object":"chat.completion","created":1,"model":"gemini-2.5-flash","choices":[{"index":0,"message":{"role":"assistant","content":"The sea is wide."},"finish_reason":"stop"}],"usage":{"prompt_tokens":50,"completion_tokens":10,"total_tokens":90}}"#;

/// DeepSeek's count of the prompt tokens its cache served.
const DEEPSEEK_CACHE_HITS: &str = r#"{"id":"c2","object":"chat.completion","created":1,"model":"deepseek-chat","choices":[{"index":0,"message":{"role":"assistant","content":"The sea is wide."},"finish_reason":"stop"}],"usage":{"prompt_tokens":50,"completion_tokens":10,"total_tokens":60,"prompt_cache_hit_tokens":30,"prompt_cache_miss_tokens":20}}"#;

/// Sends each request in turn through observe → cache → classify → `up`, reading each body
/// whole: the bodies and the call records.
async fn calls(up: Fixed, requests: Vec<Request<bytes::Bytes>>) -> (Vec<String>, Vec<CallRecord>) {
    let (observe, records) = recorded();
    let cache = CacheLayer::new(MemoryStore::new());
    let svc = observe.layer(cache.layer(ClassifyLayer::new().layer(up)));
    let mut bodies = Vec::new();
    for req in requests {
        let resp = svc.clone().oneshot(req).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        bodies.push(String::from_utf8(body.to_vec()).unwrap());
    }
    let records = records.lock().unwrap().clone();
    (bodies, records)
}

/// The usage of the call records, after checking the first was the miss and the rest hits.
fn usages(records: &[CallRecord]) -> Vec<Usage> {
    let statuses: Vec<_> = records.iter().map(|r| r.cache).collect();
    let mut want = vec![Some(CacheStatus::Hit); records.len()];
    want[0] = Some(CacheStatus::Miss);
    assert_eq!(statuses, want);
    records
        .iter()
        .map(|r| r.usage.expect("every call reports its usage"))
        .collect()
}

fn usage(input: u64, output: u64, cached: u64, written: u64, hour: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cached_input_tokens: cached,
        cache_write_input_tokens: written,
        cache_write_1h_input_tokens: hour,
    }
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap()
}

/// The usage objects an Anthropic stream's events carry: `message_start`'s and
/// `message_delta`'s.
fn anthropic_stream_usages(body: &str) -> (Value, Value) {
    let events = events(body);
    let data = |name: &str| {
        let (_, d) = events.iter().find(|(n, _)| n == name).unwrap();
        json(d)
    };
    (
        data("message_start")["message"]["usage"].clone(),
        data("message_delta")["usage"].clone(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_hit_reports_an_anthropic_answers_cache_reads_and_writes_as_the_miss_did() {
    let want = usage(3220, 7, 200, 3000, 2000);
    for up in [
        Fixed::new(ANTHROPIC_CACHE_WRITES),
        Fixed::stream(ANTHROPIC_STREAM),
    ] {
        let streamed = up.body.lock().unwrap().starts_with("event:");
        let requests = vec![
            anthropic(&anthropic_body(streamed)),
            anthropic(&anthropic_body(false)),
            anthropic(&anthropic_body(true)),
        ];
        let (bodies, records) = calls(up.clone(), requests).await;
        assert_eq!(up.calls(), 1);
        assert_eq!(usages(&records), vec![want; 3], "streamed: {streamed}");

        // Replayed in either form, the counts are Anthropic's own: the input apart from the
        // cache's reads and writes, the writes split by how long they are kept.
        let (start, delta) = anthropic_stream_usages(&bodies[2]);
        let whole = json(&bodies[1])["usage"].clone();
        for u in [&start, &whole] {
            assert_eq!(u["input_tokens"], 20, "{u}");
            assert_eq!(u["cache_read_input_tokens"], 200, "{u}");
            assert_eq!(u["cache_creation_input_tokens"], 3000, "{u}");
            assert_eq!(
                u["cache_creation"]["ephemeral_1h_input_tokens"], 2000,
                "{u}"
            );
            assert_eq!(
                u["cache_creation"]["ephemeral_5m_input_tokens"], 1000,
                "{u}"
            );
        }
        assert_eq!(whole["output_tokens"], 7);
        assert_eq!(delta["output_tokens"], 7);
    }
}

#[tokio::test(start_paused = true)]
async fn a_hit_reports_thought_tokens_counted_only_in_the_total_as_output() {
    let requests = vec![
        openai(&openai_body(false)),
        openai(&openai_body(false)),
        openai(&{
            let mut b = openai_body(true);
            b["stream_options"] = serde_json::json!({"include_usage": true});
            b
        }),
    ];
    let (bodies, records) = calls(Fixed::new(THOUGHTS_IN_TOTAL), requests).await;
    assert_eq!(usages(&records), vec![usage(50, 40, 0, 0, 0); 3]);
    // The replayed stream's usage chunk: the output with the thoughts, the same total.
    let last = events(&bodies[2])
        .into_iter()
        .map(|(_, d)| d)
        .rfind(|d| d.contains("\"usage\""))
        .unwrap();
    let u = json(&last)["usage"].clone();
    assert_eq!(
        (
            &u["prompt_tokens"],
            &u["completion_tokens"],
            &u["total_tokens"]
        ),
        (&50.into(), &40.into(), &90.into())
    );
}

#[tokio::test(start_paused = true)]
async fn a_hit_reports_deepseeks_cached_prompt_tokens() {
    let requests = vec![openai(&openai_body(false)), openai(&openai_body(false))];
    let (_, records) = calls(Fixed::new(DEEPSEEK_CACHE_HITS), requests).await;
    assert_eq!(usages(&records), vec![usage(50, 10, 30, 0, 0); 2]);
}
