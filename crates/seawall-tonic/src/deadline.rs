//! The caller's deadline across gRPC: a gRPC client sends how long it will wait as the
//! `grpc-timeout` header, and the seawall stack a server calls the model through should stop
//! working when that client stops waiting (a retry's backoff, a fallback, a queued attempt
//! past it are money spent on an answer nobody reads).
//!
//! A tonic handler builds the stack's request itself, so the header does not reach the stack on
//! its own: [`deadline`] reads it from the tonic request, and the handler puts the
//! [`Deadline`] into the extensions of the request it sends down the stack. The other
//! direction, a stack around a tonic client, hands what is left of its deadline to the server
//! with [`set_deadline`].

use seawall_core::{Deadline, parse_grpc_timeout};

/// The header gRPC carries a call's timeout in.
const GRPC_TIMEOUT: &str = "grpc-timeout";

/// The deadline the client of `request` sent (its `grpc-timeout`), counted from now; `None`
/// when it sent none or one that does not parse (a malformed hint never fails a call).
///
/// ```
/// use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let mut request = tonic::Request::new(());
/// request.set_timeout(Duration::from_millis(1500));
/// let deadline = seawall_tonic::deadline(&request).expect("the client sent a timeout");
/// assert_eq!(deadline.remaining(), Duration::from_millis(1500));
///
/// // In a handler: the stack's request carries it, and every layer inside respects it.
/// let mut llm_request = http::Request::new(bytes::Bytes::new());
/// llm_request.extensions_mut().insert(deadline);
/// # }
/// ```
pub fn deadline<T>(request: &tonic::Request<T>) -> Option<Deadline> {
    let value = request.metadata().get(GRPC_TIMEOUT)?.to_str().ok()?;
    parse_grpc_timeout(value).map(Deadline::after)
}

/// Tells the server of a gRPC call how long this caller will wait: what is left of
/// `deadline`, as the call's `grpc-timeout` (zero once it has passed).
pub fn set_deadline<T>(request: &mut tonic::Request<T>, deadline: Deadline) {
    request.set_timeout(deadline.remaining());
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_deadline_set_on_a_request_reads_back_and_garbage_is_ignored() {
        let mut request = tonic::Request::new(());
        assert!(deadline(&request).is_none());
        set_deadline(&mut request, Deadline::after(Duration::from_secs(3)));
        assert_eq!(
            deadline(&request).unwrap().remaining(),
            Duration::from_secs(3)
        );
        // A deadline already passed still says "no time left" rather than "no deadline".
        set_deadline(&mut request, Deadline::after(Duration::ZERO));
        assert!(deadline(&request).unwrap().has_passed());
        request
            .metadata_mut()
            .insert(GRPC_TIMEOUT, "soon".parse().unwrap());
        assert!(deadline(&request).is_none());
    }
}
