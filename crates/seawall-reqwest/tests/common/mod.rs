//! What the loopback tests of this crate share: the chaos upstream on a free port, an OpenAI
//! chat request, a retry layer with millisecond delays, and a raw TCP server for the faults the
//! chaos upstream does not play (a connection closed after the request, a redirect).
//!
//! Real sockets mean real time: latencies are milliseconds, and every test runs under a
//! generous limit so that a hang fails instead of blocking CI.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use seawall_mock::{MockUpstream, Profile};
use seawall_retry::BackoffRetryLayer;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Barrier;

/// The key the tests send.
pub const KEY: &str = "sk-e2e-0123456789abcdef";

/// Far longer than any test needs: reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(30);

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Runs `f` under the time limit.
pub async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("the test hung: no outcome within its time limit")
}

/// The chaos upstream on loopback.
pub struct Mock {
    pub addr: SocketAddr,
    pub upstream: MockUpstream,
}

pub async fn start(profile: Profile) -> Mock {
    profile.validate().expect("a valid profile");
    let (addr, upstream) = seawall_test_support::start_mock(profile).await;
    Mock { addr, upstream }
}

impl Mock {
    /// The OpenAI base URL of this mock.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The absolute chat completions URL of this mock.
    pub fn chat_url(&self) -> String {
        format!("{}/chat/completions", self.base_url())
    }
}

/// An OpenAI chat completion request body.
pub fn chat_body(model: &str, stream: bool) -> String {
    json!({
        "model": model,
        "max_tokens": 64,
        "stream": stream,
        "messages": [{"role": "user", "content": "Say hello"}],
    })
    .to_string()
}

/// A retry layer with real-time-friendly delays (milliseconds, no jitter on hints), overloads
/// waited out after `overload` each.
pub fn retry(max_attempts: u32, overload: Duration) -> BackoffRetryLayer {
    BackoffRetryLayer::builder()
        .max_attempts(max_attempts)
        .base_delay(ms(1))
        .max_delay(ms(20))
        .overload_min_delay(overload)
        .hint_jitter(0.0)
        .seed(7)
        .build()
        .unwrap()
}

/// What the raw server does with a request once it has read it.
#[derive(Clone, Copy)]
pub enum Raw {
    /// Closes the connection without a word.
    Close,
    /// Answers `307` to another path on itself.
    Redirect,
    /// Answers `200` to each request only once two requests are in: it never answers
    /// requests that are sent one after the other.
    OkWhenTwo,
}

/// A raw HTTP/1.1 server on loopback: its address and how many requests it has read.
pub async fn raw_server(action: Raw) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    let both = Arc::new(Barrier::new(2));
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let count = count.clone();
            let both = both.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // One whole request: its head, then as many body bytes as it announces.
                    let used = loop {
                        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                            let len = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            if buf.len() >= end + 4 + len {
                                break end + 4 + len;
                            }
                        }
                        match conn.read(&mut chunk).await {
                            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                            _ => return,
                        }
                    };
                    buf.drain(..used);
                    count.fetch_add(1, Ordering::SeqCst);
                    match action {
                        // Dropped: the connection closes.
                        Raw::Close => return,
                        Raw::Redirect => {
                            let answer = format!(
                                "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://{addr}/elsewhere\r\n\
                                 content-length: 0\r\n\r\n"
                            );
                            if conn.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                        Raw::OkWhenTwo => {
                            both.wait().await;
                            let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                                          content-length: 2\r\n\r\n{}";
                            if conn.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (addr, seen)
}
