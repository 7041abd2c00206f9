//! rig's OpenAI-compatible provider sending through a `ClientWithMiddleware` with seawall in
//! it: rig 0.44 takes any `reqwest_middleware::ClientWithMiddleware` as its transport through
//! `rig_reqwest::ReqwestMiddlewareClient` (feature `reqwest-middleware-rustls` or
//! `reqwest-middleware-native-tls` of rig-reqwest), so seawall's retries, breaker, gate,
//! budget and fallback apply to every rig call without changing rig.
//!
//! The chaos upstream answers the first calls with a 429 and a `retry-after: 1`: seawall waits
//! the hint and retries, and rig sees the answer.

use std::time::{Duration, Instant};

use rig_core::completion::CompletionRequest;
use rig_core::providers::openai::OpenAIConfig;
use seawall_classify::ClassifyLayer;
use seawall_mock::{ErrorRule, MockUpstream, Profile};
use seawall_reqwest::{NextService, ReqwestTransport, SeawallMiddleware};
use seawall_retry::BackoffRetryLayer;
use tower::ServiceBuilder;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // The chaos upstream on a free loopback port: 429s for its first half second.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let upstream = MockUpstream::new(
        Profile::default().error(
            ErrorRule::outage(429, Duration::ZERO, Duration::from_millis(500))
                .retry_after(Duration::from_secs(1)),
        ),
    );
    tokio::spawn(seawall_mock::serve(listener, upstream.clone()));

    // seawall in the middleware chain: built once, shared by every call.
    let stack = ServiceBuilder::new()
        .layer(BackoffRetryLayer::new())
        .layer(ClassifyLayer::new())
        .service(NextService::new());
    let client =
        reqwest_middleware::ClientBuilder::new(ReqwestTransport::client_builder().build()?)
            .with(SeawallMiddleware::new(stack))
            .build();

    // rig, unchanged, on that client.
    let openai = OpenAIConfig::new("sk-rig-example-0123456789")
        .with_base_url(format!("http://{addr}/v1"))
        .connect(rig_reqwest::ReqwestMiddlewareClient::from(client));
    let model = openai.chat("gpt-4o-mini");
    let started = Instant::now();
    let response = model.call(CompletionRequest::new("Say hello")).await?;
    let stats = upstream.stats();
    println!("{response:?}");
    println!(
        "answered after {:?}: the upstream saw {} requests, {} of them limited",
        started.elapsed(),
        stats.requests,
        stats.status(429)
    );
    assert_eq!(stats.ok, 1);
    assert!(stats.status(429) >= 1);
    Ok(())
}
