//! The retry layer's behaviour, on paused tokio time against a scripted upstream.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{Ask, Mock, err, rate_limited, secs, server_error};
use http::HeaderName;
use seawall_core::{
    CallContext, Dispositions, FailureClass, GiveUp, LlmError, RateLimitSnapshot, RetryPolicy,
};
use seawall_retry::{BackoffRetryBuilder, BackoffRetryLayer, IDEMPOTENCY_KEY, Jitter, RetryBudget};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

/// The defaults with a fixed jitter seed.
fn builder() -> BackoffRetryBuilder {
    BackoffRetryLayer::builder().seed(7)
}

async fn call<S>(svc: &mut S, req: Ask) -> Result<&'static str, LlmError>
where
    S: Service<Ask, Response = &'static str, Error = LlmError>,
{
    ServiceExt::<Ask>::ready(svc).await?.call(req).await
}

#[tokio::test(start_paused = true)]
async fn five_rate_limits_back_off_exponentially_with_jitter_in_bounds() {
    for jitter in [
        Jitter::None,
        Jitter::Full,
        Jitter::Equal,
        Jitter::Decorrelated,
    ] {
        let mock = Mock::failing(rate_limited);
        let layer = builder()
            .base_delay(secs(1.0))
            .multiplier(2.0)
            .max_delay(secs(60.0))
            .jitter(jitter)
            .max_attempts(6)
            .max_retries(FailureClass::RateLimited, 5)
            .no_retry_budget()
            .build()
            .unwrap();
        let mut svc = layer.layer(mock.clone());
        let e = call(&mut svc, Ask::default()).await.unwrap_err();

        assert_eq!(mock.calls(), 6, "{jitter:?}");
        // The final error: the last 429, the five earlier attempts, and why it stopped.
        assert_eq!(e.class(), FailureClass::RateLimited);
        assert_eq!(e.give_up(), Some(GiveUp::AttemptsExhausted));
        let history = e.attempts();
        assert_eq!(history.len(), 5);
        let delays: Vec<Duration> = history.iter().map(|a| a.delay).collect();
        let mut previous = secs(1.0);
        for (n, delay) in delays.iter().copied().enumerate() {
            let ceiling = secs(f64::from(1u32 << n));
            let ok = match jitter {
                Jitter::None => delay == ceiling,
                Jitter::Full => delay <= ceiling,
                Jitter::Equal => delay >= ceiling / 2 && delay <= ceiling,
                _ => delay >= secs(1.0) && delay <= previous * 2,
            };
            assert!(
                ok,
                "{jitter:?}: delay {n} was {delay:?}, ceiling {ceiling:?}"
            );
            previous = delay;
        }
        if jitter == Jitter::None {
            assert_eq!(delays, [1.0, 2.0, 4.0, 8.0, 16.0].map(secs));
        } else {
            assert_ne!(
                delays,
                [1.0, 2.0, 4.0, 8.0, 16.0].map(secs),
                "{jitter:?} jitters"
            );
        }
        // What the upstream saw matches the history: each attempt came `delay` after the
        // previous one failed (the timer wheel wakes at most 1 ms late).
        for ((a, gap), delay) in history.iter().zip(mock.gaps()).zip(&delays) {
            assert_eq!(a.class, FailureClass::RateLimited);
            assert_eq!(a.status.map(|s| s.as_u16()), Some(429));
            assert!(gap >= *delay && gap - *delay <= Duration::from_millis(1));
        }
        assert!(e.to_string().contains("after 6 attempts"), "{e}");
    }
}

#[tokio::test(start_paused = true)]
async fn final_classes_make_exactly_one_call() {
    type Case = (&'static str, fn() -> LlmError);
    let cases: Vec<Case> = vec![
        ("401", || err(FailureClass::Authentication, 401)),
        ("insufficient_quota", || {
            err(FailureClass::QuotaExhausted, 429).with_code("insufficient_quota")
        }),
        ("400", || err(FailureClass::InvalidRequest, 400)),
        ("422", || err(FailureClass::InvalidRequest, 422)),
        ("403", || err(FailureClass::PermissionDenied, 403)),
        ("404", || err(FailureClass::NotFound, 404)),
        ("context", || err(FailureClass::ContextLengthExceeded, 400)),
        ("content", || err(FailureClass::ContentFiltered, 400)),
        ("stream", || {
            LlmError::new(FailureClass::StreamInterrupted, "")
        }),
        // Local rejections, even when something claims they should be retried.
        ("circuit", || {
            LlmError::new(FailureClass::CircuitOpen, "").with_should_retry(true)
        }),
        ("gate", || LlmError::new(FailureClass::GateRejected, "")),
        ("budget", || LlmError::new(FailureClass::BudgetExceeded, "")),
        ("deadline", || {
            LlmError::new(FailureClass::DeadlineExceeded, "")
        }),
    ];
    for (name, make) in cases {
        let mock = Mock::failing(make);
        let mut svc = builder().build().unwrap().layer(mock.clone());
        let start = Instant::now();
        let e = call(
            &mut svc,
            Ask {
                idempotent: true,
                ..Ask::default()
            },
        )
        .await
        .unwrap_err();
        assert_eq!(mock.calls(), 1, "{name}");
        assert_eq!(start.elapsed(), Duration::ZERO, "{name}");
        assert_eq!(e.give_up(), Some(GiveUp::NotRetryable), "{name}");
        assert!(e.attempts().is_empty(), "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn x_should_retry_wins_either_way() {
    // false on a 500: one call.
    let mock = Mock::failing(|| server_error().with_should_retry(false));
    let mut svc = builder().build().unwrap().layer(mock.clone());
    let e = call(&mut svc, Ask::default()).await.unwrap_err();
    assert_eq!(mock.calls(), 1);
    assert_eq!(e.give_up(), Some(GiveUp::NotRetryable));

    // true on a 400: retried, up to the class's cap (2 retries by default).
    let mock = Mock::failing(|| err(FailureClass::InvalidRequest, 400).with_should_retry(true));
    let mut svc = builder().build().unwrap().layer(mock.clone());
    let e = call(&mut svc, Ask::default()).await.unwrap_err();
    assert_eq!(mock.calls(), 3);
    assert_eq!(e.give_up(), Some(GiveUp::AttemptsExhausted));
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured_with_bounded_jitter() {
    for seed in 0..20 {
        let mock = Mock::new(|n| match n {
            0 => Err(rate_limited().with_retry_after(secs(3.0))),
            _ => Ok("ok"),
        });
        let mut svc = builder().seed(seed).build().unwrap().layer(mock.clone());
        assert_eq!(call(&mut svc, Ask::default()).await.unwrap(), "ok");
        let gap = mock.gaps()[0];
        // Never early, at most 10% late: not the computed backoff (under 0.5 s).
        assert!(gap >= secs(3.0) && gap <= secs(3.3), "seed {seed}: {gap:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn exhausted_rate_limit_window_reset_is_a_hint() {
    let mock = Mock::new(|n| match n {
        0 => {
            let mut snap = RateLimitSnapshot::default();
            snap.requests.remaining = Some(0);
            snap.requests.reset_after = Some(secs(4.0));
            Err(rate_limited().with_rate_limit(snap))
        }
        _ => Ok("ok"),
    });
    let mut svc = builder().build().unwrap().layer(mock.clone());
    call(&mut svc, Ask::default()).await.unwrap();
    let gap = mock.gaps()[0];
    assert!(gap >= secs(4.0) && gap <= secs(4.4), "{gap:?}");
}

#[tokio::test(start_paused = true)]
async fn retry_after_above_the_cap_fails_at_once() {
    let mock = Mock::failing(|| rate_limited().with_retry_after(secs(90.0)));
    let mut svc = builder()
        .max_server_hint(secs(60.0))
        .build()
        .unwrap()
        .layer(mock.clone());
    let start = Instant::now();
    let e = call(&mut svc, Ask::default()).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO, "no sleep");
    assert_eq!(mock.calls(), 1, "no early retry");
    assert_eq!(e.give_up(), Some(GiveUp::HintTooLong));
    assert_eq!(e.retry_after(), Some(secs(90.0)), "the hint is surfaced");
    assert_eq!(e.class(), FailureClass::RateLimited);
}

#[tokio::test(start_paused = true)]
async fn hint_longer_than_the_remaining_budget_fails_at_once() {
    // The hint alone is longer than the budget.
    let mock = Mock::failing(|| rate_limited().with_retry_after(secs(20.0)));
    let mut svc = builder()
        .time_budget(secs(10.0))
        .build()
        .unwrap()
        .layer(mock.clone());
    let start = Instant::now();
    let e = call(&mut svc, Ask::default()).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(mock.calls(), 1);
    assert_eq!(e.give_up(), Some(GiveUp::DeadlineTooClose));
    assert_eq!(e.retry_after(), Some(secs(20.0)));

    // The hint fits the budget but not what is left of it after a slow attempt.
    let mock = Mock::failing(|| rate_limited().with_retry_after(secs(3.0))).latency(secs(8.0));
    let mut svc = builder()
        .time_budget(secs(10.0))
        .build()
        .unwrap()
        .layer(mock.clone());
    let start = Instant::now();
    let e = call(&mut svc, Ask::default()).await.unwrap_err();
    assert_eq!(
        start.elapsed(),
        secs(8.0),
        "gave up when the attempt failed"
    );
    assert_eq!(mock.calls(), 1);
    assert_eq!(e.give_up(), Some(GiveUp::DeadlineTooClose));
}

#[tokio::test(start_paused = true)]
async fn overloads_wait_at_least_the_minimum() {
    let overloaded = || err(FailureClass::Overloaded, 529).with_error_type("overloaded_error");
    for seed in 0..10 {
        let mock = Mock::new(move |n| if n == 0 { Err(overloaded()) } else { Ok("ok") });
        let mut svc = builder().seed(seed).build().unwrap().layer(mock.clone());
        call(&mut svc, Ask::default()).await.unwrap();
        let gap = mock.gaps()[0];
        assert!(gap >= secs(5.0) && gap <= secs(5.5), "seed {seed}: {gap:?}");
    }
    // Without the minimum, the first backoff is at most 0.5 s: the minimum is what waited.
    let mock = Mock::new(move |n| if n == 0 { Err(overloaded()) } else { Ok("ok") });
    let mut svc = builder()
        .overload_min_delay(Duration::ZERO)
        .build()
        .unwrap()
        .layer(mock.clone());
    call(&mut svc, Ask::default()).await.unwrap();
    assert!(mock.gaps()[0] <= secs(0.5));
}

#[tokio::test(start_paused = true)]
async fn time_budget_cuts_the_attempt_in_flight() {
    // Attempts take 4 s and fail; waits 0.5 s then 1 s. Attempt 3 starts at 9.5 s and is
    // cancelled at exactly 10 s.
    let mock = Mock::failing(server_error).latency(secs(4.0));
    let mut svc = builder()
        .time_budget(secs(10.0))
        .jitter(Jitter::None)
        .max_attempts(10)
        .max_retries(FailureClass::ServerError, 10)
        .build()
        .unwrap()
        .layer(mock.clone());
    let start = Instant::now();
    let e = call(&mut svc, Ask::default()).await.unwrap_err();
    assert_eq!(start.elapsed(), secs(10.0));
    assert_eq!(mock.calls(), 3);
    assert_eq!(
        mock.dropped(),
        3,
        "the attempt in flight was cancelled, not left running"
    );
    assert_eq!(e.class(), FailureClass::DeadlineExceeded);
    assert_eq!(e.give_up(), Some(GiveUp::DeadlineTooClose));
    let history = e.attempts();
    assert_eq!(history.len(), 2);
    assert_eq!(history[0].elapsed, secs(4.0));
    assert_eq!(history[0].delay, secs(0.5));
    assert_eq!(history[1].delay, secs(1.0));
    assert!(
        e.message().contains("last error: server_error (HTTP 500)"),
        "{e}"
    );
    let last = e
        .source_ref()
        .and_then(|s| s.downcast_ref::<LlmError>())
        .unwrap();
    assert_eq!(last.class(), FailureClass::ServerError);
    assert!(e.to_string().contains("after 3 attempts"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn time_budget_bounds_a_single_slow_attempt() {
    let mock = Mock::new(|_| Ok("late")).latency(secs(500.0));
    let mut svc = builder().build().unwrap().layer(mock.clone());
    let start = Instant::now();
    let e = call(&mut svc, Ask::default()).await.unwrap_err();
    assert_eq!(start.elapsed(), secs(120.0), "the default budget");
    assert_eq!(e.class(), FailureClass::DeadlineExceeded);
    assert!(e.attempts().is_empty());
    assert!(!e.message().contains("last error"));
    // Without a budget the attempt runs to its end.
    let mut svc = builder()
        .no_time_budget()
        .build()
        .unwrap()
        .layer(mock.clone());
    assert_eq!(call(&mut svc, Ask::default()).await.unwrap(), "late");
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_does_not_fit_the_budget_is_not_started() {
    // Attempts take 4 s; the second wait (2 s) does not fit in the last 1 s.
    let mock = Mock::failing(server_error).latency(secs(4.0));
    let mut svc = builder()
        .time_budget(secs(10.0))
        .base_delay(secs(1.0))
        .jitter(Jitter::None)
        .build()
        .unwrap()
        .layer(mock.clone());
    let start = Instant::now();
    let e = call(&mut svc, Ask::default()).await.unwrap_err();
    assert_eq!(start.elapsed(), secs(9.0));
    assert_eq!(mock.calls(), 2);
    assert_eq!(
        e.class(),
        FailureClass::ServerError,
        "the upstream's class is kept"
    );
    assert_eq!(e.give_up(), Some(GiveUp::DeadlineTooClose));
}

#[tokio::test(start_paused = true)]
async fn per_class_caps_and_idempotency() {
    let cases: Vec<(FailureClass, u16, bool, usize)> = vec![
        (FailureClass::ServerError, 500, false, 3),
        (FailureClass::RateLimited, 429, false, 3),
        (FailureClass::Overloaded, 503, false, 4),
        (FailureClass::UpstreamTimeout, 504, false, 1),
        (FailureClass::UpstreamTimeout, 504, true, 2),
        (FailureClass::Disconnected, 502, false, 1),
        (FailureClass::Connect, 502, false, 4),
    ];
    for (class, status, idempotent, calls) in cases {
        let mock = Mock::failing(move || err(class, status));
        let mut svc = builder()
            .max_attempts(10)
            .build()
            .unwrap()
            .layer(mock.clone());
        let e = call(
            &mut svc,
            Ask {
                idempotent,
                ..Ask::default()
            },
        )
        .await
        .unwrap_err();
        assert_eq!(mock.calls(), calls, "{class} idempotent={idempotent}");
        let reason = if calls == 1 {
            GiveUp::NotRetryable
        } else {
            GiveUp::AttemptsExhausted
        };
        assert_eq!(e.give_up(), Some(reason), "{class}");
    }

    // Caps count per class: two 500s and two 429s are within both caps.
    let mock = Mock::new(|n| match n {
        0 | 1 => Err(server_error()),
        2 | 3 => Err(rate_limited()),
        _ => Ok("ok"),
    });
    let mut svc = builder()
        .max_attempts(10)
        .build()
        .unwrap()
        .layer(mock.clone());
    assert_eq!(call(&mut svc, Ask::default()).await.unwrap(), "ok");
    assert_eq!(mock.calls(), 5);

    // Dispositions can be overridden: 409 made final.
    let mut table = Dispositions::default();
    table.update(FailureClass::Conflict, |d| d.retry = RetryPolicy::Never);
    let mock = Mock::failing(|| err(FailureClass::Conflict, 409));
    let mut svc = builder()
        .dispositions(table)
        .build()
        .unwrap()
        .layer(mock.clone());
    call(&mut svc, Ask::default()).await.unwrap_err();
    assert_eq!(mock.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn max_attempts_counts_the_first_call() {
    for (max, calls) in [(1, 1), (2, 2), (3, 3)] {
        let mock = Mock::failing(server_error);
        let mut svc = builder()
            .max_attempts(max)
            .max_retries(FailureClass::ServerError, 10)
            .build()
            .unwrap()
            .layer(mock.clone());
        let e = call(&mut svc, Ask::default()).await.unwrap_err();
        assert_eq!(mock.calls(), calls, "max_attempts {max}");
        assert_eq!(e.give_up(), Some(GiveUp::AttemptsExhausted));
    }
}

#[tokio::test(start_paused = true)]
async fn handle_switches_every_clone_at_once() {
    let layer = builder().build().unwrap();
    let handle = layer.handle();
    let mock = Mock::failing(server_error);
    let mut a = layer.layer(mock.clone());
    let mut b = a.clone();
    let mut c = layer.layer(mock.clone());

    handle.set_enabled(false);
    for svc in [&mut a, &mut b, &mut c] {
        let before = mock.calls();
        let e = call(svc, Ask::default()).await.unwrap_err();
        assert_eq!(mock.calls() - before, 1);
        assert_eq!(e.give_up(), Some(GiveUp::Disabled));
    }
    // A final error stays "not retryable" while disabled.
    let auth = Mock::failing(|| err(FailureClass::Authentication, 401));
    let e = call(&mut layer.layer(auth), Ask::default())
        .await
        .unwrap_err();
    assert_eq!(e.give_up(), Some(GiveUp::NotRetryable));

    handle.set_enabled(true);
    handle.set_max_attempts(2).unwrap();
    for svc in [&mut a, &mut b, &mut c] {
        let before = mock.calls();
        call(svc, Ask::default()).await.unwrap_err();
        assert_eq!(mock.calls() - before, 2);
    }
    assert_eq!(a.handle().retries(), 3);
    assert!(handle.set_max_attempts(0).is_err());
    assert_eq!(handle.max_attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn empty_retry_budget_returns_the_original_error_and_counts() {
    let layer = builder()
        .retry_budget(RetryBudget::new(0.0, 0, secs(1.0)).unwrap())
        .build()
        .unwrap();
    let mock = Mock::failing(server_error);
    let mut svc = layer.layer(mock.clone());
    let e = call(&mut svc, Ask::default()).await.unwrap_err();
    assert_eq!(mock.calls(), 1);
    assert_eq!(e.class(), FailureClass::ServerError);
    assert_eq!(e.give_up(), Some(GiveUp::RetryBudget));
    assert_eq!(layer.handle().budget_exhausted(), 1);
    assert_eq!(layer.retry_budget().unwrap().exhausted(), 1);
}

/// Many concurrent failing calls through clones of one layer: retries never exceed
/// `ratio * calls + floor`, and every refusal is counted.
#[tokio::test(start_paused = true)]
async fn retry_budget_holds_under_many_concurrent_calls() {
    const CALLS: usize = 500;
    let layer = builder()
        .retry_budget(
            RetryBudget::new(0.2, 5, secs(3600.0))
                .unwrap()
                .max_saved(10_000),
        )
        .base_delay(secs(0.01))
        .build()
        .unwrap();
    let mock = Mock::failing(server_error);
    let svc = layer.layer(mock.clone());
    let mut futures = Vec::new();
    for _ in 0..CALLS {
        let mut s = svc.clone();
        futures.push(
            ServiceExt::<Ask>::ready(&mut s)
                .await
                .unwrap()
                .call(Ask::default()),
        );
    }
    let results = futures_util::future::join_all(futures).await;
    let retries = mock.calls() - CALLS;
    assert_eq!(retries, CALLS / 5 + 5, "exactly ratio * calls + floor");
    let refused = results
        .iter()
        .filter(|r| r.as_ref().unwrap_err().give_up() == Some(GiveUp::RetryBudget))
        .count();
    assert!(refused > 0);
    assert_eq!(layer.handle().budget_exhausted(), refused as u64);
    assert_eq!(layer.handle().retries(), retries as u64);
}

/// The same on a multi-threaded runtime, calls racing on real threads.
#[test]
fn retry_budget_holds_across_threads() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .unwrap();
    let layer = builder()
        .retry_budget(
            RetryBudget::new(0.1, 3, secs(365.0 * 86_400.0))
                .unwrap()
                .max_saved(u32::MAX),
        )
        .base_delay(Duration::ZERO)
        .max_delay(Duration::ZERO)
        .overload_min_delay(Duration::ZERO)
        .build()
        .unwrap();
    let mock = Mock::failing(server_error);
    let svc = layer.layer(mock.clone());
    let tasks = 8;
    let per_task = 250;
    rt.block_on(async {
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let mut s = svc.clone();
                tokio::spawn(async move {
                    for _ in 0..per_task {
                        let _ = call(&mut s, Ask::default()).await;
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
    });
    let calls = tasks * per_task;
    let retries = mock.calls() - calls;
    assert!(
        retries <= calls / 10 + 3,
        "{retries} retries for {calls} calls"
    );
    assert!(layer.handle().budget_exhausted() > 0);
}

fn http_request() -> http::Request<Bytes> {
    http::Request::post("https://api.openai.com/v1/chat/completions")
        .body(Bytes::from_static(
            br#"{"model":"gpt-4o-mini","messages":[]}"#,
        ))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn idempotency_key_is_identical_across_attempts() {
    let attempt = HeaderName::from_static("x-attempt");
    let layer = builder()
        .idempotency_key(IDEMPOTENCY_KEY)
        .attempt_header(attempt.clone())
        .build()
        .unwrap();
    let mock = Mock::new(|n| {
        if n % 3 == 2 {
            Ok("ok")
        } else {
            Err(server_error())
        }
    });
    let mut svc = layer.layer(mock.clone());
    ServiceExt::<http::Request<Bytes>>::ready(&mut svc)
        .await
        .unwrap()
        .call(http_request())
        .await
        .unwrap();
    ServiceExt::<http::Request<Bytes>>::ready(&mut svc)
        .await
        .unwrap()
        .call(http_request())
        .await
        .unwrap();
    let headers = mock.headers();
    assert_eq!(headers.len(), 6);
    let keys: Vec<_> = headers
        .iter()
        .map(|h| h[&IDEMPOTENCY_KEY].clone())
        .collect();
    assert!(keys[0] == keys[1] && keys[1] == keys[2], "{keys:?}");
    assert!(keys[3] == keys[4] && keys[4] == keys[5], "{keys:?}");
    assert_ne!(keys[0], keys[3], "one key per logical call");
    let numbers: Vec<_> = headers
        .iter()
        .map(|h| h[&attempt].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(numbers, ["1", "2", "3", "1", "2", "3"]);

    // A key the caller set is kept.
    let mut req = http_request();
    req.headers_mut()
        .insert(IDEMPOTENCY_KEY, "mine".parse().unwrap());
    ServiceExt::<http::Request<Bytes>>::ready(&mut svc)
        .await
        .unwrap()
        .call(req)
        .await
        .unwrap();
    assert!(
        mock.headers()[6..]
            .iter()
            .all(|h| h[&IDEMPOTENCY_KEY] == "mine")
    );
}

#[tokio::test(start_paused = true)]
async fn an_idempotency_key_makes_a_504_retryable() {
    let timeout = || err(FailureClass::UpstreamTimeout, 504);
    let mock = Mock::failing(timeout);
    let mut plain = builder().build().unwrap().layer(mock.clone());
    ServiceExt::<http::Request<Bytes>>::ready(&mut plain)
        .await
        .unwrap()
        .call(http_request())
        .await
        .unwrap_err();
    assert_eq!(mock.calls(), 1);

    let mock = Mock::failing(timeout);
    let mut keyed = builder()
        .idempotency_key(IDEMPOTENCY_KEY)
        .build()
        .unwrap()
        .layer(mock.clone());
    ServiceExt::<http::Request<Bytes>>::ready(&mut keyed)
        .await
        .unwrap()
        .call(http_request())
        .await
        .unwrap_err();
    assert_eq!(mock.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn attempt_history_records_class_status_elapsed_and_delay() {
    let mock = Mock::new(|n| match n {
        0 => Err(rate_limited().with_retry_after(secs(2.0))),
        1 => Err(err(FailureClass::Overloaded, 503)),
        _ => Err(err(FailureClass::Authentication, 401)),
    })
    .latency(secs(1.0));
    let mut svc = builder()
        .hint_jitter(0.0)
        .build()
        .unwrap()
        .layer(mock.clone());
    let e = call(&mut svc, Ask::default()).await.unwrap_err();
    assert_eq!(e.class(), FailureClass::Authentication);
    assert_eq!(e.give_up(), Some(GiveUp::NotRetryable));
    let h = e.attempts();
    assert_eq!(h.len(), 2);
    assert_eq!(
        (
            h[0].class,
            h[0].status.unwrap().as_u16(),
            h[0].elapsed,
            h[0].delay
        ),
        (FailureClass::RateLimited, 429, secs(1.0), secs(2.0))
    );
    assert_eq!(
        (
            h[1].class,
            h[1].status.unwrap().as_u16(),
            h[1].elapsed,
            h[1].delay
        ),
        (FailureClass::Overloaded, 503, secs(1.0), secs(5.0))
    );
}

#[tokio::test(start_paused = true)]
async fn the_observer_context_counts_attempts() {
    let cx = Arc::new(CallContext::new());
    let mock = Mock::new(|n| if n < 2 { Err(server_error()) } else { Ok("ok") });
    let mut svc = builder().build().unwrap().layer(mock);
    let req = Ask {
        context: Some(cx.clone()),
        ..Ask::default()
    };
    call(&mut svc, req).await.unwrap();
    assert_eq!(cx.snapshot().attempts, 3);
    // A fallback outside the retry layer sends the same logical call through it again:
    // those attempts add up instead of restarting the count.
    let req = Ask {
        context: Some(cx.clone()),
        ..Ask::default()
    };
    call(&mut svc, req).await.unwrap();
    assert_eq!(cx.snapshot().attempts, 4);
}

#[tokio::test(start_paused = true)]
async fn an_answer_passes_through_untouched() {
    let layer = builder().build().unwrap();
    let mock = Mock::new(|_| Ok("first"));
    let mut svc = layer.layer(mock.clone());
    assert_eq!(call(&mut svc, Ask::default()).await.unwrap(), "first");
    assert_eq!(mock.calls(), 1);
    assert_eq!(layer.handle().retries(), 0);
}

#[tokio::test(start_paused = true)]
async fn readiness_errors_are_converted_and_returned() {
    let inner = tower::service_fn(|_: Ask| async { Ok::<_, seawall_core::BoxError>("never") });
    let mut svc = builder().build().unwrap().layer(BrokenReady(inner));
    let Err(e) = ServiceExt::<Ask>::ready(&mut svc).await else {
        panic!("readiness should fail");
    };
    assert_eq!(e.class(), FailureClass::Disconnected);
    assert!(e.message().contains("worker gone"));
}

#[derive(Clone)]
struct BrokenReady<S>(S);

impl<S: Service<Ask, Error = seawall_core::BoxError>> Service<Ask> for BrokenReady<S> {
    type Response = S::Response;
    type Error = seawall_core::BoxError;
    type Future = S::Future;
    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Err("worker gone".into()))
    }
    fn call(&mut self, req: Ask) -> S::Future {
        self.0.call(req)
    }
}

#[test]
fn bad_configuration_is_a_clear_error() {
    let cases: Vec<(BackoffRetryBuilder, &str, &str)> = vec![
        (builder().max_attempts(0), "max_attempts", "at least 1"),
        (builder().multiplier(f64::NAN), "multiplier", "finite"),
        (builder().multiplier(0.5), "multiplier", ">= 1"),
        (
            builder().base_delay(secs(10.0)),
            "max_delay",
            "shorter than the base",
        ),
        (builder().hint_jitter(1.5), "hint_jitter", "[0, 1]"),
        (builder().hint_jitter(f64::NAN), "hint_jitter", "[0, 1]"),
        (builder().time_budget(Duration::ZERO), "time_budget", "zero"),
        (
            builder().max_retries(FailureClass::ServerError, 300),
            "max_retries",
            "at most 255",
        ),
    ];
    for (b, field, needle) in cases {
        let e = b.build().unwrap_err();
        assert_eq!(e.field(), field, "{e}");
        assert!(e.to_string().contains(needle), "{e}");
    }
}

#[test]
fn debug_output_is_readable() {
    let layer = BackoffRetryLayer::new();
    let s = format!("{layer:?}");
    assert!(
        s.contains("max_attempts: 4") && s.contains("RetryBudget"),
        "{s}"
    );
    let svc = layer.layer(Mock::new(|_| Ok("x")).latency(Duration::ZERO));
    assert!(format!("{:?}", svc.handle()).contains("enabled: true"));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_call_cancels_the_attempt_in_flight() {
    let mock = Mock::new(|_| Ok("late")).latency(secs(10.0));
    let mut svc = builder().build().unwrap().layer(mock.clone());
    let fut = ServiceExt::<Ask>::ready(&mut svc)
        .await
        .unwrap()
        .call(Ask::default());
    assert!(tokio::time::timeout(secs(1.0), fut).await.is_err());
    assert_eq!(
        mock.dropped(),
        1,
        "the upstream future was dropped with the call"
    );

    // Dropped while waiting to retry: no new attempt is ever made.
    let mock = Mock::failing(server_error);
    let mut svc = builder()
        .jitter(Jitter::None)
        .build()
        .unwrap()
        .layer(mock.clone());
    let fut = ServiceExt::<Ask>::ready(&mut svc)
        .await
        .unwrap()
        .call(Ask::default());
    assert!(tokio::time::timeout(secs(0.25), fut).await.is_err());
    tokio::time::sleep(secs(30.0)).await;
    assert_eq!(mock.calls(), 1);
}

/// What an upstream saw of one HTTP attempt.
#[derive(Debug, PartialEq)]
struct Seen {
    method: http::Method,
    uri: http::Uri,
    body: Bytes,
    headers: Vec<(String, String)>,
    mine: Option<u32>,
    model: Option<String>,
    context: bool,
}

#[tokio::test(start_paused = true)]
async fn a_retry_sends_the_http_request_exactly_as_the_first_attempt() {
    use seawall_core::LlmRequest;
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Mine(u32);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let upstream = tower::service_fn(move |req: http::Request<Bytes>| {
        let mut log = log.lock().unwrap();
        log.push(Seen {
            method: req.method().clone(),
            uri: req.uri().clone(),
            body: req.body().clone(),
            headers: req
                .headers()
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
                .collect(),
            mine: req.extensions().get::<Mine>().map(|m| m.0),
            model: req.model().map(str::to_owned),
            context: req.call_context().is_some(),
        });
        let answer = if log.len() < 3 {
            Err(server_error())
        } else {
            Ok("ok")
        };
        std::future::ready(answer)
    });
    let mut svc = builder().build().unwrap().layer(upstream);
    // Few headers and only seawall's extensions (kept in parts), then many headers and one of
    // the caller's own (kept whole): every attempt of a call is the same request.
    let mut few = http_request();
    few.headers_mut().append("x-two", "a".parse().unwrap());
    few.headers_mut().append("x-two", "b".parse().unwrap());
    few.extensions_mut().insert(Arc::new(CallContext::new()));
    let mut many = http_request();
    for i in 0..6 {
        many.headers_mut()
            .append("x-many", i.to_string().parse().unwrap());
    }
    many.extensions_mut().insert(Mine(7));
    for req in [few, many] {
        seen.lock().unwrap().clear();
        ServiceExt::<http::Request<Bytes>>::ready(&mut svc)
            .await
            .unwrap()
            .call(req)
            .await
            .unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[0].model.as_deref(), Some("gpt-4o-mini"));
        assert!(seen[1..].iter().all(|s| *s == seen[0]), "{seen:#?}");
    }
}

/// An upstream that names each copy of itself, and tells which copy took each call.
#[derive(Debug)]
struct Copies {
    id: usize,
    next: Arc<std::sync::atomic::AtomicUsize>,
}

impl Clone for Copies {
    fn clone(&self) -> Self {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Copies {
            id,
            next: self.next.clone(),
        }
    }
}

impl Service<Ask> for Copies {
    type Response = usize;
    type Error = LlmError;
    type Future = std::future::Ready<Result<usize, LlmError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), LlmError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Ask) -> Self::Future {
        std::future::ready(Ok(self.id))
    }
}

#[tokio::test(start_paused = true)]
async fn the_service_that_made_a_call_makes_the_next_one() {
    // What the inner service remembers from a call (a breaker its last key, say) serves the
    // next call: the retry layer keeps it and sends a copy with the future for retries.
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(1));
    let mut svc = builder().build().unwrap().layer(Copies { id: 0, next });
    for _ in 0..3 {
        let served = ServiceExt::<Ask>::ready(&mut svc)
            .await
            .unwrap()
            .call(Ask::new("gpt-4o", 10, 10))
            .await
            .unwrap();
        assert_eq!(served, 0);
    }
}

#[tokio::test(start_paused = true)]
async fn calls_that_are_not_retried_clone_nothing_and_retries_clone_one_spare() {
    // Cloning a stack for every call, in case it is retried, writes and releases a reference
    // count per layer below: the service keeps one spare clone instead, made when the layer
    // wraps it, and shared by the service's clones.
    let mock = Mock::new(|n| match n {
        5 | 6 => Err(server_error()),
        _ => Ok("ok"),
    });
    let (counted, clones) = seawall_test_support::count_clones(mock.clone());
    let count = || clones.count();
    let mut svc = builder()
        .base_delay(secs(0.01))
        .build()
        .unwrap()
        .layer(counted);
    assert_eq!(count(), 1, "the spare, made as the layer wraps the service");
    type Svc = seawall_retry::BackoffRetry<seawall_test_support::CountClones<Mock>>;
    let call = async |svc: &mut Svc| {
        ServiceExt::<Ask>::ready(svc)
            .await
            .unwrap()
            .call(Ask::new("gpt-4o", 10, 10))
            .await
    };
    for _ in 0..5 {
        assert_eq!(call(&mut svc).await.unwrap(), "ok");
    }
    assert_eq!(count(), 1, "no clone for calls that are not retried");
    // The sixth call fails twice: its retries go through one clone of the spare.
    assert_eq!(call(&mut svc).await.unwrap(), "ok");
    assert_eq!(mock.calls(), 8);
    assert_eq!(count(), 2);
    // A service changed through `get_mut` gets a new spare, made from it at the next call.
    let _ = svc.get_mut();
    assert_eq!(call(&mut svc).await.unwrap(), "ok");
    assert_eq!(count(), 3);
    // A clone of the service, whether kept by a layer above or made for each request before
    // it is polled (as axum does), shares the spare: it copies the inner service only.
    let mut kept = svc.clone();
    assert_eq!(count(), 4);
    for _ in 0..3 {
        assert_eq!(call(&mut kept).await.unwrap(), "ok");
        assert_eq!(call(&mut svc.clone()).await.unwrap(), "ok");
    }
    assert_eq!(
        count(),
        7,
        "one copy of the inner service per clone, no spare"
    );
}
