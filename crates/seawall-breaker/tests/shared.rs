//! The seam a fleet shares its breakers through, driven by hand: what a replica hands over
//! (its outcome counts and state changes) and what the fleet's decisions do to the local
//! breakers (hold open, grant the probe, close, release).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use seawall_breaker::{
    BreakerGuard, CircuitBreakerLayer, FleetLink, Mode, Reason, SharedBreakerState, State,
    StateChange,
};
use seawall_core::{ConfigError, FailureClass, HookedBody, LlmError};
use seawall_test_support::Ask;
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt};

const KEY: &str = "api.example/m";
const INTERVAL: Duration = Duration::from_millis(250);

/// A shared state that keeps the link for the test to drive and records the changes.
#[derive(Clone, Default)]
struct ByHand {
    link: Arc<Mutex<Option<FleetLink>>>,
    changes: Arc<Mutex<Vec<(State, State, Reason)>>>,
}

impl SharedBreakerState for ByHand {
    fn attach(&self, link: FleetLink) -> Result<(), ConfigError> {
        *self.link.lock().unwrap() = Some(link);
        Ok(())
    }
    fn on_state_change(&self, c: &StateChange) {
        self.changes.lock().unwrap().push((c.from, c.to, c.reason));
    }
    fn interval(&self) -> Duration {
        INTERVAL
    }
}

impl ByHand {
    fn link(&self) -> FleetLink {
        self.link.lock().unwrap().clone().unwrap()
    }
}

/// Marks a request the fake upstream fails.
#[derive(Clone, Copy)]
struct Fail;

type Svc = BoxCloneService<Ask, http::Response<HookedBody<String, BreakerGuard>>, LlmError>;

fn stack(layer: &CircuitBreakerLayer) -> (Svc, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let upstream = tower::service_fn(move |r: Ask| {
        seen.fetch_add(1, Ordering::SeqCst);
        async move {
            if r.ext.get::<Fail>().is_some() {
                Err(LlmError::new(FailureClass::ServerError, "500"))
            } else {
                Ok(http::Response::new(String::from("ok")))
            }
        }
    });
    (BoxCloneService::new(layer.layer(upstream)), calls)
}

async fn call(svc: &mut Svc, fail: bool) -> Result<(), LlmError> {
    let mut req = Ask::named(KEY);
    if fail {
        req.ext.insert(Fail);
    }
    let resp = svc.ready().await?.call(req).await?;
    resp.into_body()
        .collect()
        .await
        .map(|_| ())
        .map_err(|e| match e {})
}

fn layer(state: &ByHand) -> CircuitBreakerLayer {
    CircuitBreakerLayer::builder()
        .consecutive_failures(0)
        .minimum_calls(10)
        .jitter(0.0)
        .shared_state(state.clone())
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn counted_outcomes_are_handed_to_the_fleet_once() {
    let state = ByHand::default();
    let layer = layer(&state);
    let (mut svc, _) = stack(&layer);
    for fail in [false, true, false, true, false] {
        let _ = call(&mut svc, fail).await;
    }
    let reports = state.link().collect().unwrap();
    assert_eq!(reports.len(), 1);
    let r = &reports[0];
    assert_eq!((&*r.key, r.calls, r.failures, r.slow_calls), (KEY, 5, 2, 0));
    assert!(!r.held && !r.wants_probe);
    assert_eq!(
        state.link().collect().unwrap(),
        vec![],
        "counts are handed over once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_the_fleet_holds_open_waits_for_the_probe_grant() {
    let state = ByHand::default();
    let layer = layer(&state);
    let (mut svc, upstream) = stack(&layer);
    let link = state.link();

    link.open(KEY, Duration::from_secs(1));
    assert_eq!(layer.handle().state(KEY), Some(State::Open));
    let err = call(&mut svc, false).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::CircuitOpen);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));

    // Past the open period the key does not go half-open by itself: it asks for the probe.
    tokio::time::advance(Duration::from_secs(2)).await;
    let err = call(&mut svc, false).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::CircuitOpen);
    assert_eq!(err.retry_after(), Some(INTERVAL));
    assert_eq!(upstream.load(Ordering::SeqCst), 0);
    let r = &link.collect().unwrap()[0];
    assert!(r.held && r.wants_probe && r.state == State::Open);

    link.grant_probe(KEY);
    assert_eq!(layer.handle().state(KEY), Some(State::HalfOpen));
    call(&mut svc, false).await.unwrap();
    assert_eq!(upstream.load(Ordering::SeqCst), 1);
    assert_eq!(layer.handle().state(KEY), Some(State::Closed));
    assert_eq!(
        *state.changes.lock().unwrap(),
        [
            (State::Closed, State::Open, Reason::Shared),
            (State::Open, State::HalfOpen, Reason::Shared),
            (State::HalfOpen, State::Closed, Reason::ProbesSucceeded),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_fleet_closing_a_key_closes_it_here() {
    let state = ByHand::default();
    let layer = layer(&state);
    let (mut svc, upstream) = stack(&layer);
    let link = state.link();
    link.open(KEY, Duration::from_secs(60));
    link.close(KEY);
    assert_eq!(layer.handle().state(KEY), Some(State::Closed));
    call(&mut svc, false).await.unwrap();
    assert_eq!(upstream.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_fleet_close_leaves_a_local_trip_alone() {
    let state = ByHand::default();
    let layer = layer(&state);
    let (mut svc, _) = stack(&layer);
    for _ in 0..10 {
        let _ = call(&mut svc, true).await;
    }
    assert_eq!(layer.handle().state(KEY), Some(State::Open));
    // The fleet never held it: its "closed" is about another replica's period.
    state.link().close(KEY);
    assert_eq!(layer.handle().state(KEY), Some(State::Open));
}

#[tokio::test(start_paused = true)]
async fn released_keys_run_on_local_state() {
    let state = ByHand::default();
    let layer = layer(&state);
    let (mut svc, upstream) = stack(&layer);
    let link = state.link();
    link.open(KEY, Duration::from_secs(1));
    tokio::time::advance(Duration::from_secs(2)).await;
    call(&mut svc, false).await.unwrap_err();
    link.release_all();
    // The local open period is over: the next call probes, without a grant.
    call(&mut svc, false).await.unwrap();
    assert_eq!(upstream.load(Ordering::SeqCst), 1);
    assert_eq!(layer.handle().state(KEY), Some(State::Closed));
}

#[tokio::test(start_paused = true)]
async fn the_fleet_leaves_manual_modes_alone() {
    let state = ByHand::default();
    let layer = layer(&state);
    layer.handle().set_mode(KEY, Mode::Disabled);
    state.link().open(KEY, Duration::from_secs(60));
    assert_eq!(layer.handle().state(KEY), Some(State::Disabled));
}

#[tokio::test(start_paused = true)]
async fn the_link_does_not_keep_the_layer_alive() {
    let state = ByHand::default();
    let layer = layer(&state);
    let (svc, _) = stack(&layer);
    let link = state.link();
    assert!(link.is_alive());
    drop((layer, svc));
    assert!(!link.is_alive());
    assert_eq!(link.collect(), None);
}

#[tokio::test(start_paused = true)]
async fn a_shared_state_that_cannot_attach_fails_the_build() {
    struct Refuses;
    impl SharedBreakerState for Refuses {
        fn attach(&self, _: FleetLink) -> Result<(), ConfigError> {
            Err(ConfigError::new("shared_state", "no runtime"))
        }
        fn on_state_change(&self, _: &StateChange) {}
        fn interval(&self) -> Duration {
            INTERVAL
        }
    }
    let err = CircuitBreakerLayer::builder()
        .shared_state(Refuses)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "shared_state");
}
