//! Polling a future again after it returned `Ready` is a caller's bug every seawall future
//! answers with the same panic; these helpers commit that bug on purpose.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Polls `fut` once, which must finish it, hands the output to `check`, then polls it again:
/// a test of the panic says `#[should_panic]`.
pub fn poll_again_after<F: Future>(fut: F, check: impl FnOnce(F::Output)) {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(out) => check(out),
        Poll::Pending => panic!("the first poll must finish the future"),
    }
    let _ = fut.as_mut().poll(&mut cx);
}

/// Polls `fut` once, which must finish it, then again.
pub fn poll_twice<F: Future>(fut: F) {
    poll_again_after(fut, drop);
}
