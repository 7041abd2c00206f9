//! Non-streamed answers that are failures in a `200`: an error object, nothing at all, or a
//! web page. All are found before the classify future resolves, so they are ordinary `Err`s
//! that the retry and fallback layers act on.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Chunks, drain, response, run};
use seawall_classify::ClassifyLayer;
use seawall_core::{BodyReport, FailureClass, FinishReason, LlmError};
use tower::{Layer, ServiceExt};

const JSON: &[(&str, &str)] = &[("content-type", "application/json")];

async fn outcome(body: &str) -> Result<(Vec<u8>, Arc<BodyReport>), LlmError> {
    let chunks: Vec<Vec<u8>> = body.as_bytes().chunks(7).map(<[u8]>::to_vec).collect();
    let resp = run(response(200, JSON, Chunks::new(chunks))).await?;
    let report = resp.extensions().get::<Arc<BodyReport>>().unwrap().clone();
    let (bytes, err) = drain(resp.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    Ok((bytes, report))
}

#[tokio::test]
async fn a_200_with_an_error_object_is_the_failure_it_names() {
    let cases = [
        (
            r#"{"error":{"message":"Rate limit reached. Please try again in 1.5s.","type":"tokens","code":"rate_limit_exceeded"}}"#,
            FailureClass::RateLimited,
        ),
        (
            r#"{"error":{"message":"Provider returned error","code":429,"metadata":{"provider_name":"x"}}}"#,
            FailureClass::RateLimited,
        ),
        (
            r#"{"error":{"message":"no capacity","status":503}}"#,
            FailureClass::Overloaded,
        ),
        (
            r#"{"error":{"message":"You exceeded your current quota","code":"insufficient_quota"}}"#,
            FailureClass::QuotaExhausted,
        ),
        (
            r#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":400}}"#,
            FailureClass::ContextLengthExceeded,
        ),
        (
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}"#,
            FailureClass::Overloaded,
        ),
        (
            r#"{"id":"x","error":{"message":"boom"}}"#,
            FailureClass::ServerError,
        ),
        (r#"{"error":"upstream failed"}"#, FailureClass::ServerError),
    ];
    for (body, class) in cases {
        let err = outcome(body).await.expect_err(body);
        assert_eq!(err.class(), class, "{body}");
        assert_eq!(err.status(), Some(http::StatusCode::OK));
    }
    let err = outcome(cases[0].0).await.unwrap_err();
    assert_eq!(err.code(), Some("rate_limit_exceeded"));
    assert_eq!(err.retry_after(), Some(Duration::from_millis(1500)));
    // Google's error model in a 200: the delay of its `RetryInfo` is the hint.
    let err = outcome(
        r#"{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"7s"}]}}"#,
    )
    .await
    .unwrap_err();
    assert_eq!(err.class(), FailureClass::RateLimited);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
    let err = outcome(cases[5].0).await.unwrap_err();
    assert_eq!(err.request_id(), Some("req_1"));
    assert_eq!(err.error_type(), Some("overloaded_error"));

    // `"error": null` beside a real answer is no error.
    let (bytes, _) = outcome(
        r#"{"object":"chat.completion","choices":[{"message":{"content":"Hi"}}],"error":null}"#,
    )
    .await
    .unwrap();
    assert!(bytes.ends_with(br#""error":null}"#));
}

#[tokio::test]
async fn a_200_web_page_is_a_server_error_and_other_types_pass() {
    // A proxy's block page or a captive portal, sent with a 200: nothing an SDK can parse.
    let page = "<html><head><title>Access blocked</title></head><body>This site is blocked by \
                your organisation's web filter.</body></html>";
    for content_type in ["text/html", " Text/HTML ; charset=UTF-8"] {
        let headers = [("content-type", content_type)];
        let err = run(response(200, &headers, Chunks::one(page)))
            .await
            .expect_err(content_type);
        assert_eq!(err.class(), FailureClass::ServerError, "{content_type}");
        assert_eq!(err.status(), Some(http::StatusCode::OK));
        assert!(err.message().contains("HTML"), "{err}");
        assert!(err.message().contains("Access blocked"), "{err}");
    }
    // Success bodies of other types pass as they are (speech, files, plain text).
    for content_type in [
        "audio/mpeg",
        "application/octet-stream",
        "text/plain",
        "text/htmlx",
    ] {
        let headers = [("content-type", content_type)];
        let resp = run(response(200, &headers, Chunks::one("ID3 bytes")))
            .await
            .unwrap();
        let (bytes, err) = drain(resp.into_body()).await;
        assert!(err.is_none(), "{content_type}: {err:?}");
        assert_eq!(bytes, b"ID3 bytes", "{content_type}");
    }
}

#[tokio::test]
async fn an_answer_longer_than_the_limit_passes_through_unread() {
    let body = format!(
        r#"{{"error":{{"message":"{}","status":503}}}}"#,
        "x".repeat(200)
    );
    let (bytes, err) = past_a_64_byte_limit(body.as_bytes()).await;
    assert_eq!(bytes, body.as_bytes());
    assert!(err.is_none());
}

/// A `200` JSON answer of `body`, in chunks of 50 bytes, through a layer that reads ahead at
/// most 64: the head is handed on, and the body is drained.
async fn past_a_64_byte_limit(body: &[u8]) -> (Vec<u8>, Option<LlmError>) {
    let chunks: Vec<Vec<u8>> = body.chunks(50).map(<[u8]>::to_vec).collect();
    let transport = tower::service_fn(move |_req: http::Request<bytes::Bytes>| {
        let chunks = chunks.clone();
        async move { Ok::<_, std::io::Error>(response(200, JSON, Chunks::new(chunks))) }
    });
    let resp = ClassifyLayer::builder()
        .error_body_limit(64)
        .build()
        .unwrap()
        .layer(transport)
        .oneshot(common::chat_request(false))
        .await
        .expect("past the limit the answer is not held back");
    drain(resp.into_body()).await
}

#[tokio::test]
async fn empty_answers_are_empty_response_failures() {
    for body in [
        r#"{"id":"c1","object":"chat.completion","model":"gpt-4o","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":0}}"#,
        r#"{"object":"chat.completion","choices":null}"#,
        r#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"stop"}]}"#,
        r#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[],"refusal":null},"finish_reason":"stop"}]}"#,
        r#"{"object":"text_completion","choices":[{"text":"","finish_reason":"stop"}]}"#,
        r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":0}}"#,
        r#"{"type":"message","content":[{"type":"text","text":""}],"stop_reason":"end_turn"}"#,
    ] {
        let err = outcome(body).await.expect_err(body);
        assert_eq!(err.class(), FailureClass::EmptyResponse, "{body}");
        assert!(err.class().default_disposition().allows_retry(false));
    }
}

#[tokio::test]
async fn answers_with_tool_calls_refusals_or_at_the_token_limit_are_not_empty() {
    for body in [
        r#"{"object":"chat.completion","choices":[{"message":{"content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}"#,
        r#"{"object":"chat.completion","choices":[{"message":{"content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}]}"#,
        r#"{"object":"chat.completion","choices":[{"message":{"content":[{"type":"text","text":"Hi"}]},"finish_reason":"stop"}]}"#,
        r#"{"object":"chat.completion","choices":[{"message":{"content":""},"finish_reason":"length"}]}"#,
        r#"{"type":"message","content":[{"type":"tool_use","id":"t","name":"now","input":{}}],"stop_reason":"tool_use"}"#,
        r#"{"object":"list","data":[{"object":"embedding","embedding":[0.1],"index":0}],"model":"e"}"#,
        r#"{}"#,
    ] {
        let (bytes, report) = outcome(body).await.expect(body);
        assert_eq!(bytes, body.as_bytes());
        assert!(report.is_finished());
    }
}

#[tokio::test]
async fn a_read_ahead_answer_is_parsed_once_and_replayed_whole() {
    let body = r#"{"id":"c2","object":"chat.completion","model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"Hello \"there\"\n"},"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":3}}}"#;
    let (bytes, report) = outcome(body).await.unwrap();
    assert_eq!(bytes, body.as_bytes());
    assert_eq!(report.model(), Some("gpt-4o-2024-08-06"));
    assert_eq!(
        report
            .usage()
            .map(|u| (u.input_tokens, u.output_tokens, u.cached_input_tokens)),
        Some((19, 10, 3))
    );
    assert_eq!(report.finish_reason(), Some(&FinishReason::Stop));
    assert!(report.is_finished());
    // Parsed once: the answer counts as one event of content, not one per read.
    assert_eq!(report.content_events(), 1);
}

#[tokio::test]
async fn blank_lines_sent_while_a_non_streamed_answer_is_generated_are_read_past() {
    // DeepSeek keeps a slow non-streamed request alive with empty lines before the JSON.
    let answer = r#"{"id":"c3","object":"chat.completion","model":"deepseek-chat","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":2}}"#;
    let body = format!("\n\n\r\n\n{answer}");
    let (bytes, report) = outcome(&body).await.unwrap();
    assert_eq!(bytes, body.as_bytes());
    assert_eq!(report.model(), Some("deepseek-chat"));
    assert_eq!(
        report.usage().map(|u| (u.input_tokens, u.output_tokens)),
        Some((7, 2))
    );
    assert_eq!(report.finish_reason(), Some(&FinishReason::Stop));

    let err = outcome("\n\n\n{\"error\":{\"message\":\"Server overloaded\",\"status\":503}}")
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Overloaded);
    // Only blank lines, then the connection closed: no answer, a retryable failure.
    for body in ["", "\n\n\n\n", "\r\n \t\n"] {
        let err = outcome(body).await.expect_err(body);
        assert_eq!(err.class(), FailureClass::EmptyResponse, "{body:?}");
    }

    // Past the read-ahead limit the head is handed on first, and the body ends in the error.
    let (bytes, err) = past_a_64_byte_limit(&b"\n".repeat(200)).await;
    assert_eq!(bytes.len(), 200);
    assert_eq!(err.map(|e| e.class()), Some(FailureClass::EmptyResponse));
}

#[tokio::test]
async fn an_answer_the_content_filter_stopped_before_any_content_is_not_retried() {
    for body in [
        r#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"content_filter"}]}"#,
        r#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":null},"finish_reason":"content_filter"}],"usage":{"prompt_tokens":9,"completion_tokens":0}}"#,
        r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":"refusal","usage":{"input_tokens":5,"output_tokens":0}}"#,
    ] {
        let err = outcome(body).await.expect_err(body);
        assert_eq!(err.class(), FailureClass::ContentFiltered, "{body}");
        assert!(!err.class().default_disposition().allows_retry(true));
    }
    // Text before the filter stopped it is an answer: the caller has what was written.
    let partial = r#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Once upon"},"finish_reason":"content_filter"}]}"#;
    let (bytes, report) = outcome(partial).await.expect(partial);
    assert_eq!(bytes, partial.as_bytes());
    assert_eq!(report.finish_reason(), Some(&FinishReason::ContentFilter));
}

/// A Responses API answer (`POST /v1/responses`) with `status`, `incomplete_details` and
/// `output` items as given.
fn response_object(status: &str, incomplete: &str, output: &str) -> String {
    format!(
        r#"{{"id":"resp_1","object":"response","created_at":1741476542,"status":"{status}","error":null,"incomplete_details":{incomplete},"model":"gpt-4.1","output":{output},"usage":{{"input_tokens":36,"input_tokens_details":{{"cached_tokens":0}},"output_tokens":3,"output_tokens_details":{{"reasoning_tokens":0}},"total_tokens":39}}}}"#
    )
}

#[tokio::test]
async fn responses_api_answers_report_how_they_finished_and_an_empty_one_fails() {
    let message = r#"[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}]}]"#;
    let length = r#"{"reason":"max_output_tokens"}"#;
    let filtered = r#"{"reason":"content_filter"}"#;
    for (body, finish) in [
        (
            response_object("completed", "null", message),
            FinishReason::Stop,
        ),
        (
            response_object("incomplete", length, message),
            FinishReason::Length,
        ),
        // Stopped at the limit before any output (reasoning used it up): an answer to continue.
        (
            response_object("incomplete", length, "[]"),
            FinishReason::Length,
        ),
        (
            response_object("incomplete", filtered, message),
            FinishReason::ContentFilter,
        ),
    ] {
        let (_, report) = outcome(&body).await.expect(&body);
        assert_eq!(report.finish_reason(), Some(&finish), "{body}");
        assert_eq!(report.usage().map(|u| u.output_tokens), Some(3));
    }
    // Finished with nothing: empty, or stopped by the content filter.
    let empty = outcome(&response_object("completed", "null", "[]")).await;
    assert_eq!(empty.unwrap_err().class(), FailureClass::EmptyResponse);
    let refused = outcome(&response_object("incomplete", filtered, "[]")).await;
    assert_eq!(refused.unwrap_err().class(), FailureClass::ContentFiltered);
    // A background answer that has not started holds nothing yet, and is no failure.
    let (_, report) = outcome(&response_object("queued", "null", "[]"))
        .await
        .expect("a queued answer");
    assert_eq!(report.finish_reason(), None);
}

#[tokio::test]
async fn an_answer_that_is_itself_an_error_object_is_that_error() {
    // vLLM and other OpenAI-compatible servers write an error as the whole document, with
    // `"object": "error"` and no `error` member; its code and words name the class.
    let body = r#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5100 tokens (100 in the messages, 5000 in the completion).","type":"BadRequestError","param":null,"code":400}"#;
    let err = outcome(body).await.expect_err(body);
    assert_eq!(err.class(), FailureClass::ContextLengthExceeded);
    assert!(err.message().contains("maximum context length"));
    let overloaded = r#"{"object":"error","message":"The engine is overloaded.","type":"ServiceUnavailableError","param":null,"code":503}"#;
    let err = outcome(overloaded).await.expect_err(overloaded);
    assert_eq!(err.class(), FailureClass::Overloaded);
    // An answer is not one because a member is named `object`.
    let answer = r#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"error"},"finish_reason":"stop"}]}"#;
    assert!(outcome(answer).await.is_ok());
}

#[tokio::test]
async fn an_answer_whose_finish_word_says_it_failed_is_that_failure() {
    let body = r#"{"id":"c1","object":"chat.completion","model":"deepseek-chat","choices":[{"index":0,"message":{"role":"assistant","content":"The sea"},"finish_reason":"insufficient_system_resource"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}"#;
    let err = outcome(body).await.expect_err(body);
    assert_eq!(err.class(), FailureClass::Overloaded);
    assert_eq!(err.error_type(), Some("insufficient_system_resource"));
    assert!(err.class().default_disposition().allows_retry(true));
    // A router's `error` finish: a server error, not an answer.
    let failed = body.replace("insufficient_system_resource", "error");
    let err = outcome(&failed).await.expect_err(&failed);
    assert_eq!(err.class(), FailureClass::ServerError);
    // Z.ai's `network_error`: its inference failed mid-answer.
    let failed = body.replace("insufficient_system_resource", "network_error");
    let err = outcome(&failed).await.expect_err(&failed);
    assert_eq!(err.class(), FailureClass::ServerError);
    // Z.ai's `sensitive`: its safety review stopped the answer, as a content filter would.
    let filtered = body
        .replace("\"The sea\"", "\"\"")
        .replace("insufficient_system_resource", "sensitive");
    let err = outcome(&filtered).await.expect_err(&filtered);
    assert_eq!(err.class(), FailureClass::ContentFiltered);
}
