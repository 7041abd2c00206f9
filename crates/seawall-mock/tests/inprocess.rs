//! The fault model through the in-process service, on tokio's paused clock.

mod common;

use std::time::Duration;

use common::*;
use http_body_util::BodyExt;
use seawall_mock::{
    Count, Delay, Draws, ErrorRule, KeepAliveStyle, KeyBy, MalformedKind, MockUpstream, Profile,
};
use serde_json::{Value, json};
use tokio::time::{Instant, advance};
use tower::ServiceExt;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

// ---- rate limits ----------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn openai_rpm_limit_gives_429_with_headers_and_retry_after() {
    let up = upstream(Profile::default().rpm(2));
    let body = openai_body(false);

    let first = call(&up, openai_req(&body, "sk-a")).await;
    assert_eq!(first.status(), 200);
    let h = first.headers();
    assert_eq!(h["x-ratelimit-limit-requests"], "2");
    assert_eq!(h["x-ratelimit-remaining-requests"], "1");
    assert_eq!(h["x-ratelimit-reset-requests"], "30s");
    assert!(h["x-request-id"].to_str().unwrap().starts_with("req_"));

    let second = call(&up, openai_req(&body, "sk-a")).await;
    assert_eq!(second.status(), 200);
    assert_eq!(second.headers()["x-ratelimit-remaining-requests"], "0");
    assert_eq!(second.headers()["x-ratelimit-reset-requests"], "1m0s");

    let limited = call(&up, openai_req(&body, "sk-a")).await;
    assert_eq!(limited.status(), 429);
    let h = limited.headers().clone();
    assert_eq!(h["retry-after"], "30");
    assert_eq!(h["retry-after-ms"], "30000");
    assert_eq!(h["x-ratelimit-remaining-requests"], "0");
    assert_eq!(h["content-type"], "application/json");
    let raw = text(limited).await;
    assert!(raw.starts_with(r#"{"error":{"message":"Rate limit reached for gpt-4o-mini"#));
    let v: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    assert_eq!(v["error"]["type"], "requests");
    assert_eq!(v["error"]["param"], Value::Null);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("Limit 2, Used 2, Requested 1"), "{msg}");
    assert!(msg.contains("Please try again in 30s"), "{msg}");

    // One millisecond early is still too early; at the hinted time it is admitted.
    advance(secs(30) - ms(1)).await;
    assert_eq!(call(&up, openai_req(&body, "sk-a")).await.status(), 429);
    advance(ms(1)).await;
    assert_eq!(call(&up, openai_req(&body, "sk-a")).await.status(), 200);
    let s = up.stats();
    assert_eq!(s.rate_limited, 2);
    assert_eq!(s.status(429), 2);
    assert_eq!(s.status(200), 3);
}

#[tokio::test(start_paused = true)]
async fn openai_tpm_limit_counts_prompt_and_max_tokens() {
    let up = upstream(Profile::default().tpm(1000));
    let mut body = openai_body(false);
    body["max_tokens"] = json!(600);
    // Prompt estimate 15 + max_tokens 600 = 615 tokens.
    let first = call(&up, openai_req(&body, "sk-a")).await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["x-ratelimit-limit-tokens"], "1000");
    assert_eq!(first.headers()["x-ratelimit-remaining-tokens"], "385");
    let limited = call(&up, openai_req(&body, "sk-a")).await;
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["retry-after-ms"], "13800");
    assert_eq!(limited.headers()["retry-after"], "14");
    let v = json_body(limited).await;
    assert_eq!(v["error"]["type"], "tokens");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Please try again in 13.8s")
    );
    advance(ms(13_800)).await;
    assert_eq!(call(&up, openai_req(&body, "sk-a")).await.status(), 200);
}

#[tokio::test(start_paused = true)]
async fn a_request_over_the_whole_tpm_is_too_large_not_a_wait() {
    let up = upstream(Profile::default().tpm(1000));
    let mut body = openai_body(false);
    // Prompt estimate 15 + max_tokens 2,000: more than the minute's 1,000 tokens.
    body["max_tokens"] = json!(2000);
    let refused = call(&up, openai_req(&body, "sk-a")).await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().get("retry-after").is_none());
    assert!(refused.headers().get("retry-after-ms").is_none());
    // Nothing was charged: the bucket is still full.
    assert_eq!(refused.headers()["x-ratelimit-remaining-tokens"], "1000");
    let v = json_body(refused).await;
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("Request too large for gpt-4o"),
        "{message}"
    );
    assert!(message.contains("Limit 1000, Requested 2015"), "{message}");
    // However long the wait, the same request is refused again; a smaller one is served.
    advance(secs(120)).await;
    assert_eq!(call(&up, openai_req(&body, "sk-a")).await.status(), 429);
    body["max_tokens"] = json!(600);
    assert_eq!(call(&up, openai_req(&body, "sk-a")).await.status(), 200);
}

#[tokio::test(start_paused = true)]
async fn anthropic_rate_limit_uses_rfc3339_resets_and_its_own_error_body() {
    let up = upstream(Profile::default().rpm(1).tpm(100_000));
    let body = anthropic_body(false);
    let first = call(&up, anthropic_req(&body, "sk-ant")).await;
    assert_eq!(first.status(), 200);
    let h = first.headers();
    assert_eq!(h["anthropic-ratelimit-requests-limit"], "1");
    assert_eq!(h["anthropic-ratelimit-requests-remaining"], "0");
    // Full again 60 s after the epoch 2023-11-14T22:13:20Z.
    assert_eq!(
        h["anthropic-ratelimit-requests-reset"],
        "2023-11-14T22:14:20Z"
    );
    assert_eq!(h["anthropic-ratelimit-tokens-limit"], "100000");
    assert!(h.contains_key("anthropic-ratelimit-tokens-reset"));
    assert!(h.contains_key("request-id"));
    assert!(!h.contains_key("x-ratelimit-limit-requests"));

    let limited = call(&up, anthropic_req(&body, "sk-ant")).await;
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["retry-after"], "60");
    assert!(!limited.headers().contains_key("retry-after-ms"));
    let id = limited.headers()["request-id"].to_str().unwrap().to_owned();
    let raw = text(limited).await;
    assert!(raw.starts_with(r#"{"type":"error","error":{"type":"rate_limit_error","message":"#));
    let v: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(v["request_id"], id.as_str());
}

#[tokio::test(start_paused = true)]
async fn limits_are_per_key_and_can_be_keyed_by_model() {
    let up = upstream(Profile::default().rpm(1));
    let body = openai_body(false);
    assert_eq!(call(&up, openai_req(&body, "sk-a")).await.status(), 200);
    assert_eq!(call(&up, openai_req(&body, "sk-a")).await.status(), 429);
    assert_eq!(call(&up, openai_req(&body, "sk-b")).await.status(), 200);

    let up = upstream(Profile::default().rpm(1).key_by(KeyBy::Model));
    let mut other = openai_body(false);
    other["model"] = json!("gpt-4o");
    assert_eq!(call(&up, openai_req(&body, "sk-a")).await.status(), 200);
    assert_eq!(call(&up, openai_req(&other, "sk-a")).await.status(), 200);
    assert_eq!(call(&up, openai_req(&body, "sk-b")).await.status(), 429);

    // A per-key override.
    let up = upstream(
        Profile::default()
            .rpm(1)
            .key_limits("sk-big", seawall_mock::KeyLimits::new(Some(3), None)),
    );
    for _ in 0..3 {
        assert_eq!(call(&up, openai_req(&body, "sk-big")).await.status(), 200);
    }
    assert_eq!(call(&up, openai_req(&body, "sk-big")).await.status(), 429);
}

#[tokio::test(start_paused = true)]
async fn rate_limit_headers_are_on_every_response() {
    let up = upstream(
        Profile::default()
            .rpm(10)
            .tpm(10_000)
            .context_window(1000)
            .error(ErrorRule::random(500, 1.0).model("gpt-4o")),
    );
    let mut failing = openai_body(false);
    failing["model"] = json!("gpt-4o");
    let err = call(&up, openai_req(&failing, "sk-a")).await;
    assert_eq!(err.status(), 500);
    assert_eq!(err.headers()["x-ratelimit-remaining-requests"], "9");
    let mut long = openai_body(false);
    long["messages"][0]["content"] = json!("x".repeat(8000));
    let too_long = call(&up, openai_req(&long, "sk-a")).await;
    assert_eq!(too_long.status(), 400);
    // Rejected before admission: not charged.
    assert_eq!(too_long.headers()["x-ratelimit-remaining-requests"], "9");
    let streamed = call(&up, openai_req(&openai_body(true), "sk-a")).await;
    assert_eq!(streamed.status(), 200);
    assert_eq!(streamed.headers()["x-ratelimit-remaining-requests"], "8");
    assert_eq!(streamed.headers()["content-type"], "text/event-stream");
}

// ---- quota ------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn quota_runs_out_after_the_billed_tokens() {
    // Each answer bills 15 prompt + 16 completion tokens = 31.
    let up = upstream(Profile::default().quota_tokens(40));
    let body = openai_body(false);
    assert_eq!(call(&up, openai_req(&body, "sk-a")).await.status(), 200);
    assert_eq!(call(&up, openai_req(&body, "sk-a")).await.status(), 200);
    let broke = call(&up, openai_req(&body, "sk-a")).await;
    assert_eq!(broke.status(), 429);
    assert!(!broke.headers().contains_key("retry-after"));
    let v = json_body(broke).await;
    assert_eq!(v["error"]["code"], "insufficient_quota");
    assert_eq!(v["error"]["type"], "insufficient_quota");
    // Another key still has its quota; time does not bring it back.
    assert_eq!(call(&up, openai_req(&body, "sk-b")).await.status(), 200);
    advance(secs(3600)).await;
    assert_eq!(call(&up, openai_req(&body, "sk-a")).await.status(), 429);
    let s = up.stats();
    assert_eq!(s.quota_exhausted, 2);
    assert_eq!(s.billed_tokens(), 3 * 31);
}

#[tokio::test(start_paused = true)]
async fn an_exhausted_key_fails_at_once_in_both_formats() {
    let up = upstream(Profile::default().exhausted_key("sk-broke"));
    let v = json_body(call(&up, openai_req(&openai_body(false), "sk-broke")).await).await;
    assert_eq!(v["error"]["code"], "insufficient_quota");
    let resp = call(&up, anthropic_req(&anthropic_body(false), "sk-broke")).await;
    assert_eq!(resp.status(), 400);
    let v = json_body(resp).await;
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("credit balance is too low")
    );
    assert_eq!(
        call(&up, openai_req(&openai_body(false), "sk-fine"))
            .await
            .status(),
        200
    );
}

// ---- server errors: outages and bursts --------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn an_outage_window_starts_and_ends_on_time() {
    let up = upstream(Profile::default().error(ErrorRule::outage(503, secs(10), secs(20))));
    let body = openai_body(false);
    let status = |up: MockUpstream| {
        let body = body.clone();
        async move { call(&up, openai_req(&body, "k")).await.status() }
    };
    assert_eq!(status(up.clone()).await, 200);
    advance(secs(10) - ms(1)).await;
    assert_eq!(status(up.clone()).await, 200);
    advance(ms(1)).await;
    let down = call(&up, openai_req(&body, "k")).await;
    assert_eq!(down.status(), 503);
    let v = json_body(down).await;
    assert_eq!(v["error"]["type"], "server_error");
    advance(secs(10) - ms(1)).await;
    assert_eq!(status(up.clone()).await, 503);
    advance(ms(1)).await;
    assert_eq!(status(up.clone()).await, 200);
    assert_eq!(up.stats().server_errors, 2);
    assert_eq!(up.stats().elapsed, secs(20));
}

#[tokio::test(start_paused = true)]
async fn a_repeating_overload_window_with_retry_after_in_anthropic_format() {
    let rule = ErrorRule::outage(529, secs(10), secs(15))
        .every(secs(60))
        .retry_after(ms(1500))
        .should_retry(true);
    let up = upstream(Profile::default().error(rule));
    let body = anthropic_body(false);
    advance(secs(12)).await;
    let first = call(&up, anthropic_req(&body, "k")).await;
    assert_eq!(first.status(), 529);
    assert_eq!(first.headers()["retry-after"], "2");
    assert_eq!(first.headers()["x-should-retry"], "true");
    let v = json_body(first).await;
    assert_eq!(v["error"]["type"], "overloaded_error");
    assert_eq!(v["error"]["message"], "Overloaded");
    advance(secs(20)).await; // 32 s: between windows
    assert_eq!(call(&up, anthropic_req(&body, "k")).await.status(), 200);
    advance(secs(40)).await; // 72 s: the second window
    assert_eq!(call(&up, anthropic_req(&body, "k")).await.status(), 529);
}

#[tokio::test(start_paused = true)]
async fn random_bursts_fail_about_their_share_of_requests() {
    let up = upstream(
        Profile::default()
            .seed(3)
            .error(ErrorRule::random(500, 0.3).statuses(&[500, 502])),
    );
    let body = openai_body(false);
    for _ in 0..1000 {
        let _ = call(&up, openai_req(&body, "k")).await;
    }
    let s = up.stats();
    let failed = s.status(500) + s.status(502);
    assert_eq!(failed, s.server_errors);
    assert!((230..370).contains(&failed), "{failed}");
    assert!(s.status(500) > 80 && s.status(502) > 80, "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn an_error_rule_can_target_one_model() {
    let up = upstream(Profile::default().error(ErrorRule::random(502, 1.0).model("gpt-4o")));
    let mut big = openai_body(false);
    big["model"] = json!("gpt-4o");
    assert_eq!(call(&up, openai_req(&big, "k")).await.status(), 502);
    assert_eq!(
        call(&up, openai_req(&openai_body(false), "k"))
            .await
            .status(),
        200
    );
}

// ---- latency ----------------------------------------------------------------------------------

fn timed_profile() -> Profile {
    Profile::default()
        .head_latency(Delay::fixed(ms(50)))
        .first_token_latency(Delay::fixed(ms(400)))
        .per_token_latency(Delay::fixed(ms(10)))
}

#[tokio::test(start_paused = true)]
async fn a_stream_head_comes_first_and_its_first_token_after_the_latency() {
    let up = upstream(timed_profile());
    let t0 = Instant::now();
    let resp = call(&up, openai_req(&openai_body(true), "k")).await;
    assert_eq!(t0.elapsed(), ms(50));
    let (frames, err) = frames(resp, t0).await;
    assert!(err.is_none());
    let content: Vec<Duration> = frames
        .iter()
        .filter(|(_, f)| events(f).iter().any(Event::is_content))
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(content.len(), 16);
    assert_eq!(content[0], ms(400));
    assert_eq!(content[1], ms(410));
    assert_eq!(content[15], ms(550));
    assert_eq!(frames.last().unwrap().0, ms(550));
}

#[tokio::test(start_paused = true)]
async fn a_complete_answer_arrives_after_first_token_plus_per_token_latency() {
    let up = upstream(timed_profile());
    let t0 = Instant::now();
    let resp = call(&up, anthropic_req(&anthropic_body(false), "k")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(t0.elapsed(), ms(400 + 15 * 10));
    // Errors come at head latency.
    let up = upstream(timed_profile().error(ErrorRule::random(500, 1.0)));
    let t0 = Instant::now();
    assert_eq!(
        call(&up, anthropic_req(&anthropic_body(false), "k"))
            .await
            .status(),
        500
    );
    assert_eq!(t0.elapsed(), ms(50));
}

#[tokio::test(start_paused = true)]
async fn latency_distributions_vary_within_their_bounds() {
    let up = upstream(
        Profile::default()
            .seed(9)
            .first_token_latency(Delay::uniform(ms(100), ms(300))),
    );
    let mut seen = Vec::new();
    for _ in 0..50 {
        let t0 = Instant::now();
        let _ = call(&up, openai_req(&openai_body(false), "k")).await;
        seen.push(t0.elapsed());
    }
    assert!(seen.iter().all(|d| *d >= ms(100) && *d <= ms(300)));
    let distinct: std::collections::BTreeSet<_> = seen.iter().collect();
    assert!(distinct.len() > 40);
}

// ---- keep-alives ----------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn keepalive_comments_precede_the_first_token() {
    let up = upstream(
        Profile::default()
            .first_token_latency(Delay::fixed(ms(350)))
            .keepalives(1.0, ms(100), KeepAliveStyle::Comment),
    );
    let t0 = Instant::now();
    let resp = call(&up, openai_req(&openai_body(true), "k")).await;
    let (frames, _) = frames(resp, t0).await;
    let keepalives: Vec<Duration> = frames
        .iter()
        .take_while(|(_, f)| f == ": keep-alive\n\n")
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(keepalives, vec![ms(0), ms(100), ms(200), ms(300)]);
    let (t, first) = &frames[4];
    assert_eq!(*t, ms(350));
    let evs = events(first);
    // The role chunk carries no content; the next event does.
    assert!(!evs[0].is_content());
    assert!(evs[1].is_content());
    // No keep-alive after the first token.
    assert!(frames[5..].iter().all(|(_, f)| !f.starts_with(':')));
}

#[tokio::test(start_paused = true)]
async fn blank_lines_and_anthropic_pings_as_keepalives() {
    let up = upstream(
        Profile::default()
            .first_token_latency(Delay::fixed(ms(250)))
            .keepalives(1.0, ms(100), KeepAliveStyle::Blank),
    );
    let (frames, _) = frames(
        call(&up, openai_req(&openai_body(true), "k")).await,
        Instant::now(),
    )
    .await;
    assert_eq!(frames[0].1, "\n");
    assert_eq!(frames[2].1, "\n");
    assert!(events(&frames[3].1).iter().any(Event::is_content));

    let up = upstream(
        Profile::default()
            .first_token_latency(Delay::fixed(ms(250)))
            .keepalives(1.0, ms(100), KeepAliveStyle::Ping),
    );
    let sse = text(call(&up, anthropic_req(&anthropic_body(true), "k")).await).await;
    let names: Vec<String> = events(&sse)
        .into_iter()
        .filter_map(|e| e.event)
        .take(5)
        .collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "ping",
            "ping",
            "content_block_start"
        ]
    );
}

// ---- stream formats ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn an_openai_stream_has_deltas_a_finish_chunk_usage_and_done() {
    let up = upstream(Profile::default());
    let mut body = openai_body(true);
    body["stream_options"] = json!({"include_usage": true});
    let sse = text(call(&up, openai_req(&body, "k")).await).await;
    let evs = events(&sse);
    assert_eq!(evs.len(), 1 + 16 + 1 + 1 + 1);
    let first = evs[0].json();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(first["usage"], Value::Null);
    let answer: String = evs[1..17].iter().map(Event::openai_text).collect();
    assert_eq!(answer.split(' ').count(), 16);
    let fin = evs[17].json();
    assert_eq!(fin["choices"][0]["finish_reason"], "stop");
    let usage = evs[18].json();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 15, "completion_tokens": 16, "total_tokens": 31})
    );
    assert_eq!(evs[19].data.as_deref(), Some("[DONE]"));

    // Without include_usage there is no usage chunk, unless the profile always sends it.
    let sse = text(call(&up, openai_req(&openai_body(true), "k")).await).await;
    assert!(!sse.contains("\"usage\""));
    assert!(sse.ends_with("data: [DONE]\n\n"));
    let up = upstream(Profile::default().always_include_usage(true));
    let sse = text(call(&up, openai_req(&openai_body(true), "k")).await).await;
    assert!(sse.contains("\"completion_tokens\":16"));
}

#[tokio::test(start_paused = true)]
async fn max_tokens_truncates_with_finish_reason_length() {
    let up = upstream(Profile::default().output_tokens(Count::fixed(40)));
    let mut body = openai_body(true);
    body["max_completion_tokens"] = json!(5);
    let sse = text(call(&up, openai_req(&body, "k")).await).await;
    let evs = events(&sse);
    assert_eq!(evs.iter().filter(|e| e.is_content()).count(), 5);
    assert!(sse.contains("\"finish_reason\":\"length\""));

    let mut body = anthropic_body(false);
    body["max_tokens"] = json!(5);
    let v = json_body(call(&up, anthropic_req(&body, "k")).await).await;
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["output_tokens"], 5);
}

#[tokio::test(start_paused = true)]
async fn an_anthropic_stream_has_the_full_event_sequence() {
    let up = upstream(Profile::default().output_tokens(Count::fixed(3)));
    let sse = text(call(&up, anthropic_req(&anthropic_body(true), "k")).await).await;
    let evs = events(&sse);
    let names: Vec<&str> = evs.iter().map(|e| e.event.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    for e in &evs {
        assert_eq!(e.json()["type"], e.event.as_deref().unwrap());
    }
    assert_eq!(evs[0].json()["message"]["usage"]["input_tokens"], 15);
    let delta = evs[6].json();
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 3);
}

#[tokio::test(start_paused = true)]
async fn complete_answers_in_both_formats() {
    let up = upstream(Profile::default().output_tokens(Count::fixed(4)));
    let v = json_body(call(&up, openai_req(&openai_body(false), "k")).await).await;
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "gpt-4o-mini");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .split(' ')
            .count(),
        4
    );
    assert_eq!(v["usage"]["total_tokens"], 19);
    assert_eq!(v["created"], EPOCH_SECS);
    let v = json_body(call(&up, anthropic_req(&anthropic_body(false), "k")).await).await;
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["type"], "text");
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["usage"], json!({"input_tokens": 15, "output_tokens": 4}));
}

// ---- cut streams and mid-stream errors --------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_cut_stream_has_no_finish_marker() {
    let up = upstream(Profile::default().cut_streams(1.0, Count::fixed(3), false));
    let resp = call(&up, openai_req(&openai_body(true), "k")).await;
    assert_eq!(resp.status(), 200);
    let (frames, err) = frames(resp, Instant::now()).await;
    assert!(err.is_none(), "a clean EOF");
    let sse: String = frames.into_iter().map(|(_, f)| f).collect();
    let evs = events(&sse);
    assert_eq!(evs.iter().filter(|e| e.is_content()).count(), 3);
    assert!(!sse.contains("[DONE]"));
    assert!(
        evs.iter()
            .all(|e| e.json()["choices"][0]["finish_reason"].is_null())
    );

    let sse = text(call(&up, anthropic_req(&anthropic_body(true), "k")).await).await;
    assert!(!sse.contains("message_stop"));
    assert!(!sse.contains("message_delta"));
    assert_eq!(sse.matches("content_block_delta").count(), 3 * 2);

    let s = up.stats();
    assert_eq!(s.streams_cut, 2);
    assert_eq!(s.streams_completed, 0);
    assert_eq!(s.output_tokens, 6, "partial streams are billed");
    assert_eq!(s.wasted_output_tokens, 6);
    assert_eq!(s.wasted_input_tokens, 30);
}

#[tokio::test(start_paused = true)]
async fn an_aborted_stream_ends_with_a_body_error() {
    let up = upstream(Profile::default().cut_streams(1.0, Count::fixed(2), true));
    let resp = call(&up, openai_req(&openai_body(true), "k")).await;
    let (frames, err) = frames(resp, Instant::now()).await;
    let err = err.expect("the body fails");
    assert_eq!(err.sent_tokens(), 2);
    assert!(err.to_string().contains("reset"));
    let sse: String = frames.into_iter().map(|(_, f)| f).collect();
    assert_eq!(events(&sse).iter().filter(|e| e.is_content()).count(), 2);
}

#[tokio::test(start_paused = true)]
async fn anthropic_mid_stream_overload_after_a_200() {
    let up = upstream(Profile::default().mid_stream_errors(1.0, Count::fixed(2)));
    let resp = call(&up, anthropic_req(&anthropic_body(true), "k")).await;
    assert_eq!(resp.status(), 200);
    let sse = text(resp).await;
    let evs = events(&sse);
    let last = evs.last().unwrap();
    assert_eq!(last.event.as_deref(), Some("error"));
    assert_eq!(
        last.json(),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    );
    assert_eq!(evs.iter().filter(|e| e.is_content()).count(), 2);
    assert!(!sse.contains("message_stop"));

    // Before any content: still after the 200, but before the commit point.
    let up = upstream(Profile::default().mid_stream_errors(1.0, Count::fixed(0)));
    let sse = text(call(&up, anthropic_req(&anthropic_body(true), "k")).await).await;
    let names: Vec<String> = events(&sse).into_iter().filter_map(|e| e.event).collect();
    assert_eq!(names, ["message_start", "error"]);

    // OpenAI's shape of the same thing.
    let sse = text(call(&up, openai_req(&openai_body(true), "k")).await).await;
    let evs = events(&sse);
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].json()["error"]["type"], "server_error");
    assert_eq!(up.stats().streams_errored, 2);
}

// ---- context length, malformed bodies, bad requests -------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_prompt_above_the_window_gets_a_context_length_error() {
    let up = upstream(
        Profile::default()
            .context_window(10)
            .model_context_window("gpt-4o", 100_000),
    );
    let resp = call(&up, openai_req(&openai_body(false), "k")).await;
    assert_eq!(resp.status(), 400);
    let v = json_body(resp).await;
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["param"], "messages");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("maximum context length is 10 tokens"), "{msg}");
    assert!(msg.contains("resulted in 15 tokens"), "{msg}");

    let v = json_body(call(&up, anthropic_req(&anthropic_body(false), "k")).await).await;
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(
        v["error"]["message"],
        "prompt is too long: 15 tokens > 10 maximum"
    );

    let mut big = openai_body(false);
    big["model"] = json!("gpt-4o");
    assert_eq!(call(&up, openai_req(&big, "k")).await.status(), 200);
    assert_eq!(up.stats().context_length, 2);
    assert_eq!(up.stats().billed_tokens(), 31, "rejections are free");
}

#[tokio::test(start_paused = true)]
async fn malformed_bodies_html_502_and_truncated_json() {
    let up = upstream(Profile::default().malformed(1.0, &[MalformedKind::Html502]));
    let resp = call(&up, openai_req(&openai_body(false), "k")).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(resp.headers()["content-type"], "text/html");
    let html = text(resp).await;
    assert!(html.contains("<title>502 Bad Gateway</title>"));

    let up = upstream(Profile::default().malformed(1.0, &[MalformedKind::TruncatedJson]));
    let resp = call(&up, openai_req(&openai_body(false), "k")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body = text(resp).await;
    assert!(body.starts_with(r#"{"id":"chatcmpl-"#));
    assert!(serde_json::from_str::<Value>(&body).is_err());
    let resp = call(&up, anthropic_req(&anthropic_body(true), "k")).await;
    assert_eq!(resp.status(), 200);
    let sse = text(resp).await;
    assert!(sse.starts_with("event: message_start\ndata: {"));
    assert!(!sse.ends_with("\n\n"));
    let s = up.stats();
    assert_eq!(s.malformed, 2);
    assert_eq!(s.wasted_input_tokens, 30);
    assert_eq!(s.wasted_output_tokens, 16);
}

#[tokio::test(start_paused = true)]
async fn error_objects_in_a_200_in_both_formats_whole_and_streamed() {
    let up = upstream(Profile::default().malformed(1.0, &[MalformedKind::Error200]));
    let resp = call(&up, openai_req(&openai_body(false), "k")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], 503);
    let resp = call(&up, anthropic_req(&anthropic_body(false), "k")).await;
    let body = json_body(resp).await;
    assert_eq!(body["error"]["type"], "overloaded_error");

    let resp = call(&up, openai_req(&openai_body(true), "k")).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let sse = text(resp).await;
    let first = &events(&sse)[0];
    assert_eq!(first.json()["error"]["code"], 503);
    let resp = call(&up, anthropic_req(&anthropic_body(true), "k")).await;
    let sse = text(resp).await;
    assert!(sse.starts_with("event: error\ndata: {"));
    let s = up.stats();
    assert_eq!(s.malformed, 4);
    assert_eq!(s.billed_tokens(), 0, "an error object is not billed");
}

#[tokio::test(start_paused = true)]
async fn empty_answers_in_both_formats_whole_and_streamed() {
    let up = upstream(Profile::default().malformed(1.0, &[MalformedKind::Empty]));
    let body = json_body(call(&up, openai_req(&openai_body(false), "k")).await).await;
    assert_eq!(body["choices"][0]["message"]["content"], "");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let body = json_body(call(&up, anthropic_req(&anthropic_body(false), "k")).await).await;
    assert_eq!(body["content"], json!([]));
    assert_eq!(body["stop_reason"], "end_turn");

    for req in [
        openai_req(&openai_body(true), "k"),
        anthropic_req(&anthropic_body(true), "k"),
    ] {
        let sse = text(call(&up, req).await).await;
        let evs = events(&sse);
        assert!(evs.iter().all(|e| !e.is_content()), "{sse}");
        assert!(sse.ends_with("data: [DONE]\n\n") || sse.ends_with("\"message_stop\"}\n\n"));
    }
    let s = up.stats();
    assert_eq!(s.malformed, 4);
    assert_eq!(s.wasted_output_tokens, 0);
    assert!(s.wasted_input_tokens > 0, "the prompt is billed");
}

#[tokio::test(start_paused = true)]
async fn bad_requests_get_the_providers_client_errors() {
    let up = upstream(Profile::default().invalid_key("sk-revoked"));
    let get = http::Request::get("http://mock/v1/chat/completions")
        .body(bytes::Bytes::new())
        .unwrap();
    assert_eq!(call(&up, get).await.status(), 405);
    let nowhere = http::Request::post("http://mock/v1/nothing")
        .body(bytes::Bytes::new())
        .unwrap();
    assert_eq!(call(&up, nowhere).await.status(), 404);
    let bad = http::Request::post("http://mock/v1/chat/completions")
        .body(bytes::Bytes::from_static(b"{oops"))
        .unwrap();
    let resp = call(&up, bad).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(
        json_body(resp).await["error"]["type"],
        "invalid_request_error"
    );
    let mut no_max = anthropic_body(false);
    no_max.as_object_mut().unwrap().remove("max_tokens");
    let v = json_body(call(&up, anthropic_req(&no_max, "k")).await).await;
    assert_eq!(v["error"]["message"], "max_tokens: Field required");
    let resp = call(&up, openai_req(&openai_body(false), "sk-revoked")).await;
    assert_eq!(resp.status(), 401);
    let body = text(resp).await;
    assert!(body.contains("invalid_api_key"));
    assert!(!body.contains("sk-revoked"), "keys never echoed");
    let resp = call(&up, anthropic_req(&anthropic_body(false), "sk-revoked")).await;
    assert_eq!(
        json_body(resp).await["error"]["type"],
        "authentication_error"
    );
    assert_eq!(up.stats().rejected, 6);
    assert_eq!(up.stats().billed_tokens(), 0);
}

// ---- billing and abandonment ------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn stats_bill_partial_and_abandoned_answers() {
    let up = upstream(timed_profile());
    // A complete answer: 15 + 16.
    let _ = text(call(&up, openai_req(&openai_body(false), "k")).await).await;
    // A stream dropped after two tokens: billed 15 + 2, all wasted.
    let resp = call(&up, openai_req(&openai_body(true), "k")).await;
    let mut body = resp.into_body();
    let mut tokens = 0;
    while tokens < 2 {
        let f = body.frame().await.unwrap().unwrap();
        let chunk = String::from_utf8(f.into_data().unwrap().to_vec()).unwrap();
        tokens += events(&chunk).iter().filter(|e| e.is_content()).count();
    }
    drop(body);
    // A complete answer whose caller gave up before it arrived: billed in full, wasted.
    let pending = up.respond(openai_req(&openai_body(false), "k"));
    let gave_up = tokio::time::timeout(ms(100), pending).await;
    assert!(gave_up.is_err());

    let s = up.stats();
    assert_eq!(s.requests, 3);
    assert_eq!(s.ok, 3);
    assert_eq!(s.streams_started, 1);
    assert_eq!(s.abandoned, 2);
    assert_eq!(s.input_tokens, 45);
    assert_eq!(s.output_tokens, 16 + 2 + 16);
    assert_eq!(s.wasted_input_tokens, 30);
    assert_eq!(s.wasted_output_tokens, 2 + 16);
    assert_eq!(s.wasted_tokens(), 48);
}

#[tokio::test(start_paused = true)]
async fn the_service_front_end_works_with_tower() {
    let up = upstream(Profile::default());
    let resp = up
        .clone()
        .oneshot(openai_req(&openai_body(false), "k"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Clones share state.
    assert_eq!(up.stats().requests, 1);
}

// ---- determinism and a storm ------------------------------------------------------------------

type Run = Vec<(u16, Vec<(Duration, String)>, bool)>;

async fn storm_run(seed: u64) -> (Run, seawall_mock::Stats) {
    let profile = Profile::builtin("storm").unwrap().seed(seed).rpm(10);
    let up = upstream(profile);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..120u64 {
        tokio::time::sleep(ms(400)).await;
        let key = format!("sk-{}", i % 3);
        let req = match i % 4 {
            0 => openai_req(&openai_body(false), &key),
            1 => openai_req(&openai_body(true), &key),
            2 => anthropic_req(&anthropic_body(false), &key),
            _ => anthropic_req(&anthropic_body(true), &key),
        };
        let fut = up.respond(req);
        tasks.push(tokio::spawn(async move {
            let resp = fut.await.unwrap();
            let status = resp.status().as_u16();
            let (frames, err) = frames(resp, t0).await;
            (status, frames, err.is_some())
        }));
    }
    let mut run = Vec::new();
    for t in tasks {
        run.push(t.await.unwrap());
    }
    (run, up.stats())
}

#[tokio::test(start_paused = true)]
async fn a_fixed_seed_gives_the_same_run() {
    let (a, stats_a) = storm_run(77).await;
    let (b, stats_b) = storm_run(77).await;
    assert!(a == b, "same seed, same statuses, bytes and timings");
    assert_eq!(stats_a, stats_b);
    // The run is worth comparing: it met limits, the outage and healthy answers.
    assert!(stats_a.rate_limited > 0, "{stats_a:?}");
    assert!(stats_a.server_errors > 0, "{stats_a:?}");
    assert!(stats_a.ok > 30, "{stats_a:?}");
    let (c, _) = storm_run(78).await;
    assert!(a != c, "another seed, another run");
}

#[tokio::test(start_paused = true)]
async fn a_storm_of_3000_requests_from_200_clients_in_virtual_time() {
    let up = upstream(Profile::builtin("storm").unwrap());
    let mut clients = Vec::new();
    for c in 0..200u32 {
        let up = up.clone();
        clients.push(tokio::spawn(async move {
            let key = format!("sk-{}", c % 4);
            for i in 0..15u32 {
                let req = if (c + i) % 2 == 0 {
                    openai_req(&openai_body((c + i) % 3 == 0), &key)
                } else {
                    anthropic_req(&anthropic_body((c + i) % 3 == 0), &key)
                };
                let resp = call(&up, req).await;
                let mut body = resp.into_body();
                while let Some(Ok(_)) = body.frame().await {}
                tokio::time::sleep(ms(200)).await;
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    let s = up.stats();
    assert_eq!(s.requests, 3000);
    let outcomes = s.ok
        + s.rate_limited
        + s.quota_exhausted
        + s.context_length
        + s.server_errors
        + s.malformed
        + s.rejected;
    assert_eq!(outcomes, 3000);
    assert_eq!(s.by_status.iter().map(|(_, n)| n).sum::<u64>(), 3000);
    assert_eq!(
        s.streams_started,
        s.streams_completed + s.streams_cut + s.streams_errored + s.abandoned
    );
    assert!(s.rate_limited > 0 && s.server_errors > 0 && s.streams_cut > 0);
    assert!(s.wasted_tokens() > 0 && s.wasted_tokens() < s.billed_tokens());
    assert!(s.elapsed > secs(30), "{:?}", s.elapsed);
}

// ---- billing ----------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn usage_and_billing_count_every_one_of_n_answers() {
    let up = upstream(Profile::default().output_tokens(Count::fixed(10)));
    let mut body = openai_body(false);
    body["n"] = json!(3);
    let v = json_body(call(&up, openai_req(&body, "sk-a")).await).await;
    assert_eq!(v["usage"]["completion_tokens"], 30);
    assert_eq!(up.stats().output_tokens, 30);

    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let sse = text(call(&up, openai_req(&body, "sk-a")).await).await;
    let usage = events(&sse)
        .iter()
        .filter(|e| e.data.as_deref().is_some_and(|d| d != "[DONE]"))
        .map(Event::json)
        .find(|j| j["usage"].is_object())
        .unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 30);
    assert_eq!(up.stats().output_tokens, 60);
}

#[tokio::test(start_paused = true)]
async fn embeddings_are_deterministic_vectors_and_honour_the_server_errors() {
    let up = upstream(Profile::default().error(ErrorRule::outage(
        503,
        Duration::from_secs(10),
        Duration::from_secs(20),
    )));
    let ask = |input: &str| {
        http::Request::post("http://mock/v1/embeddings")
            .header("authorization", "Bearer sk-test")
            .body(bytes::Bytes::from(
                json!({"model": "text-embedding-3-small", "input": input, "dimensions": 8})
                    .to_string(),
            ))
            .unwrap()
    };
    let resp = call(&up, ask("hello")).await;
    assert_eq!(resp.status(), 200);
    let v = json_body(resp).await;
    let first = v["data"][0]["embedding"].clone();
    assert_eq!(first.as_array().unwrap().len(), 8);
    assert_eq!(v["model"], "text-embedding-3-small");
    let again = json_body(call(&up, ask("hello")).await).await;
    assert_eq!(again["data"][0]["embedding"], first);
    let other = json_body(call(&up, ask("goodbye")).await).await;
    assert_ne!(other["data"][0]["embedding"], first);
    // The outage window takes the embeddings endpoint down too.
    advance(Duration::from_secs(12)).await;
    assert_eq!(call(&up, ask("hello")).await.status(), 503);
    let no_input = http::Request::post("http://mock/v1/embeddings")
        .body(bytes::Bytes::from_static(br#"{"model":"e"}"#))
        .unwrap();
    assert_eq!(call(&up, no_input).await.status(), 400);
}

// ---- where the draws come from ---------------------------------------------------------------

/// A profile whose draws show: answers of 1-300 words, half the streams cut.
fn varied(draws: Draws) -> Profile {
    Profile::default()
        .seed(5)
        .draws(draws)
        .output_tokens(Count::range(1, 300))
        .cut_streams(0.5, Count::range(1, 50), false)
}

fn prompt(i: usize) -> Value {
    json!({"model": "gpt-4o-mini", "stream": true,
           "messages": [{"role": "user", "content": format!("question {i}")}]})
}

/// The text a streamed answer delivered, and whether it ended with its marker.
async fn delivered(up: &MockUpstream, body: &Value) -> (String, bool) {
    let sse = text(call(up, openai_req(body, "sk-test")).await).await;
    let words = events(&sse)
        .iter()
        .filter(|e| e.is_content())
        .map(Event::openai_text)
        .collect();
    (words, sse.contains("[DONE]"))
}

/// Ten prompts sent to a fresh upstream in one order, and to another in reverse after a call
/// of its own, with an option (`stream_options`) the first client did not send.
async fn both_orders(draws: Draws) -> (Vec<(String, bool)>, Vec<(String, bool)>) {
    let (a, b) = (upstream(varied(draws)), upstream(varied(draws)));
    let mut first = Vec::new();
    for i in 0..10 {
        first.push(delivered(&a, &prompt(i)).await);
    }
    delivered(&b, &prompt(99)).await;
    let mut second = vec![(String::new(), false); 10];
    for i in (0..10).rev() {
        let mut body = prompt(i);
        body["stream_options"] = json!({"include_usage": true});
        second[i] = delivered(&b, &body).await;
    }
    (first, second)
}

#[tokio::test(start_paused = true)]
async fn drawn_by_request_the_same_call_meets_the_same_answer_and_faults_in_any_order() {
    let (first, second) = both_orders(Draws::Request).await;
    assert_eq!(first, second);
    // The profile's faults did show: some streams cut, some whole.
    assert!(first.iter().any(|(_, done)| *done) && first.iter().any(|(_, done)| !*done));
    // By arrival (the default), the order and the extra call shift every draw.
    let (first, second) = both_orders(Draws::Arrival).await;
    assert_ne!(first, second);
}

#[tokio::test(start_paused = true)]
async fn drawn_by_request_a_retry_draws_afresh_and_the_same_for_every_client() {
    let (a, b) = (
        upstream(varied(Draws::Request)),
        upstream(varied(Draws::Request)),
    );
    let (mut on_a, mut on_b) = (Vec::new(), Vec::new());
    for _ in 0..6 {
        on_a.push(delivered(&a, &prompt(1)).await);
    }
    delivered(&b, &prompt(2)).await;
    for _ in 0..6 {
        on_b.push(delivered(&b, &prompt(1)).await);
    }
    assert_eq!(on_a, on_b);
    assert!(on_a.iter().any(|x| *x != on_a[0]), "{on_a:?}");
}

#[tokio::test(start_paused = true)]
async fn drawn_by_request_a_prompts_first_stream_is_cut_alike_at_two_providers() {
    // Same seed, other models and rates; the second also fails half its calls with a 503.
    let cuts = |p: f64| {
        Profile::default()
            .seed(5)
            .draws(Draws::Request)
            .output_tokens(Count::range(60, 300))
            .cut_streams(p, Count::range(1, 50), false)
    };
    let (a, b) = (
        upstream(cuts(0.3)),
        upstream(cuts(0.6).error(ErrorRule::random(503, 0.5))),
    );
    let (mut cut_a, mut cut_b, mut errors) = (Vec::new(), Vec::new(), 0);
    for i in 0..40 {
        cut_a.push(!delivered(&a, &prompt(i)).await.1);
        let mut body = prompt(i);
        body["model"] = json!("backup-model");
        loop {
            let resp = call(&b, openai_req(&body, "sk-test")).await;
            if resp.status() == 200 {
                cut_b.push(!text(resp).await.contains("[DONE]"));
                break;
            }
            errors += 1;
        }
    }
    assert!(errors > 0);
    let (n_a, n_b) = (
        cut_a.iter().filter(|c| **c).count(),
        cut_b.iter().filter(|c| **c).count(),
    );
    assert!(n_a > 0 && n_b > n_a, "{n_a} {n_b}");
    // Every prompt whose stream was cut at the lower rate was cut at the higher one too.
    assert!(cut_a.iter().zip(&cut_b).all(|(a, b)| !a || *b));
}

#[tokio::test(start_paused = true)]
async fn an_openai_path_is_answered_as_openai_even_with_an_anthropic_version_header() {
    let up = upstream(Profile::default());
    // An OpenAI path is answered as OpenAI answers, whatever headers ride along.
    let mut req = openai_req(&openai_body(false), "sk-a");
    req.headers_mut()
        .insert("anthropic-version", "2023-06-01".parse().unwrap());
    let answer = json_body(call(&up, req).await).await;
    assert_eq!(answer["object"], "chat.completion", "{answer}");
}
