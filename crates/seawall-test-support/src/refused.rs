//! A loopback port that refuses connections, for tests of connect errors.

use std::net::SocketAddr;

use tokio::net::TcpSocket;

/// A loopback TCP port held by a socket that is bound but never listens: a connection to it is
/// refused, and while this value lives no other socket is given the port.
///
/// Binding a listener and dropping it, to learn a free port, is not enough: the port is then
/// free for the next bind anywhere, and a test running beside this one may be listening on it
/// (and answering) by the time this one connects.
#[derive(Debug)]
pub struct RefusedPort {
    /// Held, never read: the port stays bound while this lives.
    _socket: TcpSocket,
    addr: SocketAddr,
}

impl RefusedPort {
    /// Binds a loopback port of its own.
    pub fn new() -> Self {
        let socket = TcpSocket::new_v4().expect("a TCP socket");
        socket
            .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("a free loopback port");
        let addr = socket.local_addr().expect("a bound address");
        RefusedPort {
            _socket: socket,
            addr,
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl Default for RefusedPort {
    fn default() -> Self {
        RefusedPort::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_to_it_is_refused_while_it_lives() {
        let refused = RefusedPort::new();
        for _ in 0..3 {
            let err =
                std::net::TcpStream::connect(refused.addr).expect_err("nothing listens there");
            assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
        }
        // Held: the port is not given to another bind meanwhile.
        let other = TcpSocket::new_v4().unwrap();
        assert!(other.bind(refused.addr).is_err());
        drop(refused);
    }
}
