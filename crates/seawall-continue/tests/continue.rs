//! ContinueLayer against the chaos upstream on paused time: answers cut by `max_tokens`
//! continued to the whole text, streams cut mid-way resumed without duplicated text, in both
//! wire formats, and every way it must not change what the caller gets.

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::BodyExt;
use seawall_continue::{ContinuationStyle, ContinueLayer};
use seawall_core::{FailureClass, LlmError};
use seawall_mock::{Count, ErrorRule, Profile};
use seawall_test_support::drain;
use serde_json::Value;
use tower::ServiceExt;

fn cutting(after: u32) -> Profile {
    profile().cut_streams(1.0, Count::fixed(after), true)
}

async fn json_of<B>(resp: http::Response<B>) -> Value
where
    B: http_body::Body<Data = Bytes, Error = LlmError>,
{
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

/// An upstream whose answers are 40 tokens long, and a layer that continues an answer at most
/// three times.
fn forty_tokens_and_three_continuations() -> (Up, ContinueLayer) {
    let up = Up::single(profile().output_tokens(Count::fixed(40)));
    let layer = ContinueLayer::builder()
        .max_continuations(3)
        .build()
        .unwrap();
    (up, layer)
}

#[tokio::test(start_paused = true)]
async fn a_length_cut_answer_is_continued_to_the_whole_text_with_summed_usage() {
    for anthropic_wire in [false, true] {
        let whole = uncut(profile(), anthropic_wire).await;
        let up = Up::single(profile());
        let (svc, records) = stack(up.clone(), ContinueLayer::new());
        let resp = svc.oneshot(ask(anthropic_wire, false, 6)).await.unwrap();
        let v = json_of(resp).await;
        assert_eq!(answer_text(&v), whole, "{v}");
        // Three attempts: 6 + 6 + 4 words, each billed; the instruction style's continuations
        // repeat one word each, which the layer trimmed.
        assert_eq!(up.calls(), 3);
        let (finish, output, input) = if anthropic_wire {
            (
                &v["stop_reason"],
                &v["usage"]["output_tokens"],
                &v["usage"]["input_tokens"],
            )
        } else {
            (
                &v["choices"][0]["finish_reason"],
                &v["usage"]["completion_tokens"],
                &v["usage"]["prompt_tokens"],
            )
        };
        assert!(matches!(finish.as_str(), Some("stop" | "end_turn")), "{v}");
        assert_eq!(output, if anthropic_wire { 16 } else { 18 }, "{v}");
        // Three prompts, each longer than the last (it carries the partial answer).
        assert!(input.as_u64().unwrap() > 30, "{v}");
        let records = records.lock().unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!((records[0].continuations, records[0].resumed), (2, 0));
        assert_eq!(
            records[0].usage.unwrap().output_tokens,
            output.as_u64().unwrap()
        );
    }
}

#[tokio::test(start_paused = true)]
async fn each_style_asks_the_way_its_upstream_understands() {
    for style in [
        ContinuationStyle::Prefix,
        ContinuationStyle::ContinueFinalMessage,
        ContinuationStyle::Instruction,
    ] {
        let whole = uncut(profile(), false).await;
        let up = Up::single(profile());
        let layer = ContinueLayer::builder()
            .openai_style(style)
            .build()
            .unwrap();
        let (svc, _) = stack(up.clone(), layer);
        let v = json_of(svc.oneshot(openai(false, 6)).await.unwrap()).await;
        assert_eq!(answer_text(&v), whole, "{style:?}");
        let follow_up = up.request(1);
        let messages = follow_up["messages"].as_array().unwrap();
        let partial = whole.split(' ').take(6).collect::<Vec<_>>().join(" ");
        match style {
            ContinuationStyle::Instruction => {
                assert_eq!(messages[messages.len() - 2]["content"], partial.as_str());
                assert_eq!(messages[messages.len() - 1]["role"], "user");
            }
            ContinuationStyle::Prefix => {
                assert_eq!(messages.last().unwrap()["prefix"], true);
                assert_eq!(messages.last().unwrap()["content"], partial.as_str());
            }
            _ => {
                assert_eq!(follow_up["continue_final_message"], true);
                assert_eq!(follow_up["add_generation_prompt"], false);
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_streamed_length_cut_answer_continues_in_the_same_stream() {
    // The same with the first tokens held: a length finish while held is continued.
    for (anthropic_wire, held) in [(false, 0), (true, 0), (false, 100), (true, 100)] {
        let whole = uncut(profile(), anthropic_wire).await;
        let up = Up::single(profile());
        let (svc, records) = stack(up.clone(), restarting(held));
        let resp = svc.oneshot(ask(anthropic_wire, true, 6)).await.unwrap();
        let (sse, err) = drain(resp.into_body()).await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(streamed_text(&sse), whole, "{sse}");
        if anthropic_wire {
            assert_eq!(count(&sse, "message_start"), 1, "{sse}");
            assert_eq!(count(&sse, "content_block_start"), 1, "{sse}");
            assert_eq!(count(&sse, "content_block_stop"), 1, "{sse}");
            assert_eq!(count(&sse, "message_stop"), 1, "{sse}");
            let deltas: Vec<_> = events(&sse)
                .into_iter()
                .filter(|(n, _)| n == "message_delta")
                .collect();
            assert_eq!(deltas.len(), 1, "{sse}");
            let d: Value = serde_json::from_str(&deltas[0].1).unwrap();
            assert_eq!(d["delta"]["stop_reason"], "end_turn");
            assert_eq!(d["usage"]["output_tokens"], 16);
        } else {
            assert_eq!(count(&sse, "\"role\""), 1, "{sse}");
            assert_eq!(count(&sse, "[DONE]"), 1, "{sse}");
            assert_eq!(count(&sse, "\"finish_reason\":\"length\""), 0, "{sse}");
            assert_eq!(count(&sse, "\"finish_reason\":\"stop\""), 1, "{sse}");
            let usage: Vec<Value> = events(&sse)
                .iter()
                .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
                .filter(|v| v["usage"].is_object())
                .collect();
            assert_eq!(usage.len(), 1, "{sse}");
            assert_eq!(usage[0]["usage"]["completion_tokens"], 18);
            // Every chunk carries the first attempt's id.
            let ids: std::collections::HashSet<String> = events(&sse)
                .iter()
                .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
                .filter_map(|v| v["id"].as_str().map(str::to_owned))
                .collect();
            assert_eq!(ids.len(), 1, "{ids:?}");
        }
        assert_eq!(records.lock().unwrap()[0].continuations, 2);
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_cut_mid_way_is_resumed_with_the_exact_text_in_both_formats() {
    for anthropic_wire in [false, true] {
        let whole = uncut(profile(), anthropic_wire).await;
        let up = Up::new(cutting(5), profile());
        let (svc, records) = stack(up.clone(), ContinueLayer::new());
        let resp = svc.oneshot(ask(anthropic_wire, true, 100)).await.unwrap();
        let (sse, err) = drain(resp.into_body()).await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(streamed_text(&sse), whole, "{sse}");
        assert_eq!(up.calls(), 2);
        let done = if anthropic_wire {
            "message_stop"
        } else {
            "[DONE]"
        };
        assert_eq!(count(&sse, done), 1, "{sse}");
        let records = records.lock().unwrap();
        assert_eq!((records[0].resumed, records[0].continuations), (1, 0));
        let usage = records[0].usage.unwrap();
        // 5 tokens of the cut attempt, 11 of the continuation (and the word the instruction
        // style's continuation repeats, which the layer trimmed).
        assert_eq!(usage.output_tokens, if anthropic_wire { 16 } else { 17 });
        assert_eq!(records[0].outcome, seawall_observe::CallOutcome::Success);
    }
}

#[tokio::test(start_paused = true)]
async fn several_cuts_are_resumed_up_to_the_bound_then_the_cut_is_the_callers() {
    // The first four streams are cut after 3 tokens.
    let whole = uncut(profile(), false).await;
    let up = Up::new(cutting(3), profile()).first_calls(4);
    let layer = ContinueLayer::builder()
        .max_continuations(10)
        .build()
        .unwrap();
    let (svc, records) = stack(up.clone(), layer);
    let (sse, err) = drain(svc.oneshot(openai(true, 100)).await.unwrap().into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(streamed_text(&sse), whole);
    assert_eq!(records.lock().unwrap()[0].resumed, 4);
    assert_eq!(up.calls(), 5);

    // Every stream is cut: after two resumptions the third cut is the caller's. With the first
    // tokens held, restarts count against the same bound, and the caller gets the third
    // attempt's three words with its cut, nothing of the first two.
    for held in [0, 100] {
        let up = Up::single(cutting(3));
        let layer = ContinueLayer::builder()
            .max_continuations(2)
            .openai_style(ContinuationStyle::Prefix)
            .restart_within(held)
            .build()
            .unwrap();
        let (svc, records) = stack(up.clone(), layer);
        let (sse, err) = drain(svc.oneshot(openai(true, 100)).await.unwrap().into_body()).await;
        assert_eq!(err.unwrap().class(), FailureClass::StreamInterrupted);
        assert_eq!(up.calls(), 3);
        let words = if held == 0 { 9 } else { 3 };
        assert_eq!(streamed_text(&sse).split(' ').count(), words, "{sse}");
        if held == 0 {
            assert!(whole.starts_with(&streamed_text(&sse)));
        }
        assert_eq!(count(&sse, "\"role\":\"assistant\""), 1, "{sse}");
        let records = records.lock().unwrap();
        let (resumed, restarts) = if held == 0 { (2, 0) } else { (0, 2) };
        assert_eq!(
            (records[0].resumed, records[0].restarts),
            (resumed, restarts)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn length_continuations_stop_at_the_bound_with_a_length_finish() {
    let (up, layer) = forty_tokens_and_three_continuations();
    let (svc, records) = stack(up.clone(), layer);
    let v = json_of(svc.oneshot(anthropic(false, 5)).await.unwrap()).await;
    assert_eq!(up.calls(), 4);
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(answer_text(&v).split(' ').count(), 20);
    assert_eq!(records.lock().unwrap()[0].continuations, 3);
}

#[tokio::test(start_paused = true)]
async fn with_resumption_off_the_caller_gets_the_stream_interrupted_error() {
    let up = Up::new(cutting(5), profile());
    let layer = ContinueLayer::builder().resume(false).build().unwrap();
    let (svc, records) = stack(up.clone(), layer);
    let (sse, err) = drain(svc.oneshot(anthropic(true, 100)).await.unwrap().into_body()).await;
    assert_eq!(err.unwrap().class(), FailureClass::StreamInterrupted);
    assert_eq!(streamed_text(&sse).split(' ').count(), 5);
    assert_eq!(up.calls(), 1);
    assert_eq!(records.lock().unwrap()[0].resumed, 0);
}

#[tokio::test(start_paused = true)]
async fn a_failing_continuation_leaves_the_original_stream_interrupted_error() {
    for anthropic_wire in [false, true] {
        let failing = profile().error(ErrorRule::random(500, 1.0));
        let up = Up::new(cutting(5), failing);
        let (svc, _) = stack(up.clone(), ContinueLayer::new());
        let resp = svc.oneshot(ask(anthropic_wire, true, 100)).await.unwrap();
        let (sse, err) = drain(resp.into_body()).await;
        let err = err.expect("the cut reaches the caller");
        assert_eq!(err.class(), FailureClass::StreamInterrupted);
        assert!(err.to_string().contains("reset"), "{err}");
        assert_eq!(streamed_text(&sse).split(' ').count(), 5);
        assert_eq!(up.calls(), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_length_continuation_leaves_the_answer_as_it_was() {
    let failing = profile().error(ErrorRule::random(503, 1.0));
    // Streamed: the finish, usage and [DONE] held back are sent after all.
    let up = Up::new(profile(), failing.clone());
    let (svc, _) = stack(up.clone(), ContinueLayer::new());
    let (sse, err) = drain(svc.oneshot(openai(true, 6)).await.unwrap().into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(streamed_text(&sse).split(' ').count(), 6);
    assert_eq!(count(&sse, "\"finish_reason\":\"length\""), 1, "{sse}");
    assert_eq!(count(&sse, "[DONE]"), 1, "{sse}");
    // Not streamed: the first answer, unchanged.
    let up = Up::new(profile(), failing);
    let (svc, _) = stack(up.clone(), ContinueLayer::new());
    let v = json_of(svc.oneshot(anthropic(false, 6)).await.unwrap()).await;
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(answer_text(&v).split(' ').count(), 6);
}

#[tokio::test(start_paused = true)]
async fn an_answer_that_needs_nothing_passes_through_byte_for_byte() {
    for anthropic_wire in [false, true] {
        for stream in [false, true] {
            let direct = common::mock(profile())
                .oneshot(ask(anthropic_wire, stream, 100))
                .await
                .unwrap();
            let want = direct.into_body().collect().await.unwrap().to_bytes();
            let up = Up::single(profile());
            let (svc, records) = stack(up.clone(), ContinueLayer::new());
            let resp = svc.oneshot(ask(anthropic_wire, stream, 100)).await.unwrap();
            let (got, err) = drain(resp.into_body()).await;
            assert!(err.is_none());
            assert_eq!(got.as_bytes(), &want[..]);
            assert_eq!(up.calls(), 1);
            let r = &records.lock().unwrap()[0];
            assert_eq!((r.continuations, r.resumed), (0, 0));
            assert!(r.usage.is_some());
        }
    }
}

#[tokio::test(start_paused = true)]
async fn requests_it_cannot_continue_are_left_alone() {
    let up = Up::new(cutting(5), profile());
    let (svc, _) = stack(up.clone(), ContinueLayer::new());
    // Two choices: the cut is the caller's.
    let mut req = openai(true, 100);
    let mut body: Value = serde_json::from_slice(req.body()).unwrap();
    body["n"] = 2.into();
    *req.body_mut() = Bytes::from(body.to_string());
    let (_, err) = drain(svc.oneshot(req).await.unwrap().into_body()).await;
    assert_eq!(err.unwrap().class(), FailureClass::StreamInterrupted);
    assert_eq!(up.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_record_keeps_the_callers_time_to_first_token() {
    use seawall_mock::Delay;
    use std::time::Duration;
    let first = cutting(5).first_token_latency(Delay::fixed(Duration::from_millis(400)));
    let rest = profile().first_token_latency(Delay::fixed(Duration::from_millis(100)));
    let up = Up::new(first, rest);
    let records: Records = Default::default();
    let sink = records.clone();
    let observe = seawall_observe::ObserveLayer::builder()
        .recorder(move |r: &seawall_observe::CallRecord| sink.lock().unwrap().push(r.clone()))
        .build()
        .unwrap();
    use tower::Layer;
    let svc = observe.layer(
        ContinueLayer::new().layer(
            seawall_stream::StreamTimeoutLayer::new()
                .layer(seawall_classify::ClassifyLayer::new().layer(up.clone())),
        ),
    );
    let (_, err) = drain(svc.oneshot(openai(true, 100)).await.unwrap().into_body()).await;
    assert!(err.is_none(), "{err:?}");
    let r = &records.lock().unwrap()[0];
    assert_eq!(r.resumed, 1);
    assert_eq!(r.time_to_first_token, Some(Duration::from_millis(400)));
}

#[tokio::test(start_paused = true)]
async fn a_stream_cut_after_more_text_than_the_layer_keeps_is_not_resumed() {
    // The text delivered before the cut (5 words) is longer than the layer keeps: it is not
    // kept, and the cut is the caller's, as without the layer.
    for anthropic_wire in [false, true] {
        let up = Up::new(cutting(5), profile());
        let layer = ContinueLayer::builder().max_text_bytes(8).build().unwrap();
        let (svc, records) = stack(up.clone(), layer);
        let resp = svc.oneshot(ask(anthropic_wire, true, 100)).await.unwrap();
        let (sse, err) = drain(resp.into_body()).await;
        assert_eq!(err.unwrap().class(), FailureClass::StreamInterrupted);
        assert_eq!(streamed_text(&sse).split(' ').count(), 5);
        assert_eq!(up.calls(), 1);
        assert_eq!(records.lock().unwrap()[0].resumed, 0);
    }
    // Within the bound, the same cut is resumed.
    let up = Up::new(cutting(5), profile());
    let layer = ContinueLayer::builder()
        .max_text_bytes(4096)
        .build()
        .unwrap();
    let (svc, _) = stack(up.clone(), layer);
    let (_, err) = drain(svc.oneshot(openai(true, 100)).await.unwrap().into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(up.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_answer_larger_than_the_layer_reads_passes_through_uncontinued() {
    // A `length` answer over `max_body_bytes` is not read for its finish: passed on whole,
    // byte for byte, and no follow-up is made.
    let direct = common::mock(profile())
        .oneshot(anthropic(false, 6))
        .await
        .unwrap();
    let want = direct.into_body().collect().await.unwrap().to_bytes();
    let up = Up::single(profile());
    let layer = ContinueLayer::builder().max_body_bytes(64).build().unwrap();
    let (svc, records) = stack(up.clone(), layer);
    let resp = svc.oneshot(anthropic(false, 6)).await.unwrap();
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(got, want);
    assert_eq!(up.calls(), 1);
    assert_eq!(records.lock().unwrap()[0].continuations, 0);
    // Within the bound, the same answer is continued.
    let up = Up::single(profile());
    let (svc, _) = stack(up.clone(), ContinueLayer::new());
    let v = json_of(svc.oneshot(anthropic(false, 6)).await.unwrap()).await;
    assert_eq!(up.calls(), 3);
    assert_eq!(v["stop_reason"], "end_turn");
}

#[test]
fn a_service_moved_to_another_thread_keeps_the_layers_settings() {
    // The services of each thread hold the settings through a handle of their own, made again
    // on the first call after a move: a clone running on another thread obeys the same bound.
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let (up, layer) = forty_tokens_and_three_continuations();
    let (svc, records) = stack(up.clone(), layer);
    let here = svc.clone().oneshot(anthropic(false, 5));
    let here = rt().block_on(async { json_of(here.await.unwrap()).await });
    let moved = svc.clone();
    let there = std::thread::scope(|s| {
        s.spawn(move || {
            let call = moved.oneshot(anthropic(false, 5));
            rt().block_on(async { json_of(call.await.unwrap()).await })
        })
        .join()
        .unwrap()
    });
    for v in [&here, &there] {
        assert_eq!(v["stop_reason"], "max_tokens");
        assert_eq!(answer_text(v).split(' ').count(), 20);
    }
    assert_eq!(up.calls(), 8);
    let records = records.lock().unwrap();
    assert_eq!(records.len(), 2);
    assert!(records.iter().all(|r| r.continuations == 3));
}

#[tokio::test(start_paused = true)]
async fn the_service_is_cloned_only_for_calls_that_are_followed_up() {
    // A call that may be continued keeps a service for its follow-ups: cloned from one spare
    // when a follow-up is made, not for every call.
    use seawall_classify::ClassifyLayer;
    use tower::{Layer, Service};
    let up = Up::new(cutting(5), profile()).first_calls(4);
    let (counted, clones) = seawall_test_support::count_clones(up.clone());
    let mut svc = ContinueLayer::new().layer(ClassifyLayer::new().layer(counted));
    assert_eq!(
        clones.count(),
        1,
        "the spare, made as the layer wraps the service"
    );
    // Three non-streamed answers that need nothing, and a stream cut after 5 tokens, resumed.
    for _ in 0..3 {
        let resp = svc.ready().await.unwrap().call(openai(false, 100)).await;
        assert_eq!(
            json_of(resp.unwrap()).await["choices"][0]["finish_reason"],
            "stop"
        );
    }
    assert_eq!(
        clones.count(),
        1,
        "no clone for calls that are not followed up"
    );
    let resp = svc.ready().await.unwrap().call(openai(true, 100)).await;
    let (sse, err) = drain(resp.unwrap().into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(count(&sse, "[DONE]"), 1, "{sse}");
    assert_eq!(up.calls(), 5);
    assert_eq!(clones.count(), 2, "one for the stream that was resumed");
    // An answer cut by `max_tokens`, continued twice through one clone.
    let resp = svc.ready().await.unwrap().call(openai(false, 6)).await;
    assert_eq!(
        json_of(resp.unwrap()).await["choices"][0]["finish_reason"],
        "stop"
    );
    assert_eq!(up.calls(), 8);
    assert_eq!(clones.count(), 3);

    // A layer that continues nothing keeps no spare.
    let (counted, clones) = seawall_test_support::count_clones(up.clone());
    let off = ContinueLayer::builder()
        .max_continuations(0)
        .build()
        .unwrap();
    let mut svc = off.layer(ClassifyLayer::new().layer(counted));
    let resp = svc.ready().await.unwrap().call(openai(false, 100)).await;
    assert_eq!(
        json_of(resp.unwrap()).await["choices"][0]["finish_reason"],
        "stop"
    );
    assert_eq!(clones.count(), 0);
}

/// A layer that holds a stream's first `tokens` tokens back.
fn restarting(tokens: u32) -> ContinueLayer {
    ContinueLayer::builder()
        .restart_within(tokens)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_stream_cut_while_its_first_tokens_are_held_is_asked_again_from_the_start() {
    let error_event = profile().mid_stream_errors(1.0, Count::fixed(4));
    for (anthropic_wire, cut, cut_at) in [
        (false, cutting(5), 5),
        (true, cutting(5), 5),
        (false, error_event, 4),
    ] {
        let whole = uncut(profile(), anthropic_wire).await;
        let up = Up::new(cut, profile());
        let (svc, records) = stack(up.clone(), restarting(100));
        let resp = svc.oneshot(ask(anthropic_wire, true, 100)).await.unwrap();
        let (sse, err) = drain(resp.into_body()).await;
        assert!(err.is_none(), "{err:?}");
        // Only the second attempt's stream: its opening once, its text whole, no error event.
        assert_eq!(streamed_text(&sse), whole, "{sse}");
        let (opening, done) = if anthropic_wire {
            ("message_start", "message_stop")
        } else {
            ("\"role\":\"assistant\"", "[DONE]")
        };
        assert_eq!((count(&sse, opening), count(&sse, done)), (1, 1), "{sse}");
        assert_eq!(count(&sse, "error"), 0, "{sse}");
        // The same request again, not a follow-up carrying a partial answer.
        assert_eq!(up.calls(), 2);
        assert_eq!(up.request(1), up.request(0));
        let records = records.lock().unwrap();
        assert_eq!(
            (records[0].restarts, records[0].resumed, records[0].attempts),
            (1, 0, 2)
        );
        // The record counts both attempts' output; the caller's stream says its own.
        let usage = records[0].usage.unwrap();
        assert_eq!(usage.output_tokens, 16 + cut_at, "{usage:?}");
        assert_eq!(records[0].outcome, seawall_observe::CallOutcome::Success);
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_cut_after_its_held_tokens_went_through_is_resumed() {
    let whole = uncut(profile(), false).await;
    let up = Up::new(cutting(5), profile());
    // Five words are more than two tokens: let through, so the cut is resumed.
    let (svc, records) = stack(up.clone(), restarting(2));
    let (sse, err) = drain(svc.oneshot(openai(true, 100)).await.unwrap().into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(streamed_text(&sse), whole, "{sse}");
    assert_ne!(up.request(1), up.request(0));
    assert_eq!(up.request(1)["messages"][1]["role"], "assistant");
    let records = records.lock().unwrap();
    assert_eq!((records[0].restarts, records[0].resumed), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn the_caller_gets_a_held_stream_once_its_first_tokens_came() {
    // Ten milliseconds between words: what reaches the caller at the instant of its first
    // frame is everything the layer held until then.
    let slow = || {
        profile().per_token_latency(seawall_mock::Delay::fixed(
            std::time::Duration::from_millis(10),
        ))
    };
    for (tokens, at_least, below) in [(0, 0, 8), (12, 48, usize::MAX)] {
        let up = Up::single(slow());
        let (svc, _) = stack(up.clone(), restarting(tokens));
        let mut body = svc.oneshot(openai(true, 100)).await.unwrap().into_body();
        let mut first_at = None;
        let mut at_once = String::new();
        while let Some(frame) = body.frame().await {
            let now = tokio::time::Instant::now();
            let frame = frame.unwrap().into_data().unwrap();
            if *first_at.get_or_insert(now) == now {
                at_once.push_str(&streamed_text(std::str::from_utf8(&frame).unwrap()));
            }
        }
        assert!(
            (at_once.len() >= at_least) && (at_once.len() < below),
            "holding {tokens}: {at_once:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_whole_answers_usage_counts_output_that_only_the_total_holds() {
    // A thinking model behind an OpenAI-compatible endpoint (Gemini's): its thought tokens are
    // in `total_tokens`, billed as output, and not in `completion_tokens`.
    let sse = "data: {\"id\":\"g\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gemini-2.5-flash\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"36\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":198,\"total_tokens\":623}}\n\ndata: [DONE]\n\n";
    let upstream = tower::service_fn(move |_req: http::Request<Bytes>| async move {
        let resp = http::Response::builder()
            .header("content-type", "text/event-stream")
            .body(http_body_util::Full::new(Bytes::from_static(
                sse.as_bytes(),
            )))
            .unwrap();
        Ok::<_, LlmError>(resp)
    });
    let (svc, records) = stack(upstream, ContinueLayer::new());
    let resp = svc.oneshot(ask(false, true, 64)).await.unwrap();
    drain(resp.into_body()).await;
    let usage = records.lock().unwrap()[0].usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (20, 603));
}

/// A streamed body whose parser (a classifier, stood in for here) recorded each frame with a
/// `content` member as content in its report at `stamped`, not when the frame is read.
struct Stamped {
    frames: std::collections::VecDeque<Bytes>,
    report: std::sync::Arc<seawall_core::BodyReport>,
    stamped: tokio::time::Instant,
}

impl http_body::Body for Stamped {
    type Data = Bytes;
    type Error = LlmError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, LlmError>>> {
        let frame = self.frames.pop_front();
        if let Some(f) = &frame {
            if f.windows(11).any(|w| w == b"\"content\":\"") {
                self.report.record_content_at(self.stamped);
            }
        }
        std::task::Poll::Ready(frame.map(|f| Ok(http_body::Frame::data(f))))
    }
}

/// The spliced answer's report takes each content frame's time from the report of the
/// attempt's own parser, where that parser recorded one while the frame was read.
#[tokio::test(start_paused = true)]
async fn the_whole_answers_content_times_are_those_the_attempts_parser_recorded() {
    let start = tokio::time::Instant::now();
    let svc = tower::service_fn(move |_req: http::Request<Bytes>| async move {
        // The answer comes 5 s after the call; its parser stamped its content at 3 s.
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        let report = std::sync::Arc::new(seawall_core::BodyReport::starting_at(start));
        let chunk = |delta: &str| {
            Bytes::from(format!(
                "data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":null}}]}}\n\n"
            ))
        };
        let frames = [
            chunk(r#"{"role":"assistant","content":""}"#),
            chunk(r#"{"content":"Hi"}"#),
            chunk(r#"{"content":" there"}"#),
            Bytes::from_static(
                b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            ),
            Bytes::from_static(b"data: [DONE]\n\n"),
        ];
        let body = Stamped {
            frames: frames.into_iter().collect(),
            report: report.clone(),
            stamped: start + std::time::Duration::from_secs(3),
        };
        let mut resp = http::Response::builder()
            .header("content-type", "text/event-stream")
            .body(body)
            .unwrap();
        resp.extensions_mut().insert(report);
        Ok::<_, LlmError>(resp)
    });
    let svc = tower::Layer::layer(&ContinueLayer::new(), svc);
    let resp = svc.oneshot(openai(true, 64)).await.unwrap();
    let whole = resp
        .extensions()
        .get::<std::sync::Arc<seawall_core::BodyReport>>()
        .unwrap()
        .clone();
    let (text, error) = drain(resp.into_body()).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(streamed_text(&text), "Hi there");
    assert_eq!(whole.content_events(), 2);
    assert_eq!(
        whole.last_content_at(),
        Some(start + std::time::Duration::from_secs(3))
    );
    assert_eq!(
        whole.time_to_first_token(),
        Some(std::time::Duration::from_secs(3))
    );
}
