//! `wq-bench --postgres` on a PostgreSQL server that this test starts on a free loopback port
//! (`workq-conformance`'s test servers): the URL comes from `WQ_POSTGRES_URL` and the
//! figures come in the `--json` schema.

use std::process::{Command, Output};

use workq_conformance::servers::postgres as server;

fn bench(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wq-bench"))
        .args(args)
        .env("WQ_POSTGRES_URL", url)
        .output()
        .expect("run wq-bench")
}

/// `wq-bench --postgres` reports in the `--json` schema (one object per line and
/// figure, `impl` `workq-postgres`), and refuses a workload it has no server version of
/// and `--postgres` without a URL.
#[test]
fn the_bench_on_postgres_speaks_the_bench_json_schema() {
    // A missing PostgreSQL fails the test naming the package, unless WQ_SKIP_PG_TESTS=1
    // outside CI (then `None`).
    let Some(server) = server::PgServer::start() else {
        return;
    };
    let url = server.url();
    let out = bench(
        &url,
        &["--postgres", "--quick", "--no-pgboss", "-w", "W1", "--json"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let w1 = lines
        .iter()
        .find(|v| v["workload"] == "W1" && v["metric"] == "items_per_s")
        .unwrap_or_else(|| panic!("no W1 items_per_s in {text}"));
    assert_eq!(w1["impl"], "workq-postgres", "{text}");
    assert!(w1["value"].as_f64().is_some_and(|v| v > 0.0), "{text}");
    for key in ["min", "max"] {
        assert!(w1[key].as_f64().is_some_and(|v| v > 0.0), "{text}");
    }
    assert_eq!(w1["runs"], 1, "{text}");
    assert!(
        lines.iter().all(|v| v["impl"]
            .as_str()
            .is_some_and(|i| i.starts_with("workq-postgres"))),
        "--no-pgboss measures no pg-boss: {text}"
    );
    assert!(stderr.contains("pg-boss not measured"), "{stderr}");

    // A workload that has no version on a server is refused, saying which ones have.
    let out = bench(&url, &["--postgres", "--quick", "--no-pgboss", "-w", "W2"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("with a server: W1, W3, W3P, W4, W7, W8"),
        "{stderr}"
    );

    // `--postgres` alone without WQ_POSTGRES_URL says what it needs.
    let out = Command::new(env!("CARGO_BIN_EXE_wq-bench"))
        .args(["--postgres", "--quick", "-w", "W1"])
        .env_remove("WQ_POSTGRES_URL")
        .output()
        .expect("run wq-bench");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("WQ_POSTGRES_URL"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `wq-bench --postgres -w W8` (a small burst): the noisy neighbour on the three queues (no
/// groups, groups, groups with limits), each with its quiet pickup, throughputs and the most
/// leases the bench counted at once, the limited one within its limits (a run over them
/// fails); pg-boss skipped.
#[test]
fn the_noisy_neighbour_on_postgres_reports_three_queues_within_their_limits() {
    let Some(server) = server::PgServer::start() else {
        return;
    };
    let out = bench(
        &server.url(),
        &[
            "--postgres",
            "--quick",
            "--no-pgboss",
            "-w",
            "W8",
            "--w8-burst",
            "2000",
            "--json",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    noisy_neighbour::check(&lines, "workq-postgres");
}

/// `wq-bench --postgres -w W7B --plot DIR` (a quick burn-down at 4 and 64 workers, ours
/// only): one items/s per worker count in the bench JSON schema, the backlog drained (the
/// bench's queues are in the database, and no item of theirs), and the plot
/// `w7b-postgresql.svg` naming each worker count.
#[test]
fn the_burn_down_on_postgres_drains_its_backlog_and_plots_items_per_second() {
    let Some(server) = server::PgServer::start() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("wq-burn-postgres-{}", std::process::id()));
    let args = burn_down::args(["--postgres", "--no-pgboss"], &dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = bench(&server.url(), &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    burn_down::check(&stdout, &dir, "w7b-postgresql.svg", "workq-postgres");
    let _ = std::fs::remove_dir_all(&dir);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (queues, items): (i64, i64) = runtime.block_on(async {
        use sqlx::Connection;
        let mut con = sqlx::PgConnection::connect(&server.url())
            .await
            .expect("connect to the test's server");
        sqlx::query_as(
            "SELECT (SELECT count(*) FROM workqueue_queues WHERE name LIKE 'wq-bench-w7-%'),
                    (SELECT count(*) FROM workqueue_items i
                       JOIN workqueue_queues q ON q.id = i.queue
                      WHERE q.name LIKE 'wq-bench-w7-%')",
        )
        .fetch_one(&mut con)
        .await
        .expect("count the bench's queues and items")
    });
    assert_eq!(queues, 2, "a queue per worker count");
    assert_eq!(items, 0, "the backlog drained and deleted");
}

#[path = "support/burn_down.rs"]
mod burn_down;
#[path = "support/noisy_neighbour.rs"]
mod noisy_neighbour;
