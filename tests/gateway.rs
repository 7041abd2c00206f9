//! The gateway example as a client sees it, over loopback: its app and stack run against the
//! `seawall-mock` upstream, both on free `127.0.0.1` ports, and the test talks HTTP to it.

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
use seawall::http::{ApiKey, OpenAiConfig};
use seawall::mock::{Count, MockUpstream, Profile};
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
        allow_unpriced,
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

/// The mock upstream and the gateway in front of it, each on a free loopback port.
async fn start(profile: Profile, settings: Settings) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = listener.local_addr().unwrap();
    let upstream = MockUpstream::new(profile);
    let router = seawall::mock::router(upstream.clone())
        .layer(axum::middleware::map_response(with_org_headers));
    tokio::spawn(async move { axum::serve(listener, router).await });

    let config = OpenAiConfig::new(ApiKey::new(UPSTREAM_KEY).unwrap())
        .with_base_url(format!("http://{upstream_addr}/v1"));
    let client = gateway::client(&config, &settings).unwrap();
    let listener = gateway::bind(&settings.addr, &settings.keys).await.unwrap();
    let gateway = listener.local_addr().unwrap();
    let app = gateway::app(client, settings.keys);
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

async fn post(to: SocketAddr, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Answer {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut req = http::Request::post(format!("http://{to}/v1/chat/completions"))
        .header("content-type", "application/json");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = bounded(client.request(req.body(Full::new(body.into())).unwrap()))
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
