//! Single flight: identical requests in flight at once share one upstream call, each caller
//! with its own cancellation; a failure is not shared.

mod common;

use std::time::Duration;

use common::*;
use futures_util::future::join_all;
use seawall_cache::{CacheLayer, MemoryStore};
use serde_json::json;

fn layer() -> CacheLayer {
    CacheLayer::new(MemoryStore::new())
}

#[tokio::test(start_paused = true)]
async fn a_thousand_identical_calls_make_one_upstream_call() {
    let up = Up::plain().slow(Duration::from_millis(500));
    let svc = stack(layer(), &up);
    let calls = (0..1_000).map(|i| {
        let svc = svc.clone();
        // Half of them stream: one answer serves both modes.
        let req = openai(&openai_body(i % 2 == 0));
        async move { read(send(&svc, req).await.unwrap()).await }
    });
    let results = join_all(calls).await;
    assert_eq!(up.calls(), 1, "the upstream saw exactly one call");
    let text = answer_text(&results[1].2);
    let mut statuses = std::collections::HashMap::new();
    for (status, _, body) in &results {
        assert_eq!(answer_text(body), text);
        *statuses.entry(status.clone()).or_insert(0) += 1;
    }
    assert_eq!(statuses["miss"], 1);
    assert_eq!(statuses["hit"], 999);
}

#[tokio::test(start_paused = true)]
async fn without_single_flight_every_concurrent_call_goes_upstream() {
    let up = Up::plain().slow(Duration::from_millis(500));
    let cache = CacheLayer::builder(MemoryStore::new())
        .single_flight(false)
        .build()
        .unwrap();
    let svc = stack(cache, &up);
    let calls = (0..10).map(|_| {
        let svc = svc.clone();
        async move { read(send(&svc, openai(&openai_body(false))).await.unwrap()).await }
    });
    join_all(calls).await;
    assert_eq!(up.calls(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_leader_hands_over_to_a_waiter() {
    let up = Up::plain().slow(Duration::from_millis(500));
    let svc = stack(layer(), &up);
    let leader = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, openai(&openai_body(false))).await.map(|_| ()) }
    });
    settle().await;
    let waiters: Vec<_> = (0..5)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                read(send(&svc, openai(&openai_body(true))).await.unwrap()).await
            })
        })
        .collect();
    settle().await;
    assert_eq!(up.calls(), 1);
    tokio::time::advance(Duration::from_millis(100)).await;
    leader.abort();
    settle().await;
    // One waiter took over: a second call, and only one.
    assert_eq!(up.calls(), 2);
    let results = tokio::time::timeout(Duration::from_secs(10), join_all(waiters))
        .await
        .expect("nobody hangs");
    let statuses: Vec<_> = results.into_iter().map(|r| r.unwrap().0).collect();
    assert_eq!(statuses.iter().filter(|s| *s == "miss").count(), 1);
    assert_eq!(statuses.iter().filter(|s| *s == "hit").count(), 4);
    assert_eq!(up.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_drops_its_body_half_read_hands_over_too() {
    let up = Up::plain().slow(Duration::from_millis(50));
    let svc = stack(layer(), &up);
    let leader = send(&svc, openai(&openai_body(true)));
    let waiter = {
        let svc = svc.clone();
        tokio::spawn(
            async move { read(send(&svc, openai(&openai_body(true))).await.unwrap()).await },
        )
    };
    let resp = leader.await.unwrap();
    settle().await;
    drop(resp);
    let (status, _, body) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is not left hanging")
        .unwrap();
    assert_eq!(status, "miss", "the waiter led the second flight");
    assert!(!answer_text(&body).is_empty());
    assert_eq!(up.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_costs_nothing() {
    let up = Up::plain().slow(Duration::from_millis(500));
    let svc = stack(layer(), &up);
    let leader = tokio::spawn({
        let svc = svc.clone();
        async move { read(send(&svc, openai(&openai_body(false))).await.unwrap()).await }
    });
    settle().await;
    let waiter = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, openai(&openai_body(false))).await.map(|_| ()) }
    });
    settle().await;
    waiter.abort();
    let (status, ..) = leader.await.unwrap();
    assert_eq!(status, "miss");
    assert_eq!(up.calls(), 1);
    let (status, ..) = fetch(&svc, openai(&openai_body(false))).await;
    assert_eq!(status, "hit");
}

#[tokio::test(start_paused = true)]
async fn a_failure_is_not_shared_waiters_make_their_own_calls() {
    let up = Up::plain().slow(Duration::from_millis(500)).failing(1);
    let svc = stack(layer(), &up);
    let calls = (0..5).map(|_| {
        let svc = svc.clone();
        async move {
            match send(&svc, openai(&openai_body(false))).await {
                Ok(resp) => Ok(read(resp).await),
                Err(e) => Err(e),
            }
        }
    });
    let results = join_all(calls).await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    assert_eq!(
        failed, 1,
        "only the leader's call failed; nobody was handed its error"
    );
    // The leader, then each of the four waiters on its own.
    assert_eq!(up.calls(), 5);
    for r in results.into_iter().flatten() {
        assert_eq!(r.0, "miss");
    }
}

#[tokio::test(start_paused = true)]
async fn different_requests_do_not_wait_for_each_other() {
    let up = Up::plain().slow(Duration::from_millis(500));
    let svc = stack(layer(), &up);
    let calls = (0..3).map(|i| {
        let svc = svc.clone();
        let body =
            json!({"model": "m", "messages": [{"role": "user", "content": format!("q{i}")}]});
        async move { read(send(&svc, openai(&body)).await.unwrap()).await }
    });
    join_all(calls).await;
    assert_eq!(up.calls(), 3);
}

/// Under real threads: rounds of concurrent identical calls, some abandoned, on a
/// multi-threaded runtime; each round makes exactly one upstream call per leader that was not
/// abandoned before its answer, and no caller hangs.
#[test]
fn concurrent_callers_on_two_threads_share_one_call_per_round() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for round in 0..50 {
            let up = Up::plain().slow(Duration::from_millis(2));
            let svc = stack(layer(), &up);
            let body = json!({"model": "m", "messages": [{"role": "user", "content": format!("round {round}")}]});
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let svc = svc.clone();
                    let req = openai(&body);
                    tokio::spawn(async move { read(send(&svc, req).await.unwrap()).await })
                })
                .collect();
            let results = tokio::time::timeout(Duration::from_secs(30), join_all(tasks))
                .await
                .expect("no caller hangs");
            for r in results {
                assert!(!answer_text(&r.unwrap().2).is_empty());
            }
            // Callers that came after the answer was stored hit; those during the flight waited:
            // either way, one upstream call.
            assert_eq!(up.calls(), 1, "round {round}");
        }
    });
}
