//! `wq-bench --profile` on servers of the test's own (`workq-conformance`'s): W7's flood
//! reports what the server did per item beside items/s, in the `--json` schema, with
//! figures that follow from the workload (every item inserted and deleted once on
//! PostgreSQL; some commands per item and some CPU on Redis).

use std::process::{Command, Output};

use serde_json::Value;
use workq_conformance::servers::{postgres, redis};

/// One W7 shape, our queue only, profiled, as JSON lines.
fn bench(flag: &str, var: &str, url: &str, skip: &str) -> (Vec<Value>, String) {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_wq-bench"))
        .args([
            flag,
            skip,
            "--quick",
            "-w",
            "W7",
            "--processes",
            "1",
            "--handler-ms",
            "0",
            "--profile",
            "--json",
        ])
        .env(var, url)
        .output()
        .expect("run wq-bench");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    (lines, stderr)
}

/// The value of `metric` for `imp` at W7's one shape.
fn value(lines: &[Value], imp: &str, metric: &str) -> f64 {
    let line = lines
        .iter()
        .find(|v| v["impl"] == imp && v["metric"] == metric)
        .unwrap_or_else(|| panic!("no {imp} {metric} in {lines:?}"));
    assert_eq!(line["workload"], "W7");
    assert_eq!(line["processes"], 1);
    line["value"].as_f64().expect("a number")
}

#[test]
fn on_redis_the_profile_counts_commands_cpu_and_bytes_per_item() {
    let Some(server) = redis::require() else {
        return;
    };
    let (lines, _) = bench("--redis", "WQ_REDIS_URL", &server.url(), "--no-bullmq");
    let ours = "workq-redis";
    assert!(value(&lines, ours, "items_per_s") > 0.0);
    // An item is added, taken and completed: at least a command or two each, all told.
    assert!(value(&lines, ours, "commands_per_item") >= 1.0, "{lines:?}");
    assert!(value(&lines, ours, "net_bytes_per_item") > 8.0, "{lines:?}");
    assert!(value(&lines, ours, "server_cpu_ms_per_1k_items") > 0.0);
    value(&lines, ours, "script_calls_per_item");
    let top: Vec<&Value> = lines
        .iter()
        .filter(|v| {
            v["metric"]
                .as_str()
                .is_some_and(|m| m.starts_with("cmd_") && m.ends_with("_per_item"))
        })
        .collect();
    assert_eq!(top.len(), 3, "the three most-called commands: {lines:?}");
    assert!(
        top.iter().all(|v| v["metric"] != "cmd_info_per_item"),
        "the profile's own INFO is left out: {top:?}"
    );
}

#[test]
fn on_postgres_the_profile_counts_transactions_wal_rows_and_cpu_per_item() {
    let Some(server) = postgres::PgServer::start() else {
        return;
    };
    let (lines, stderr) = bench(
        "--postgres",
        "WQ_POSTGRES_URL",
        &server.url(),
        "--no-pgboss",
    );
    let ours = "workq-postgres";
    // 10,000 items, each inserted once and deleted once when done: the counts of every
    // connection reach the statistics, the producer's and the worker process's.
    let inserted = value(&lines, ours, "rows_inserted_per_item");
    assert!((1.0..1.05).contains(&inserted), "{inserted}: {lines:?}");
    assert!(value(&lines, ours, "xacts_per_item") > 0.0);
    // Every insert writes WAL: a row and an index entry at least.
    assert!(
        value(&lines, ours, "wal_bytes_per_item") > 50.0,
        "{lines:?}"
    );
    // The test's server runs on this machine: its CPU is read from /proc.
    assert!(value(&lines, ours, "server_cpu_ms_per_1k_items") > 0.0);
    // Without pg_stat_statements, no statements figure, and a note says why.
    assert!(lines.iter().all(|v| v["metric"] != "statements_per_item"));
    assert!(stderr.contains("pg_stat_statements"), "{stderr}");
}
