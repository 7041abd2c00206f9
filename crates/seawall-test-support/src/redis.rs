//! A real `redis-server` on a free loopback port, for the tests of shared state.
//!
//! Tests of a store never talk to a fake: each starts its own server in a temporary directory
//! (no persistence, loopback only), may stop and restart it on the same port to test outages,
//! and the server is killed when the handle drops. `.ci/run` installs `redis-server` when a
//! machine lacks it, so a missing binary is a failure here, not a skip.

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
        let port = free_port();
        let dir = tempfile::tempdir().expect("a temporary directory for redis-server");
        let mut server = RedisServer {
            port,
            dir,
            child: None,
        };
        server.restart();
        server
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
    pub fn restart(&mut self) {
        if self.child.is_some() {
            return;
        }
        let child = Command::new("redis-server")
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
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(self.addr()).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not accept connections on {} within 10 s",
                self.addr()
            );
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

fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free loopback port");
    listener.local_addr().expect("a bound address").port()
}
