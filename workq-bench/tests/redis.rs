//! `wq-bench --redis` on a `redis-server` with a password that this test starts on a free
//! loopback port: the URL comes from `WQ_REDIS_URL`, the figures come in the `--json` schema,
//! and the password shows up nowhere in the output.

use std::process::{Command, Output};

const PASSWORD: &str = "B3nch-Secret";

use workq_conformance::servers::redis as server;

/// A `redis-server` with a password and an AOF, of the test's own: a
/// missing binary fails the test naming the Debian package, unless `WQ_SKIP_REDIS_TESTS=1`
/// outside CI (then `None`).
fn server() -> Option<server::RedisServer> {
    server::require_with(server::Durability::EverySec, &["--requirepass", PASSWORD])
}

fn bench(url: &str, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_wq-bench"))
        .args(args)
        .env("WQ_REDIS_URL", url)
        .output()
        .expect("run wq-bench");
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

/// `wq-bench --redis` reports in the `--json` schema (one object per line and figure, `impl`
/// `workq-redis`, and `workq-redis-batch` for W1's batched consumer).
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
        assert_eq!(w1["impl"], "workq-redis", "{text}");
        assert!(w1["value"].as_f64().is_some_and(|v| v > 0.0), "{text}");
        assert_eq!(w1["runs"], 1, "{text}");
        assert!(
            lines
                .iter()
                .all(|v| v["impl"] == "workq-redis" || v["impl"] == "workq-redis-batch"),
            "--no-bullmq measures no BullMQ: {text}"
        );
        assert!(
            lines
                .iter()
                .any(|v| v["impl"] == "workq-redis-batch" && v["workload"] == "W1"),
            "W1 with a batched consumer: {text}"
        );
    };
    let args = ["--quick", "--no-bullmq", "-w", "W1", "--json"];
    let out = bench(&url, &[&["--redis"][..], &args].concat());
    check(&stdout(&out));
    // A workload that has no Redis version is refused.
    let out = bench(&url, &["--redis", "--quick", "-w", "W2"]);
    assert!(!out.status.success());
}

/// `wq-bench --redis -w W7`: the fleet workload on worker processes, its `--json` lines with the
/// shape (`processes`, `workers`, `handler_ms`) beside docs/bench-workloads.md's keys; `--plot DIR`
/// runs the scaling sweep W7S and writes its SVG; `--plot` without a server is refused.
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
    let out = bench(
        &url,
        &[
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
        assert_eq!(line["impl"], "workq-redis");
        let shape = ["processes", "workers", "handler_ms"].map(|key| line[key].as_u64());
        assert_eq!(shape, [Some(2), Some(4), Some(0)], "{line}");
        assert!(line["value"].as_f64().is_some_and(|v| v >= 0.0), "{line}");
    }
    assert!(
        w7.iter()
            .any(|v| v["metric"] == "items_per_s" && v["value"].as_f64() > Some(0.0))
    );

    let dir = std::env::temp_dir().join(format!("wq-plot-{}", std::process::id()));
    let out = bench(
        &url,
        &[
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

    let out = bench(&url, &["--quick", "-w", "W1", "--plot", "/tmp"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--plot needs"));
}

/// `wq-bench --redis -w W8` (a small burst): the noisy neighbour on the three queues (no
/// groups, groups, groups with limits), each with its quiet pickup, throughputs and the most
/// leases the bench counted at once, the limited one within its limits (a run over them
/// fails); BullMQ skipped.
#[test]
fn the_noisy_neighbour_on_redis_reports_three_queues_within_their_limits() {
    let Some(server) = server() else { return };
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/", server.port());
    let args = [
        "--redis",
        "--quick",
        "--no-bullmq",
        "-w",
        "W8",
        "--w8-burst",
        "2000",
        "--json",
    ];
    let text = stdout(&bench(&url, &args));
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    noisy_neighbour::check(&lines, "workq-redis");
}

/// `wq-bench --redis -w W7B --plot DIR` (a quick burn-down at 4 and 64 workers, ours only):
/// one items/s per worker count in the bench JSON schema, the backlog drained and its queue
/// deleted (no key and no index entry of the bench left on the server), and the plot
/// `w7b-redis.svg` naming each worker count.
#[test]
fn the_burn_down_on_redis_drains_its_backlog_and_plots_items_per_second() {
    let Some(server) = server() else { return };
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/", server.port());
    let dir = std::env::temp_dir().join(format!("wq-burn-redis-{}", std::process::id()));
    let args = burn_down::args(["--redis", "--no-bullmq"], &dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = bench(&url, &args);
    burn_down::check(&stdout(&out), &dir, "w7b-redis.svg", "workq-redis");
    let _ = std::fs::remove_dir_all(&dir);

    let mut con = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("connect to the test's server");
    let left: Vec<String> = redis::cmd("KEYS")
        .arg("*wq-bench*")
        .query(&mut con)
        .expect("KEYS");
    assert!(left.is_empty(), "the bench left {left:?}");
    let queues: Vec<String> = redis::cmd("SMEMBERS")
        .arg("wq:queues")
        .query(&mut con)
        .expect("SMEMBERS");
    assert!(queues.is_empty(), "the bench left {queues:?} in the index");
}

#[path = "support/burn_down.rs"]
mod burn_down;
#[path = "support/noisy_neighbour.rs"]
mod noisy_neighbour;
