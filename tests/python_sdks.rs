//! The official Python SDKs (`openai`, `anthropic`, pinned in tests/sdk/requirements.txt)
//! against the gateway example: the claim that it is a drop-in base URL for both is only worth
//! what the real clients make of its answers, streams, model lists and errors.
//!
//! The gateway runs in process on a free loopback port, in front of a calm `seawall-mock`
//! upstream (no random faults, so the run is deterministic) except for one fault per API:
//! the first request of each is answered with the mock's own 503, and a marked stream of each
//! is cut after its first tokens. The SDKs run with their retries off, so they pass only if
//! the gateway's stack absorbed both (the cut stream continued in the same stream the SDK
//! reads). The gateway's cache is on, with two client keys: the SDKs must parse its replays
//! (a non-streamed answer replayed as a stream in each API's format) as they parse the
//! upstream's answers.
//!
//! The packages come from a venv the test makes under the target dir (`sdk-venv`) the first
//! time, with `python3 -m venv` and pip (PyPI), and reuses after; `$SEAWALL_PYTHON` names
//! another Python that has them. Without Python 3 and its `venv` module the test fails, saying
//! what is missing (`.ci/run` installs them on a fresh machine).

#[path = "../examples/gateway.rs"]
#[allow(dead_code)] // `main`, the chaos profile and the banner are the example's own.
mod gateway;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use gateway::{ClientKeys, Settings};
use seawall::mock::{Count, Delay, ErrorRule, MockUpstream, Profile};
use seawall_test_support::global_log;
use tokio::net::TcpListener;
use tokio::process::Command;

/// The key the SDKs present to the gateway.
const CLIENT_KEY: &str = "sdk-client-key";
/// A second client's key: the gateway's cache keeps the two clients' answers apart.
const OTHER_CLIENT_KEY: &str = "sdk-other-client-key";

/// Far longer than the script needs (a few seconds): reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(120);

/// The first request to each path goes to a mock that fails every request with a 503, in the
/// wire format of the path's API; a request whose prompt carries [`QUOTA_MARKER`] goes to one
/// whose quota for the gateway's key ran out; the first one per path whose prompt carries
/// [`CUT_MARKER`] to one that cuts its stream.
#[derive(Clone)]
struct FirstAttemptFails {
    failing: MockUpstream,
    no_quota: MockUpstream,
    cutting: MockUpstream,
    seen: Arc<Mutex<HashSet<String>>>,
}

/// The marker of tests/sdk/check_sdks.py's prompts that meet an exhausted quota.
const QUOTA_MARKER: &[u8] = b"QUOTA-EXHAUSTED-UPSTREAM";

/// The marker of tests/sdk/check_sdks.py's prompts whose first stream is cut.
const CUT_MARKER: &[u8] = b"CUT-THIS-STREAM-ONCE";

fn carries(body: &[u8], marker: &[u8]) -> bool {
    body.windows(marker.len()).any(|w| w == marker)
}

/// The gateway's own key at the upstream.
const UPSTREAM_KEY: &str = "sk-upstream-key-of-the-gateway";

async fn first_attempt_fails(
    State(faults): State<FirstAttemptFails>,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let first = |what: &str| {
        let key = format!("{what} {}", parts.uri.path());
        faults.seen.lock().unwrap().insert(key)
    };
    let upstream = if carries(&body, QUOTA_MARKER) {
        &faults.no_quota
    } else if first("any") {
        &faults.failing
    } else if carries(&body, CUT_MARKER) && first("cut") {
        &faults.cutting
    } else {
        return next.run(Request::from_parts(parts, body.into())).await;
    };
    let resp = upstream
        .respond(http::Request::from_parts(parts, body))
        .await
        .unwrap_or_else(|never| match never {});
    resp.map(axum::body::Body::new)
}

/// Runs a setup command, failing the test with its output if it fails.
async fn setup(what: &str, cmd: &mut Command) {
    let out = tokio::time::timeout(Duration::from_secs(600), cmd.kill_on_drop(true).output())
        .await
        .unwrap_or_else(|_| panic!("{what}: no outcome in 10 minutes"))
        .unwrap_or_else(|e| panic!("{what}: cannot run it ({e}); the test needs Python 3"));
    assert!(
        out.status.success(),
        "{what} failed ({}). The test needs Python 3 with its venv module (Debian: \
         python3-venv) and PyPI, or SEAWALL_PYTHON naming a Python with the packages of \
         tests/sdk/requirements.txt.\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Python with the pinned SDKs: `$SEAWALL_PYTHON`, or the test's own venv, made and filled
/// when missing (pip does nothing when the pins are already there).
async fn sdk_python() -> PathBuf {
    if let Some(python) = std::env::var_os("SEAWALL_PYTHON") {
        return python.into();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let venv = target.join("sdk-venv");
    let python = venv.join("bin/python");
    let has_pip = Command::new(&python)
        .args(["-m", "pip", "--version"])
        .output()
        .await
        .is_ok_and(|o| o.status.success());
    if !has_pip {
        let _ = std::fs::remove_dir_all(&venv);
        setup(
            "python3 -m venv",
            Command::new("python3").arg("-m").arg("venv").arg(&venv),
        )
        .await;
    }
    setup(
        "pip install -r tests/sdk/requirements.txt",
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(root.join("tests/sdk/requirements.txt")),
    )
    .await;
    python
}

#[tokio::test]
async fn the_official_python_sdks_work_against_the_gateway() {
    global_log();
    // The upstream: calm, but the first attempt of each API fails.
    let calm = MockUpstream::new(Profile::default());
    let failing = MockUpstream::new(Profile::default().error(ErrorRule::random(503, 1.0)));
    let no_quota = MockUpstream::new(Profile::default().exhausted_key(UPSTREAM_KEY));
    // The connection dropped after 5 tokens of text, 10 ms apart: the first token has gone
    // out to the SDK when it drops (a cut before it would simply be retried).
    let cutting = MockUpstream::new(
        Profile::default()
            .per_token_latency(Delay::fixed(Duration::from_millis(10)))
            .cut_streams(1.0, Count::fixed(5), true),
    );
    let faults = FirstAttemptFails {
        failing: failing.clone(),
        no_quota: no_quota.clone(),
        cutting: cutting.clone(),
        seen: Arc::default(),
    };
    let router = seawall::mock::router(calm.clone())
        .layer(middleware::from_fn_with_state(faults, first_attempt_fails));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });

    // The gateway, with a client key, as a real deployment would have.
    let settings = Settings {
        addr: "127.0.0.1:0".to_owned(),
        keys: ClientKeys::parse(&format!("{CLIENT_KEY},{OTHER_CLIENT_KEY}")),
        fallback_model: "gpt-4o-mini".to_owned(),
        anthropic_fallback_model: "claude-haiku-4-5".to_owned(),
        allow_unpriced: false,
        cache_ttl: Some(Duration::from_secs(600)),
    };
    let (openai, anthropic) = gateway::mock_upstreams(upstream, UPSTREAM_KEY).unwrap();
    let providers = gateway::Providers::new(Some(openai), Some(anthropic), &settings).unwrap();
    let listener = gateway::bind(&settings.addr, &settings.keys).await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Requests the SDKs mark as retries of theirs (`x-stainless-retry-count` above 0).
    let sdk_retries = Arc::new(AtomicUsize::new(0));
    let seen = sdk_retries.clone();
    let app = gateway::app(providers, settings.keys).layer(middleware::from_fn(
        move |req: Request, next: Next| {
            let retry = req
                .headers()
                .get("x-stainless-retry-count")
                .is_some_and(|v| v.as_bytes() != b"0");
            if retry {
                seen.fetch_add(1, Ordering::SeqCst);
            }
            next.run(req)
        },
    ));
    tokio::spawn(async move { axum::serve(listener, app).await });

    let python = sdk_python().await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/check_sdks.py");
    let started = Instant::now();
    let run = Command::new(&python)
        .arg(&script)
        .env("SEAWALL_GATEWAY_URL", format!("http://{addr}"))
        .env("SEAWALL_GATEWAY_KEY", CLIENT_KEY)
        .env("SEAWALL_GATEWAY_OTHER_KEY", OTHER_CLIENT_KEY)
        .env("SEAWALL_GATEWAY_CACHE", "1")
        // A proxy from the environment must not intercept loopback calls.
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(LIMIT, run)
        .await
        .expect("the SDK script hung: no outcome within its time limit")
        .unwrap_or_else(|e| panic!("cannot run {python:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the SDK checks failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    println!("{stdout}(in {:.2?})", started.elapsed());

    // The cache's checks ran (the script skips them against a gateway without a cache).
    assert_eq!(stdout.matches("streamed hit").count(), 2, "{stdout}");
    // The faults happened, and the gateway absorbed them: one 503 per API, each retried.
    assert_eq!(failing.stats().server_errors, 2, "{stdout}");
    // A call past the quota: the primary model and its fallback once each, per API, and no
    // SDK retried it (nor anything else).
    assert_eq!(no_quota.stats().requests, 4, "{stdout}");
    assert_eq!(sdk_retries.load(Ordering::SeqCst), 0, "{stdout}");
    // One stream cut per API, each continued by one follow-up that the calm upstream
    // streamed to its end.
    assert_eq!(cutting.stats().requests, 2, "{stdout}");
    assert_eq!(cutting.stats().streams_cut, 2, "{stdout}");
    // OpenAI: a completion and a stream; Anthropic: a message and two streams. Models,
    // refused keys and unpriced models never reach the upstream. With the cache, per API:
    // the greedy question once, its sampled twin, its no-store copy and the other client's
    // copy (every hit, streamed or not, is served by the gateway alone). The cut streams'
    // follow-ups.
    assert_eq!(calm.stats().requests, 5 + 2 * 4 + 2, "{stdout}");
    assert_eq!(calm.stats().streams_completed, 3 + 2, "{stdout}");
}
