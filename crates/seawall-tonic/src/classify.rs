//! A `tonic::Status` from an LLM server reached over gRPC, as the [`LlmError`] an HTTP stack
//! would have produced for the same failure.
//!
//! Self-hosted inference servers (vLLM, Triton, TGI and the like) speak gRPC as well as HTTP.
//! seawall's retry, breaker and fallback layers decide from a [`FailureClass`] and a retry
//! hint, so a gRPC failure must arrive with the same class and hint as its HTTP twin, or the
//! layers would treat the same overload differently depending on the wire.
//!
//! The rules are on [`classify_status`].

use std::error::Error as StdError;
use std::time::Duration;

use seawall_classify::{ProviderError, class_of, classify_transport_error, hints};
use seawall_core::{FailureClass, LlmError};
use tonic::{Code, Status, TimeoutExpired};
use tonic_types::{ErrorDetails, StatusExt};

use crate::status::{ERROR_DOMAIN, PUSHBACK_KEY};

/// The [`LlmError`] for a `Status` of an LLM server. Never panics, whatever the details hold.
///
/// What is read, in order:
///
/// 1. A status that tonic made itself from a transport error (it has a
///    [source](std::error::Error::source): a refused connection, a reset stream) is classified
///    from that error chain by [`classify_transport_error`], as the HTTP transport's errors
///    are; tonic's own client timeout (`tonic::TimeoutExpired`, which tonic reports as
///    `CANCELLED`) is a [`FailureClass::Timeout`].
/// 2. `google.rpc.ErrorInfo` in the [`ERROR_DOMAIN`] names the class exactly (another seawall
///    server wrote it with [`to_status`](crate::to_status)). A class the remote server raised
///    itself is what it means to us: its open breaker, full gate or spent retry budget is an
///    `Overloaded` server, its spent cost budget our `QuotaExhausted`, its time budget an
///    `UpstreamTimeout`, its unreachable shared store a `ServerError`.
/// 3. Otherwise the code decides, and for the codes whose meaning hangs on the words
///    (`INVALID_ARGUMENT`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `RESOURCE_EXHAUSTED`,
///    `UNKNOWN`, `INTERNAL`, `DATA_LOSS`) the message and the ErrorInfo reason are read by the
///    same rules as an HTTP error body of the matching status
///    ([`seawall_classify::class_of`]): "maximum context length" is a context-length error,
///    "content policy" a content filter, `insufficient_quota` an exhausted quota.
///
/// | code | class |
/// |---|---|
/// | `RESOURCE_EXHAUSTED` | `RateLimited`; `QuotaExhausted` when the ErrorInfo reason names a quota (`insufficient_quota`, ...), or a `QuotaFailure` (or quota wording) comes without a retry delay |
/// | `UNAVAILABLE` | `Overloaded` (HTTP 503's class: retried after the overload delay, counted by the breaker) |
/// | `DEADLINE_EXCEEDED` | `Timeout` |
/// | `INVALID_ARGUMENT`, `FAILED_PRECONDITION`, `OUT_OF_RANGE` | by the words: `ContextLengthExceeded`, `ContentFiltered`, `QuotaExhausted`, else `InvalidRequest` |
/// | `UNAUTHENTICATED` | `Authentication` |
/// | `PERMISSION_DENIED` | `PermissionDenied` |
/// | `NOT_FOUND`, `UNIMPLEMENTED` | `NotFound` (a method the server lacks is a missing endpoint: never retried, worth a fallback) |
/// | `ALREADY_EXISTS`, `ABORTED` | `Conflict` |
/// | `CANCELLED` | `Disconnected` (the server gave up on a call it had received: retried only when idempotent) |
/// | `UNKNOWN`, `INTERNAL`, `DATA_LOSS` | `ServerError` (`Overloaded` if the words say so) |
/// | `OK` on an error | `ServerError` (the server broke the protocol) |
///
/// The retry hint is `google.rpc.RetryInfo`'s delay, else the `grpc-retry-pushback-ms`
/// metadata (non-negative whole milliseconds). A negative or unreadable pushback means "do not
/// retry" in the gRPC retry design, and becomes [`LlmError::should_retry`] `false`, as an
/// `x-should-retry: false` header does over HTTP. Hints are capped at
/// [`seawall_classify::hints::MAX_HINT`]. The ErrorInfo reason becomes the error's
/// [code](LlmError::code), `google.rpc.RequestInfo`'s id its request id, and the status itself
/// its [source](LlmError::source_ref).
///
/// ```
/// use std::time::Duration;
/// use seawall_core::FailureClass;
/// use tonic::Code;
/// use tonic_types::{ErrorDetails, StatusExt};
///
/// let status = tonic::Status::with_error_details(
///     Code::ResourceExhausted,
///     "too many requests",
///     ErrorDetails::with_retry_info(Some(Duration::from_secs(2))),
/// );
/// let err = seawall_tonic::classify_status(status);
/// assert_eq!(err.class(), FailureClass::RateLimited);
/// assert_eq!(err.retry_hint(), Some(Duration::from_secs(2)));
///
/// let long = tonic::Status::invalid_argument(
///     "This model's maximum context length is 4096 tokens, your prompt has 5000.",
/// );
/// assert_eq!(
///     seawall_tonic::classify_status(long).class(),
///     FailureClass::ContextLengthExceeded
/// );
/// ```
pub fn classify_status(status: Status) -> LlmError {
    if status.source().is_some() {
        return from_transport(status);
    }
    // Details that do not decode are ignored: the code still says enough.
    let details = status.check_error_details().unwrap_or_default();
    let (hint, no_retry) = retry_hint(&status, &details);
    let reason = details
        .error_info()
        .map(|i| i.reason.as_str())
        .filter(|r| !r.is_empty());
    let class = seawall_class(&details)
        .unwrap_or_else(|| class_of_code(&status, reason, &details, hint.is_some()));

    let message = if status.message().trim().is_empty() {
        status.code().description()
    } else {
        status.message()
    };
    let mut err = LlmError::new(class, message);
    if let Some(reason) = reason {
        err = err.with_code(reason);
    }
    if let Some(id) = details
        .request_info()
        .map(|i| i.request_id.as_str())
        .filter(|id| !id.is_empty())
    {
        err = err.with_request_id(id);
    }
    if let Some(hint) = hint {
        err = err.with_retry_after(hint);
    }
    if no_retry {
        err = err.with_should_retry(false);
    }
    err.with_source(status)
}

/// A status tonic raised on the client side from a transport error.
fn from_transport(status: Status) -> LlmError {
    let mut cause: Option<&(dyn StdError + 'static)> = Some(&status);
    while let Some(e) = cause {
        if e.is::<TimeoutExpired>() {
            return LlmError::new(FailureClass::Timeout, status.message()).with_source(status);
        }
        cause = e.source();
    }
    classify_transport_error(Box::new(status))
}

/// The class another seawall server named in its ErrorInfo, as it matters to this client.
fn seawall_class(details: &ErrorDetails) -> Option<FailureClass> {
    let info = details.error_info()?;
    if info.domain != ERROR_DOMAIN {
        return None;
    }
    let class = FailureClass::ALL
        .into_iter()
        .find(|c| c.as_str().eq_ignore_ascii_case(&info.reason))?;
    use FailureClass::*;
    Some(match class {
        CircuitOpen | GateRejected | RetryBudgetExhausted => Overloaded,
        BudgetExceeded => QuotaExhausted,
        DeadlineExceeded => UpstreamTimeout,
        SharedStateUnavailable => ServerError,
        upstream => upstream,
    })
}

/// The class from the code, and from the words where the code leaves it open.
fn class_of_code(
    status: &Status,
    reason: Option<&str>,
    details: &ErrorDetails,
    has_hint: bool,
) -> FailureClass {
    use FailureClass::*;
    let words = |http_status: u16| class_of(http_status, &provider_error(status.message(), reason));
    match status.code() {
        Code::Ok => ServerError,
        Code::Cancelled => Disconnected,
        Code::Unknown | Code::Internal | Code::DataLoss => match words(500) {
            Overloaded => Overloaded,
            _ => ServerError,
        },
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => words(400),
        Code::DeadlineExceeded => Timeout,
        Code::NotFound | Code::Unimplemented => NotFound,
        Code::AlreadyExists | Code::Aborted => Conflict,
        Code::PermissionDenied => PermissionDenied,
        Code::Unauthenticated => Authentication,
        Code::Unavailable => Overloaded,
        Code::ResourceExhausted => {
            // A quota named by the reason is final. Quota words or a QuotaFailure with a
            // delay to come back after are a per-window quota: a rate limit, as over HTTP.
            let named = class_of(429, &provider_error("", reason)) == QuotaExhausted;
            let quota = words(429) == QuotaExhausted || details.quota_failure().is_some();
            if named || (quota && !has_hint) {
                QuotaExhausted
            } else {
                RateLimited
            }
        }
    }
}

/// The status's message and ErrorInfo reason in the shape of an OpenAI error body, for the
/// HTTP classifier's reading of words.
fn provider_error(message: &str, reason: Option<&str>) -> ProviderError {
    ProviderError::from_value(&serde_json::json!({
        "error": { "message": message, "code": reason }
    }))
}

/// The server's retry delay, and whether it said not to retry at all.
fn retry_hint(status: &Status, details: &ErrorDetails) -> (Option<Duration>, bool) {
    let cap = |d: Duration| d.min(hints::MAX_HINT);
    if let Some(delay) = details.retry_info().and_then(|r| r.retry_delay) {
        return (Some(cap(delay)), false);
    }
    let Some(value) = status.metadata().get(PUSHBACK_KEY) else {
        return (None, false);
    };
    match value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        Some(ms) => (Some(cap(Duration::from_millis(ms))), false),
        None => (None, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::to_status;
    use FailureClass::*;
    use tonic::metadata::MetadataMap;
    use tonic_types::QuotaViolation;

    /// Every code, as a server sends it with a plain message, and its class.
    const TABLE: [(Code, FailureClass); 17] = [
        (Code::Ok, ServerError),
        (Code::Cancelled, Disconnected),
        (Code::Unknown, ServerError),
        (Code::InvalidArgument, InvalidRequest),
        (Code::DeadlineExceeded, Timeout),
        (Code::NotFound, NotFound),
        (Code::AlreadyExists, Conflict),
        (Code::PermissionDenied, PermissionDenied),
        (Code::ResourceExhausted, RateLimited),
        (Code::FailedPrecondition, InvalidRequest),
        (Code::Aborted, Conflict),
        (Code::OutOfRange, InvalidRequest),
        (Code::Unimplemented, NotFound),
        (Code::Internal, ServerError),
        (Code::Unavailable, Overloaded),
        (Code::DataLoss, ServerError),
        (Code::Unauthenticated, Authentication),
    ];

    #[test]
    fn every_code_has_its_documented_class() {
        for (i, (code, class)) in TABLE.into_iter().enumerate() {
            assert_eq!(code as i32, i as i32, "the table lists every code in order");
            let err = classify_status(Status::new(code, "the server said no"));
            assert_eq!(err.class(), class, "{code:?}");
            assert!(err.source_ref().unwrap().is::<Status>(), "{code:?}");
        }
        assert_eq!(
            Code::from_i32(TABLE.len() as i32),
            Code::Unknown,
            "no code missing"
        );
    }

    #[test]
    fn words_refine_invalid_argument_like_an_http_400() {
        for (message, class) in [
            (
                "This model's maximum context length is 4096 tokens. However, you requested 5000.",
                ContextLengthExceeded,
            ),
            (
                "prompt is too long: 210000 tokens > 200000 maximum",
                ContextLengthExceeded,
            ),
            (
                "Your request was rejected by the content policy.",
                ContentFiltered,
            ),
            ("temperature must be between 0 and 2", InvalidRequest),
        ] {
            for code in [
                Code::InvalidArgument,
                Code::FailedPrecondition,
                Code::OutOfRange,
            ] {
                let err = classify_status(Status::new(code, message));
                assert_eq!(err.class(), class, "{code:?} {message}");
            }
        }
        let overloaded = classify_status(Status::internal("engine overloaded, try later"));
        assert_eq!(overloaded.class(), Overloaded);
    }

    fn exhausted(message: &str, details: ErrorDetails) -> LlmError {
        classify_status(Status::with_error_details(
            Code::ResourceExhausted,
            message,
            details,
        ))
    }

    #[test]
    fn resource_exhausted_with_retry_info_is_a_rate_limit_with_its_hint() {
        let err = exhausted(
            "too many requests",
            ErrorDetails::with_retry_info(Some(Duration::from_millis(2500))),
        );
        assert_eq!(err.class(), RateLimited);
        assert_eq!(err.retry_hint(), Some(Duration::from_millis(2500)));
    }

    #[test]
    fn resource_exhausted_naming_a_quota_is_quota_exhausted_even_with_a_delay() {
        let mut details = ErrorDetails::with_error_info(
            "insufficient_quota",
            "openai.com",
            std::collections::HashMap::<String, String>::new(),
        );
        details.set_retry_info(Some(Duration::from_secs(30)));
        let err = exhausted("You exceeded your current quota", details);
        assert_eq!(err.class(), QuotaExhausted);
        assert_eq!(err.code(), Some("insufficient_quota"));
    }

    #[test]
    fn a_quota_failure_without_a_delay_is_final_with_one_a_rate_limit() {
        let violation = || {
            vec![QuotaViolation::new(
                "project:42",
                "daily token quota used up",
            )]
        };
        let err = exhausted(
            "quota exceeded",
            ErrorDetails::with_quota_failure(violation()),
        );
        assert_eq!(err.class(), QuotaExhausted);

        let mut details = ErrorDetails::with_quota_failure(violation());
        details.set_retry_info(Some(Duration::from_secs(40)));
        let err = exhausted("quota exceeded", details);
        assert_eq!(
            err.class(),
            RateLimited,
            "a per-window quota says when to come back"
        );
        assert_eq!(err.retry_hint(), Some(Duration::from_secs(40)));
    }

    fn with_pushback(value: &str) -> Status {
        let mut metadata = MetadataMap::new();
        metadata.insert(PUSHBACK_KEY, value.parse().unwrap());
        Status::with_metadata(Code::Unavailable, "busy", metadata)
    }

    #[test]
    fn pushback_metadata_is_a_hint_and_a_negative_one_forbids_retries() {
        let err = classify_status(with_pushback("1200"));
        assert_eq!(err.class(), Overloaded);
        assert_eq!(err.retry_hint(), Some(Duration::from_millis(1200)));
        assert_eq!(err.should_retry(), None);

        for never in ["-1", "soon"] {
            let err = classify_status(with_pushback(never));
            assert_eq!(err.retry_hint(), None, "{never}");
            assert_eq!(err.should_retry(), Some(false), "{never}");
        }
    }

    #[test]
    fn huge_hints_are_capped() {
        let err = exhausted(
            "slow down",
            ErrorDetails::with_retry_info(Some(Duration::from_secs(10_000_000))),
        );
        assert_eq!(err.retry_hint(), Some(hints::MAX_HINT));
    }

    #[test]
    fn seawall_statuses_round_trip_and_remote_rejections_become_upstream_classes() {
        for class in FailureClass::ALL {
            let err = LlmError::new(class, "x").with_retry_after(Duration::from_secs(3));
            let back = classify_status(to_status(&err));
            let expected = match class {
                CircuitOpen | GateRejected | RetryBudgetExhausted => Overloaded,
                BudgetExceeded => QuotaExhausted,
                DeadlineExceeded => UpstreamTimeout,
                SharedStateUnavailable => ServerError,
                same => same,
            };
            assert_eq!(back.class(), expected, "{class}");
            assert!(!back.class().is_local(), "{class}");
            assert_eq!(back.retry_hint(), Some(Duration::from_secs(3)), "{class}");
        }
    }

    #[test]
    fn garbage_details_are_ignored_not_a_panic() {
        let status = Status::with_details(
            Code::ResourceExhausted,
            "slow down",
            bytes::Bytes::from_static(&[0xff, 0x01, 0x02, 0x80]),
        );
        assert_eq!(classify_status(status).class(), RateLimited);
    }

    #[test]
    fn credentials_in_the_message_are_redacted() {
        let err = classify_status(Status::unauthenticated(
            "invalid api key sk-proj-abcdefghijklmnopqrstuvwx1234",
        ));
        assert_eq!(err.class(), Authentication);
        assert!(!err.to_string().contains("abcdefghijklmnop"), "{err}");
    }

    #[test]
    fn a_refused_connection_is_connect_and_tonics_timeout_is_timeout() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let status = Status::from_error(Box::new(tonic::ConnectError(Box::new(refused))));
        assert_eq!(classify_status(status).class(), Connect);

        let status = Status::from_error(Box::new(TimeoutExpired(())));
        assert_eq!(status.code(), Code::Cancelled);
        assert_eq!(classify_status(status).class(), Timeout);
    }
}
