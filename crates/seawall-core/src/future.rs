//! What a seawall future does when it is polled again after it returned `Poll::Ready`.
//!
//! Polling a finished future is a bug in the caller, and tower's own futures answer it with
//! a panic. seawall's futures do the same, in every crate, with one message: answering with
//! an error instead would disguise the caller's bug as an upstream failure, and the layers
//! outside (retry, breaker, fallback) would act on it — retry it, count it against a
//! provider, switch to another model.

/// The message every seawall future panics with when polled after completion.
pub const POLLED_AFTER_COMPLETION: &str = "seawall: future polled after completion";

/// Panics with [`POLLED_AFTER_COMPLETION`].
///
/// Call it from the branch of a `poll` that only a caller polling a finished future reaches.
#[cold]
#[track_caller]
pub fn polled_after_completion() -> ! {
    panic!("{POLLED_AFTER_COMPLETION}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "seawall: future polled after completion")]
    fn panics_with_the_shared_message() {
        polled_after_completion();
    }
}
