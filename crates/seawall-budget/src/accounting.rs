//! One [`SpendRecord`] per attempt, to a pluggable [`AccountingSink`].
//!
//! The budget layer sees every attempt (it sits inside the retry layer), so it is where
//! spend is best accounted: a record per attempt, with its tokens, its cost and how it ended.
//! [`JsonlSink`] writes them as JSON Lines from a background thread and never blocks a call.
//!
//! A ledger file outlives the process and is read by people and tools that hold no
//! credentials, so [`JsonlSink`] passes the request-derived text of a record (budget keys,
//! the model name) through [`redact`] before writing it: a key function handed a raw API key
//! (use [`fingerprint`](crate::fingerprint) instead) does not put the key on disk.

use std::fmt;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use seawall_core::{FailureClass, ServiceTier, redact_shared};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::time::Timestamp;

/// How an attempt ended, for the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptOutcome {
    /// The response (and its body, if streamed) completed.
    Ok,
    /// The attempt, or its body, failed with this class. The budget's own rejections are
    /// `Failed(BudgetExceeded)`.
    Failed(FailureClass),
    /// The caller dropped the call or the body before it ended.
    Dropped,
}

impl AttemptOutcome {
    /// `"ok"`, `"dropped"` or the class's snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            AttemptOutcome::Ok => "ok",
            AttemptOutcome::Dropped => "dropped",
            AttemptOutcome::Failed(c) => c.as_str(),
        }
    }

    /// The inverse of [`AttemptOutcome::as_str`].
    pub fn parse(s: &str) -> Option<AttemptOutcome> {
        match s {
            "ok" => Some(AttemptOutcome::Ok),
            "dropped" => Some(AttemptOutcome::Dropped),
            _ => FailureClass::ALL
                .into_iter()
                .find(|c| c.as_str() == s)
                .map(AttemptOutcome::Failed),
        }
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for AttemptOutcome {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for AttemptOutcome {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        AttemptOutcome::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown outcome {s:?}")))
    }
}

/// What the budget charged for an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Charged {
    /// The cost of the usage the upstream reported.
    Usage,
    /// The reservation (the estimate): the attempt may have been billed and reported no usage.
    Estimate,
    /// Nothing: the attempt failed before the upstream could bill, or was refused.
    Nothing,
}

/// One attempt, as the budget saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpendRecord {
    /// When the attempt was admitted (UTC, on the layer's clock).
    pub time: Timestamp,
    /// The keys the attempt was counted under, by scope (`{"tenant": "acme"}`).
    #[serde(with = "keys_as_map")]
    pub keys: Vec<(Arc<str>, Arc<str>)>,
    /// The model asked for.
    pub model: Option<Arc<str>>,
    /// The service tier the attempt was priced at, when the price table prices tiers and the
    /// request asked for one (`"priority"`, `"flex"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<ServiceTier>,
    /// From admission until the response, or its body, ended.
    pub seconds: f64,
    /// Input tokens reported (cached included), if usage was reported.
    pub input_tokens: Option<u64>,
    /// Output tokens reported.
    pub output_tokens: Option<u64>,
    /// Cached input tokens reported.
    pub cached_input_tokens: Option<u64>,
    /// Input tokens written to the provider's cache, reported (Anthropic's).
    pub cache_write_input_tokens: Option<u64>,
    /// Of those, the ones kept for an hour (Anthropic's, at their own price).
    pub cache_write_1h_input_tokens: Option<u64>,
    /// The cost charged, in dollars (for reading; sum `cost_nanos` for exact totals).
    pub cost_usd: f64,
    /// The cost charged, in nano-dollars.
    pub cost_nanos: u64,
    /// The reservation made at admission, in nano-dollars.
    pub reserved_nanos: u64,
    /// The attempt number within the logical call: the `attempts` count of the call's
    /// `CallContext` when the attempt was admitted (an outer retry layer counts an attempt
    /// before sending it), at least 1; `None` without a call context.
    pub attempt: Option<u32>,
    /// How the attempt ended.
    pub outcome: AttemptOutcome,
    /// What was charged.
    pub charged: Charged,
}

mod keys_as_map {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use serde::ser::SerializeMap;
    use serde::{Deserialize, Deserializer, Serializer};

    type Pairs = Vec<(Arc<str>, Arc<str>)>;

    pub(super) fn serialize<S: Serializer>(
        keys: &[(Arc<str>, Arc<str>)],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(keys.len()))?;
        for (k, v) in keys {
            map.serialize_entry(&**k, &**v)?;
        }
        map.end()
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Pairs, D::Error> {
        let map = BTreeMap::<String, String>::deserialize(d)?;
        Ok(map.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
    }
}

/// Where spend records go. Called on the call path (when an attempt settles): it must not
/// block; hand the record to a queue if writing it takes time.
pub trait AccountingSink: Send + Sync + 'static {
    /// Takes one record.
    fn record(&self, record: SpendRecord);
}

impl<F> AccountingSink for F
where
    F: Fn(SpendRecord) + Send + Sync + 'static,
{
    fn record(&self, record: SpendRecord) {
        self(record)
    }
}

impl<T: AccountingSink + ?Sized> AccountingSink for Arc<T> {
    fn record(&self, record: SpendRecord) {
        (**self).record(record)
    }
}

/// Keeps records in memory (tests, small tools).
#[derive(Debug, Default)]
pub struct MemorySink {
    records: Mutex<Vec<SpendRecord>>,
}

impl MemorySink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the records so far.
    pub fn records(&self) -> Vec<SpendRecord> {
        self.lock().clone()
    }

    /// Takes the records so far.
    pub fn take(&self) -> Vec<SpendRecord> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SpendRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl AccountingSink for MemorySink {
    fn record(&self, record: SpendRecord) {
        self.lock().push(record);
    }
}

enum Msg {
    Record(Box<SpendRecord>),
    Flush(mpsc::Sender<io::Result<()>>),
}

#[derive(Debug, Default)]
struct SinkStats {
    written: AtomicU64,
    dropped: AtomicU64,
    write_errors: AtomicU64,
    warned: AtomicBool,
}

/// Writes records as JSON Lines (one JSON object per line) from a background thread.
///
/// `record` only puts the record on a bounded channel: when the writer falls behind and the
/// channel is full, the record is dropped and counted ([`JsonlSink::dropped`]) rather than
/// blocking the call. The writer gathers what is queued into one write and flushes whenever
/// the channel runs empty. Records lost to write errors are counted and logged once; a line
/// torn by a failed write is followed by a newline, so readers can skip it. Dropping the sink lets the writer finish what is queued in the
/// background; call [`JsonlSink::flush`] to wait for it.
///
/// ```
/// use seawall_budget::JsonlSink;
/// let path = std::env::temp_dir().join(format!("seawall-doc-{}.jsonl", std::process::id()));
/// let sink = JsonlSink::create(&path).unwrap();
/// sink.flush().unwrap();
/// assert_eq!(sink.dropped(), 0);
/// # std::fs::remove_file(&path).ok();
/// ```
pub struct JsonlSink {
    tx: SyncSender<Msg>,
    stats: Arc<SinkStats>,
}

impl fmt::Debug for JsonlSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonlSink")
            .field("written", &self.written())
            .field("dropped", &self.dropped())
            .field("write_errors", &self.write_errors())
            .finish_non_exhaustive()
    }
}

impl JsonlSink {
    /// The default channel capacity, in records.
    pub const DEFAULT_CAPACITY: usize = 8192;

    /// Appends to the file at `path` (created if missing).
    pub fn create(path: impl AsRef<Path>) -> io::Result<JsonlSink> {
        Self::create_with_capacity(path, Self::DEFAULT_CAPACITY)
    }

    /// [`JsonlSink::create`] with a channel of `capacity` records.
    pub fn create_with_capacity(path: impl AsRef<Path>, capacity: usize) -> io::Result<JsonlSink> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Self::from_writer(file, capacity)
    }

    /// Writes to any writer (a pipe, a socket, a test buffer).
    pub fn from_writer(
        writer: impl Write + Send + 'static,
        capacity: usize,
    ) -> io::Result<JsonlSink> {
        let (tx, rx) = mpsc::sync_channel(capacity.max(1));
        let stats = Arc::new(SinkStats::default());
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name("seawall-jsonl".into())
            .spawn(move || write_loop(rx, writer, &thread_stats))?;
        Ok(JsonlSink { tx, stats })
    }

    /// Records written so far.
    pub fn written(&self) -> u64 {
        self.stats.written.load(Ordering::Relaxed)
    }

    /// Records dropped because the channel was full.
    pub fn dropped(&self) -> u64 {
        self.stats.dropped.load(Ordering::Relaxed)
    }

    /// Records lost to write errors.
    pub fn write_errors(&self) -> u64 {
        self.stats.write_errors.load(Ordering::Relaxed)
    }

    /// Waits until every record queued before this call is written and flushed (an error
    /// if the last write failed; see [`JsonlSink::write_errors`] for the count). Blocks the
    /// calling thread: call it at shutdown or from a blocking task, not on the call path.
    pub fn flush(&self) -> io::Result<()> {
        let (ack, done) = mpsc::channel();
        let gone = || io::Error::other("the JSON Lines writer thread has stopped");
        self.tx.send(Msg::Flush(ack)).map_err(|_| gone())?;
        done.recv().map_err(|_| gone())?
    }
}

impl AccountingSink for JsonlSink {
    fn record(&self, record: SpendRecord) {
        match self.tx.try_send(Msg::Record(Box::new(record))) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The most bytes gathered before a write, so a burst becomes a few large writes.
const MAX_BATCH: usize = 256 * 1024;

/// Gathers serialized records and writes them in batches, counting what made it.
struct BatchWriter<'a, W> {
    out: W,
    batch: Vec<u8>,
    pending: u64,
    // The last write failed part-way: start the next batch on a fresh line.
    torn: bool,
    stats: &'a SinkStats,
}

impl<W: Write> BatchWriter<'_, W> {
    fn push(&mut self, record: &SpendRecord) {
        if self.torn && self.batch.is_empty() {
            self.batch.push(b'\n');
        }
        let start = self.batch.len();
        match serde_json::to_writer(&mut self.batch, record) {
            Ok(()) => {
                self.batch.push(b'\n');
                self.pending += 1;
            }
            Err(e) => {
                self.batch.truncate(start);
                self.lost(1, &e);
            }
        }
    }

    fn write_out(&mut self) -> io::Result<()> {
        let res = if self.batch.is_empty() {
            self.out.flush()
        } else {
            self.out
                .write_all(&self.batch)
                .and_then(|()| self.out.flush())
        };
        match &res {
            Ok(()) => {
                self.stats
                    .written
                    .fetch_add(self.pending, Ordering::Relaxed);
                self.torn = false;
            }
            Err(e) => {
                self.lost(self.pending, e);
                self.torn = !self.batch.is_empty();
            }
        }
        self.batch.clear();
        self.pending = 0;
        res
    }

    fn lost(&self, n: u64, e: &dyn std::fmt::Display) {
        self.stats.write_errors.fetch_add(n, Ordering::Relaxed);
        if !self.stats.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(target: "seawall::budget", error = %e, "seawall budget: cannot write spend records");
        }
    }
}

/// Redacts the text of a record that came from a request (off the call path: the writer
/// thread does it).
fn redact_record(r: &mut SpendRecord) {
    for (_, key) in &mut r.keys {
        *key = redact_shared(std::mem::take(key));
    }
    if let Some(model) = &mut r.model {
        *model = redact_shared(std::mem::take(model));
    }
}

fn write_loop<W: Write>(rx: Receiver<Msg>, out: W, stats: &SinkStats) {
    let mut w = BatchWriter {
        out,
        batch: Vec::new(),
        pending: 0,
        torn: false,
        stats,
    };
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Record(mut r) => {
                    redact_record(&mut r);
                    w.push(&r);
                    if w.batch.len() >= MAX_BATCH {
                        let _ = w.write_out();
                    }
                }
                Msg::Flush(ack) => {
                    let _ = ack.send(w.write_out());
                }
            }
            next = rx.try_recv().ok();
        }
        let _ = w.write_out();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Condvar;

    fn record(i: u64) -> SpendRecord {
        SpendRecord {
            time: Timestamp::from_unix_secs(1_700_000_000 + i),
            keys: vec![("tenant".into(), "acme".into())],
            model: Some("gpt-4o".into()),
            service_tier: None,
            seconds: 0.25,
            input_tokens: Some(10),
            output_tokens: Some(i),
            cached_input_tokens: Some(0),
            cache_write_input_tokens: Some(0),
            cache_write_1h_input_tokens: Some(0),
            cost_usd: 1e-6,
            cost_nanos: 1_000,
            reserved_nanos: 2_000,
            attempt: Some(1),
            outcome: AttemptOutcome::Failed(FailureClass::Timeout),
            charged: Charged::Estimate,
        }
    }

    #[test]
    fn record_round_trips_through_json() {
        let r = record(3);
        let line = serde_json::to_string(&r).unwrap();
        assert!(line.contains(r#""keys":{"tenant":"acme"}"#), "{line}");
        assert!(line.contains(r#""outcome":"timeout""#), "{line}");
        assert!(line.contains(r#""charged":"estimate""#), "{line}");
        assert!(
            line.contains(r#""time":"2023-11-14T22:13:23.000Z""#),
            "{line}"
        );
        let back: SpendRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(back, r);
        for o in [AttemptOutcome::Ok, AttemptOutcome::Dropped] {
            assert_eq!(AttemptOutcome::parse(o.as_str()), Some(o));
        }
        assert!(serde_json::from_str::<AttemptOutcome>(r#""nope""#).is_err());
    }

    #[test]
    fn jsonl_ledger_redacts_credentials_in_keys_and_model() {
        let gate = Gate::default();
        gate.0.0.lock().unwrap().open = true;
        let sink = JsonlSink::from_writer(gate.clone(), 8).unwrap();
        let mut r = record(1);
        r.keys = vec![
            ("tenant".into(), "acme".into()),
            ("api-key".into(), "Bearer sk-proj-ledgerSecret0123".into()),
        ];
        r.model = Some("gpt-4o?key=AIzaSyLedgerSecret0123456789abcdefghij".into());
        sink.record(r);
        sink.flush().unwrap();
        let text = String::from_utf8(gate.0.0.lock().unwrap().data.clone()).unwrap();
        assert!(
            !text.contains("ledgerSecret") && !text.contains("LedgerSecret"),
            "{text}"
        );
        assert!(text.contains(r#""tenant":"acme""#), "{text}");
        assert!(text.contains("[REDACTED]"), "{text}");
    }

    /// A writer that blocks until released, to stand for a stalled disk.
    #[derive(Clone, Default)]
    struct Gate(Arc<(Mutex<GateState>, Condvar)>);

    #[derive(Default)]
    struct GateState {
        open: bool,
        entered: bool,
        data: Vec<u8>,
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let (lock, cv) = &*self.0;
            let mut g = lock.lock().unwrap();
            g.entered = true;
            cv.notify_all();
            let mut g = cv.wait_while(g, |s| !s.open).unwrap();
            g.data.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_writer_never_blocks_record() {
        let gate = Gate::default();
        let sink = JsonlSink::from_writer(gate.clone(), 2).unwrap();
        let (lock, cv) = &*gate.0;
        sink.record(record(0));
        // Wait until the writer is stuck writing the first record.
        drop(cv.wait_while(lock.lock().unwrap(), |s| !s.entered).unwrap());
        for i in 1..10 {
            sink.record(record(i));
        }
        // Two fit in the channel; the other seven are dropped, and `record` returned each time.
        assert_eq!(sink.dropped(), 7);
        lock.lock().unwrap().open = true;
        cv.notify_all();
        sink.flush().unwrap();
        let text = String::from_utf8(lock.lock().unwrap().data.clone()).unwrap();
        let lines: Vec<SpendRecord> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines, [record(0), record(1), record(2)]);
        assert_eq!(sink.written(), 3);
    }

    #[test]
    fn write_errors_are_counted() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::other("disk full"))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let sink = JsonlSink::from_writer(Broken, 4).unwrap();
        sink.record(record(1));
        // The record fails whether it is written before the flush or by it.
        let _ = sink.flush();
        assert_eq!(sink.write_errors(), 1);
        assert_eq!(sink.written(), 0);
    }
}
