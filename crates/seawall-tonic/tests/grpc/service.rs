//! The example service as a gRPC client sees it: the service and the `seawall-mock` upstream
//! each on a free `127.0.0.1` port, driven with a real tonic client over loopback.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use crate::llm_stream::proto::GenerateRequest;
use crate::llm_stream::{LlmClient, LlmService, Settings};
use seawall_http::{ApiKey, OpenAiConfig};
use seawall_mock::{Count, ErrorRule, MockUpstream, Profile};
use seawall_test_support::{global_log, start_mock};
use tonic::Code;
use tonic_types::StatusExt;

const UPSTREAM_KEY: &str = "sk-proj-UpstreamKeyOfTheService0123456789";

/// Far longer than any test needs: reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(30);

async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("the test hung: no outcome within its time limit")
}

struct Running {
    client: LlmClient,
    upstream: MockUpstream,
}

/// The mock upstream and the example service in front of it, each on a free loopback port,
/// and a tonic client connected to the service.
async fn start(profile: Profile, settings: Settings) -> Running {
    let (upstream_addr, upstream) = start_mock(profile).await;
    let config = OpenAiConfig::new(ApiKey::new(UPSTREAM_KEY).unwrap())
        .with_base_url(format!("http://{upstream_addr}/v1"));
    let service = LlmService::new(
        crate::llm_stream::client(&config, &settings).unwrap(),
        settings,
    );
    let listener = crate::llm_stream::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(crate::llm_stream::serve(listener, service));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    Running {
        client: LlmClient::new(channel),
        upstream,
    }
}

fn ask(prompt: &str) -> GenerateRequest {
    GenerateRequest {
        model: "gpt-4o-mini".to_owned(),
        prompt: prompt.to_owned(),
        max_tokens: 32,
    }
}

/// What one call gave: the tokens, and the status it failed with (at the start or at the end
/// of the stream), if any.
struct Outcome {
    tokens: Vec<String>,
    status: Option<tonic::Status>,
    failed_at_start: bool,
}

async fn generate(
    client: &mut LlmClient,
    request: impl tonic::IntoRequest<GenerateRequest>,
) -> Outcome {
    let mut stream = match bounded(client.generate(request)).await {
        Ok(resp) => resp.into_inner(),
        Err(status) => {
            return Outcome {
                tokens: Vec::new(),
                status: Some(status),
                failed_at_start: true,
            };
        }
    };
    let mut tokens = Vec::new();
    loop {
        match bounded(stream.message()).await {
            Ok(Some(token)) => tokens.push(token.text),
            Ok(None) => {
                return Outcome {
                    tokens,
                    status: None,
                    failed_at_start: false,
                };
            }
            Err(status) => {
                return Outcome {
                    tokens,
                    status: Some(status),
                    failed_at_start: false,
                };
            }
        }
    }
}

fn reason(status: &tonic::Status) -> String {
    status
        .get_details_error_info()
        .expect("an ErrorInfo detail")
        .reason
}

#[tokio::test]
async fn a_normal_answer_streams_its_tokens_and_ends_cleanly() {
    global_log();
    let mut run = start(
        Profile::default().output_tokens(Count::fixed(12)),
        Settings::default(),
    )
    .await;
    let out = generate(&mut run.client, ask("Hello!")).await;
    assert!(out.status.is_none(), "{:?}", out.status);
    assert!(
        out.tokens.len() >= 2,
        "streamed token by token: {:?}",
        out.tokens
    );
    assert!(out.tokens.iter().all(|t| !t.is_empty()));
    assert_eq!(run.upstream.stats().requests, 1);
}

#[tokio::test]
async fn an_exhausted_quota_is_resource_exhausted_without_retry_info_and_not_retried() {
    global_log();
    let profile = Profile::default().exhausted_key(UPSTREAM_KEY);
    let mut run = start(profile, Settings::default()).await;
    let out = generate(&mut run.client, ask("Hello!")).await;
    let status = out.status.expect("a failed call");
    assert!(out.failed_at_start);
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(&status), "QUOTA_EXHAUSTED");
    assert!(status.get_details_retry_info().is_none());
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "-1"
    );
    // The class's sentence, not the upstream's words (which can name the account).
    assert!(!status.message().contains("current quota"), "{status:?}");
    assert!(!format!("{status:?}").contains(UPSTREAM_KEY));
    assert_eq!(
        run.upstream.stats().requests,
        1,
        "an exhausted quota is never retried"
    );
}

#[tokio::test]
async fn a_rate_limit_outlasting_the_time_budget_is_resource_exhausted_with_retry_info() {
    global_log();
    // The upstream asks for two minutes; the call may take one: the retry layer gives up at
    // once and hands on the hint, and the client learns when to come back.
    let profile =
        Profile::default().error(ErrorRule::random(429, 1.0).retry_after(Duration::from_secs(120)));
    let settings = Settings {
        time_budget: Duration::from_secs(60),
        ..Settings::default()
    };
    let mut run = start(profile, settings).await;
    let out = generate(&mut run.client, ask("Hello!")).await;
    let status = out.status.expect("a failed call");
    assert!(out.failed_at_start);
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(&status), "RATE_LIMITED");
    let retry = status.get_details_retry_info().expect("a RetryInfo detail");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(120)));
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "120000"
    );
    assert_eq!(
        run.upstream.stats().requests,
        1,
        "no attempt after the refused wait"
    );
}

#[tokio::test]
async fn a_prompt_too_long_for_the_model_is_invalid_argument() {
    global_log();
    let profile = Profile::default().context_window(64);
    let mut run = start(profile, Settings::default()).await;
    let out = generate(&mut run.client, ask(&"many words ".repeat(400))).await;
    let status = out.status.expect("a failed call");
    assert!(out.failed_at_start);
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(reason(&status), "CONTEXT_LENGTH_EXCEEDED");
    assert!(status.get_details_retry_info().is_none());
}

#[tokio::test]
async fn a_stream_cut_after_its_first_token_ends_with_a_status_after_the_tokens() {
    global_log();
    let profile = Profile::default()
        .output_tokens(Count::fixed(20))
        .cut_streams(1.0, Count::fixed(4), false);
    let mut run = start(profile, Settings::default()).await;
    let out = generate(&mut run.client, ask("Hello!")).await;
    assert!(
        !out.failed_at_start,
        "the call was committed at its first token"
    );
    assert!(!out.tokens.is_empty(), "the tokens before the cut arrived");
    let status = out.status.expect("the stream ends with a status");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(reason(&status), "STREAM_INTERRUPTED");
    assert_eq!(
        run.upstream.stats().requests,
        1,
        "never retried after the commit point"
    );
}

#[tokio::test]
async fn an_empty_prompt_is_refused_before_any_upstream_call() {
    global_log();
    let mut run = start(Profile::default(), Settings::default()).await;
    let out = generate(&mut run.client, ask("  ")).await;
    assert_eq!(out.status.expect("refused").code(), Code::InvalidArgument);
    assert_eq!(run.upstream.stats().requests, 0);
}

/// The contract for other languages, and what the hand-written Rust side puts on the wire:
/// every field of `proto/llm.proto` with its name, tag and wire type, and the method path.
#[test]
#[allow(clippy::needless_update)] // A one-field message has nothing for `..default()` to fill.
fn the_hand_written_messages_match_the_proto_file() {
    use crate::llm_stream::proto::Token;
    use prost::Message;

    /// (message, field, encoding of a message with only that field set), names checked by
    /// the compiler.
    macro_rules! only {
        ($message:ident . $field:ident = $value:expr) => {
            (
                stringify!($message),
                stringify!($field),
                $message {
                    $field: $value,
                    ..$message::default()
                }
                .encode_to_vec(),
            )
        };
    }
    let rust = [
        only!(GenerateRequest.model = "m".to_owned()),
        only!(GenerateRequest.prompt = "p".to_owned()),
        only!(GenerateRequest.max_tokens = 1),
        only!(Token.text = "t".to_owned()),
    ];

    let text = include_str!("../../proto/llm.proto");
    let mut package = "";
    let mut service = "";
    let mut methods = Vec::new();
    let mut message = "";
    let mut fields = Vec::new();
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or("").trim();
        let words: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || "=;({".contains(c))
            .filter(|w| !w.is_empty())
            .collect();
        match words.as_slice() {
            ["package", name] => package = name,
            ["service", name] => service = name,
            ["rpc", name, ..] => methods.push(format!("/{package}.{service}/{name}")),
            ["message", name] => message = name,
            ["}"] => message = "",
            [kind, name, tag] if !message.is_empty() => {
                fields.push((message, *name, *kind, tag.parse::<u64>().unwrap()));
            }
            _ => {}
        }
    }
    assert_eq!(methods, [crate::llm_stream::GENERATE_PATH]);
    assert_eq!(
        fields.len(),
        rust.len(),
        "every field of the .proto is in Rust: {fields:?}"
    );
    for (message, field, wire) in rust {
        let (_, _, kind, tag) = fields
            .iter()
            .find(|(m, f, _, _)| *m == message && *f == field)
            .unwrap_or_else(|| panic!("{message}.{field} is not in llm.proto"));
        let wire_type = match *kind {
            "string" | "bytes" => 2,
            "uint32" | "int32" | "uint64" | "int64" | "bool" => 0,
            other => panic!("teach this test the wire type of {other}"),
        };
        // The first byte of a one-field message is its key, `tag << 3 | wire type` (one
        // byte for tags below 16).
        assert_eq!(
            u64::from(wire[0]),
            tag << 3 | wire_type,
            "{message}.{field}"
        );
    }
}

#[tokio::test]
async fn the_clients_grpc_timeout_ends_a_529_storm_with_deadline_exceeded_before_it() {
    global_log();
    // Every call is overloaded; the service waits at least 1 s between attempts and has a
    // minute of time budget. The client waits 1.5 s.
    let profile = Profile::default().error(ErrorRule::random(529, 1.0));
    let mut run = start(profile, Settings::default()).await;
    let mut request = tonic::Request::new(ask("Hello!"));
    request.set_timeout(Duration::from_millis(1500));
    let started = std::time::Instant::now();
    let out = generate(&mut run.client, request).await;
    let took = started.elapsed();
    let status = out.status.expect("a failed call");
    assert!(out.failed_at_start);
    // The service's own answer (its ErrorInfo), not tonic's timer cancelling the call.
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(reason(&status), "DEADLINE_EXCEEDED");
    assert!(
        took < Duration::from_millis(1500),
        "ended before the client gave up: {took:?}"
    );
    // Attempts at 0 and after the first wait (1 to 1.1 s); the next wait does not fit.
    assert_eq!(run.upstream.stats().requests, 2);
}
