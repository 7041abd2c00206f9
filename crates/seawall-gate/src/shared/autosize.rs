//! The auto-sizing mode's hold on the limit: it moves the configured limit (the adaptive
//! mode's ceiling) to the size [`AutoSize`](crate::AutoSize) computes.

use std::time::Duration;

use seawall_core::{RateLimitSnapshot, Usage};
use tokio::time::Instant;

use super::Shared;

impl Shared {
    /// Notes the limits a response (or an error) reported, when auto-sizing is on.
    pub(super) fn autosize_limits(&self, snapshot: Option<&RateLimitSnapshot>) {
        if let (Some(sizer), Some(s)) = (&self.sizer, snapshot) {
            sizer.limits(s);
        }
    }

    /// Notes a call that completed after holding its permit since `since`, and resizes when
    /// the sizer says so.
    pub(super) fn autosize_completed(&self, since: Option<Instant>, usage: Option<Usage>) {
        let (Some(sizer), Some(since)) = (&self.sizer, since) else {
            return;
        };
        let now = Instant::now();
        let held: Duration = now.saturating_duration_since(since);
        let Some(size) = sizer.completed(held, usage, now) else {
            return;
        };
        let mut c = self.control();
        if c.ceiling == size {
            return;
        }
        tracing::debug!(
            target: "seawall::gate",
            from = c.ceiling,
            to = size,
            "seawall gate: auto-sized"
        );
        c.ceiling = size;
        // The adaptive mode, when on, stays below the new ceiling; otherwise the size is the
        // limit.
        let current = if c.adaptive.is_some() {
            c.current.min(size)
        } else {
            size
        };
        self.apply(&mut c, current);
    }
}
