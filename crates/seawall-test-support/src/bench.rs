//! The smallest typed request and response, for the benches: they must measure a layer, not
//! the cost of building, cloning or dropping a rich test request.

use seawall_core::{Completion, LlmRequest, LlmResponse, OnComplete, Outcome, Usage};

/// A typed request as an SDK wrapper would have it: a static model name and a token estimate;
/// no extensions, `Copy`.
#[derive(Debug, Clone, Copy)]
pub struct Bare {
    /// The model (and the key of per-model state).
    pub model: &'static str,
    /// The estimated input tokens.
    pub input: u32,
    /// The maximum output tokens.
    pub max: Option<u32>,
}

impl LlmRequest for Bare {
    fn model(&self) -> Option<&str> {
        Some(self.model)
    }
    fn max_output_tokens(&self) -> Option<u32> {
        self.max
    }
    fn estimated_input_tokens(&self) -> u32 {
        self.input
    }
}

/// A fully-read response without usage: its completion hook fires at once.
#[derive(Debug, Clone, Copy)]
pub struct Done;

impl LlmResponse for Done {
    type Hooked<G: OnComplete> = Done;
    fn usage(&self) -> Option<Usage> {
        None
    }
    fn on_complete<G: OnComplete>(self, hook: G) -> Done {
        hook.on_complete(Completion {
            outcome: Outcome::Complete,
            report: None,
            usage: None,
        });
        self
    }
}

/// Tells `hook` that a fully-read response without a report or usage is complete: what the
/// `on_complete` of a test's own response type does.
pub fn complete_now<G: OnComplete>(hook: G) {
    hook.on_complete(Completion {
        outcome: Outcome::Complete,
        report: None,
        usage: None,
    });
}
