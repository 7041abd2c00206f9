//! The incident: the seeded workload, the two upstreams (the primary provider and a backup
//! provider) as chaos profiles, and the prices.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use seawall::core::SeededRandom;
use seawall::mock::{Count, Delay, ErrorRule, KeepAliveStyle, MalformedKind, Profile};

/// The model every client asks for, served by the primary provider.
pub(crate) const PRIMARY_MODEL: &str = "gpt-4o";
/// The same model at a second, OpenAI-compatible provider: seawall's fallback target.
pub(crate) const BACKUP_MODEL: &str = "gpt-4o-backup";
/// The path every request goes to (relative: the transport picks the provider by model).
pub(crate) const PATH: &str = "/v1/chat/completions";
/// Dollars per million input and output tokens, the same at both providers.
pub(crate) const PRICE_IN: f64 = 2.50;
pub(crate) const PRICE_OUT: f64 = 10.00;
/// `max_tokens` of every request.
pub(crate) const MAX_TOKENS: u32 = 400;

/// Everything that shapes one run; printed so a reader can judge the workload.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
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
    /// Whether seawall's rate buckets hold a minute's worth, as the providers' buckets do,
    /// rather than the gate's default of ten seconds' worth (the fleet run, whose traffic
    /// lasts seconds: there the providers' full buckets are most of what they admit).
    pub(crate) minute_buckets: bool,
    /// The share of calls that ask one of [`POPULAR_PROMPTS`] questions again, word for word
    /// (`--repeat`; 0 by default): what a cache can answer without a call.
    pub(crate) repeat: f64,
}

/// How many distinct questions the repeated calls ask (a help desk's frequent questions).
pub(crate) const POPULAR_PROMPTS: usize = 40;

impl Scenario {
    /// The default incident, on virtual time.
    pub(crate) fn virtual_time(seed: u64, clients: usize, requests: usize) -> Scenario {
        Scenario {
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
            minute_buckets: false,
            repeat: 0.0,
        }
    }

    /// The same incident over loopback HTTP on real time: upstream timings ten times faster,
    /// limits ten times higher per minute (the same per unit of compressed time), fewer calls.
    pub(crate) fn real_time(seed: u64, clients: usize, requests: usize) -> Scenario {
        let mut s = Scenario::virtual_time(seed, clients, requests);
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
    /// they admit in the seconds it lasts (their buckets start with a minute's worth); seawall's
    /// rate buckets hold a minute's worth too, as the providers' do.
    pub(crate) fn fleet(seed: u64, clients: usize, requests: usize) -> Scenario {
        let mut s = Scenario::real_time(seed, clients, requests);
        s.primary_rpm = 500;
        s.primary_tpm = 500_000;
        s.backup_rpm = 500;
        s.backup_tpm = 500_000;
        s.minute_buckets = true;
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

    /// The backup provider: a little slower to the first token, its own limits, a light
    /// background of 500s. The same in the calm and the storm runs.
    pub(crate) fn backup_profile(&self) -> Profile {
        Profile::default()
            .seed(self.seed ^ 0x5eed_0002)
            .rpm(self.backup_rpm)
            .tpm(self.backup_tpm)
            .head_latency(Delay::uniform(self.ms(30), self.ms(100)))
            .first_token_latency(
                Delay::lognormal(self.ms(600), 0.5)
                    .plus(self.ms(250))
                    .capped(self.ms(30_000)),
            )
            .per_token_latency(Delay::uniform(self.ms(0), self.ms(30)).plus(self.ms(10)))
            .output_tokens(Count::range(40, 350))
            .error(ErrorRule::random(500, 0.01))
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
                        let body = if self.repeat > 0.0 && unit(&rng) < self.repeat {
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
        let _ = writeln!(
            s,
            "storm      529/503 burst {:.0}-{:.0} s for {:.0}% of requests; always 1% 500, 2% 503 \
             (retry-after 2 s), 0.3% HTML 502; streams: 0.4% cut after 1-100 tokens, 0.4% error \
             event after 0-20 tokens, 20% keep-alives before the first token",
            secs(self.outage.0),
            secs(self.outage.1),
            self.outage.2 * 100.0,
        );
        let _ = writeln!(
            s,
            "backup     {BACKUP_MODEL} (a second provider, same price; only seawall's fallback \
             uses it): {} RPM / {} TPM, first token {:.2} s + lognormal(median {:.2} s), 1% 500",
            self.backup_rpm,
            self.backup_tpm,
            secs(self.ms(250)),
            secs(self.ms(600)),
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
