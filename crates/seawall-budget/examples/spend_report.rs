//! Reads a JSON Lines spend file written by `JsonlSink` and prints the total number of calls,
//! the total cost, the mean latency and the three slowest calls.
//!
//! ```text
//! cargo run -p seawall-budget --example spend_report -- path/to/spend.jsonl
//! ```
//!
//! Without a path, it first sends a small simulated workload (on tokio's paused clock, so it
//! finishes at once) through a `CostBudgetLayer` with a `JsonlSink` into a temporary file,
//! then reports on that file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use seawall_budget::{
    AttemptOutcome, Budget, CostBudgetLayer, JsonlSink, MissingMaxOutput, PriceTable, ScopeKeys,
    SpendRecord, Usd,
};
use seawall_core::{FailureClass, LlmError, Random, SeededRandom, Usage};
use tower::{Service, ServiceBuilder, ServiceExt};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = match std::env::args_os().nth(1) {
        Some(p) => PathBuf::from(p),
        None => {
            let p =
                std::env::temp_dir().join(format!("seawall-spend-{}.jsonl", std::process::id()));
            println!("no file given: simulating 200 calls into {}\n", p.display());
            simulate(&p)?;
            p
        }
    };
    report(&path)
}

fn report(path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut records: Vec<SpendRecord> = Vec::new();
    let mut unreadable = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str(line) {
            Ok(r) => records.push(r),
            Err(_) => unreadable += 1,
        }
    }
    let total = Usd::from_nanos(records.iter().map(|r| r.cost_nanos).sum());
    let refused =
        |r: &SpendRecord| r.outcome == AttemptOutcome::Failed(FailureClass::BudgetExceeded);
    let sent: Vec<&SpendRecord> = records.iter().filter(|r| !refused(r)).collect();
    let mean = if sent.is_empty() {
        0.0
    } else {
        sent.iter().map(|r| r.seconds).sum::<f64>() / sent.len() as f64
    };

    println!("file           {}", path.display());
    println!(
        "calls          {} ({} refused by the budget)",
        records.len(),
        records.len() - sent.len()
    );
    println!("total cost     {total}");
    println!("mean latency   {mean:.3} s (over attempts that went out)");
    if unreadable > 0 {
        println!("unreadable     {unreadable} lines skipped");
    }

    let mut by_outcome: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for r in &records {
        let e = by_outcome.entry(r.outcome.as_str()).or_default();
        e.0 += 1;
        e.1 += r.cost_nanos;
    }
    println!("\nby outcome");
    for (outcome, (n, nanos)) in by_outcome {
        println!("  {outcome:<22} {n:>6} calls  {}", Usd::from_nanos(nanos));
    }

    let mut slowest = sent;
    slowest.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    println!("\nslowest calls");
    for r in slowest.iter().take(3) {
        let keys: Vec<String> = r.keys.iter().map(|(s, k)| format!("{s}={k}")).collect();
        println!(
            "  {:>8.3} s  {}  {:<18} {:<18} {}  {}",
            r.seconds,
            r.time,
            r.model.as_deref().unwrap_or("-"),
            r.outcome.as_str(),
            Usd::from_nanos(r.cost_nanos),
            keys.join(" ")
        );
    }
    Ok(())
}

/// A fake upstream: latency and usage drawn from a seeded source, some overloads.
#[tokio::main(flavor = "current_thread")]
async fn simulate(path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::pause();
    // The crate's example price file (USD per million tokens).
    let prices = PriceTable::from_toml_str(include_str!("../prices.example.toml"))?;
    let sink = Arc::new(JsonlSink::create(path)?);
    let budget = CostBudgetLayer::builder(prices)
        .budget(Budget::daily("daily", Usd::from_cents(25)).soft_limit_percent(80))
        .budget(Budget::hourly("tenant-hourly", Usd::from_cents(10)).per_key("tenant"))
        .keys(
            ScopeKeys::new().scope("tenant", |req: &http::Request<Bytes>| {
                req.headers()
                    .get("x-tenant")?
                    .to_str()
                    .ok()
                    .map(str::to_owned)
            }),
        )
        .missing_max_output(MissingMaxOutput::Default(512))
        .sink(sink.clone())
        .build()?;

    let rng = Arc::new(SeededRandom::new(42));
    let r = rng.clone();
    let upstream = tower::service_fn(move |_req: http::Request<Bytes>| {
        let (latency, out, fail) = (
            r.next_f64() * 4.0,
            (r.next_f64() * 500.0) as u64,
            r.next_f64(),
        );
        async move {
            tokio::time::sleep(Duration::from_secs_f64(0.2 + latency)).await;
            if fail < 0.05 {
                return Err(LlmError::new(FailureClass::Overloaded, "overloaded"));
            }
            let mut resp = http::Response::new(http_body_util::Empty::<Bytes>::new());
            resp.extensions_mut().insert(Usage {
                input_tokens: 300,
                output_tokens: out,
                cached_input_tokens: 100,
                cache_write_input_tokens: 0,
                cache_write_1h_input_tokens: 0,
            });
            Ok(resp)
        }
    });
    let mut svc = ServiceBuilder::new().layer(budget).service(upstream);
    for i in 0..200 {
        let model = if i % 3 == 0 { "gpt-4o" } else { "gpt-4o-mini" };
        let req = http::Request::post("https://api.openai.com/v1/chat/completions")
            .header("x-tenant", ["acme", "globex", "initech"][i % 3])
            .body(Bytes::from(format!(
                r#"{{"model":"{model}","messages":[{{"role":"user","content":"{}"}}]}}"#,
                "lorem ipsum ".repeat(100)
            )))?;
        let _ = svc.ready().await?.call(req).await;
    }
    sink.flush()?;
    Ok(())
}
