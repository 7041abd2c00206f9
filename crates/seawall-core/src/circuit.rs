//! What a retry that is waiting to try again can learn from the circuit breaker below it.
//!
//! The retry layer sits outside the breaker, so that the breaker counts every attempt. When an
//! attempt fails, the retry waits before the next one (after an overload, at least 5 s), and
//! in an incident the breaker often opens during that wait, on the failures of the other calls
//! in flight. The retry then wakes only to be refused, and a fallback layer outside gets the
//! call only then: the whole wait is lost, at the start of every incident, for every call that
//! failed just before the breaker opened.
//!
//! So a breaker attaches a [`Circuit`] to the error of each admitted attempt that failed
//! ([`LlmError::set_circuit`]), and a retry about to wait asks it for the refusal of the
//! attempt it would make when the wait ends ([`Circuit::refusal_at`]). That future completes
//! with the error the breaker would refuse the attempt with, as soon as the circuit is open
//! until at least then. The retry ends the call with that error at once: the outcome the
//! wait would have led to, without the wait. A circuit that opens but will have gone half-open
//! by the end of the wait cuts nothing short (the attempt may then be its probe).

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
