//! [`ContextPolicy`]: what the guard does with a request that does not fit.

/// What a [`ContextGuardLayer`](crate::ContextGuardLayer) does with a request whose prompt
/// plus maximum output does not fit its model's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ContextPolicy {
    /// Fail at once with a `ContextLengthExceeded` error: no upstream call. A fallback layer
    /// outside the guard then sends the request to its larger-context list. The default.
    #[default]
    Refuse,
    /// Drop the oldest conversation turns until it fits: never a system prompt, never the
    /// last user turn, and an assistant's tool calls always with their results. When even
    /// the last turn alone does not fit, refuse.
    TrimOldest,
    /// Lower `max_tokens` (and `max_completion_tokens` / `max_output_tokens`, whichever the
    /// body has) to the room the prompt leaves, unless that is below `floor` tokens (or the
    /// bound asked for, if smaller): then refuse. A bound above the model's output limit is
    /// lowered to the limit.
    LowerMaxTokens {
        /// The fewest output tokens worth sending the request for.
        floor: u32,
    },
}

impl ContextPolicy {
    /// [`ContextPolicy::LowerMaxTokens`] with a floor of `floor` output tokens.
    pub const fn lower_max_tokens(floor: u32) -> Self {
        ContextPolicy::LowerMaxTokens { floor }
    }
}
