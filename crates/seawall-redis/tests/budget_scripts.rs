//! Each budget script on its own, run by hand against a real redis-server with raw keys and
//! arguments: what the store relies on, checked where it happens.

use redis::Script;
use redis::aio::MultiplexedConnection;
use seawall_test_support::RedisServer;

const COMMON: &str = include_str!("../scripts/budget_common.lua");

fn script(body: &str) -> Script {
    Script::new(&format!("{COMMON}\n{body}"))
}

fn reserve_script() -> Script {
    script(include_str!("../scripts/budget_reserve.lua"))
}

fn settle_script() -> Script {
    script(include_str!("../scripts/budget_settle.lua"))
}

fn read_script() -> Script {
    script(include_str!("../scripts/budget_read.lua"))
}

async fn connect(server: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// One line: counter `c{n}`, leases `l{n}`; a total window unless said otherwise.
struct Line {
    n: u32,
    limit: u64,
    kind: &'static str,
    arg: u64,
    soft: &'static str,
}

fn total(n: u32, limit: u64) -> Line {
    Line {
        n,
        limit,
        kind: "t",
        arg: 0,
        soft: "",
    }
}

async fn reserve(
    conn: &mut MultiplexedConnection,
    id: &str,
    now: u64,
    lease_end: u64,
    amount: u64,
    lines: &[Line],
) -> Vec<String> {
    let s = reserve_script();
    let mut inv = s.prepare_invoke();
    inv.key(format!("id:{id}"));
    for l in lines {
        inv.key(format!("c{}", l.n)).key(format!("l{}", l.n));
    }
    inv.arg(now)
        .arg(lease_end)
        .arg(60_000)
        .arg(amount)
        .arg(format!("{amount}:{id}"));
    for l in lines {
        inv.arg(l.limit).arg(l.kind).arg(l.arg).arg(l.soft).arg(0);
    }
    inv.invoke_async(conn).await.unwrap()
}

async fn settle(
    conn: &mut MultiplexedConnection,
    id: &str,
    now: u64,
    amount: u64,
    cost: u64,
    lines: &[Line],
) -> Vec<String> {
    let s = settle_script();
    let mut inv = s.prepare_invoke();
    inv.key(format!("id:{id}"));
    for l in lines {
        inv.key(format!("c{}", l.n)).key(format!("l{}", l.n));
    }
    inv.arg(now)
        .arg(60_000)
        .arg(amount)
        .arg(format!("{amount}:{id}"))
        .arg(cost);
    for l in lines {
        inv.arg(l.kind).arg(l.arg).arg(l.soft).arg(0);
    }
    inv.invoke_async(conn).await.unwrap()
}

async fn read(conn: &mut MultiplexedConnection, line: &Line, now: u64) -> (u64, u64) {
    let out: Vec<String> = read_script()
        .key(format!("c{}", line.n))
        .key(format!("l{}", line.n))
        .arg(now)
        .arg(line.kind)
        .arg(line.arg)
        .arg(line.soft)
        .arg(0)
        .invoke_async(conn)
        .await
        .unwrap();
    (out[0].parse().unwrap(), out[1].parse().unwrap())
}

#[tokio::test]
async fn reserve_takes_every_line_or_none() {
    let server = RedisServer::start();
    let mut c = connect(&server).await;
    let lines = [total(1, 100), total(2, 30)];
    assert_eq!(
        reserve(&mut c, "a", 0, 1_000, 20, &lines).await,
        ["ok", "0", "20", "0", "20"]
    );
    // The second line refuses: it reports its counter, and the first keeps only the first 20.
    assert_eq!(
        reserve(&mut c, "b", 0, 1_000, 20, &lines).await,
        ["no", "2", "0", "20"]
    );
    assert_eq!(read(&mut c, &lines[0], 0).await, (0, 20));
    assert_eq!(read(&mut c, &lines[1], 0).await, (0, 20));
}

#[tokio::test]
async fn reserve_repeated_with_the_same_id_is_a_no_op() {
    let server = RedisServer::start();
    let mut c = connect(&server).await;
    let lines = [total(1, 100)];
    assert_eq!(reserve(&mut c, "a", 0, 1_000, 20, &lines).await[0], "ok");
    assert_eq!(reserve(&mut c, "a", 0, 1_000, 20, &lines).await, ["seen"]);
    assert_eq!(read(&mut c, &lines[0], 0).await, (0, 20));
}

#[tokio::test]
async fn a_lease_that_ended_is_given_back_by_the_next_script() {
    let server = RedisServer::start();
    let mut c = connect(&server).await;
    let lines = [total(1, 100)];
    reserve(&mut c, "a", 0, 1_000, 70, &lines).await;
    // One millisecond before its end the lease still holds its 70.
    assert_eq!(
        reserve(&mut c, "b", 999, 5_000, 40, &lines).await,
        ["no", "1", "0", "70"]
    );
    assert_eq!(
        reserve(&mut c, "b", 1_000, 5_000, 40, &lines).await,
        ["ok", "0", "40"]
    );
    let leases: u64 = redis::cmd("ZCARD")
        .arg("l1")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(leases, 1);
    // Settled after its lease, the attempt's cost still counts; its reservation is not
    // removed twice.
    settle(&mut c, "a", 1_500, 70, 65, &lines).await;
    assert_eq!(read(&mut c, &lines[0], 1_500).await, (65, 40));
}

#[tokio::test]
async fn settle_replaces_the_reservation_once_per_id() {
    let server = RedisServer::start();
    let mut c = connect(&server).await;
    let lines = [total(1, 100), total(2, 100)];
    reserve(&mut c, "a", 0, 1_000, 20, &lines).await;
    settle(&mut c, "a", 10, 20, 35, &lines).await;
    settle(&mut c, "a", 10, 20, 35, &lines).await;
    assert_eq!(read(&mut c, &lines[0], 10).await, (35, 0));
    assert_eq!(read(&mut c, &lines[1], 10).await, (35, 0));
}

#[tokio::test]
async fn a_release_that_arrives_first_makes_the_late_reservation_a_no_op() {
    let server = RedisServer::start();
    let mut c = connect(&server).await;
    let lines = [total(1, 100)];
    settle(&mut c, "a", 0, 20, 0, &lines).await;
    assert_eq!(reserve(&mut c, "a", 0, 1_000, 20, &lines).await, ["seen"]);
    assert_eq!(read(&mut c, &lines[0], 0).await, (0, 0));
}

#[tokio::test]
async fn settle_reports_a_soft_threshold_once_per_window() {
    let server = RedisServer::start();
    let mut c = connect(&server).await;
    let day = |end: u64| Line {
        n: 1,
        limit: 100,
        kind: "c",
        arg: end,
        soft: "50",
    };
    let lines = [total(2, 1_000), day(86_400_000)];
    assert!(settle(&mut c, "a", 0, 0, 40, &lines).await.is_empty());
    assert_eq!(settle(&mut c, "b", 1, 0, 10, &lines).await, ["2", "50"]);
    assert!(settle(&mut c, "c", 2, 0, 10, &lines).await.is_empty());
    // The next day starts empty and may fire again.
    let next = [total(2, 1_000), day(2 * 86_400_000)];
    assert_eq!(
        settle(&mut c, "d", 86_400_000, 0, 55, &next).await,
        ["2", "55"]
    );
}

#[tokio::test]
async fn read_rolls_a_rolling_window_by_sub_window() {
    let server = RedisServer::start();
    let mut c = connect(&server).await;
    let at = |bucket: u64| Line {
        n: 1,
        limit: 100,
        kind: "r",
        arg: bucket,
        soft: "",
    };
    settle(&mut c, "a", 0, 0, 5, &[at(100)]).await;
    settle(&mut c, "b", 0, 0, 7, &[at(130)]).await;
    // 61 sub-windows are kept: the newest and the 60 before it.
    assert_eq!(read(&mut c, &at(160), 0).await, (12, 0));
    assert_eq!(read(&mut c, &at(161), 0).await, (7, 0));
    assert_eq!(read(&mut c, &at(400), 0).await, (0, 0));
}
