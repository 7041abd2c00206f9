//! Whatever a follow-up answers (broken SSE, half events, lying usage, JSON that is not an
//! answer, bytes that are not text), the layer never panics and the caller's body ends.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use proptest::prelude::*;
use seawall_classify::ClassifyLayer;
use seawall_continue::ContinueLayer;
use seawall_core::{BoxError, LlmError};
use seawall_mock::{Count, MockUpstream, Profile};
use seawall_test_support::{drain, paused_runtime};
use serde_json::json;
use tower::{Layer, Service, ServiceExt};

/// A body of given chunks.
struct Chunks(VecDeque<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

type AnyBody = UnsyncBoxBody<Bytes, BoxError>;

/// The first call to the mock; every follow-up answered with `chunks`.
#[derive(Clone)]
struct Hostile {
    mock: MockUpstream,
    chunks: Vec<Vec<u8>>,
    stream: bool,
    calls: Arc<AtomicUsize>,
}

impl Service<Request<Bytes>> for Hostile {
    type Response = Response<AnyBody>;
    type Error = LlmError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<AnyBody>, LlmError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let this = self.clone();
        Box::pin(async move {
            if n == 0 {
                let resp = match this.mock.oneshot(req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                };
                return Ok(resp.map(|b| b.map_err(BoxError::from).boxed_unsync()));
            }
            let ct = if this.stream {
                "text/event-stream"
            } else {
                "application/json"
            };
            let body = Chunks(this.chunks.into_iter().map(Bytes::from).collect());
            Ok(Response::builder()
                .header("content-type", ct)
                .body(body.boxed_unsync())
                .unwrap())
        })
    }
}

const PIECES: &[&str] = &[
    "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" storm passes\"},\"finish_reason\":null}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"completion_tokens\":18446744073709551615}}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":-1,\"completion_tokens\":\"many\"}}\n\n",
    "data: {\"choices\":[{\"index\":3,\"delta\":{\"content\":\"x\"}}]}\n\n",
    "data: {\"error\":{\"message\":\"boom\"}}\n\n",
    "data: [DONE]\n\n",
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1}}}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":7,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\\u00e9 wave\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":null}\n\n",
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n",
    ": keep-alive\n\n",
    "\r\r\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":",
    "{\"choices\":[{\"message\":{\"content\":\" more\"},\"finish_reason\":\"length\"}],\"usage\":{\"completion_tokens\":1}}",
    "{\"content\":[{\"type\":\"text\",\"text\":7}],\"stop_reason\":\"max_tokens\"}",
    "{\"content\":\"not blocks\",\"stop_reason\":\"end_turn\"}",
];

fn chunks() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let piece = prop_oneof![
        3 => prop::sample::select(PIECES).prop_map(|p| p.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ];
    prop::collection::vec(piece, 0..10)
}

fn request(anthropic: bool, stream: bool, max_tokens: u32) -> Request<Bytes> {
    let (uri, body) = if anthropic {
        (
            "http://mock/v1/messages",
            json!({"model": "claude-sonnet-4-5", "max_tokens": max_tokens, "stream": stream,
                   "messages": [{"role": "user", "content": "hi"}]}),
        )
    } else {
        (
            "http://mock/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "max_tokens": max_tokens, "stream": stream,
                   "stream_options": {"include_usage": true},
                   "messages": [{"role": "user", "content": "hi"}]}),
        )
    };
    Request::post(uri)
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// A stream cut (or cut by `length`) and followed by hostile follow-ups.
    #[test]
    fn hostile_follow_ups_of_a_stream_never_panic(
        chunks in chunks(),
        anthropic in any::<bool>(),
        cut in any::<bool>(),
        restart in any::<bool>(),
    ) {
        let profile = Profile::default().seed(5).output_tokens(Count::fixed(16));
        let profile = if cut { profile.cut_streams(1.0, Count::fixed(4), true) } else { profile };
        let up = Hostile { mock: MockUpstream::new(profile), chunks, stream: true, calls: Arc::default() };
        let layer = ContinueLayer::builder().restart_within(if restart { 100 } else { 0 }).build().unwrap();
        let svc = layer.layer(ClassifyLayer::new().layer(up.clone()));
        let max = if cut { 100 } else { 6 };
        let (text, err) = paused_runtime().block_on(async move {
            let resp = svc.oneshot(request(anthropic, true, max)).await.unwrap();
            drain(resp.into_body()).await
        });
        prop_assert!(up.calls.load(Ordering::SeqCst) <= 4);
        // What the first attempt sent reaches the caller, unless it was held and asked again:
        // then the caller has the second attempt's stream, or the cut.
        prop_assert!(!text.is_empty() || (restart && err.is_some()));
    }

    /// Every attempt hostile, the first included, with the first tokens held: whatever is held
    /// and asked again, the layer never panics, stays within its bound, and the body ends.
    #[test]
    fn hostile_streams_held_and_asked_again_never_panic(
        chunks in chunks(),
        anthropic in any::<bool>(),
    ) {
        let up = Always { chunks, seen: Arc::default() };
        let layer = ContinueLayer::builder().restart_within(100).build().unwrap();
        let svc = layer.layer(ClassifyLayer::new().layer(up.clone()));
        paused_runtime().block_on(async move {
            let resp = svc.oneshot(request(anthropic, true, 100)).await.unwrap();
            drain(resp.into_body()).await
        });
        prop_assert!(up.seen.lock().unwrap().len() <= 4);
    }

    /// A non-streamed answer cut by `length` and followed by hostile follow-ups.
    #[test]
    fn hostile_follow_ups_of_an_answer_never_panic(
        chunks in chunks(),
        anthropic in any::<bool>(),
    ) {
        let profile = Profile::default().seed(5).output_tokens(Count::fixed(16));
        let up = Hostile { mock: MockUpstream::new(profile), chunks, stream: false, calls: Arc::default() };
        let svc = ContinueLayer::new().layer(ClassifyLayer::new().layer(up.clone()));
        let result = paused_runtime().block_on(async move {
            match svc.oneshot(request(anthropic, false, 6)).await {
                Ok(resp) => resp.into_body().collect().await.map(|b| b.to_bytes()).ok(),
                Err(_) => None,
            }
        });
        // The first answer (at least) comes back, as JSON.
        let bytes = result.expect("the first answer is never lost");
        prop_assert!(serde_json::from_slice::<serde_json::Value>(&bytes).is_ok());
    }
}

/// Every call answered with the same stream, which ends without its finish marker; the
/// requests' bodies kept.
#[derive(Clone)]
struct Always {
    chunks: Vec<Vec<u8>>,
    seen: Arc<std::sync::Mutex<Vec<Bytes>>>,
}

impl Service<Request<Bytes>> for Always {
    type Response = Response<Chunks>;
    type Error = LlmError;
    type Future = std::future::Ready<Result<Response<Chunks>, LlmError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        self.seen.lock().unwrap().push(req.into_body());
        let body = Chunks(self.chunks.iter().map(|c| Bytes::from(c.clone())).collect());
        std::future::ready(Ok(Response::builder()
            .header("content-type", "text/event-stream")
            .body(body)
            .unwrap()))
    }
}

/// A stream the layer would hold forever is let through: past 64 KiB held, or as soon as its
/// answer is a tool call (which the layer cannot continue). Let through, its cut is not
/// asked again from the start: resumed (the text), or the caller's (the tool call).
#[test]
fn a_held_stream_is_let_through_when_it_holds_too_much_or_cannot_be_continued() {
    let role =
        "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    let word =
        "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    let tool = "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}}]}\n\n";
    let keep_alives: Vec<&str> = [role, word]
        .into_iter()
        .chain(std::iter::repeat_n(": keep-alive\n\n", 5_000))
        .collect();
    for (chunks, sent) in [
        (keep_alives, ": keep-alive"),
        (vec![role, tool], "tool_calls"),
    ] {
        let up = Always {
            chunks: chunks.into_iter().map(|c| c.as_bytes().to_vec()).collect(),
            seen: Arc::default(),
        };
        let layer = ContinueLayer::builder()
            .restart_within(100)
            .build()
            .unwrap();
        let svc = layer.layer(ClassifyLayer::new().layer(up.clone()));
        let (text, err) = paused_runtime().block_on(async move {
            let resp = svc.oneshot(request(false, true, 100)).await.unwrap();
            drain(resp.into_body()).await
        });
        assert!(err.is_some(), "every attempt is cut");
        assert!(text.contains(sent), "{}", &text[..text.len().min(200)]);
        let seen = up.seen.lock().unwrap();
        assert!(
            seen[1..].iter().all(|follow_up| *follow_up != seen[0]),
            "restarted"
        );
        assert_eq!(seen.len(), if sent == "tool_calls" { 1 } else { 4 });
    }
}
