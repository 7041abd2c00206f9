//! The cache's costs: a hit served from the in-memory store, the overhead a miss adds over
//! the service it wraps, the key's digest alone, the store's part of a miss in a full store,
//! and single flight under two-thread contention.
//! Before the timings it prints the allocations of one hit, for small and large requests and
//! answers: a hit allocates in proportion to the answer only.
//!
//! `cargo bench -p seawall-cache --bench cache`
//!
//! Wall-clock figures move with the machine's load; instruction counts do not. With
//! `CACHE_PROFILE=<part>` set, the binary instead runs `CACHE_PROFILE_N` calls (default
//! 10,000) of one part inside `profile_loop` and exits, for callgrind to count:
//!
//! ```text
//! CACHE_PROFILE=hit valgrind --tool=callgrind --toggle-collect='*profile_loop*' \
//!     target/release/deps/cache-<hash>
//! ```
//!
//! Parts: `key` (the key alone), `hit`, `miss`, `bare` (the inner service alone, the miss's
//! baseline), `key_fresh` (the key of each of the miss's new questions) and `none` (its
//! requests dropped uncalled, `key_fresh`'s baseline). Requests are built before the loop, so the counts are the cache's own; with
//! `CACHE_PROFILE_BUILD=each` each is built just before its call instead, for CPU time with
//! requests as warm in the caches as a request just received (see `profile`).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group};
use http_body::Body;
use http_body_util::Full;
use seawall_cache::{Answer, CacheKey, CacheLayer, KeyDeriver, MemoryStore, Wire};
use tower::{Layer, Service, ServiceExt};

/// The system allocator, counting the bytes allocated.
#[global_allocator]
static ALLOC: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

fn prompt(words: usize, tag: usize) -> Bytes {
    let text = "the sea is salty ".repeat(words);
    Bytes::from(format!(
        r#"{{"model":"gpt-4o-mini","temperature":0,"max_tokens":64,"messages":[{{"role":"system","content":"Be brief."}},{{"role":"user","content":"{text}{tag}"}}]}}"#
    ))
}

/// A new small question at each call.
fn new_questions() -> impl FnMut() -> Bytes {
    let mut i = 0;
    move || {
        i += 1;
        prompt(4, i)
    }
}

fn request(body: Bytes) -> http::Request<Bytes> {
    http::Request::post("http://localhost/v1/chat/completions")
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

fn answer_json(words: usize) -> Bytes {
    let text = "Waves carry salt. ".repeat(words);
    Bytes::from(format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini","choices":[{{"index":0,"message":{{"role":"assistant","content":"{text}"}},"logprobs":null,"finish_reason":"stop"}}],"usage":{{"prompt_tokens":20,"completion_tokens":12,"total_tokens":32}}}}"#
    ))
}

/// An upstream that answers at once with `answer`, counting its calls.
#[derive(Clone)]
struct Inner {
    answer: Bytes,
    calls: Arc<AtomicUsize>,
}

fn upstream(answer: Bytes, calls: Arc<AtomicUsize>) -> Inner {
    Inner { answer, calls }
}

impl Service<http::Request<Bytes>> for Inner {
    type Response = http::Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: http::Request<Bytes>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut resp = http::Response::new(Full::new(self.answer.clone()));
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        std::future::ready(Ok(resp))
    }
}

/// Calls `svc` and reads the whole body, polling by hand: every future here is ready at once.
fn run<S, B>(svc: &mut S, req: http::Request<Bytes>) -> usize
where
    S: Service<http::Request<Bytes>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(std::task::Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_ready());
    let mut fut = std::pin::pin!(svc.call(req));
    let Poll::Ready(resp) = fut.as_mut().poll(&mut cx) else {
        panic!("the bench's futures are ready at once");
    };
    let mut body = resp.unwrap().into_body();
    let mut n = 0;
    while let Poll::Ready(Some(frame)) = std::pin::Pin::new(&mut body).poll_frame(&mut cx) {
        n += frame.unwrap().into_data().map_or(0, |d| d.len());
    }
    n
}

fn allocations(label: &str, mut f: impl FnMut()) {
    f();
    let before = ALLOC.total_allocated();
    const N: usize = 1000;
    for _ in 0..N {
        f();
    }
    let bytes = (ALLOC.total_allocated() - before) / N;
    println!("bytes allocated per call, {label}: {bytes}");
}

fn hit_service(answer_words: usize) -> (seawall_cache::Cache<Inner>, Arc<AtomicUsize>) {
    let calls = Arc::default();
    let svc = CacheLayer::new(MemoryStore::new())
        .layer(upstream(answer_json(answer_words), Arc::clone(&calls)));
    (svc, calls)
}

fn bench(c: &mut Criterion) {
    // Allocations of a hit: flat in the request's size, the answer's bytes shared.
    for (req_words, answer_words) in [(4, 8), (400, 8), (4, 800)] {
        let (mut svc, _) = hit_service(answer_words);
        let body = prompt(req_words, 0);
        run(&mut svc, request(body.clone()));
        allocations(
            &format!(
                "hit, request {} B, answer {} B",
                body.len(),
                answer_json(answer_words).len()
            ),
            || {
                run(&mut svc, request(body.clone()));
            },
        );
    }

    let mut group = c.benchmark_group("cache");

    let small = prompt(4, 0);
    // Keying one request body: the small request, a 2 KiB prompt (where the canonical scan's
    // per-byte cost shows), the small request's fields in the order the OpenAI SDKs write them
    // (`messages`, `model`, then the rest alphabetically: already in the key's order of
    // members), the same with the sampling options a playground's exported code sets (names
    // of up to 21 bytes, `max_completion_tokens`), and a conversation of ten short turns.
    let sdk = |model_and_options: &str| {
        Bytes::from(format!(
            r#"{{"messages":[{{"role":"system","content":"Be brief."}},{{"role":"user","content":"{}0"}}],{model_and_options}}}"#,
            "the sea is salty ".repeat(4)
        ))
    };
    let turns: Vec<String> = (0..10)
        .map(|i| {
            let role = ["user", "assistant"][i % 2];
            format!(r#"{{"role":"{role}","content":"Turn {i}: the sea is salty."}}"#)
        })
        .collect();
    for (name, body) in [
        ("key_digest_small_request", small.clone()),
        ("key_digest_2kb_prompt", prompt(120, 0)),
        (
            "key_digest_sdk_order",
            sdk(r#""model":"gpt-4o-mini","max_tokens":64,"temperature":0"#),
        ),
        (
            "key_digest_sampling_options",
            sdk(concat!(
                r#""model":"gpt-4.1","frequency_penalty":0,"max_completion_tokens":2048,"#,
                r#""presence_penalty":0,"response_format":{"type":"text"},"temperature":1,"top_p":1"#
            )),
        ),
        (
            "key_digest_ten_turns",
            Bytes::from(format!(
                r#"{{"messages":[{}],"model":"gpt-4o-mini","temperature":0}}"#,
                turns.join(",")
            )),
        ),
    ] {
        group.bench_function(name, |b| {
            let keys = KeyDeriver::new();
            let req = request(body.clone());
            b.iter(|| keys.key(&req, None).unwrap().0)
        });
    }
    group.bench_function("sha256_of_300_bytes", |b| {
        use sha2::Digest;
        let data = [7u8; 300];
        b.iter(|| sha2::Sha256::digest(std::hint::black_box(&data)))
    });
    group.bench_function("blake3_of_300_bytes", |b| {
        // The fast hash most often suggested instead, on the same bytes.
        let data = [7u8; 300];
        b.iter(|| blake3::hash(std::hint::black_box(&data)))
    });
    group.bench_function("key_digest_value_tree_baseline", |b| {
        // What building a JSON tree alone costs, for comparison with the one-pass digest.
        let req = request(small.clone());
        b.iter(|| serde_json::from_slice::<serde_json::Value>(req.body()).unwrap())
    });

    group.bench_function("build_request_only", |b| {
        // What every other bench here spends building its request, to subtract.
        b.iter(|| request(small.clone()))
    });
    group.bench_function("bare_upstream", |b| {
        let mut svc = upstream(answer_json(8), Arc::default());
        b.iter(|| run(&mut svc, request(small.clone())))
    });
    group.bench_function("hit_small_answer", |b| {
        let (mut svc, calls) = hit_service(8);
        run(&mut svc, request(small.clone()));
        b.iter(|| run(&mut svc, request(small.clone())));
        assert_eq!(
            calls.load(Ordering::Relaxed),
            1,
            "every call after the first hit"
        );
    });
    group.bench_function("miss_small_answer", |b| {
        // A new question every time (the store keeps the newest 10,000 answers).
        let mut svc =
            CacheLayer::new(MemoryStore::new()).layer(upstream(answer_json(8), Arc::default()));
        let mut next = new_questions();
        b.iter(|| run(&mut svc, request(next())));
    });
    group.bench_function("bare_upstream_new_request_each_time", |b| {
        // The miss's baseline: the same request building, without the cache.
        let mut svc = upstream(answer_json(8), Arc::default());
        let mut next = new_questions();
        b.iter(|| run(&mut svc, request(next())));
    });

    group.bench_function("store_miss_in_a_full_store_paired", |b| {
        // The in-memory store alone, as a miss uses it: a lookup that finds nothing and an
        // insert that evicts the oldest of 10,000 answers, whose memory no call touched since
        // 10,000 misses ago. Between two misses the stack runs: each iteration here copies
        // 16 KiB, about the stack's own frames and bodies. Reported: the time with the store
        // less the same copies and answers without it, in alternating batches, so that the
        // machine's drift falls on both (a sample whose drift outweighs the store counts as
        // 1 ns a call: criterion refuses a zero).
        let store = MemoryStore::new();
        let raw = answer_json(8);
        let ttl = Duration::from_secs(3600);
        let answer = |i: u64| {
            let text = format!("answer {i}");
            let usage = seawall_core::Usage::default();
            let a = Answer::new(
                Wire::OpenAiChat,
                "id",
                "gpt-4o-mini",
                0,
                &text,
                "stop",
                usage,
            );
            Arc::new(a.with_raw(raw.clone()))
        };
        let mut next = 0u64;
        let mut key = || {
            next += 1;
            let mut bytes = [0; 32];
            bytes[..8].copy_from_slice(&next.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
            bytes[8..16].copy_from_slice(&next.to_le_bytes());
            (next, CacheKey::from_bytes(bytes))
        };
        for _ in 0..MemoryStore::DEFAULT_MAX_ENTRIES {
            let (i, k) = key();
            store.insert(&k, answer(i), ttl);
        }
        let (src, mut dst) = (vec![1u8; 16 << 10], vec![0u8; 16 << 10]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _entered = rt.enter();
        b.iter_custom(|iters| {
            let (mut with, mut without) = (Duration::ZERO, Duration::ZERO);
            let mut left = iters;
            while left > 0 {
                let n = left.min(128);
                let start = Instant::now();
                for _ in 0..n {
                    let (i, _) = key();
                    std::hint::black_box(answer(i));
                    dst.copy_from_slice(std::hint::black_box(&src));
                }
                without += start.elapsed();
                let start = Instant::now();
                for _ in 0..n {
                    let (i, k) = key();
                    let a = answer(i);
                    std::hint::black_box(store.lookup(&k));
                    dst.copy_from_slice(std::hint::black_box(&src));
                    store.insert(&k, a, ttl);
                }
                with += start.elapsed();
                left -= n;
            }
            with.saturating_sub(without)
                .max(Duration::from_nanos(iters))
        })
    });
    group.bench_function("single_flight_two_threads_same_key", |b| {
        // Nothing is ever stored (a store of 0 entries): every call misses, and the two
        // threads' identical calls meet in the flight table.
        let calls = Arc::new(AtomicUsize::new(0));
        let svc =
            CacheLayer::new(MemoryStore::with_bounds(0, 0)).layer(upstream(answer_json(8), calls));
        b.iter_custom(|iters| {
            let start = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..2 {
                    let svc = svc.clone();
                    let body = small.clone();
                    s.spawn(move || {
                        // A waiter waits for the other thread's leader: a real runtime.
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .build()
                            .unwrap();
                        rt.block_on(async move {
                            for _ in 0..iters {
                                let resp =
                                    svc.clone().oneshot(request(body.clone())).await.unwrap();
                                let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
                            }
                        })
                    });
                }
            });
            // Per call: two threads made `iters` calls each.
            start.elapsed() / 2
        })
    });
    group.finish();
}

/// The calls counted under callgrind (see the module docs): `requests` through `f`.
#[inline(never)]
fn profile_loop(
    requests: impl IntoIterator<Item = http::Request<Bytes>>,
    mut f: impl FnMut(http::Request<Bytes>),
) {
    for req in requests {
        f(std::hint::black_box(req));
    }
}

/// Runs the part `CACHE_PROFILE` names, if set; says whether it ran.
///
/// The requests are all built before the loop (the default, so the counts are the calls'
/// own), or, with `CACHE_PROFILE_BUILD=each`, each just before its call. The latter is for
/// CPU time: a request built long before its call has its body and headers out of the CPU's
/// caches by then (hundreds of megabytes of requests were built since), which a request just
/// read from a socket does not; building in the loop puts the same building cost in every
/// part, so it cancels in a difference of parts.
fn profile() -> bool {
    let Ok(part) = std::env::var("CACHE_PROFILE") else {
        return false;
    };
    let n: usize = std::env::var("CACHE_PROFILE_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    if std::env::var("CACHE_PROFILE_BUILD").is_ok_and(|v| v == "each") {
        let mut next = new_questions();
        let fresh = (0..n).map(move |_| request(next()));
        let same = (0..n).map(|_| request(prompt(4, 0)));
        profile_part(&part, n, fresh, same);
    } else {
        let mut next = new_questions();
        let fresh: Vec<_> = (0..n).map(|_| request(next())).collect();
        let same: Vec<_> = (0..n).map(|_| request(prompt(4, 0))).collect();
        profile_part(&part, n, fresh, same);
    }
    true
}

/// One profiled part over `fresh` (new questions) or `same` (one question) requests.
fn profile_part(
    part: &str,
    n: usize,
    fresh: impl IntoIterator<Item = http::Request<Bytes>>,
    same: impl IntoIterator<Item = http::Request<Bytes>>,
) {
    match part {
        "key" => {
            let keys = KeyDeriver::new();
            profile_loop(same, |req| {
                std::hint::black_box(keys.key(&req, None).unwrap());
            });
        }
        "hit" => {
            let (mut svc, calls) = hit_service(8);
            run(&mut svc, request(prompt(4, 0)));
            profile_loop(same, |req| {
                run(&mut svc, req);
            });
            assert_eq!(calls.load(Ordering::Relaxed), 1);
        }
        "miss" => {
            let calls = Arc::new(AtomicUsize::new(0));
            let mut svc = CacheLayer::new(MemoryStore::new())
                .layer(upstream(answer_json(8), Arc::clone(&calls)));
            profile_loop(fresh, |req| {
                run(&mut svc, req);
            });
            assert_eq!(calls.load(Ordering::Relaxed), n);
        }
        "key_fresh" => {
            // The key of each new question: the part of a miss that a hit makes too.
            let keys = KeyDeriver::new();
            profile_loop(fresh, |req| {
                std::hint::black_box(keys.key(&req, None).unwrap());
            });
        }
        "none" => {
            // The requests built and dropped, nothing else: what every part spends outside
            // its calls, to subtract from `key_fresh`.
            profile_loop(fresh, |req| drop(std::hint::black_box(req)));
        }
        "bare" => {
            let mut svc = upstream(answer_json(8), Arc::default());
            profile_loop(fresh, |req| {
                run(&mut svc, req);
            });
        }
        other => panic!("CACHE_PROFILE: no part {other:?} (key, key_fresh, none, hit, miss, bare)"),
    }
}

criterion_group!(benches, bench);

fn main() {
    if profile() {
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
