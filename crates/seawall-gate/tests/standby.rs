//! Calls a fallback target stands by for ([`Standby`]): the gate holds them for their key's
//! rate or pause at most the standby wait, and otherwise turns them away at once, so the
//! fallback above sends them to a target with room. On paused tokio time: the times asserted
//! are exact.

mod common;

use std::time::Duration;

use common::{Ask, Reply, Upstream, call, gate, rejection, settle};
use seawall_core::{Deadline, FailureClass, LlmError, Standby};
use seawall_gate::{
    ConcurrencyGateBuilder, ConcurrencyGateLayer, DEFAULT_STANDBY_WAIT, Limit, Rates, RejectReason,
};
use tokio::time::Instant;
use tower::ServiceExt;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One request per `every` (a bucket of one), a 30 s maximum wait, the default standby wait.
fn paced(every: Duration) -> ConcurrencyGateBuilder {
    let per_minute = (60_000 / every.as_millis()) as u64;
    ConcurrencyGateLayer::builder()
        .max_wait(Duration::from_secs(30))
        .rates(Rates::new().with_requests(Limit::per_minute(per_minute).with_burst(1)))
}

fn standing_by(mut ask: Ask) -> Ask {
    Standby::set(&mut ask, true);
    ask
}

fn reason(e: &LlmError) -> RejectReason {
    rejection(e).reason()
}

#[tokio::test(start_paused = true)]
async fn a_rate_wait_past_the_standby_wait_sends_the_call_on_at_once() {
    assert_eq!(DEFAULT_STANDBY_WAIT, Duration::from_secs(1));
    let up = Upstream::new(|_| Reply::ok());
    let svc = gate(paced(Duration::from_secs(10)), &up);
    drop(call(&svc, Ask::numbered(0)).await.unwrap());

    let t0 = Instant::now();
    let e = call(&svc, standing_by(Ask::numbered(1))).await.unwrap_err();
    assert_eq!(t0.elapsed(), Duration::ZERO, "turned away without waiting");
    assert_eq!(reason(&e), RejectReason::Spilled);
    assert_eq!(e.retry_after(), Some(Duration::from_secs(10)));
    let stats = svc.handle().stats();
    assert_eq!((stats.spilled, stats.rejected), (1, 1));

    // The same call with nowhere else to go waits for the rate, as before.
    drop(call(&svc, Ask::numbered(2)).await.unwrap());
    assert_eq!(t0.elapsed(), Duration::from_secs(10));
    assert_eq!(up.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_rate_wait_within_the_standby_wait_is_waited() {
    let up = Upstream::new(|_| Reply::ok());
    let svc = gate(paced(ms(500)), &up);
    drop(call(&svc, Ask::numbered(0)).await.unwrap());
    let t0 = Instant::now();
    drop(call(&svc, standing_by(Ask::numbered(1))).await.unwrap());
    assert_eq!(t0.elapsed(), ms(500));
    assert_eq!(svc.handle().stats().spilled, 0);
}

#[tokio::test(start_paused = true)]
async fn the_calls_already_in_the_key_line_count_toward_the_wait() {
    let up = Upstream::new(|_| Reply::ok());
    let svc = gate(paced(ms(400)), &up);
    drop(call(&svc, Ask::numbered(0)).await.unwrap());
    // Two calls wait in the key's line: admitted at 0.4 s and 0.8 s.
    let waiting: Vec<_> = (1..=2)
        .map(|i| tokio::spawn(svc.clone().oneshot(Ask::numbered(i))))
        .collect();
    settle().await;

    // Alone, this call would wait 0.4 s; behind them, 1.2 s: more than the standby wait, so
    // it goes at once rather than after a second in the line.
    let t0 = Instant::now();
    let e = call(&svc, standing_by(Ask::numbered(3))).await.unwrap_err();
    assert_eq!(reason(&e), RejectReason::Spilled);
    assert_eq!(t0.elapsed(), Duration::ZERO);
    assert_eq!(e.retry_after(), Some(ms(1200)));

    for w in waiting {
        drop(w.await.unwrap().unwrap());
    }
    assert_eq!(t0.elapsed(), ms(800));
    // The line is empty again: a call with a standby waits its 0.4 s.
    drop(call(&svc, standing_by(Ask::numbered(4))).await.unwrap());
    assert_eq!(t0.elapsed(), ms(1200));
}

#[tokio::test(start_paused = true)]
async fn a_call_that_waited_its_standby_wait_in_the_line_is_sent_on_then() {
    // The estimate saw a short wait, but the call ahead was held longer (the upstream paused
    // the key meanwhile): the call leaves the line at its standby wait.
    let up = Upstream::new(|_| Reply::ok());
    let svc = gate(paced(ms(500)), &up);
    drop(call(&svc, Ask::numbered(0)).await.unwrap());
    let ahead = tokio::spawn(svc.clone().oneshot(Ask::numbered(1)));
    settle().await;
    let t0 = Instant::now();
    let behind = tokio::spawn(svc.clone().oneshot(standing_by(Ask::numbered(2))));
    settle().await;
    svc.handle().pause_key(Some("m"), Duration::from_secs(5));
    let e = behind.await.unwrap().unwrap_err();
    assert_eq!(reason(&e), RejectReason::Spilled);
    assert_eq!(t0.elapsed(), DEFAULT_STANDBY_WAIT);
    drop(ahead.await.unwrap().unwrap());
    assert_eq!(t0.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_paused_key_sends_calls_with_a_standby_on_and_holds_the_others() {
    let up = Upstream::new(|_| Reply::ok());
    let svc = gate(
        ConcurrencyGateLayer::builder().max_wait(Duration::from_secs(30)),
        &up,
    );
    svc.handle().pause_key(Some("m"), Duration::from_secs(5));
    let t0 = Instant::now();
    let e = call(&svc, standing_by(Ask::numbered(0))).await.unwrap_err();
    assert_eq!(reason(&e), RejectReason::Spilled);
    assert_eq!(t0.elapsed(), Duration::ZERO);
    drop(call(&svc, Ask::numbered(1)).await.unwrap());
    assert_eq!(t0.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn the_wait_for_a_permit_is_not_cut() {
    let up = Upstream::new(|_| Reply::stream());
    let svc = gate(
        ConcurrencyGateLayer::builder()
            .limit(1)
            .max_wait(Duration::from_secs(30)),
        &up,
    );
    let held = call(&svc, Ask::numbered(0)).await.unwrap();
    let t0 = Instant::now();
    let waiting = tokio::spawn(svc.clone().oneshot(standing_by(Ask::numbered(1))));
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(held);
    up.end(0);
    let resp = waiting
        .await
        .unwrap()
        .expect("admitted once the permit came back");
    assert_eq!(t0.elapsed(), Duration::from_secs(3));
    up.end(1);
    drop(resp);
}

#[tokio::test(start_paused = true)]
async fn a_standby_wait_as_long_as_the_max_wait_holds_the_call_as_any_other() {
    let up = Upstream::new(|_| Reply::ok());
    let svc = gate(
        paced(Duration::from_secs(10)).standby_wait(Duration::from_secs(30)),
        &up,
    );
    drop(call(&svc, Ask::numbered(0)).await.unwrap());
    let t0 = Instant::now();
    drop(call(&svc, standing_by(Ask::numbered(1))).await.unwrap());
    assert_eq!(t0.elapsed(), Duration::from_secs(10));

    // Changed at run time: a shorter one sends the next call on.
    svc.handle().set_standby_wait(Duration::from_secs(2));
    assert_eq!(svc.handle().stats().standby_wait, Duration::from_secs(2));
    let e = call(&svc, standing_by(Ask::numbered(2))).await.unwrap_err();
    assert_eq!(reason(&e), RejectReason::Spilled);
}

#[tokio::test(start_paused = true)]
async fn a_caller_deadline_before_admission_sends_the_call_on_rather_than_failing_it() {
    // The rate admits in 0.8 s, within the standby wait, but the caller has only 0.5 s: the
    // fallback may still answer in time, so the call is handed to it, not failed.
    let up = Upstream::new(|_| Reply::ok());
    let svc = gate(paced(ms(800)), &up);
    drop(call(&svc, Ask::numbered(0)).await.unwrap());
    let mut ask = standing_by(Ask::numbered(1));
    ask.ext.insert(Deadline::after(ms(500)));
    let t0 = Instant::now();
    let e = call(&svc, ask).await.unwrap_err();
    assert_eq!(reason(&e), RejectReason::Spilled);
    assert_eq!(t0.elapsed(), Duration::ZERO);

    // Without a standby, the same call fails on its deadline.
    let mut ask = Ask::numbered(2);
    ask.ext.insert(Deadline::after(ms(500)));
    let e = call(&svc, ask).await.unwrap_err();
    assert_eq!(e.class(), FailureClass::DeadlineExceeded, "{e}");
}
