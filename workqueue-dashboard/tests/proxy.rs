//! The dashboard behind a real nginx with its defaults (`proxy_pass` alone: `Host` rewritten
//! to the upstream's address, no `X-Forwarded-*` header), over a live `redis-server`: with
//! `Config::public_url` the token's cookie is scoped to the proxied path and actions from the
//! public origin go through; without it, the same action is refused as cross-origin.
//!
//! Needs the Debian package `nginx` (`$WQ_NGINX`, else `/usr/sbin/nginx`). Without it the test
//! fails, naming the package; outside CI, `WQ_SKIP_NGINX_TESTS=1` skips it knowingly.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use workqueue_dashboard::{Config, Dashboard, RedisSource};
use workqueue_redis::RedisQueue;

const SKIP_VAR: &str = "WQ_SKIP_NGINX_TESTS";

fn nginx_binary() -> Option<PathBuf> {
    let path =
        std::env::var("WQ_NGINX").map_or_else(|_| PathBuf::from("/usr/sbin/nginx"), PathBuf::from);
    if path.exists() {
        return Some(path);
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if !ci && std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") {
        eprintln!("note: no nginx; {SKIP_VAR}=1, so the proxy test does not run");
        return None;
    }
    panic!(
        "{} not found: the proxy test needs the Debian package nginx (apt-get install nginx); \
         outside CI, set {SKIP_VAR}=1 to skip it knowingly",
        path.display()
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// An nginx of the test's own, in a directory of its own, stopped by PID when dropped.
struct Nginx {
    child: Child,
    dir: PathBuf,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// nginx on `port`, proxying `/wq/` to `with_public` and `/plain/` to `without`, with
/// nothing but `proxy_pass`: nginx's defaults.
fn nginx(binary: &PathBuf, port: u16, with_public: SocketAddr, without: SocketAddr) -> Nginx {
    let dir = std::env::temp_dir().join(format!("wq-nginx-{}-{port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log;\nevents {{ worker_connections 64; }}\nhttp {{\n\
         access_log off;\nclient_body_temp_path {d}/body;\nproxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\nuwsgi_temp_path {d}/uwsgi;\nscgi_temp_path {d}/scgi;\n\
         server {{\nlisten 127.0.0.1:{port};\n\
         location /wq/ {{ proxy_pass http://{with_public}/; }}\n\
         location /plain/ {{ proxy_pass http://{without}/; }}\n}}\n}}\n"
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let child = Command::new(binary)
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(&conf_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run nginx");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nginx did not listen; see {d}/error.log"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Nginx { child, dir }
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
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
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
    let source = || RedisSource::new(&server.url(), "wq").unwrap();
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
