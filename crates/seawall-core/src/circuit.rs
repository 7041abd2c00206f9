//! What a retry that is waiting to try again can learn from the circuit breaker below it:
//! whether that breaker will refuse the attempt the wait is for (the why is on [`Circuit`]).
//!
//! A trait in core, so that the retry layer and the breaker, each in its own crate, meet
//! through the error of the failed attempt and neither depends on the other.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::time::Instant;

use crate::error::LlmError;

/// The refusal a breaker will give an attempt: see [`Circuit::refusal_at`].
pub type Refusal = Pin<Box<dyn Future<Output = LlmError> + Send>>;

/// The circuit breaker a failed attempt went through, as a retry waiting to send the call back
/// through it sees it.
///
/// A retry waits before its next attempt (after an overload, at least 5 s), and in an
/// incident the breaker below it often opens during that wait, on the failures of the other
/// calls in flight. Without this, the retry would wake only to be refused, and a fallback
/// outside would get the call only then. A breaker attaches one to the error of each attempt
/// it admitted that failed ([`LlmError::set_circuit`]); a retry about to wait asks it for the
/// refusal of the attempt it would make when the wait ends, and ends the call with that
/// refusal as soon as it comes: the outcome the wait would have led to, without the wait.
pub trait Circuit: Send + Sync {
    /// A future that completes, with the error an attempt made at `at` would be refused with,
    /// once the circuit is open until `at` or later (at once if it already is). It stays
    /// pending while the circuit would admit the attempt.
    fn refusal_at(self: Arc<Self>, at: Instant) -> Refusal;
}
