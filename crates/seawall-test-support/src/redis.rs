//! A real `redis-server` on a free loopback port, for the tests of shared state.
//!
//! Tests of a store never talk to a fake: each starts its own server in a temporary directory
//! (no persistence, loopback only), may stop and restart it on the same port to test outages,
//! and the server is killed when the handle drops. `.ci/run` installs `redis-server` when a
//! machine lacks it, so a missing binary is a failure here, not a skip.
//!
//! A free port is only free when it is asked for: two tests running at once can be handed
//! the same one, and the second server then fails to bind while the first answers in its
//! place, until the first test ends and takes it away. So a server counts as up only when the
//! process answering on the port is the one this handle started (its `INFO` says its pid),
//! and a server that could not bind is started again on another port.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// A running (or stopped) `redis-server` owned by one test.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not on the `PATH` or does not come up within ten seconds: the
    /// test cannot run, and must say so rather than pass.
    pub fn start() -> RedisServer {
        let dir = tempfile::tempdir().expect("a temporary directory for redis-server");
        let mut server = RedisServer {
            port: free_port(),
            dir,
            child: None,
        };
        // A port another test's server took meanwhile: another port.
        for _ in 0..20 {
            if server.spawn() {
                return server;
            }
            server.port = free_port();
        }
        panic!("redis-server found no free loopback port in 20 tries");
    }

    /// The URL a client connects with (`redis://127.0.0.1:PORT/`).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// Kills the server (as a crash would: no shutdown, nothing saved). Clients see their
    /// connections drop and new ones refused until [`restart`](Self::restart).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty: it kept nothing) and waits until it
    /// accepts connections. Does nothing if it is running.
    ///
    /// # Panics
    ///
    /// When the port was taken meanwhile (the server cannot bind it).
    pub fn restart(&mut self) {
        if self.child.is_none() {
            assert!(
                self.spawn(),
                "redis-server could not bind {} again: the port was taken",
                self.addr()
            );
        }
    }

    /// Starts the server on `self.port` and waits until it answers there: `false` when it
    /// exited instead (the port was taken).
    fn spawn(&mut self) -> bool {
        let mut child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--protected-mode", "yes"])
            // Lets a test make the server hang (`DEBUG SLEEP`) from loopback.
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(self.dir_path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on the PATH (`.ci/run` installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return false;
            }
            if answers_as(self.addr(), child.id()) {
                self.child = Some(child);
                return true;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "redis-server did not accept connections on {} within 10 s",
                    self.addr()
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn dir_path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether the server answering on `addr` is the process `pid` (by its `INFO server`).
fn answers_as(addr: SocketAddr, pid: u32) -> bool {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"INFO server\r\n").is_err() {
        return false;
    }
    let want = format!("process_id:{pid}\r\n");
    let mut seen = Vec::new();
    let mut buf = [0; 4096];
    // The reply is a few kilobytes at most; stop once the pid line is in it.
    while seen.len() < 64 * 1024 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
        let text = String::from_utf8_lossy(&seen);
        if let Some(at) = text.find("process_id:") {
            if text[at..].contains("\r\n") {
                return text[at..].starts_with(&want);
            }
        }
    }
    false
}

fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free loopback port");
    listener.local_addr().expect("a bound address").port()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_answers_only_as_the_process_that_started_it() {
        let server = RedisServer::start();
        let pid = server.child.as_ref().map(Child::id).expect("running");
        assert!(answers_as(server.addr(), pid));
        assert!(!answers_as(server.addr(), pid.wrapping_add(1)));
    }

    #[test]
    fn a_server_started_on_a_port_another_holds_is_not_taken_for_up() {
        let first = RedisServer::start();
        let mut second = RedisServer {
            port: first.port,
            dir: tempfile::tempdir().expect("a temporary directory"),
            child: None,
        };
        // The first answers on the port, but not as the second, which cannot bind it.
        assert!(!second.spawn());
        assert!(second.child.is_none());
        assert!(answers_as(
            first.addr(),
            first.child.as_ref().map(Child::id).expect("running")
        ));
    }
}
