//! The response future of [`Classify`](crate::Classify).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::SystemTime;

use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body::Body;
use seawall_core::{BodyReport, BoxError, LlmError};
use tokio::time::Instant;

use crate::body::ClassifiedBody;
use crate::classifier::{Classifier, ErrorResponse};
use crate::hints;
use crate::parse::Parser;

pin_project_lite::pin_project! {
    /// The future of [`Classify`](crate::Classify): waits for the response head; on success
    /// wraps the body in a [`ClassifiedBody`], on failure reads at most the error-body limit of
    /// the body, drops the rest, and returns the classified [`LlmError`].
    pub struct ResponseFuture<F, B, C> {
        #[pin]
        state: State<F, B>,
        classifier: C,
        limit: usize,
        streaming: bool,
        known_api: bool,
        started: Instant,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Calling {
            #[pin]
            future: F,
        },
        Reading {
            head: Option<http::response::Parts>,
            #[pin]
            body: B,
            buf: Vec<u8>,
            truncated: bool,
        },
        Done,
    }
}

impl<F, B, C> ResponseFuture<F, B, C> {
    pub(crate) fn new(
        future: F,
        classifier: C,
        limit: usize,
        streaming: bool,
        known_api: bool,
        started: Instant,
    ) -> Self {
        ResponseFuture {
            state: State::Calling { future },
            classifier,
            limit,
            streaming,
            known_api,
            started,
        }
    }
}

impl<F, B, C> std::fmt::Debug for ResponseFuture<F, B, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Calling { .. } => "calling",
            State::Reading { .. } => "reading error body",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("error_body_limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// Whether a successful body is an SSE stream: by its content type, or, without one, by the
/// request's `stream` flag.
fn is_sse(headers: &HeaderMap, streaming: bool) -> bool {
    match headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    {
        Some(ct) => ct
            .trim_start()
            .get(..17)
            .is_some_and(|p| p.eq_ignore_ascii_case("text/event-stream")),
        None => streaming,
    }
}

impl<F, B, E, C> Future for ResponseFuture<F, B, C>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    B: Body<Data = Bytes>,
    C: Classifier,
{
    type Output = Result<Response<ClassifiedBody<B>>, LlmError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Calling { future } => {
                    let response = match ready!(future.poll(cx)) {
                        Ok(r) => r,
                        Err(e) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(this
                                .classifier
                                .classify_transport_error(e.into())));
                        }
                    };
                    let (mut parts, body) = response.into_parts();
                    if this.classifier.is_failure(parts.status, &parts.headers) {
                        this.state.set(State::Reading {
                            head: Some(parts),
                            body,
                            buf: Vec::new(),
                            truncated: false,
                        });
                        continue;
                    }
                    let report = Arc::new(BodyReport::starting_at(*this.started));
                    if let Some(snap) = hints::rate_limits(&parts.headers, SystemTime::now()) {
                        parts.extensions.insert(snap);
                    }
                    parts.extensions.insert(report.clone());
                    let parser = if is_sse(&parts.headers, *this.streaming) {
                        Parser::sse(hints::request_id(&parts.headers), *this.known_api)
                    } else {
                        Parser::json()
                    };
                    this.state.set(State::Done);
                    let body = ClassifiedBody::new(body, report, parser);
                    return Poll::Ready(Ok(Response::from_parts(parts, body)));
                }
                StateProj::Reading {
                    head,
                    mut body,
                    buf,
                    truncated,
                } => {
                    let limit = *this.limit;
                    while buf.len() < limit {
                        match ready!(body.as_mut().poll_frame(cx)) {
                            Some(Ok(frame)) => {
                                if let Ok(data) = frame.into_data() {
                                    let take = (limit - buf.len()).min(data.len());
                                    buf.extend_from_slice(&data[..take]);
                                    *truncated |= take < data.len();
                                }
                            }
                            // A body that fails half-way is classified from what arrived.
                            Some(Err(_)) | None => break,
                        }
                    }
                    if buf.len() >= limit && !body.is_end_stream() {
                        *truncated = true;
                    }
                    let Some(head) = head.take() else {
                        continue;
                    };
                    let response = ErrorResponse::new(head.status, &head.headers, buf)
                        .with_truncated(*truncated);
                    let err = this.classifier.classify_response(&response);
                    // Dropping the state drops the unread rest of the body.
                    this.state.set(State::Done);
                    return Poll::Ready(Err(err));
                }
                StateProj::Done => seawall_core::polled_after_completion(),
            }
        }
    }
}
