//! The repair layer end to end: a scripted upstream (or the chaos upstream behind the real
//! classifier), on paused time.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use seawall_classify::ClassifyLayer;
use seawall_core::{Deadline, FailureClass, LlmError};
use seawall_mock::{MockUpstream, Profile};
use seawall_observe::{CallOutcome, CallRecord, ObserveLayer};
use seawall_repair::{Answer, ContentInvalid, RepairLayer, require_fields, validate_json};
use seawall_retry::BackoffRetryLayer;
use seawall_test_support::ChanBody;
use serde_json::{Value, json};
use tower::{Layer, Service, ServiceExt};

/// One scripted reply: a status and the body's frames, or an error.
#[derive(Clone)]
enum Reply {
    Body(u16, Vec<Bytes>),
    Fail(FailureClass),
    /// A body that fails after its first frame.
    Broken(Bytes),
}

/// An upstream that answers from a script (repeating its last reply) and keeps every request
/// body it received.
#[derive(Clone, Default)]
struct Script {
    replies: Arc<Mutex<VecDeque<Reply>>>,
    seen: Arc<Mutex<Vec<Bytes>>>,
    content_length: bool,
}

impl Script {
    fn new(replies: impl IntoIterator<Item = Reply>) -> Script {
        Script {
            replies: Arc::new(Mutex::new(replies.into_iter().collect())),
            ..Script::default()
        }
    }

    fn calls(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn body(&self, i: usize) -> Value {
        serde_json::from_slice(&self.seen.lock().unwrap()[i]).unwrap()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Service<Request<Bytes>> for Script {
    type Response = Response<ChanBody>;
    type Error = LlmError;
    type Future = BoxFuture<Result<Response<ChanBody>, LlmError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LlmError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        self.seen.lock().unwrap().push(req.body().clone());
        let reply = {
            let mut replies = self.replies.lock().unwrap();
            if replies.len() > 1 {
                replies.pop_front()
            } else {
                replies.front().cloned()
            }
        }
        .expect("a scripted reply");
        let content_length = self.content_length;
        Box::pin(async move {
            let (feed, body) = ChanBody::channel();
            let (status, len) = match reply {
                Reply::Fail(class) => return Err(LlmError::new(class, "scripted")),
                Reply::Body(status, frames) => {
                    let len: usize = frames.iter().map(Bytes::len).sum();
                    for f in frames {
                        feed.send(Ok(Frame::data(f))).unwrap();
                    }
                    (status, len)
                }
                Reply::Broken(first) => {
                    let len = first.len();
                    feed.send(Ok(Frame::data(first))).unwrap();
                    feed.send(Err(LlmError::new(FailureClass::StreamInterrupted, "cut")))
                        .unwrap();
                    (200, len)
                }
            };
            let mut resp = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .header("x-request-id", "req_script");
            if content_length {
                resp = resp.header("content-length", len);
            }
            Ok(resp.body(body).unwrap())
        })
    }
}

fn openai_answer(text: &str) -> Reply {
    let body = json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}});
    Reply::Body(200, vec![Bytes::from(body.to_string())])
}

fn anthropic_answer(text: &str) -> Reply {
    let body = json!({"id": "msg_1", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5", "stop_reason": "end_turn",
        "content": [{"type": "text", "text": text}],
        "usage": {"input_tokens": 9, "output_tokens": 5}});
    Reply::Body(200, vec![Bytes::from(body.to_string())])
}

fn openai_body(stream: bool) -> Value {
    json!({"model": "gpt-4o-mini", "stream": stream, "max_tokens": 64,
           "messages": [{"role": "system", "content": "Reply in JSON."},
                        {"role": "user", "content": "Where is Oslo?"}]})
}

fn anthropic_body(stream: bool) -> Value {
    json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": stream,
           "system": "Reply in JSON.",
           "messages": [{"role": "user", "content": "Where is Oslo?"}]})
}

fn openai(body: &Value) -> Request<Bytes> {
    Request::post("http://mock/v1/chat/completions")
        .header("authorization", "Bearer sk-test")
        .header("content-type", "application/json")
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

fn anthropic(body: &Value) -> Request<Bytes> {
    Request::post("http://mock/v1/messages")
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .body(Bytes::from(body.to_string()))
        .unwrap()
}

async fn text_of<B>(resp: Response<B>) -> Bytes
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    resp.into_body().collect().await.unwrap().to_bytes()
}

fn city() -> impl Fn(&Answer<'_>) -> Result<(), String> + Clone + Send + Sync + 'static {
    require_fields(&["city", "country"])
}

#[tokio::test(start_paused = true)]
async fn an_invalid_answer_is_repaired_on_the_second_turn_with_the_answer_and_the_error() {
    let up = Script::new([
        openai_answer("Oslo is the capital of Norway."),
        openai_answer(r#"{"city": "Oslo", "country": "Norway"}"#),
    ]);
    let svc = RepairLayer::new(city()).layer(up.clone());
    let original = openai_body(false);
    let resp = svc.oneshot(openai(&original)).await.expect("repaired");
    let body: Value = serde_json::from_slice(&text_of(resp).await).unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"],
        r#"{"city": "Oslo", "country": "Norway"}"#
    );
    assert_eq!(up.calls(), 2);
    assert_eq!(
        up.body(0),
        original,
        "the first turn is the caller's request"
    );
    let second = up.body(1);
    let messages = second["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4);
    assert_eq!(messages[..2], original["messages"].as_array().unwrap()[..]);
    assert_eq!(
        messages[2],
        json!({"role": "assistant", "content": "Oslo is the capital of Norway."})
    );
    assert_eq!(messages[3]["role"], "user");
    let complaint = messages[3]["content"].as_str().unwrap();
    assert!(
        complaint.contains("the answer is not valid JSON"),
        "{complaint}"
    );
    assert_eq!(second["model"], original["model"]);
    assert_eq!(second["max_tokens"], original["max_tokens"]);
}

#[tokio::test(start_paused = true)]
async fn an_anthropic_repair_appends_to_messages_and_leaves_system_alone() {
    let up = Script::new([
        anthropic_answer(r#"{"city": "Oslo"}"#),
        anthropic_answer(r#"{"city": "Oslo", "country": "Norway"}"#),
    ]);
    let layer = RepairLayer::builder(city())
        .template("Wrong: {error}")
        .build()
        .unwrap();
    let svc = layer.layer(up.clone());
    let original = anthropic_body(false);
    let resp = svc.oneshot(anthropic(&original)).await.expect("repaired");
    let body: Value = serde_json::from_slice(&text_of(resp).await).unwrap();
    assert_eq!(
        body["content"][0]["text"],
        r#"{"city": "Oslo", "country": "Norway"}"#
    );
    let second = up.body(1);
    assert_eq!(second["system"], "Reply in JSON.");
    assert_eq!(
        second["messages"],
        json!([{"role": "user", "content": "Where is Oslo?"},
               {"role": "assistant", "content": "{\"city\": \"Oslo\"}"},
               {"role": "user", "content": "Wrong: the JSON object is missing the field `country`"}])
    );
}

#[tokio::test(start_paused = true)]
async fn it_gives_up_after_max_repairs_with_every_answers_error() {
    // The chaos upstream answers lorem text, never JSON; the real classifier is below.
    for (request, path) in [
        (openai(&openai_body(false)), "openai"),
        (anthropic(&anthropic_body(false)), "anthropic"),
    ] {
        let mock = MockUpstream::new(Profile::default().seed(3));
        let stack =
            RepairLayer::new(validate_json()).layer(ClassifyLayer::new().layer(mock.clone()));
        let err = stack.oneshot(request).await.expect_err(path);
        assert_eq!(err.class(), FailureClass::ContentInvalid, "{path}: {err}");
        assert_eq!(mock.stats().requests, 3, "{path}: the answer and 2 repairs");
        let detail = ContentInvalid::of(&err).expect("the detail is the source");
        assert_eq!(detail.errors().len(), 3, "{path}");
        for e in detail.errors() {
            assert!(e.starts_with("the answer is not valid JSON"), "{path}: {e}");
        }
        assert!(err.message().starts_with("3 answers failed validation"));
    }
}

#[tokio::test(start_paused = true)]
async fn zero_repairs_validates_and_fails_at_once() {
    let up = Script::new([openai_answer("nope")]);
    let layer = RepairLayer::builder(validate_json())
        .max_repairs(0)
        .build()
        .unwrap();
    let err = layer
        .layer(up.clone())
        .oneshot(openai(&openai_body(false)))
        .await
        .expect_err("invalid");
    assert_eq!(err.class(), FailureClass::ContentInvalid);
    assert_eq!(err.request_id(), Some("req_script"));
    assert_eq!(ContentInvalid::of(&err).unwrap().errors().len(), 1);
    assert_eq!(up.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_error_never_shows_a_credential_the_validator_quoted() {
    let up = Script::new([openai_answer("my key is sk-proj-abcdefghijklmnop123456")]);
    let svc = RepairLayer::new(|a: &Answer<'_>| Err(format!("bad answer: {}", a.text())))
        .layer(up.clone());
    let err = svc
        .oneshot(openai(&openai_body(false)))
        .await
        .expect_err("invalid");
    let mut shown = format!("{err} {err:?}");
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        shown.push_str(&format!(" {s} {s:?}"));
        source = s.source();
    }
    shown.push_str(&format!("{:?}", ContentInvalid::of(&err)));
    assert!(!shown.contains("abcdefghijklmnop123456"), "{shown}");
    assert_eq!(up.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_valid_answer_makes_one_call_and_is_returned_byte_for_byte() {
    let raw = Bytes::from(
        openai_answer_raw(r#"{"city":"Oslo","country":"Norway"}"#).replace(',', " ,\n "),
    );
    // Three frames, as a body may come off the wire.
    let frames = vec![raw.slice(..10), raw.slice(10..40), raw.slice(40..)];
    let up = Script::new([Reply::Body(200, frames)]);
    let svc = RepairLayer::new(city()).layer(up.clone());
    let original = openai(&openai_body(false));
    let sent = original.body().clone();
    let resp = svc.oneshot(original).await.expect("valid");
    assert_eq!(resp.headers()["x-request-id"], "req_script");
    assert!(resp.body().is_read());
    assert_eq!(text_of(resp).await, raw);
    assert_eq!(up.calls(), 1);
    assert_eq!(
        up.seen.lock().unwrap()[0],
        sent,
        "the request went unchanged"
    );
}

fn openai_answer_raw(text: &str) -> String {
    match openai_answer(text) {
        Reply::Body(_, frames) => String::from_utf8(frames[0].to_vec()).unwrap(),
        _ => unreachable!(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_streamed_request_is_never_repaired() {
    for (request, sse) in [
        (
            openai(&openai_body(true)),
            "data: {\"choices\":[{\"delta\":{\"content\":\"not json\"}}]}\n\ndata: [DONE]\n\n",
        ),
        (
            anthropic(&anthropic_body(true)),
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        ),
    ] {
        let up = Script::new([Reply::Body(200, vec![Bytes::from(sse)])]);
        let svc = RepairLayer::new(validate_json()).layer(up.clone());
        let resp = svc.oneshot(request).await.expect("passed through");
        assert!(!resp.body().is_read(), "never read by the layer");
        assert_eq!(text_of(resp).await, sse);
        assert_eq!(up.calls(), 1);
    } // Even a streamed request answered with an invalid JSON answer (a server that ignored
    // `stream`) is left alone: the layer decides from the request, before any answer.
    let up = Script::new([openai_answer("not json")]);
    let svc = RepairLayer::new(validate_json()).layer(up.clone());
    let resp = svc
        .oneshot(openai(&openai_body(true)))
        .await
        .expect("passed through");
    assert!(!resp.body().is_read());
    text_of(resp).await;
    assert_eq!(up.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn hostile_bodies_pass_through_untouched_without_a_panic() {
    let bodies: Vec<Bytes> = vec![
        Bytes::from_static(b"<html>502 Bad Gateway</html>"),
        Bytes::from_static(b"{\"choices\": [{\"message\": {\"content\": "),
        Bytes::from_static(b"{\"foo\": 1}"),
        Bytes::from_static(b"[]"),
        Bytes::from_static(b"null"),
        Bytes::from_static(b"{\"choices\": [{\"message\": 7}]}"),
        Bytes::from_static(&[0xff, 0xfe, 0x00, 0x80]),
        Bytes::new(),
        Bytes::from("[".repeat(100_000)),
    ];
    for body in bodies {
        for request in [
            openai(&openai_body(false)),
            anthropic(&anthropic_body(false)),
        ] {
            let up = Script::new([Reply::Body(200, vec![body.clone()])]);
            let svc = RepairLayer::new(validate_json()).layer(up.clone());
            let resp = svc.oneshot(request).await.expect("passed through");
            assert_eq!(text_of(resp).await, body);
            assert_eq!(up.calls(), 1);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_error_status_passes_through_unread() {
    let up = Script::new([Reply::Body(503, vec![Bytes::from_static(b"busy")])]);
    let svc = RepairLayer::new(validate_json()).layer(up.clone());
    let resp = svc
        .oneshot(openai(&openai_body(false)))
        .await
        .expect("passed");
    assert_eq!(resp.status(), 503);
    assert!(!resp.body().is_read());
    assert_eq!(up.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_answer_over_the_body_limit_passes_through_unvalidated() {
    let huge = openai_answer_raw(&"not json ".repeat(10_000));
    let frames: Vec<Bytes> = Bytes::from(huge.clone())
        .chunks(1000)
        .map(Bytes::copy_from_slice)
        .collect();
    // Without a content-length: found once the bytes read pass the limit.
    let up = Script::new([Reply::Body(200, frames.clone())]);
    let layer = RepairLayer::builder(validate_json())
        .max_body_bytes(4096)
        .build()
        .unwrap();
    let resp = layer
        .clone()
        .layer(up.clone())
        .oneshot(openai(&openai_body(false)))
        .await
        .expect("passed");
    assert!(!resp.body().is_read());
    assert_eq!(text_of(resp).await, huge.as_bytes());
    assert_eq!(up.calls(), 1);
    // With one: not read at all.
    let up = Script {
        content_length: true,
        ..Script::new([Reply::Body(200, frames)])
    };
    let resp = layer
        .layer(up.clone())
        .oneshot(openai(&openai_body(false)))
        .await
        .expect("passed");
    assert!(!resp.body().is_read());
    assert_eq!(text_of(resp).await, huge.as_bytes());
    assert_eq!(up.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn tool_call_answers_and_several_choices_are_not_judged() {
    let tool = json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message":
        {"role": "assistant", "content": null,
         "tool_calls": [{"id": "c", "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]}}]});
    let up = Script::new([Reply::Body(200, vec![Bytes::from(tool.to_string())])]);
    let svc = RepairLayer::new(validate_json()).layer(up.clone());
    svc.oneshot(openai(&openai_body(false)))
        .await
        .expect("passed");
    assert_eq!(up.calls(), 1);

    let mut body = openai_body(false);
    body["n"] = json!(3);
    let up = Script::new([openai_answer("not json")]);
    let svc = RepairLayer::new(validate_json()).layer(up.clone());
    svc.oneshot(openai(&body)).await.expect("passed");
    assert_eq!(up.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_body_that_fails_while_read_ends_the_call_with_its_error() {
    let up = Script::new([Reply::Broken(Bytes::from_static(b"{\"choices\""))]);
    let svc = RepairLayer::new(validate_json()).layer(up.clone());
    let err = svc
        .oneshot(openai(&openai_body(false)))
        .await
        .expect_err("broken");
    assert_eq!(err.class(), FailureClass::StreamInterrupted);
    assert_eq!(up.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn no_repair_turn_once_the_deadline_has_passed() {
    let up = Script::new([openai_answer("late and wrong")]);
    let svc = RepairLayer::new(validate_json()).layer(up.clone());
    let mut req = openai(&openai_body(false));
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_secs(1)));
    tokio::time::advance(Duration::from_secs(2)).await;
    let err = svc.oneshot(req).await.expect_err("no time to repair");
    assert_eq!(err.class(), FailureClass::ContentInvalid);
    assert_eq!(ContentInvalid::of(&err).unwrap().errors().len(), 1);
    assert_eq!(up.calls(), 1);
}

fn recorded() -> (ObserveLayer, Arc<Mutex<Vec<CallRecord>>>) {
    let records: Arc<Mutex<Vec<CallRecord>>> = Arc::default();
    let sink = records.clone();
    let layer = ObserveLayer::builder()
        .recorder(move |r: &CallRecord| sink.lock().unwrap().push(r.clone()))
        .build()
        .unwrap();
    (layer, records)
}

#[tokio::test(start_paused = true)]
async fn each_repair_turn_is_counted_in_the_call_record() {
    let up = Script::new([
        openai_answer("one"),
        openai_answer("two"),
        openai_answer(r#"{"city": "Oslo", "country": "Norway"}"#),
    ]);
    let (observe, records) = recorded();
    let svc = observe.layer(RepairLayer::new(city()).layer(up.clone()));
    let resp = svc
        .clone()
        .oneshot(openai(&openai_body(false)))
        .await
        .expect("repaired");
    text_of(resp).await;
    {
        let records = records.lock().unwrap();
        let r = &records[0];
        assert_eq!(r.outcome, CallOutcome::Success);
        assert_eq!(r.repairs, 2);
        assert_eq!(r.attempts, 3, "one call per turn");
        assert_eq!(r.retries(), 0, "a repair turn is not a retry");
    }

    // And a call that gives up says so too.
    let up = Script::new([openai_answer("never")]);
    let (observe, records) = recorded();
    let svc = observe.layer(RepairLayer::new(city()).layer(up.clone()));
    svc.oneshot(openai(&openai_body(false)))
        .await
        .expect_err("gives up");
    let records = records.lock().unwrap();
    assert_eq!(records[0].class, Some(FailureClass::ContentInvalid));
    assert_eq!(records[0].repairs, 2);
}

#[tokio::test(start_paused = true)]
async fn a_repair_turn_goes_through_the_inner_retry_loop() {
    // The repair turn meets an overload first: the retry layer inside retries it.
    let up = Script::new([
        openai_answer("not json"),
        Reply::Fail(FailureClass::Overloaded),
        openai_answer(r#"{"city": "Oslo", "country": "Norway"}"#),
    ]);
    let (observe, records) = recorded();
    let svc =
        observe.layer(RepairLayer::new(city()).layer(BackoffRetryLayer::new().layer(up.clone())));
    let resp = svc
        .oneshot(openai(&openai_body(false)))
        .await
        .expect("repaired after a retry");
    text_of(resp).await;
    assert_eq!(up.calls(), 3);
    let records = records.lock().unwrap();
    assert_eq!(records[0].repairs, 1);
    assert_eq!(records[0].attempts, 3);
    assert_eq!(records[0].retries(), 1);
    // The retried turn was the repair turn, with the answer and the complaint in it.
    assert_eq!(up.body(1), up.body(2));
    assert_eq!(up.body(2)["messages"].as_array().unwrap().len(), 4);
}
