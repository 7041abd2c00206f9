//! The shared connection: answers within its timeout, says when it degrades, recovers on its
//! own after a restart, and never prints its URL.

use std::time::{Duration, Instant};

use seawall_redis::{SharedRedis, Unavailable};
use seawall_test_support::RedisServer;

async fn ping(redis: &SharedRedis) -> Result<String, Unavailable> {
    redis
        .run("test", |mut c| async move {
            redis::cmd("PING").query_async::<String>(&mut c).await
        })
        .await
}

#[tokio::test]
async fn a_call_answers_then_fails_fast_while_the_server_is_down_then_recovers() {
    let mut server = RedisServer::start();
    let redis = SharedRedis::builder(server.url())
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    assert_eq!(ping(&redis).await.unwrap(), "PONG");
    assert!(!redis.is_degraded());

    server.stop();
    let started = Instant::now();
    assert!(ping(&redis).await.is_err());
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    assert!(redis.is_degraded());
    assert!(redis.failures() >= 1);

    server.restart();
    let mut answered = false;
    for _ in 0..50 {
        if ping(&redis).await.is_ok() {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(answered, "the connection was not remade after the restart");
    assert!(!redis.is_degraded());
}

#[tokio::test]
async fn a_server_that_hangs_costs_a_call_its_timeout_and_no_more() {
    let server = RedisServer::start();
    let redis = SharedRedis::builder(server.url())
        .timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    assert!(ping(&redis).await.is_ok());
    // Another client makes the server busy for a second.
    let blocker = SharedRedis::builder(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let hang = tokio::spawn(async move {
        blocker
            .run("test", |mut c| async move {
                redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg(1)
                    .query_async::<()>(&mut c)
                    .await
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    let err = ping(&redis).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(err, Unavailable::TimedOut(Duration::from_millis(50)));
    assert!(took < Duration::from_millis(300), "{took:?}");
    hang.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_password_in_the_url_is_never_printed() {
    let redis = SharedRedis::new("redis://:hunter2-secret@127.0.0.1:1/").unwrap();
    assert!(!format!("{redis:?}").contains("hunter2"));
    let builder = SharedRedis::builder("redis://:hunter2-secret@127.0.0.1:1/");
    assert!(!format!("{builder:?}").contains("hunter2"));
    let err = SharedRedis::new("nonsense://:hunter2-secret@").unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
    let err = ping(&redis).await.unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}
