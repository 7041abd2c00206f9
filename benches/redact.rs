//! What redaction costs: the text of an error with no credential (the common case, one
//! pass of the matcher), an error message quoting a key, and a 64 KiB error body built to
//! slow a search down (tokens glued to each other, a name that never ends).
//!
//! ```text
//! cargo bench -p seawall-benches --bench redact
//! ```

use std::hint::black_box;

use criterion::Criterion;
use seawall::core::redact;

fn main() {
    let cases = [
        (
            "message_without_a_key",
            "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. Please reduce the length of the messages.".to_owned(),
        ),
        (
            "message_with_a_key",
            "Incorrect API key provided: sk-proj-abcdefghij0123456789. You can find your API key at https://platform.openai.com/account/api-keys.".to_owned(),
        ),
        (
            "body_64k_without_a_key",
            "the quick brown fox jumps over the lazy dog ".repeat(1500),
        ),
        ("body_64k_glued_tokens", "ghs_abcdefghijklmnopqrst-".repeat(2600)),
        (
            "body_64k_keys_in_names",
            "x-apiAIzaSyNameSecret0123456789abcdefgh-key: v ".repeat(1400),
        ),
    ];
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("redact");
    for (name, text) in &cases {
        group.bench_function(*name, |b| b.iter(|| redact(black_box(text)).len()));
    }
    group.finish();
    c.final_summary();
}
