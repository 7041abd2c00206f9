//! The exact cache end to end, on paused time: what is stored and served, in which form, for
//! whom, for how long, and what bypasses it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use seawall_cache::{CacheControl, CacheLayer, CacheStatus, MemoryStore};
use seawall_core::{ServedBy, Usage};
use seawall_mock::{Count, Profile};
use serde_json::{Value, json};

fn layer() -> CacheLayer {
    CacheLayer::new(MemoryStore::new())
}

// ---- stream <-> non-stream, both wire formats ------------------------------------------------

#[tokio::test(start_paused = true)]
async fn answers_replay_across_stream_modes_in_both_wire_formats() {
    for (make, body) in [
        (openai as fn(&Value) -> _, openai_body as fn(bool) -> Value),
        (anthropic, anthropic_body),
    ] {
        for first_streamed in [false, true] {
            let up = Up::plain();
            let svc = stack(layer(), &up);
            let (status, _, original) = fetch(&svc, make(&body(first_streamed))).await;
            assert_eq!(status, "miss");
            assert_eq!(up.calls(), 1);
            let text = answer_text(&original);
            assert!(!text.is_empty());

            // The other mode, then the same mode: both from the cache.
            for streamed in [!first_streamed, first_streamed] {
                let (status, replay_type, replay) = fetch(&svc, make(&body(streamed))).await;
                assert_eq!(status, "hit", "streamed {streamed} after {first_streamed}");
                assert_eq!(up.calls(), 1, "a hit makes no upstream call");
                assert_eq!(answer_text(&replay), text);
                if streamed {
                    assert_eq!(replay_type, "text/event-stream");
                    let events = events(&replay);
                    let (name, last) = events.last().unwrap();
                    // The stream ends properly, in its own wire format.
                    assert!(
                        last == "[DONE]" || name == "message_stop",
                        "ends with {name} {last}"
                    );
                } else {
                    assert_eq!(replay_type, "application/json");
                    let v: Value = serde_json::from_str(&replay).unwrap();
                    assert!(
                        v["choices"][0]["finish_reason"] == "stop"
                            || v["stop_reason"] == "end_turn"
                            || v["choices"][0]["finish_reason"] == "length"
                            || v["stop_reason"] == "max_tokens",
                        "{v}"
                    );
                }
                if !first_streamed && !streamed {
                    assert_eq!(replay, original, "a JSON answer is replayed byte for byte");
                }
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_replayed_stream_passes_the_classifier_as_a_complete_answer() {
    // The replayed SSE, fed back through the real classifier, is a finished stream.
    let up = Up::plain();
    let svc = stack(layer(), &up);
    fetch(&svc, openai(&openai_body(false))).await;
    let mut streamed = openai_body(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (_, _, sse) = fetch(&svc, openai(&streamed)).await;
    let usage_chunk = events(&sse)
        .into_iter()
        .find(|(_, d)| d.contains("\"usage\""))
        .expect("include_usage gives a usage chunk");
    let v: Value = serde_json::from_str(&usage_chunk.1).unwrap();
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0);

    let replayed = seawall_cache::Assembler::new(seawall_cache::Wire::OpenAiChat, true, 1 << 20);
    let mut a = replayed;
    a.feed(sse.as_bytes());
    let answer = a.finish().expect("the replay is a complete answer");
    assert_eq!(
        answer.usage().output_tokens,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
}

// ---- what is never stored ------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_cut_stream_is_never_stored() {
    let up = Up::new(Profile::default().cut_streams(1.0, Count::fixed(3), false));
    let svc = stack(layer(), &up);
    let resp = send(&svc, openai(&openai_body(true))).await.unwrap();
    use http_body_util::BodyExt;
    assert!(
        resp.into_body().collect().await.is_err(),
        "the cut reaches the caller"
    );
    fetch_status_is(&svc, openai(&openai_body(false)), "miss").await;
    assert_eq!(up.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_error_event_in_a_stream_is_never_stored() {
    let up = Up::new(Profile::default().mid_stream_errors(1.0, Count::fixed(2)));
    let svc = stack(layer(), &up);
    let resp = send(&svc, anthropic(&anthropic_body(true))).await.unwrap();
    use http_body_util::BodyExt;
    assert!(resp.into_body().collect().await.is_err());
    let _ = send(&svc, anthropic(&anthropic_body(true))).await;
    assert_eq!(up.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_failed_call_is_never_stored() {
    let up = Up::plain().failing(1);
    let svc = stack(layer(), &up);
    assert!(send(&svc, openai(&openai_body(false))).await.is_err());
    fetch_status_is(&svc, openai(&openai_body(false)), "miss").await;
    fetch_status_is(&svc, openai(&openai_body(false)), "hit").await;
    assert_eq!(up.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_body_dropped_half_read_is_never_stored() {
    let up = Up::plain();
    let svc = stack(layer(), &up);
    let resp = send(&svc, openai(&openai_body(true))).await.unwrap();
    use http_body_util::BodyExt;
    let mut body = resp.into_body();
    assert!(body.frame().await.is_some());
    drop(body);
    fetch_status_is(&svc, openai(&openai_body(true)), "miss").await;
    assert_eq!(up.calls(), 2);
}

/// The stack with a front that marks every answer as served by `served`.
async fn served_by(served: ServedBy, allow: bool) -> usize {
    use tower::{Layer, ServiceExt};
    let up = Up::plain();
    let marked = tower::util::MapResponseLayer::new(move |mut r: http::Response<_>| {
        r.extensions_mut().insert(served.clone());
        r
    })
    .layer(seawall_classify::ClassifyLayer::new().layer(up.clone()));
    let cache = CacheLayer::builder(MemoryStore::new())
        .allow_fallback_answers(allow)
        .build()
        .unwrap();
    let svc = cache.layer(marked);
    for _ in 0..2 {
        let resp = svc
            .clone()
            .oneshot(openai(&openai_body(false)))
            .await
            .unwrap();
        http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap();
    }
    up.calls()
}

#[tokio::test(start_paused = true)]
async fn fallback_answers_are_stored_only_when_allowed_and_degraded_ones_never() {
    let fallback = ServedBy {
        target: "gpt-4o-mini".into(),
        model: None,
        degraded: false,
    };
    let degraded = ServedBy {
        target: "last-resort".into(),
        model: None,
        degraded: true,
    };
    let primary = ServedBy {
        target: "primary".into(),
        model: None,
        degraded: false,
    };
    assert_eq!(served_by(primary, false).await, 1);
    assert_eq!(served_by(fallback.clone(), false).await, 2);
    assert_eq!(served_by(fallback, true).await, 1);
    assert_eq!(served_by(degraded, true).await, 2);
}

#[tokio::test(start_paused = true)]
async fn several_choices_bypass_the_cache() {
    let up = Up::plain();
    let svc = stack(layer(), &up);
    let mut body = openai_body(false);
    body["n"] = json!(2);
    fetch_status_is(&svc, openai(&body), "bypass").await;
    fetch_status_is(&svc, openai(&body), "bypass").await;
    assert_eq!(up.calls(), 2);
}

// ---- policy ---------------------------------------------------------------------------------

async fn fetch_status_is(svc: &Stack, req: http::Request<Bytes>, want: &str) {
    let (status, ..) = fetch(svc, req).await;
    assert_eq!(status, want);
}

/// A cache whose answers live a minute, over `up`.
fn minute_ttl(up: &Up) -> Stack {
    let cache = CacheLayer::builder(MemoryStore::new())
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    stack(cache, up)
}

#[tokio::test(start_paused = true)]
async fn entries_expire_after_their_ttl() {
    let up = Up::plain();
    let svc = minute_ttl(&up);
    fetch_status_is(&svc, openai(&openai_body(false)), "miss").await;
    tokio::time::advance(Duration::from_secs(59)).await;
    fetch_status_is(&svc, openai(&openai_body(false)), "hit").await;
    tokio::time::advance(Duration::from_secs(1)).await;
    fetch_status_is(&svc, openai(&openai_body(false)), "miss").await;
    assert_eq!(up.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_entry_lives_from_when_its_answer_arrived_not_from_when_its_body_was_read() {
    let up = Up::plain();
    let svc = minute_ttl(&up);
    // The answer arrives now; the caller reads its body to the end 30 seconds later, and
    // only then is it stored.
    let resp = send(&svc, openai(&openai_body(false))).await.unwrap();
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(read(resp).await.0, "miss");
    tokio::time::advance(Duration::from_secs(29)).await;
    fetch_status_is(&svc, openai(&openai_body(false)), "hit").await;
    // 60 seconds after it arrived (30 after it was stored), it is gone.
    tokio::time::advance(Duration::from_secs(1)).await;
    fetch_status_is(&svc, openai(&openai_body(false)), "miss").await;
    assert_eq!(up.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_store_bound_evicts_the_oldest_answer() {
    let up = Up::plain();
    let svc = stack(
        CacheLayer::new(MemoryStore::with_bounds(1, usize::MAX)),
        &up,
    );
    let ask =
        |q: &str| openai(&json!({"model": "m", "messages": [{"role": "user", "content": q}]}));
    fetch_status_is(&svc, ask("a"), "miss").await;
    fetch_status_is(&svc, ask("b"), "miss").await;
    fetch_status_is(&svc, ask("b"), "hit").await;
    fetch_status_is(&svc, ask("a"), "miss").await;
}

#[tokio::test(start_paused = true)]
async fn an_answer_larger_than_the_entry_bound_is_passed_through_not_stored() {
    let up = Up::new(Profile::default().output_tokens(Count::fixed(200)));
    let cache = CacheLayer::builder(MemoryStore::new())
        .max_entry_bytes(256)
        .build()
        .unwrap();
    let svc = stack(cache, &up);
    let (_, _, body) = fetch(&svc, openai(&openai_body(false))).await;
    assert!(body.len() > 256, "the caller gets all of it");
    fetch_status_is(&svc, openai(&openai_body(false)), "miss").await;
}

#[tokio::test(start_paused = true)]
async fn no_cache_reads_through_and_refreshes() {
    let up = Up::plain();
    let svc = stack(layer(), &up);
    fetch_status_is(&svc, openai(&openai_body(false)), "miss").await;
    let mut req = openai(&openai_body(false));
    req.headers_mut()
        .insert("cache-control", "max-age=0, No-Cache".parse().unwrap());
    fetch_status_is(&svc, req, "bypass").await;
    assert_eq!(up.calls(), 2, "no-cache went upstream");
    // The refreshed answer is the one served now: the mock's second answer has another id.
    let (_, _, served) = fetch(&svc, openai(&openai_body(false))).await;
    let mut again = openai(&openai_body(false));
    again.extensions_mut().insert(CacheControl::NoCache);
    let (status, _, fresh) = fetch(&svc, again).await;
    assert_eq!(status, "bypass");
    let (_, _, now) = fetch(&svc, openai(&openai_body(false))).await;
    let id = |b: &str| serde_json::from_str::<Value>(b).unwrap()["id"].clone();
    assert_ne!(id(&served), id(&fresh));
    assert_eq!(id(&now), id(&fresh));
    assert_eq!(up.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn no_store_neither_reads_nor_writes() {
    let up = Up::plain();
    let svc = stack(layer(), &up);
    let no_store = || {
        let mut r = openai(&openai_body(false));
        r.headers_mut()
            .insert("cache-control", "no-store".parse().unwrap());
        r
    };
    fetch_status_is(&svc, no_store(), "bypass").await;
    fetch_status_is(&svc, openai(&openai_body(false)), "miss").await;
    fetch_status_is(&svc, no_store(), "bypass").await;
    let mut ext = openai(&openai_body(false));
    ext.extensions_mut().insert(CacheControl::NoStore);
    fetch_status_is(&svc, ext, "bypass").await;
    // Every no-store call went upstream, even with an answer stored.
    assert_eq!(up.calls(), 4);
}

#[tokio::test(start_paused = true)]
async fn sampled_answers_above_the_temperature_threshold_are_not_cached_unless_opted_in() {
    let mut hot = openai_body(false);
    hot["temperature"] = json!(0.9);
    let up = Up::plain();
    let strict = CacheLayer::builder(MemoryStore::new())
        .max_temperature(0.5)
        .build()
        .unwrap();
    let svc = stack(strict, &up);
    fetch_status_is(&svc, openai(&hot), "bypass").await;
    fetch_status_is(&svc, openai(&hot), "bypass").await;
    fetch_status_is(&svc, openai(&openai_body(false)), "miss").await;
    fetch_status_is(&svc, openai(&openai_body(false)), "hit").await;

    let opted = CacheLayer::builder(MemoryStore::new())
        .max_temperature(0.5)
        .cache_any_temperature()
        .build()
        .unwrap();
    let svc = stack(opted, &up);
    fetch_status_is(&svc, openai(&hot), "miss").await;
    fetch_status_is(&svc, openai(&hot), "hit").await;
}

#[tokio::test(start_paused = true)]
async fn a_request_without_a_temperature_counts_as_sampled_at_the_providers_default() {
    let mut unsaid = openai_body(false);
    unsaid.as_object_mut().unwrap().remove("temperature");
    let mut null = openai_body(false);
    null["temperature"] = Value::Null;
    let up = Up::plain();
    // Greedy decoding only: a request that does not ask for it samples at 1.0.
    let greedy = CacheLayer::builder(MemoryStore::new())
        .max_temperature(0.0)
        .build()
        .unwrap();
    let svc = stack(greedy, &up);
    for body in [&unsaid, &null, &unsaid] {
        fetch_status_is(&svc, openai(body), "bypass").await;
    }
    fetch_status_is(&svc, anthropic(&anthropic_body(false)), "bypass").await;
    fetch_status_is(&svc, openai(&openai_body(false)), "miss").await;
    fetch_status_is(&svc, openai(&openai_body(false)), "hit").await;
    assert_eq!(up.calls(), 5);

    // The default threshold is that default: such requests are cached.
    let svc = stack(CacheLayer::new(MemoryStore::new()), &up);
    for (body, want) in [
        (&unsaid, "miss"),
        (&unsaid, "hit"),
        (&null, "miss"),
        (&null, "hit"),
    ] {
        fetch_status_is(&svc, openai(body), want).await;
    }
    fetch_status_is(&svc, anthropic(&anthropic_body(false)), "miss").await;
    fetch_status_is(&svc, anthropic(&anthropic_body(false)), "hit").await;
}

#[tokio::test(start_paused = true)]
async fn time_sensitive_prompts_always_bypass() {
    let up = Up::plain();
    let cache = CacheLayer::builder(MemoryStore::new())
        .bypass_when(|req| {
            let body = String::from_utf8_lossy(req.body()).to_lowercase();
            body.contains("today") || body.contains("latest")
        })
        .build()
        .unwrap();
    let svc = stack(cache, &up);
    let weather = json!({"model": "m", "messages": [{"role": "user", "content": "What's the weather today?"}]});
    fetch_status_is(&svc, openai(&weather), "bypass").await;
    fetch_status_is(&svc, openai(&weather), "bypass").await;
    assert_eq!(up.calls(), 2);
    fetch_status_is(&svc, openai(&openai_body(false)), "miss").await;
    fetch_status_is(&svc, openai(&openai_body(false)), "hit").await;
}

#[tokio::test(start_paused = true)]
async fn tenants_never_share_answers_unless_configured_to() {
    let as_tenant = |key: &str| {
        let mut r = openai(&openai_body(false));
        r.headers_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
        r
    };
    let up = Up::plain();
    let svc = stack(layer(), &up);
    fetch_status_is(&svc, as_tenant("sk-a"), "miss").await;
    fetch_status_is(&svc, as_tenant("sk-b"), "miss").await;
    fetch_status_is(&svc, as_tenant("sk-a"), "hit").await;

    let by_header = CacheLayer::builder(MemoryStore::new())
        .partition(|r: &http::Request<Bytes>| {
            r.headers()
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        })
        .build()
        .unwrap();
    let svc = stack(by_header, &up);
    let tenant = |t: &str, key: &str| {
        let mut r = as_tenant(key);
        r.headers_mut().insert("x-tenant", t.parse().unwrap());
        r
    };
    fetch_status_is(&svc, tenant("acme", "sk-a"), "miss").await;
    fetch_status_is(&svc, tenant("acme", "sk-b"), "hit").await;
    fetch_status_is(&svc, tenant("initech", "sk-a"), "miss").await;

    let shared = CacheLayer::builder(MemoryStore::new())
        .shared_across_tenants()
        .build()
        .unwrap();
    let svc = stack(shared, &up);
    fetch_status_is(&svc, as_tenant("sk-a"), "miss").await;
    fetch_status_is(&svc, as_tenant("sk-b"), "hit").await;
}

#[tokio::test(start_paused = true)]
async fn normalisation_turns_a_zero_hit_rate_into_a_real_one() {
    // Every prompt carries its own request id and timestamp.
    let ask = |i: u32| {
        openai(&json!({"model": "m", "temperature": 0, "messages": [
            {"role": "user", "content": format!("[req {i:04x} at 2026-12-01T19:{:02}:00Z] Summarise the tides", i % 60)}
        ]}))
    };
    let hits = |svc: Stack| async move {
        let mut hits = 0;
        for i in 0..20 {
            let (status, ..) = fetch(&svc, ask(i)).await;
            hits += usize::from(status == "hit");
        }
        hits
    };
    let up = Up::plain();
    assert_eq!(hits(stack(layer(), &up)).await, 0);
    assert_eq!(up.calls(), 20);

    let strip = CacheLayer::builder(MemoryStore::new())
        .normalize(|body: &mut Value| {
            for m in body["messages"].as_array_mut().into_iter().flatten() {
                if let Some(Value::String(text)) = m.get_mut("content") {
                    if let Some(end) = text.find("] ") {
                        text.replace_range(..end + 2, "");
                    }
                }
            }
        })
        .build()
        .unwrap();
    let up = Up::plain();
    assert_eq!(hits(stack(strip, &up)).await, 19);
    assert_eq!(up.calls(), 1);
}

// ---- hostile bodies ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn hostile_bodies_bypass_and_never_panic() {
    let up = Up::plain();
    let cache = CacheLayer::builder(MemoryStore::new())
        .max_body_bytes(64 * 1024)
        .build()
        .unwrap();
    let svc = stack(cache, &up);
    let deep = format!(
        r#"{{"model":"m","messages":{}1{}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let huge = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(100_000)
    );
    let bodies = [
        "not json".to_owned(),
        "[1,2,3]".to_owned(),
        r#"{"model":"m""#.to_owned(),
        r#"{"model":"m"} trailing"#.to_owned(),
        "\u{0}\u{ff}".to_owned(),
        deep,
        huge,
    ];
    let n = bodies.len();
    for body in bodies.iter().chain(&bodies) {
        // The upstream refuses most of them: the cache passes its answer on either way.
        if let Ok(resp) = send(&svc, raw_openai(body.clone())).await {
            assert_eq!(resp.headers()[seawall_cache::CACHE_HEADER], "bypass");
            assert_eq!(
                resp.extensions().get::<CacheStatus>(),
                Some(&CacheStatus::Bypass)
            );
        }
    }
    assert_eq!(
        up.calls(),
        2 * n,
        "each went upstream, none was served or shared"
    );
}

// ---- the call record ------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_hit_is_recorded_as_cached_with_no_attempt_and_zero_cost_but_its_usage() {
    use tower::{Layer, ServiceExt};
    let (observe, records) = recorded();
    let up = Up::plain();
    let svc = observe.layer(stack(layer(), &up));
    let mut body = openai_body(true);
    body["stream_options"] = json!({"include_usage": true});
    for req in [openai(&body), openai(&openai_body(false))] {
        let resp = svc.clone().oneshot(req).await.unwrap();
        http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap();
    }
    let records = records.lock().unwrap();
    let [miss, hit] = &records[..] else {
        panic!("two records: {records:?}");
    };
    assert_eq!(miss.cache, Some(CacheStatus::Miss));
    assert_eq!(miss.attempts, 1);
    assert_eq!(hit.cache, Some(CacheStatus::Hit));
    assert_eq!(hit.attempts, 0);
    assert_eq!(hit.cost_usd, Some(0.0));
    let usage: Usage = hit.usage.expect("a hit carries its answer's usage");
    assert_eq!(Some(usage), miss.usage);
    assert!(usage.output_tokens > 0);
    assert!(hit.to_json().contains(r#""cache":"hit""#));
}

// ---- stores that answer at once, and stores that do not -------------------------------------

#[tokio::test(start_paused = true)]
async fn the_memory_store_calls_the_ready_upstream_in_place_on_a_miss_and_never_on_a_hit() {
    use tower::{Layer, Service, ServiceExt};
    let up = Up::plain();
    let (counted, clones) = seawall_test_support::count_clones(up.clone());
    let mut svc = layer().layer(counted);
    assert_eq!(
        clones.count(),
        1,
        "the spare, made as the layer wraps the service"
    );
    // A miss that leads its flight goes upstream from `call`, on the service that was made
    // ready: nothing is cloned, and the upstream has the request before the future is polled.
    let fut = svc.ready().await.unwrap().call(openai(&openai_body(false)));
    assert_eq!(up.calls(), 1, "a miss known at once is sent from `call`");
    http_body_util::BodyExt::collect(fut.await.unwrap().into_body())
        .await
        .unwrap();
    assert_eq!(clones.count(), 1);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for _ in 0..3 {
        svc.ready().await.unwrap();
        let mut fut = std::pin::pin!(svc.call(openai(&openai_body(false))));
        let std::task::Poll::Ready(resp) = fut.as_mut().poll(&mut cx) else {
            panic!("a hit from the memory store is ready at the first poll");
        };
        assert_eq!(resp.unwrap().headers()[seawall_cache::CACHE_HEADER], "hit");
    }
    assert_eq!(clones.count(), 1);
    assert_eq!(up.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_call_that_goes_upstream_after_a_wait_clones_the_spare_and_a_hit_clones_nothing() {
    use tower::{Layer, Service, ServiceExt};
    let up = Up::plain();
    let (counted, clones) = seawall_test_support::count_clones(up.clone());
    let mut svc = CacheLayer::new(Remote(MemoryStore::new())).layer(counted);
    assert_eq!(
        clones.count(),
        1,
        "the spare, made as the layer wraps the service"
    );
    // The store answers through a future: the call is made only after it, on a clone of the
    // spare made then and polled ready first; the ready service stays for the next call.
    let fut = svc.ready().await.unwrap().call(openai(&openai_body(false)));
    assert_eq!(up.calls(), 0, "nothing is sent before the lookup");
    assert_eq!(clones.count(), 1, "nothing is cloned before it is needed");
    http_body_util::BodyExt::collect(fut.await.unwrap().into_body())
        .await
        .unwrap();
    assert_eq!(up.calls(), 1);
    assert_eq!(
        clones.count(),
        2,
        "one clone, for the call that went upstream"
    );
    // Hits through the store's future go nowhere: no clone.
    for _ in 0..3 {
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(openai(&openai_body(false)))
            .await;
        assert_eq!(resp.unwrap().headers()[seawall_cache::CACHE_HEADER], "hit");
    }
    assert_eq!((up.calls(), clones.count()), (1, 2));
}

/// An upstream that is not ready until a signal: a call that goes upstream after a wait
/// polls its clone ready first, and waits.
#[derive(Clone)]
struct Gated {
    up: Up,
    open: Arc<std::sync::atomic::AtomicBool>,
}

impl tower::Service<http::Request<Bytes>> for Gated {
    type Response = <Up as tower::Service<http::Request<Bytes>>>::Response;
    type Error = <Up as tower::Service<http::Request<Bytes>>>::Error;
    type Future = <Up as tower::Service<http::Request<Bytes>>>::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        if self.open.load(std::sync::atomic::Ordering::SeqCst) {
            self.up.poll_ready(cx)
        } else {
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    }

    fn call(&mut self, req: http::Request<Bytes>) -> Self::Future {
        self.up.call(req)
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_that_goes_upstream_after_a_wait_waits_for_its_service_to_be_ready() {
    use tower::{Layer, Service};
    let up = Up::plain();
    let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut svc = CacheLayer::new(Remote(MemoryStore::new())).layer(Gated {
        up: up.clone(),
        open: open.clone(),
    });
    std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    // The service was ready at `call`; it is not when the lookup has found nothing.
    let fut = svc.call(openai(&openai_body(false)));
    open.store(false, std::sync::atomic::Ordering::SeqCst);
    let mut fut = std::pin::pin!(fut);
    for _ in 0..5 {
        assert!(futures_poll_once(fut.as_mut()).await.is_pending());
    }
    assert_eq!(up.calls(), 0, "not sent on a service that is not ready");
    open.store(true, std::sync::atomic::Ordering::SeqCst);
    http_body_util::BodyExt::collect(fut.await.unwrap().into_body())
        .await
        .unwrap();
    assert_eq!(up.calls(), 1);
}

/// Polls `fut` once, as the runtime would.
async fn futures_poll_once<F: std::future::Future + Unpin>(
    mut fut: F,
) -> std::task::Poll<F::Output> {
    std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut fut).poll(cx))).await
}

/// A store that only answers through its futures, each waiting a tick first (a remote one).
struct Remote(MemoryStore);

impl seawall_cache::CacheStore for Remote {
    fn get(
        &self,
        key: &seawall_cache::CacheKey,
    ) -> seawall_cache::StoreFuture<Option<Arc<seawall_cache::Answer>>> {
        let (store, key) = (self.0.clone(), *key);
        Box::pin(async move {
            tokio::task::yield_now().await;
            Ok(store.lookup(&key))
        })
    }

    fn put(
        &self,
        key: &seawall_cache::CacheKey,
        answer: Arc<seawall_cache::Answer>,
        ttl: Duration,
    ) -> seawall_cache::StoreFuture<()> {
        let (store, key) = (self.0.clone(), *key);
        Box::pin(async move {
            tokio::task::yield_now().await;
            store.insert(&key, answer, ttl);
            Ok(())
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_that_answers_only_through_futures_is_awaited() {
    let memory = MemoryStore::new();
    let up = Up::plain();
    let svc = stack(CacheLayer::new(Remote(memory.clone())), &up);
    let (status, _, original) = fetch(&svc, openai(&openai_body(false))).await;
    assert_eq!(status, "miss");
    // The answer is written by the store's future, on a task.
    settle().await;
    assert_eq!(memory.usage().0, 1);
    for streamed in [false, true] {
        let (status, _, replay) = fetch(&svc, openai(&openai_body(streamed))).await;
        assert_eq!(status, "hit");
        assert_eq!(answer_text(&replay), answer_text(&original));
    }
    assert_eq!(up.calls(), 1);
}
