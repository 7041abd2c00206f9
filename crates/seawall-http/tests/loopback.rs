//! The transport against a tiny hyper server on 127.0.0.1: no other network.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use seawall_core::{BoxError, FailureClass, LlmError};
use seawall_http::{
    AnthropicConfig, ApiKey, HttpTransport, OpenAiConfig, ProxyMatcher, Upstream, into_llm_error,
};
use seawall_test_support::RefusedPort;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

#[derive(Debug, Clone)]
struct Seen {
    version: Version,
    path: String,
    headers: HeaderMap,
}

struct TestServer {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl TestServer {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("a request arrived")
    }
}

/// A server answering every request with `echo:<body length>`, counting TCP connections.
async fn server(tls: Option<TlsAcceptor>) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (conns, log) = (connections.clone(), seen.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            conns.fetch_add(1, Ordering::SeqCst);
            let log = log.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let log = log.clone();
                    async move {
                        log.lock().unwrap().push(Seen {
                            version: req.version(),
                            path: req.uri().path_and_query().unwrap().to_string(),
                            headers: req.headers().clone(),
                        });
                        let n = req.into_body().collect().await?.to_bytes().len();
                        Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(format!(
                            "echo:{n}"
                        )))))
                    }
                });
                let builder = auto::Builder::new(TokioExecutor::new());
                let _ = match tls {
                    Some(acceptor) => {
                        let Ok(stream) = acceptor.accept(stream).await else {
                            return;
                        };
                        builder.serve_connection(TokioIo::new(stream), svc).await
                    }
                    None => builder.serve_connection(TokioIo::new(stream), svc).await,
                };
            });
        }
    });
    TestServer {
        addr,
        connections,
        seen,
    }
}

fn post(uri: &str, body: &'static str) -> Request<Bytes> {
    Request::post(uri)
        .body(Bytes::from_static(body.as_bytes()))
        .unwrap()
}

async fn send(t: &HttpTransport, req: Request<Bytes>) -> Result<String, BoxError> {
    let resp = t.clone().oneshot(req).await?;
    let body = resp.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8(body.to_vec())?)
}

const KEY: &str = "sk-test-SECRET0123456789";

#[tokio::test]
async fn openai_relative_uris_resolve_against_the_base_url_with_bearer_auth() {
    let srv = server(None).await;
    let cfg = OpenAiConfig::from_lookup(|name| match name {
        "OPENAI_API_KEY" => Some(KEY.to_owned()),
        "OPENAI_BASE_URL" => Some(srv.url("/v1/")),
        _ => None,
    })
    .unwrap();
    let t = HttpTransport::builder()
        .upstream(cfg.upstream().unwrap())
        .build()
        .unwrap();
    let body = r#"{"model":"m","messages":[]}"#;
    assert_eq!(
        send(&t, post("/chat/completions?trace=1", body))
            .await
            .unwrap(),
        format!("echo:{}", body.len())
    );
    let seen = srv.last();
    assert_eq!(seen.path, "/v1/chat/completions?trace=1");
    assert_eq!(
        seen.headers["authorization"],
        format!("Bearer {KEY}").as_str()
    );
    assert_eq!(seen.headers["content-type"], "application/json");
    assert_eq!(seen.headers["host"], srv.addr.to_string().as_str());
}

#[tokio::test]
async fn anthropic_headers_and_a_request_header_wins() {
    let srv = server(None).await;
    let up = AnthropicConfig::new(ApiKey::new(KEY).unwrap())
        .with_base_url(srv.url(""))
        .upstream()
        .unwrap();
    let t = HttpTransport::new().unwrap().with_upstream(up);
    let mut req = post("/v1/messages", "{}");
    req.headers_mut()
        .insert("anthropic-version", "2099-01-01".parse().unwrap());
    send(&t, req).await.unwrap();
    let seen = srv.last();
    assert_eq!(seen.path, "/v1/messages");
    assert_eq!(seen.headers["x-api-key"], KEY);
    assert_eq!(seen.headers["anthropic-version"], "2099-01-01");
    assert!(seen.headers.get("authorization").is_none());
}

#[tokio::test]
async fn credentials_never_go_to_another_origin() {
    let upstream_srv = server(None).await;
    let other = server(None).await;
    let up = OpenAiConfig::new(ApiKey::new(KEY).unwrap())
        .with_base_url(upstream_srv.url("/v1"))
        .upstream()
        .unwrap();
    let t = HttpTransport::new().unwrap().with_upstream(up);
    send(&t, post(&other.url("/v1/chat/completions"), "{}"))
        .await
        .unwrap();
    assert!(other.last().headers.get("authorization").is_none());
    // An absolute URI to the upstream's own origin does get them.
    send(&t, post(&upstream_srv.url("/v1/embeddings"), "{}"))
        .await
        .unwrap();
    assert!(upstream_srv.last().headers.contains_key("authorization"));
}

#[tokio::test]
async fn keep_alive_reuses_one_connection() {
    let srv = server(None).await;
    let t = HttpTransport::builder()
        .pool_max_idle_per_host(4)
        .upstream(Upstream::new(&srv.url("/v1")).unwrap())
        .build()
        .unwrap();
    for _ in 0..5 {
        send(&t, post("/chat/completions", "{}")).await.unwrap();
    }
    assert_eq!(srv.seen.lock().unwrap().len(), 5);
    assert_eq!(srv.connections.load(Ordering::SeqCst), 1);
    // A pool that keeps no idle connection opens one per call.
    let srv = server(None).await;
    let t = HttpTransport::builder()
        .pool_max_idle_per_host(0)
        .upstream(Upstream::new(&srv.url("")).unwrap())
        .build()
        .unwrap();
    for _ in 0..3 {
        send(&t, post("/x", "{}")).await.unwrap();
    }
    assert_eq!(srv.connections.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn connection_refused_is_a_connect_error() {
    let refused = RefusedPort::new();
    let up = OpenAiConfig::new(ApiKey::new(KEY).unwrap())
        .with_base_url(format!("http://127.0.0.1:{}/v1", refused.port()))
        .upstream()
        .unwrap();
    let t = HttpTransport::new().unwrap().with_upstream(up);
    let err = t
        .oneshot(post("/chat/completions", "{}"))
        .await
        .unwrap_err();
    let legacy = err
        .downcast_ref::<hyper_util::client::legacy::Error>()
        .expect("the transport's own error, boxed");
    assert!(legacy.is_connect());
    let err = into_llm_error(err);
    assert_eq!(err.class(), FailureClass::Connect);
    let shown = format!("{err} {err:?}");
    assert!(shown.to_lowercase().contains("refused"), "{shown}");
    assert!(!shown.contains("SECRET"), "{shown}");
}

#[tokio::test]
async fn a_relative_uri_without_a_base_url_is_an_invalid_request() {
    let t = HttpTransport::new().unwrap();
    let err = t
        .oneshot(post("/chat/completions", "{}"))
        .await
        .unwrap_err();
    assert_eq!(LlmError::from(err).class(), FailureClass::InvalidRequest);
}

#[tokio::test]
async fn debug_never_shows_the_key() {
    let up = OpenAiConfig::new(ApiKey::new(KEY).unwrap())
        .upstream()
        .unwrap();
    let t = HttpTransport::new().unwrap().with_upstream(up.clone());
    let anthropic = AnthropicConfig::new(ApiKey::new(KEY).unwrap());
    for shown in [
        format!("{t:?}"),
        format!("{t:#?}"),
        format!("{up:?}"),
        format!("{anthropic:?}"),
        format!("{:?}", HttpTransport::builder().upstream(up.clone())),
    ] {
        assert!(!shown.contains("SECRET"), "{shown}");
    }
    assert!(format!("{t:?}").contains("api.openai.com"));
}

/// A self-signed certificate for `localhost`: the server's acceptor (h2 and http/1.1 by ALPN)
/// and a client configuration that trusts it.
fn tls_pair() -> (TlsAcceptor, rustls::ClientConfig) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert_der: CertificateDer<'static> = cert.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server_cfg = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert_der.clone()], key)
        .unwrap();
    server_cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert_der).unwrap();
    let client_cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (TlsAcceptor::from(Arc::new(server_cfg)), client_cfg)
}

#[tokio::test]
async fn https_with_http2_by_alpn() {
    let (acceptor, client_cfg) = tls_pair();
    let srv = server(Some(acceptor)).await;
    let up = OpenAiConfig::new(ApiKey::new(KEY).unwrap())
        .with_base_url(format!("https://localhost:{}/v1", srv.addr.port()))
        .upstream()
        .unwrap();
    let t = HttpTransport::builder()
        .tls_config(client_cfg)
        .upstream(up)
        .build()
        .unwrap();
    assert_eq!(
        send(&t, post("/chat/completions", "{}")).await.unwrap(),
        "echo:2"
    );
    let seen = srv.last();
    assert_eq!(seen.version, Version::HTTP_2);
    assert_eq!(
        seen.headers["authorization"],
        format!("Bearer {KEY}").as_str()
    );

    // The default roots do not trust the self-signed certificate: a connect error.
    let t = HttpTransport::new()
        .unwrap()
        .with_upstream(Upstream::new(&format!("https://localhost:{}", srv.addr.port())).unwrap());
    let err = t.oneshot(post("/v1/x", "{}")).await.unwrap_err();
    assert_eq!(into_llm_error(err).class(), FailureClass::Connect);
}

#[tokio::test]
async fn http2_prior_knowledge_over_plain_http() {
    let srv = server(None).await;
    let t = HttpTransport::builder()
        .http2_prior_knowledge(true)
        .upstream(Upstream::new(&srv.url("")).unwrap())
        .build()
        .unwrap();
    send(&t, post("/v1/messages", "{}")).await.unwrap();
    assert_eq!(srv.last().version, Version::HTTP_2);
}

/// What a loopback proxy saw: the head of each request it received, in order.
#[derive(Clone, Default)]
struct ProxyLog(Arc<Mutex<Vec<String>>>);

impl ProxyLog {
    fn heads(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// A small HTTP proxy on 127.0.0.1: `CONNECT` opens a tunnel to the target (or answers `407`
/// when `password` is set and the request lacks it); any other request is answered by the
/// proxy itself with `proxied`, as a forward proxy's upstream would.
async fn proxy(password: Option<&'static str>) -> (String, ProxyLog) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let log = ProxyLog::default();
    let seen = log.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if client.read_exact(&mut byte).await.is_err() {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                seen.0.lock().unwrap().push(head.clone());
                let authorized = password.is_none_or(|p| head.contains(p));
                if !authorized {
                    let _ = client
                        .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n")
                        .await;
                } else if let Some(target) = head.strip_prefix("CONNECT ") {
                    let target = target.split(' ').next().unwrap().to_owned();
                    let Ok(mut upstream) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    client.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                } else {
                    let _ = client
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nproxied!")
                        .await;
                }
            });
        }
    });
    (url, log)
}

#[tokio::test]
async fn https_goes_through_a_connect_tunnel_with_tls_end_to_end() {
    let (acceptor, client_cfg) = tls_pair();
    let srv = server(Some(acceptor)).await;
    let (proxy_url, log) = proxy(None).await;
    let t = HttpTransport::builder()
        .tls_config(client_cfg)
        .proxy(ProxyMatcher::builder().https(proxy_url.as_str()).build())
        .upstream(
            OpenAiConfig::new(ApiKey::new(KEY).unwrap())
                .with_base_url(format!("https://localhost:{}/v1", srv.addr.port()))
                .upstream()
                .unwrap(),
        )
        .build()
        .unwrap();
    assert_eq!(
        send(&t, post("/chat/completions", "{}")).await.unwrap(),
        "echo:2"
    );
    let heads = log.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(
        heads[0].starts_with(&format!("CONNECT localhost:{} HTTP/1.1", srv.addr.port())),
        "{heads:?}"
    );
    // The key travels inside the TLS tunnel, never in what the proxy can read.
    assert!(!heads[0].contains("SECRET"), "{heads:?}");
    assert_eq!(
        srv.last().headers["authorization"],
        format!("Bearer {KEY}").as_str()
    );
}

#[tokio::test]
async fn no_proxy_hosts_connect_directly() {
    let srv = server(None).await;
    let (proxy_url, log) = proxy(None).await;
    let t = HttpTransport::builder()
        .proxy(
            ProxyMatcher::builder()
                .all(proxy_url.as_str())
                .no("localhost,127.0.0.0/8")
                .build(),
        )
        .upstream(Upstream::new(&srv.url("/v1")).unwrap())
        .build()
        .unwrap();
    assert_eq!(send(&t, post("/messages", "{}")).await.unwrap(), "echo:2");
    assert!(log.heads().is_empty(), "{:?}", log.heads());
    assert_eq!(srv.last().path, "/v1/messages");
}

#[tokio::test]
async fn plain_http_goes_to_a_forward_proxy_in_absolute_form_with_its_credentials() {
    let (proxy_url, log) = proxy(Some("Basic dXNlcjpwcm94eS1wYXNz")).await;
    let with_auth = proxy_url.replace("http://", "http://user:proxy-pass@");
    let t = HttpTransport::builder()
        .proxy(ProxyMatcher::builder().http(with_auth.as_str()).build())
        .upstream(Upstream::new("http://llm.internal:8000/v1").unwrap())
        .build()
        .unwrap();
    assert_eq!(
        send(&t, post("/chat/completions", "{}")).await.unwrap(),
        "proxied!"
    );
    let heads = log.heads();
    assert!(
        heads[0].starts_with("POST http://llm.internal:8000/v1/chat/completions HTTP/1.1"),
        "{heads:?}"
    );
    assert!(
        heads[0].contains("proxy-authorization: Basic dXNlcjpwcm94eS1wYXNz"),
        "{heads:?}"
    );
    assert!(!format!("{t:?}").contains("proxy-pass"), "{t:?}");
}

#[tokio::test]
async fn a_proxy_that_refuses_the_tunnel_is_a_connect_error_without_its_credentials() {
    let (proxy_url, log) = proxy(Some("never sent")).await;
    let with_auth = proxy_url.replace("http://", "http://user:proxy-pass@");
    let t = HttpTransport::builder()
        .proxy(ProxyMatcher::builder().https(with_auth.as_str()).build())
        .upstream(Upstream::new("https://api.openai.com/v1").unwrap())
        .build()
        .unwrap();
    let err = into_llm_error(
        t.oneshot(post("/chat/completions", "{}"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.class(), FailureClass::Connect, "{err}");
    assert_eq!(log.heads().len(), 1);
    assert!(log.heads()[0].starts_with("CONNECT api.openai.com:443"));
    let mut shown = format!("{err} {err:?}");
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        shown.push_str(&format!(" {s} {s:?}"));
        source = s.source();
    }
    assert!(!shown.contains("proxy-pass"), "{shown}");
}

#[tokio::test]
async fn a_socks_proxy_is_refused_with_a_clear_connect_error_not_bypassed() {
    let srv = server(None).await;
    let t = HttpTransport::builder()
        .proxy(ProxyMatcher::builder().all("socks5://127.0.0.1:1").build())
        .upstream(Upstream::new(&srv.url("/v1")).unwrap())
        .build()
        .unwrap();
    let err = into_llm_error(t.oneshot(post("/messages", "{}")).await.unwrap_err());
    assert_eq!(err.class(), FailureClass::Connect, "{err}");
    assert!(err.to_string().contains("socks5"), "{err}");
    assert_eq!(srv.connections.load(Ordering::SeqCst), 0);
}
