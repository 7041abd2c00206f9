//! The choices a user makes about unbounded and failed attempts, as plain data: the
//! [`CostBudgetBuilder`](crate::CostBudgetBuilder) stores them, the services read them.

use seawall_core::FailureClass;

/// What to do with a request that does not say how many tokens it may produce.
///
/// Without a maximum the cost of an attempt has no upper bound, so nothing can be reserved.
/// A maximum that bounds nothing (negative, not a number) counts as none; see
/// [`RequestMeta::parse`](seawall_core::RequestMeta::parse) for the values that are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingMaxOutput {
    /// Refuse it with `BudgetExceeded` (code `max_output_tokens_required`). The default: the
    /// layer does not change what a request asks for unless told to.
    #[default]
    Reject,
    /// Write this maximum into the request (`LlmRequest::set_max_output_tokens`) and reserve
    /// for it.
    Default(u32),
}

/// What an attempt that reported no usage is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Nothing: the reservation is released.
    Release,
    /// The reservation (the estimate, an upper bound of what it may have cost).
    ChargeEstimate,
}

/// The default settlement of a failed attempt that reported no usage.
///
/// Charged the estimate: the outcomes after which the upstream may have done, and billed,
/// the work: our attempt timeout (`Timeout`), `UpstreamTimeout` (504), `Disconnected` (lost
/// after sending) and `StreamInterrupted` (content had begun). Released: everything else,
/// which fails before the upstream bills: connection failures, 4xx, 429, 5xx rejections,
/// and local rejections by inner layers. A dropped call or body is charged the estimate too
/// (see [`CostBudgetBuilder::on_drop`](crate::CostBudgetBuilder::on_drop)).
pub const fn default_settlement(class: FailureClass) -> Settlement {
    match class {
        FailureClass::Timeout
        | FailureClass::UpstreamTimeout
        | FailureClass::Disconnected
        | FailureClass::StreamInterrupted => Settlement::ChargeEstimate,
        _ => Settlement::Release,
    }
}
