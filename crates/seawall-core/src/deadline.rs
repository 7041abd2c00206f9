//! A call's deadline, carried by the request so that every layer inside respects it.
//!
//! A caller that gives up after 10 s gains nothing from work done after 10 s, and pays for it:
//! a retry's backoff that sleeps past the deadline, a gate that queues past it, a fallback
//! started a second before it. Each layer has its own bound (a retry time budget, a gate's
//! maximum wait, a stream's idle timeout); the deadline is the caller's, and each bound is
//! cut to what remains of it ([`Deadline::bound`]). A call found past its deadline fails
//! with [`FailureClass::DeadlineExceeded`] before it spends anything ([`Deadline::check`]).
//!
//! Where it comes from, the earliest one winning:
//! - a [`Deadline`] in the request's extensions (set it in code, or in an outer layer);
//! - a `grpc-timeout` header (gRPC's format: up to 8 digits and a unit, `H M S m u n`);
//! - an `x-seawall-timeout` header, or the `x-stainless-timeout` header that the official
//!   OpenAI and Anthropic SDKs send with their own timeout: seconds, decimals allowed.
//!
//! A header's timeout counts from the moment the request is first [prepared]: the
//! outermost seawall layer turns it into a [`Deadline`] extension there, so every layer
//! inside sees the same instant. Headers that do not parse are ignored, never an error: a
//! malformed hint must not fail a call the caller would otherwise get.
//!
//! [prepared]: crate::LlmRequest::prepare

use std::time::Duration;

use http::{HeaderMap, HeaderName};
use tokio::time::Instant;

use crate::class::FailureClass;
use crate::error::LlmError;
use crate::time::instant_after;

/// When the caller stops waiting for a call. Insert it into a request's extensions, or let a
/// header set it: `grpc-timeout` (gRPC's format), [`TIMEOUT_HEADER`] or the SDKs'
/// `x-stainless-timeout` (seconds), read once, the earliest winning, when the request is first
/// [prepared](crate::LlmRequest::prepare).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(Instant);

/// The header seawall reads a caller's timeout from: seconds, decimals allowed.
pub const TIMEOUT_HEADER: &str = "x-seawall-timeout";

/// The header the official OpenAI and Anthropic SDKs send with their own timeout, in seconds.
const STAINLESS_TIMEOUT_HEADER: &str = "x-stainless-timeout";

impl Deadline {
    /// A deadline at `at`.
    pub fn at(at: Instant) -> Self {
        Deadline(at)
    }

    /// A deadline `timeout` from now (far in the future if that does not fit the clock).
    pub fn after(timeout: Duration) -> Self {
        Deadline(instant_after(Instant::now(), timeout))
    }

    /// The instant.
    pub fn instant(&self) -> Instant {
        self.0
    }

    /// The time left, zero once it has passed.
    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// Whether it has passed.
    pub fn has_passed(&self) -> bool {
        Instant::now() >= self.0
    }

    /// A layer's own bound cut to what is left: `min(bound, remaining)`.
    pub fn bound(&self, bound: Duration) -> Duration {
        bound.min(self.remaining())
    }

    /// The earlier of a layer's own deadline and this one.
    pub fn earliest(deadline: Option<Deadline>, other: Option<Deadline>) -> Option<Deadline> {
        match (deadline, other) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// `Err(DeadlineExceeded)` once the deadline has passed; layers call it before they spend.
    pub fn check(&self) -> Result<(), LlmError> {
        if self.has_passed() {
            Err(self.exceeded())
        } else {
            Ok(())
        }
    }

    /// The error of a call past its deadline.
    pub fn exceeded(&self) -> LlmError {
        LlmError::new(
            FailureClass::DeadlineExceeded,
            "the caller's deadline passed before the call could finish",
        )
    }

    /// The deadline the headers ask for, counted from now, or `None` when none parses.
    pub fn from_headers(headers: &HeaderMap) -> Option<Deadline> {
        // Looked up by ready-made names: a lookup by `&str` parses the name on every call.
        const GRPC: HeaderName = HeaderName::from_static("grpc-timeout");
        const OWN: HeaderName = HeaderName::from_static(TIMEOUT_HEADER);
        const STAINLESS: HeaderName = HeaderName::from_static(STAINLESS_TIMEOUT_HEADER);
        // One pass over the names present, not three lookups: a lookup hashes its name, and
        // most requests carry none of the three (a name compares unequal at its kind or
        // length). The first value of each name, as `get` would give.
        let [mut grpc, mut own, mut stainless] = [None; 3];
        for (name, value) in headers {
            let slot = if *name == GRPC {
                &mut grpc
            } else if *name == OWN {
                &mut own
            } else if *name == STAINLESS {
                &mut stainless
            } else {
                continue;
            };
            slot.get_or_insert(value);
        }
        let grpc = grpc
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout);
        let secs = [own, stainless]
            .into_iter()
            .filter_map(|v| v?.to_str().ok())
            .filter_map(parse_seconds)
            .min();
        let timeout = match (grpc, secs) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        Some(Deadline::after(timeout))
    }
}

/// Parses gRPC's `grpc-timeout` value: 1 to 8 ASCII digits and a unit (`H` hours, `M`
/// minutes, `S` seconds, `m` milliseconds, `u` microseconds, `n` nanoseconds).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let value = value.trim();
    // The unit must be ASCII: splitting before a multi-byte last character would panic.
    if !value.is_ascii() {
        return None;
    }
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Parses a timeout in seconds (`"10"`, `"2.5"`); negative, non-finite and absurd values
/// (over a year) are refused.
fn parse_seconds(value: &str) -> Option<Duration> {
    let secs: f64 = value.trim().parse().ok()?;
    (secs.is_finite() && (0.0..=31_536_000.0).contains(&secs))
        .then(|| Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn grpc_timeouts_parse_in_every_unit_and_refuse_the_malformed() {
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("10S"), Some(Duration::from_secs(10)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "S", "123456789S", "10s", "1.5S", "-1S", "10", "é", "1é"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_earliest_header_wins_and_garbage_is_ignored() {
        let mut h = HeaderMap::new();
        assert_eq!(Deadline::from_headers(&h), None);
        h.insert("grpc-timeout", HeaderValue::from_static("5S"));
        h.insert(TIMEOUT_HEADER, HeaderValue::from_static("2.5"));
        h.insert(STAINLESS_TIMEOUT_HEADER, HeaderValue::from_static("600"));
        let d = Deadline::from_headers(&h).expect("a deadline");
        assert_eq!(d.remaining(), Duration::from_millis(2500));
        h.insert(TIMEOUT_HEADER, HeaderValue::from_static("NaN"));
        assert_eq!(
            Deadline::from_headers(&h).unwrap().remaining(),
            Duration::from_secs(5)
        );
        h.remove("grpc-timeout");
        h.insert(TIMEOUT_HEADER, HeaderValue::from_static("-3"));
        assert_eq!(
            Deadline::from_headers(&h).unwrap().remaining(),
            Duration::from_secs(600)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeated_timeout_header_is_read_by_its_first_value_among_other_headers() {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/json"));
        h.insert("x-stainless-runtime", HeaderValue::from_static("CPython"));
        h.append(STAINLESS_TIMEOUT_HEADER, HeaderValue::from_static("30"));
        h.append(STAINLESS_TIMEOUT_HEADER, HeaderValue::from_static("1"));
        h.insert("grpc-timeoutx", HeaderValue::from_static("1S"));
        assert_eq!(
            Deadline::from_headers(&h).unwrap().remaining(),
            Duration::from_secs(30)
        );
        h.append("grpc-timeout", HeaderValue::from_static("20S"));
        h.append("grpc-timeout", HeaderValue::from_static("2S"));
        assert_eq!(
            Deadline::from_headers(&h).unwrap().remaining(),
            Duration::from_secs(20)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_cuts_bounds_and_fails_once_passed() {
        let d = Deadline::after(Duration::from_secs(10));
        assert_eq!(d.bound(Duration::from_secs(30)), Duration::from_secs(10));
        assert_eq!(d.bound(Duration::from_secs(3)), Duration::from_secs(3));
        assert!(d.check().is_ok());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(d.has_passed());
        assert_eq!(d.remaining(), Duration::ZERO);
        let err = d.check().unwrap_err();
        assert_eq!(err.class(), FailureClass::DeadlineExceeded);
        let later = Deadline::after(Duration::from_secs(1));
        assert_eq!(Deadline::earliest(Some(later), Some(d)), Some(d));
        assert_eq!(Deadline::earliest(None, Some(d)), Some(d));
        assert!(Deadline::after(Duration::MAX).remaining() > Duration::from_secs(1 << 20));
    }
}
