//! Test support: a `redis-server` of the test's own (a free loopback port, a fresh data
//! directory, stopped by PID when dropped) and requests to the dashboard's router.

#![allow(dead_code, unreachable_pub)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

/// The opt-out of the Redis tests on a machine without `redis-server` (never under CI).
const SKIP_VAR: &str = "WQ_SKIP_REDIS_TESTS";

fn binary() -> String {
    std::env::var("WQ_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

pub struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts a server with `extra` arguments. A missing binary fails the test, naming the
    /// Debian package, unless `WQ_SKIP_REDIS_TESTS=1` outside CI (then `None`).
    pub fn require(extra: &[&str]) -> Option<Self> {
        let found = Command::new(binary())
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true");
            if !ci && std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") {
                eprintln!("note: redis-server not found; {SKIP_VAR}=1, so this test does not run");
                return None;
            }
            panic!(
                "{} not found: install the Debian package redis-server, or set {SKIP_VAR}=1 \
                 to skip knowingly (never under CI=true)",
                binary()
            );
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "wq-dashboard-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the server's data directory");
        for _ in 0..10 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let mut child = Command::new(binary())
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--daemonize", "no", "--save", "", "--appendonly", "no"])
                .args([
                    "--dir",
                    &dir.display().to_string(),
                    "--logfile",
                    "redis.log",
                ])
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("run redis-server");
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Some(RedisServer { child, port, dir });
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server would not start; see {}", dir.display());
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A response: status, body text and the `Set-Cookie` header if any.
pub struct Reply {
    pub status: StatusCode,
    pub body: String,
    pub cookie: Option<String>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// Sends `request` to `app`.
pub async fn send(app: &Router, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let cookie = response
        .headers()
        .get("set-cookie")
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        cookie,
    }
}

/// A GET with a loopback `Host`.
pub async fn get(app: &Router, path: &str) -> Reply {
    send(
        app,
        Request::get(path)
            .header("host", "127.0.0.1:8080")
            .body(Body::empty())
            .unwrap(),
    )
    .await
}

/// A POST as the page sends it (loopback `Host`, the CSRF header, same origin).
pub async fn post(app: &Router, path: &str, body: serde_json::Value) -> Reply {
    send(
        app,
        Request::post(path)
            .header("host", "127.0.0.1:8080")
            .header("origin", "http://127.0.0.1:8080")
            .header("sec-fetch-site", "same-origin")
            .header("x-wq-csrf", "1")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap(),
    )
    .await
}
