//! The gateway example as a client sees it, over loopback: its app and stacks run against the
//! `seawall-mock` upstream (which speaks both the OpenAI and the Anthropic API), both on free
//! `127.0.0.1` ports, and the test talks HTTP to it.

#[path = "../examples/gateway.rs"]
#[allow(dead_code)] // `main` and the chaos profile are the example's own.
mod gateway;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use gateway::{ClientKeys, MAX_REQUEST_BODY, Settings};
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use seawall::mock::{Count, Delay, ErrorRule, MockUpstream, Profile};
use seawall_test_support::global_log;
use serde_json::Value;
use tokio::net::TcpListener;

const UPSTREAM_KEY: &str = "sk-proj-UpstreamKeyOfTheGateway0123456789";
const CLIENT_KEYS: &str = "client-key-one, client-key-two";

/// Far longer than any test needs: reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(30);

async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("the test hung: no outcome within its time limit")
}

fn settings(keys: &str, allow_unpriced: bool) -> Settings {
    Settings {
        addr: "127.0.0.1:0".to_owned(),
        keys: ClientKeys::parse(keys),
        fallback_model: "gpt-4o-mini".to_owned(),
        anthropic_fallback_model: "claude-haiku-4-5".to_owned(),
        allow_unpriced,
        cache_ttl: None,
    }
}

/// Headers a real provider sends that name the account behind the gateway.
async fn with_org_headers(mut resp: axum::response::Response) -> axum::response::Response {
    let h = resp.headers_mut();
    for (name, value) in [
        ("openai-organization", "org-GatewayOwnerOrg"),
        ("openai-project", "proj_GatewayOwnerProject"),
        ("openai-processing-ms", "42"),
        ("x-ratelimit-limit-requests", "10000"),
        ("x-ratelimit-remaining-tokens", "149984"),
        ("anthropic-ratelimit-requests-limit", "4000"),
        ("anthropic-organization-id", "a1b2c3d4-org"),
        ("x-request-id", "req_upstream123"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    resp
}

struct Running {
    gateway: SocketAddr,
    upstream: MockUpstream,
}

/// The mock upstream and the gateway in front of it, each on a free loopback port, serving
/// both APIs.
async fn start(profile: Profile, settings: Settings) -> Running {
    start_serving(profile, settings, Apis::Both).await
}

/// Which of its two APIs the gateway has an upstream for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Apis {
    Both,
    OpenAiOnly,
}

async fn start_serving(profile: Profile, settings: Settings, apis: Apis) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = listener.local_addr().unwrap();
    let upstream = MockUpstream::new(profile);
    let router = seawall::mock::router(upstream.clone())
        .layer(axum::middleware::map_response(with_org_headers));
    tokio::spawn(async move { axum::serve(listener, router).await });

    let (openai, anthropic) = gateway::mock_upstreams(upstream_addr, UPSTREAM_KEY).unwrap();
    let anthropic = (apis == Apis::Both).then_some(anthropic);
    let providers = gateway::Providers::new(Some(openai), anthropic, &settings).unwrap();
    let listener = gateway::bind(&settings.addr, &settings.keys).await.unwrap();
    let gateway = listener.local_addr().unwrap();
    let app = gateway::app(providers, settings.keys);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Running { gateway, upstream }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// `POST /v1/chat/completions`.
async fn post(to: SocketAddr, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Answer {
    call(to, "POST", "/v1/chat/completions", headers, body.into()).await
}

/// `POST /v1/messages`, as the Anthropic SDK sends it (with `anthropic-version`).
async fn post_messages(to: SocketAddr, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Answer {
    let mut all = vec![("anthropic-version", "2023-06-01")];
    all.extend_from_slice(headers);
    call(to, "POST", "/v1/messages", &all, body.into()).await
}

async fn get(to: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    call(to, "GET", path, headers, Bytes::new()).await
}

async fn call(
    to: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Answer {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("http://{to}{path}"))
        .header("content-type", "application/json");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = bounded(client.request(req.body(Full::new(body)).unwrap()))
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    let body = bounded(body.collect()).await.unwrap().to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

fn chat(model: &str) -> String {
    serde_json::json!({
        "model": model,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Hello!"}],
    })
    .to_string()
}

#[tokio::test]
async fn requests_need_one_of_the_client_keys() {
    global_log();
    let run = start(Profile::default(), settings(CLIENT_KEYS, false)).await;
    let missing = post(run.gateway, &[], chat("gpt-4o")).await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED, "{}", missing.body);
    assert_eq!(missing.json()["error"]["code"], "invalid_api_key");
    assert_eq!(missing.headers["www-authenticate"], "Bearer");
    for wrong in [
        ("authorization", "Bearer client-key-on"),
        ("authorization", "Bearer client-key-one-and-more"),
        ("authorization", "Basic client-key-one"),
        ("x-api-key", "client-key-three"),
        ("authorization", UPSTREAM_KEY),
    ] {
        let a = post(run.gateway, &[wrong], chat("gpt-4o")).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{wrong:?}: {}", a.body);
    }
    assert_eq!(
        run.upstream.stats().requests,
        0,
        "refused calls never reach the upstream"
    );

    for right in [
        ("authorization", "Bearer client-key-one"),
        ("authorization", "bearer client-key-two"),
        ("x-api-key", "client-key-two"),
    ] {
        let a = post(run.gateway, &[right], chat("gpt-4o")).await;
        assert_eq!(a.status, StatusCode::OK, "{right:?}: {}", a.body);
    }
    assert_eq!(run.upstream.stats().requests, 3);
}

#[tokio::test]
async fn without_keys_the_gateway_serves_loopback_only() {
    global_log();
    let none = ClientKeys::parse(" , ");
    assert!(none.is_empty());
    let err = gateway::bind("0.0.0.0:0", &none).await.unwrap_err();
    assert!(err.to_string().contains("GATEWAY_KEYS"), "{err}");
    assert!(gateway::bind("[::]:0", &none).await.is_err());
    let open: SocketAddr = "192.0.2.7:8080".parse().unwrap();
    assert!(gateway::check_exposure(&[open], &none).is_err());
    assert!(gateway::check_exposure(&[open], &ClientKeys::parse(CLIENT_KEYS)).is_ok());

    // Loopback without keys serves anyone on the machine, and the banner says so.
    let run = start(Profile::default(), settings("", false)).await;
    assert_eq!(
        post(run.gateway, &[], chat("gpt-4o")).await.status,
        StatusCode::OK
    );
    let banner = gateway::banner(run.gateway, "mock", &settings("", false));
    assert!(banner.contains("loopback only"), "{banner}");
}

#[tokio::test]
async fn the_banner_and_debug_never_show_client_keys() {
    global_log();
    let s = settings(CLIENT_KEYS, false);
    let banner = gateway::banner("127.0.0.1:8080".parse().unwrap(), "mock", &s);
    let debug = format!("{s:?}");
    for shown in [&banner, &debug] {
        assert!(!shown.contains("client-key-"), "{shown}");
    }
    assert!(banner.contains("client keys: 2"), "{banner}");
    assert!(banner.contains("$GATEWAY_KEY"), "{banner}");
    for route in ["/v1/chat/completions", "/v1/messages", "/v1/models"] {
        assert!(banner.contains(route), "{route} missing from {banner}");
    }
}

#[tokio::test]
async fn upstream_rate_limit_and_organisation_headers_stay_behind() {
    global_log();
    let run = start(Profile::default(), settings("", false)).await;
    for body in [
        chat("gpt-4o"),
        chat("gpt-4o").replace("\"max_tokens\"", "\"stream\":true,\"max_tokens\""),
    ] {
        let a = post(run.gateway, &[], body).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        let names: Vec<&str> = a.headers.keys().map(|n| n.as_str()).collect();
        for name in &names {
            assert!(
                !name.starts_with("x-ratelimit-")
                    && !name.starts_with("anthropic-")
                    && !name.starts_with("openai-")
                    && !name.ends_with("request-id"),
                "{name} reached the client: {names:?}"
            );
        }
        assert!(a.headers.contains_key("x-seawall-served-by"), "{names:?}");
        assert!(a.headers.contains_key("content-type"), "{names:?}");
    }
}

#[tokio::test]
async fn budget_refusals_tell_the_client_nothing_of_the_limit() {
    let log = global_log();

    let run = start(Profile::default(), settings("", false)).await;
    // 10M output tokens of gpt-4o cost $100, past the $5 daily budget.
    let a = post(
        run.gateway,
        &[],
        chat("gpt-4o").replace("\"max_tokens\":16", "\"max_tokens\":10000000"),
    )
    .await;
    assert_eq!(a.status, StatusCode::PAYMENT_REQUIRED, "{}", a.body);
    assert_eq!(
        a.json()["error"]["message"],
        "The spending limit of this gateway has been reached."
    );
    for detail in [
        "$",
        "daily",
        "would be exceeded",
        "spent",
        "reserved",
        "budget_exceeded (",
        "\"code\":\"budget",
    ] {
        assert!(!a.body.contains(detail), "{detail:?} in {}", a.body);
    }
    let logged = log.text();
    assert!(logged.contains("budget \"daily\""), "{logged}");
    assert!(logged.contains("limit $5.00"), "{logged}");
    assert_eq!(run.upstream.stats().requests, 0);
}

#[tokio::test]
async fn upstream_errors_reach_the_client_as_a_class_level_message() {
    global_log();
    // The upstream refuses the gateway's own key with its usual explanation.
    let profile = Profile::default().invalid_key(UPSTREAM_KEY);
    let run = start(profile, settings("", false)).await;
    let a = post(run.gateway, &[], chat("gpt-4o")).await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{}", a.body);
    assert_eq!(a.json()["error"]["message"], "The upstream service failed.");
    assert_eq!(a.json()["error"]["type"], "authentication");
    assert!(a.json()["error"]["code"].is_null(), "{}", a.body);
    for detail in [
        "Incorrect",
        "invalid_api_key",
        "platform.openai.com",
        "gpt-4o-mini",
    ] {
        assert!(!a.body.contains(detail), "{detail:?} in {}", a.body);
    }
    assert!(run.upstream.stats().requests > 0);
}

#[tokio::test]
async fn the_callers_timeout_header_bounds_the_gateways_wait() {
    global_log();
    // The upstream would answer after 10 s; the caller's SDK says it waits 0.4 s.
    let profile = Profile::default().head_latency(Delay::fixed(Duration::from_secs(10)));
    let run = start(profile, settings("", false)).await;
    let started = std::time::Instant::now();
    let a = post(
        run.gateway,
        &[("x-stainless-timeout", "0.4")],
        chat("gpt-4o"),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT, "{}", a.body);
    assert_eq!(a.json()["error"]["type"], "deadline_exceeded", "{}", a.body);
    assert!(
        took < Duration::from_secs(5),
        "the gateway kept working for {took:?} after its caller stopped waiting"
    );
    // No second attempt and no fallback were started past the deadline.
    assert_eq!(run.upstream.stats().requests, 1);
}

#[tokio::test]
async fn request_bodies_over_the_cap_are_refused_with_413() {
    global_log();
    let run = start(Profile::default(), settings("", false)).await;
    let padding = " ".repeat(MAX_REQUEST_BODY);
    let big = chat("gpt-4o").replacen('{', &format!("{{{padding}"), 1);
    assert!(big.len() > MAX_REQUEST_BODY);
    let a = post(run.gateway, &[], big).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", a.body);
    assert_eq!(run.upstream.stats().requests, 0);

    // Just under the cap still goes through.
    let padding = " ".repeat(MAX_REQUEST_BODY - chat("gpt-4o").len());
    let fits = chat("gpt-4o").replacen('{', &format!("{{{padding}"), 1);
    assert_eq!(fits.len(), MAX_REQUEST_BODY);
    assert_eq!(post(run.gateway, &[], fits).await.status, StatusCode::OK);
}

#[tokio::test]
async fn unpriced_models_are_refused_unless_allowed() {
    global_log();
    let run = start(Profile::default(), settings("", false)).await;
    let a = post(run.gateway, &[], chat("o1-pro")).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    assert_eq!(a.json()["error"]["code"], "model_not_available");
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no price")),
        "{}",
        a.body
    );
    assert_eq!(run.upstream.stats().requests, 0, "nothing spent");

    let run = start(Profile::default(), settings("", true)).await;
    let a = post(run.gateway, &[], chat("o1-pro")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(run.upstream.stats().requests, 1);
}

#[tokio::test]
async fn a_stream_that_fails_mid_way_ends_with_a_class_level_error_event() {
    global_log();
    let profile = Profile::default()
        .output_tokens(Count::fixed(20))
        .mid_stream_errors(1.0, Count::fixed(3));
    let run = start(profile, settings("", false)).await;
    let a = post(
        run.gateway,
        &[],
        chat("gpt-4o").replace("\"max_tokens\"", "\"stream\":true,\"max_tokens\""),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let last = a
        .body
        .trim_end()
        .rsplit("\n\n")
        .next()
        .unwrap_or_default()
        .to_owned();
    let event: Value = serde_json::from_str(last.trim_start_matches("data: ")).unwrap_or_default();
    assert_eq!(
        event["error"]["type"], "stream_interrupted",
        "last event: {last}"
    );
    assert_eq!(event["error"]["message"], "The upstream service failed.");
}

/// An Anthropic Messages request.
fn message(model: &str, stream: bool) -> String {
    serde_json::json!({
        "model": model,
        "max_tokens": 16,
        "stream": stream,
        "messages": [{"role": "user", "content": "Hello!"}],
    })
    .to_string()
}

/// The `event:` names of an SSE body, in order.
fn event_types(sse: &str) -> Vec<&str> {
    sse.lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect()
}

#[tokio::test]
async fn models_are_listed_in_the_format_of_the_client_that_asks() {
    global_log();
    let run = start(Profile::default(), settings("", false)).await;

    let openai = get(run.gateway, "/v1/models", &[]).await;
    assert_eq!(openai.status, StatusCode::OK, "{}", openai.body);
    let list = openai.json();
    assert_eq!(list["object"], "list", "{}", openai.body);
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["object"], "model", "{m}");
            assert!(m["created"].is_u64() && m["owned_by"].is_string(), "{m}");
            m["id"].as_str().unwrap()
        })
        .collect();
    assert_eq!(ids, ["gpt-4o", "gpt-4o-mini"]);

    let anthropic = get(
        run.gateway,
        "/v1/models",
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(anthropic.status, StatusCode::OK, "{}", anthropic.body);
    let list = anthropic.json();
    assert!(list.get("object").is_none(), "{}", anthropic.body);
    assert_eq!(list["has_more"], false);
    assert_eq!(list["first_id"], "claude-sonnet-4-5");
    assert_eq!(list["last_id"], "claude-haiku-4-5");
    let first = &list["data"][0];
    assert_eq!(first["type"], "model");
    assert_eq!(first["id"], "claude-sonnet-4-5");
    assert_eq!(first["display_name"], "Claude Sonnet 4.5");
    assert_eq!(first["created_at"], "1970-01-01T00:00:00Z");
    assert_eq!(list["data"].as_array().unwrap().len(), 2);
    assert_eq!(
        run.upstream.stats().requests,
        0,
        "listed by the gateway itself"
    );
}

#[tokio::test]
async fn the_fallback_model_is_listed_with_the_priced_ones() {
    global_log();
    let mut s = settings("", true);
    s.fallback_model = "gpt-4.1-nano".to_owned();
    let run = start(Profile::default(), s).await;
    let list = get(run.gateway, "/v1/models", &[]).await.json();
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["gpt-4o", "gpt-4o-mini", "gpt-4.1-nano"]);
}

#[tokio::test]
async fn a_model_is_retrieved_by_id_in_either_format() {
    global_log();
    let run = start(Profile::default(), settings("", false)).await;
    let a = get(run.gateway, "/v1/models/gpt-4o-mini", &[]).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.json()["id"], "gpt-4o-mini");
    assert_eq!(a.json()["object"], "model");

    let claude = [("anthropic-version", "2023-06-01")];
    let a = get(run.gateway, "/v1/models/claude-haiku-4-5", &claude).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.json()["type"], "model");
    assert_eq!(a.json()["display_name"], "Claude Haiku 4.5");

    // Each API has its own models, and an unknown one is the API's own 404.
    let a = get(run.gateway, "/v1/models/claude-haiku-4-5", &[]).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{}", a.body);
    assert_eq!(a.json()["error"]["code"], "model_not_found");
    let a = get(run.gateway, "/v1/models/gpt-4o", &claude).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{}", a.body);
    assert_eq!(a.json()["type"], "error");
    assert_eq!(a.json()["error"]["type"], "not_found_error");
}

#[tokio::test]
async fn messages_are_answered_through_the_anthropic_stack() {
    global_log();
    let run = start(Profile::default(), settings("", false)).await;
    let a = post_messages(run.gateway, &[], message("claude-sonnet-4-5", false)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let m = a.json();
    assert_eq!(m["type"], "message", "{}", a.body);
    assert_eq!(m["model"], "claude-sonnet-4-5");
    assert!(
        m["content"][0]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{}",
        a.body
    );
    assert!(m["stop_reason"].is_string(), "{}", a.body);
    assert!(
        m["usage"]["output_tokens"].as_u64().unwrap_or(0) > 0,
        "{}",
        a.body
    );
    assert_eq!(a.headers["x-seawall-served-by"], "primary");
    for name in a.headers.keys() {
        assert!(
            !name.as_str().starts_with("anthropic-") && name != "request-id",
            "{name} reached the client"
        );
    }
    assert_eq!(run.upstream.stats().requests, 1);
}

#[tokio::test]
async fn messages_calls_are_recorded_and_charged() {
    let log = global_log();
    // A model name no other test uses, so its record is this test's.
    let run = start(Profile::default(), settings("", true)).await;
    let a = post_messages(run.gateway, &[], message("claude-record-probe", false)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let logged = log.text();
    let record = logged
        .lines()
        .find(|l| l.contains("seawall::call") && l.contains("claude-record-probe"))
        .unwrap_or_else(|| panic!("no call record in {logged}"));
    assert!(record.contains("\"cost_usd\""), "{record}");
    assert!(record.contains("\"output_tokens\""), "{record}");
}

#[tokio::test]
async fn streamed_messages_pass_anthropic_event_types_through() {
    global_log();
    let profile = Profile::default().output_tokens(Count::fixed(5));
    let run = start(profile, settings("", false)).await;
    let a = post_messages(run.gateway, &[], message("claude-sonnet-4-5", true)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(
        a.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = event_types(&a.body);
    assert_eq!(events.first(), Some(&"message_start"), "{}", a.body);
    assert_eq!(events.get(1), Some(&"content_block_start"), "{}", a.body);
    assert_eq!(
        events
            .iter()
            .filter(|e| **e == "content_block_delta")
            .count(),
        5,
        "{}",
        a.body
    );
    assert_eq!(
        events[events.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"],
        "{}",
        a.body
    );
}

#[tokio::test]
async fn a_messages_stream_that_fails_mid_way_ends_with_an_anthropic_error_event() {
    global_log();
    let profile = Profile::default()
        .output_tokens(Count::fixed(20))
        .mid_stream_errors(1.0, Count::fixed(3));
    let run = start(profile, settings("", false)).await;
    let a = post_messages(run.gateway, &[], message("claude-sonnet-4-5", true)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let last = a.body.trim_end().rsplit("\n\n").next().unwrap_or_default();
    let (event, data) = last.split_once('\n').unwrap_or_default();
    assert_eq!(event, "event: error", "last event: {last}");
    let data: Value = serde_json::from_str(data.trim_start_matches("data: ")).unwrap_or_default();
    assert_eq!(data["type"], "error", "{last}");
    assert_eq!(data["error"]["message"], "The upstream service failed.");
}

#[tokio::test]
async fn a_rate_limit_reaches_each_client_in_its_own_error_format() {
    global_log();
    // A 429 the upstream says not to retry: it reaches the client.
    let profile = Profile::default().error(ErrorRule::random(429, 1.0).should_retry(false));
    let run = start(profile, settings("", false)).await;

    let a = post_messages(run.gateway, &[], message("claude-sonnet-4-5", false)).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
    assert_eq!(
        a.json(),
        serde_json::json!({"type": "error", "error": {
            "type": "rate_limit_error",
            "message": "Too many requests. Please try again later.",
        }})
    );

    let a = post(run.gateway, &[], chat("gpt-4o")).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
    assert_eq!(a.json()["error"]["type"], "rate_limited", "{}", a.body);
    assert_eq!(
        a.json()["error"]["code"],
        "rate_limit_exceeded",
        "{}",
        a.body
    );
    assert!(a.json().get("type").is_none(), "{}", a.body);
}

#[tokio::test]
async fn anthropic_clients_get_anthropic_error_bodies_from_the_gateway_too() {
    global_log();
    let run = start(Profile::default(), settings("", false)).await;
    // The budget refuses: 10M output tokens of Sonnet cost $150, past the $5 daily budget.
    let a = post_messages(
        run.gateway,
        &[],
        message("claude-sonnet-4-5", false).replace("\"max_tokens\":16", "\"max_tokens\":10000000"),
    )
    .await;
    assert_eq!(a.status, StatusCode::PAYMENT_REQUIRED, "{}", a.body);
    assert_eq!(a.json()["error"]["type"], "billing_error", "{}", a.body);
    // An unpriced model.
    let a = post_messages(run.gateway, &[], message("claude-opus-1", false)).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    assert_eq!(
        a.json()["error"]["type"],
        "invalid_request_error",
        "{}",
        a.body
    );
    assert_eq!(run.upstream.stats().requests, 0);
}

#[tokio::test]
async fn the_new_routes_need_one_of_the_client_keys() {
    global_log();
    let run = start(Profile::default(), settings(CLIENT_KEYS, false)).await;
    let a = post_messages(run.gateway, &[], message("claude-sonnet-4-5", false)).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{}", a.body);
    assert_eq!(a.json()["type"], "error", "{}", a.body);
    assert_eq!(a.json()["error"]["type"], "authentication_error");
    let wrong = [("x-api-key", "client-key-three")];
    for path in ["/v1/models", "/v1/models/gpt-4o"] {
        assert_eq!(
            get(run.gateway, path, &[]).await.status,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            get(run.gateway, path, &wrong).await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    let a = get(
        run.gateway,
        "/v1/models",
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(
        a.json()["error"]["type"],
        "authentication_error",
        "{}",
        a.body
    );
    assert_eq!(run.upstream.stats().requests, 0);

    let right = [("x-api-key", "client-key-two")];
    let a = post_messages(run.gateway, &right, message("claude-sonnet-4-5", false)).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let bearer = [("authorization", "Bearer client-key-one")];
    for path in ["/v1/models", "/v1/models/gpt-4o"] {
        let a = get(run.gateway, path, &bearer).await;
        assert_eq!(a.status, StatusCode::OK, "{path}: {}", a.body);
    }
}

#[tokio::test]
async fn message_bodies_over_the_cap_are_refused_with_an_anthropic_413() {
    global_log();
    let run = start(Profile::default(), settings("", false)).await;
    let padding = " ".repeat(MAX_REQUEST_BODY);
    let big = message("claude-sonnet-4-5", false).replacen('{', &format!("{{{padding}"), 1);
    let a = post_messages(run.gateway, &[], big).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", a.body);
    assert_eq!(a.json()["error"]["type"], "request_too_large", "{}", a.body);
    assert_eq!(run.upstream.stats().requests, 0);
}

#[tokio::test]
async fn without_an_anthropic_upstream_messages_are_refused_clearly() {
    global_log();
    let run = start_serving(Profile::default(), settings("", false), Apis::OpenAiOnly).await;
    let a = post_messages(run.gateway, &[], message("claude-sonnet-4-5", false)).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{}", a.body);
    let text = a.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        text.contains("no Anthropic upstream") && text.contains("does not translate"),
        "{}",
        a.body
    );
    let list = get(
        run.gateway,
        "/v1/models",
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(list.json()["data"], serde_json::json!([]), "{}", list.body);
    // The OpenAI side is unaffected.
    assert_eq!(
        post(run.gateway, &[], chat("gpt-4o")).await.status,
        StatusCode::OK
    );
    assert_eq!(run.upstream.stats().requests, 1);
}

#[tokio::test]
async fn an_anthropic_outage_is_answered_by_the_claude_fallback() {
    global_log();
    let profile = Profile::default().error(
        ErrorRule::random(529, 1.0)
            .model("claude-sonnet-4-5")
            .should_retry(false),
    );
    let run = start(profile, settings("", false)).await;
    for stream in [false, true] {
        let a = post_messages(run.gateway, &[], message("claude-sonnet-4-5", stream)).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        let served = a.headers["x-seawall-served-by"].to_str().unwrap();
        assert!(served.contains("claude-haiku-4-5"), "{served}");
    }
}

#[tokio::test]
async fn one_daily_budget_covers_both_apis() {
    global_log();
    // Streams that start at once and then take a minute per token: a started stream keeps its
    // reservation while the test holds it open.
    let profile = Profile::default()
        .output_tokens(Count::fixed(2))
        .per_token_latency(Delay::fixed(Duration::from_secs(60)));
    let run = start(profile, settings("", false)).await;
    // $4 reserved: 400k output tokens of gpt-4o at $10 per million.
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let held = http::Request::post(format!("http://{}/v1/chat/completions", run.gateway))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat("gpt-4o").replace(
            "\"max_tokens\":16",
            "\"stream\":true,\"max_tokens\":400000",
        ))))
        .unwrap();
    let held = bounded(client.request(held)).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);

    // $1.50 more through the other API: 100k output tokens of Claude Sonnet at $15 per million.
    // Streamed, so that were it served, its head would come at once, not after the tokens.
    let sonnet =
        message("claude-sonnet-4-5", true).replace("\"max_tokens\":16", "\"max_tokens\":100000");
    let req = http::Request::post(format!("http://{}/v1/messages", run.gateway))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .body(Full::new(Bytes::from(sonnet.clone())))
        .unwrap();
    let refused = bounded(client.request(req)).await.unwrap();
    drop(held);
    assert_eq!(refused.status(), StatusCode::PAYMENT_REQUIRED);
    let body = bounded(refused.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap_or_default();
    assert_eq!(body["error"]["type"], "billing_error", "{body}");

    // Without the held reservation the same call fits: the refusal was the shared budget's.
    let other = start(Profile::default(), settings("", false)).await;
    let a = post_messages(other.gateway, &[], sonnet).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
}

#[tokio::test]
async fn openai_clients_get_openais_codes_and_a_spent_quota_they_do_not_retry() {
    global_log();
    bounded(async {
        let quota = || Profile::default().exhausted_key(UPSTREAM_KEY);
        let run = start(quota(), settings("", false)).await;
        let a = post(run.gateway, &[], chat("gpt-4o")).await;
        assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
        let named = |a: &Answer, field: &str| a.json()["error"][field].as_str().map(str::to_owned);
        assert_eq!(named(&a, "type").as_deref(), Some("insufficient_quota"));
        assert_eq!(named(&a, "code").as_deref(), Some("insufficient_quota"));
        assert_eq!(a.headers["x-should-retry"], "false");

        // A prompt past every model's window: OpenAI's code for it, which clients branch on.
        let context = start(Profile::default().context_window(8), settings("", false)).await;
        let a = post(context.gateway, &[], chat("gpt-4o")).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
        assert_eq!(
            named(&a, "code").as_deref(),
            Some("context_length_exceeded")
        );

        // async-openai's own retry layer retries every 429 but OpenAI's `insufficient_quota`:
        // through it, a client makes one call and gets the quota error, not the gateway's open
        // circuit on a retry.
        use async_openai::middleware::{ReqwestService, retry::OpenAIRetryLayer};
        let run = start(quota(), settings("", false)).await;
        let service = tower::ServiceBuilder::new()
            .layer(OpenAIRetryLayer::new(2))
            .service(ReqwestService::new(reqwest::Client::new()));
        let config = async_openai::config::OpenAIConfig::new()
            .with_api_base(format!("http://{}/v1", run.gateway))
            .with_api_key("any");
        let client = async_openai::Client::with_config(config).with_http_service(service);
        let request: async_openai::types::chat::CreateChatCompletionRequest =
            serde_json::from_str(&chat("gpt-4o")).unwrap();
        let err = client.chat().create(request).await.unwrap_err();
        let async_openai::error::OpenAIError::ApiError(e) = err else {
            panic!("an API error: {err:?}");
        };
        assert_eq!(e.status_code.as_u16(), 429, "{e}");
        assert_eq!(e.api_error.r#type.as_deref(), Some("insufficient_quota"));
        // The primary model and the fallback, once each.
        assert_eq!(run.upstream.stats().requests, 2);
    })
    .await;
}
