//! `scripts/breaker_sync.lua` on its own, against a real server: the shared window and its
//! rule, the "open until" hints, the probe lease, and forgetting unprobed keys.

use redis::aio::MultiplexedConnection;
use seawall_test_support::RedisServer;

const OPEN: &str = "t:breaker:open";
const BASE: &str = "t:breaker:";
const KEY: &str = "api.example/m";
const T0: u64 = 1_700_000_000_000;
/// The rules every sync below passes: a 10 s window of 1 s buckets, at least 10 calls, trip
/// at 50% failures, open 5 s, leases of 3 s, forget 60 s after the open period.
const OPEN_MS: i64 = 5_000;
const LEASE_MS: u64 = 3_000;
const FORGET_MS: u64 = 60_000;

/// A key the fleet holds open: ms left, lease (0 none, 1 the caller's, 2 another's).
type Open = Vec<(String, i64, u8)>;

#[derive(Default)]
struct Sync<'a> {
    events: Vec<(&'a str, &'a str, u64)>,
    /// key, calls, failures, slow calls, wants the probe.
    reports: Vec<(&'a str, u32, u32, u32, bool)>,
}

async fn sync(conn: &mut MultiplexedConnection, me: &str, now: u64, s: Sync<'_>) -> Open {
    let script = redis::Script::new(include_str!("../scripts/breaker_sync.lua"));
    let mut inv = script.key(OPEN);
    inv.arg(BASE)
        .arg(me)
        .arg(now)
        .arg(10_000)
        .arg(1_000)
        .arg(10)
        .arg("0.5")
        .arg("")
        .arg(OPEN_MS)
        .arg(LEASE_MS)
        .arg(FORGET_MS)
        .arg(s.events.len());
    for (kind, key, ms) in &s.events {
        inv.arg(*kind).arg(*key).arg(*ms);
    }
    inv.arg(s.reports.len());
    for (key, c, f, sl, wants) in &s.reports {
        inv.arg(*key)
            .arg(*c)
            .arg(*f)
            .arg(*sl)
            .arg(if *wants { "1" } else { "0" });
    }
    let flat: Vec<String> = inv.invoke_async(conn).await.unwrap();
    flat.chunks_exact(3)
        .map(|c| (c[0].clone(), c[1].parse().unwrap(), c[2].parse().unwrap()))
        .collect()
}

fn report(calls: u32, failures: u32) -> Sync<'static> {
    Sync {
        reports: vec![(KEY, calls, failures, 0, false)],
        ..Sync::default()
    }
}

fn wants() -> Sync<'static> {
    Sync {
        reports: vec![(KEY, 0, 0, 0, true)],
        ..Sync::default()
    }
}

fn event(kind: &'static str, ms: u64) -> Sync<'static> {
    Sync {
        events: vec![(kind, KEY, ms)],
        ..Sync::default()
    }
}

async fn connect(server: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_fleet_window_trips_a_key_once_it_holds_the_minimum_calls() {
    let server = RedisServer::start();
    let mut c = connect(&server).await;
    assert_eq!(sync(&mut c, "a", T0, report(9, 9)).await, vec![]);
    // Another replica's success brings the fleet to the minimum, at 90% failures.
    let open = sync(&mut c, "b", T0 + 10, report(1, 0)).await;
    assert_eq!(open, vec![(KEY.to_owned(), OPEN_MS, 0)]);
    // The window starts afresh: the next period is judged on new evidence.
    let exists: bool = redis::cmd("EXISTS")
        .arg(format!("{BASE}win:{KEY}"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(!exists);
}

#[tokio::test]
async fn one_replica_failing_alone_is_outvoted_by_the_others_successes() {
    let server = RedisServer::start();
    let mut c = connect(&server).await;
    sync(&mut c, "b", T0, report(20, 0)).await;
    sync(&mut c, "c", T0, report(20, 0)).await;
    // 20 failures from one replica: 20 of 60 calls, under 50%.
    assert_eq!(sync(&mut c, "a", T0 + 10, report(20, 20)).await, vec![]);
}

#[tokio::test]
async fn buckets_older_than_the_window_no_longer_count() {
    let server = RedisServer::start();
    let mut c = connect(&server).await;
    sync(&mut c, "a", T0, report(9, 9)).await;
    // 11 s later the 9 failures have left the 10 s window: 1 call, no trip.
    assert_eq!(sync(&mut c, "a", T0 + 11_000, report(1, 1)).await, vec![]);
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(format!("{BASE}win:{KEY}"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(fields.len(), 2, "only the new bucket's fields: {fields:?}");
}

#[tokio::test]
async fn a_hint_opens_at_once_and_only_extends() {
    let server = RedisServer::start();
    let mut c = connect(&server).await;
    let open = sync(&mut c, "a", T0, event("hint", 30_000)).await;
    assert_eq!(open, vec![(KEY.to_owned(), 30_000, 0)]);
    let open = sync(&mut c, "b", T0 + 1_000, event("hint", 1_000)).await;
    assert_eq!(
        open,
        vec![(KEY.to_owned(), 29_000, 0)],
        "a shorter hint does not shorten"
    );
}

#[tokio::test]
async fn one_replica_wins_the_probe_lease_until_it_expires() {
    let server = RedisServer::start();
    let mut c = connect(&server).await;
    sync(&mut c, "a", T0, event("hint", 1_000)).await;
    // Before the open period ends nobody gets the lease.
    assert_eq!(
        sync(&mut c, "a", T0 + 500, wants()).await,
        vec![(KEY.to_owned(), 500, 0)]
    );
    let t = T0 + 1_000;
    assert_eq!(
        sync(&mut c, "a", t, wants()).await,
        vec![(KEY.to_owned(), 0, 1)]
    );
    assert_eq!(
        sync(&mut c, "b", t, wants()).await,
        vec![(KEY.to_owned(), 0, 2)]
    );
    // The lease lasts 3 s, then it is anyone's.
    let later = t + LEASE_MS;
    assert_eq!(
        sync(&mut c, "b", later, wants()).await,
        vec![(KEY.to_owned(), -(LEASE_MS as i64), 1)]
    );
}

#[tokio::test]
async fn only_the_lease_holder_closes_or_reopens_the_key() {
    let server = RedisServer::start();
    let mut c = connect(&server).await;
    sync(&mut c, "a", T0, event("hint", 1_000)).await;
    let t = T0 + 1_000;
    sync(&mut c, "a", t, wants()).await;
    // A replica without the lease: its half-open period was its own.
    let open = sync(&mut c, "b", t, event("closed", 0)).await;
    assert_eq!(open, vec![(KEY.to_owned(), 0, 2)]);
    // The holder's failed probe re-opens the key, for the period it says, and frees the lease.
    let open = sync(&mut c, "a", t + 10, event("reopen", 8_000)).await;
    assert_eq!(open, vec![(KEY.to_owned(), 8_000, 0)]);
    let t = t + 10 + 8_000;
    sync(&mut c, "b", t, wants()).await;
    // A late outcome from the former holder counts for nothing.
    let open = sync(&mut c, "a", t, event("closed", 0)).await;
    assert_eq!(open, vec![(KEY.to_owned(), 0, 2)]);
    // The holder's successful probe closes it for the fleet.
    assert_eq!(sync(&mut c, "b", t + 10, event("closed", 0)).await, vec![]);
    let lease: Option<String> = redis::cmd("GET")
        .arg(format!("{BASE}lease:{KEY}"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(lease, None);
}

#[tokio::test]
async fn a_key_nobody_probes_is_forgotten() {
    let server = RedisServer::start();
    let mut c = connect(&server).await;
    sync(&mut c, "a", T0, event("hint", 1_000)).await;
    let just_before = T0 + 1_000 + FORGET_MS;
    assert_eq!(
        sync(&mut c, "a", just_before, Sync::default()).await.len(),
        1
    );
    assert_eq!(
        sync(&mut c, "a", just_before + 1, Sync::default()).await,
        vec![]
    );
}
