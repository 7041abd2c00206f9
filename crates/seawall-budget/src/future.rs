//! [`ResponseFuture`]: admission (if the store is remote), then the attempt.

use seawall_core::AdmitFuture;

use crate::guard::BudgetGuard;

/// The response future of [`CostBudget`](crate::CostBudget): waits for a remote store's
/// admission if it must, calls the inner service with the reservation armed, and attaches the
/// [`BudgetGuard`] to the response, which settles the attempt when the body ends.
pub type ResponseFuture<F, S, Req> = AdmitFuture<S, Req, F, BudgetGuard>;
