//! `wq dashboard`: refuses to expose itself without a token, serves the queues of a live
//! `redis-server` and of a live PostgreSQL side by side, never prints a password, logs every
//! action to stderr, and stops on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const WQ: &str = env!("CARGO_BIN_EXE_wq");

/// A process of the test's own, stopped by PID when dropped.
struct Stop(Child);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[path = "../../workqueue-redis/tests/support/server.rs"]
mod server;

#[path = "../../workqueue-postgres/tests/support/server.rs"]
mod pg_server;

/// A password-protected `redis-server` from workqueue-redis's test support, or `None` when it
/// is missing and `WQ_SKIP_REDIS_TESTS=1` outside CI; a missing server fails the test
/// otherwise.
fn redis(password: &str) -> Option<server::RedisServer> {
    server::require_with(server::Durability::None, &["--requirepass", password])
}

fn http_get(addr: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

#[test]
fn anything_but_loopback_needs_a_token() {
    let out = Command::new(WQ)
        .args([
            "dashboard",
            "--redis",
            "redis://127.0.0.1:1/",
            "--addr",
            "0.0.0.0:0",
        ])
        .env_remove("WQ_DASHBOARD_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("token"));
}

#[test]
fn a_public_url_needs_a_token_and_a_token_file_is_read() {
    let run = |args: &[&str]| {
        Command::new(WQ)
            .arg("dashboard")
            .args(["--redis", "redis://127.0.0.1:1/", "--addr", "127.0.0.1:0"])
            .args(args)
            .env_remove("WQ_DASHBOARD_TOKEN")
            .output()
            .unwrap()
    };
    let out = run(&["--public-url", "https://ops.example.com/wq/"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("token"));
    let empty = std::env::temp_dir().join(format!("wq-empty-token-{}", std::process::id()));
    std::fs::write(&empty, "\n").unwrap();
    let out = run(&["--token-file", &empty.display().to_string()]);
    let _ = std::fs::remove_file(&empty);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("empty"));
    let out = run(&["--token-file", "/nonexistent/wq-token"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn serves_the_queues_and_hides_the_password() {
    let Some(server) = redis("pw-s3cret") else {
        return;
    };
    let port = server.port();
    let url = format!("redis://:pw-s3cret@127.0.0.1:{port}/");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let q: workqueue_redis::RedisQueue<u32> = workqueue_redis::RedisQueue::builder("mail")
            .url(url.clone())
            .check_persistence(false)
            .build()
            .await
            .unwrap();
        q.add(1).await.unwrap();
        q.add(2).await.unwrap();
    });
    let mut child = Command::new(WQ)
        .args(["dashboard", "--addr", "127.0.0.1:0"])
        .env("WQ_REDIS_URL", &url)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut dashboard = Stop(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    assert!(!line.contains("pw-s3cret"), "{line}");
    assert!(line.contains("***@127.0.0.1"), "{line}");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    let reply = http_get(&addr, "/api/queues");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"name\":\"mail\""), "{reply}");
    assert!(reply.contains("\"depth\":2"), "{reply}");
    assert!(!reply.contains("pw-s3cret"));
    let metrics = http_get(&addr, "/metrics");
    assert!(
        metrics.contains("workqueue_depth{name=\"mail\",source=\"redis\"} 2"),
        "{metrics}"
    );

    // An action is logged to stderr: who, what, which queue, and what came of it.
    let reply = http_post(&addr, "/api/queues/mail/pause");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"message\":\"paused\""), "{reply}");
    // SIGTERM stops it cleanly.
    let pid = dashboard.0.id();
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = dashboard.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    let mut log = String::new();
    stderr.read_to_string(&mut log).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("dashboard action"))
        .unwrap_or_else(|| panic!("no audit line in {log:?}"));
    for part in [
        "client=127.0.0.1:",
        "action=\"pause\"",
        "queue=\"mail\"",
        "result=\"ok\"",
    ] {
        assert!(line.contains(part), "{part} in {line}");
    }
    assert!(!log.contains("pw-s3cret"), "{log}");
}

fn http_post(addr: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://{addr}\r\nX-Wq-Csrf: 1\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

#[test]
fn postgres_without_a_url_needs_the_environment() {
    let out = Command::new(WQ)
        .args(["dashboard", "--postgres", "--addr", "127.0.0.1:0"])
        .env_remove("WQ_POSTGRES_URL")
        .env_remove("WQ_REDIS_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("WQ_POSTGRES_URL"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(WQ)
        .args([
            "dashboard",
            "--postgres",
            "mysql://nowhere",
            "--addr",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a URL that is not PostgreSQL's");
}

/// `--redis URL` and `--postgres` (its URL from `WQ_POSTGRES_URL`): both servers' queues on one
/// page, an action on the PostgreSQL queue in the audit trail, no password anywhere.
#[test]
fn serves_redis_and_postgres_queues_side_by_side() {
    let Some(redis) = redis("pw-r3dis") else {
        return;
    };
    let Some(pg) = pg_server::PgServer::start() else {
        return;
    };
    let redis_url = format!("redis://:pw-r3dis@127.0.0.1:{}/", redis.port());
    // The test server trusts loopback clients: the password is never checked, only hidden.
    let pg_url = pg.url().replacen(
        "postgres://postgres@",
        "postgres://postgres:pw-p0stgres@",
        1,
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let r: workqueue_redis::RedisQueue<u32> = workqueue_redis::RedisQueue::builder("mail")
            .url(redis_url.clone())
            .check_persistence(false)
            .build()
            .await
            .unwrap();
        r.add(1).await.unwrap();
        let p: workqueue_postgres::PgQueue<u32> = workqueue_postgres::PgQueue::builder("billing")
            .url(pg_url.clone())
            .listen(false)
            .build()
            .await
            .unwrap();
        for i in 0..3 {
            p.add(i).await.unwrap();
        }
    });
    let mut child = Command::new(WQ)
        .args([
            "dashboard",
            "--addr",
            "127.0.0.1:0",
            "--redis",
            &redis_url,
            "--postgres",
        ])
        .env("WQ_POSTGRES_URL", &pg_url)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut dashboard = Stop(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    for secret in ["pw-r3dis", "pw-p0stgres"] {
        assert!(!line.contains(secret), "{line}");
    }
    assert!(
        line.contains("the queues in PostgreSQL at postgres://***@127.0.0.1:"),
        "{line}"
    );
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    let reply = http_get(&addr, "/api/queues");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let body: serde_json::Value =
        serde_json::from_str(reply.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    // Each source's queues, in the order of the sources.
    let listed: Vec<(String, String, u64)> = body["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            (
                q["source"].as_str().unwrap().to_owned(),
                q["name"].as_str().unwrap().to_owned(),
                q["depth"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("redis".to_owned(), "mail".to_owned(), 1),
            ("postgres".to_owned(), "billing".to_owned(), 3)
        ]
    );
    for secret in ["pw-r3dis", "pw-p0stgres"] {
        assert!(!reply.contains(secret), "{reply}");
    }
    let metrics = http_get(&addr, "/metrics");
    assert!(
        metrics.contains("workqueue_depth{name=\"billing\",source=\"postgres\"} 3"),
        "{metrics}"
    );
    let reply = http_post(&addr, "/api/queues/billing/pause");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"message\":\"paused\""), "{reply}");
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(dashboard.0.id().to_string())
        .status();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = dashboard.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    let mut log = String::new();
    stderr.read_to_string(&mut log).unwrap();
    let audit = log
        .lines()
        .find(|l| l.contains("dashboard action"))
        .unwrap_or_else(|| panic!("no audit line in {log:?}"));
    for part in ["source=postgres", "queue=\"billing\"", "result=\"ok\""] {
        assert!(audit.contains(part), "{part} in {audit}");
    }
    for secret in ["pw-r3dis", "pw-p0stgres"] {
        assert!(!log.contains(secret), "{log}");
    }
}
