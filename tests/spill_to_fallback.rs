//! A burst beyond the primary's rate, and an overloaded primary, with a fallback that has
//! room.
//!
//! The gate paces each model at its rate. Holding the calls the primary's rate cannot take
//! for seconds, while the backup named in the fallback chain sits idle, is the wrong trade:
//! the fallback layer marks the calls it stands by for, and the gate sends those on at once
//! when their wait would pass the standby wait. The backup, the chain's last target, has
//! nowhere else to send its calls: they wait for its rate as before. The retry layer, given a
//! standby wait, makes the same trade for its waits: an overload's five seconds on the primary
//! are not spent when the backup stands by.
//!
//! On tokio's paused clock, so the times asserted are exact.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use seawall::core::{CallContext, FailureClass, LlmError, LlmRequest, ServedBy, Standby};
use seawall::fallback::{FallbackLayer, Target};
use seawall::gate::{ConcurrencyGateLayer, Limit, Rates};
use seawall::retry::BackoffRetryLayer;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};

fn ask() -> http::Request<Bytes> {
    http::Request::post("https://api.example/v1/chat/completions")
        .body(Bytes::from_static(
            br#"{"model":"primary","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#,
        ))
        .unwrap()
}

/// Two calls at once, then one every 10 s.
fn slow() -> Rates {
    Rates::new().with_requests(Limit::per_minute(6).with_burst(2))
}

#[tokio::test(start_paused = true)]
async fn calls_beyond_the_primary_rate_go_to_the_backup_at_once() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let upstream = tower::service_fn(move |req: http::Request<Bytes>| {
        let model = req.model().unwrap_or("").to_owned();
        log.lock().unwrap().push((model, Standby::is_on(&req)));
        async { Ok::<_, LlmError>(http::Response::new(String::from("{}"))) }
    });
    let gate = ConcurrencyGateLayer::builder()
        .limit(16)
        .key_rates("api.example/primary", slow())
        .key_rates("api.example/backup", slow())
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(FallbackLayer::new([Target::model("backup")]))
        .layer(BackoffRetryLayer::builder().seed(1).build().unwrap())
        .layer(gate.clone())
        .service(upstream);

    let t0 = Instant::now();
    let calls: Vec<_> = (0..6)
        .map(|_| {
            let svc = svc.clone();
            let cx = CallContext::shared();
            let mut req = ask();
            req.extensions_mut().insert(cx.clone());
            tokio::spawn(async move {
                let resp = svc.oneshot(req).await.unwrap();
                let served = resp.extensions().get::<ServedBy>().unwrap().target.clone();
                (served.to_string(), t0.elapsed(), cx.snapshot())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for c in calls {
        answers.push(c.await.unwrap());
    }
    answers.sort_by_key(|a| a.1);
    let who: Vec<_> = answers.iter().map(|a| (a.0.as_str(), a.1)).collect();
    let now = Duration::ZERO;
    assert_eq!(
        who,
        [
            ("primary", now),
            ("primary", now),
            // Sent on at once: the primary's rate would have held them 10 to 40 s.
            ("backup", now),
            ("backup", now),
            // The backup's own rate holds the rest: it is the chain's last target.
            ("backup", Duration::from_secs(10)),
            ("backup", Duration::from_secs(20)),
        ]
    );
    for (_, _, facts) in answers.iter().filter(|a| a.0 == "backup") {
        assert_eq!(facts.fallbacks, 1);
        assert_eq!(facts.rejections, [FailureClass::GateRejected]);
    }
    let stats = gate.handle().stats();
    assert_eq!((stats.spilled, stats.rejected), (4, 4));
    // Only requests with a target behind them were marked.
    let seen = seen.lock().unwrap();
    assert!(
        seen.iter().all(|(m, on)| *on == (m == "primary")),
        "{seen:?}"
    );
    assert_eq!(seen.len(), 6, "each call reached the upstream once");
}

#[tokio::test(start_paused = true)]
async fn an_overloaded_primary_hands_its_call_to_the_backup_without_the_overload_wait() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let upstream = tower::service_fn(move |req: http::Request<Bytes>| {
        let model = req.model().unwrap_or("").to_owned();
        log.lock().unwrap().push((model.clone(), Instant::now()));
        async move {
            if model == "primary" {
                return Err(LlmError::new(FailureClass::Overloaded, "529 overloaded"));
            }
            Ok::<_, LlmError>(http::Response::new(String::from("{}")))
        }
    });
    let svc = ServiceBuilder::new()
        .layer(FallbackLayer::new([Target::model("backup")]))
        .layer(
            BackoffRetryLayer::builder()
                .seed(1)
                .standby_wait(Duration::from_secs(1))
                .build()
                .unwrap(),
        )
        .service(upstream);
    let t0 = Instant::now();
    let resp = svc.oneshot(ask()).await.unwrap();
    assert_eq!(t0.elapsed(), Duration::ZERO, "no 5 s overload wait");
    assert_eq!(
        &*resp.extensions().get::<ServedBy>().unwrap().target,
        "backup"
    );
    let seen = seen.lock().unwrap();
    let models: Vec<_> = seen.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(models, ["primary", "backup"]);
}
