//! Each fleet script on its own, against a real redis-server: the bucket arithmetic, the
//! pause, the permits and leases, and the once-only settlement the layer relies on.

use std::time::Duration;

use seawall_redis::fleet::{ACQUIRE, PAUSE, RENEW, SETTLE};
use seawall_redis::{SharedRedis, redis};
use seawall_test_support::RedisServer;

const B: &str = "t:fleet:{k}:b";
const H: &str = "t:fleet:{k}:h";
const P: &str = "t:fleet:{k}:p";

/// A connection with a generous timeout: these tests check the scripts, not the timeout.
fn connect(server: &RedisServer) -> SharedRedis {
    SharedRedis::builder(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Limits as the scripts take them: `None` is -1 (no limit).
#[derive(Clone, Copy)]
struct Lim {
    rpm: i64,
    rburst: i64,
    tpm: i64,
    tburst: i64,
    permits: i64,
}

const NONE: Lim = Lim {
    rpm: -1,
    rburst: 0,
    tpm: -1,
    tburst: 0,
    permits: -1,
};

async fn acquire(r: &SharedRedis, now: u64, id: &str, l: Lim, cost: u64) -> (i64, u64, String) {
    let script = redis::Script::new(ACQUIRE);
    let mut inv = script.prepare_invoke();
    inv.key(B)
        .key(H)
        .key(P)
        .arg(now)
        .arg(id)
        .arg(30_000)
        .arg(l.rpm)
        .arg(l.rburst)
        .arg(l.tpm)
        .arg(l.tburst)
        .arg(cost)
        .arg(l.permits)
        .arg(25);
    r.run(
        "test",
        |mut c| async move { inv.invoke_async(&mut c).await },
    )
    .await
    .unwrap()
}

async fn settle(
    r: &SharedRedis,
    now: u64,
    id: &str,
    l: Lim,
    reserved: u64,
    used: u64,
    mode: &str,
) -> i64 {
    let script = redis::Script::new(SETTLE);
    let mut inv = script.prepare_invoke();
    inv.key(B)
        .key(H)
        .arg(now)
        .arg(id)
        .arg(l.rpm)
        .arg(l.rburst)
        .arg(l.tpm)
        .arg(l.tburst)
        .arg(reserved)
        .arg(used)
        .arg(mode);
    r.run(
        "test",
        |mut c| async move { inv.invoke_async(&mut c).await },
    )
    .await
    .unwrap()
}

async fn field(r: &SharedRedis, f: &str) -> Option<f64> {
    let f = f.to_owned();
    let v: Option<String> = r
        .run("test", |mut c| async move {
            redis::cmd("HGET").arg(B).arg(f).query_async(&mut c).await
        })
        .await
        .unwrap();
    v.map(|s| s.parse().unwrap())
}

async fn holds(r: &SharedRedis) -> Vec<(String, u64)> {
    r.run("test", |mut c| async move {
        redis::cmd("ZRANGE")
            .arg(H)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut c)
            .await
    })
    .await
    .unwrap()
}

fn admitted(a: &(i64, u64, String)) -> bool {
    a.0 == 1
}

#[tokio::test]
async fn acquire_takes_one_request_and_the_tokens_and_leases_a_hold() {
    let server = RedisServer::start();
    let r = connect(&server);
    let l = Lim {
        rpm: 60,
        rburst: 10,
        tpm: 6_000,
        tburst: 1_000,
        permits: -1,
    };
    let a = acquire(&r, 1_000, "a", l, 300).await;
    assert_eq!(a, (1, 0, "admitted".to_owned()));
    assert_eq!(field(&r, "r").await, Some(9.0));
    assert_eq!(field(&r, "t").await, Some(700.0));
    assert_eq!(holds(&r).await, vec![("a".to_owned(), 31_000)]);
}

#[tokio::test]
async fn acquire_answers_the_refill_time_and_admits_once_the_clock_gets_there() {
    let server = RedisServer::start();
    let r = connect(&server);
    // One request a second, a burst of two.
    let l = Lim {
        rpm: 60,
        rburst: 2,
        ..NONE
    };
    assert!(admitted(&acquire(&r, 0, "a", l, 0).await));
    assert!(admitted(&acquire(&r, 0, "b", l, 0).await));
    assert_eq!(
        acquire(&r, 0, "c", l, 0).await,
        (0, 1_000, "requests".to_owned())
    );
    assert_eq!(
        acquire(&r, 400, "c", l, 0).await,
        (0, 600, "requests".to_owned())
    );
    assert!(admitted(&acquire(&r, 1_000, "c", l, 0).await));
    // A refused call took nothing: the next is due a second after the last admission.
    assert_eq!(
        acquire(&r, 1_000, "d", l, 0).await,
        (0, 1_000, "requests".to_owned())
    );
}

#[tokio::test]
async fn a_cost_above_the_burst_goes_on_a_full_bucket_and_leaves_debt() {
    let server = RedisServer::start();
    let r = connect(&server);
    // 600 tokens a minute (10 a second), a burst of 100.
    let l = Lim {
        tpm: 600,
        tburst: 100,
        ..NONE
    };
    assert!(admitted(&acquire(&r, 0, "big", l, 250).await));
    assert_eq!(field(&r, "t").await, Some(-150.0));
    // 160 tokens at 10 a second before a call of 10 fits.
    assert_eq!(
        acquire(&r, 0, "next", l, 10).await,
        (0, 16_000, "tokens".to_owned())
    );
}

#[tokio::test]
async fn acquire_under_an_id_already_admitted_takes_nothing_twice() {
    let server = RedisServer::start();
    let r = connect(&server);
    let l = Lim {
        rpm: 60,
        rburst: 10,
        ..NONE
    };
    assert_eq!(acquire(&r, 0, "a", l, 0).await.2, "admitted");
    assert_eq!(acquire(&r, 0, "a", l, 0).await, (1, 0, "held".to_owned()));
    assert_eq!(field(&r, "r").await, Some(9.0));
}

#[tokio::test]
async fn a_zero_limit_is_never() {
    let server = RedisServer::start();
    let r = connect(&server);
    let l = Lim {
        rpm: 0,
        rburst: 1,
        ..NONE
    };
    assert_eq!(acquire(&r, 0, "a", l, 0).await, (-1, 0, "zero".to_owned()));
}

#[tokio::test]
async fn the_pause_stops_admissions_until_it_ends_and_a_later_pause_wins() {
    let server = RedisServer::start();
    let r = connect(&server);
    let pause = |now: u64, ms: u64| {
        let r = r.clone();
        async move {
            let script = redis::Script::new(PAUSE);
            let mut inv = script.prepare_invoke();
            inv.key(P).arg(now).arg(ms);
            r.run("test", |mut c| async move {
                inv.invoke_async::<i64>(&mut c).await
            })
            .await
            .unwrap()
        }
    };
    assert_eq!(pause(1_000, 5_000).await, 1);
    // A shorter pause does not cut the longer one.
    assert_eq!(pause(2_000, 1_000).await, 0);
    assert_eq!(
        acquire(&r, 3_000, "a", NONE, 0).await,
        (0, 3_000, "paused".to_owned())
    );
    assert_eq!(pause(3_000, 10_000).await, 1);
    assert_eq!(
        acquire(&r, 3_000, "a", NONE, 0).await,
        (0, 10_000, "paused".to_owned())
    );
    assert!(admitted(&acquire(&r, 13_000, "a", NONE, 0).await));
    // The key expires with the pause (server time; a lease of TTL, not a decision).
    let ttl: i64 = r
        .run("test", |mut c| async move {
            redis::cmd("PTTL").arg(P).query_async(&mut c).await
        })
        .await
        .unwrap();
    assert!(ttl > 0 && ttl <= 10_000, "{ttl}");
}

#[tokio::test]
async fn permits_count_live_holds_and_a_hold_past_its_lease_frees_its_permit() {
    let server = RedisServer::start();
    let r = connect(&server);
    let l = Lim { permits: 2, ..NONE };
    assert!(admitted(&acquire(&r, 0, "a", l, 0).await));
    assert!(admitted(&acquire(&r, 10, "b", l, 0).await));
    assert_eq!(
        acquire(&r, 20, "c", l, 0).await,
        (0, 25, "permits".to_owned())
    );
    // "a" was leased until 30 000: at that moment it is gone.
    assert_eq!(acquire(&r, 29_999, "c", l, 0).await.2, "permits");
    assert_eq!(acquire(&r, 30_000, "c", l, 0).await.2, "admitted");
    let ids: Vec<String> = holds(&r).await.into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, ["b", "c"]);
}

#[tokio::test]
async fn settle_gives_back_unused_tokens_up_to_the_burst_and_charges_an_overrun() {
    let server = RedisServer::start();
    let r = connect(&server);
    let l = Lim {
        rpm: 60,
        rburst: 10,
        tpm: 6_000,
        tburst: 1_000,
        permits: -1,
    };
    acquire(&r, 0, "a", l, 500).await;
    acquire(&r, 0, "b", l, 400).await;
    assert_eq!(field(&r, "t").await, Some(100.0));
    // "a" used 200 of its 500.
    assert_eq!(settle(&r, 0, "a", l, 500, 200, "settle").await, 1);
    assert_eq!(field(&r, "t").await, Some(400.0));
    // "b" used 1 000 of its 400: 600 of debt.
    assert_eq!(settle(&r, 0, "b", l, 400, 1_000, "settle").await, 1);
    assert_eq!(field(&r, "t").await, Some(-200.0));
    // The request is not given back for a call that went.
    assert_eq!(field(&r, "r").await, Some(8.0));
    assert!(holds(&r).await.is_empty());
    // Giving back never fills past the burst.
    acquire(&r, 60_000, "c", l, 900).await;
    settle(&r, 60_000, "c", l, 900, 0, "settle").await;
    assert_eq!(field(&r, "t").await, Some(1_000.0));
}

#[tokio::test]
async fn a_settlement_sent_twice_or_for_an_unknown_hold_changes_nothing() {
    let server = RedisServer::start();
    let r = connect(&server);
    let l = Lim {
        tpm: 6_000,
        tburst: 1_000,
        ..NONE
    };
    acquire(&r, 0, "a", l, 500).await;
    assert_eq!(settle(&r, 0, "a", l, 500, 900, "settle").await, 1);
    assert_eq!(field(&r, "t").await, Some(100.0));
    assert_eq!(settle(&r, 0, "a", l, 500, 900, "settle").await, 0);
    assert_eq!(settle(&r, 0, "never", l, 500, 0, "cancel").await, 0);
    assert_eq!(field(&r, "t").await, Some(100.0));
}

#[tokio::test]
async fn cancel_gives_back_the_request_and_every_token_of_a_call_that_never_went() {
    let server = RedisServer::start();
    let r = connect(&server);
    let l = Lim {
        rpm: 60,
        rburst: 10,
        tpm: 6_000,
        tburst: 1_000,
        permits: 1,
    };
    acquire(&r, 0, "a", l, 500).await;
    assert_eq!(settle(&r, 0, "a", l, 500, 0, "cancel").await, 1);
    assert_eq!(field(&r, "r").await, Some(10.0));
    assert_eq!(field(&r, "t").await, Some(1_000.0));
    // And its permit.
    assert!(admitted(&acquire(&r, 0, "b", l, 0).await));
}

#[tokio::test]
async fn renew_extends_live_holds_and_never_brings_back_an_ended_one() {
    let server = RedisServer::start();
    let r = connect(&server);
    let l = Lim { permits: 5, ..NONE };
    acquire(&r, 0, "a", l, 0).await;
    acquire(&r, 0, "b", l, 0).await;
    settle(&r, 0, "b", l, 0, 0, "settle").await;
    let renew = |now: u64, ids: &'static [&'static str]| {
        let r = r.clone();
        async move {
            let script = redis::Script::new(RENEW);
            let mut inv = script.prepare_invoke();
            inv.key(H).arg(now).arg(30_000);
            for id in ids {
                inv.arg(*id);
            }
            r.run("test", |mut c| async move {
                inv.invoke_async::<i64>(&mut c).await
            })
            .await
            .unwrap()
        }
    };
    assert_eq!(renew(20_000, &["a", "b"]).await, 1);
    assert_eq!(holds(&r).await, vec![("a".to_owned(), 50_000)]);
    // Past its lease a hold is not renewed: its permit may be another call's.
    assert_eq!(renew(50_000, &["a"]).await, 0);
    assert_eq!(holds(&r).await, vec![("a".to_owned(), 50_000)]);
}
