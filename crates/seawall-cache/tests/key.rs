//! The cache key: the same for requests that ask the same thing, different for any that asks
//! something else.

use bytes::Bytes;
use seawall_cache::{CacheKey, KeyDeriver};
use serde_json::{Value, json};

fn key_at(path: &str, body: &str) -> CacheKey {
    let req = http::Request::post(path)
        .body(Bytes::from(body.to_owned()))
        .unwrap();
    KeyDeriver::new().key(&req, None).unwrap().0
}

fn key(body: &str) -> CacheKey {
    key_at("/v1/chat/completions", body)
}

fn base() -> Value {
    json!({
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Why is the sea salty?"}
        ],
        "temperature": 0,
        "max_tokens": 100
    })
}

#[test]
fn the_key_is_stable_under_key_order_whitespace_number_spelling_and_stream() {
    let compact = key(&base().to_string());
    let spaced = r#"
        {
          "max_tokens" : 100.0 ,
          "temperature": 0e0,
          "stream": true, "stream_options": {"include_usage": true},
          "messages": [
            {"content": "Be brief.", "role": "system"},
            {"content": "Why is the sea \u0073alty?", "role": "user"}
          ],
          "model": "gpt-4o"
        }"#;
    assert_eq!(key(spaced), compact);
    let mut unstreamed = base();
    unstreamed["stream"] = json!(false);
    assert_eq!(key(&unstreamed.to_string()), compact);
    // Stable across calls, threads and builds of the deriver.
    let again = std::thread::spawn(move || key(&base().to_string()))
        .join()
        .unwrap();
    assert_eq!(again, compact);
}

#[test]
fn anything_that_changes_the_answer_changes_the_key() {
    let original = key(&base().to_string());
    let changes: Vec<(&str, Value)> = vec![
        ("temperature", json!(0.7)),
        ("top_p", json!(0.9)),
        ("max_tokens", json!(101)),
        ("seed", json!(42)),
        ("response_format", json!({"type": "json_object"})),
        ("model", json!("gpt-4o-mini")),
        (
            "tools",
            json!([{"type": "function", "function": {"name": "f"}}]),
        ),
        ("stop", json!(["\n"])),
        ("frequency_penalty", json!(0.5)),
    ];
    let mut seen = vec![original];
    for (field, value) in changes {
        let mut body = base();
        body[field] = value;
        let k = key(&body.to_string());
        assert!(!seen.contains(&k), "{field} changes the key");
        seen.push(k);
    }
    let mut reworded = base();
    reworded["messages"][1]["content"] = json!("Why is the sea salty? ");
    assert!(!seen.contains(&key(&reworded.to_string())));
    let mut system = base();
    system["messages"][0]["content"] = json!("Be thorough.");
    assert!(!seen.contains(&key(&system.to_string())));
    // The same body to another API or deployment is another question.
    assert_ne!(key_at("/v1/messages", &base().to_string()), original);
    assert_ne!(
        key_at(
            "/openai/deployments/a/chat/completions",
            &base().to_string()
        ),
        key_at(
            "/openai/deployments/b/chat/completions",
            &base().to_string()
        )
    );
}

#[test]
fn the_partition_keeps_tenants_apart_and_the_headers_of_the_api_version_count() {
    let req = |version: &str| {
        http::Request::post("/v1/messages")
            .header("anthropic-version", version)
            .body(Bytes::from(base().to_string()))
            .unwrap()
    };
    let keys = KeyDeriver::new();
    let k = |r, p: Option<&[u8]>| keys.key(&r, p).unwrap().0;
    assert_ne!(
        k(req("2023-06-01"), Some(b"a")),
        k(req("2023-06-01"), Some(b"b"))
    );
    assert_ne!(k(req("2023-06-01"), Some(b"a")), k(req("2023-06-01"), None));
    assert_ne!(k(req("2023-06-01"), None), k(req("2024-01-01"), None));
}

#[test]
fn the_facts_the_policy_needs_are_read_on_the_way() {
    let req = http::Request::post("/v1/chat/completions")
        .body(Bytes::from_static(
            br#"{"n": 3, "temperature": 1.25, "stream": true, "stream_options": {"include_usage": true}, "model": "m"}"#,
        ))
        .unwrap();
    let (_, facts) = KeyDeriver::new().key(&req, None).unwrap();
    assert_eq!(facts.choices, 3);
    assert_eq!(facts.temperature, Some(1.25));
    assert!(facts.stream && facts.include_usage);
}
