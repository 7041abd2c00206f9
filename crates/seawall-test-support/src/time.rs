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
