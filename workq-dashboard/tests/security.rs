//! The dashboard as an attacker meets it, through real requests (and real sockets where the
//! server's bounds are the point), over a live `redis-server`: no tokenless trust without the
//! client's address, weak tokens refused at start, `?token=` percent-decoded, guesses counted
//! and slowed, bodies over the limit refused and never acted on, slow requests timed out,
//! idle and slow connections closed, floods of sockets kept from other clients (the many
//! addresses of one IPv6 /64 counted as one client), HTTPS, no secret of a URL shown, the
//! sampler idle while nobody reads, long items (and dead letters' errors) cut in listings but
//! whole in the detail, and time limits of `Duration::MAX` meaning no limit.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use serde_json::json;
use support::{RedisServer, TOKEN, get, send, send_without_peer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use workq_dashboard::admin::{
    Admin, AdminError, BoxFuture, Capabilities, MemoryAdmin, QueueSummary, ServerStatus, Stats,
};
use workq_dashboard::{Config, Dashboard, Server, router};
use workq_redis::RedisAdmin;
use workq_redis::RedisQueue;

async fn queue<T>(server: &RedisServer, name: &str) -> RedisQueue<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    RedisQueue::builder(name)
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .expect("connect")
}

/// Queue `name` with one dead letter.
async fn with_dead_letter(server: &RedisServer, name: &str) -> RedisQueue<u32> {
    let text: RedisQueue<String> = queue(server, name).await;
    text.add("not a number".to_owned()).await.unwrap();
    let numbers: RedisQueue<u32> = queue(server, name).await;
    assert!(numbers.try_get().await.unwrap().is_empty());
    assert_eq!(numbers.stats(10).await.unwrap().summary.dead, 1);
    numbers
}

fn with_token() -> Config {
    Config {
        token: Some(TOKEN.into()),
        ..Config::default()
    }
}

/// The request: `curl -X POST -H 'Host: localhost' -H 'X-Wq-Csrf: 1'
/// http://queues.internal:8080/api/queues/orders/dead-letters/purge` against a router served
/// with `axum::serve(listener, app)`, which records no peer address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_or_the_clients_address_every_request_is_refused() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q = with_dead_letter(&server, "orders").await;
    let app = router(
        RedisAdmin::new(&server.url(), "wq").unwrap(),
        Config::default(),
    );
    let purge = send_without_peer(
        &app,
        Request::post("/api/queues/orders/dead-letters/purge")
            .header("host", "localhost")
            .header("x-wq-csrf", "1")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(purge.status, StatusCode::FORBIDDEN, "{}", purge.body);
    assert_eq!(
        q.stats(10).await.unwrap().summary.dead,
        1,
        "nothing was purged"
    );
    let read = send_without_peer(
        &app,
        Request::get("/api/queues")
            .header("host", "localhost")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(read.status, StatusCode::FORBIDDEN);
    // The error says how to fix it.
    for hint in ["Config::token", "Server", "connect_info"] {
        assert!(read.body.contains(hint), "{hint} in {}", read.body);
    }
    // With a token, the same router needs no peer address.
    let app = router(RedisAdmin::new(&server.url(), "wq").unwrap(), with_token());
    let ok = send_without_peer(
        &app,
        Request::get("/api/queues")
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK);
}

#[tokio::test]
async fn weak_tokens_and_a_public_url_without_one_are_refused_at_start() {
    let build = |token: Option<&str>, public: Option<&str>| {
        Dashboard::new(Config {
            token: token.map(str::to_owned),
            public_url: public.map(str::to_owned),
            ..Config::default()
        })
        .source(MemoryAdmin::new())
        .router()
    };
    let short = build(Some("t0ken-123"), None).unwrap_err();
    assert!(
        short.contains("too weak") && short.contains("128"),
        "{short}"
    );
    assert!(
        !short.contains("t0ken-123"),
        "the error never holds the token"
    );
    let patterned = build(Some(&"ab".repeat(40)), None).unwrap_err();
    assert!(patterned.contains("too weak"), "{patterned}");
    // A token goes into a header as it is: one that could inject a header is refused.
    let injecting = build(
        Some("Zq3Xv9KpL2mN8rT4wY6bC1dF5gH7jQ0sUe\r\nSet-Cookie: admin=1"),
        None,
    )
    .unwrap_err();
    assert!(injecting.contains("URL-safe"), "{injecting}");
    let semicolon = build(Some("Zq3Xv9KpL2mN8rT4wY6bC1dF5gH7jQ0sUe;Path=/"), None).unwrap_err();
    assert!(semicolon.contains("URL-safe"), "{semicolon}");
    let proxied = build(None, Some("https://ops.example.com/wq/")).unwrap_err();
    assert!(proxied.contains("needs a token"), "{proxied}");
    assert!(build(Some(TOKEN), Some("https://ops.example.com/wq/")).is_ok());
    assert!(build(Some(&workq_dashboard::generate_token()), None).is_ok());
}

#[tokio::test]
async fn the_token_in_the_address_is_percent_decoded() {
    let token = "Zq3Xv9Kp.L2mN8rT4~wY6bC1dF5gH7jQ0sUe";
    let app = router(
        MemoryAdmin::new(),
        Config {
            token: Some(token.into()),
            ..Config::default()
        },
    );
    let encoded = token.replace('~', "%7E").replace('.', "%2E");
    let visit = get(&app, &format!("/?token={encoded}")).await;
    assert_eq!(visit.status, StatusCode::SEE_OTHER, "{}", visit.body);
    let cookie = visit.cookie.unwrap();
    assert!(
        cookie.starts_with(&format!("wq_dashboard_token={token};")),
        "{cookie}"
    );
    // A wrong token that tries to smuggle a header through its decoding sets nothing.
    let smuggled = get(&app, "/?token=x%0D%0ASet-Cookie:%20admin=1").await;
    assert_eq!(smuggled.status, StatusCode::UNAUTHORIZED);
    assert!(smuggled.cookie.is_none());
}

fn from(peer: &str, token: &str) -> Request<Body> {
    let mut request = Request::get("/api/queues")
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap();
    request
        .extensions_mut()
        .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
    request
}

/// On the paused clock of the test runtime, the time a request takes is exactly the time
/// the dashboard held its answer.
#[tokio::test(start_paused = true)]
async fn failed_attempts_are_counted_and_slowed_down_per_address() {
    let app = router(MemoryAdmin::new(), with_token());
    let wrong = "Aq3Xv9KpL2mN8rT4wY6bC1dF5gH7jQ0sUe";
    let mut held = Vec::new();
    for _ in 0..8 {
        let start = tokio::time::Instant::now();
        let reply = send(&app, from("203.0.113.9:4000", wrong)).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        held.push(start.elapsed());
    }
    assert_eq!(&held[..5], &[Duration::ZERO; 5], "typos are not slowed");
    assert!(held[5] >= Duration::from_millis(200), "{held:?}");
    assert!(held[7] > held[6] && held[6] > held[5], "{held:?}");
    // Another address is not slowed by the first one's guesses.
    let start = tokio::time::Instant::now();
    send(&app, from("198.51.100.3:4000", wrong)).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Nor is a request with no token at all: it guesses nothing.
    let mut bare = Request::get("/api/queues").body(Body::empty()).unwrap();
    bare.extensions_mut().insert(ConnectInfo(
        "203.0.113.9:4002".parse::<SocketAddr>().unwrap(),
    ));
    let start = tokio::time::Instant::now();
    assert_eq!(send(&app, bare).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Nor is the right token from the guessing address.
    let start = tokio::time::Instant::now();
    let ok = send(&app, from("203.0.113.9:4001", TOKEN)).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::ZERO);
    let mut metrics = Request::get("/metrics")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    metrics
        .extensions_mut()
        .insert(ConnectInfo("127.0.0.1:1".parse::<SocketAddr>().unwrap()));
    let text = send(&app, metrics).await.body;
    for line in [
        "workqueue_dashboard_auth_failures_total 10",
        "workqueue_dashboard_refusals_total{reason=\"unauthorized\"} 10",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

/// A POST as the page sends it, with a token and `body`.
fn action(path: &str, body: Body, length: Option<usize>) -> Request<Body> {
    let mut request = Request::post(path)
        .header("host", "127.0.0.1:8080")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("x-wq-csrf", "1")
        .header("content-type", "application/json");
    if let Some(n) = length {
        request = request.header("content-length", n);
    }
    request.body(body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_refused_and_never_acted_on() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q = with_dead_letter(&server, "orders").await;
    let app = router(RedisAdmin::new(&server.url(), "wq").unwrap(), with_token());
    let huge = format!("{{\"item\": \"{}\"}}", "x".repeat(200_000));
    let declared = send(
        &app,
        action(
            "/api/queues/orders/dead-letters/purge",
            Body::from(huge.clone()),
            Some(huge.len()),
        ),
    )
    .await;
    assert_eq!(declared.status, StatusCode::PAYLOAD_TOO_LARGE);
    // No length given: the body streams, and is refused once it passes the limit.
    let chunks: Vec<Result<String, std::io::Error>> =
        (0..50).map(|_| Ok("y".repeat(4096))).collect();
    let streamed = send(
        &app,
        action(
            "/api/queues/orders/dead-letters/purge",
            Body::from_stream(futures::stream::iter(chunks)),
            None,
        ),
    )
    .await;
    assert_eq!(
        streamed.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        streamed.body
    );
    assert_eq!(
        q.stats(10).await.unwrap().summary.dead,
        1,
        "nothing was purged"
    );
    let garbled = send(
        &app,
        action(
            "/api/queues/orders/items/remove",
            Body::from("{not json"),
            None,
        ),
    )
    .await;
    assert_eq!(garbled.status, StatusCode::BAD_REQUEST);
    let mut metrics = Request::get("/metrics")
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    metrics
        .extensions_mut()
        .insert(ConnectInfo("127.0.0.1:1".parse::<SocketAddr>().unwrap()));
    let text = send(&app, metrics).await.body;
    for line in [
        "workqueue_dashboard_refusals_total{reason=\"body_too_large\"} 2",
        "workqueue_dashboard_refusals_total{reason=\"bad_body\"} 1",
        "workqueue_dashboard_actions_total{action=\"purge_dead_letters\",result=\"refused\"} 2",
        "workqueue_dashboard_actions_total{action=\"remove\",result=\"refused\"} 1",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

/// A dashboard served by [`Server`] on a free loopback port.
async fn serve(app: axum::Router, server: impl FnOnce(Server) -> Server) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = server(Server::new(listener));
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.serve(app));
    addr
}

/// One request on a fresh connection from `from` (a loopback address); the whole answer
/// (empty if the server closed the connection unanswered, or reset it).
async fn exchange(addr: SocketAddr, from: &str, request: &str) -> String {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    if stream.write_all(request.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut reply))
        .await
        .expect("an answer or a close");
    String::from_utf8_lossy(&reply).into_owned()
}

/// `n` connections from `from` (a loopback address) that never send a byte.
async fn idle_sockets(addr: SocketAddr, from: &str, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut sockets = Vec::with_capacity(n);
    for _ in 0..n {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
        sockets.push(socket.connect(addr).await.expect("connect"));
    }
    sockets
}

/// How many of `sockets` the server closed (or closes within `wait` of each read), without
/// answering them.
async fn closed_by_the_server(sockets: &mut [tokio::net::TcpStream], wait: Duration) -> usize {
    let mut closed = 0;
    for stream in sockets {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(wait, stream.read(&mut byte)).await {
            Ok(Ok(0) | Err(_)) => closed += 1,
            Ok(Ok(_)) => panic!("an answer to no request"),
            Err(_) => {}
        }
    }
    closed
}

fn authorised_get(addr: SocketAddr, path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Connection: close\r\n\r\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_never_finishes_its_body_is_answered_408() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q = with_dead_letter(&server, "orders").await;
    let app = router(
        RedisAdmin::new(&server.url(), "wq").unwrap(),
        Config {
            request_timeout: Duration::from_millis(500),
            ..with_token()
        },
    );
    let addr = serve(app, |s| s).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    stream
        .write_all(
            format!(
                "POST /api/queues/orders/dead-letters/purge HTTP/1.1\r\nHost: {addr}\r\n\
                 Authorization: Bearer {TOKEN}\r\nX-Wq-Csrf: 1\r\nContent-Length: 100\r\n\r\n{{"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut reply = vec![0; 1024];
    let n = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut reply))
        .await
        .expect("an answer")
        .unwrap();
    let reply = String::from_utf8_lossy(&reply[..n]);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert_eq!(
        q.stats(10).await.unwrap().summary.dead,
        1,
        "nothing was purged"
    );
}

/// Every time limit of the router and the server at `Duration::MAX` means no limit: the
/// requests are answered, the actions acted on, and no connection's task panics on a
/// deadline past the clock's end (hyper added the header timeout to the clock's now).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_limits_of_duration_max_mean_no_limit() {
    let admin = MemoryAdmin::new();
    let app = router(
        admin,
        Config {
            request_timeout: Duration::MAX,
            sample_every: Duration::MAX,
            keep: Duration::MAX,
            ..with_token()
        },
    );
    let addr = serve(app, |s| s.header_read_timeout(Duration::MAX)).await;
    for _ in 0..2 {
        let reply = exchange(addr, "127.0.0.1", &authorised_get(addr, "/api/queues")).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
    }
    let reply = exchange(
        addr,
        "127.0.0.1",
        &format!(
            "POST /api/queues/orders/pause HTTP/1.1\r\nHost: {addr}\r\n\
             Authorization: Bearer {TOKEN}\r\nX-Wq-Csrf: 1\r\nContent-Length: 0\r\n\
             Connection: close\r\n\r\n"
        ),
    )
    .await;
    // Answered (the in-process source has no queue of that name), not dropped.
    assert!(reply.starts_with("HTTP/1.1 "), "{reply:?}");
    assert!(!reply.starts_with("HTTP/1.1 408"), "{reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_are_closed_and_a_flood_keeps_no_one_out() {
    let app = router(MemoryAdmin::new(), with_token());
    let addr = serve(app, |s| {
        s.max_connections(300)
            .max_connections_per_client(20)
            .header_read_timeout(Duration::from_millis(500))
    })
    .await;
    // 2,000 sockets from 127.0.0.2 that never send a byte.
    let mut flood = idle_sockets(addr, "127.0.0.2", 2_000).await;
    // An operator from another address is answered at once.
    let reply = exchange(addr, "127.0.0.1", &authorised_get(addr, "/api/queues")).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // All but 20 of the flood were closed as they came: the server holds no descriptor
    // for them. The 20 it kept are closed when their headers do not come.
    assert_eq!(
        closed_by_the_server(&mut flood, Duration::from_secs(10)).await,
        2_000,
        "every idle connection is closed in the end"
    );
    // A client that trickles its headers is closed too, before they are done.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    let mut slow = socket.connect(addr).await.unwrap();
    let mut cut = false;
    for b in authorised_get(addr, "/api/queues").bytes() {
        if slow.write_all(&[b]).await.is_err() {
            cut = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut rest = Vec::new();
    let answered = slow.read_to_end(&mut rest).await.map_or(0, |_| rest.len());
    assert!(
        cut || !String::from_utf8_lossy(&rest).contains("200 OK"),
        "a trickle of headers over 0.5 s is cut: {answered} bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connections_of_one_address_are_capped_not_those_of_others() {
    let app = router(MemoryAdmin::new(), with_token());
    let addr = serve(app, |s| {
        s.max_connections(100).max_connections_per_client(5)
    })
    .await;
    let held = idle_sockets(addr, "127.0.0.3", 5).await;
    // The sixth from that address is closed at once, unanswered.
    let sixth = exchange(addr, "127.0.0.3", &authorised_get(addr, "/api/queues")).await;
    assert!(sixth.is_empty(), "{sixth}");
    let other = exchange(addr, "127.0.0.4", &authorised_get(addr, "/api/queues")).await;
    assert!(other.starts_with("HTTP/1.1 200"), "{other}");
    drop(held);
    // Their places are free again.
    let mut again = String::new();
    for _ in 0..50 {
        again = exchange(addr, "127.0.0.3", &authorised_get(addr, "/api/queues")).await;
        if !again.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
}

/// A listener that gives each connection from 127.0.0.5 another address of one IPv6 /64
/// (`2001:db8:1:2::1`, `::2`, ...), as a machine given a /64 can send from, and every other
/// connection `2001:db8:9:9::1`: loopback has one IPv6 address, so the test names them.
struct OneSixtyFour {
    inner: tokio::net::TcpListener,
    next: u16,
}

impl axum::serve::Listener for OneSixtyFour {
    type Io = tokio::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (stream, peer) = axum::serve::Listener::accept(&mut self.inner).await;
        let ip = if peer.ip() == std::net::IpAddr::from([127, 0, 0, 5]) {
            self.next += 1;
            std::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 0, 0, 0, self.next)
        } else {
            std::net::Ipv6Addr::new(0x2001, 0xdb8, 9, 9, 0, 0, 0, 1)
        };
        (stream, SocketAddr::new(ip.into(), peer.port()))
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// One client with many addresses of its /64 is one client to the per-client cap: its
/// sockets cannot fill the cap of all connections and keep an operator out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_addresses_of_one_ipv6_64_are_one_client_and_keep_no_one_out() {
    let app = router(MemoryAdmin::new(), with_token());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::from_listener(OneSixtyFour {
        inner: listener,
        next: 0,
    })
    .max_connections(20)
    .max_connections_per_client(5)
    .header_read_timeout(Duration::from_secs(60));
    tokio::spawn(server.serve(app));
    // As many idle sockets as the cap of all connections, each from an address of its own
    // in one /64.
    let mut flood = idle_sockets(addr, "127.0.0.5", 20).await;
    // An operator from another /64 is answered.
    let reply = exchange(addr, "127.0.0.1", &authorised_get(addr, "/api/queues")).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // The /64 kept 5 connections; the others were closed as they came.
    assert_eq!(
        closed_by_the_server(&mut flood, Duration::from_millis(500)).await,
        15,
        "all but the per-client cap of 5 closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_certificate_and_its_key() {
    let dir = std::env::temp_dir().join(format!("wq-dashboard-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = Server::new(listener)
        .tls_pem(&cert_path, &key_path)
        .expect("a certificate and its key");
    assert!(server.is_tls());
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.serve(router(MemoryAdmin::new(), with_token())));
    // A key that is not the certificate's is refused at start.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let other_key = dir.join("other.pem");
    std::fs::write(&other_key, other.signing_key.serialize_pem()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    assert!(
        Server::new(listener)
            .tls_pem(&cert_path, &other_key)
            .is_err()
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    assert!(Server::new(listener).tls_pem(&key_path, &key_path).is_err());

    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.expect("a TLS handshake");
    tls.write_all(authorised_get(addr, "/api/queues").as_bytes())
        .await
        .unwrap();
    let mut reply = Vec::new();
    let _ = tls.read_to_end(&mut reply).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // Plain HTTP to the HTTPS port gets no page.
    let plain = exchange(addr, "127.0.0.1", &authorised_get(addr, "/api/queues")).await;
    assert!(!plain.contains("200 OK"), "{plain}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn no_url_secret_is_shown_whatever_the_scheme() {
    let url = "redis+unix:///nonexistent/wq-test.sock?db=0&pass=hunter2-s3cret";
    let source = RedisAdmin::new(url, "wq").unwrap();
    assert!(!format!("{source:?}").contains("hunter2"), "{source:?}");
    let app = router(source, Config::default());
    let reply = get(&app, "/api/queues").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!reply.body.contains("hunter2"), "{}", reply.body);
    assert!(
        reply
            .body
            .contains("redis+unix:///nonexistent/wq-test.sock?db=0&pass=***"),
        "{}",
        reply.body
    );
}

/// A source that counts how often its queues are listed (a real in-process source under
/// it).
#[derive(Debug)]
struct Counting {
    inner: MemoryAdmin,
    listings: Arc<AtomicUsize>,
}

impl Admin for Counting {
    fn kind(&self) -> &'static str {
        "memory"
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn status(&self) -> ServerStatus {
        self.inner.status()
    }
    fn queues(&self) -> BoxFuture<'_, Result<Vec<QueueSummary>, AdminError>> {
        self.listings.fetch_add(1, Ordering::SeqCst);
        self.inner.queues()
    }
    fn summary<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueSummary, AdminError>> {
        self.inner.summary(queue)
    }
    fn stats<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Stats, AdminError>> {
        self.inner.stats(queue, limit)
    }
}

#[tokio::test(start_paused = true)]
async fn the_sampler_asks_the_servers_nothing_while_nobody_reads() {
    let listings = Arc::new(AtomicUsize::new(0));
    let app = router(
        Counting {
            inner: MemoryAdmin::new(),
            listings: listings.clone(),
        },
        Config {
            sample_every: Duration::from_secs(1),
            ..Config::default()
        },
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(listings.load(Ordering::SeqCst), 0, "no page, no scraper");
    // A scraper reads: sampled every second while it does, and 10 s after.
    get(&app, "/metrics").await;
    let after_read = listings.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let sampled = listings.load(Ordering::SeqCst) - after_read;
    assert!((4..=6).contains(&sampled), "{sampled} samples in 5 s");
    tokio::time::sleep(Duration::from_secs(30)).await;
    let idle = listings.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(listings.load(Ordering::SeqCst), idle, "idle again");
    get(&app, "/api/queues").await;
    let woken = listings.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        listings.load(Ordering::SeqCst) >= woken + 2,
        "a page reads again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_cut_long_items_and_the_detail_shows_them_whole() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q: RedisQueue<String> = queue(&server, "big").await;
    let long = format!("<img src=x onerror=alert(1)>{}", "é".repeat(20_000));
    q.add(long.clone()).await.unwrap();
    q.add("short".to_owned()).await.unwrap();
    let app = router(
        RedisAdmin::new(&server.url(), "wq").unwrap(),
        Config::default(),
    );
    let reply = get(&app, "/api/queues/big/items?state=ready&limit=10").await;
    assert!(reply.body.len() < 2_000, "{} bytes", reply.body.len());
    let page = reply.json();
    let first = &page["items"][0];
    assert_eq!(first["item_truncated"], true);
    assert_eq!(
        first["item_bytes"],
        json!(serde_json::to_string(&long).unwrap().len())
    );
    let shown = first["item"].as_str().unwrap();
    assert!(shown.len() <= 250 && shown.ends_with('…'), "{shown}");
    assert_eq!(page["items"][1]["item"], "\"short\"");
    assert!(page["items"][1].get("item_truncated").is_none());
    let reference = first["item_ref"].as_str().unwrap();
    let detail = get(
        &app,
        &format!("/api/queues/big/item?ref={reference}&state=ready&limit=10"),
    )
    .await;
    assert_eq!(detail.status, StatusCode::OK, "{}", detail.body);
    assert_eq!(
        detail.json()["item"].as_str().unwrap(),
        serde_json::to_string(&long).unwrap(),
        "the detail has it whole"
    );
    let gone = get(
        &app,
        "/api/queues/big/item?ref=0000000000000000&state=ready&limit=10",
    )
    .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
}

/// A dead letter's error text, as long as the item it quotes, is cut in the listing of dead
/// letters like its item, and whole in the item's detail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_dead_letter_error_is_cut_in_listings_and_whole_in_the_detail() {
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let text: RedisQueue<String> = queue(&server, "dl").await;
    let long = "é".repeat(2_000);
    text.add(long.clone()).await.unwrap();
    // The number queue cannot read it: a dead letter whose error quotes the whole text.
    let numbers: RedisQueue<u32> = queue(&server, "dl").await;
    assert!(numbers.try_get().await.unwrap().is_empty());
    let app = router(
        RedisAdmin::new(&server.url(), "wq").unwrap(),
        Config::default(),
    );
    let reply = get(&app, "/api/queues/dl/items?state=dead&limit=10").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let page = reply.json();
    // The error, the dead letter's item and the entry's item are cut. (Redis's dead letter
    // id is its stored entry, item and error included, and is carried whole: the page
    // posts it back to requeue or delete that letter.)
    let entry = &page["items"][0];
    for text in [
        &entry["dead"]["error"],
        &entry["dead"]["item"],
        &entry["item"],
    ] {
        let text = text.as_str().unwrap();
        assert!(text.len() <= 250 && text.ends_with('…'), "{text}");
    }
    assert!(
        entry["dead"]["error"]
            .as_str()
            .unwrap()
            .starts_with("invalid type: string"),
        "{entry}"
    );
    let reference = page["items"][0]["item_ref"].as_str().unwrap();
    let detail = get(
        &app,
        &format!("/api/queues/dl/item?ref={reference}&state=dead&limit=10"),
    )
    .await;
    assert_eq!(detail.status, StatusCode::OK, "{}", detail.body);
    let whole = detail.json()["dead_letters"][0]["error"]
        .as_str()
        .unwrap()
        .to_owned();
    // Whole as the backend keeps it (Redis keeps an error's first 1,000 bytes).
    let cut = entry["dead"]["error"]
        .as_str()
        .unwrap()
        .trim_end_matches('…');
    assert!(
        whole.len() >= 1_000 && whole.starts_with(cut) && whole.ends_with("éé"),
        "{} bytes",
        whole.len()
    );
}
