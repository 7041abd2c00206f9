//! Successful bodies: SSE streams of both wire formats and plain JSON, read without buffering.

mod common;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{Chunks, chat_request, drain, response, run, run_request, sse_response};
use http_body_util::BodyExt;
use proptest::prelude::*;
use seawall_core::{
    BodyReport, Completion, FailureClass, FinishReason, LlmResponse, Outcome, Usage,
};

const OPENAI_STREAM: &str = concat!(
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
    ": keep-alive\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":2,\"total_tokens\":22,\"prompt_tokens_details\":{\"cached_tokens\":8,\"audio_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}\n\n",
    "data: [DONE]\n\n",
);

const ANTHROPIC_STREAM: &str = concat!(
    "event: message_start\n",
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5-20250929\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":5,\"cache_read_input_tokens\":10,\"output_tokens\":1}}}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: ping\n",
    "data: {\"type\": \"ping\"}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"!\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: message_delta\n",
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n",
    "event: message_stop\n",
    "data: {\"type\":\"message_stop\"}\n\n",
);

const ANTHROPIC_OVERLOADED: &str = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"},\"request_id\":null}\n\n";

/// What a body run leaves behind, for comparisons.
#[derive(Debug, PartialEq)]
struct Summary {
    bytes: Vec<u8>,
    usage: Option<Usage>,
    model: Option<String>,
    finish: Option<FinishReason>,
    finished: bool,
    content_events: u64,
    error: Option<(FailureClass, Option<String>, String)>,
}

async fn summarize(resp: http::Response<seawall_classify::ClassifiedBody<Chunks>>) -> Summary {
    let report: Arc<BodyReport> = resp.extensions().get::<Arc<BodyReport>>().unwrap().clone();
    let (bytes, err) = drain(resp.into_body()).await;
    Summary {
        bytes,
        usage: report.usage(),
        model: report.model().map(str::to_owned),
        finish: report.finish_reason().cloned(),
        finished: report.is_finished(),
        content_events: report.content_events(),
        error: err.map(|e| {
            (
                e.class(),
                e.error_type().map(str::to_owned),
                e.message().to_owned(),
            )
        }),
    }
}

/// What the classifier makes of a whole JSON answer.
async fn json_of(body: String) -> Summary {
    let resp = response(
        200,
        &[("content-type", "application/json")],
        Chunks::one(body),
    );
    summarize(run(resp).await.unwrap()).await
}

async fn stream_of(chunks: Vec<Vec<u8>>) -> Summary {
    summarize(run(sse_response(Chunks::new(chunks))).await.unwrap()).await
}

fn usage(input: u64, output: u64, cached: u64) -> Option<Usage> {
    Some(Usage {
        input_tokens: input,
        output_tokens: output,
        cached_input_tokens: cached,
        cache_write_input_tokens: 0,
        cache_write_1h_input_tokens: 0,
    })
}

/// `usage` with `n` of its input tokens written to the provider's cache.
fn written(usage: Option<Usage>, n: u64) -> Option<Usage> {
    usage.map(|u| Usage {
        cache_write_input_tokens: n,
        ..u
    })
}

#[tokio::test]
async fn openai_stream_fills_the_report_and_passes_bytes_through() {
    let s = stream_of(vec![OPENAI_STREAM.into()]).await;
    assert_eq!(s.bytes, OPENAI_STREAM.as_bytes());
    assert_eq!(s.error, None);
    assert_eq!(s.content_events, 2, "the empty role delta is not content");
    assert_eq!(s.model.as_deref(), Some("gpt-4o-mini-2024-07-18"));
    assert_eq!(s.finish, Some(FinishReason::Stop));
    assert_eq!(s.usage, usage(20, 2, 8));
    assert!(s.finished);
}

#[tokio::test]
async fn anthropic_stream_fills_the_report() {
    let s = stream_of(vec![ANTHROPIC_STREAM.into()]).await;
    assert_eq!(s.bytes, ANTHROPIC_STREAM.as_bytes());
    assert_eq!(s.error, None);
    assert_eq!(s.content_events, 2);
    assert_eq!(s.model.as_deref(), Some("claude-sonnet-4-5-20250929"));
    assert_eq!(s.finish, Some(FinishReason::Stop));
    // input = 25 + 10 cache reads + 5 cache writes; cached = the reads, written = the writes.
    assert_eq!(s.usage, written(usage(40, 15, 10), 5));
    assert!(s.finished);
}

#[tokio::test]
async fn finish_reasons_of_both_formats() {
    for (openai, want) in [
        ("stop", FinishReason::Stop),
        ("length", FinishReason::Length),
        ("tool_calls", FinishReason::ToolCalls),
        ("content_filter", FinishReason::ContentFilter),
        ("weird", FinishReason::Other("weird".into())),
    ] {
        let body = OPENAI_STREAM.replace(
            "\"finish_reason\":\"stop\"",
            &format!("\"finish_reason\":\"{openai}\""),
        );
        assert_eq!(
            stream_of(vec![body.into()]).await.finish,
            Some(want),
            "{openai}"
        );
    }
    for (anthropic, want) in [
        ("end_turn", FinishReason::Stop),
        ("max_tokens", FinishReason::Length),
        ("tool_use", FinishReason::ToolCalls),
        ("stop_sequence", FinishReason::Stop),
        ("refusal", FinishReason::ContentFilter),
    ] {
        let body = ANTHROPIC_STREAM.replace("\"end_turn\"", &format!("\"{anthropic}\""));
        assert_eq!(
            stream_of(vec![body.into()]).await.finish,
            Some(want),
            "{anthropic}"
        );
    }
}

#[tokio::test]
async fn keep_alives_blank_lines_and_pings_are_not_content() {
    let chunks: Vec<&[u8]> = vec![
        b": keep-alive\n\n",
        b"\n\n\n",
        b"event: ping\ndata: {\"type\": \"ping\"}\n\n",
        b": OPENROUTER PROCESSING\n\n",
        b"data: {\"model\":\"deepseek-chat\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        b"data: {\"model\":\"deepseek-chat\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n",
    ];
    let resp = run(sse_response(Chunks::new(chunks.clone())))
        .await
        .unwrap();
    let report = resp.body_report().unwrap().clone();
    let mut body = resp.into_body();
    for (i, chunk) in chunks.iter().enumerate().take(chunks.len() - 1) {
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), chunk);
        assert!(!report.has_content(), "chunk {i} is not content");
    }
    body.frame().await.unwrap().unwrap();
    assert!(report.has_content());
    assert_eq!(report.content_events(), 1);
}

#[tokio::test]
async fn reasoning_tool_calls_and_refusals_are_content() {
    for delta in [
        r#"{"reasoning_content":"think"}"#,
        r#"{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}"#,
        r#"{"refusal":"I can't"}"#,
    ] {
        let chunk = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{delta}}}]}}\n\ndata: [DONE]\n\n"
        );
        assert_eq!(
            stream_of(vec![chunk.into()]).await.content_events,
            1,
            "{delta}"
        );
    }
    let tool = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\"\"}}\n\n";
    assert_eq!(stream_of(vec![tool.into()]).await.content_events, 1);
}

#[tokio::test]
async fn anthropic_error_before_content_keeps_its_class() {
    let start = ANTHROPIC_STREAM
        .split("event: content_block_start")
        .next()
        .unwrap();
    let chunks = vec![
        start.into(),
        b"event: ping\ndata: {\"type\": \"ping\"}\n\n".to_vec(),
        ANTHROPIC_OVERLOADED.into(),
    ];
    let resp = run(response(
        200,
        &[
            ("content-type", "text/event-stream"),
            ("request-id", "req_stream"),
        ],
        Chunks::new(chunks),
    ))
    .await
    .unwrap();
    let (bytes, err) = drain(resp.into_body()).await;
    assert!(
        bytes.ends_with(ANTHROPIC_OVERLOADED.as_bytes()),
        "the error chunk passes through first"
    );
    let err = err.unwrap();
    assert_eq!(err.class(), FailureClass::Overloaded);
    assert_eq!(err.error_type(), Some("overloaded_error"));
    assert_eq!(err.message(), "Overloaded");
    assert_eq!(err.status(), Some(http::StatusCode::OK));
    assert_eq!(err.request_id(), Some("req_stream"));
}

#[tokio::test]
async fn anthropic_error_after_content_is_stream_interrupted() {
    let cut = ANTHROPIC_STREAM
        .split("event: content_block_stop")
        .next()
        .unwrap();
    let s = stream_of(vec![cut.into(), ANTHROPIC_OVERLOADED.into()]).await;
    assert_eq!(
        s.error,
        Some((
            FailureClass::StreamInterrupted,
            Some("overloaded_error".into()),
            "Overloaded".into()
        ))
    );
    assert!(!s.finished);
    // The input usage of message_start is kept for accounting.
    assert_eq!(s.usage, written(usage(40, 1, 10), 5));
}

#[tokio::test]
async fn openai_error_chunk_before_and_after_content() {
    let error = "data: {\"error\":{\"message\":\"The server had an error while processing your request.\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n";
    let s = stream_of(vec![error.into()]).await;
    assert_eq!(s.error.as_ref().unwrap().0, FailureClass::ServerError);
    assert_eq!(s.error.as_ref().unwrap().1.as_deref(), Some("server_error"));

    let content = OPENAI_STREAM.split("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[{\"index\":0,\"delta\":{},").next().unwrap();
    let s = stream_of(vec![content.into(), error.into()]).await;
    let (class, ty, message) = s.error.unwrap();
    assert_eq!(class, FailureClass::StreamInterrupted);
    assert_eq!(ty.as_deref(), Some("server_error"));
    assert!(message.starts_with("The server had an error"));

    let rate = "data: {\"error\":{\"message\":\"Rate limit reached. Please try again in 1.4s.\",\"type\":\"tokens\",\"code\":\"rate_limit_exceeded\"}}\n\n";
    let resp = run(sse_response(Chunks::one(rate))).await.unwrap();
    let err = drain(resp.into_body()).await.1.unwrap();
    assert_eq!(err.class(), FailureClass::RateLimited);
    assert_eq!(err.code(), Some("rate_limit_exceeded"));
    assert_eq!(err.retry_after(), Some(Duration::from_millis(1400)));

    // OpenRouter-style: an error next to `choices` in a chunk.
    let mid = "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"error\":{\"code\":502,\"message\":\"Provider disconnected\"},\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"finish_reason\":\"error\"}]}\n\n";
    let s = stream_of(vec![mid.into()]).await;
    assert_eq!(s.error.unwrap().0, FailureClass::ServerError);
}

/// `stream` without its finish chunk and `[DONE]`.
fn without_finish(stream: &str) -> String {
    stream
        .split_inclusive("\n\n")
        .filter(|e| !e.contains("\"finish_reason\":\"stop\"") && !e.contains("[DONE]"))
        .collect()
}

#[tokio::test]
async fn a_stream_whose_every_choice_finished_is_whole_without_its_done_marker() {
    // Text Generation Inference before 2.1.1 and some llama.cpp forks leave `[DONE]` out; a
    // connection can close just before it. The finish reasons say the answer is whole.
    let no_done = OPENAI_STREAM.replace("data: [DONE]\n\n", "");
    let s = stream_of(vec![no_done.into()]).await;
    assert_eq!(s.error, None);
    assert!(s.finished);
    assert_eq!(s.finish, Some(FinishReason::Stop));
    assert_eq!(s.usage, usage(20, 2, 8));
    // Closed right after the finish chunk, before the usage chunk.
    let end = OPENAI_STREAM.find("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[],").unwrap();
    let s = stream_of(vec![OPENAI_STREAM[..end].into()]).await;
    assert_eq!(s.error, None);
    assert!(s.finished);

    let chunk = |index: u64, content: &str, finish: &str| {
        format!(
            "data: {{\"choices\":[{{\"index\":{index},\"delta\":{{\"content\":\"{content}\"}},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    // Two choices: whole only once both finished.
    let both = [
        chunk(0, "a", "null"),
        chunk(1, "b", "null"),
        chunk(0, "", "\"stop\""),
        chunk(1, "", "\"length\""),
    ]
    .concat();
    let s = stream_of(vec![both.into()]).await;
    assert_eq!(s.error, None);
    let one = [
        chunk(0, "a", "null"),
        chunk(1, "b", "null"),
        chunk(0, "", "\"stop\""),
    ]
    .concat();
    let s = stream_of(vec![one.into()]).await;
    assert_eq!(s.error.unwrap().0, FailureClass::StreamInterrupted);
    // A choice seen at index 1 only: index 0 never finished.
    let s = stream_of(vec![chunk(1, "b", "\"stop\"").into()]).await;
    assert_eq!(s.error.unwrap().0, FailureClass::StreamInterrupted);
    // An empty finish reason (a server's placeholder on every chunk) is no finish.
    let s = stream_of(vec![chunk(0, "a", "\"\"").into()]).await;
    assert_eq!(s.error.unwrap().0, FailureClass::StreamInterrupted);
    // Past the choices this reading tracks, the marker is needed.
    let s = stream_of(vec![chunk(64, "a", "\"stop\"").into()]).await;
    assert_eq!(s.error.unwrap().0, FailureClass::StreamInterrupted);
}

#[tokio::test]
async fn missing_finish_marker_is_an_error_not_a_truncation() {
    // Cut before the finish chunk (the usage chunk came first, as a router may send it).
    let cut = without_finish(OPENAI_STREAM);
    let s = stream_of(vec![cut.into()]).await;
    assert_eq!(s.error.as_ref().unwrap().0, FailureClass::StreamInterrupted);
    assert!(!s.finished);
    assert_eq!(
        s.usage,
        usage(20, 2, 8),
        "usage seen before the cut is kept"
    );

    let cut = ANTHROPIC_STREAM.replace(
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        "",
    );
    let s = stream_of(vec![cut.into()]).await;
    assert_eq!(s.error.unwrap().0, FailureClass::StreamInterrupted);
    assert_eq!(s.usage, written(usage(40, 15, 10), 5));

    // Before any content nothing reached the caller: Disconnected (retryable if idempotent).
    let s = stream_of(vec![b": keep-alive\n\n".to_vec()]).await;
    assert_eq!(s.error.unwrap().0, FailureClass::Disconnected);
    let s = stream_of(vec![]).await;
    assert_eq!(s.error.unwrap().0, FailureClass::Disconnected);

    // `data: [DONE]` without the trailing blank line still counts.
    let s = stream_of(vec![
        b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]".to_vec(),
    ])
    .await;
    assert_eq!(s.error, None);
    assert!(s.finished);
}

#[tokio::test]
async fn transport_error_mid_stream() {
    let content = OPENAI_STREAM.split("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[{\"index\":0,\"delta\":{},").next().unwrap();
    let body = Chunks::one(content.to_owned()).then_fail(io::ErrorKind::ConnectionReset);
    let resp = run(response(
        200,
        &[
            ("content-type", "text/event-stream"),
            ("x-request-id", "req_t"),
        ],
        body,
    ))
    .await
    .unwrap();
    let (_, err) = drain(resp.into_body()).await;
    let err = err.unwrap();
    assert_eq!(err.class(), FailureClass::StreamInterrupted);
    assert_eq!(err.request_id(), Some("req_t"));
    let io = err
        .source_ref()
        .unwrap()
        .downcast_ref::<io::Error>()
        .unwrap();
    assert_eq!(io.kind(), io::ErrorKind::ConnectionReset);

    let body = Chunks::one(": keep-alive\n\n").then_fail(io::ErrorKind::ConnectionReset);
    let (_, err) = drain(run(sse_response(body)).await.unwrap().into_body()).await;
    assert_eq!(err.unwrap().class(), FailureClass::Disconnected);

    // A JSON body that breaks after its first bytes.
    let body = Chunks::one("{\"id\":").then_fail(io::ErrorKind::UnexpectedEof);
    let (_, err) = drain(
        run(response(200, &[("content-type", "application/json")], body))
            .await
            .unwrap()
            .into_body(),
    )
    .await;
    assert_eq!(err.unwrap().class(), FailureClass::StreamInterrupted);
}

#[tokio::test]
async fn crlf_lines_and_multi_line_data() {
    let body = OPENAI_STREAM.replace('\n', "\r\n");
    let s = stream_of(vec![body.into()]).await;
    assert_eq!(s.content_events, 2);
    assert!(s.finished);
    let multi = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\ndata: \"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let s = stream_of(vec![multi.into()]).await;
    assert_eq!(s.content_events, 1);
    assert!(s.finished);
}

#[tokio::test]
async fn oversized_lines_are_bounded_and_skipped() {
    let mut huge = b"data: {\"choices\":[{\"delta\":{\"content\":\"".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 3 << 20));
    huge.extend_from_slice(b"\"}}]}\n\n");
    let chunks: Vec<Vec<u8>> = huge
        .chunks(64 * 1024)
        .map(<[u8]>::to_vec)
        .chain([b"data: [DONE]\n\n".to_vec()])
        .collect();
    let s = stream_of(chunks).await;
    assert_eq!(s.error, None);
    assert!(s.finished);
    assert_eq!(
        s.content_events, 1,
        "the skipped event still counts as output"
    );
}

#[tokio::test]
async fn responses_api_stream() {
    let body = concat!(
        "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"model\":\"gpt-4.1\",\"status\":\"in_progress\"}}\n\n",
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"model\":\"gpt-4.1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":12,\"input_tokens_details\":{\"cached_tokens\":4},\"output_tokens\":3,\"total_tokens\":15}}}\n\n",
    );
    let s = stream_of(vec![body.into()]).await;
    assert_eq!(s.error, None);
    assert_eq!(s.model.as_deref(), Some("gpt-4.1"));
    assert_eq!(s.usage, usage(12, 3, 4));
    assert!(s.finished);
    assert_eq!(s.content_events, 1);
}

const OPENAI_JSON: &str = r#"{"id":"chatcmpl-2","object":"chat.completion","created":1,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there"},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0}},"system_fingerprint":"fp_1"}"#;
const ANTHROPIC_JSON: &str = r#"{"id":"msg_2","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[{"type":"text","text":"Hi"}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":7,"cache_creation_input_tokens":0,"cache_read_input_tokens":3,"output_tokens":5}}"#;

#[tokio::test]
async fn json_bodies_fill_the_report_at_their_end() {
    let s = summarize(
        run(response(
            200,
            &[("content-type", "application/json")],
            Chunks::one(OPENAI_JSON),
        ))
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(s.bytes, OPENAI_JSON.as_bytes());
    assert_eq!(s.model.as_deref(), Some("gpt-4o-2024-08-06"));
    assert_eq!(s.usage, usage(19, 10, 0));
    assert_eq!(s.finish, Some(FinishReason::Length));
    assert!(s.finished);
    assert_eq!(s.content_events, 1);

    let s = summarize(
        run(response(
            200,
            &[("content-type", "application/json")],
            Chunks::one(ANTHROPIC_JSON),
        ))
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(s.model.as_deref(), Some("claude-haiku-4-5"));
    assert_eq!(s.usage, usage(10, 5, 3));
    assert_eq!(s.finish, Some(FinishReason::ToolCalls));
}

#[tokio::test]
async fn thought_tokens_counted_only_in_the_total_are_output() {
    // Gemini through its OpenAI-compatible endpoint (or a proxy translating its counts): the
    // thought tokens are in `total_tokens` and billed as output, not in `completion_tokens`.
    let gemini = r#"{"id":"g","object":"chat.completion","created":1,"model":"gemini-2.5-flash","choices":[{"index":0,"message":{"role":"assistant","content":"36"},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":198,"total_tokens":623}}"#;
    // The same with a member the byte scan leaves to serde (an escaped key).
    let by_serde = gemini.replace(r#""created""#, r#""cr\u0065ated""#);
    // OpenAI proper: the total is the sum; nothing changes.
    let openai = gemini.replace("623", "218");
    for (body, output) in [(gemini.to_owned(), 603), (by_serde, 603), (openai, 198)] {
        let s = json_of(body.clone()).await;
        assert_eq!(s.usage, usage(20, output, 0), "{body}");
    }
    let streamed = "data: {\"id\":\"g\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gemini-2.5-flash\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"36\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":198,\"total_tokens\":623}}\n\ndata: [DONE]\n\n";
    let s = stream_of(vec![streamed.into()]).await;
    assert_eq!(s.usage, usage(20, 603, 0));
    assert!(s.error.is_none(), "{:?}", s.error);
}

#[tokio::test]
async fn anthropic_cache_writes_kept_for_an_hour_are_read_apart_from_the_others() {
    // 25 uncached + 10 read + 50 written, 30 of them for an hour (billed at twice the input).
    let usage_json = r#""usage":{"input_tokens":25,"cache_read_input_tokens":10,"cache_creation_input_tokens":50,"cache_creation":{"ephemeral_5m_input_tokens":20,"ephemeral_1h_input_tokens":30},"output_tokens":15}"#;
    let want = Some(Usage {
        cache_write_input_tokens: 50,
        cache_write_1h_input_tokens: 30,
        ..usage(85, 15, 10).unwrap()
    });
    let whole = format!(
        r#"{{"id":"msg_3","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{{"type":"text","text":"Hi"}}],"stop_reason":"end_turn","stop_sequence":null,{usage_json}}}"#
    );
    // The same with a member the byte scan leaves to serde (an escaped key).
    let by_serde = whole.replace(r#""role""#, r#""r\u006fle""#);
    for body in [whole, by_serde] {
        let s = json_of(body.clone()).await;
        assert_eq!(s.usage, want, "{body}");
    }
    // Streamed: the counts come in `message_start`, the final output in `message_delta`.
    let streamed = format!(
        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_3\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,{}}}}}\n\n\
         event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
         event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"Hi\"}}}}\n\n\
         event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":0}}\n\n\
         event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":15}}}}\n\n\
         event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n",
        usage_json.replace(r#""output_tokens":15"#, r#""output_tokens":1"#)
    );
    let s = stream_of(vec![streamed.into()]).await;
    assert!(s.error.is_none(), "{:?}", s.error);
    assert_eq!(s.usage, want);
}

#[tokio::test]
async fn large_json_body_uses_head_and_tail_windows() {
    let long = "word ".repeat(60_000);
    let body = OPENAI_JSON.replace("Hello there", &long);
    let chunks: Vec<Vec<u8>> = body.as_bytes().chunks(1000).map(<[u8]>::to_vec).collect();
    let s = summarize(
        run(response(
            200,
            &[("content-type", "application/json")],
            Chunks::new(chunks),
        ))
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(s.bytes.len(), body.len());
    assert_eq!(s.model.as_deref(), Some("gpt-4o-2024-08-06"));
    assert_eq!(s.usage, usage(19, 10, 0));
    assert_eq!(s.finish, Some(FinishReason::Length));
    assert!(s.finished);
}

#[tokio::test]
async fn stream_flag_decides_without_a_content_type() {
    let resp = run_request(
        chat_request(true),
        response(200, &[], Chunks::one(OPENAI_STREAM)),
    )
    .await
    .unwrap();
    let s = summarize(resp).await;
    assert_eq!(s.content_events, 2);
    assert_eq!(s.usage, usage(20, 2, 8));
    // An explicit JSON content type wins over the flag.
    let resp = run_request(
        chat_request(true),
        response(
            200,
            &[("content-type", "application/json")],
            Chunks::one(OPENAI_JSON),
        ),
    )
    .await
    .unwrap();
    let s = summarize(resp).await;
    assert_eq!(s.usage, usage(19, 10, 0));
}

#[tokio::test(start_paused = true)]
async fn report_clock_starts_with_the_attempt() {
    use tower::{Layer, ServiceExt};
    let transport = tower::service_fn(|_req: http::Request<Bytes>| async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok::<_, io::Error>(sse_response(Chunks::one(OPENAI_STREAM)))
    });
    let resp = seawall_classify::ClassifyLayer::default()
        .layer(transport)
        .oneshot(chat_request(true))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(100)).await;
    let report = resp.body_report().unwrap().clone();
    let _ = drain(resp.into_body()).await;
    assert_eq!(
        report.time_to_first_token(),
        Some(Duration::from_millis(300))
    );
}

#[tokio::test]
async fn outer_hooks_see_the_usage_and_the_error() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let resp = run(sse_response(Chunks::one(OPENAI_STREAM))).await.unwrap();
    let resp = resp.on_complete(move |c: Completion<'_>| {
        log.lock()
            .unwrap()
            .push((matches!(c.outcome, Outcome::Complete), c.usage));
    });
    let _ = resp.into_body().collect().await;
    let cut = without_finish(OPENAI_STREAM);
    let log = seen.clone();
    let resp = run(sse_response(Chunks::one(cut)))
        .await
        .unwrap()
        .on_complete(move |c: Completion<'_>| {
            let class = match c.outcome {
                Outcome::Failed(Some(e)) => Some(e.class()),
                _ => None,
            };
            assert_eq!(class, Some(FailureClass::StreamInterrupted));
            log.lock().unwrap().push((false, c.usage));
        });
    let _ = resp.into_body().collect().await;
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(true, usage(20, 2, 8)), (false, usage(20, 2, 8))]
    );
}

fn split_at(body: &[u8], mut points: Vec<usize>) -> Vec<Vec<u8>> {
    points.iter_mut().for_each(|p| *p %= body.len() + 1);
    points.sort_unstable();
    let mut out = Vec::new();
    let mut last = 0;
    for p in points {
        out.push(body[last..p].to_vec());
        last = p;
    }
    out.push(body[last..].to_vec());
    out
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Splitting a stream anywhere, into any number of chunks (empty ones included), gives the
    /// same bytes and the same report.
    #[test]
    fn chunk_boundaries_do_not_matter(
        which in 0usize..4,
        points in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let cut_anthropic = format!(
            "{}{ANTHROPIC_OVERLOADED}",
            ANTHROPIC_STREAM.split("event: content_block_stop").next().unwrap()
        );
        let body: &[u8] = match which {
            0 => OPENAI_STREAM.as_bytes(),
            1 => ANTHROPIC_STREAM.as_bytes(),
            2 => cut_anthropic.as_bytes(),
            _ => OPENAI_JSON.as_bytes(),
        };
        let ct = if which == 3 { "application/json" } else { "text/event-stream" };
        let whole = block_on(async {
            summarize(run(response(200, &[("content-type", ct)], Chunks::one(body.to_vec()))).await.unwrap()).await
        });
        let split = block_on(async {
            summarize(run(response(200, &[("content-type", ct)], Chunks::new(split_at(body, points)))).await.unwrap()).await
        });
        prop_assert_eq!(split, whole);
    }
}

#[tokio::test]
async fn a_stream_cut_inside_its_first_event_is_broken_not_a_success() {
    // The request went to a known API: its finish marker is expected, and the half JSON
    // event is not output.
    let s = stream_of(vec![
        b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.com".to_vec(),
    ])
    .await;
    assert_eq!(s.error.unwrap().0, FailureClass::Disconnected);
    assert_eq!(s.content_events, 0);
    assert!(!s.finished);

    let s = stream_of(vec![
        b"event: message_start\ndata: {\"type\":\"message_start\",\"mess".to_vec(),
    ])
    .await;
    assert_eq!(s.error.unwrap().0, FailureClass::Disconnected);

    // After real content, a cut event makes the stream interrupted.
    let mut cut = OPENAI_STREAM
        .split("data: [DONE]")
        .next()
        .unwrap()
        .to_owned();
    cut.truncate(cut.len() - 40);
    let s = stream_of(vec![cut.into()]).await;
    assert_eq!(s.error.unwrap().0, FailureClass::StreamInterrupted);
}

#[tokio::test]
async fn a_json_body_cut_short_is_an_error_not_a_success() {
    for cut in [OPENAI_JSON.len() / 2, OPENAI_JSON.len() - 1] {
        let s = summarize(
            run(response(
                200,
                &[("content-type", "application/json")],
                Chunks::one(&OPENAI_JSON[..cut]),
            ))
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(
            s.error.unwrap().0,
            FailureClass::StreamInterrupted,
            "cut at {cut}"
        );
        assert!(!s.finished);
    }
    // Braces and quotes inside strings do not confuse the depth count.
    let tricky = r#"{"choices":[{"message":{"content":"a } ] \" { ["}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}"#;
    let s = summarize(
        run(response(
            200,
            &[("content-type", "application/json")],
            Chunks::one(tricky),
        ))
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(s.error, None);
    assert!(s.finished);
}

/// `OPENAI_STREAM` with its line endings rewritten: `\r`, `\r\n`, or a mix of all three.
fn with_line_endings(body: &str, which: usize) -> String {
    match which {
        0 => body.to_owned(),
        1 => body.replace('\n', "\r"),
        2 => body.replace('\n', "\r\n"),
        _ => {
            body.split('\n')
                .enumerate()
                .map(|(i, line)| format!("{line}{}", ["\n", "\r", "\r\n"][i % 3]))
                .collect::<String>()
                .trim_end_matches(['\r', '\n'])
                .to_owned()
                + "\n\n"
        }
    }
}

#[tokio::test]
async fn cr_lf_and_crlf_all_end_lines() {
    let lf = stream_of(vec![OPENAI_STREAM.into()]).await;
    for which in 1..4 {
        let body = with_line_endings(OPENAI_STREAM, which);
        let s = stream_of(vec![body.clone().into()]).await;
        assert_eq!(s.error, None, "endings {which}");
        assert_eq!(s.content_events, 2, "endings {which}");
        assert!(s.finished, "endings {which}");
        assert_eq!((s.usage, s.model), (lf.usage, lf.model.clone()));
    }
    // A CR ending one chunk and the LF starting the next are one line ending, not two: the
    // event is not dispatched early with half its data lines.
    let split = stream_of(vec![
        b"event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\r".to_vec(),
        b"\ndata: \"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\r\n\r\n".to_vec(),
        b"event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n".to_vec(),
    ])
    .await;
    assert_eq!(split.error, None);
    assert_eq!(split.content_events, 1);
    assert!(split.finished);
}

#[tokio::test]
async fn a_leading_byte_order_mark_and_data_without_a_space_are_read() {
    let body = format!(
        "\u{FEFF}{}",
        OPENAI_STREAM
            .replace("data: ", "data:")
            .replace(": keep", ":keep")
    );
    let s = stream_of(vec![body.into()]).await;
    assert_eq!(s.error, None);
    assert_eq!(s.content_events, 2);
    assert!(s.finished);
    assert_eq!(s.usage, usage(20, 2, 8));
    // A first event with content behind the mark (and the mark split over two chunks).
    let bytes = "\u{FEFF}data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n".as_bytes();
    let s = stream_of(vec![bytes[..1].to_vec(), bytes[1..].to_vec()]).await;
    assert_eq!(s.error, None);
    assert_eq!(s.content_events, 1);
    assert!(s.finished);
}

#[tokio::test]
async fn an_error_event_split_over_data_lines_is_an_error() {
    let s = stream_of(vec![
        b"data: {\"error\":\ndata: {\"message\":\"busy\",\ndata: \"type\":\"server_error\",\"status\":503}}\n\n"
            .to_vec(),
    ])
    .await;
    assert_eq!(s.content_events, 0);
    assert_eq!(s.error.unwrap().0, FailureClass::Overloaded);
}

#[tokio::test]
async fn an_error_event_before_content_is_the_failure_its_status_names() {
    for (event, class) in [
        (
            r#"{"error":{"message":"Provider returned error","code":429}}"#,
            FailureClass::RateLimited,
        ),
        (
            r#"{"error":{"message":"upstream busy","status":503}}"#,
            FailureClass::Overloaded,
        ),
        (
            r#"{"error":{"message":"bad","code":400,"status":400}}"#,
            FailureClass::InvalidRequest,
        ),
        (r#"{"error":{"message":"oops"}}"#, FailureClass::ServerError),
    ] {
        let s = stream_of(vec![format!("data: {event}\n\n").into_bytes()]).await;
        assert_eq!(s.error.unwrap().0, class, "{event}");
    }
    // After content: the stream ends with it, interrupted.
    let head = OPENAI_STREAM.split(": keep-alive").next().unwrap();
    let hello = OPENAI_STREAM.lines().nth(4).unwrap();
    let body =
        format!("{head}{hello}\n\ndata: {{\"error\":{{\"message\":\"busy\",\"status\":503}}}}\n\n");
    let s = stream_of(vec![body.into()]).await;
    assert_eq!(s.content_events, 1);
    assert_eq!(s.error.unwrap().0, FailureClass::StreamInterrupted);
}

#[tokio::test]
async fn an_event_that_is_itself_an_error_object_ends_the_stream_as_that_error() {
    // vLLM's error event is the error object itself (`"object": "error"`, no `error` member);
    // Google's OpenAI-compatible API may send its error objects in an array.
    let vllm = r#"{"object":"error","message":"The decoder prompt (length 5000) is longer than the maximum model length of 4096.","type":"BadRequestError","param":null,"code":400}"#;
    let google = r#"[{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}]"#;
    for (event, class) in [
        (vllm, FailureClass::ContextLengthExceeded),
        (google, FailureClass::Overloaded),
    ] {
        let body = format!("data: {event}\n\ndata: [DONE]\n\n");
        let s = stream_of(vec![body.into_bytes()]).await;
        assert_eq!(s.content_events, 0, "{event}");
        assert_eq!(s.error.expect(event).0, class, "{event}");
    }
    // After content: the stream ends with it, interrupted.
    let head = OPENAI_STREAM.split(": keep-alive").next().unwrap();
    let hello = OPENAI_STREAM.lines().nth(4).unwrap();
    let s = stream_of(vec![format!("{head}{hello}\n\ndata: {vllm}\n\n").into()]).await;
    assert_eq!(s.content_events, 1);
    assert_eq!(s.error.unwrap().0, FailureClass::StreamInterrupted);
}

#[tokio::test]
async fn a_finish_word_that_says_the_answer_failed_is_that_failure_not_an_answer() {
    let chunk = |delta: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"deepseek-chat\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let role = chunk(r#"{"role":"assistant","content":""}"#, "null");
    let text = chunk(r#"{"content":"The sea"}"#, "null");
    let ending = |word: &str| chunk(r#"{"content":""}"#, &format!("\"{word}\""));
    for (word, after_content, want) in [
        // DeepSeek's starved answer: before any content an overload, retried (nothing reached
        // the caller); after content cut, as by any error event.
        (
            "insufficient_system_resource",
            false,
            FailureClass::Overloaded,
        ),
        (
            "insufficient_system_resource",
            true,
            FailureClass::StreamInterrupted,
        ),
        // A router's `error` finish with no error object beside it: a server error.
        ("error", false, FailureClass::ServerError),
        // Z.ai's `network_error`: its inference failed.
        ("network_error", true, FailureClass::StreamInterrupted),
        // Z.ai's `sensitive` before any content: its safety review refused the answer.
        ("sensitive", false, FailureClass::ContentFiltered),
    ] {
        let before = if after_content {
            format!("{role}{text}")
        } else {
            role.clone()
        };
        let stream = format!("{before}{}data: [DONE]\n\n", ending(word));
        let s = stream_of(vec![stream.into_bytes()]).await;
        assert_eq!(s.content_events, u64::from(after_content), "{word}");
        let (class, _, _) = s.error.expect("not a finished answer");
        assert_eq!(class, want, "{word} after content: {after_content}");
    }
}

#[tokio::test]
async fn a_stream_that_finishes_without_content_is_an_empty_response() {
    let openai = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let anthropic = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude\",\"content\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":1}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    for body in [openai, anthropic] {
        let resp = run_request(
            chat_request(true),
            sse_response(Chunks::one(body.to_owned())),
        )
        .await
        .unwrap();
        let s = summarize(resp).await;
        assert_eq!(s.bytes, body.as_bytes(), "the frames still pass through");
        assert!(s.finished);
        let (class, _, _) = s.error.expect("an empty answer is a failure");
        assert_eq!(class, FailureClass::EmptyResponse, "{body}");
    }
    let anthropic_usage = summarize(
        run(sse_response(Chunks::one(anthropic.to_owned())))
            .await
            .unwrap(),
    )
    .await
    .usage;
    assert_eq!(
        anthropic_usage,
        usage(5, 1, 0),
        "the usage is still reported"
    );

    // Stopped by the content filter before any content: the same prompt would be stopped again.
    let refusal = anthropic.replace("end_turn", "refusal");
    for body in [openai.replace("\"stop\"", "\"content_filter\""), refusal] {
        let resp = run_request(chat_request(true), sse_response(Chunks::one(body.clone())))
            .await
            .unwrap();
        let (class, _, _) = summarize(resp)
            .await
            .error
            .expect("a filtered stream fails");
        assert_eq!(class, FailureClass::ContentFiltered, "{body}");
    }

    // Not empty: stopped at the token limit, or a tool use whose input streamed as nothing.
    let length = openai.replace("\"stop\"", "\"length\"");
    let tool = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude\",\"content\":[]}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"now\",\"input\":{}}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    for body in [length.as_str(), tool] {
        let s = stream_of(vec![body.into()]).await;
        assert_eq!(s.error, None, "{body}");
        assert!(s.finished);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Whatever the line endings (LF, CR, CRLF or a mix), a leading byte order mark, and
    /// however the bytes are cut into chunks (a CR and its LF in different chunks included),
    /// the report is the one of the plain LF stream.
    #[test]
    fn any_split_of_any_line_endings_gives_the_same_events(
        which in 0usize..4,
        bom in any::<bool>(),
        anthropic in any::<bool>(),
        points in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let base = if anthropic { ANTHROPIC_STREAM } else { OPENAI_STREAM };
        let mut body = with_line_endings(base, which);
        if bom {
            body.insert(0, '\u{FEFF}');
        }
        let plain = block_on(stream_of(vec![base.into()]));
        let split = block_on(stream_of(split_at(body.as_bytes(), points)));
        prop_assert_eq!(split.bytes, body.into_bytes());
        prop_assert_eq!(
            (split.usage, split.model, split.finish, split.finished, split.content_events, split.error),
            (plain.usage, plain.model, plain.finish, plain.finished, plain.content_events, plain.error)
        );
    }
}

#[tokio::test]
async fn a_routers_error_chunk_ends_the_stream_as_the_failure_it_names() {
    // OpenRouter reports a failure mid-stream as a chunk with a top-level `error` and
    // `finish_reason: "error"`, then `[DONE]`: not an answer that finished.
    let after_content = concat!(
        "data: {\"id\":\"gen-1\",\"object\":\"chat.completion.chunk\",\"model\":\"openai/gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"gen-1\",\"object\":\"chat.completion.chunk\",\"model\":\"openai/gpt-4o\",\"provider\":\"openai\",\"error\":{\"code\":\"server_error\",\"message\":\"Provider disconnected unexpectedly\"},\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"finish_reason\":\"error\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let before_content = concat!(
        ": OPENROUTER PROCESSING\n\n",
        "data: {\"id\":\"gen-1\",\"object\":\"chat.completion.chunk\",\"model\":\"openai/gpt-4o\",\"error\":{\"code\":502,\"message\":\"Provider returned error\"},\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"finish_reason\":\"error\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    for (body, want) in [
        (after_content, FailureClass::StreamInterrupted),
        (before_content, FailureClass::ServerError),
    ] {
        let resp = run_request(
            chat_request(true),
            sse_response(Chunks::one(body.to_owned())),
        )
        .await
        .unwrap();
        let (class, _, _) = summarize(resp).await.error.expect("the stream failed");
        assert_eq!(class, want, "{body}");
    }
}
