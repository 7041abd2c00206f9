//! The gateway's log writer: stderr, written by a thread of its own, so that a call never
//! waits on the terminal, pipe or file its record goes to.
//!
//! The gateway logs one record per call (target `seawall::call`). Written straight to stderr,
//! each one is a `write(2)` on the worker thread serving the call, under stderr's lock: a
//! slow reader of the log (a terminal, a full pipe) then stalls every call, and even a fast
//! one costs a system call per call. `tracing-appender`'s non-blocking writer queues each
//! formatted line for a thread of its own instead; behind a buffer that its thread flushes
//! whenever it has caught up, many lines go out in one system call when the gateway is busy.
//! It is lossy: when the queue is full (the log cannot keep up) lines are dropped rather than
//! calls delayed, and a watcher thread says in the log how many were lost.

use std::io::{self, BufWriter};
use std::time::Duration;

use tracing_appender::non_blocking::{NonBlocking, NonBlockingBuilder, WorkerGuard};

/// How many lines may wait for the writer thread before new ones are dropped.
const QUEUE: usize = 16 * 1024;

/// How often the watcher looks for dropped lines.
const WATCH: Duration = Duration::from_secs(10);

/// A lossy writer to stderr, and the guard that flushes what is queued when dropped (keep it
/// for the life of the process).
pub(crate) fn stderr() -> (NonBlocking, WorkerGuard) {
    let (writer, guard) = lossy(BufWriter::with_capacity(64 * 1024, io::stderr()), QUEUE);
    let counter = writer.error_counter();
    let _ = std::thread::Builder::new()
        .name("gateway-log-drops".to_owned())
        .spawn(move || {
            let mut reported = 0;
            loop {
                std::thread::sleep(WATCH);
                let lost = counter.dropped_lines();
                if lost != reported {
                    tracing::warn!(
                        "gateway: {} log lines dropped (the log could not keep up)",
                        lost - reported
                    );
                    reported = lost;
                }
            }
        });
    (writer, guard)
}

fn lossy<W: io::Write + Send + 'static>(to: W, queue: usize) -> (NonBlocking, WorkerGuard) {
    NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(queue)
        .thread_name("gateway-log")
        .finish(to)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::mpsc::{Receiver, Sender, channel};

    use super::*;

    /// A writer that blocks until the test lets it go, like a terminal nobody reads.
    struct Stuck(Receiver<()>);

    impl Write for Stuck {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let _ = self.0.recv();
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A writer that hands each write it gets to the test.
    struct Chunks(Sender<Vec<u8>>);

    impl Write for Chunks {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let _ = self.0.send(bytes.to_vec());
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn an_event_reaches_the_log_as_one_whole_line() {
        let (tx, rx) = channel();
        let (writer, guard) = lossy(Chunks(tx), 4);
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(writer)
            .finish();
        tracing::subscriber::with_default(subscriber, || tracing::info!(calls = 2, "one record"));
        drop(guard);
        let chunks: Vec<Vec<u8>> = rx.try_iter().collect();
        assert_eq!(chunks.len(), 1, "{chunks:?}");
        let line = String::from_utf8(chunks[0].clone()).unwrap();
        assert!(
            line.contains("one record calls=2") && line.ends_with('\n'),
            "{line}"
        );
    }

    #[test]
    fn a_full_queue_drops_and_counts_lines_instead_of_blocking() {
        let (release, stuck) = channel();
        let (mut writer, guard) = lossy(Stuck(stuck), 1);
        for _ in 0..5 {
            writer.write_all(b"x\n").unwrap();
        }
        // The writer thread holds at most one line and the queue one more: the rest dropped.
        assert!(writer.error_counter().dropped_lines() >= 3);
        drop(release);
        drop(guard);
    }
}
