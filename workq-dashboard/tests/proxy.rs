//! The dashboard behind a real nginx with its defaults (`proxy_pass` alone: `Host` rewritten
//! to the upstream's address, no `X-Forwarded-*` header), over a live `redis-server`: with
//! `Config::public_url` the token's cookie is scoped to the proxied path and actions from the
//! public origin go through; without it, the same action is refused as cross-origin. Every
//! request through the proxy reaches the dashboard from 127.0.0.1, so without the token
//! nothing is read or done through it.
//!
//! Needs the Debian package `nginx` (`$WQ_NGINX`, else `/usr/sbin/nginx`). Without it the test
//! fails, naming the package; outside CI, `WQ_SKIP_NGINX_TESTS=1` skips it knowingly.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use workq_conformance::servers::free_port;
use workq_conformance::servers::nginx::{self as nginx_support, nginx_binary};
use workq_dashboard::{Config, Dashboard, Server};
use workq_redis::RedisAdmin;
use workq_redis::RedisQueue;

/// nginx on `port`, proxying `/wq/` to `with_public` and `/plain/` to `without`, with
/// nothing but `proxy_pass`: nginx's defaults.
fn nginx(
    binary: &PathBuf,
    port: u16,
    with_public: SocketAddr,
    without: SocketAddr,
) -> nginx_support::Nginx {
    nginx_support::start(binary, port, &[("/wq/", with_public), ("/plain/", without)])
}

/// One HTTP/1.1 exchange on a fresh connection: the status line, the headers and the body.
fn exchange(port: u16, request: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

async fn serve(dashboard: Dashboard) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = dashboard.router().unwrap();
    tokio::spawn(Server::new(listener).serve(app));
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_nginx_defaults_the_public_url_keeps_actions_working_and_safe() {
    let Some(binary) = nginx_binary() else {
        return;
    };
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q: RedisQueue<String> = RedisQueue::builder("jobs")
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .unwrap();
    q.add("x".to_owned()).await.unwrap();
    let port = free_port();
    let public = format!("http://127.0.0.1:{port}/wq/");
    let config = |public_url: Option<String>| Config {
        token: Some(support::TOKEN.into()),
        public_url,
        ..Config::default()
    };
    let source = || RedisAdmin::new(&server.url(), "wq").unwrap();
    let with_public = serve(Dashboard::new(config(Some(public.clone()))).source(source())).await;
    let without = serve(Dashboard::new(config(None)).source(source())).await;
    let _nginx = nginx(&binary, port, with_public, without);
    let host = format!("127.0.0.1:{port}");

    let result = tokio::task::spawn_blocking(move || {
        // The token's visit sets a cookie scoped to the proxied path.
        let visit = exchange(
            port,
            &format!("GET /wq/?token={} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n", support::TOKEN),
        );
        assert!(visit.starts_with("HTTP/1.1 303"), "{visit}");
        let cookie_line = visit
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
            .unwrap_or_else(|| panic!("no cookie in {visit}"))
            .to_owned();
        assert!(cookie_line.contains("Path=/wq/"), "{cookie_line}");
        assert!(!cookie_line.contains("Secure"), "plain http: {cookie_line}");
        let pair = cookie_line
            .split_once(':')
            .unwrap()
            .1
            .trim()
            .split(';')
            .next()
            .unwrap()
            .to_owned();
        let listing = exchange(
            port,
            &format!("GET /wq/api/queues HTTP/1.1\r\nHost: {host}\r\nCookie: {pair}\r\nConnection: close\r\n\r\n"),
        );
        assert!(listing.starts_with("HTTP/1.1 200"), "{listing}");
        assert!(listing.contains("\"name\":\"jobs\""), "{listing}");
        // An action as the browser sends it: the public origin, the cookie, the header.
        let token = support::TOKEN;
        let action = |prefix: &str| {
            exchange(
                port,
                &format!(
                    "POST /{prefix}/api/queues/jobs/pause HTTP/1.1\r\nHost: {host}\r\n\
                     Origin: http://{host}\r\nSec-Fetch-Site: same-origin\r\nX-Wq-Csrf: 1\r\n\
                     Cookie: {pair}\r\nAuthorization: Bearer {token}\r\n\
                     Content-Length: 0\r\nConnection: close\r\n\r\n"
                ),
            )
        };
        let refused = action("plain");
        assert!(refused.starts_with("HTTP/1.1 403"), "without a public URL: {refused}");
        assert!(refused.contains("cross-origin"), "{refused}");
        let done = action("wq");
        assert!(done.starts_with("HTTP/1.1 200"), "with the public URL: {done}");
        // A page of another origin is refused behind the proxy too.
        let foreign = exchange(
            port,
            &format!(
                "POST /wq/api/queues/jobs/resume HTTP/1.1\r\nHost: {host}\r\n\
                 Origin: http://evil.example\r\nX-Wq-Csrf: 1\r\nCookie: {pair}\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            ),
        );
        assert!(foreign.starts_with("HTTP/1.1 403"), "{foreign}");
    })
    .await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic.into_panic());
    }
    assert!(
        q.is_paused().await.unwrap(),
        "only the action through /wq/ paused it"
    );
}

/// The request, through nginx's defaults to a dashboard with a token: the request
/// reaches the dashboard from 127.0.0.1 naming a loopback `Host`, which is all the tokenless
/// mode looked at; with a token it reads nothing and purges nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_nginx_without_the_token_nothing_is_read_or_done() {
    let Some(binary) = nginx_binary() else {
        return;
    };
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let text: RedisQueue<String> = RedisQueue::builder("orders")
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .unwrap();
    text.add("bad".to_owned()).await.unwrap();
    let numbers: RedisQueue<u32> = RedisQueue::builder("orders")
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .unwrap();
    assert!(numbers.try_get().await.unwrap().is_empty());
    assert_eq!(numbers.stats(10).await.unwrap().summary.dead, 1);
    let token = workq_dashboard::generate_token();
    let upstream = serve(
        Dashboard::new(Config {
            token: Some(token.clone()),
            ..Config::default()
        })
        .source(RedisAdmin::new(&server.url(), "wq").unwrap()),
    )
    .await;
    let port = free_port();
    let _nginx = nginx_support::start(&binary, port, &[("/", upstream)]);
    let result = tokio::task::spawn_blocking(move || {
        let purge = exchange(
            port,
            "POST /api/queues/orders/dead-letters/purge HTTP/1.1\r\nHost: localhost\r\n\
             X-Wq-Csrf: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        assert!(purge.starts_with("HTTP/1.1 401"), "{purge}");
        let read = exchange(
            port,
            "GET /api/queues/orders/items?state=dead HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             Connection: close\r\n\r\n",
        );
        assert!(read.starts_with("HTTP/1.1 401"), "{read}");
        assert!(!read.contains("bad"), "{read}");
        let with_token = exchange(
            port,
            &format!(
                "GET /api/queues HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
                 Connection: close\r\n\r\n"
            ),
        );
        assert!(with_token.starts_with("HTTP/1.1 200"), "{with_token}");
    })
    .await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic.into_panic());
    }
    assert_eq!(
        numbers.stats(10).await.unwrap().summary.dead,
        1,
        "nothing was purged"
    );
}
