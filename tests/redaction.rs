//! Credentials never leave through an error: a corpus of leak shapes (every key fake) goes
//! through each way an `LlmError` is shown, written or sent, and no secret may come out.

#[path = "../examples/gateway.rs"]
#[allow(dead_code)] // `main` and the chaos profile are the example's own.
mod gateway;

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use seawall::budget::{Budget, CostBudgetLayer, JsonlSink, Price, PriceTable, Usd};
use seawall::{FailureClass, LlmError};
use seawall_test_support::{Captured, global_log};
use tower::{Layer, ServiceExt};

/// A leak as an upstream, a proxy or a transport error might phrase it, and the secrets in it.
struct Leak {
    text: &'static str,
    secrets: &'static [&'static str],
}

const fn leak(text: &'static str, secrets: &'static [&'static str]) -> Leak {
    Leak { text, secrets }
}

const CORPUS: &[Leak] = &[
    leak(
        "Incorrect API key provided: sk-abcdefghijklmnopqrstuvwxyzABCDEF0123456789ab.",
        &["abcdefghijklmnopqrstuvwxyzABCDEF0123456789ab"],
    ),
    leak(
        "Incorrect API key provided: sk-proj-Zx9Qm2Lk7Vb4Nc1Hd8Gf3Js6Pa0Ty5Re_wUiOoPlKjHgFdSaQwErTy. \
         You can find your API key at https://platform.openai.com/account/api-keys.",
        &["Zx9Qm2Lk7Vb4Nc1Hd8Gf3Js6Pa0Ty5Re_wUiOoPlKjHgFdSaQwErTy"],
    ),
    leak(
        "key sk-svcacct-FAKEsvc0123456789abcdefghijABCDEFGHIJ is disabled",
        &["FAKEsvc0123456789abcdefghijABCDEFGHIJ"],
    ),
    leak(
        "authentication_error: invalid x-api-key sk-ant-api03-FAKEant0123456789abcdefghij-KLMNOPqrstuv_wxyz-AA",
        &["FAKEant0123456789abcdefghij-KLMNOPqrstuv_wxyz-AA"],
    ),
    leak(
        "admin key sk-ant-admin01-FAKEadm0123456789abcdefghijklmnop revoked",
        &["FAKEadm0123456789abcdefghijklmnop"],
    ),
    leak(
        "Access denied due to invalid subscription key. api-key: 0f1e2d3c4b5a69788796a5b4c3d2e1f0",
        &["0f1e2d3c4b5a69788796a5b4c3d2e1f0"],
    ),
    leak(
        "Ocp-Apim-Subscription-Key: 9a8b7c6d5e4f30211203f4e5d6c7b8a9 is not valid",
        &["9a8b7c6d5e4f30211203f4e5d6c7b8a9"],
    ),
    leak(
        "POST https://generativelanguage.googleapis.com/v1beta/models/gemini-pro:generateContent?key=AIzaSyFAKEfake0123456789abcdefghijkLMN failed",
        &["AIzaSyFAKEfake0123456789abcdefghijkLMN"],
    ),
    leak(
        "API key not valid. Please pass a valid API key: AIzaSyD-FAKEfake_0123456789ABCDEFGHIJKL.",
        &["AIzaSyD-FAKEfake_0123456789ABCDEFGHIJKL"],
    ),
    leak(
        "Authorization: Bearer eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJmYWtlLXVzZXIiLCJpYXQiOjE3MDAwMDAwMDB9.ZmFrZS1zaWduYXR1cmUtbm90LXJlYWw",
        &[
            "eyJzdWIiOiJmYWtlLXVzZXIiLCJpYXQiOjE3MDAwMDAwMDB9",
            "ZmFrZS1zaWduYXR1cmUtbm90LXJlYWw",
        ],
    ),
    leak(
        "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJmYWtlMiJ9.RkFLRXNpZ25hdHVyZQ expired",
        &["eyJzdWIiOiJmYWtlMiJ9", "RkFLRXNpZ25hdHVyZQ"],
    ),
    leak(
        "proxy said: authorization: bearer opaqueBearerToken0123456789",
        &["opaqueBearerToken0123456789"],
    ),
    leak(
        "Authorization: Basic Z2F0ZXdheTpodW50ZXIyLXBhc3N3b3Jk rejected",
        &["Z2F0ZXdheTpodW50ZXIyLXBhc3N3b3Jk"],
    ),
    leak(
        "GET https://api.example.com/v1/complete?model=x&api_key=fakeKey_0123456789abcdef&v=2",
        &["fakeKey_0123456789abcdef"],
    ),
    leak(
        "connect to https://gateway-user:Hunter2-Passw0rd@proxy.internal:8443 refused",
        &["Hunter2-Passw0rd"],
    ),
    leak(
        r#"{"api_key": "fk-live-0123456789abcdefFAKE", "model": "gpt-4o"}"#,
        &["fk-live-0123456789abcdefFAKE"],
    ),
    leak(
        r#"{"headers": {"x-api-key": "plainSecretValue_987654321", "accept": "*/*"}}"#,
        &["plainSecretValue_987654321"],
    ),
    leak(
        r#"{"Authorization": "Bearer opaqueJsonToken0123456789"}"#,
        &["opaqueJsonToken0123456789"],
    ),
    leak(
        r#"request was {\"api_key\":\"escapedSecret0123456789\",\"stream\":true}"#,
        &["escapedSecret0123456789"],
    ),
    leak(
        "request headers:\nx-api-key: headerEchoSecret0123456789\ncontent-type: application/json",
        &["headerEchoSecret0123456789"],
    ),
    leak(
        "<html><body><h1>502 Bad Gateway</h1><p>upstream https://api.openai.com/v1?api-key=htmlPageSecret0123456789</p>\
         <pre>Authorization: Bearer htmlBearerSecret0123456789</pre></body></html>",
        &["htmlPageSecret0123456789", "htmlBearerSecret0123456789"],
    ),
    leak(
        "Invalid API Key: gsk_FAKEfake0123456789abcdefghijklmnopqrstuvwxyz0123",
        &["FAKEfake0123456789abcdefghijklmnopqrstuvwxyz0123"],
    ),
    leak(
        "Incorrect API key provided: xai-FAKExai0123456789abcdefghijklmnopqrstuvwxyz",
        &["FAKExai0123456789abcdefghijklmnopqrstuvwxyz"],
    ),
    leak(
        "Invalid API key pplx-FAKEpplx0123456789abcdefghijklmnop provided",
        &["FAKEpplx0123456789abcdefghijklmnop"],
    ),
    leak(
        "The API key fw_FAKEfw0123456789abcdefghij is not valid",
        &["FAKEfw0123456789abcdefghij"],
    ),
    leak(
        "Wrong API key: csk-FAKEcsk0123456789abcdefghijklmnop",
        &["FAKEcsk0123456789abcdefghijklmnop"],
    ),
    leak(
        "Authentication failed for nvapi-FAKEnv0123456789-abcdefghij_klmnop",
        &["FAKEnv0123456789-abcdefghij_klmnop"],
    ),
    leak(
        "bad token r8_FAKEr80123456789abcdefghijkl",
        &["FAKEr80123456789abcdefghijkl"],
    ),
    leak(
        "key sk_live_FAKEsk0123456789abcdefghijklmn refused",
        &["FAKEsk0123456789abcdefghijklmn"],
    ),
    leak(
        "401 for token hf_FAKEhf0123456789abcdefghijklmn",
        &["FAKEhf0123456789abcdefghijklmn"],
    ),
    leak(
        "spawned with OPENAI_API_KEY=envSecretValue0123456789 python app.py",
        &["envSecretValue0123456789"],
    ),
    leak(
        "GET /v1/models?access_token=ya29.FAKEfake-0123456789_abcdef HTTP/1.1",
        &["ya29.FAKEfake-0123456789_abcdef"],
    ),
    leak(
        r#"{"user": "ops", "password": "correct-horse-battery-staple"}"#,
        &["correct-horse-battery-staple"],
    ),
    // Keys glued to the text before them, with no word boundary at their start (a message
    // cut and joined, a provider that writes no space).
    leak(
        r#"{"error":{"messsk-proj-FAKEglued0123456789abcdefghij","type":"invalid_request_error"}}"#,
        &["FAKEglued0123456789abcdefghij"],
    ),
    leak(
        "upstream said: invalid keysk-ant-api03-FAKEglued0123456789abcdef_ghij-klmn",
        &["FAKEglued0123456789abcdef_ghij-klmn"],
    ),
    leak(
        "x-request-id: req_sk-_000proj-FAKEglued3456789abcdefghij",
        &["FAKEglued3456789abcdefghij"],
    ),
    leak(
        "token=xyzgsk_FAKEgluedgsk0123456789abcdefghijkl and pplx: abcpplx-FAKEgluedpplx0123456789abcd",
        &[
            "FAKEgluedgsk0123456789abcdefghijkl",
            "FAKEgluedpplx0123456789abcd",
        ],
    ),
    leak(
        "aws credentials AKIAIOSFODNN7EXAMPLE not accepted",
        &["AKIAIOSFODNN7EXAMPLE"],
    ),
    leak(
        "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig=FAKEsasSignature0123456789%2Babc%3D",
        &["FAKEsasSignature0123456789"],
    ),
];

#[test]
fn the_corpus_is_large_and_its_secrets_are_in_their_texts() {
    global_log();
    assert!(CORPUS.len() >= 20);
    for leak in CORPUS {
        for secret in leak.secrets {
            assert!(leak.text.contains(secret), "{secret} not in {}", leak.text);
        }
    }
}

#[track_caller]
fn assert_no_secret(shown: &str, channel: &str) {
    for leak in CORPUS {
        for secret in leak.secrets {
            assert!(
                !shown.contains(secret),
                "{channel} leaked {secret:?} of {:?}:\n{shown}",
                leak.text
            );
        }
    }
}

/// A foreign error (a transport's, say) whose text and source carry a leak.
#[derive(Debug)]
struct Foreign {
    text: &'static str,
    source: Option<Box<Foreign>>,
}

impl fmt::Display for Foreign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text)
    }
}

impl StdError for Foreign {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

/// An error of each construction seawall uses: a message, provider fields, a foreign source
/// with a source of its own, and an `LlmError` as the source (as the retry layer keeps it).
fn errors_of(leak: &Leak) -> Vec<LlmError> {
    let foreign = Foreign {
        text: leak.text,
        source: Some(Box::new(Foreign {
            text: leak.text,
            source: None,
        })),
    };
    vec![
        LlmError::new(FailureClass::Authentication, leak.text),
        LlmError::new(FailureClass::InvalidRequest, "bad request")
            .with_code(leak.text)
            .with_error_type(leak.text)
            .with_request_id(leak.text),
        LlmError::new(FailureClass::Connect, "could not connect").with_source(foreign),
        LlmError::new(FailureClass::DeadlineExceeded, "time budget ran out")
            .with_source(LlmError::new(FailureClass::ServerError, leak.text)),
        LlmError::from_boxed(leak.text.into()),
    ]
}

/// The source chain on one line, the way `anyhow` prints `{:#}`.
fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

#[test]
fn display_debug_and_the_source_chain_never_show_a_secret() {
    global_log();
    for leak in CORPUS {
        for e in errors_of(leak) {
            assert_no_secret(&e.to_string(), "Display");
            assert_no_secret(&format!("{e:?}"), "Debug");
            assert_no_secret(&format!("{e:#?}"), "pretty Debug");
            assert_no_secret(&chain(&e), "source chain");
            let mut next = e.source();
            while let Some(s) = next {
                assert_no_secret(&format!("{s:?}"), "Debug of a source");
                next = s.source();
            }
            assert!(
                format!("{e:?}{}", chain(&e)).contains("[REDACTED]"),
                "nothing redacted in {e:?}"
            );
        }
    }
}

#[test]
fn tracing_records_never_show_a_secret() {
    let log = global_log();
    for leak in CORPUS {
        for e in errors_of(leak) {
            // As an error value (the subscriber walks its sources), by Display, by Debug.
            tracing::error!(error = &e as &(dyn StdError + 'static), "call failed");
            tracing::warn!(error = %e, "call failed");
            tracing::info!(error = ?e, "call failed");
        }
    }
    let text = log.text();
    assert!(
        text.contains("error.sources="),
        "sources were not walked:\n{text}"
    );
    assert_no_secret(&text, "tracing");
}

#[tokio::test]
async fn the_jsonl_ledger_never_shows_a_secret() {
    global_log();
    let out = Captured::default();
    let sink = Arc::new(JsonlSink::from_writer(out.clone(), 1024).unwrap());
    let layer = CostBudgetLayer::builder(
        PriceTable::new().with_default(Price::per_million_f64(1.0, 1.0).unwrap()),
    )
    // A key function handed the raw header: a mistake the ledger must survive.
    .budget(Budget::daily("per-caller", Usd::from_dollars(100)).per_key("caller"))
    .keys(|req: &http::Request<Bytes>| {
        let v = req.headers().get("x-caller")?.to_str().ok()?;
        Some(v.to_owned())
    })
    .sink(sink.clone())
    .build()
    .unwrap();
    let svc = layer.layer(tower::service_fn(|_req: http::Request<Bytes>| async {
        Err::<http::Response<Full<Bytes>>, _>(LlmError::new(FailureClass::ServerError, "boom"))
    }));
    for leak in CORPUS {
        let body = serde_json::json!({
            "model": leak.text,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
        });
        let req = http::Request::post("/v1/chat/completions")
            .header("x-caller", leak.text.replace('\n', " "))
            .body(Bytes::from(body.to_string()))
            .unwrap();
        let _ = svc.clone().oneshot(req).await;
    }
    let flushed = tokio::task::spawn_blocking(move || sink.flush().map(|()| sink.written()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(flushed, CORPUS.len() as u64, "one record per call");
    assert_no_secret(&out.text(), "JSONL ledger");
}

#[tokio::test]
async fn the_gateway_error_body_and_log_never_show_a_secret() {
    let log = global_log();
    // An upstream whose error messages quote the corpus: the request says which entry.
    let upstream = axum::Router::new().fallback(|body: Bytes| async move {
        let req: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let i: usize = req["messages"][0]["content"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let leak = &CORPUS[i.min(CORPUS.len() - 1)];
        let error = serde_json::json!({
            "error": {"message": leak.text, "type": "invalid_request_error", "code": leak.text}
        });
        (
            http::StatusCode::BAD_REQUEST,
            [
                ("content-type", "application/json"),
                ("x-request-id", leak.text),
            ],
            error.to_string(),
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, upstream).await });

    let settings = gateway::Settings {
        addr: "127.0.0.1:0".to_owned(),
        keys: gateway::ClientKeys::default(),
        fallback_model: "gpt-4o-mini".to_owned(),
        anthropic_fallback_model: "claude-haiku-4-5".to_owned(),
        allow_unpriced: false,
        cache_ttl: None,
    };
    let (openai, anthropic) =
        gateway::mock_upstreams(upstream_addr, "sk-proj-FAKEgatewayUpstream0123456789").unwrap();
    let providers = gateway::Providers::new(Some(openai), Some(anthropic), &settings).unwrap();
    let listener = gateway::bind(&settings.addr, &settings.keys).await.unwrap();
    let gateway_addr = listener.local_addr().unwrap();
    let app = gateway::app(providers, settings.keys);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let http: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    // Both APIs, each with its own error format.
    let routes = [
        ("/v1/chat/completions", "gpt-4o"),
        ("/v1/messages", "claude-sonnet-4-5"),
    ];
    for (i, (path, model)) in (0..CORPUS.len()).flat_map(|i| routes.map(|r| (i, r))) {
        let body = serde_json::json!({
            "model": model,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": i.to_string()}],
        });
        let req = http::Request::post(format!("http://{gateway_addr}{path}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let resp = tokio::time::timeout(std::time::Duration::from_secs(30), http.request(req))
            .await
            .expect("the gateway answered in time")
            .unwrap();
        // Mostly 400; some messages classify as another failure (a refused key, a proxy page).
        let status = resp.status();
        assert!(
            status.is_client_error() || status.is_server_error(),
            "{status}"
        );
        let mut shown = format!("{:?}", resp.headers());
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        shown.push_str(&String::from_utf8_lossy(&body));
        assert_no_secret(&shown, "gateway error body");
        assert!(shown.contains(r#""message":"The "#), "{shown}");
    }
    let logged = log.text();
    assert!(logged.contains("gateway: call failed"), "{logged}");
    assert_no_secret(&logged, "gateway log");
}
