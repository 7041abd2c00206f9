//! Behaviour of the cost budget layer, on paused tokio time.
#![allow(
    clippy::float_cmp,
    reason = "costs and durations are compared with exact expected values"
)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::*;
use http_body::Frame;
use http_body_util::BodyExt;
use seawall_budget::*;
use seawall_core::{CallContext, FailureClass, LlmError, LlmRequest, PartEstimate, ServiceTier};
use tower::Layer;
use tower::{Service, ServiceBuilder, ServiceExt};

/// The estimate of a gpt-4o `Ask(1000 in, 100 out)`: 1000 × 2.5 + 100 × 10 = 3500 $/M.
const EST: u64 = 3_500_000;

fn utc(s: &str) -> SystemTime {
    let t = Timestamp::parse_rfc3339(s).unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_nanos(t.as_unix_nanos())
}

async fn call<S, R>(svc: &mut S, req: R) -> Result<S::Response, LlmError>
where
    S: Service<R, Error = LlmError>,
{
    svc.ready().await?.call(req).await
}

/// A transport that answers every request with `f(request)`, counting calls.
fn transport<F>(
    calls: Arc<AtomicUsize>,
    f: F,
) -> impl Service<Ask, Response = Resp, Error = LlmError, Future: Send> + Clone
where
    F: Fn(&Ask) -> Result<Resp, LlmError> + Clone + Send + Sync + 'static,
{
    tower::service_fn(move |req: Ask| {
        calls.fetch_add(1, Ordering::SeqCst);
        let out = f(&req);
        async move { out }
    })
}

#[tokio::test(start_paused = true)]
async fn estimate_and_settle_per_model() {
    let sink = Arc::new(MemorySink::new());
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("all", Usd::from_dollars(10)))
        .budget(Budget::daily("per-model", Usd::from_dollars(1)).per_model())
        .sink(sink.clone())
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut svc = layer.layer(transport(calls.clone(), |req| {
        Ok(match req.model.as_deref() {
            Some("gpt-4o") => done(usage(900, 80, 400)),
            _ => done(usage(2_000, 300, 1_500)),
        })
    }));
    call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap();
    call(&mut svc, Ask::new("claude-haiku-4-5-20251001", 2_000, 500))
        .await
        .unwrap();

    // 500 × 2.5 + 400 × 1.25 + 80 × 10 = 2550 $/M; 500 × 1 + 1500 × 0.1 + 300 × 5 = 2150 $/M.
    let records = sink.records();
    let costs: Vec<_> = records.iter().map(|r| r.cost_nanos).collect();
    assert_eq!(costs, [2_550_000, 2_150_000]);
    let reserved: Vec<_> = records.iter().map(|r| r.reserved_nanos).collect();
    assert_eq!(reserved, [EST, 2_000 * 1_000 + 500 * 5_000]);
    assert!(records.iter().all(|r| r.charged == Charged::Usage));
    assert_eq!(
        records[1].model.as_deref(),
        Some("claude-haiku-4-5-20251001")
    );
    assert_eq!(
        records[1].keys,
        [(Arc::from("model"), Arc::from("claude-haiku-4-5-20251001"))]
    );
    assert_eq!(records[0].input_tokens, Some(900));
    assert_eq!(records[0].cached_input_tokens, Some(400));
    assert_eq!(records[0].cost_usd, 0.00255);

    let all = layer.spend("all", None).unwrap();
    assert_eq!(all.spent, Usd::from_nanos(4_700_000));
    assert_eq!(all.reserved, Usd::ZERO);
    assert_eq!(
        layer.spend("per-model", Some("gpt-4o")).unwrap().spent,
        Usd::from_nanos(2_550_000)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_prompt_past_the_long_context_threshold_is_reserved_and_charged_at_the_long_prices() {
    // $1.25 / $10, and $2.50 / $15 above 200,000 input tokens (Gemini 2.5 Pro's prices).
    let price = Price::per_million(Usd::from_cents(125), Usd::from_dollars(10)).with_long_context(
        200_000,
        Price::per_million(Usd::from_cents(250), Usd::from_dollars(15)),
    );
    let sink = Arc::new(MemorySink::new());
    let layer = CostBudgetLayer::builder(PriceTable::new().with("gemini-2.5-pro", price))
        .budget(Budget::total("all", Usd::from_dollars(10)))
        .sink(sink.clone())
        .build()
        .unwrap();
    // The upstream reports 250,000 input tokens whatever was estimated.
    let mut svc = layer.layer(transport(Arc::default(), |_| {
        Ok(done(usage(250_000, 1_000, 0)))
    }));
    // Estimated above the threshold, and (an under-estimate) below it.
    for estimated in [300_000, 100_000] {
        call(&mut svc, Ask::new("gemini-2.5-pro", estimated, 1_000))
            .await
            .unwrap();
    }
    let records = sink.records();
    let reserved: Vec<_> = records.iter().map(|r| r.reserved_nanos).collect();
    // 300,000 × 2.5 + 1,000 × 15 = $0.765; 100,000 × 1.25 + 1,000 × 10 = $0.135.
    assert_eq!(reserved, [765_000_000, 135_000_000]);
    // Both charged what was billed: 250,000 × 2.5 + 1,000 × 15 = $0.64.
    let costs: Vec<_> = records.iter().map(|r| r.cost_nanos).collect();
    assert_eq!(costs, [640_000_000, 640_000_000]);
    let all = layer.spend("all", None).unwrap();
    assert_eq!(all.spent, Usd::from_nanos(1_280_000_000));
}

#[tokio::test(start_paused = true)]
async fn refuses_at_the_limit_and_admits_up_to_it_exactly() {
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("all", Usd::from_nanos(2 * EST)))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let feeds = Arc::new(Mutex::new(Vec::new()));
    let f = feeds.clone();
    let mut svc = layer.layer(transport(calls.clone(), move |_| {
        let (resp, tx, report) = stream();
        f.lock().unwrap().push((tx, report));
        Ok(resp)
    }));
    // Two attempts in flight hold the whole budget until their bodies end.
    let a = call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap();
    let b = call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap();
    let s = layer.spend("all", None).unwrap();
    assert_eq!((s.spent, s.reserved), (Usd::ZERO, Usd::from_nanos(2 * EST)));

    let err = call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::BudgetExceeded);
    assert_eq!(err.code(), Some("budget_exceeded"));
    assert!(err.message().contains("\"all\""), "{err}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "a refused attempt never goes out"
    );

    // The first ends having used nothing: its whole reservation comes back, and an attempt
    // that needs exactly what is left is admitted.
    let (tx, report) = feeds.lock().unwrap().remove(0);
    report.set_usage(usage(0, 0, 0));
    tx.send(Ok(Frame::data(Bytes::from_static(b"x")))).unwrap();
    drop(tx);
    a.into_body().collect().await.unwrap();
    let s = layer.spend("all", None).unwrap();
    assert_eq!((s.spent, s.reserved), (Usd::ZERO, Usd::from_nanos(EST)));
    let c = call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap();
    assert_eq!(layer.spend("all", None).unwrap().remaining(), Usd::ZERO);
    drop((b, c));
}

#[tokio::test(start_paused = true)]
async fn streaming_usage_from_the_final_chunk_settles_at_the_end() {
    let sink = Arc::new(MemorySink::new());
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("all", Usd::from_dollars(1)))
        .sink(sink.clone())
        .build()
        .unwrap();
    let feed = Arc::new(Mutex::new(None));
    let f = feed.clone();
    let mut svc = layer.layer(transport(Arc::default(), move |_| {
        let (resp, tx, report) = stream();
        *f.lock().unwrap() = Some((tx, report));
        Ok(resp)
    }));
    let resp = call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap();
    let (tx, report) = feed.lock().unwrap().take().unwrap();
    let mut body = resp.into_body();

    tx.send(Ok(Frame::data(Bytes::from_static(
        b"data: {\"delta\":\"hi\"}\n\n",
    ))))
    .unwrap();
    body.frame().await.unwrap().unwrap();
    tokio::time::advance(Duration::from_secs(2)).await;
    // Mid-stream the reservation is still held and nothing is spent.
    let s = layer.spend("all", None).unwrap();
    assert_eq!((s.spent, s.reserved), (Usd::ZERO, Usd::from_nanos(EST)));
    assert!(sink.records().is_empty());

    // The final chunk carries the usage (the classifying body writes it to the report), then
    // the stream ends.
    report.set_usage(usage(1_000, 40, 0));
    tx.send(Ok(Frame::data(Bytes::from_static(b"data: [DONE]\n\n"))))
        .unwrap();
    drop(tx);
    body.frame().await.unwrap().unwrap();
    assert!(body.frame().await.is_none());

    let s = layer.spend("all", None).unwrap();
    // 1000 × 2.5 + 40 × 10 = 2900 $/M
    assert_eq!(
        (s.spent, s.reserved),
        (Usd::from_nanos(2_900_000), Usd::ZERO)
    );
    let r = &sink.records()[0];
    assert_eq!((r.outcome, r.charged), (AttemptOutcome::Ok, Charged::Usage));
    assert_eq!(r.output_tokens, Some(40));
    assert_eq!(r.seconds, 2.0);
}

#[tokio::test(start_paused = true)]
async fn a_completed_response_without_usage_is_charged_its_estimate() {
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("all", Usd::from_dollars(1)))
        .build()
        .unwrap();
    let mut svc = layer.layer(transport(Arc::default(), |_| Ok(done_without_usage())));
    call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap();
    assert_eq!(
        layer.spend("all", None).unwrap().spent,
        Usd::from_nanos(EST)
    );
}

#[derive(Clone, Copy, Debug)]
enum Ending {
    Err(FailureClass),
    BodyErr(FailureClass),
    DropFuture,
    DropBody,
}

/// Runs one attempt that ends as told; returns what it was charged and its record.
async fn charged_for(
    ending: Ending,
    tweak: fn(CostBudgetBuilder) -> CostBudgetBuilder,
) -> (Usd, SpendRecord) {
    let sink = Arc::new(MemorySink::new());
    let layer = tweak(
        CostBudgetLayer::builder(prices())
            .budget(Budget::total("all", Usd::from_dollars(1)))
            .sink(sink.clone()),
    )
    .build()
    .unwrap();
    let feed = Arc::new(Mutex::new(None));
    let f = feed.clone();
    let inner = tower::service_fn(move |_req: Ask| {
        let f = f.clone();
        async move {
            match ending {
                Ending::Err(class) => Err(LlmError::new(class, "upstream said no")),
                Ending::DropFuture => std::future::pending().await,
                Ending::BodyErr(_) | Ending::DropBody => {
                    let (resp, tx, _report) = stream();
                    *f.lock().unwrap() = Some(tx);
                    Ok(resp)
                }
            }
        }
    });
    let mut svc = layer.layer(inner);
    let fut = svc
        .ready()
        .await
        .unwrap()
        .call(Ask::new("gpt-4o", 1_000, 100));
    match ending {
        Ending::Err(class) => assert_eq!(fut.await.unwrap_err().class(), class),
        Ending::DropFuture => {
            let mut fut = Box::pin(fut);
            assert!(futures_util::poll!(&mut fut).is_pending());
            assert_eq!(
                layer.spend("all", None).unwrap().reserved,
                Usd::from_nanos(EST)
            );
            drop(fut);
        }
        Ending::BodyErr(class) => {
            let mut body = fut.await.unwrap().into_body();
            let tx = feed.lock().unwrap().take().unwrap();
            tx.send(Ok(Frame::data(Bytes::from_static(b"partial"))))
                .unwrap();
            tx.send(Err(LlmError::new(class, "cut"))).unwrap();
            body.frame().await.unwrap().unwrap();
            assert!(body.frame().await.unwrap().is_err());
        }
        Ending::DropBody => {
            let mut body = fut.await.unwrap().into_body();
            let tx = feed.lock().unwrap().take().unwrap();
            tx.send(Ok(Frame::data(Bytes::from_static(b"partial"))))
                .unwrap();
            body.frame().await.unwrap().unwrap();
            drop(body);
        }
    }
    let s = layer.spend("all", None).unwrap();
    assert_eq!(s.reserved, Usd::ZERO, "{ending:?} left a reservation");
    let records = sink.take();
    assert_eq!(records.len(), 1, "{ending:?}");
    (s.spent, records.into_iter().next().unwrap())
}

#[tokio::test(start_paused = true)]
async fn failed_attempts_release_unless_they_may_have_been_billed() {
    use FailureClass::*;
    let est = Usd::from_nanos(EST);
    let keep = |b: CostBudgetBuilder| b;
    for (ending, expected, outcome) in [
        (
            Ending::Err(Connect),
            Usd::ZERO,
            AttemptOutcome::Failed(Connect),
        ),
        (
            Ending::Err(Overloaded),
            Usd::ZERO,
            AttemptOutcome::Failed(Overloaded),
        ),
        (
            Ending::Err(RateLimited),
            Usd::ZERO,
            AttemptOutcome::Failed(RateLimited),
        ),
        (
            Ending::Err(InvalidRequest),
            Usd::ZERO,
            AttemptOutcome::Failed(InvalidRequest),
        ),
        (
            Ending::Err(CircuitOpen),
            Usd::ZERO,
            AttemptOutcome::Failed(CircuitOpen),
        ),
        (Ending::Err(Timeout), est, AttemptOutcome::Failed(Timeout)),
        (
            Ending::Err(UpstreamTimeout),
            est,
            AttemptOutcome::Failed(UpstreamTimeout),
        ),
        (
            Ending::Err(Disconnected),
            est,
            AttemptOutcome::Failed(Disconnected),
        ),
        (
            Ending::BodyErr(StreamInterrupted),
            est,
            AttemptOutcome::Failed(StreamInterrupted),
        ),
        (
            Ending::BodyErr(Overloaded),
            Usd::ZERO,
            AttemptOutcome::Failed(Overloaded),
        ),
        (Ending::DropFuture, est, AttemptOutcome::Dropped),
        (Ending::DropBody, est, AttemptOutcome::Dropped),
    ] {
        let (spent, record) = charged_for(ending, keep).await;
        assert_eq!(spent, expected, "{ending:?}");
        assert_eq!(record.outcome, outcome, "{ending:?}");
        assert_eq!(record.cost_nanos, expected.as_nanos());
        let charged = if expected == Usd::ZERO {
            Charged::Nothing
        } else {
            Charged::Estimate
        };
        assert_eq!(record.charged, charged, "{ending:?}");
    }
    // Both choices are configurable.
    let release = |b: CostBudgetBuilder| {
        b.on_failure(Timeout, Settlement::Release)
            .on_drop(Settlement::Release)
    };
    assert_eq!(
        charged_for(Ending::Err(Timeout), release).await.0,
        Usd::ZERO
    );
    assert_eq!(charged_for(Ending::DropFuture, release).await.0, Usd::ZERO);
    let charge = |b: CostBudgetBuilder| b.on_failure(ServerError, Settlement::ChargeEstimate);
    assert_eq!(charged_for(Ending::Err(ServerError), charge).await.0, est);
}

#[tokio::test(start_paused = true)]
async fn calendar_and_rolling_windows_roll_over() {
    // Hourly, starting one minute before the top of the hour.
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::hourly("hourly", Usd::from_nanos(EST)))
        .wall_clock_origin(utc("2025-03-10T10:59:00Z"))
        .build()
        .unwrap();
    let mut svc = layer.layer(transport(Arc::default(), |_| Ok(done_without_usage())));
    call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap();
    let err = call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::BudgetExceeded);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(60)));
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(
        call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
            .await
            .is_err()
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap();

    // Monthly, across the end of January.
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::monthly("monthly", Usd::from_nanos(EST)))
        .wall_clock_origin(utc("2025-01-31T23:59:30Z"))
        .build()
        .unwrap();
    let mut svc = layer.layer(transport(Arc::default(), |_| Ok(done_without_usage())));
    call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap();
    let err = call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap_err();
    assert_eq!(err.retry_after(), Some(Duration::from_secs(30)));
    tokio::time::advance(Duration::from_secs(30)).await;
    call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap();

    // Rolling ten minutes (sub-windows of ten seconds): spend stays counted for the whole
    // window, then leaves it.
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::rolling(
            "ten-minutes",
            Usd::from_nanos(EST),
            Duration::from_secs(600),
        ))
        .wall_clock_origin(utc("2025-03-10T10:00:00Z"))
        .build()
        .unwrap();
    let mut svc = layer.layer(transport(Arc::default(), |_| Ok(done_without_usage())));
    call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(600)).await;
    let err = call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap_err();
    assert_eq!(err.retry_after(), None);
    tokio::time::advance(Duration::from_secs(10)).await;
    call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn keys_are_isolated_and_global_budgets_still_apply() {
    let sink = Arc::new(MemorySink::new());
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::daily("tenant-daily", Usd::from_nanos(2 * EST)).per_key("tenant"))
        .budget(Budget::total("all", Usd::from_nanos(5 * EST)))
        .keys(tenant_keys())
        .sink(sink.clone())
        .build()
        .unwrap();
    let mut svc = layer.layer(transport(Arc::default(), |_| Ok(done_without_usage())));
    let ask = |t: Option<&str>| {
        let a = Ask::new("gpt-4o", 1_000, 100);
        match t {
            Some(t) => a.tenant(t),
            None => a,
        }
    };
    for _ in 0..2 {
        call(&mut svc, ask(Some("acme"))).await.unwrap();
    }
    let err = call(&mut svc, ask(Some("acme"))).await.unwrap_err();
    assert!(
        err.message().contains("\"tenant-daily\" for \"acme\""),
        "{err}"
    );
    // Another tenant has its own counter.
    for _ in 0..2 {
        call(&mut svc, ask(Some("globex"))).await.unwrap();
    }
    // Requests without a tenant share one counter; the global budget stops the fifth.
    call(&mut svc, ask(None)).await.unwrap();
    let err = call(&mut svc, ask(None)).await.unwrap_err();
    assert!(err.message().contains("\"all\""), "{err}");
    assert_eq!(
        layer.spend("tenant-daily", Some("acme")).unwrap().spent,
        Usd::from_nanos(2 * EST)
    );
    assert_eq!(
        layer.spend("tenant-daily", None).unwrap().spent,
        Usd::from_nanos(EST)
    );
    assert_eq!(
        layer.spend("tenant-daily", Some("initech")).unwrap().spent,
        Usd::ZERO
    );
    let records = sink.records();
    assert_eq!(records[0].keys, [(Arc::from("tenant"), Arc::from("acme"))]);
    assert_eq!(records[5].keys, [(Arc::from("tenant"), Arc::from(UNKEYED))]);
    assert_eq!(records.len(), 7, "refusals are recorded too");
    assert_eq!(
        records[2].outcome,
        AttemptOutcome::Failed(FailureClass::BudgetExceeded)
    );
}

#[tokio::test(start_paused = true)]
async fn soft_threshold_fires_once_per_window() {
    let crossed = Arc::new(Mutex::new(Vec::new()));
    let c = crossed.clone();
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::hourly("hourly", Usd::from_dollars(1)).soft_limit_percent(80))
        .on_soft_limit(move |e| c.lock().unwrap().push(e.clone()))
        .wall_clock_origin(utc("2025-03-10T10:00:00Z"))
        .build()
        .unwrap();
    // 25,000 output tokens at $10/M: $0.25 an attempt, estimate and cost alike.
    let mut svc = layer.layer(transport(Arc::default(), |_| Ok(done(usage(0, 25_000, 0)))));
    for hour in 1..=2 {
        for i in 1..=4 {
            call(&mut svc, Ask::new("gpt-4o", 0, 25_000)).await.unwrap();
            // $0.75 is below 80%, $1.00 is above.
            assert_eq!(
                crossed.lock().unwrap().len(),
                if i < 4 { hour - 1 } else { hour }
            );
        }
        assert!(call(&mut svc, Ask::new("gpt-4o", 0, 25_000)).await.is_err());
        assert_eq!(crossed.lock().unwrap().len(), hour, "once per window");
        tokio::time::advance(Duration::from_secs(3600)).await;
    }
    let e = &crossed.lock().unwrap()[0];
    assert_eq!(&*e.budget, "hourly");
    assert_eq!(
        (e.spent, e.threshold, e.limit),
        (
            Usd::from_dollars(1),
            Usd::from_cents(80),
            Usd::from_dollars(1)
        )
    );
}

#[tokio::test(start_paused = true)]
async fn missing_max_output_is_refused_or_defaulted() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("all", Usd::from_dollars(1)))
        .build()
        .unwrap();
    let mut svc = layer.layer(transport(calls.clone(), |_| Ok(done_without_usage())));
    let mut ask = Ask::new("gpt-4o", 1_000, 0);
    ask.max = None;
    let err = call(&mut svc, ask.clone()).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::BudgetExceeded);
    assert_eq!(err.code(), Some("max_output_tokens_required"));
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // With a default, the layer writes it into the request (here an HTTP JSON body).
    let seen = Arc::new(Mutex::new(None));
    let s = seen.clone();
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("all", Usd::from_dollars(1)))
        .missing_max_output(MissingMaxOutput::Default(256))
        .build()
        .unwrap();
    let mut svc = layer.layer(tower::service_fn(move |req: http::Request<Bytes>| {
        let body: serde_json::Value = serde_json::from_slice(req.body()).unwrap();
        *s.lock().unwrap() = Some((body["max_tokens"].clone(), req.max_output_tokens()));
        async { Ok::<_, LlmError>(done_without_usage()) }
    }));
    let req = http::Request::post("https://api.openai.com/v1/chat/completions")
        .body(Bytes::from_static(br#"{"model":"gpt-4o","messages":[]}"#))
        .unwrap();
    call(&mut svc, req).await.unwrap();
    assert_eq!(
        seen.lock().unwrap().take(),
        Some((serde_json::json!(256), Some(256)))
    );
    // Empty prompt, 256 output tokens at $10/M.
    assert_eq!(
        layer.spend("all", None).unwrap().spent,
        Usd::from_nanos(2_560_000)
    );
}

#[tokio::test(start_paused = true)]
async fn unknown_models_are_refused_or_get_the_default_price() {
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("all", Usd::from_dollars(1)))
        .build()
        .unwrap();
    let mut svc = layer.layer(transport(Arc::default(), |_| Ok(done(usage(10, 10, 0)))));
    let err = call(&mut svc, Ask::new("mystery-model", 1, 1))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::BudgetExceeded);
    assert_eq!(err.code(), Some("unpriced_model"));
    assert!(err.message().contains("mystery-model"), "{err}");
    let mut no_model = Ask::new("x", 1, 1);
    no_model.model = None;
    assert!(call(&mut svc, no_model).await.is_err());

    let layer = CostBudgetLayer::builder(prices().with_default(haiku()))
        .budget(Budget::total("all", Usd::from_dollars(1)))
        .build()
        .unwrap();
    let mut svc = layer.layer(transport(Arc::default(), |_| Ok(done(usage(10, 10, 0)))));
    call(&mut svc, Ask::new("mystery-model", 1, 1))
        .await
        .unwrap();
    // 10 × $1/M + 10 × $5/M
    assert_eq!(
        layer.spend("all", None).unwrap().spent,
        Usd::from_nanos(60_000)
    );
}

#[tokio::test(start_paused = true)]
async fn every_attempt_is_checked_and_reported_to_the_call_context() {
    let sink = Arc::new(MemorySink::new());
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("all", Usd::from_nanos(EST + 2_000_000)))
        .sink(sink.clone())
        .build()
        .unwrap();
    let attempt = Arc::new(AtomicUsize::new(0));
    let a = attempt.clone();
    let mut svc = layer.layer(transport(Arc::default(), move |_| {
        match a.fetch_add(1, Ordering::SeqCst) {
            0 => Err(LlmError::new(FailureClass::Overloaded, "busy")),
            _ => Ok(done(usage(1_000, 10, 0))),
        }
    }));
    // What a retry layer outside does: one context per logical call, counting attempts, and
    // the same request sent again.
    let ctx = Arc::new(CallContext::new());
    let mut ask = Ask::new("gpt-4o", 1_000, 100);
    ask.ext.insert(ctx.clone());
    for n in 1..=3 {
        ctx.update(|f| f.attempts = n);
        let _ = call(&mut svc, ask.clone()).await;
    }
    let facts = ctx.snapshot();
    // Attempt 1 overloaded (released), attempt 2 cost 1000 × 2.5 + 10 × 10 = 2600 $/M; attempt
    // 3 needed 3500 $/M with 2400 left: refused.
    assert_eq!(facts.cost_usd, Some(0.0026));
    assert_eq!(facts.rejections, [FailureClass::BudgetExceeded]);
    let records = sink.records();
    let attempts: Vec<_> = records.iter().map(|r| (r.attempt, r.outcome)).collect();
    assert_eq!(
        attempts,
        [
            (Some(1), AttemptOutcome::Failed(FailureClass::Overloaded)),
            (Some(2), AttemptOutcome::Ok),
            (
                Some(3),
                AttemptOutcome::Failed(FailureClass::BudgetExceeded)
            ),
        ]
    );
}

/// A store that decides a little later, as a remote one would.
struct SlowStore(Arc<MemoryStore>);

impl BudgetStore for SlowStore {
    fn reserve(&self, charge: &Charge<'_>) -> Admission {
        let store = self.0.clone();
        let (budgets, keys): (Vec<Budget>, Vec<Option<Arc<str>>>) =
            charge.lines().map(|(b, k)| (b.clone(), k.cloned())).unzip();
        let (amount, now) = (charge.amount(), charge.now());
        Admission::Pending(Box::pin(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            match store.reserve(&Charge::new(&budgets, &keys, amount, now)) {
                Admission::Ready(r) => r,
                Admission::Pending(f) => f.await,
            }
        }))
    }

    fn settle(&self, charge: &Charge<'_>, cost: Usd) -> Settled {
        self.0.settle(charge, cost)
    }

    fn spend(&self, budget: &Budget, key: Option<&str>, now: Timestamp) -> Spend {
        self.0.spend(budget, key, now)
    }
}

#[tokio::test(start_paused = true)]
async fn a_remote_store_can_decide_asynchronously() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("all", Usd::from_nanos(EST)))
        .store(SlowStore(Arc::new(MemoryStore::new())))
        .build()
        .unwrap();
    let mut svc = layer.layer(transport(calls.clone(), |_| Ok(done_without_usage())));

    let fut = svc
        .ready()
        .await
        .unwrap()
        .call(Ask::new("gpt-4o", 1_000, 100));
    let mut fut = Box::pin(fut);
    assert!(futures_util::poll!(&mut fut).is_pending());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "not called before admission"
    );
    fut.await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        layer.spend("all", None).unwrap().spent,
        Usd::from_nanos(EST)
    );

    // Refused after the wait; the inner service is never called.
    let err = call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::BudgetExceeded);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A store whose shared state is gone: it cannot decide.
struct DownStore;

impl BudgetStore for DownStore {
    fn reserve(&self, _: &Charge<'_>) -> Admission {
        Admission::Pending(Box::pin(async {
            Err(Refusal::Unavailable(StoreUnavailable {
                reason: "no answer within 50ms".into(),
            }))
        }))
    }

    fn settle(&self, _: &Charge<'_>, _: Usd) -> Settled {
        unreachable!("nothing was admitted")
    }

    fn spend(&self, budget: &Budget, _: Option<&str>, _: Timestamp) -> Spend {
        Spend {
            limit: budget.limit(),
            ..Spend::default()
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_unavailable_store_refuses_with_shared_state_unavailable() {
    let calls = Arc::new(AtomicUsize::new(0));
    let sink = Arc::new(MemorySink::new());
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("all", Usd::from_dollars(1)))
        .store(DownStore)
        .sink(sink.clone())
        .build()
        .unwrap();
    let mut svc = layer.layer(transport(calls.clone(), |_| Ok(done_without_usage())));
    let err = call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::SharedStateUnavailable);
    assert_eq!(err.code(), Some("budget_store_unavailable"));
    assert!(err.to_string().contains("no answer within 50ms"), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "never called");
    let records = sink.records();
    assert_eq!(
        records[0].outcome,
        AttemptOutcome::Failed(FailureClass::SharedStateUnavailable)
    );
    assert_eq!(records[0].cost_nanos, 0);
}

/// A store that applies settlements later, from a queue, as a remote one does.
struct QueuedStore(Arc<MemoryStore>);

impl BudgetStore for QueuedStore {
    fn reserve(&self, charge: &Charge<'_>) -> Admission {
        self.0.reserve(charge)
    }

    fn settle(&self, charge: &Charge<'_>, cost: Usd) -> Settled {
        let store = self.0.clone();
        let (budgets, keys): (Vec<Budget>, Vec<Option<Arc<str>>>) =
            charge.lines().map(|(b, k)| (b.clone(), k.cloned())).unzip();
        let (amount, now, id) = (charge.amount(), charge.now(), charge.id());
        let applied = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let charge = Charge::new(&budgets, &keys, amount, now).with_id(id);
            store.settle(&charge, cost).crossed().await
        });
        Settled::Pending(Box::pin(async move { applied.await.unwrap() }))
    }

    fn spend(&self, budget: &Budget, key: Option<&str>, now: Timestamp) -> Spend {
        self.0.spend(budget, key, now)
    }
}

#[tokio::test(start_paused = true)]
async fn a_queued_settlement_does_not_hold_the_call_and_still_reports_its_soft_limit() {
    let crossed = Arc::new(Mutex::new(Vec::new()));
    let c = crossed.clone();
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("all", Usd::from_dollars(1)).soft_limit_percent(20))
        .store(QueuedStore(Arc::new(MemoryStore::new())))
        .on_soft_limit(move |e| c.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    // $0.25 an attempt: past the 20% threshold at once.
    let mut svc = layer.layer(transport(Arc::default(), |_| Ok(done(usage(0, 25_000, 0)))));
    let started = tokio::time::Instant::now();
    call(&mut svc, Ask::new("gpt-4o", 0, 25_000)).await.unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO, "the call did not wait");
    assert!(crossed.lock().unwrap().is_empty(), "not applied yet");
    assert_eq!(
        layer.spend("all", None).unwrap().reserved,
        Usd::from_cents(25)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(crossed.lock().unwrap().len(), 1);
    let s = layer.read_spend("all", None).unwrap().await.unwrap();
    assert_eq!((s.spent, s.reserved), (Usd::from_cents(25), Usd::ZERO));
}

#[tokio::test(start_paused = true)]
async fn jsonl_records_sum_to_the_spend() {
    let path = std::env::temp_dir().join(format!(
        "seawall-budget-test-{}-{:?}.jsonl",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_file(&path);
    let sink = Arc::new(JsonlSink::create(&path).unwrap());
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("all", Usd::from_nanos(3 * EST)))
        .sink(sink.clone())
        .build()
        .unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let c = n.clone();
    let mut svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(transport(Arc::default(), move |_| {
            match c.fetch_add(1, Ordering::SeqCst) % 3 {
                0 => Ok(done(usage(800, 90, 100))),
                1 => Err(LlmError::new(FailureClass::UpstreamTimeout, "504")),
                _ => Err(LlmError::new(FailureClass::ServerError, "500")),
            }
        }));
    for _ in 0..6 {
        let _ = call(&mut svc, Ask::new("gpt-4o", 1_000, 100)).await;
    }
    sink.flush().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let records: Vec<SpendRecord> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 6);
    let total: u64 = records.iter().map(|r| r.cost_nanos).sum();
    assert_eq!(
        Usd::from_nanos(total),
        layer.spend("all", None).unwrap().spent
    );
    assert!(
        records
            .iter()
            .any(|r| r.outcome == AttemptOutcome::Failed(FailureClass::BudgetExceeded))
    );
    assert_eq!(sink.dropped(), 0);
    std::fs::remove_file(&path).unwrap();
}

#[tokio::test(start_paused = true)]
async fn http_requests_keyed_by_api_key_fingerprint() {
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::daily("per-key", Usd::from_nanos(3_000_000)).per_key("api_key"))
        .keys(
            ScopeKeys::new().scope("api_key", |req: &http::Request<Bytes>| {
                let key = req.headers().get("authorization")?.to_str().ok()?;
                Some(fingerprint(key).to_string())
            }),
        )
        .build()
        .unwrap();
    let mut svc = layer.layer(tower::service_fn(|_req: http::Request<Bytes>| async {
        Ok::<_, LlmError>(done_without_usage())
    }));
    let req = |key: &str| {
        http::Request::post("https://api.openai.com/v1/chat/completions")
            .header("authorization", format!("Bearer {key}"))
            .body(Bytes::from_static(
                br#"{"model":"gpt-4o","max_tokens":200,"messages":[{"role":"user","content":"hello"}]}"#,
            ))
            .unwrap()
    };
    call(&mut svc, req("sk-secret-one-123456")).await.unwrap();
    let err = call(&mut svc, req("sk-secret-one-123456"))
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(
        shown.contains("fp-") && !shown.contains("secret-one"),
        "{shown}"
    );
    call(&mut svc, req("sk-secret-two-123456")).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_request_for_a_service_tier_is_reserved_and_charged_at_that_tiers_prices() {
    // gpt-5: $1.25 / $10 standard, $2.50 / $20 priority, $0.625 / $5 flex.
    let table = PriceTable::new()
        .with(
            "gpt-5",
            Price::per_million(Usd::from_cents(125), Usd::from_dollars(10)),
        )
        .with_tier(
            "gpt-5",
            ServiceTier::Priority,
            Price::per_million(Usd::from_cents(250), Usd::from_dollars(20)),
        )
        .with_tier(
            "gpt-5",
            ServiceTier::Flex,
            Price::per_million(Usd::from_nanos(625_000_000), Usd::from_dollars(5)),
        )
        .with(
            "gpt-4o",
            Price::per_million(Usd::from_cents(250), Usd::from_dollars(10)),
        );
    let sink = Arc::new(MemorySink::new());
    let layer = CostBudgetLayer::builder(table)
        .budget(Budget::total("all", Usd::from_dollars(10)))
        .sink(sink.clone())
        .build()
        .unwrap();
    let mut svc = layer.layer(tower::service_fn(|_req: http::Request<Bytes>| async {
        Ok::<_, LlmError>(done(usage(1_000, 100, 0)))
    }));
    let req = |model: &str, tier: &str| {
        let body = format!(
            r#"{{"model":"{model}","max_tokens":100,{tier}"messages":[{{"role":"user","content":"hello"}}]}}"#
        );
        http::Request::post("https://api.openai.com/v1/chat/completions")
            .body(Bytes::from(body))
            .unwrap()
    };
    for (model, tier) in [
        ("gpt-5", r#""service_tier":"priority","#),
        ("gpt-5", r#""service_tier":"flex","#),
        ("gpt-5", r#""service_tier":"auto","#),
        ("gpt-5", ""),
        // A model without tier prices is priced as any other.
        ("gpt-4o", r#""service_tier":"priority","#),
    ] {
        call(&mut svc, req(model, tier)).await.unwrap();
    }
    // 1,000 in and 100 out: 1,000 × 2.5 + 100 × 20, 1,000 × 0.625 + 100 × 5, then
    // 1,000 × 1.25 + 100 × 10 twice, and gpt-4o's 1,000 × 2.5 + 100 × 10.
    let costs: Vec<_> = sink.records().iter().map(|r| r.cost_nanos).collect();
    assert_eq!(
        costs,
        [4_500_000, 1_125_000, 2_250_000, 2_250_000, 3_500_000]
    );
    // Each reserved at its tier's prices too (the estimate of "hello" is a few tokens).
    let reserved: Vec<_> = sink.records().iter().map(|r| r.reserved_nanos).collect();
    assert!(
        reserved[0] > reserved[2] && reserved[2] > reserved[1],
        "{reserved:?}"
    );
    assert_eq!(reserved[2], reserved[3]);
    // The ledger says which tier each was priced at (none for the standard prices).
    let tiers: Vec<_> = sink.records().iter().map(|r| r.service_tier).collect();
    let (p, f) = (Some(ServiceTier::Priority), Some(ServiceTier::Flex));
    assert_eq!(tiers, [p, f, None, None, None]);
    let line = serde_json::to_string(&sink.records()[0]).unwrap();
    assert!(line.contains(r#""service_tier":"priority""#), "{line}");
    let back: SpendRecord = serde_json::from_str(&line).unwrap();
    assert_eq!(back, sink.records()[0]);
    let standard = serde_json::to_string(&sink.records()[2]).unwrap();
    assert!(!standard.contains("service_tier"), "{standard}");
}

#[test]
fn bad_configurations_are_errors() {
    let dup = CostBudgetLayer::builder(prices())
        .budget(Budget::total("a", Usd::from_dollars(1)))
        .budget(Budget::daily("a", Usd::from_dollars(1)))
        .build()
        .unwrap_err();
    assert!(dup.to_string().contains("unique"), "{dup}");
    let nokeys = CostBudgetLayer::builder(prices())
        .budget(Budget::total("t", Usd::from_dollars(1)).per_key("tenant"))
        .build()
        .unwrap_err();
    assert!(
        nokeys.to_string().contains("CostBudgetBuilder::keys"),
        "{nokeys}"
    );
    assert_eq!(nokeys.field(), "keys");
    let zero = CostBudgetLayer::builder(prices())
        .missing_max_output(MissingMaxOutput::Default(0))
        .build()
        .unwrap_err();
    assert!(zero.to_string().contains("more than zero"), "{zero}");
    assert!(
        CostBudgetLayer::builder(prices())
            .input_margin_percent(5_000)
            .build()
            .is_err()
    );
}

#[tokio::test(start_paused = true)]
async fn input_margin_enlarges_the_reservation() {
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::total("all", Usd::from_dollars(1)))
        .input_margin_percent(20)
        .build()
        .unwrap();
    let mut svc = layer.layer(transport(Arc::default(), |_| Ok(done_without_usage())));
    call(&mut svc, Ask::new("gpt-4o", 1_000, 100))
        .await
        .unwrap();
    // 1200 × 2.5 + 100 × 10
    assert_eq!(
        layer.spend("all", None).unwrap().spent,
        Usd::from_nanos(4_000_000)
    );
}

/// The reservation of one HTTP JSON body sent to gpt-4o through `builder`, or the refusal.
async fn reserved_for(builder: CostBudgetBuilder, body: String) -> Result<u64, LlmError> {
    let sink = Arc::new(MemorySink::new());
    let layer = builder.sink(sink.clone()).build().unwrap();
    let mut svc = layer.layer(tower::service_fn(|_req: http::Request<Bytes>| async {
        Ok::<_, LlmError>(done_without_usage())
    }));
    let req = http::Request::post("https://api.openai.com/v1/chat/completions")
        .body(Bytes::from(body))
        .unwrap();
    call(&mut svc, req).await?;
    Ok(sink.records()[0].reserved_nanos)
}

fn dollar_budget() -> CostBudgetBuilder {
    CostBudgetLayer::builder(prices()).budget(Budget::total("all", Usd::from_dollars(1)))
}

#[tokio::test(start_paused = true)]
async fn every_one_of_n_answers_is_reserved() {
    // 4 answers × 100 tokens at $10/M = $0.004.
    let body = r#"{"model":"gpt-4o","n":4,"max_tokens":100,"messages":[]}"#;
    assert_eq!(
        reserved_for(dollar_budget(), body.into()).await.unwrap(),
        4_000_000
    );
    // `best_of` generates (and bills) that many, even when `n` is smaller; the empty prompt
    // is one text part (4 tokens at $2.50/M).
    let body = r#"{"model":"gpt-4o","n":1,"best_of":3,"max_tokens":100,"prompt":""}"#;
    assert_eq!(
        reserved_for(dollar_budget(), body.into()).await.unwrap(),
        3_000_000 + 4 * 2_500
    );
    // 128 × 16,384 tokens could cost $20.97: more than the $1 limit.
    let body = r#"{"model":"gpt-4o","n":128,"max_tokens":16384,"messages":[]}"#;
    let err = reserved_for(dollar_budget(), body.into())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("budget_exceeded"));
}

#[tokio::test(start_paused = true)]
async fn images_are_reserved_at_the_part_estimate_not_as_text() {
    let image = |data: &str| {
        format!(
            r#"{{"model":"gpt-4o","max_tokens":10,"messages":[{{"role":"user","content":[
            {{"type":"image_url","image_url":{{"url":"data:image/png;base64,{data}"}}}}]}}]}}"#
        )
    };
    // As text, 400,000 base64 characters would be 100,000 tokens ($0.25).
    let big = "A".repeat(400_000);
    // "user": 1 token + 4 for the part, 1,600 for the image, at $2.50/M; 10 out at $10/M.
    let want = (5 + 1_600) * 2_500 + 10 * 10_000;
    assert_eq!(
        reserved_for(dollar_budget(), image(&big)).await.unwrap(),
        want
    );
    let small = PartEstimate::DEFAULT.per_image(85);
    let want = (5 + 85) * 2_500 + 10 * 10_000;
    let builder = dollar_budget().part_estimate(small);
    assert_eq!(reserved_for(builder, image(&big)).await.unwrap(), want);
    // The input margin applies to parts too.
    let builder = dollar_budget()
        .part_estimate(small)
        .input_margin_percent(100);
    assert_eq!(
        reserved_for(builder, image("")).await.unwrap(),
        want + 90 * 2_500
    );
}

#[tokio::test(start_paused = true)]
async fn the_largest_usable_max_output_is_reserved_and_an_unusable_one_follows_the_policy() {
    // 5,000 of the two fields, given as a numeric string: 5,000 × $10/M.
    let body = r#"{"model":"gpt-4o","max_tokens":100,"max_completion_tokens":"5e3","messages":[]}"#;
    assert_eq!(
        reserved_for(dollar_budget(), body.into()).await.unwrap(),
        50_000_000
    );
    for v in ["-1", "\"lots\"", "null"] {
        let body = format!(r#"{{"model":"gpt-4o","max_tokens":{v},"messages":[]}}"#);
        let err = reserved_for(dollar_budget(), body.clone())
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("max_output_tokens_required"), "{v}");
        let builder = dollar_budget().missing_max_output(MissingMaxOutput::Default(64));
        assert_eq!(reserved_for(builder, body).await.unwrap(), 640_000, "{v}");
    }
}
