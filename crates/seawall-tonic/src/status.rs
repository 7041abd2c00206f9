//! An [`LlmError`] as the `tonic::Status` a gRPC client expects.
//!
//! A tonic server whose handler calls an LLM through the seawall stack ends a failed call with
//! a `Status`. The code is what a gRPC client (and its retry policy) acts on, so it follows the
//! meaning of the gRPC codes rather than the upstream's HTTP status; the details carry the rest
//! in the google.rpc error model, which gRPC clients already know how to read:
//!
//! - `google.rpc.ErrorInfo`: `reason` is the class's stable name in upper case
//!   (`RATE_LIMITED`, as the error model asks of a reason), `domain` is [`ERROR_DOMAIN`]. It
//!   tells apart classes that share a code (a rate limit and an exhausted quota are both
//!   `RESOURCE_EXHAUSTED`), and [`classify_status`](crate::classify_status) reads it back.
//! - `google.rpc.RetryInfo`, when the error has a retry hint ([`LlmError::retry_hint`]), and
//!   the same delay as `grpc-retry-pushback-ms` metadata, which gRPC clients with a retry
//!   policy honour (the gRPC client retry design, "pushback"). A spent quota or budget
//!   without a hint gets a pushback of `-1`, the design's "do not retry": its code is also a
//!   rate limit's, which retry policies often list as retryable.
//!
//! The message is one fixed sentence per class. The upstream's own message, code and request
//! id stay behind: they can name the server's account, organisation or key, and a caller
//! cannot act on them anyway. Log the [`LlmError`] (redacted) for the operator.
//!
//! Which code for which class is decided in one `match`, one arm per class. `FailureClass` is
//! `#[non_exhaustive]`, so Rust insists on a last wildcard arm in another crate; what forces a
//! decision for a class added later is the unit test's table, an array of exactly
//! `FailureClass::COUNT` entries, which stops compiling until the new class is in it (and, to
//! pass, in the `match`). The table is in the [crate docs](crate).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use seawall_core::{FailureClass, LlmError};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The `domain` of the `google.rpc.ErrorInfo` this crate writes, and the one whose reasons
/// [`classify_status`](crate::classify_status) reads as failure classes.
pub const ERROR_DOMAIN: &str = "seawall";

/// The metadata key of the gRPC retry pushback: whole milliseconds to wait before a retry.
pub const PUSHBACK_KEY: &str = "grpc-retry-pushback-ms";

/// The gRPC code of a failure class, and the fixed message a caller sees.
fn mapping(class: FailureClass) -> (Code, &'static str) {
    use FailureClass::*;
    match class {
        // Back-pressure and spending limits: RESOURCE_EXHAUSTED, the code of "a per-user
        // quota, or the entire system is out of resources". ErrorInfo tells them apart.
        RateLimited => (
            Code::ResourceExhausted,
            "The model's rate limit was reached. Please retry later.",
        ),
        QuotaExhausted => (
            Code::ResourceExhausted,
            "The model's usage quota is exhausted.",
        ),
        GateRejected => (
            Code::ResourceExhausted,
            "Too many calls are waiting for the model. Please retry later.",
        ),
        BudgetExceeded => (
            Code::ResourceExhausted,
            "The spending limit of this service has been reached.",
        ),
        // Transient trouble upstream or on the way to it: UNAVAILABLE, the code a client may
        // retry with backoff. After the first streamed message gRPC clients never retry a
        // call by themselves, so a broken stream may share it.
        Overloaded => (
            Code::Unavailable,
            "The model is overloaded. Please retry later.",
        ),
        ServerError => (Code::Unavailable, "The model's service failed."),
        Connect | Disconnected => (
            Code::Unavailable,
            "The model's service could not be reached.",
        ),
        StreamInterrupted => (Code::Unavailable, "The model's answer broke off."),
        EmptyResponse => (Code::Unavailable, "The model returned an empty answer."),
        CircuitOpen => (
            Code::Unavailable,
            "The model is failing and calls to it are paused. Please retry later.",
        ),
        RetryBudgetExhausted => (
            Code::Unavailable,
            "The model is failing too often to retry. Please retry later.",
        ),
        SharedStateUnavailable => (
            Code::Unavailable,
            "This service's shared limits cannot be checked right now. Please retry later.",
        ),
        // Out of time, ours or the upstream's.
        Timeout | UpstreamTimeout | RequestTimeout => {
            (Code::DeadlineExceeded, "The model did not answer in time.")
        }
        DeadlineExceeded => (Code::DeadlineExceeded, "The call's time budget ran out."),
        // The caller's request is at fault. A content-filter refusal is INVALID_ARGUMENT too:
        // the prompt is the problem whatever the server's state (FAILED_PRECONDITION would
        // tell the caller to wait for the system to change, PERMISSION_DENIED that its
        // credentials lack a right); ErrorInfo's reason says CONTENT_FILTERED.
        ContextLengthExceeded => (
            Code::InvalidArgument,
            "The request is too long for the model's context window.",
        ),
        ContentFiltered => (
            Code::InvalidArgument,
            "The request was declined by the content policy.",
        ),
        InvalidRequest => (
            Code::InvalidArgument,
            "The request was rejected as invalid.",
        ),
        // ABORTED: "typically a concurrency issue"; retry at a higher level.
        Conflict => (
            Code::Aborted,
            "The request conflicted with another one. Please retry.",
        ),
        Authentication => (
            Code::Unauthenticated,
            "The credentials for the model were not accepted.",
        ),
        PermissionDenied => (
            Code::PermissionDenied,
            "The credentials for the model do not allow this request.",
        ),
        NotFound => (
            Code::NotFound,
            "The requested model or resource does not exist.",
        ),
        // The model answered, every repair turn too, but never in a shape the server can use.
        // INTERNAL: the server's own dependency broke its contract; not UNAVAILABLE, which
        // clients retry, since the repair turns already were the better retry.
        ContentInvalid => (
            Code::Internal,
            "The model's answer did not pass validation.",
        ),
        // `FailureClass` is `#[non_exhaustive]`, so another crate must have this arm. It is
        // never taken by this version: the tests' table is an array of `FailureClass::COUNT`
        // entries, so a new class stops them compiling until its code is decided above.
        _ => (Code::Unknown, "The model call failed."),
    }
}

/// The gRPC code of a failure class (the table in the [crate docs](crate)).
///
/// ```
/// use seawall_core::FailureClass;
/// use seawall_tonic::grpc_code;
/// use tonic::Code;
///
/// assert_eq!(grpc_code(FailureClass::RateLimited), Code::ResourceExhausted);
/// assert_eq!(grpc_code(FailureClass::ContextLengthExceeded), Code::InvalidArgument);
/// ```
pub fn grpc_code(class: FailureClass) -> Code {
    mapping(class).0
}

/// The `google.rpc.ErrorInfo` reason of a class: its stable name in upper case.
pub fn error_reason(class: FailureClass) -> String {
    class.as_str().to_ascii_uppercase()
}

/// The `Status` a gRPC client should see for `err`: the class's code and fixed message,
/// `ErrorInfo` (reason and [`ERROR_DOMAIN`]) and, with a retry hint, `RetryInfo` and
/// [`PUSHBACK_KEY`] metadata. An exhausted quota or budget without a hint gets a pushback of
/// `-1`, the gRPC retry design's "do not retry", since its code is also a rate limit's.
///
/// It borrows the error, so the handler can still log it; [`into_status`] also keeps it as
/// the status's source.
///
/// ```
/// use std::time::Duration;
/// use seawall_core::{FailureClass, LlmError};
/// use tonic_types::StatusExt;
///
/// let err = LlmError::new(FailureClass::RateLimited, "Rate limit reached for org-123")
///     .with_retry_after(Duration::from_secs(2));
/// let status = seawall_tonic::to_status(&err);
/// assert_eq!(status.code(), tonic::Code::ResourceExhausted);
/// assert!(!status.message().contains("org-123"));
/// let retry = status.get_details_retry_info().unwrap();
/// assert_eq!(retry.retry_delay, Some(Duration::from_secs(2)));
/// assert_eq!(status.get_details_error_info().unwrap().reason, "RATE_LIMITED");
/// ```
pub fn to_status(err: &LlmError) -> Status {
    let class = err.class();
    let (code, message) = mapping(class);
    let mut details = ErrorDetails::with_error_info(
        error_reason(class),
        ERROR_DOMAIN,
        HashMap::<String, String>::new(),
    );
    let mut metadata = MetadataMap::new();
    if let Some(hint) = err.retry_hint() {
        details.set_retry_info(Some(hint));
        metadata.insert(PUSHBACK_KEY, MetadataValue::from(pushback_ms(hint)));
    } else if matches!(
        class,
        FailureClass::QuotaExhausted | FailureClass::BudgetExceeded
    ) {
        // They share RESOURCE_EXHAUSTED with rate limits, which a client's retry policy may
        // list as retryable; a negative pushback tells it that this one will not pass.
        metadata.insert(PUSHBACK_KEY, MetadataValue::from(-1i32));
    }
    Status::with_error_details_and_metadata(code, message, details, metadata)
}

/// [`to_status`], keeping `err` as the status's [source](std::error::Error::source) for the
/// server's own interceptors and logs (tonic never sends a source to the client). Made to be
/// passed to `map_err`: `client.oneshot(req).await.map_err(into_status)?`.
pub fn into_status(err: LlmError) -> Status {
    let mut status = to_status(&err);
    status.set_source(Arc::new(err));
    status
}

/// A delay in whole milliseconds, rounded up (a client that waits a little less than asked
/// meets the same limit again).
fn pushback_ms(hint: Duration) -> u64 {
    u64::try_from(hint.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use FailureClass::*;

    /// Every class and the code a gRPC client sees; a new class fails this test until it is
    /// added here (and to the table in the crate docs).
    const TABLE: [(FailureClass, Code); FailureClass::COUNT] = [
        (RateLimited, Code::ResourceExhausted),
        (QuotaExhausted, Code::ResourceExhausted),
        (Overloaded, Code::Unavailable),
        (ServerError, Code::Unavailable),
        (UpstreamTimeout, Code::DeadlineExceeded),
        (RequestTimeout, Code::DeadlineExceeded),
        (Conflict, Code::Aborted),
        (Timeout, Code::DeadlineExceeded),
        (Connect, Code::Unavailable),
        (Disconnected, Code::Unavailable),
        (StreamInterrupted, Code::Unavailable),
        (EmptyResponse, Code::Unavailable),
        (ContextLengthExceeded, Code::InvalidArgument),
        (ContentFiltered, Code::InvalidArgument),
        (InvalidRequest, Code::InvalidArgument),
        (Authentication, Code::Unauthenticated),
        (PermissionDenied, Code::PermissionDenied),
        (NotFound, Code::NotFound),
        (CircuitOpen, Code::Unavailable),
        (GateRejected, Code::ResourceExhausted),
        (BudgetExceeded, Code::ResourceExhausted),
        (RetryBudgetExhausted, Code::Unavailable),
        (DeadlineExceeded, Code::DeadlineExceeded),
        (SharedStateUnavailable, Code::Unavailable),
        (ContentInvalid, Code::Internal),
    ];

    #[test]
    fn every_class_has_its_documented_code() {
        let classes: Vec<_> = TABLE.iter().map(|(c, _)| *c).collect();
        assert_eq!(
            classes,
            FailureClass::ALL,
            "the table lists every class once"
        );
        for (class, code) in TABLE {
            let status = to_status(&LlmError::new(class, "upstream said something"));
            assert_eq!(status.code(), code, "{class}");
            assert_eq!(grpc_code(class), code, "{class}");
        }
    }

    #[test]
    fn every_class_names_itself_in_error_info_with_the_seawall_domain() {
        for class in FailureClass::ALL {
            let status = to_status(&LlmError::new(class, "x"));
            let info = status.get_details_error_info().expect("ErrorInfo");
            assert_eq!(info.reason, class.as_str().to_ascii_uppercase());
            assert_eq!(info.domain, ERROR_DOMAIN);
        }
    }

    #[test]
    fn the_message_is_the_class_sentence_never_the_upstream_text() {
        let secret = "Incorrect API key provided: sk-proj-abcdefghijklmnop1234 for org-Secret";
        for class in FailureClass::ALL {
            let err = LlmError::new(class, secret)
                .with_code("invalid_api_key")
                .with_request_id("req_upstream42");
            let status = to_status(&err);
            let shown = format!("{} {:?}", status.message(), status.metadata());
            for leak in ["sk-proj", "org-Secret", "invalid_api_key", "req_upstream42"] {
                assert!(!shown.contains(leak), "{class}: {shown}");
            }
            assert!(!status.message().is_empty(), "{class}");
        }
    }

    #[test]
    fn a_retry_hint_becomes_retry_info_and_pushback_rounded_up() {
        let err = LlmError::new(RateLimited, "slow down")
            .with_retry_after(Duration::from_micros(1_500_100));
        let status = to_status(&err);
        assert_eq!(
            status.get_details_retry_info().unwrap().retry_delay,
            Some(Duration::from_micros(1_500_100))
        );
        assert_eq!(status.metadata().get(PUSHBACK_KEY).unwrap(), "1501");
    }

    #[test]
    fn without_a_hint_there_is_no_retry_info_or_pushback() {
        for class in [RateLimited, Overloaded, CircuitOpen, InvalidRequest] {
            let status = to_status(&LlmError::new(class, "x"));
            assert!(status.get_details_retry_info().is_none(), "{class}");
            assert!(status.metadata().get(PUSHBACK_KEY).is_none(), "{class}");
        }
    }

    #[test]
    fn a_spent_quota_or_budget_tells_grpc_retry_policies_not_to_retry() {
        for class in [QuotaExhausted, BudgetExceeded] {
            let status = to_status(&LlmError::new(class, "insufficient_quota"));
            assert_eq!(status.code(), Code::ResourceExhausted);
            assert!(status.get_details_retry_info().is_none(), "{class}");
            assert_eq!(
                status.metadata().get(PUSHBACK_KEY).unwrap(),
                "-1",
                "{class}"
            );
            let back = crate::classify_status(status);
            assert_eq!(back.class(), QuotaExhausted, "{class}");
            assert_eq!(back.should_retry(), Some(false), "{class}");
        }
    }

    #[test]
    fn into_status_keeps_the_error_as_source() {
        let status = into_status(LlmError::new(Overloaded, "busy"));
        let source = std::error::Error::source(&status).expect("a source");
        let err = source.downcast_ref::<LlmError>().expect("the LlmError");
        assert_eq!(err.class(), Overloaded);
    }
}
