//! The gateway's log writer: stderr, written by a thread of its own, so that a call never
//! waits on the terminal, pipe or file its record goes to.
//!
//! The gateway logs one record per call (target `seawall::call`). Written straight to stderr,
//! each one is a `write(2)` on the worker thread serving the call, under stderr's lock: a
//! slow reader of the log (a terminal, a full pipe) then stalls every call, and even a fast
//! one costs a system call per call. Here an event's line goes into a bounded queue and the
//! writer thread writes the queue out in batches, flushing whenever it has caught up; a
//! worker never blocks on it. When the queue is full (the log cannot keep up) lines are
//! dropped rather than calls delayed, and the writer says how many it lost.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock};

use tracing_subscriber::fmt::MakeWriter;

/// How many lines may wait for the writer thread before new ones are dropped.
const QUEUE: usize = 16 * 1024;

/// Hands each log event a [`Line`] that goes to the writer thread when dropped.
#[derive(Clone, Debug)]
pub(crate) struct NonBlocking {
    /// Started on the first event, so a process that never logs starts no thread.
    queue: Arc<OnceLock<SyncSender<Vec<u8>>>>,
    dropped: Arc<AtomicU64>,
}

impl NonBlocking {
    /// A writer to stderr; its thread starts with the first line.
    pub(crate) fn stderr() -> Self {
        NonBlocking {
            queue: Arc::new(OnceLock::new()),
            dropped: Arc::new(AtomicU64::new(0)),
        }
    }

    fn sender(&self) -> &SyncSender<Vec<u8>> {
        self.queue.get_or_init(|| {
            let (tx, rx) = sync_channel(QUEUE);
            let dropped = Arc::clone(&self.dropped);
            // Without a thread there is nowhere to write: the lines are then dropped (the
            // receiver is gone, so every send fails) and counted, never a panic.
            let _ = std::thread::Builder::new()
                .name("gateway-log".to_owned())
                .spawn(move || write_out(&rx, &dropped));
            tx
        })
    }
}

/// The writer thread: writes lines as they come, through a buffer that is flushed whenever
/// the queue is empty, so a line reaches stderr at once when the gateway is quiet and many go
/// in one system call when it is busy.
fn write_out(rx: &Receiver<Vec<u8>>, dropped: &AtomicU64) {
    let mut out = io::BufWriter::with_capacity(64 * 1024, io::stderr());
    let mut reported = 0;
    while let Ok(line) = rx.recv() {
        let _ = out.write_all(&line);
        loop {
            match rx.try_recv() {
                Ok(line) => {
                    let _ = out.write_all(&line);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    let _ = out.flush();
                    return;
                }
            }
        }
        let lost = dropped.load(Ordering::Relaxed);
        if lost != reported {
            let _ = writeln!(
                out,
                "gateway: {} log lines dropped (the log could not keep up)",
                lost - reported
            );
            reported = lost;
        }
        let _ = out.flush();
    }
}

/// One event's line, sent to the writer thread when the event has been formatted.
#[derive(Debug)]
pub(crate) struct Line<'a> {
    buf: Vec<u8>,
    to: &'a NonBlocking,
}

impl Write for Line<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let line = std::mem::take(&mut self.buf);
        match self.to.sender().try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.to.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl<'a> MakeWriter<'a> for NonBlocking {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        Line {
            buf: Vec::new(),
            to: self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_queued_whole_when_its_writer_is_dropped() {
        let (tx, rx) = sync_channel(4);
        let writer = NonBlocking {
            queue: Arc::new(OnceLock::from(tx)),
            dropped: Arc::new(AtomicU64::new(0)),
        };
        {
            let mut line = writer.make_writer();
            line.write_all(b"one ").unwrap();
            line.write_all(b"record\n").unwrap();
            assert!(
                rx.try_recv().is_err(),
                "nothing is sent before the event ends"
            );
        }
        assert_eq!(rx.try_recv().unwrap(), b"one record\n");
    }

    #[test]
    fn a_full_queue_drops_and_counts_lines_instead_of_blocking() {
        let (tx, rx) = sync_channel(1);
        let writer = NonBlocking {
            queue: Arc::new(OnceLock::from(tx)),
            dropped: Arc::new(AtomicU64::new(0)),
        };
        for _ in 0..3 {
            writer.make_writer().write_all(b"x\n").unwrap();
        }
        assert_eq!(writer.dropped.load(Ordering::Relaxed), 2);
        assert_eq!(rx.try_recv().unwrap(), b"x\n");
    }
}
