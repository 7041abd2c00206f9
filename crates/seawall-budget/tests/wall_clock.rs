//! Calendar windows follow the wall clock, read at every admission: a host that was
//! suspended, or a clock corrected after start-up, rolls the window at the right moment.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::*;
use http_body_util::BodyExt;
use seawall_budget::*;
use seawall_core::{FailureClass, HookedBody, LlmError};
use tower::{Layer, Service, ServiceExt};

/// The estimate of a gpt-4o `Ask(1000 in, 100 out)`: 1000 × 2.5 + 100 × 10 = 3500 $/M.
const EST: u64 = 3_500_000;

fn utc(s: &str) -> SystemTime {
    let t = Timestamp::parse_rfc3339(s).unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_nanos(t.as_unix_nanos())
}

/// A wall clock the test sets by hand; tokio's clock never moves in these tests.
#[derive(Clone)]
struct WallClock(Arc<Mutex<SystemTime>>);

impl WallClock {
    fn at(s: &str) -> WallClock {
        WallClock(Arc::new(Mutex::new(utc(s))))
    }

    fn set(&self, s: &str) {
        *self.0.lock().unwrap() = utc(s);
    }

    fn read(&self) -> impl Fn() -> SystemTime + Send + Sync + 'static {
        let now = self.0.clone();
        move || *now.lock().unwrap()
    }
}

/// A layer with one daily budget that holds exactly one `Ask(1000, 100)`.
fn one_call_a_day(
    clock: &WallClock,
) -> impl Service<Ask, Response = http::Response<HookedBody<ChanBody, BudgetGuard>>, Error = LlmError>
+ use<> {
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::daily("daily", Usd::from_nanos(EST)))
        .wall_clock(clock.read())
        .build()
        .unwrap();
    layer.layer(tower::service_fn(|_: Ask| async {
        Ok::<_, LlmError>(done_without_usage())
    }))
}

/// One call, its body read to the end so the attempt is settled.
async fn call<S>(svc: &mut S) -> Result<(), LlmError>
where
    S: Service<Ask, Error = LlmError>,
    S::Response: http_body::Body + Unpin,
{
    let resp = svc
        .ready()
        .await?
        .call(Ask::new("gpt-4o", 1_000, 100))
        .await?;
    let _ = resp.collect().await;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_wall_clock_jump_after_a_suspend_rolls_the_daily_window() {
    let clock = WallClock::at("2025-03-10T23:00:00Z");
    let mut svc = one_call_a_day(&clock);
    call(&mut svc).await.unwrap();
    let err = call(&mut svc).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::BudgetExceeded);

    // The host sleeps for eight hours: the monotonic clock (tokio's) does not move.
    clock.set("2025-03-11T07:00:00Z");
    call(&mut svc).await.unwrap();
    assert!(call(&mut svc).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_wall_clock_wrong_at_start_rolls_at_the_real_midnight_once_corrected() {
    // The real time is 21:00, but the clock is three hours behind when the layer starts.
    let clock = WallClock::at("2025-03-10T18:00:00Z");
    let mut svc = one_call_a_day(&clock);
    call(&mut svc).await.unwrap();

    // Synchronised: the same day, so the spend still counts until the real midnight.
    clock.set("2025-03-10T21:00:05Z");
    assert!(call(&mut svc).await.is_err());
    clock.set("2025-03-10T23:59:59Z");
    let err = call(&mut svc).await.unwrap_err();
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));

    clock.set("2025-03-11T00:00:00Z");
    call(&mut svc).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_default_clock_is_the_system_clock() {
    let layer = CostBudgetLayer::builder(prices())
        .budget(Budget::daily("daily", Usd::from_dollars(1)))
        .build()
        .unwrap();
    let before = Timestamp::from_system_time(SystemTime::now());
    // Paused tokio time moves; the system clock does not follow it.
    tokio::time::advance(Duration::from_secs(10 * 86_400)).await;
    let now = layer.now();
    let after = Timestamp::from_system_time(SystemTime::now());
    assert!(
        before <= now && now <= after,
        "{before} <= {now} <= {after}"
    );
}
