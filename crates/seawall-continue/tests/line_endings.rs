//! A whole stream passes through the layer byte for byte, in the order sent, whatever its line
//! endings (LF, CRLF or CR, as the SSE format allows) and wherever its chunks split it: a
//! chunk may end between the CR and the LF that close an event the layer holds back (an
//! Anthropic `content_block_stop`, until it knows no continuation follows), and that LF must
//! stay behind the event.

use std::collections::VecDeque;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use proptest::prelude::*;
use seawall_continue::ContinueLayer;
use seawall_core::LlmError;
use seawall_test_support::{Chunks, paused_runtime};
use tower::{Layer, ServiceExt};

const ANTHROPIC: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n\
event: ping\ndata: {\"type\":\"ping\"}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
: keep-alive\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

const OPENAI: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"He\"},\"finish_reason\":null}]}\n\n\
: keep-alive\n\n\
data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"llo\"},\"finish_reason\":\"stop\"}]}\n\n\
data: [DONE]\n\n";

/// `stream` with its line endings made `eol`, cut into chunks at `cuts` (offsets, any order).
fn chunked(stream: &str, eol: &str, cuts: &[usize]) -> (Bytes, VecDeque<Bytes>) {
    let whole = Bytes::from(stream.replace('\n', eol));
    let mut at: Vec<usize> = cuts.iter().map(|c| c % whole.len()).collect();
    at.extend([0, whole.len()]);
    at.sort_unstable();
    at.dedup();
    let chunks = at.windows(2).map(|w| whole.slice(w[0]..w[1])).collect();
    (whole, chunks)
}

/// What the caller reads of `chunks`, answered to a streamed request of the wire's API.
fn through_the_layer(anthropic: bool, chunks: VecDeque<Bytes>) -> Bytes {
    let upstream = tower::service_fn(move |_: Request<Bytes>| {
        let body = Chunks(chunks.clone());
        async move {
            Ok::<_, LlmError>(
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(body)
                    .unwrap(),
            )
        }
    });
    let (uri, model) = if anthropic {
        ("https://api.anthropic.com/v1/messages", "claude-haiku-4-5")
    } else {
        ("https://api.openai.com/v1/chat/completions", "gpt-4o")
    };
    let body = format!(
        r#"{{"model":"{model}","max_tokens":64,"stream":true,"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let req = Request::post(uri)
        .header("content-type", "application/json")
        .body(Bytes::from(body))
        .unwrap();
    paused_runtime().block_on(async {
        let resp = ContinueLayer::new()
            .layer(upstream)
            .oneshot(req)
            .await
            .unwrap();
        resp.into_body().collect().await.unwrap().to_bytes()
    })
}

#[test]
fn a_crlf_split_after_a_held_event_stays_behind_it() {
    // The chunk ends on the CR that closes `content_block_stop`; its LF starts the next one.
    let crlf = ANTHROPIC.replace('\n', "\r\n");
    let stop = crlf.find("event: content_block_stop").unwrap();
    let cut = stop + crlf[stop..].find("\r\n\r\n").unwrap() + 3;
    let (whole, chunks) = chunked(ANTHROPIC, "\r\n", &[cut]);
    assert_eq!(&chunks[0][chunks[0].len() - 1..], b"\r");
    assert_eq!(&chunks[1][..1], b"\n");
    assert_eq!(through_the_layer(true, chunks), whole);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_whole_stream_passes_byte_for_byte_whatever_its_line_endings_and_chunks(
        anthropic in any::<bool>(),
        eol in prop_oneof![Just("\n"), Just("\r\n"), Just("\r")],
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let stream = if anthropic { ANTHROPIC } else { OPENAI };
        let (whole, chunks) = chunked(stream, eol, &cuts);
        prop_assert_eq!(through_the_layer(anthropic, chunks), whole);
    }
}
