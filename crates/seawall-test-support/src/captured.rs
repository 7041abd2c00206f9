//! Where a test's log (or ledger) lines go, so that it can read back what was written.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

/// An in-memory writer whose clones share one buffer: hand a clone to the writer (a tracing
/// subscriber's `with_writer(move || c.clone())`, a ledger), read [`Captured::text`] after.
#[derive(Debug, Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Everything written so far, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The log of the whole test binary: one global `tracing` subscriber writing to one
/// [`Captured`], installed on first use. Call it first in every test of a binary that reads
/// its log. A per-test (thread-local) subscriber races with the callsites that tests on other
/// threads register at the same moment, and can miss the very event a test looks for; a
/// global one installed before anything logs cannot.
pub fn global_log() -> &'static Captured {
    static LOG: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let log = Captured::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
        log
    })
}
