//! A body in a content coding (a transport asked for gzip and did not undo it) passes through
//! every layer that reads bodies untouched: the classifier and the stream timeouts do not take
//! a whole compressed stream for a cut one, the continuation does not resume it, the repair
//! layer does not judge its bytes, the cache does not store them; and a compressed error body
//! puts no binary in the error's message.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use seawall::cache::{CacheLayer, MemoryStore};
use seawall::classify::ClassifyLayer;
use seawall::continuation::ContinueLayer;
use seawall::core::{FailureClass, LlmError};
use seawall::repair::RepairLayer;
use seawall::retry::BackoffRetryLayer;
use seawall::stream::StreamTimeoutLayer;
use tower::{Layer, ServiceBuilder, ServiceExt};

/// A whole OpenAI stream (content, `finish_reason: stop`, `[DONE]`), gzip-compressed.
const GZIPPED_STREAM: &[u8] = b"\
    \x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\x8d\xcc\x31\x0a\x84\x30\x10\x05\xd0\x3e\xa7\x90\
    \x5f\x5b\x58\x4f\xad\x60\xa5\x07\x10\x59\x82\x19\x71\x20\x4c\xc4\x8c\x20\x48\xee\xbe\x96\
    \x0b\xdb\x58\x3f\x78\xc1\x9b\xa7\xea\xc6\xb2\x25\x59\x38\x83\xa6\x1b\xa2\x81\x2f\x50\x53\
    \x23\x70\x34\x0f\x7a\x38\xa9\xb1\x1a\x08\xbd\xa0\xd4\x58\x45\x25\x6f\x9f\x83\x7d\x4e\x0a\
    \xd2\x33\xc6\x32\x17\xe7\xc2\xab\xee\x3f\x40\xb6\xb4\xe3\xa7\x98\xda\x71\xe8\x66\xe7\xbe\
    \x26\x25\x83\xe3\xa0\x00\x00\x00";

/// A whole non-streamed OpenAI answer, stopped at its token limit (which the continuation
/// would continue, if it could read it), gzip-compressed.
const GZIPPED_ANSWER: &[u8] = b"\
    \x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\x3d\x8e\x51\x0a\xc2\x40\x0c\x44\xef\x92\xef\x56\
    \x2c\xe8\xcf\x9e\xc0\x3b\x88\x94\x75\x1b\xbb\xd1\x6d\x52\x9a\x08\x42\xd9\xbb\x9b\x82\xf5\
    \x2b\xf0\x66\x32\x33\x2b\xd0\x00\x01\x52\x8e\x96\xa6\xb9\xb4\x1d\x34\x20\xf7\x27\x26\xfb\
    \xd1\x43\x12\xe7\x68\x24\xec\xd2\x24\x03\x16\x57\xc6\xd9\xda\x93\x38\x48\x59\x28\xa1\x42\
    \xb8\xae\x40\x3c\xe0\x07\xc2\xd1\x6d\xa8\x1a\x47\x84\xb0\xc2\x22\xc5\x2f\x44\x55\x52\x8b\
    \x6c\xdb\x8f\xb0\x21\x6f\x05\x17\x82\xda\xc0\x83\x98\x34\xf7\x0b\x46\xf5\x92\x00\x05\x79\
    \xb4\x0c\xf5\xd6\xc0\x7b\x8f\x99\x17\x9f\x61\xbd\xc9\x0b\xd9\xdb\xce\x5b\xca\xbe\xeb\x4f\
    \xbb\x5a\xbf\xb2\x1b\xb5\xb8\xd0\x00\x00\x00";

fn ask() -> http::Request<Bytes> {
    ask_for(true)
}

fn ask_for(stream: bool) -> http::Request<Bytes> {
    let body = format!(
        r#"{{"model":"gpt-4o","stream":{stream},"temperature":0,"messages":[{{"role":"user","content":"Hi?"}}]}}"#
    );
    http::Request::post("https://api.openai.com/v1/chat/completions")
        .header("accept-encoding", "gzip")
        .body(Bytes::from(body))
        .unwrap()
}

type Answer = http::Response<Full<Bytes>>;

/// An upstream that answers every call with `status` and `body` in the gzip coding.
fn gzipping(
    status: u16,
    body: &'static [u8],
    calls: &Arc<AtomicUsize>,
) -> impl tower::Service<
    http::Request<Bytes>,
    Response = Answer,
    Error = LlmError,
    Future = std::future::Ready<Result<Answer, LlmError>>,
> + Clone {
    let calls = calls.clone();
    tower::service_fn(move |_req: http::Request<Bytes>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let content_type = if status == 200 && body == GZIPPED_STREAM {
            "text/event-stream"
        } else {
            "application/json"
        };
        std::future::ready(Ok(http::Response::builder()
            .status(status)
            .header("content-type", content_type)
            .header("content-encoding", "gzip")
            .body(Full::new(Bytes::from_static(body)))
            .unwrap()))
    })
}

#[tokio::test(start_paused = true)]
async fn a_compressed_stream_passes_every_reading_layer_untouched() {
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ServiceBuilder::new()
        .layer(CacheLayer::new(MemoryStore::new()))
        .layer(ContinueLayer::new())
        .layer(RepairLayer::new(|_| Err("never valid".to_owned())))
        .layer(BackoffRetryLayer::new())
        .layer(StreamTimeoutLayer::new())
        .layer(ClassifyLayer::default())
        .service(gzipping(200, GZIPPED_STREAM, &calls));
    for call in 1..=2 {
        let resp = client.clone().oneshot(ask()).await.expect("an answer");
        assert_eq!(resp.headers()["content-encoding"], "gzip");
        let body = resp.into_body().collect().await.expect("no body error");
        assert_eq!(body.to_bytes(), GZIPPED_STREAM, "the bytes as sent");
        // One upstream call per call: no retry, continuation or repair turn, and no cached
        // answer for the second.
        assert_eq!(calls.load(Ordering::SeqCst), call);
    }

    // With no classifier below to say the body is unread: the same, streamed or not.
    for (stream, body) in [(true, GZIPPED_STREAM), (false, GZIPPED_ANSWER)] {
        let before = calls.load(Ordering::SeqCst);
        let client = ServiceBuilder::new()
            .layer(CacheLayer::new(MemoryStore::new()))
            .layer(ContinueLayer::new())
            .layer(RepairLayer::new(|_| Err("never valid".to_owned())))
            .service(gzipping(200, body, &calls));
        for call in 1..=2 {
            let resp = client
                .clone()
                .oneshot(ask_for(stream))
                .await
                .expect("an answer");
            let bytes = resp.into_body().collect().await.expect("no body error");
            assert_eq!(bytes.to_bytes(), body, "the bytes as sent");
            assert_eq!(
                calls.load(Ordering::SeqCst),
                before + call,
                "stream: {stream}"
            );
        }
    }

    // The stream timeouts alone, with no classifier: the same.
    let alone = StreamTimeoutLayer::new().layer(gzipping(200, GZIPPED_STREAM, &calls));
    let resp = alone
        .oneshot(ask())
        .await
        .expect("committed at its first bytes");
    let body = resp.into_body().collect().await.expect("no body error");
    assert_eq!(body.to_bytes(), GZIPPED_STREAM);
}

#[tokio::test]
async fn a_compressed_error_body_is_classified_by_its_status_with_a_readable_message() {
    let calls = Arc::new(AtomicUsize::new(0));
    let err = ClassifyLayer::default()
        .layer(gzipping(429, GZIPPED_STREAM, &calls))
        .oneshot(ask())
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::RateLimited);
    assert!(
        err.message().contains("`gzip` content coding"),
        "{}",
        err.message()
    );
    assert!(
        err.message().chars().all(|c| !c.is_control()),
        "{:?}",
        err.message()
    );
}
