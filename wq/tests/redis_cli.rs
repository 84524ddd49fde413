//! `wq redis` as an operator uses it, on a `redis-server` with a password that this test starts
//! on a free loopback port: the URL comes from `WQ_REDIS_URL`, and the password shows up
//! nowhere in the output.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const PASSWORD: &str = "Op3rator-Secret";

#[path = "../../workqueue-redis/tests/support/server.rs"]
mod server;

/// A `redis-server` with a password and an AOF, from workqueue-redis's test support: a
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

    let stats = stdout(&wq(&url, &["redis", "stats", "jobs"]));
    assert!(stats.contains("queue          jobs"), "{stats}");
    assert!(stats.contains("shut down      no"), "{stats}");

    stdout(&wq(&url, &["redis", "shutdown", "jobs"]));
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
    let purged = stdout(&wq(&url, &["redis", "dead-letters", "purge", "jobs"]));
    assert!(purged.contains("0 dead letters purged"), "{purged}");
    let requeued = stdout(&wq(&url, &["redis", "dead-letters", "requeue-all", "jobs"]));
    assert!(requeued.contains("0 dead letters requeued"), "{requeued}");

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
/// and a `--workers-only` one (started through the deprecated `wq redis demo`, which still
/// works) share it, retries and give-ups happen, and both checks (never two workers at once;
/// every last event reconciled after it arrived) hold.
#[test]
fn the_redis_demo_runs_workers_in_two_processes_and_its_checks_hold() {
    let Some(server) = server() else {
        return;
    };
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/", server.port());
    let helper = Command::new(env!("CARGO_BIN_EXE_wq"))
        .args(["redis", "demo", "--queue", "cli-demo", "--workers-only"])
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
}

/// `wq bench --redis` reports in `wq bench`'s `--json` schema (one object per line and figure,
/// `impl` `workqueue-redis`, and `workqueue-redis-batch` for W1's batched consumer), and the deprecated `wq redis bench` still runs it, saying so.
#[test]
fn the_bench_on_redis_speaks_the_bench_json_schema() {
    let Some(server) = server() else { return };
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/", server.port());
    let check = |text: &str| {
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect();
        let w1 = lines
            .iter()
            .find(|v| v["workload"] == "W1" && v["metric"] == "items_per_s")
            .unwrap_or_else(|| panic!("no W1 items_per_s in {text}"));
        assert_eq!(w1["impl"], "workqueue-redis", "{text}");
        assert!(w1["value"].as_f64().is_some_and(|v| v > 0.0), "{text}");
        assert_eq!(w1["runs"], 1, "{text}");
        assert!(
            lines
                .iter()
                .all(|v| v["impl"] == "workqueue-redis" || v["impl"] == "workqueue-redis-batch"),
            "--no-bullmq measures no BullMQ: {text}"
        );
        assert!(
            lines
                .iter()
                .any(|v| v["impl"] == "workqueue-redis-batch" && v["workload"] == "W1"),
            "W1 with a batched consumer: {text}"
        );
    };
    let args = ["--quick", "--no-bullmq", "-w", "W1", "--json"];
    let out = wq(&url, &[&["bench", "--redis"][..], &args].concat());
    check(&stdout(&out));
    let out = wq(&url, &[&["redis", "bench"][..], &args].concat());
    check(&stdout(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("deprecated"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A workload that has no Redis version is refused.
    let out = wq(&url, &["bench", "--redis", "--quick", "-w", "W2"]);
    assert!(!out.status.success());
}

/// `wq bench --redis -w W7`: the fleet workload on worker processes, its `--json` lines with
/// the shape (`processes`, `workers`, `handler_ms`) beside BENCH.md's keys; `--plot DIR` runs
/// the scaling sweep W7S and writes its SVG; `--plot` without a server is refused.
#[test]
fn the_fleet_bench_on_redis_reports_each_shape_and_plots_the_sweep() {
    let Some(server) = server() else { return };
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/", server.port());
    let lines = |out: &std::process::Output| -> Vec<serde_json::Value> {
        stdout(out)
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect()
    };
    let out = wq(
        &url,
        &[
            "bench",
            "--redis",
            "--quick",
            "--no-bullmq",
            "-w",
            "W7",
            "--processes",
            "2",
            "--workers",
            "4",
            "--handler-ms",
            "0",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let w7 = lines(&out);
    for metric in [
        "items_per_s",
        "pickup_p50_ms",
        "pickup_p99_ms",
        "pickup_max_ms",
    ] {
        let line = w7
            .iter()
            .find(|v| v["metric"] == metric)
            .unwrap_or_else(|| panic!("no {metric} in {w7:?}"));
        assert_eq!(line["workload"], "W7");
        assert_eq!(line["impl"], "workqueue-redis");
        let shape = ["processes", "workers", "handler_ms"].map(|key| line[key].as_u64());
        assert_eq!(shape, [Some(2), Some(4), Some(0)], "{line}");
        assert!(line["value"].as_f64().is_some_and(|v| v >= 0.0), "{line}");
    }
    assert!(
        w7.iter()
            .any(|v| v["metric"] == "items_per_s" && v["value"].as_f64() > Some(0.0))
    );

    let dir = std::env::temp_dir().join(format!("wq-plot-{}", std::process::id()));
    let out = wq(
        &url,
        &[
            "bench",
            "--redis",
            "--quick",
            "--no-bullmq",
            "-w",
            "W7S",
            "--workers",
            "1,4",
            "--handler-ms",
            "0",
            "--plot",
            dir.to_str().expect("a UTF-8 path"),
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sweep = lines(&out);
    let workers: Vec<Option<u64>> = sweep
        .iter()
        .filter(|v| v["workload"] == "W7S" && v["metric"] == "items_per_s")
        .map(|v| v["workers"].as_u64())
        .collect();
    assert_eq!(workers, [Some(1), Some(4)], "{sweep:?}");
    let svg = std::fs::read_to_string(dir.join("w7-scaling.svg")).expect("the plot is written");
    assert!(svg.starts_with("<svg") && svg.contains("workers per process"));
    let _ = std::fs::remove_dir_all(&dir);

    let out = wq(&url, &["bench", "--quick", "-w", "W1", "--plot", "/tmp"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--plot needs"));
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
