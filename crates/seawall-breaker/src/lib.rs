//! seawall-breaker: not written yet.
