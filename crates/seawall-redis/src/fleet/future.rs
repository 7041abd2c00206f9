//! The fleet limit's response future: waits for the fleet's admission, then runs the call
//! holding its [`FleetPermit`], which it hands to the response.

use seawall_core::AdmitFuture;

use super::permit::FleetPermit;

/// The response future of [`FleetLimit`](super::FleetLimit): waits for the fleet's
/// admission, calls the inner service, and attaches the permit to the response.
///
/// Dropping it at any point gives back what it holds: a wait leaves nothing behind, an
/// admission in flight queues the cancellation of its hold, a call in flight ends its hold.
pub type ResponseFuture<S, Req, F> = AdmitFuture<S, Req, F, FleetPermit>;
