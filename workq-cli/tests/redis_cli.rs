//! `wq redis` (the Redis alias of `wq queue`) as an operator uses it, on a `redis-server`
//! with a password that this test starts on a free loopback port: the URL comes from
//! `WQ_REDIS_URL`, and the password shows up nowhere in the output.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const PASSWORD: &str = "Op3rator-Secret";

use workq_conformance::servers::redis as server;

/// A `redis-server` with a password and an AOF, of the test's own: a
/// missing binary fails the test naming the Debian package, unless `WQ_SKIP_REDIS_TESTS=1`
/// outside CI (then `None`).
fn server() -> Option<server::RedisServer> {
    server::require_with(server::Durability::EverySec, &["--requirepass", PASSWORD])
}

fn wq(url: &str, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_wq"))
        .args(args)
        .env("WQ_REDIS_URL", url)
        .output()
        .expect("run wq");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains("Secret"), "a password in the output: {all}");
    out
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn operator_commands_take_the_url_from_the_environment_and_never_print_the_password() {
    let Some(server) = server() else { return };
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/", server.port());
    // The commands act on queues that exist: one item makes `jobs` one.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let jobs: workq_redis::RedisQueue<String> = workq_redis::RedisQueue::connect(&url, "jobs")
            .await
            .unwrap();
        jobs.add("a".to_owned()).await.unwrap();
    });

    let stats = stdout(&wq(&url, &["redis", "stats", "jobs"]));
    assert!(stats.contains("queue          jobs"), "{stats}");
    assert!(stats.contains("shut down      no"), "{stats}");

    stdout(&wq(&url, &["redis", "shutdown", "jobs", "--yes"]));
    let stats = stdout(&wq(&url, &["redis", "stats", "jobs"]));
    assert!(stats.contains("shut down      yes"), "{stats}");
    let resumed = stdout(&wq(&url, &["redis", "resume", "jobs"]));
    assert!(resumed.contains("resumed"), "{resumed}");
    let stats = stdout(&wq(&url, &["redis", "stats", "jobs"]));
    assert!(stats.contains("shut down      no"), "{stats}");
    let paused = stdout(&wq(&url, &["redis", "pause", "jobs"]));
    assert!(paused.contains("is paused"), "{paused}");
    let stats = stdout(&wq(&url, &["redis", "stats", "jobs"]));
    assert!(stats.contains("paused         yes"), "{stats}");
    let resumed = stdout(&wq(&url, &["redis", "resume", "jobs"]));
    assert!(resumed.contains("resumed (it was paused)"), "{resumed}");

    let listed = stdout(&wq(&url, &["redis", "dead-letters", "list", "jobs"]));
    assert_eq!(listed, "");
    let purged = stdout(&wq(
        &url,
        &["redis", "dead-letters", "purge", "jobs", "--yes"],
    ));
    assert!(purged.contains("0 dead letters purged"), "{purged}");
    let requeued = stdout(&wq(
        &url,
        &["redis", "dead-letters", "requeue-all", "jobs", "--yes"],
    ));
    assert!(requeued.contains("0 dead letters requeued"), "{requeued}");

    // A mistyped queue is refused, exit non-zero, and nothing is written: the server holds
    // the same keys, none of them the typo's.
    let keys = || {
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            let mut con = redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let mut all: Vec<String> = redis::cmd("KEYS")
                .arg("*")
                .query_async(&mut con)
                .await
                .unwrap();
            all.sort();
            all
        })
    };
    let before = keys();
    assert!(!before.is_empty());
    for args in [
        &["redis", "shutdown", "typo", "--yes"][..],
        &["redis", "shutdown", "typo"],
    ] {
        let out = wq(&url, args);
        assert!(!out.status.success(), "{args:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("no queue named typo"), "{args:?}: {said}");
    }
    let after = keys();
    assert_eq!(after, before, "keys written for the typo");
    assert!(!after.iter().any(|k| k.contains("typo")), "{after:?}");

    // A wrong password fails without showing it.
    let wrong = format!("redis://:Wrong-Secret@127.0.0.1:{}/", server.port());
    let out = wq(&wrong, &["redis", "stats", "jobs"]);
    assert!(!out.status.success());
    // A queue name the library refuses.
    let out = wq(&url, &["redis", "stats", "bad name"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("white space"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `wq demo --redis` runs the library's `Workers` on the queue on Redis: a producing process
/// and a `--workers-only` one share it, retries and give-ups happen, and both checks (never two workers at once;
/// every last event reconciled after it arrived) hold.
#[test]
fn the_redis_demo_runs_workers_in_two_processes_and_its_checks_hold() {
    let Some(server) = server() else {
        return;
    };
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/", server.port());
    let helper = Command::new(env!("CARGO_BIN_EXE_wq"))
        .args(["demo", "--redis", "--queue", "cli-demo", "--workers-only"])
        .args(["--workers", "3"])
        .env("WQ_REDIS_URL", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run wq");
    let out = wq(
        &url,
        &[
            "demo",
            // `--redis` alone: the URL comes from WQ_REDIS_URL.
            "--redis",
            "--queue",
            "cli-demo",
            "--events",
            "600",
            "--objects",
            "50",
            // Long enough that the workers-only process is up before the end (it waits
            // for a queue that is not shut down, so it must join before the fleet stop).
            "--duration",
            "2",
            "--failure-rate",
            "0.3",
            "--max-retries",
            "1",
        ],
    );
    let text = stdout(&out);
    assert!(text.contains("never two workers at once: ok"), "{text}");
    assert!(
        text.contains("every last event reconciled after it arrived: ok"),
        "{text}"
    );
    // With 30 % failures and one retry, some items fail twice and are given up.
    let given_up: u64 = text
        .lines()
        .find_map(|line| line.split("(given up: ").nth(1))
        .and_then(|rest| rest.trim_end_matches(')').parse().ok())
        .expect("a given-up count");
    assert!(given_up > 0, "{text}");
    // The fleet shutdown at the end stops the workers-only process too.
    let mut helper = helper;
    let deadline = Instant::now() + Duration::from_secs(30);
    while helper.try_wait().expect("poll wq").is_none() {
        if Instant::now() > deadline {
            let _ = helper.kill();
            panic!("the workers-only process did not end after the fleet shutdown");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let helper = helper
        .wait_with_output()
        .expect("the workers-only process ends");
    let helper_text = String::from_utf8_lossy(&helper.stdout);
    assert!(helper.status.success(), "{helper_text}");
    assert!(
        helper_text.contains("never two workers at once: ok"),
        "{helper_text}"
    );

    // The server is left as the demo found it: no key at all (so no bookkeeping, and no
    // queue shut down for ever, listed by every dashboard).
    let keys: u64 = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut con = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("DBSIZE").query_async(&mut con).await.unwrap()
    });
    assert_eq!(keys, 0, "keys left on the server");
    let listed = stdout(&wq(&url, &["redis", "list"]));
    assert!(!listed.contains("cli-demo"), "{listed}");
}

/// A `redis-server` started by the command `wq demo` prints, shut down (without saving) when
/// dropped.
struct Started(u16);

impl Drop for Started {
    fn drop(&mut self) {
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.0)) {
            use std::io::Write;
            let _ = stream.write_all(b"SHUTDOWN NOSAVE\r\n");
            let _ = std::io::Read::read(&mut stream, &mut [0; 64]);
        }
    }
}

/// With no server at the URL, `wq demo --redis` prints the one command that starts one; that
/// command, run as printed, starts a server (in the background, keeping nothing on disk) that
/// the demo then runs on with its checks holding.
#[test]
fn the_command_the_demo_prints_without_a_server_starts_one_it_runs_on() {
    if !server::require_binary() {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("redis://127.0.0.1:{port}/");
    let out = Command::new(env!("CARGO_BIN_EXE_wq"))
        .args(["demo", "--redis", &url])
        .output()
        .expect("run wq");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let command = stderr
        .lines()
        .find_map(|line| line.strip_prefix("    "))
        .unwrap_or_else(|| panic!("no command in: {stderr}"));
    assert!(
        command.starts_with("redis-server "),
        "the binary is installed, so no apt-get: {command}"
    );

    // Run where a server that did save would leave its files.
    let dir = std::env::temp_dir().join(format!("wq-demo-redis-start-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let status = Command::new("sh")
        .args(["-c", command])
        .current_dir(&dir)
        .status()
        .expect("run sh");
    let _started = Started(port);
    assert!(status.success(), "{command}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "no server on {port} after: {command}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_wq"))
        .args([
            "demo",
            "--redis",
            &url,
            "--events",
            "300",
            "--objects",
            "30",
        ])
        .args(["--duration", "1", "--no-progress"])
        .output()
        .expect("run wq");
    let text = stdout(&out);
    assert!(text.contains("never two workers at once: ok"), "{text}");
    assert!(
        text.contains("every last event reconciled after it arrived: ok"),
        "{text}"
    );
    drop(_started);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .expect("read the directory")
        .collect();
    assert!(left.is_empty(), "the server left files: {left:?}");
    let _ = std::fs::remove_dir(&dir);
}
