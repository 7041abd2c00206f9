//! Incremental parsers of successful bodies, one module per job: [`sse`] gives the events of
//! both wire formats their meaning (on the shared SSE splitter of `seawall-core`), [`json`]
//! reads plain JSON bodies whole or through a head and a rolling tail window, and [`usage`]
//! reads the usage fields both find. Neither parser buffers the body. This module holds what
//! they share: the one [`Parser`] the body drives, and the errors a body can end in.

mod json;
mod memo;
mod scan;
mod sse;
mod usage;

use http::StatusCode;

use seawall_core::{BodyReport, BoxError, FailureClass, LlmError};

use crate::classifier::{class_of, error_from};
use crate::error_body::ProviderError;

use json::JsonScanner;
pub(crate) use json::{Verdict, read_whole};
use sse::SseParser;

/// The error of an error object inside a successful answer (an SSE error event, or a `200`
/// whose JSON body is an error): built by the built-in rules for both wire formats.
pub(crate) fn embedded_error(e: &ProviderError, what: &str) -> LlmError {
    let class = class_of(200, e);
    let mut err = error_from(class, None, e, true).with_status(StatusCode::OK);
    if e.message().is_none() {
        err = LlmError::new(class, what).with_status(StatusCode::OK);
        if let Some(c) = e.code() {
            err = err.with_code(c);
        }
        if let Some(t) = e.error_type() {
            err = err.with_error_type(t);
        }
        if let Some(id) = e.request_id() {
            err = err.with_request_id(id);
        }
    }
    err
}

/// The error of an answer whose finish word says it failed
/// ([`FinishReason::failure`](seawall_core::FinishReason::failure)), inside a `200`.
pub(crate) fn cut_answer(word: &str) -> Option<LlmError> {
    seawall_core::FinishReason::failure(word).map(|e| e.with_status(StatusCode::OK))
}

/// The error of an answer that finished without any content: `EmptyResponse`, worth another
/// try, unless the provider's content filter is what stopped it (OpenAI's and Azure's
/// `content_filter`, Anthropic's `refusal`): the same prompt would be stopped again, so it is
/// `ContentFiltered`, never retried, and a content-policy fallback may take it.
pub(crate) fn empty_answer(report: &BodyReport) -> LlmError {
    let err = if report.finish_reason() == Some(&seawall_core::FinishReason::ContentFilter) {
        LlmError::new(
            FailureClass::ContentFiltered,
            "the provider's content filter stopped the answer before any content",
        )
    } else {
        LlmError::new(
            FailureClass::EmptyResponse,
            "the answer finished without any content",
        )
    };
    err.with_status(StatusCode::OK)
}

/// A body error when the body broke or ended early: `StreamInterrupted` once content was
/// seen, else `Disconnected` (nothing reached the caller yet, and the upstream may have billed
/// the prompt).
fn broken(report: &BodyReport, what: &str) -> LlmError {
    if report.has_content() {
        LlmError::new(FailureClass::StreamInterrupted, what)
    } else {
        LlmError::new(
            FailureClass::Disconnected,
            format!("{what} (before any content)"),
        )
    }
}

/// The parser of one successful body.
#[derive(Debug)]
pub(crate) enum Parser {
    /// Boxed: a stream's parser is three times the size of the others, and the parser rides
    /// in the body that every layer above moves; a stream pays one allocation for it instead.
    Sse(Box<SseParser>),
    /// Boxed too: only an answer not read whole before the response is handed on (one over
    /// the read-ahead limit, or one the whole-answer read was not sure of) uses it.
    Json(Box<JsonScanner>),
    /// The body was read whole and reported before the response was handed on.
    Read,
    /// A body in a content coding (gzip, ...) that no layer below undid: passed on untouched.
    /// Its first bytes count as content (the stream layer commits on them); its end says
    /// nothing of a finish marker, so the report never claims one.
    Opaque,
}

impl Parser {
    /// `known_api`: the request went to OpenAI or Anthropic, so the finish marker is expected
    /// even before an event of theirs was recognised.
    pub(crate) fn sse(request_id: Option<&str>, known_api: bool) -> Parser {
        Parser::Sse(Box::new(SseParser::new(request_id, known_api)))
    }

    pub(crate) fn json() -> Parser {
        Parser::Json(Box::default())
    }

    /// For a body already read whole and reported ([`read_whole`]).
    pub(crate) fn read() -> Parser {
        Parser::Read
    }

    /// Feeds a chunk; returns an error the stream carried, if any.
    pub(crate) fn feed(&mut self, chunk: &[u8], report: &BodyReport) -> Option<LlmError> {
        match self {
            Parser::Sse(p) => p.feed(chunk, report),
            Parser::Json(p) => {
                p.feed(chunk, report);
                None
            }
            Parser::Opaque => {
                if !chunk.is_empty() {
                    report.record_content();
                }
                None
            }
            Parser::Read => None,
        }
    }

    /// The body ended normally; returns an error if it ended too early.
    pub(crate) fn eof(&mut self, report: &BodyReport) -> Option<LlmError> {
        match self {
            Parser::Sse(p) => p.eof(report),
            Parser::Json(p) => p.eof(report),
            Parser::Read | Parser::Opaque => None,
        }
    }

    /// The body failed with a transport error.
    pub(crate) fn failed(&mut self, error: BoxError, report: &BodyReport) -> LlmError {
        let error = match error.downcast::<LlmError>() {
            Ok(e) => return *e,
            Err(e) => e,
        };
        if let Parser::Sse(p) = self {
            p.flush_usage(report);
        }
        let mut err = broken(report, &format!("response body failed: {error}"));
        if let Some(id) = match self {
            Parser::Sse(p) => p.request_id(),
            _ => None,
        } {
            err = err.with_request_id(id);
        }
        err.with_status(StatusCode::OK).with_source(error)
    }
}
