//! The incident: the seeded workload, the two upstreams (the primary provider and a backup
//! provider) as chaos profiles, and the prices.
//!
//! Two incidents can be chosen (`--scenario`): the default bad minute ([`Incident::Storm`]) and
//! a long outage of the primary with its key running out of quota and prompts too long for the
//! model ([`Incident::Outage`]). In both the backup provider has stream faults of its own (cuts,
//! error events, keep-alives) at its own rates: a policy that falls back meets them too.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use seawall::core::SeededRandom;
use seawall::mock::{Count, Delay, Draws, ErrorRule, KeepAliveStyle, MalformedKind, Profile};

/// The model every client asks for, served by the primary provider.
pub(crate) const PRIMARY_MODEL: &str = "gpt-4o";
/// The same model at a second, OpenAI-compatible provider: seawall's fallback target.
pub(crate) const BACKUP_MODEL: &str = "gpt-4o-backup";
/// A model with a larger context window at the backup provider: where a prompt too long for
/// [`PRIMARY_MODEL`] can still be served (the fallback target of context-length errors).
pub(crate) const LARGE_MODEL: &str = "gpt-4.1";
/// The context window of [`PRIMARY_MODEL`] and [`BACKUP_MODEL`] in the outage incident. Smaller
/// than the real model's, so the long prompts that overflow it stay cheap to simulate.
pub(crate) const CONTEXT_WINDOW: u32 = 8_192;
/// Characters of a long prompt (about 10,000 tokens: beyond [`CONTEXT_WINDOW`]).
pub(crate) const LONG_PROMPT_CHARS: usize = 40_000;
/// The path every request goes to (relative: the transport picks the provider by model).
pub(crate) const PATH: &str = "/v1/chat/completions";
/// Dollars per million input and output tokens, the same at both providers.
pub(crate) const PRICE_IN: f64 = 2.50;
pub(crate) const PRICE_OUT: f64 = 10.00;
/// `max_tokens` of every request.
pub(crate) const MAX_TOKENS: u32 = 400;

/// Which incident the run simulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Incident {
    /// The default: a bad minute (a 503/529 burst) in a background of faults.
    Storm,
    /// The primary's key out of quota early in the run (429 `insufficient_quota` to the end)
    /// and a long outage of the primary (three minutes), with a share of prompts too long for
    /// the model.
    Outage,
}

impl Incident {
    /// The incidents, in the order `--help` lists them.
    pub(crate) const ALL: [Incident; 2] = [Incident::Storm, Incident::Outage];

    /// The name `--scenario` takes.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Incident::Storm => "storm",
            Incident::Outage => "outage",
        }
    }

    /// The incident named `name`, if any.
    pub(crate) fn parse(name: &str) -> Option<Incident> {
        Incident::ALL.into_iter().find(|i| i.name() == name)
    }

    /// Logical calls in the run when `--requests` does not say (the outage needs a longer run).
    pub(crate) fn default_requests(self) -> usize {
        match self {
            Incident::Storm => 3000,
            Incident::Outage => 6000,
        }
    }
}

/// Everything that shapes one run; printed so a reader can judge the workload.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    pub(crate) incident: Incident,
    pub(crate) seed: u64,
    pub(crate) clients: usize,
    pub(crate) requests: usize,
    /// Think time between a client's calls, uniform in this range.
    pub(crate) think: (Duration, Duration),
    /// Each client starts after a delay uniform in `[0, ramp]`.
    pub(crate) ramp: Duration,
    /// Prompt length in characters, uniform in this range (about 4 characters a token).
    pub(crate) prompt_chars: (usize, usize),
    /// Upstream timings are multiplied by this (1 on virtual time; smaller over real HTTP).
    pub(crate) time_scale: f64,
    pub(crate) primary_rpm: u32,
    pub(crate) primary_tpm: u32,
    pub(crate) backup_rpm: u32,
    pub(crate) backup_tpm: u32,
    /// The 503/529 burst at the primary: from, to, share of requests failed.
    pub(crate) outage: (Duration, Duration, f64),
    /// The share of calls that ask one of [`POPULAR_PROMPTS`] questions again, word for word
    /// (`--repeat`; 0 by default): what a cache can answer without a call.
    pub(crate) repeat: f64,
    /// The share of calls whose prompt is too long for [`CONTEXT_WINDOW`] (outage incident).
    pub(crate) long_prompts: f64,
    /// Tokens the primary's key may be billed before it answers 429 `insufficient_quota`.
    pub(crate) primary_quota: Option<u64>,
}

/// How many distinct questions the repeated calls ask (a help desk's frequent questions).
pub(crate) const POPULAR_PROMPTS: usize = 40;

impl Scenario {
    /// `incident` on virtual time.
    pub(crate) fn incident(
        incident: Incident,
        seed: u64,
        clients: usize,
        requests: usize,
    ) -> Scenario {
        let storm = Scenario {
            incident,
            seed,
            clients,
            requests,
            think: (Duration::from_millis(500), Duration::from_secs(6)),
            ramp: Duration::from_secs(5),
            prompt_chars: (400, 2400),
            time_scale: 1.0,
            primary_rpm: 1_500,
            primary_tpm: 1_000_000,
            backup_rpm: 2_000,
            backup_tpm: 1_500_000,
            outage: (Duration::from_secs(30), Duration::from_secs(60), 0.85),
            repeat: 0.0,
            long_prompts: 0.0,
            primary_quota: None,
        };
        match incident {
            Incident::Storm => storm,
            // Its key may be billed 250k tokens (about 450 calls), which runs out in the first
            // 20 s, then 429 insufficient_quota to the end; down (503/529) from 20 s to 200 s.
            // (With 800k, a policy whose breaker kept the traffic on the backup after the
            // outage never met the quota: that part of the incident went untested.)
            // The long prompts need more tokens a minute than the storm's workload.
            Incident::Outage => Scenario {
                primary_tpm: 2_000_000,
                backup_tpm: 2_000_000,
                outage: (Duration::from_secs(20), Duration::from_secs(200), 0.98),
                long_prompts: 0.03,
                primary_quota: Some(250_000),
                ..storm
            },
        }
    }

    /// The same incident over loopback HTTP on real time: upstream timings ten times faster,
    /// limits ten times higher per minute (the same per unit of compressed time), fewer calls.
    pub(crate) fn real_time(
        incident: Incident,
        seed: u64,
        clients: usize,
        requests: usize,
    ) -> Scenario {
        let mut s = Scenario::incident(incident, seed, clients, requests);
        s.time_scale = 0.1;
        s.think = (s.think.0.mul_f64(0.1), s.think.1.mul_f64(0.1));
        s.ramp = s.ramp.mul_f64(0.1);
        s.primary_rpm *= 10;
        s.primary_tpm *= 10;
        s.backup_rpm *= 10;
        s.backup_tpm *= 10;
        s.outage = (s.outage.0.mul_f64(0.1), s.outage.1.mul_f64(0.1), s.outage.2);
        s
    }

    /// The fleet run's incident (`--replicas`): the real-time scaling of [`Scenario::real_time`],
    /// with both providers at 500 RPM / 500k TPM, so that the fleet's traffic needs more than
    /// they admit in the seconds it lasts (their buckets start with a minute's worth).
    pub(crate) fn fleet(seed: u64, clients: usize, requests: usize) -> Scenario {
        let mut s = Scenario::real_time(Incident::Storm, seed, clients, requests);
        s.primary_rpm = 500;
        s.primary_tpm = 500_000;
        s.backup_rpm = 500;
        s.backup_tpm = 500_000;
        s
    }

    fn ms(&self, ms: u64) -> Duration {
        Duration::from_millis(ms).mul_f64(self.time_scale)
    }

    /// The primary provider. `storm` adds the faults; without it this is the calm upstream of
    /// the baseline run: same latencies (minus the slow-first-token tail), same limits.
    pub(crate) fn primary_profile(&self, storm: bool) -> Profile {
        let sigma = if storm { 1.0 } else { 0.5 };
        let p = Profile::default()
            .seed(self.seed ^ 0x5eed_0001)
            .draws(Draws::Request)
            .rpm(self.primary_rpm)
            .tpm(self.primary_tpm)
            .head_latency(Delay::uniform(self.ms(20), self.ms(80)))
            .first_token_latency(
                Delay::lognormal(self.ms(450), sigma)
                    .plus(self.ms(150))
                    .capped(self.ms(30_000)),
            )
            .per_token_latency(Delay::uniform(self.ms(0), self.ms(30)).plus(self.ms(10)))
            .output_tokens(Count::range(40, 350));
        if !storm {
            return p;
        }
        let (from, to, share) = self.outage;
        let mut p = p;
        if let Some(tokens) = self.primary_quota {
            p = p.quota_tokens(tokens);
        }
        if self.long_prompts > 0.0 {
            p = p.model_context_window(PRIMARY_MODEL, CONTEXT_WINDOW);
        }
        p.keepalives(0.2, self.ms(1_000), KeepAliveStyle::Comment)
            .cut_streams(0.004, Count::range(1, 100), false)
            .mid_stream_errors(0.004, Count::range(0, 20))
            .malformed(0.003, &[MalformedKind::Html502])
            .error(
                ErrorRule::outage(529, from, to)
                    .statuses(&[529, 503])
                    .probability(share),
            )
            .error(ErrorRule::random(500, 0.01))
            .error(ErrorRule::random(503, 0.02).retry_after(Duration::from_secs(2)))
    }

    /// The backup provider: a little slower to the first token, with the storm's long tail of
    /// slow first tokens (lognormal sigma 1.0, as the primary's; the keep-alives come with it),
    /// its own limits, a light background of 500s and stream faults of its own (cuts, error
    /// events, keep-alives, a few HTML 502s) at its own rates. Only runs in the incident use it. In the outage incident it also serves [`LARGE_MODEL`], and
    /// its copy of the model has the primary's context window.
    pub(crate) fn backup_profile(&self) -> Profile {
        let mut p = Profile::default()
            .seed(self.seed ^ 0x5eed_0001)
            .draws(Draws::Request)
            .rpm(self.backup_rpm)
            .tpm(self.backup_tpm)
            .head_latency(Delay::uniform(self.ms(30), self.ms(100)))
            .first_token_latency(
                Delay::lognormal(self.ms(600), 1.0)
                    .plus(self.ms(250))
                    .capped(self.ms(30_000)),
            )
            .per_token_latency(Delay::uniform(self.ms(0), self.ms(30)).plus(self.ms(10)))
            .output_tokens(Count::range(40, 350))
            .keepalives(0.15, self.ms(1_000), KeepAliveStyle::Comment)
            .cut_streams(0.005, Count::range(1, 100), false)
            .mid_stream_errors(0.003, Count::range(0, 20))
            .malformed(0.002, &[MalformedKind::Html502])
            .error(ErrorRule::random(500, 0.01));
        if self.long_prompts > 0.0 {
            p = p.model_context_window(BACKUP_MODEL, CONTEXT_WINDOW);
        }
        p
    }

    /// The workload: per client, when it starts and what it asks, in order. The same for
    /// every policy.
    pub(crate) fn workload(&self) -> Vec<ClientPlan> {
        let per = self.requests / self.clients.max(1);
        let extra = self.requests % self.clients.max(1);
        (0..self.clients)
            .map(|c| {
                let rng =
                    SeededRandom::new(self.seed.wrapping_mul(0x9E37_79B9).wrapping_add(c as u64));
                let uniform = |lo: Duration, hi: Duration| lo + (hi - lo).mul_f64(unit(&rng));
                let start = uniform(Duration::ZERO, self.ramp);
                let n = per + usize::from(c < extra);
                let calls = (0..n)
                    .map(|i| {
                        let span = self.prompt_chars.1 - self.prompt_chars.0;
                        let chars = self.prompt_chars.0 + (unit(&rng) * span as f64) as usize;
                        // Drawn only when asked for, so the default workload stays the same.
                        let body = if self.long_prompts > 0.0 && unit(&rng) < self.long_prompts {
                            request_body(c, i, LONG_PROMPT_CHARS)
                        } else if self.repeat > 0.0 && unit(&rng) < self.repeat {
                            let k = (unit(&rng) * POPULAR_PROMPTS as f64) as usize;
                            popular_body(k.min(POPULAR_PROMPTS - 1), self.prompt_chars.0)
                        } else {
                            request_body(c, i, chars)
                        };
                        Call {
                            body,
                            think: uniform(self.think.0, self.think.1),
                        }
                    })
                    .collect();
                ClientPlan { start, calls }
            })
            .collect()
    }

    /// A few lines describing the run, for the header of the report.
    pub(crate) fn describe(&self, mode: &str) -> String {
        let mut s = String::new();
        let secs = |d: Duration| d.as_secs_f64();
        let _ = writeln!(
            s,
            "workload   {} clients, {} streamed chat completions ({} each, think time {:.1}-{:.1} s, \
             start spread over {:.1} s), prompts {}-{} chars, max_tokens {}, seed {}  [{}]",
            self.clients,
            self.requests,
            self.requests / self.clients.max(1),
            secs(self.think.0),
            secs(self.think.1),
            secs(self.ramp),
            self.prompt_chars.0,
            self.prompt_chars.1,
            MAX_TOKENS,
            self.seed,
            mode
        );
        if self.repeat > 0.0 {
            let _ = writeln!(
                s,
                "repeats    {:.0}% of calls ask one of {POPULAR_PROMPTS} frequent questions again, word \
                 for word ({} chars)",
                self.repeat * 100.0,
                self.prompt_chars.0
            );
        }
        let _ = writeln!(
            s,
            "primary    {PRIMARY_MODEL}: {} RPM / {} TPM (a request costs prompt + max_tokens), \
             first token {:.2} s + lognormal(median {:.2} s, sigma 1.0 in the storm, 0.5 calm), \
             10-40 ms a token, 40-350 tokens",
            self.primary_rpm,
            self.primary_tpm,
            secs(self.ms(150)),
            secs(self.ms(450)),
        );
        let burst = match self.incident {
            Incident::Storm => "529/503 burst",
            Incident::Outage => "outage (529/503)",
        };
        let _ = writeln!(
            s,
            "{:<10} {burst} {:.0}-{:.0} s for {:.0}% of requests; always 1% 500, 2% 503 \
             (retry-after 2 s), 0.3% HTML 502; streams: 0.4% cut after 1-100 tokens, 0.4% error \
             event after 0-20 tokens, 20% keep-alives before the first token",
            self.incident.name(),
            secs(self.outage.0),
            secs(self.outage.1),
            self.outage.2 * 100.0,
        );
        if let Some(tokens) = self.primary_quota {
            let _ = writeln!(
                s,
                "quota      the primary's key is billed at most {tokens} tokens, then answers 429 \
                 insufficient_quota to the end of the run"
            );
        }
        if self.long_prompts > 0.0 {
            let _ = writeln!(
                s,
                "context    {:.0}% of prompts are {LONG_PROMPT_CHARS} chars (~{} tokens), over the \
                 {CONTEXT_WINDOW}-token window of {PRIMARY_MODEL} and {BACKUP_MODEL} (400 \
                 context_length_exceeded); {LARGE_MODEL} at the backup provider serves them",
                self.long_prompts * 100.0,
                LONG_PROMPT_CHARS / 4,
            );
        }
        let _ = writeln!(
            s,
            "backup     {BACKUP_MODEL} (a second provider, same price; the policies with a \
             fallback use it): {} RPM / {} TPM, first token {:.2} s + lognormal(median {:.2} s, \
             sigma 1.0), 1% 500, 0.2% HTML 502; streams: 0.5% cut after 1-100 tokens, 0.3% error event after \
             0-20 tokens, 15% keep-alives before the first token",
            self.backup_rpm,
            self.backup_tpm,
            secs(self.ms(250)),
            secs(self.ms(600)),
        );
        let _ = writeln!(
            s,
            "draws      by request: a call's latencies, answer length and server errors come \
             from its prompt, model and how often the provider saw it before, its stream's cut \
             or error event from its prompt and how many streams answered it before (the same \
             seed at both providers), so every row meets the same luck on the same call (not \
             the next draw in order of arrival, which each row's retries shift)"
        );
        let _ = write!(
            s,
            "prices     ${PRICE_IN:.2} / ${PRICE_OUT:.2} per million input / output tokens, \
             billed as the mock bills (prompt when accepted, each streamed token as sent)"
        );
        s
    }
}

/// One client's calls.
#[derive(Debug, Clone)]
pub(crate) struct ClientPlan {
    pub(crate) start: Duration,
    pub(crate) calls: Vec<Call>,
}

/// One logical call and the pause after it.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) body: Bytes,
    pub(crate) think: Duration,
}

impl Call {
    /// The HTTP request of this call (relative URI: the transport picks the provider).
    pub(crate) fn request(&self) -> http::Request<Bytes> {
        http::Request::post(PATH)
            .header("authorization", "Bearer sk-storm-demo")
            .header("content-type", "application/json")
            .body(self.body.clone())
            .expect("a static request is valid")
    }
}

fn unit(rng: &SeededRandom) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

fn request_body(client: usize, call: usize, chars: usize) -> Bytes {
    chat_body(format!("client {client} question {call}: "), chars)
}

/// One of the frequent questions: the same body whoever asks it.
fn popular_body(k: usize, chars: usize) -> Bytes {
    chat_body(format!("frequent question {k}: "), chars)
}

fn chat_body(mut text: String, chars: usize) -> Bytes {
    const FILLER: &str = "please summarise the incident report in plain words ";
    while text.len() < chars {
        text.push_str(FILLER);
    }
    text.truncate(chars);
    Bytes::from(format!(
        r#"{{"model":"{PRIMARY_MODEL}","stream":true,"stream_options":{{"include_usage":true}},"max_tokens":{MAX_TOKENS},"messages":[{{"role":"user","content":"{text}"}}]}}"#
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backup_suffers_stream_faults_of_its_own_in_every_incident() {
        for incident in Incident::ALL {
            let p = Scenario::incident(incident, 7, 10, 100).backup_profile();
            assert!(p.stream.cut.probability > 0.0, "{incident:?}");
            assert!(p.stream.error.probability > 0.0, "{incident:?}");
            assert!(p.stream.keepalive.probability > 0.0, "{incident:?}");
        }
    }

    #[test]
    fn the_outage_runs_three_minutes_and_exhausts_the_primarys_quota() {
        let s = Scenario::incident(Incident::Outage, 7, 10, 100);
        assert!(s.outage.1 - s.outage.0 >= Duration::from_secs(180));
        let storm = s.primary_profile(true);
        assert_eq!(storm.quota.tokens, s.primary_quota);
        assert_eq!(
            storm.context.models.get(PRIMARY_MODEL),
            Some(&CONTEXT_WINDOW)
        );
        // The calm reference serves every prompt, without a quota.
        let calm = s.primary_profile(false);
        assert_eq!(calm.quota.tokens, None);
        assert!(calm.context.models.is_empty());
        // The larger model has no window at the backup; the backup's copy of gpt-4o has one.
        let backup = s.backup_profile();
        assert_eq!(
            backup.context.models.get(BACKUP_MODEL),
            Some(&CONTEXT_WINDOW)
        );
        assert_eq!(backup.context.models.get(LARGE_MODEL), None);
    }

    #[test]
    fn a_share_of_the_outages_prompts_overflow_the_window_and_none_of_the_storms() {
        let long = |incident| {
            Scenario::incident(incident, 7, 50, 2000)
                .workload()
                .iter()
                .flat_map(|p| &p.calls)
                .filter(|c| c.body.len() > LONG_PROMPT_CHARS)
                .count()
        };
        assert_eq!(long(Incident::Storm), 0);
        let n = long(Incident::Outage);
        assert!((30..=90).contains(&n), "{n} long prompts of 2000");
    }

    #[test]
    fn scenarios_parse_by_name() {
        assert_eq!(Incident::parse("outage"), Some(Incident::Outage));
        assert_eq!(Incident::parse("storm"), Some(Incident::Storm));
        assert_eq!(Incident::parse("flood"), None);
    }
}
