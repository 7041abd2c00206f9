//! The chaos upstream served over real loopback HTTP, for tests of the transport and of whole
//! stacks end to end.

use std::net::SocketAddr;

use seawall_mock::{MockUpstream, Profile};

/// Serves a [`MockUpstream`] with `profile` on a free loopback port: its address, and the
/// upstream (whose statistics the test reads).
pub async fn start_mock(profile: Profile) -> (SocketAddr, MockUpstream) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free loopback port");
    let addr = listener.local_addr().expect("a bound address");
    let upstream = MockUpstream::new(profile);
    tokio::spawn(seawall_mock::serve(listener, upstream.clone()));
    (addr, upstream)
}
