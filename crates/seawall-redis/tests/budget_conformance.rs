//! The Redis budget store passes the same conformance tests as the in-process store: the same
//! admissions, windows, keys and soft-limit reports, each against its own real redis-server.

use std::time::Duration;

use seawall_redis::{RedisBudgetStore, SharedRedis};
use seawall_test_support::RedisServer;

async fn fixture() -> (RedisBudgetStore, RedisServer) {
    let server = RedisServer::start();
    // Generous: the machine running the tests may be busy, and these test behaviour, not speed.
    let redis = SharedRedis::builder(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    (RedisBudgetStore::new(redis), server)
}

seawall_test_support::budget_store_conformance!(fixture());
