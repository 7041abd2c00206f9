//! A caller's bug and extreme settings: a call polled after it finished panics with the
//! shared message, and no configured timeout panics a call.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;
use seawall_core::{FailureClass, LlmError};
use seawall_stream::{StreamTimeoutLayer, StreamTimeouts};
use seawall_test_support::{
    Chunks, extreme_duration_or_none as extreme, paused_runtime, poll_twice,
};
use tower::{Layer, Service, ServiceExt};

/// An upstream whose head (an SSE stream of two events) arrives after `delay`.
fn upstream(
    delay: Duration,
) -> impl Service<Request<Bytes>, Response = Response<Full<Bytes>>, Error = LlmError> {
    tower::service_fn(move |_: Request<Bytes>| async move {
        tokio::time::sleep(delay).await;
        Ok(Response::builder()
            .header("content-type", "text/event-stream")
            .body(Full::new(Bytes::from_static(
                b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n",
            )))
            .unwrap())
    })
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_finished_call_again_panics() {
    let mut svc = StreamTimeoutLayer::new().layer(upstream(Duration::ZERO));
    poll_twice(svc.ready().await.unwrap().call(Request::new(Bytes::new())));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn no_timeout_setting_panics_a_call(
        attempt in extreme(),
        first_token in extreme(),
        idle in extreme(),
        total in extreme(),
        delay in 0u64..120,
    ) {
        let rt = paused_runtime();
        let config = StreamTimeouts::new()
            .with_attempt(attempt)
            .with_first_token(first_token)
            .with_idle(idle)
            .with_total(total);
        let outcome = rt.block_on(async {
            let svc = StreamTimeoutLayer::builder()
        .timeouts(config)
        .build()
        .unwrap().layer(upstream(Duration::from_secs(delay)));
            let resp = svc.oneshot(Request::new(Bytes::new())).await?;
            resp.into_body().collect().await.map(|b| b.to_bytes())
        });
        match outcome {
            Ok(body) => prop_assert!(body.ends_with(b"[DONE]\n\n")),
            Err(e) => prop_assert_eq!(e.class(), FailureClass::Timeout, "{}", e),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_that_knows_its_length_counts_the_frames_held_before_the_commit_point() {
    // A keep-alive and a role-only chunk come before the first token: the layer holds them
    // until it commits, then replays them ahead of what the upstream still has.
    let frames = [
        &b": keep-alive\n\n"[..],
        b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
        b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
        b"data: [DONE]\n\n",
    ];
    let total: u64 = frames.iter().map(|f| f.len() as u64).sum();
    let svc = StreamTimeoutLayer::new().layer(tower::service_fn(move |_: Request<Bytes>| {
        let body = Chunks(frames.iter().map(|f| Bytes::from_static(f)).collect());
        async move {
            Ok::<_, LlmError>(
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(body)
                    .unwrap(),
            )
        }
    }));
    let resp = svc.oneshot(Request::new(Bytes::new())).await.unwrap();
    let mut body = resp.into_body();
    let mut left = total;
    loop {
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(left));
        let Some(frame) = body.frame().await else {
            break;
        };
        left -= frame.unwrap().into_data().unwrap().len() as u64;
    }
    assert_eq!(left, 0, "every byte was read");
}
