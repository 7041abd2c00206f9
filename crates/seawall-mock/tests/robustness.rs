//! A caller's bug and extreme profiles: a response polled after it finished panics with the
//! shared message, and no latency, keep-alive or outage setting panics a call.

mod common;

use std::time::Duration;

use common::{anthropic_body, anthropic_req, openai_body, openai_req, upstream};
use http_body_util::BodyExt;
use proptest::prelude::*;
use seawall_mock::{Count, Delay, ErrorRule, KeepAliveStyle, Profile};
use seawall_test_support::{extreme_duration as extreme, paused_runtime, poll_twice};

#[tokio::test(start_paused = true)]
#[should_panic(expected = "seawall: future polled after completion")]
async fn polling_a_finished_response_again_panics() {
    let up = upstream(Profile::default());
    poll_twice(up.respond(openai_req(&openai_body(false), "sk-a")));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn no_duration_in_a_profile_panics_a_call(
        (lo, hi, plus) in (extreme(), extreme(), extreme()),
        first_token in extreme(),
        per_token in extreme(),
        keepalive in extreme(),
        (start, end, period, retry_after) in (extreme(), extreme(), extreme(), extreme()),
    ) {
        let profile = Profile::default()
            .seed(5)
            .rpm(1)
            .head_latency(Delay::uniform(lo, hi).plus(plus))
            .first_token_latency(Delay::fixed(first_token))
            .per_token_latency(Delay::fixed(per_token).capped(per_token))
            .output_tokens(Count::fixed(3))
            .keepalives(1.0, keepalive, KeepAliveStyle::Blank)
            .error(ErrorRule::outage(503, start, end).every(period).retry_after(retry_after));
        let rt = paused_runtime();
        let statuses = rt.block_on(async {
            let up = upstream(profile);
            let mut statuses = Vec::new();
            for req in [
                anthropic_req(&anthropic_body(true), "sk-ant"),
                anthropic_req(&anthropic_body(false), "sk-ant"),
                openai_req(&openai_body(true), "sk-a"),
            ] {
                let call = async {
                    let resp = up.respond(req).await.unwrap_or_else(|never| match never {});
                    let status = resp.status().as_u16();
                    // A few frames at most: a tiny keep-alive interval before a far-off first
                    // token is an endless (and valid) stream of keep-alives.
                    let mut body = resp.into_body();
                    for _ in 0..64 {
                        match body.frame().await {
                            Some(Ok(_)) => {}
                            _ => break,
                        }
                    }
                    status
                };
                // Ten years of paused time: long latencies are cut short here.
                let cut = Duration::from_secs(10 * 365 * 86_400);
                statuses.push(tokio::time::timeout(cut, call).await.ok());
            }
            statuses
        });
        for status in statuses.into_iter().flatten() {
            prop_assert!([200, 429, 503].contains(&status), "{}", status);
        }
    }
}
