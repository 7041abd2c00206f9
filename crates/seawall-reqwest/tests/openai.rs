//! The real async-openai client over a seawall stack (`OpenAiService`), against the chaos
//! upstream over loopback: answers complete and streamed, server hints, overloads, quota, and
//! a stream cut after its first content, and answers replayed from the cache.

mod common;

use std::time::Duration;

use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessage, CreateChatCompletionRequest, CreateChatCompletionRequestArgs,
    FinishReason,
};
use common::{KEY, Mock, bounded, ms, retry, start};
use futures_util::StreamExt;
use seawall_cache::{CacheLayer, MemoryStore};
use seawall_classify::ClassifyLayer;
use seawall_core::{FailureClass, LlmError};
use seawall_mock::{Count, Delay, ErrorRule, Profile};
use seawall_reqwest::{OpenAiLayer, ReqwestTransport};
use seawall_retry::BackoffRetryLayer;
use seawall_stream::StreamTimeoutLayer;
use tower::ServiceBuilder;

/// async-openai's client on `retry` over the user's reqwest client, pointed at the mock.
fn client(mock: &Mock, retry: BackoffRetryLayer) -> async_openai::Client<OpenAIConfig> {
    let service = ServiceBuilder::new()
        .layer(OpenAiLayer::new())
        .layer(retry)
        .layer(StreamTimeoutLayer::new())
        .layer(ClassifyLayer::new())
        .service(reqwest_transport());
    async_openai::Client::with_config(config(mock)).with_http_service(service)
}

/// The user's reqwest client as the transport.
fn reqwest_transport() -> ReqwestTransport {
    ReqwestTransport::new(ReqwestTransport::client_builder().build().unwrap())
}

/// async-openai's configuration for the mock.
fn config(mock: &Mock) -> OpenAIConfig {
    OpenAIConfig::new()
        .with_api_base(mock.base_url())
        .with_api_key(KEY)
}

fn request(model: &str) -> CreateChatCompletionRequest {
    CreateChatCompletionRequestArgs::default()
        .model(model)
        .max_completion_tokens(64u32)
        .messages([ChatCompletionRequestUserMessage::from("Say hello").into()])
        .build()
        .unwrap()
}

/// What a streamed chat completion gave: its content, its finish reason if one came, and the
/// error that ended it, if one did.
struct Streamed {
    content: String,
    finish: Option<FinishReason>,
    error: Option<OpenAIError>,
}

async fn stream(client: &async_openai::Client<OpenAIConfig>) -> Streamed {
    let mut stream = client
        .chat()
        .create_stream(request("gpt-4o-mini"))
        .await
        .unwrap();
    let mut out = Streamed {
        content: String::new(),
        finish: None,
        error: None,
    };
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => {
                for choice in chunk.choices {
                    out.content
                        .push_str(choice.delta.content.as_deref().unwrap_or(""));
                    out.finish = out.finish.or(choice.finish_reason);
                }
            }
            Err(e) => {
                out.error = Some(e);
                break;
            }
        }
    }
    out
}

#[tokio::test]
async fn a_chat_completion_is_answered_complete_and_streamed() {
    bounded(async {
        let mock = start(Profile::default().per_token_latency(Delay::fixed(ms(2)))).await;
        let client = client(&mock, retry(3, ms(1)));

        let answer = client.chat().create(request("gpt-4o-mini")).await.unwrap();
        assert_eq!(answer.choices.len(), 1);
        let content = answer.choices[0]
            .message
            .content
            .clone()
            .unwrap_or_default();
        assert!(!content.is_empty());

        let streamed = stream(&client).await;
        assert!(streamed.error.is_none(), "{:?}", streamed.error);
        assert!(!streamed.content.is_empty());
        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.ok, s.streams_completed), (2, 2, 1), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn a_rate_limit_with_a_hint_is_retried_and_the_caller_sees_the_answer() {
    bounded(async {
        let hint = Duration::from_secs(1);
        let mock = start(
            Profile::default()
                .error(ErrorRule::outage(429, Duration::ZERO, ms(800)).retry_after(hint)),
        )
        .await;
        let client = client(&mock, retry(4, ms(1)));

        let started = std::time::Instant::now();
        let answer = client.chat().create(request("gpt-4o-mini")).await.unwrap();
        assert_eq!(answer.choices.len(), 1);
        let s = mock.upstream.stats();
        let limited = s.status(429);
        assert!(limited >= 1, "{s:?}");
        assert_eq!(s.requests, limited + 1, "{s:?}");
        assert!(started.elapsed() >= hint * limited as u32);
    })
    .await;
}

#[tokio::test]
async fn a_burst_of_529s_is_retried_by_the_one_retry_loop() {
    bounded(async {
        let mock =
            start(Profile::default().error(ErrorRule::outage(529, Duration::ZERO, ms(700)))).await;
        let client = client(&mock, retry(10, ms(250)));

        let answer = client.chat().create(request("gpt-4o-mini")).await.unwrap();
        assert_eq!(answer.choices.len(), 1);
        let s = mock.upstream.stats();
        let overloaded = s.status(529);
        assert!(overloaded >= 1, "{s:?}");
        assert_eq!(s.requests, overloaded + 1, "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn an_exhausted_quota_is_an_api_error_after_exactly_one_upstream_call() {
    bounded(async {
        let mock = start(Profile::default().exhausted_key(KEY)).await;
        let client = client(&mock, retry(4, ms(1)));

        let err = client
            .chat()
            .create(request("gpt-4o-mini"))
            .await
            .unwrap_err();
        let OpenAIError::ApiError(e) = err else {
            panic!("an API error, as async-openai's own client reports it: {err:?}");
        };
        assert_eq!(e.status_code, 429);
        assert_eq!(e.api_error.code.as_deref(), Some("insufficient_quota"));
        let s = mock.upstream.stats();
        assert_eq!((s.requests, s.quota_exhausted), (1, 1), "{s:?}");
    })
    .await;
}

#[tokio::test]
async fn a_stream_cut_after_content_yields_the_content_then_an_error_and_is_not_retried() {
    bounded(async {
        let mock = start(
            Profile::default()
                .per_token_latency(Delay::fixed(ms(1)))
                .cut_streams(1.0, Count::fixed(4), false),
        )
        .await;
        let client = client(&mock, retry(3, ms(1)));

        let Streamed { content, error, .. } = stream(&client).await;
        assert!(!content.is_empty(), "the content came first");
        let error = error.expect("then an error, never a silent truncation");
        assert!(matches!(error, OpenAIError::StreamError(_)), "{error:?}");
        let s = mock.upstream.stats();
        assert_eq!(
            (s.requests, s.streams_cut),
            (1, 1),
            "past the commit point: {s:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_failure_without_an_upstream_answer_is_a_boxed_llm_error() {
    bounded(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = listener.local_addr().unwrap();
        drop(listener);
        let service = ServiceBuilder::new()
            .layer(OpenAiLayer::new())
            .layer(retry(1, ms(1)))
            .layer(ClassifyLayer::new())
            .service(ReqwestTransport::new(
                ReqwestTransport::client_builder().build().unwrap(),
            ));
        let config = OpenAIConfig::new()
            .with_api_base(format!("http://{closed}/v1"))
            .with_api_key(KEY);
        let client = async_openai::Client::with_config(config).with_http_service(service);

        let err = client
            .chat()
            .create(request("gpt-4o-mini"))
            .await
            .unwrap_err();
        let OpenAIError::Boxed(e) = err else {
            panic!("the LlmError, boxed: {err:?}");
        };
        let e = e
            .downcast_ref::<LlmError>()
            .expect("downcasts to the LlmError");
        assert_eq!(e.class(), FailureClass::Connect);
    })
    .await;
}

#[tokio::test]
async fn a_cached_answer_reaches_async_openai_whole_and_as_a_stream_after_one_upstream_call() {
    bounded(async {
        let mock = start(Profile::default().per_token_latency(Delay::fixed(ms(1)))).await;
        let service = ServiceBuilder::new()
            .layer(OpenAiLayer::new())
            .layer(CacheLayer::new(MemoryStore::new()))
            .layer(retry(3, ms(1)))
            .layer(StreamTimeoutLayer::new())
            .layer(ClassifyLayer::new())
            .service(reqwest_transport());
        let client = async_openai::Client::with_config(config(&mock)).with_http_service(service);

        let first = client.chat().create(request("gpt-4o-mini")).await.unwrap();
        let again = client.chat().create(request("gpt-4o-mini")).await.unwrap();
        let said = |a: &async_openai::types::chat::CreateChatCompletionResponse| {
            a.choices[0].message.content.clone().unwrap_or_default()
        };
        assert!(!said(&first).is_empty());
        assert_eq!(said(&again), said(&first));
        assert_eq!(
            again.usage, first.usage,
            "the answer is replayed as it came"
        );

        // The same question streamed: async-openai parses the cache's replay as SSE chunks.
        let streamed = stream(&client).await;
        assert!(streamed.error.is_none(), "{:?}", streamed.error);
        assert_eq!(streamed.content, said(&first));
        assert!(
            streamed.finish.is_some(),
            "the replay ends with its finish reason"
        );
        let s = mock.upstream.stats();
        assert_eq!(s.requests, 1, "one upstream call for three answers: {s:?}");
    })
    .await;
}
