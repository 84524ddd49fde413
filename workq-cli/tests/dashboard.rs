//! `wq dashboard` as a process: it makes a token and prints the address to open once, wants
//! the token from everyone (behind a reverse proxy too), refuses to serve the network in
//! clear or with a weak token, says loudly what `--no-auth` trusts, serves HTTPS, holds no
//! descriptor for a flood of sockets, logs every action and refusal to stderr, never prints
//! a password, shows the queues of a live `redis-server` and of a live PostgreSQL side by
//! side, and stops on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const WQ: &str = env!("CARGO_BIN_EXE_wq");

/// A process of the test's own, stopped by PID when dropped.
struct Stop(Child);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

use workq_conformance::servers::{nginx, postgres as pg_server, redis as server};

/// A password-protected `redis-server` of the test's own, or `None` when it is missing and
/// `WQ_SKIP_REDIS_TESTS=1` outside CI; a missing server fails the test otherwise.
fn redis(password: &str) -> Option<server::RedisServer> {
    server::require_with(server::Durability::None, &["--requirepass", password])
}

/// A running `wq dashboard`: the first line it printed, the address it listens on, the token
/// in the address to open (when it made one), and its stderr.
struct Dashboard {
    process: Stop,
    line: String,
    addr: String,
    token: Option<String>,
    /// Kept open for the process's life: it may print more lines (the proxied address
    /// after the public one), and a closed pipe would make that print fail.
    stdout: BufReader<ChildStdout>,
    stderr: ChildStderr,
}

impl Dashboard {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Dashboard {
        let mut command = Command::new(WQ);
        command
            .arg("dashboard")
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("WQ_DASHBOARD_TOKEN")
            .env_remove("WQ_REDIS_URL")
            .env_remove("WQ_POSTGRES_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let process = Stop(child);
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://") || w.starts_with("https://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        let rest = url.split_once("://").unwrap().1;
        let addr = rest
            .split('/')
            .next()
            .unwrap()
            .replace("0.0.0.0", "127.0.0.1");
        let token = url.split_once("?token=").map(|(_, t)| t.to_owned());
        Dashboard {
            process,
            line,
            addr,
            token,
            stdout,
            stderr,
        }
    }

    /// The next line it printed after the first.
    fn next_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line
    }

    fn pid(&self) -> u32 {
        self.process.0.id()
    }

    fn bearer(&self) -> String {
        format!(
            "Authorization: Bearer {}\r\n",
            self.token.as_deref().expect("a token")
        )
    }

    /// SIGTERM; waits for a clean exit and returns what it wrote to stderr.
    fn stop(mut self) -> String {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = self.process.0.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "{status}");
        let mut log = String::new();
        self.stderr.read_to_string(&mut log).unwrap();
        log
    }
}

/// Asserts that `text` holds every one of `parts`.
fn assert_holds(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part} in {text}");
    }
}

/// A `wq dashboard` on a free loopback port with `extra` arguments, for a Redis that is not
/// there (its API answers 503): for what comes before the queues.
fn without_redis(extra: &[&str]) -> Dashboard {
    let mut args = vec!["--addr", "127.0.0.1:0", "--redis", "redis://127.0.0.1:1/"];
    args.extend_from_slice(extra);
    Dashboard::start(&args, &[])
}

/// One request on a fresh connection: the whole answer.
fn http(addr: &str, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    String::from_utf8_lossy(&reply).into_owned()
}

fn http_get(addr: &str, path: &str, extra: &str) -> String {
    http(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n"),
    )
}

/// A POST as the page sends it (same origin, the CSRF header), with `extra` headers.
fn http_post(addr: &str, path: &str, extra: &str) -> String {
    http(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://{addr}\r\nX-Wq-Csrf: 1\r\n\
             {extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    )
}

/// Runs `wq dashboard ARGS`, which must refuse them at start (exit 2, within 20 s: a
/// dashboard that starts serving instead is stopped, and the test fails); its stderr.
fn refused(args: &[&str]) -> String {
    let child = Command::new(WQ)
        .arg("dashboard")
        .args(["--redis", "redis://127.0.0.1:1/"])
        .args(args)
        .env_remove("WQ_DASHBOARD_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut process = Stop(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = process.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "{args:?}: not refused, it serves"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    process
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
    stderr
}

#[test]
fn the_network_is_not_served_in_clear_tokenless_or_with_a_weak_token() {
    let clear = refused(&["--addr", "0.0.0.0:0"]);
    for hint in ["--tls-cert", "--public-url https://", "--insecure-http"] {
        assert!(clear.contains(hint), "{hint} in {clear}");
    }
    let tokenless = refused(&["--addr", "0.0.0.0:0", "--insecure-http", "--no-auth"]);
    assert!(tokenless.contains("loopback"), "{tokenless}");
    // A plain `http://` public URL is refused, `--insecure-http` or not: that flag lets
    // this server speak plain HTTP, not the page operators open.
    for extra in [
        &[][..],
        &["--insecure-http"],
        &["--insecure-http", "--addr", "0.0.0.0:0"],
    ] {
        let mut args = vec!["--public-url", "http://ops.example.com/wq/"];
        args.extend_from_slice(extra);
        let plain = refused(&args);
        assert!(
            plain.contains("--public-url") && plain.contains("https://"),
            "{args:?}: {plain}"
        );
    }
    let weak = refused(&["--token", "t0ken-123"]);
    assert!(
        weak.contains("too weak") && !weak.contains("t0ken-123"),
        "{weak}"
    );
    let unsafe_chars = refused(&["--token", "Zq3Xv9KpL2mN8rT4wY6bC1dF5gH7jQ0sUe;x"]);
    assert!(unsafe_chars.contains("URL-safe"), "{unsafe_chars}");
    refused(&["--no-auth", "--public-url", "https://ops.example.com/wq/"]);
    refused(&["--tls-cert", "/nonexistent/cert.pem"]);
    let empty = std::env::temp_dir().join(format!("wq-empty-token-{}", std::process::id()));
    std::fs::write(&empty, "\n").unwrap();
    let out = refused(&["--token-file", &empty.display().to_string()]);
    let _ = std::fs::remove_file(&empty);
    assert!(out.contains("empty"), "{out}");
    refused(&["--token-file", "/nonexistent/wq-token"]);
}

#[test]
fn a_token_is_made_printed_once_and_wanted_from_everyone() {
    let Some(server) = redis("pw-s3cret") else {
        return;
    };
    let port = server.port();
    let url = format!("redis://:pw-s3cret@127.0.0.1:{port}/");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let q: workq_redis::RedisQueue<u32> = workq_redis::RedisQueue::builder("mail")
            .url(url.clone())
            .check_persistence(false)
            .build()
            .await
            .unwrap();
        q.add(1).await.unwrap();
        q.add(2).await.unwrap();
    });
    let dashboard = Dashboard::start(&["--addr", "127.0.0.1:0"], &[("WQ_REDIS_URL", &url)]);
    let line = dashboard.line.clone();
    assert!(!line.contains("pw-s3cret"), "{line}");
    assert!(line.contains("***@127.0.0.1"), "{line}");
    let token = dashboard
        .token
        .clone()
        .expect("the address carries the token");
    assert!(token.len() >= 22, "{token}");
    workq_dashboard::check_token(&token).unwrap();
    let addr = dashboard.addr.clone();

    // Without the token, nothing; with it, the queues.
    let bare = http_get(&addr, "/api/queues", "");
    assert!(bare.starts_with("HTTP/1.1 401"), "{bare}");
    assert!(!bare.contains("mail"), "{bare}");
    let wrong = http_get(
        &addr,
        "/api/queues",
        "Authorization: Bearer Aq3Xv9KpL2mN8rT4wY6bC1dF5gH7jQ0sUe\r\n",
    );
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    let reply = http_get(&addr, "/api/queues", &dashboard.bearer());
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"name\":\"mail\""), "{reply}");
    assert!(reply.contains("\"depth\":2"), "{reply}");
    assert!(!reply.contains("pw-s3cret"));
    // The printed address sets the cookie, which then serves the page.
    let visit = http_get(&addr, &format!("/?token={token}"), "");
    assert!(visit.starts_with("HTTP/1.1 303"), "{visit}");
    let cookie = visit
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .unwrap_or_else(|| panic!("no cookie in {visit}"));
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap();
    let page = http_get(&addr, "/", &format!("Cookie: {pair}\r\n"));
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let metrics = http_get(&addr, "/metrics", &dashboard.bearer());
    assert!(
        metrics.contains("workqueue_depth{name=\"mail\",source=\"redis\"} 2"),
        "{metrics}"
    );

    // An action, and refusals: without the CSRF header, without the token, a body over the
    // limit.
    let reply = http_post(&addr, "/api/queues/mail/pause", &dashboard.bearer());
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"message\":\"paused\""), "{reply}");
    let no_csrf = http(
        &addr,
        &format!(
            "POST /api/queues/mail/resume HTTP/1.1\r\nHost: {addr}\r\n{}Content-Length: 0\r\n\
             Connection: close\r\n\r\n",
            dashboard.bearer()
        ),
    );
    assert!(no_csrf.starts_with("HTTP/1.1 403"), "{no_csrf}");
    let no_token = http_post(&addr, "/api/queues/mail/dead-letters/purge", "");
    assert!(no_token.starts_with("HTTP/1.1 401"), "{no_token}");
    let huge = http(
        &addr,
        &format!(
            "POST /api/queues/mail/items/remove HTTP/1.1\r\nHost: {addr}\r\nX-Wq-Csrf: 1\r\n{}\
             Content-Length: 1000000\r\nConnection: close\r\n\r\n",
            dashboard.bearer()
        ),
    );
    assert!(huge.starts_with("HTTP/1.1 413"), "{huge}");
    let metrics = http_get(&addr, "/metrics", &dashboard.bearer());
    for counted in [
        "workqueue_dashboard_actions_total{action=\"pause\",result=\"ok\"} 1",
        "workqueue_dashboard_actions_total{action=\"resume\",result=\"refused\"} 1",
        "workqueue_dashboard_refusals_total{reason=\"csrf\"} 1",
        "workqueue_dashboard_refusals_total{reason=\"body_too_large\"} 1",
        "workqueue_dashboard_auth_failures_total 3",
    ] {
        assert!(metrics.contains(counted), "{counted} in {metrics}");
    }

    // An idle keep-alive connection does not hold up SIGTERM.
    let mut idle = TcpStream::connect(&addr).unwrap();
    write!(
        idle,
        "GET /api/queues HTTP/1.1\r\nHost: {addr}\r\n{}\r\n",
        dashboard.bearer()
    )
    .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let log = dashboard.stop();
    drop(idle);

    // Every action and every refusal is a line of the audit trail: who, what, which queue,
    // and what came of it. The token is never logged, nor the password.
    let action = log
        .lines()
        .find(|l| l.contains("dashboard action"))
        .unwrap_or_else(|| panic!("no audit line in {log:?}"));
    for part in [
        "client=\"127.0.0.1:",
        "action=\"pause\"",
        "queue=\"mail\"",
        "result=\"ok\"",
    ] {
        assert!(action.contains(part), "{part} in {action}");
    }
    let refusals: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("dashboard request refused"))
        .collect();
    for (action, reason) in [
        ("resume", "X-Wq-Csrf"),
        ("purge_dead_letters", "a token is needed"),
        ("remove", "over the limit"),
    ] {
        let line = refusals
            .iter()
            .find(|l| l.contains(&format!("action=\"{action}\"")))
            .unwrap_or_else(|| panic!("no refusal of {action} in {refusals:?}"));
        for part in [
            "client=\"127.0.0.1:",
            "queue=\"mail\"",
            "result=\"refused\"",
            reason,
        ] {
            assert!(line.contains(part), "{part} in {line}");
        }
    }
    assert!(
        refusals.iter().any(|l| l.contains("reason=wrong token")),
        "{refusals:?}"
    );
    assert!(!log.contains("pw-s3cret"), "{log}");
    assert!(!log.contains(&token), "{log}");
}

#[test]
fn behind_a_proxy_the_public_address_is_printed_with_the_token() {
    let dashboard = Dashboard::start(
        &[
            "--addr",
            "127.0.0.1:0",
            "--redis",
            "redis://127.0.0.1:1/",
            "--public-url",
            "https://ops.example.com/wq",
        ],
        &[],
    );
    assert!(
        dashboard
            .line
            .contains("https://ops.example.com/wq/?token="),
        "{}",
        dashboard.line
    );
    assert!(dashboard.token.is_some());
    dashboard.stop();
}

/// A non-loopback `--addr` is served behind a proxy that ends TLS (`--public-url
/// https://...`) or, when told so, in clear (`--insecure-http`), and the start says which.
#[test]
fn a_network_address_is_served_behind_an_https_proxy_or_in_clear_when_told() {
    let mut behind = Dashboard::start(
        &[
            "--addr",
            "0.0.0.0:0",
            "--redis",
            "redis://127.0.0.1:1/",
            "--public-url",
            "https://ops.example.com/wq/",
        ],
        &[],
    );
    assert!(
        behind.line.contains("https://ops.example.com/wq/?token="),
        "{}",
        behind.line
    );
    let listening = behind.next_line();
    assert!(
        listening.contains("listening on http://0.0.0.0:")
            && listening.contains("behind the proxy")
            && listening.contains("plain HTTP from the proxy"),
        "{listening}"
    );
    let port = listening
        .split("0.0.0.0:")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no port in {listening:?}"));
    let addr = format!("127.0.0.1:{port}");
    // Served, to whoever has the token (Redis is not there: 503).
    assert!(http_get(&addr, "/api/queues", "").starts_with("HTTP/1.1 401"));
    let reply = http_get(&addr, "/api/queues", &behind.bearer());
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    let log = behind.stop();
    assert!(!log.contains("WARNING"), "{log}");

    let clear = Dashboard::start(
        &[
            "--addr",
            "0.0.0.0:0",
            "--redis",
            "redis://127.0.0.1:1/",
            "--insecure-http",
        ],
        &[],
    );
    assert!(
        clear.line.starts_with("wq dashboard: http://0.0.0.0:") && clear.token.is_some(),
        "{}",
        clear.line
    );
    let reply = http_get(&clear.addr, "/api/queues", &clear.bearer());
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    let log = clear.stop();
    assert_holds(
        &log,
        &[
            "WARNING: --insecure-http",
            "plain HTTP",
            "in clear",
            "--tls-cert",
        ],
    );
}

#[test]
fn no_auth_says_loudly_what_it_trusts() {
    let dashboard = Dashboard::start(
        &[
            "--addr",
            "127.0.0.1:0",
            "--no-auth",
            "--redis",
            "redis://127.0.0.1:1/",
        ],
        &[],
    );
    assert!(dashboard.token.is_none(), "{}", dashboard.line);
    let reply = http_get(&dashboard.addr, "/api/queues", "");
    assert!(!reply.starts_with("HTTP/1.1 401"), "{reply}");
    let log = dashboard.stop();
    for part in [
        "WARNING",
        "--no-auth",
        "every user of this machine",
        "reverse proxy",
        "127.0.0.1",
    ] {
        assert!(log.contains(part), "{part} in {log}");
    }
}

/// The refusal of `action` in an audit trail.
fn refusal_of<'a>(log: &'a str, action: &str) -> &'a str {
    log.lines()
        .find(|l| {
            l.contains("dashboard request refused") && l.contains(&format!("action=\"{action}\""))
        })
        .unwrap_or_else(|| panic!("no refusal of {action} in {log}"))
}

/// `--read-only` refuses every action, and each refusal is a line of the audit trail naming
/// who asked, the action, the queue and the item its body named, and is counted; so is a
/// refusal for want of a token.
#[test]
fn read_only_refusals_name_their_item_in_the_audit_trail_and_are_counted() {
    let dashboard = without_redis(&["--read-only"]);
    assert!(dashboard.line.contains("(read-only)"), "{}", dashboard.line);
    let addr = dashboard.addr.clone();
    let body = r#"{"item":"\"default/web-0\""}"#;
    let with_body = |extra: &str| {
        http(
            &addr,
            &format!(
                "POST /api/queues/mail/items/remove HTTP/1.1\r\nHost: {addr}\r\n\
                 Origin: http://{addr}\r\nX-Wq-Csrf: 1\r\n{extra}Content-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
        )
    };
    let refused = with_body(&dashboard.bearer());
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(refused.contains("read-only"), "{refused}");
    let unknown = with_body("");
    assert!(unknown.starts_with("HTTP/1.1 401"), "{unknown}");
    let purge = http_post(
        &addr,
        "/api/queues/mail/dead-letters/purge",
        &dashboard.bearer(),
    );
    assert!(purge.starts_with("HTTP/1.1 403"), "{purge}");
    assert_holds(
        &http_get(&addr, "/metrics", &dashboard.bearer()),
        &[
            "workqueue_dashboard_refusals_total{reason=\"read_only\"} 2",
            "workqueue_dashboard_refusals_total{reason=\"unauthorized\"} 1",
            "workqueue_dashboard_actions_total{action=\"remove\",result=\"refused\"} 2",
            "workqueue_dashboard_actions_total{action=\"purge_dead_letters\",result=\"refused\"} 1",
        ],
    );
    let log = dashboard.stop();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("dashboard request refused") && l.contains("action=\"remove\""))
        .collect();
    assert_eq!(lines.len(), 2, "{log}");
    for (line, status, reason) in [
        (lines[0], "403", "the dashboard is read-only"),
        (lines[1], "401", "a token is needed"),
    ] {
        assert_holds(
            line,
            &[
                "client=\"127.0.0.1:",
                "queue=\"mail\"",
                r#"item="\"default/web-0\"""#,
                "result=\"refused\"",
                &format!("status={status}"),
                reason,
            ],
        );
    }
    assert_holds(
        refusal_of(&log, "purge_dead_letters"),
        &["queue=\"mail\"", "item=\"\"", "read-only", "status=403"],
    );
}

/// Actions that fail on the server (Redis killed under the dashboard) are answered with the
/// server's error, each is a line of the audit trail with `result="error"` (who, what, which
/// queue, no URL or password) and is counted; a body that is not JSON is refused (400),
/// logged naming its action and queue, and counted.
#[test]
fn failed_actions_and_bad_bodies_are_in_the_audit_trail_and_counted() {
    let Some(mut server) = redis("pw-d0wn") else {
        return;
    };
    let url = format!("redis://:pw-d0wn@127.0.0.1:{}/", server.port());
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let q: workq_redis::RedisQueue<u32> = workq_redis::RedisQueue::builder("mail")
            .url(url.clone())
            .check_persistence(false)
            .build()
            .await
            .unwrap();
        q.add(1).await.unwrap();
    });
    let dashboard = Dashboard::start(&["--addr", "127.0.0.1:0"], &[("WQ_REDIS_URL", &url)]);
    let addr = dashboard.addr.clone();
    let listed = http_get(&addr, "/api/queues", &dashboard.bearer());
    assert!(listed.contains("\"name\":\"mail\""), "{listed}");

    let body = "{not json";
    let garbled = http(
        &addr,
        &format!(
            "POST /api/queues/mail/items/remove HTTP/1.1\r\nHost: {addr}\r\nX-Wq-Csrf: 1\r\n{}\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            dashboard.bearer(),
            body.len()
        ),
    );
    assert!(garbled.starts_with("HTTP/1.1 400"), "{garbled}");
    // A source the dashboard does not have: an error, logged as counted.
    let elsewhere = http_post(
        &addr,
        "/api/queues/mail/resume?source=nope",
        &dashboard.bearer(),
    );
    assert!(elsewhere.starts_with("HTTP/1.1 404"), "{elsewhere}");

    server.kill();
    for path in [
        "/api/queues/mail/pause",
        "/api/queues/mail/dead-letters/purge",
    ] {
        let reply = http_post(&addr, path, &dashboard.bearer());
        assert!(
            reply.starts_with("HTTP/1.1 502") || reply.starts_with("HTTP/1.1 503"),
            "{path}: {reply}"
        );
        assert!(reply.contains("\"error\""), "{path}: {reply}");
        assert!(
            !reply.contains("pw-d0wn") && !reply.contains("redis://"),
            "{reply}"
        );
    }
    assert_holds(
        &http_get(&addr, "/metrics", &dashboard.bearer()),
        &[
            "workqueue_dashboard_actions_total{action=\"pause\",result=\"error\"} 1",
            "workqueue_dashboard_actions_total{action=\"resume\",result=\"error\"} 1",
            "workqueue_dashboard_actions_total{action=\"purge_dead_letters\",result=\"error\"} 1",
            "workqueue_dashboard_actions_total{action=\"remove\",result=\"refused\"} 1",
            "workqueue_dashboard_refusals_total{reason=\"bad_body\"} 1",
        ],
    );
    let log = dashboard.stop();
    for (action, why) in [
        ("pause", "error="),
        ("purge_dead_letters", "error="),
        ("resume", "status=404"),
    ] {
        let line = log
            .lines()
            .find(|l| l.contains("dashboard action") && l.contains(&format!("action=\"{action}\"")))
            .unwrap_or_else(|| panic!("no audit line of {action} in {log}"));
        assert_holds(
            line,
            &[
                "client=\"127.0.0.1:",
                "queue=\"mail\"",
                "result=\"error\"",
                why,
            ],
        );
        assert!(!line.contains("redis://"), "{line}");
    }
    assert_holds(
        refusal_of(&log, "remove"),
        &[
            "client=\"127.0.0.1:",
            "queue=\"mail\"",
            "result=\"refused\"",
            "status=400",
            "body:",
        ],
    );
    assert!(!log.contains("pw-d0wn"), "{log}");
}

/// A request whose body does not come within `--request-timeout` is answered 408, and the
/// refusal is logged with the action and queue it asked for, and counted.
#[test]
fn a_request_over_the_time_limit_is_logged_and_counted() {
    let dashboard = without_redis(&["--request-timeout", "1"]);
    let addr = dashboard.addr.clone();
    let started = Instant::now();
    let reply = http(
        &addr,
        &format!(
            "POST /api/queues/mail/dead-letters/purge HTTP/1.1\r\nHost: {addr}\r\n\
             X-Wq-Csrf: 1\r\n{}Content-Length: 100\r\nConnection: close\r\n\r\n{{",
            dashboard.bearer()
        ),
    );
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_holds(
        &http_get(&addr, "/metrics", &dashboard.bearer()),
        &[
            "workqueue_dashboard_refusals_total{reason=\"timeout\"} 1",
            "workqueue_dashboard_actions_total{action=\"purge_dead_letters\",result=\"refused\"} 1",
        ],
    );
    let log = dashboard.stop();
    assert_holds(
        refusal_of(&log, "purge_dead_letters"),
        &[
            "client=\"127.0.0.1:",
            "queue=\"mail\"",
            "result=\"refused\"",
            "status=408",
            "took over 1 s",
        ],
    );
}

/// The issue's request through nginx's defaults on the same host: the dashboard sees it come
/// from 127.0.0.1 naming a loopback `Host`, which once sufficed; now the token is wanted.
#[test]
fn behind_a_proxy_on_this_machine_the_token_is_still_wanted() {
    let Some(binary) = nginx::nginx_binary() else {
        return;
    };
    let Some(server) = redis("pw-pr0xy") else {
        return;
    };
    let url = format!("redis://:pw-pr0xy@127.0.0.1:{}/", server.port());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dead = |runtime: &tokio::runtime::Runtime| {
        runtime.block_on(async {
            let q: workq_redis::RedisQueue<u32> = workq_redis::RedisQueue::builder("orders")
                .url(url.clone())
                .check_persistence(false)
                .build()
                .await
                .unwrap();
            q.stats(10).await.unwrap().summary.dead
        })
    };
    runtime.block_on(async {
        let text: workq_redis::RedisQueue<String> = workq_redis::RedisQueue::builder("orders")
            .url(url.clone())
            .check_persistence(false)
            .build()
            .await
            .unwrap();
        text.add("bad".to_owned()).await.unwrap();
        let q: workq_redis::RedisQueue<u32> = workq_redis::RedisQueue::builder("orders")
            .url(url.clone())
            .check_persistence(false)
            .build()
            .await
            .unwrap();
        assert!(q.try_get().await.unwrap().is_empty());
    });
    assert_eq!(dead(&runtime), 1);
    let dashboard = Dashboard::start(&["--addr", "127.0.0.1:0"], &[("WQ_REDIS_URL", &url)]);
    let port = workq_conformance::servers::free_port();
    let _nginx = nginx::start(&binary, port, &[("/", dashboard.addr.parse().unwrap())]);
    let proxy = format!("127.0.0.1:{port}");
    let purge = http(
        &proxy,
        "POST /api/queues/orders/dead-letters/purge HTTP/1.1\r\nHost: localhost\r\n\
         X-Wq-Csrf: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert!(purge.starts_with("HTTP/1.1 401"), "{purge}");
    assert_eq!(dead(&runtime), 1, "nothing was purged");
    let read = http_get(&proxy, "/api/queues/orders/items?state=dead", "");
    assert!(
        read.starts_with("HTTP/1.1 401") && !read.contains("bad"),
        "{read}"
    );
    let with_token = http_get(&proxy, "/api/queues", &dashboard.bearer());
    assert!(with_token.starts_with("HTTP/1.1 200"), "{with_token}");
    let log = dashboard.stop();
    assert!(log.contains("dashboard request refused"), "{log}");
}

#[test]
fn no_password_of_a_redis_url_is_printed_whatever_its_form() {
    let dashboard = Dashboard::start(
        &[
            "--addr",
            "127.0.0.1:0",
            "--redis",
            "redis+unix:///nonexistent/wq.sock?db=0&pass=hunter2-s3cret",
        ],
        &[],
    );
    assert!(!dashboard.line.contains("hunter2"), "{}", dashboard.line);
    assert!(dashboard.line.contains("pass=***"), "{}", dashboard.line);
    let reply = http_get(&dashboard.addr, "/api/queues", &dashboard.bearer());
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(!reply.contains("hunter2"), "{reply}");
    let log = dashboard.stop();
    assert!(!log.contains("hunter2"), "{log}");
}

/// The descriptors a process holds open.
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[test]
fn a_flood_of_sockets_holds_no_descriptors_and_keeps_no_one_out() {
    let dashboard = Dashboard::start(
        &[
            "--addr",
            "127.0.0.1:0",
            "--redis",
            "redis://127.0.0.1:1/",
            "--max-connections-per-client",
            "16",
            "--header-read-timeout",
            "1",
        ],
        &[],
    );
    let pid = dashboard.pid();
    let before = open_files(pid);
    let addr: std::net::SocketAddr = dashboard.addr.parse().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // 2,000 sockets from 127.0.0.2 that never send a byte.
    let flood = runtime.block_on(async {
        let mut flood = Vec::new();
        for _ in 0..2_000 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            flood.push(socket.connect(addr).await.expect("connect"));
        }
        flood
    });
    // Connections from 127.0.0.2 past the 16th are closed as they come.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut held = open_files(pid);
    while held > before + 16 + 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        held = open_files(pid);
    }
    assert!(
        held <= before + 16 + 4,
        "{held} open, {before} before the flood"
    );
    // An operator from 127.0.0.1 is answered.
    let reply = http_get(&dashboard.addr, "/api/queues", &dashboard.bearer());
    assert!(
        reply.starts_with("HTTP/1.1 503") || reply.starts_with("HTTP/1.1 200"),
        "{reply}"
    );
    // The 16 it kept are closed when their headers do not come.
    let deadline = Instant::now() + Duration::from_secs(20);
    while open_files(pid) > before + 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(open_files(pid) <= before + 2, "{} open", open_files(pid));
    drop(flood);
    let log = dashboard.stop();
    assert!(log.contains("connections over the cap"), "{log}");
}

#[test]
fn https_with_a_certificate_and_its_key_on_any_address() {
    let dir = std::env::temp_dir().join(format!("wq-dashboard-cli-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    let dashboard = Dashboard::start(
        &[
            "--addr",
            "0.0.0.0:0",
            "--redis",
            "redis://127.0.0.1:1/",
            "--tls-cert",
            &cert_path.display().to_string(),
            "--tls-key",
            &key_path.display().to_string(),
        ],
        &[],
    );
    assert!(
        dashboard.line.contains("https://0.0.0.0:"),
        "{}",
        dashboard.line
    );
    let addr: std::net::SocketAddr = dashboard.addr.parse().unwrap();
    let bearer = dashboard.bearer();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let reply = runtime.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.cert.der().clone()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = connector.connect(name, tcp).await.expect("a TLS handshake");
        tls.write_all(
            format!(
                "GET /api/queues HTTP/1.1\r\nHost: localhost\r\n{bearer}Connection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let mut reply = Vec::new();
        let _ = tls.read_to_end(&mut reply).await;
        String::from_utf8_lossy(&reply).into_owned()
    });
    // Redis is not there: the dashboard answers that it is down, over HTTPS.
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    let plain = http_get(&dashboard.addr, "/api/queues", &bearer);
    assert!(!plain.contains("HTTP/1.1 503"), "{plain}");
    dashboard.stop();
    let _ = std::fs::remove_dir_all(&dir);
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
        let r: workq_redis::RedisQueue<u32> = workq_redis::RedisQueue::builder("mail")
            .url(redis_url.clone())
            .check_persistence(false)
            .build()
            .await
            .unwrap();
        r.add(1).await.unwrap();
        let p: workq_postgres::PgQueue<u32> = workq_postgres::PgQueue::builder("billing")
            .url(pg_url.clone())
            .listen(false)
            .build()
            .await
            .unwrap();
        for i in 0..3 {
            p.add(i).await.unwrap();
        }
    });
    let dashboard = Dashboard::start(
        &["--addr", "127.0.0.1:0", "--redis", &redis_url, "--postgres"],
        &[("WQ_POSTGRES_URL", &pg_url)],
    );
    let line = dashboard.line.clone();
    for secret in ["pw-r3dis", "pw-p0stgres"] {
        assert!(!line.contains(secret), "{line}");
    }
    assert!(
        line.contains("the queues in PostgreSQL at postgres://***@127.0.0.1:"),
        "{line}"
    );
    let addr = dashboard.addr.clone();
    let bearer = dashboard.bearer();
    let reply = http_get(&addr, "/api/queues", &bearer);
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
    let metrics = http_get(&addr, "/metrics", &bearer);
    assert!(
        metrics.contains("workqueue_depth{name=\"billing\",source=\"postgres\"} 3"),
        "{metrics}"
    );
    let reply = http_post(&addr, "/api/queues/billing/pause", &bearer);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"message\":\"paused\""), "{reply}");
    let log = dashboard.stop();
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
