//! Polling a finished call again is the caller's bug: it panics with the shared message
//! instead of returning an error the layers outside would act on.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use seawall_test_support::poll_twice;
use tower::{Layer, Service, ServiceExt};

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_finished_call_again_panics() {
    let inner = tower::service_fn(|_: http::Request<Bytes>| async {
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"{}"))))
    });
    let mut svc = seawall_observe::ObserveLayer::new().layer(inner);
    poll_twice(
        svc.ready()
            .await
            .unwrap()
            .call(http::Request::new(Bytes::new())),
    );
}
