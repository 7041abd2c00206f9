//! Paused time: tests that wait out minutes of backoff, windows and outages run in
//! microseconds, and always the same way.

use tokio::runtime::{Builder, Runtime};

/// A current-thread runtime whose clock starts paused, for a test (a property test, say) that
/// cannot be a `#[tokio::test(start_paused = true)]`.
pub fn paused_runtime() -> Runtime {
    Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}

/// Lets every spawned task run as far as it can without moving the clock.
pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Polls `condition` every 10 ms of real time until it holds, for at most `within`; whether it
/// did. For tests on real time (a real Redis) that wait for a background effect: they poll
/// the effect with a deadline instead of sleeping a guessed time.
pub async fn eventually<F, Fut>(within: std::time::Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + within;
    loop {
        if condition().await {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
