//! Server hints read from response headers and error messages.
//!
//! Every parser here takes untrusted input and returns `None` for anything it does not
//! understand: none of them panics, whatever the bytes. Delays are clamped to [`MAX_HINT`].

use std::time::{Duration, SystemTime};

use http::HeaderMap;
use seawall_core::{RateLimitSnapshot, RateLimitWindow};

/// The longest delay a hint can carry: one day. A longer `Retry-After` or reset (or an
/// infinite one) is clamped to this, so it still reads as "not soon" to a retry layer, which
/// then fails fast instead of sleeping.
pub const MAX_HINT: Duration = Duration::from_secs(24 * 60 * 60);

fn from_secs(secs: f64) -> Option<Duration> {
    if secs.is_nan() || secs < 0.0 {
        return None;
    }
    if secs >= MAX_HINT.as_secs_f64() {
        return Some(MAX_HINT);
    }
    Some(Duration::from_secs_f64(secs))
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// Parses a Go-style duration as OpenAI sends in `x-ratelimit-reset-*` and in "Please try again
/// in ..." messages: `12ms`, `1.4s`, `6m0s`, `1h2m3.5s`, `0s`; units `ns`, `us`/`µs`, `ms`,
/// `s`, `m`, `h`. A bare number is read as seconds. Negative or malformed input gives `None`;
/// huge values are clamped to [`MAX_HINT`].
///
/// ```
/// use std::time::Duration;
/// use seawall_classify::hints::parse_go_duration;
/// assert_eq!(parse_go_duration("1h2m3.5s"), Some(Duration::from_millis(3_723_500)));
/// assert_eq!(parse_go_duration("12ms"), Some(Duration::from_millis(12)));
/// assert_eq!(parse_go_duration("-1s"), None);
/// ```
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.is_empty() || s.len() > 64 {
        return None;
    }
    if let Ok(secs) = s.parse::<f64>() {
        // A bare number: seconds. `parse` also accepts "inf"/"nan"; only digits count here.
        if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return from_secs(secs);
        }
        return None;
    }
    let mut total = 0.0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        if num_len == 0 {
            return None;
        }
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(rest.len(), |(i, _)| i);
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * scale;
    }
    from_secs(total)
}

/// Parses one `Retry-After` value: integer or float seconds, or an HTTP-date taken relative to
/// `now`. Negative, NaN or malformed values give `None`; a date in the past gives zero; huge
/// values are clamped to [`MAX_HINT`].
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if let Ok(secs) = value.parse::<f64>() {
        return from_secs(secs);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(now)
            .map_or(Duration::ZERO, |d| d.min(MAX_HINT)),
    )
}

fn parse_millis(value: &str) -> Option<Duration> {
    let ms: f64 = value.trim().parse().ok()?;
    from_secs(ms / 1000.0)
}

/// The moment the server's relative figures are measured from: its `Date` header if present
/// and valid, else `now`.
pub fn reference_time(headers: &HeaderMap, now: SystemTime) -> SystemTime {
    header(headers, "date")
        .and_then(|d| httpdate::parse_http_date(d).ok())
        .unwrap_or(now)
}

/// The server's requested delay from the headers, in order of precedence: `retry-after-ms`,
/// `x-ms-retry-after-ms` (Azure), `retry-after` (seconds or HTTP-date, relative to the
/// response's `Date` header when present). An invalid header is skipped in favour of the next.
pub fn retry_after_from_headers(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    header(headers, "retry-after-ms")
        .and_then(parse_millis)
        .or_else(|| header(headers, "x-ms-retry-after-ms").and_then(parse_millis))
        .or_else(|| {
            let v = header(headers, "retry-after")?;
            parse_retry_after(v, reference_time(headers, now))
        })
}

fn find_ascii_ci(haystack: &str, needle: &str) -> Option<usize> {
    let (h, n) = (haystack.as_bytes(), needle.as_bytes());
    if n.is_empty() || h.len() < n.len() {
        return None;
    }
    (0..=h.len() - n.len()).find(|&i| h[i..i + n.len()].eq_ignore_ascii_case(n))
}

/// Finds a delay in an error message: "Please try again in 120ms / 1.4s / 6m0s" (OpenAI),
/// "Please retry after 6 seconds" (Azure OpenAI), "please try again after 1 seconds"
/// (Moonshot), or "Please retry in 33.7s".
///
/// ```
/// use std::time::Duration;
/// use seawall_classify::hints::retry_after_from_message;
/// let m = "Rate limit reached for gpt-4o on tokens per min (TPM). Please try again in 1.4s. Visit ...";
/// assert_eq!(retry_after_from_message(m), Some(Duration::from_millis(1400)));
/// assert_eq!(retry_after_from_message("Please retry after 6 seconds."), Some(Duration::from_secs(6)));
/// ```
pub fn retry_after_from_message(message: &str) -> Option<Duration> {
    let found = ["try again in ", "retry in "]
        .iter()
        .find_map(|p| find_ascii_ci(message, p).map(|i| i + p.len()));
    if let Some(start) = found {
        let rest = &message[start..];
        let token = rest.split_whitespace().next()?;
        let token = token.trim_end_matches(['.', ',', ';', ')']);
        if let Some(d) = parse_go_duration(token) {
            return Some(d);
        }
        return number_and_word(rest);
    }
    ["retry after ", "try again after "].iter().find_map(|p| {
        let i = find_ascii_ci(message, p)?;
        number_and_word(&message[i + p.len()..])
    })
}

/// "6 seconds", "500 ms", "2 minutes".
fn number_and_word(rest: &str) -> Option<Duration> {
    let mut words = rest.split_whitespace();
    let value: f64 = words.next()?.parse().ok()?;
    let unit = words
        .next()
        .unwrap_or("s")
        .trim_end_matches(['.', ',', ';', ')'])
        .to_ascii_lowercase();
    let scale = match unit.as_str() {
        "ms" | "millisecond" | "milliseconds" => 1e-3,
        "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
        "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
        "h" | "hour" | "hours" => 3600.0,
        _ => return None,
    };
    from_secs(value * scale)
}

/// The `x-should-retry: true|false` directive, which beats the class default either way.
pub fn should_retry(headers: &HeaderMap) -> Option<bool> {
    let v = header(headers, "x-should-retry")?;
    if v.eq_ignore_ascii_case("true") {
        Some(true)
    } else if v.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// The upstream request id, as [`seawall_core::request_id`] reads it.
pub fn request_id(headers: &HeaderMap) -> Option<&str> {
    seawall_core::request_id(headers)
}

fn parse_count(v: &str) -> Option<u64> {
    if let Ok(n) = v.parse::<u64>() {
        return Some(n);
    }
    let f: f64 = v.parse().ok()?;
    (f.is_finite() && f >= 0.0).then(|| f.min(u64::MAX as f64) as u64)
}

/// Parses an RFC 3339 instant (`2024-06-12T20:44:15Z`, `2024-06-12T20:44:15.25+02:00`).
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    if s.len() > 64 {
        return None;
    }
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    let nanos = t.unix_timestamp_nanos();
    let since_epoch = Duration::from_nanos(u64::try_from(nanos).ok()?);
    SystemTime::UNIX_EPOCH.checked_add(since_epoch)
}

const OPENAI: [[&str; 3]; 2] = seawall_core::OPENAI_RATE_LIMIT_HEADERS;
const ANTHROPIC: [[&str; 3]; 4] = seawall_core::ANTHROPIC_RATE_LIMIT_HEADERS;
/// `[remaining, reset]` of gateways and servers that use neither provider's names: the IETF
/// draft's `RateLimit-Remaining` / `RateLimit-Reset`, and the `X-RateLimit-Remaining` /
/// `X-RateLimit-Reset` of Envoy and many API gateways. Their reset is in seconds.
const GENERIC: [[&str; 2]; 2] = [
    ["ratelimit-remaining", "ratelimit-reset"],
    ["x-ratelimit-remaining", "x-ratelimit-reset"],
];

/// A generic reset: seconds from now, or, for a value over a year's seconds, the Unix time
/// (in seconds, or in milliseconds past 10^12) that some gateways send instead.
fn generic_reset(value: &str, reference: SystemTime) -> Option<Duration> {
    const YEAR: f64 = 365.0 * 86_400.0;
    let n: f64 = value.parse().ok()?;
    if !n.is_finite() || n <= YEAR {
        return from_secs(n);
    }
    let secs = if n > 1e12 { n / 1e3 } else { n };
    let at = SystemTime::UNIX_EPOCH.checked_add(Duration::try_from_secs_f64(secs).ok()?)?;
    Some(
        at.duration_since(reference)
            .map_or(Duration::ZERO, |d| d.min(MAX_HINT)),
    )
}

fn reset_in(value: &str, reference: SystemTime) -> Option<Duration> {
    if let Some(at) = parse_rfc3339(value) {
        return Some(
            at.duration_since(reference)
                .map_or(Duration::ZERO, |d| d.min(MAX_HINT)),
        );
    }
    parse_go_duration(value)
}

/// Reads the rate-limit headers of both wire formats into one snapshot; `None` when there are
/// none.
///
/// - OpenAI: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as Go durations.
/// - Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
///   remaining,reset}`, resets as RFC 3339 instants, turned into durations relative to the
///   response's `Date` header if present, else `now`. A reset in the past is zero.
/// - Without either's request headers, a gateway's `ratelimit-{remaining,reset}` or
///   `x-ratelimit-{remaining,reset}` (a reset in seconds, or a Unix time) as the requests
///   window. They name no window length, so no limit is taken from them: only what is left
///   and when it comes back, which is what a retry's wait needs.
pub fn rate_limits(headers: &HeaderMap, now: SystemTime) -> Option<RateLimitSnapshot> {
    rate_limits_lazily(headers, || now)
}

/// [`rate_limits`], reading the clock only for an answer that has such headers (most have
/// none, and a clock read costs more than the check).
pub(crate) fn rate_limits_lazily(
    headers: &HeaderMap,
    now: impl FnOnce() -> SystemTime,
) -> Option<RateLimitSnapshot> {
    // Most answers carry none of the eighteen names, and looking each up parses it: one pass
    // over the names present says first whether any could be there (they all start so).
    let any = headers.keys().any(|k| {
        let k = k.as_str();
        k.starts_with("x-ratelimit-")
            || k.starts_with("anthropic-ratelimit-")
            || k.starts_with("ratelimit-")
    });
    if !any {
        return None;
    }
    let mut snap = RateLimitSnapshot::default();
    let reference = reference_time(headers, now());
    let window = |[limit, remaining, reset]: [&str; 3]| RateLimitWindow {
        limit: header(headers, limit).and_then(parse_count),
        remaining: header(headers, remaining).and_then(parse_count),
        reset_after: header(headers, reset).and_then(|v| reset_in(v, reference)),
    };
    snap.requests = window(OPENAI[0]);
    snap.tokens = window(OPENAI[1]);
    for (slot, names) in [
        (&mut snap.requests, ANTHROPIC[0]),
        (&mut snap.tokens, ANTHROPIC[1]),
        (&mut snap.input_tokens, ANTHROPIC[2]),
        (&mut snap.output_tokens, ANTHROPIC[3]),
    ] {
        let w = window(names);
        if !w.is_empty() {
            *slot = w;
        }
    }
    if snap.requests.is_empty() {
        if let Some((remaining, reset)) = GENERIC.iter().find_map(|[remaining, reset]| {
            let remaining = header(headers, remaining).and_then(parse_count)?;
            Some((remaining, header(headers, reset)))
        }) {
            snap.requests.remaining = Some(remaining);
            snap.requests.reset_after = reset.and_then(|v| generic_reset(v, reference));
        }
    }
    (!snap.is_empty()).then_some(snap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn every_rate_limit_header_starts_with_a_prefix_the_quick_check_knows() {
        for name in OPENAI.iter().chain(&ANTHROPIC).flatten() {
            assert!(
                name.starts_with("x-ratelimit-") || name.starts_with("anthropic-ratelimit-"),
                "{name}"
            );
        }
        for name in GENERIC.iter().flatten() {
            assert!(
                name.starts_with("x-ratelimit-") || name.starts_with("ratelimit-"),
                "{name}"
            );
        }
        assert!(rate_limits(&headers(&[("content-type", "application/json")]), at(0)).is_none());
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn go_durations() {
        let ms = Duration::from_millis;
        for (text, want) in [
            ("12ms", Some(ms(12))),
            ("1s", Some(ms(1000))),
            ("1.4s", Some(ms(1400))),
            ("6m0s", Some(ms(360_000))),
            ("1h2m3.5s", Some(ms(3_723_500))),
            ("0s", Some(ms(0))),
            ("500us", Some(Duration::from_micros(500))),
            ("500µs", Some(Duration::from_micros(500))),
            ("250ns", Some(Duration::from_nanos(250))),
            ("20", Some(ms(20_000))),
            ("+3s", Some(ms(3000))),
            ("-1s", None),
            ("", None),
            ("s", None),
            ("1x", None),
            ("1.2.3s", None),
            ("NaN", None),
            ("inf", None),
            ("1000000h", Some(MAX_HINT)),
        ] {
            assert_eq!(parse_go_duration(text), want, "{text:?}");
        }
    }

    #[test]
    fn retry_after_values() {
        let now = at(1_700_000_000);
        for (text, want) in [
            ("30", Some(Duration::from_secs(30))),
            ("1.5", Some(Duration::from_millis(1500))),
            ("0", Some(Duration::ZERO)),
            ("-5", None),
            ("NaN", None),
            ("nan", None),
            ("inf", Some(MAX_HINT)),
            ("1e300", Some(MAX_HINT)),
            ("99999999999999999999", Some(MAX_HINT)),
            ("soon", None),
            ("", None),
        ] {
            assert_eq!(parse_retry_after(text, now), want, "{text:?}");
        }
        let future = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(
            parse_retry_after(&future, now),
            Some(Duration::from_secs(90))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(parse_retry_after(&past, now), Some(Duration::ZERO));
        let far = httpdate::fmt_http_date(now + Duration::from_secs(400 * 86_400));
        assert_eq!(parse_retry_after(&far, now), Some(MAX_HINT));
    }

    #[test]
    fn header_precedence_and_date_reference() {
        let now = at(1_700_000_000);
        let h = headers(&[
            ("retry-after", "7"),
            ("retry-after-ms", "250"),
            ("x-ms-retry-after-ms", "900"),
        ]);
        assert_eq!(
            retry_after_from_headers(&h, now),
            Some(Duration::from_millis(250))
        );
        let h = headers(&[("retry-after", "7"), ("x-ms-retry-after-ms", "900.5")]);
        assert_eq!(
            retry_after_from_headers(&h, now),
            Some(Duration::from_micros(900_500))
        );
        let h = headers(&[("retry-after", "7"), ("retry-after-ms", "garbage")]);
        assert_eq!(
            retry_after_from_headers(&h, now),
            Some(Duration::from_secs(7))
        );
        // An HTTP-date is measured from the server's Date header, not our clock.
        let server_now = at(1_600_000_000);
        let h = headers(&[
            ("date", &httpdate::fmt_http_date(server_now)),
            (
                "retry-after",
                &httpdate::fmt_http_date(server_now + Duration::from_secs(12)),
            ),
        ]);
        assert_eq!(
            retry_after_from_headers(&h, now),
            Some(Duration::from_secs(12))
        );
        assert_eq!(retry_after_from_headers(&HeaderMap::new(), now), None);
    }

    #[test]
    fn message_hints() {
        let ms = Duration::from_millis;
        for (text, want) in [
            ("Please try again in 120ms.", Some(ms(120))),
            ("Please try again in 1.4s. Visit https://x", Some(ms(1400))),
            ("please TRY AGAIN IN 6m0s", Some(ms(360_000))),
            ("Please try again in 20 seconds.", Some(ms(20_000))),
            ("Please retry after 6 seconds.", Some(ms(6000))),
            (
                "max request per minute reached: 3, please try again after 1 seconds",
                Some(ms(1000)),
            ),
            ("Please try again after some time.", None),
            ("Quota exceeded. Please retry in 33.5s.", Some(ms(33_500))),
            ("Try again later.", None),
            ("try again in", None),
            ("try again in -3s", None),
            ("", None),
        ] {
            assert_eq!(retry_after_from_message(text), want, "{text:?}");
        }
    }

    #[test]
    fn should_retry_directive() {
        assert_eq!(
            should_retry(&headers(&[("x-should-retry", "true")])),
            Some(true)
        );
        assert_eq!(
            should_retry(&headers(&[("x-should-retry", " FALSE ")])),
            Some(false)
        );
        assert_eq!(should_retry(&headers(&[("x-should-retry", "maybe")])), None);
        assert_eq!(should_retry(&HeaderMap::new()), None);
    }

    #[test]
    fn request_id_headers() {
        for name in [
            "x-request-id",
            "request-id",
            "apim-request-id",
            "x-amzn-requestid",
        ] {
            assert_eq!(
                request_id(&headers(&[(name, " abc ")])),
                Some("abc"),
                "{name}"
            );
        }
        assert_eq!(
            request_id(&headers(&[("request-id", "b"), ("x-request-id", "a")])),
            Some("a")
        );
        assert_eq!(request_id(&HeaderMap::new()), None);
    }

    #[test]
    fn rfc3339() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(at(0)));
        assert_eq!(
            parse_rfc3339("2024-06-12T20:44:15Z"),
            Some(at(1_718_225_055))
        );
        assert_eq!(
            parse_rfc3339("2024-06-12T22:44:15.5+02:00"),
            Some(at(1_718_225_055) + Duration::from_millis(500))
        );
        assert_eq!(parse_rfc3339("2000-02-29T00:00:00Z"), Some(at(951_782_400)));
        for bad in [
            "",
            "2024-13-01T00:00:00Z",
            "2024-06-12 20:44:15",
            "2024-06-12T20:44:15+0200",
            "1969-12-31T23:59:59Z",
            "2024-06-12T2X:44:15Z",
            "2024-06-12T20:44:15.Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn openai_rate_limit_headers() {
        let h = headers(&[
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-tokens", "149984"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]);
        let s = rate_limits(&h, at(0)).unwrap();
        assert_eq!(s.requests.limit, Some(60));
        assert_eq!(s.requests.remaining, Some(0));
        assert_eq!(s.requests.reset_after, Some(Duration::from_secs(1)));
        assert_eq!(s.tokens.limit, Some(150_000));
        assert_eq!(s.tokens.remaining, Some(149_984));
        assert_eq!(s.tokens.reset_after, Some(Duration::from_secs(360)));
        // The 60 requests come back over 1 s, so the next one may go after 1/60 s.
        assert_eq!(s.exhausted_until(), Some(Duration::from_nanos(16_666_667)));
        assert!(rate_limits(&HeaderMap::new(), at(0)).is_none());
    }

    #[test]
    fn anthropic_rate_limit_headers_relative_to_date() {
        let server_now = parse_rfc3339("2025-01-01T12:00:00Z").unwrap();
        let h = headers(&[
            ("date", &httpdate::fmt_http_date(server_now)),
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-requests-reset", "2025-01-01T12:00:01Z"),
            ("anthropic-ratelimit-tokens-remaining", "0"),
            ("anthropic-ratelimit-tokens-reset", "2025-01-01T12:00:30Z"),
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "39000"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2025-01-01T11:59:00Z",
            ),
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "7990"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2025-01-01T12:00:02Z",
            ),
        ]);
        // Our clock is far off; the Date header is the reference.
        let s = rate_limits(&h, at(0)).unwrap();
        assert_eq!(s.requests.limit, Some(50));
        assert_eq!(s.requests.reset_after, Some(Duration::from_secs(1)));
        assert_eq!(s.tokens.reset_after, Some(Duration::from_secs(30)));
        assert_eq!(s.input_tokens.limit, Some(40_000));
        assert_eq!(s.input_tokens.reset_after, Some(Duration::ZERO));
        assert_eq!(s.output_tokens.remaining, Some(7990));
        assert_eq!(s.output_tokens.reset_after, Some(Duration::from_secs(2)));
        assert_eq!(s.exhausted_until(), Some(Duration::from_secs(30)));
        // Without a Date header, `now` is the reference.
        let h = headers(&[("anthropic-ratelimit-tokens-reset", "2025-01-01T12:00:30Z")]);
        let s = rate_limits(&h, server_now).unwrap();
        assert_eq!(s.tokens.reset_after, Some(Duration::from_secs(30)));
    }

    #[test]
    fn odd_counts_are_tolerated() {
        let h = headers(&[
            ("x-ratelimit-limit-requests", "60.0"),
            ("x-ratelimit-remaining-requests", "-1"),
            ("x-ratelimit-reset-requests", "tomorrow"),
        ]);
        let s = rate_limits(&h, at(0)).unwrap();
        assert_eq!(s.requests.limit, Some(60));
        assert_eq!(s.requests.remaining, None);
        assert_eq!(s.requests.reset_after, None);
    }

    proptest::proptest! {
        /// Whatever a gateway writes as its reset, the wait read from it is never past the cap,
        /// and one in seconds is read as that many seconds.
        #[test]
        fn a_generic_reset_is_bounded(
            number in proptest::num::f64::ANY,
            secs in 0u32..=31_536_000,
            text in "\\PC{0,24}",
        ) {
            let now = at(1_700_000_000);
            for v in [number.to_string(), text] {
                if let Some(d) = generic_reset(&v, now) {
                    proptest::prop_assert!(d <= MAX_HINT, "{v}");
                }
            }
            let want = Duration::from_secs(u64::from(secs)).min(MAX_HINT);
            proptest::prop_assert_eq!(generic_reset(&secs.to_string(), now), Some(want));
        }
    }
}
