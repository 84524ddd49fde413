//! `wq postgres ...` and `wq demo --postgres` on a PostgreSQL server that this test starts on a
//! free loopback port (`workq-conformance`'s test servers): the URL comes from
//! `WQ_POSTGRES_URL`, and the demo's checks hold across processes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use workq_conformance::servers::postgres as server;

fn wq(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wq"))
        .args(args)
        .env("WQ_POSTGRES_URL", url)
        .output()
        .expect("run wq")
}

/// A password in the URL (the test server trusts loopback, so it is not checked): it must
/// show up nowhere in `wq`'s output.
const PASSWORD: &str = "Demo-Secret";

fn url_with_password(server: &server::PgServer) -> String {
    server
        .url()
        .replace("postgres@", &format!("postgres:{PASSWORD}@"))
}

/// Runs `wq demo --postgres` (URL from `WQ_POSTGRES_URL`) with `args`; its stdout, once it
/// exited 0 without printing the password.
fn demo(url: &str, args: &[&str]) -> String {
    let out = wq(url, &[&["demo", "--postgres"][..], args].concat());
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.contains(PASSWORD) && !stderr.contains(PASSWORD),
        "a password in the output: {stdout}{stderr}"
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    stdout
}

/// A small run: 600 events for 60 objects in a second.
const SMALL: &[&str] = &["--objects", "60", "--events", "600", "--duration", "1s"];

/// Both checks of a producing process's summary hold.
fn assert_checks_hold(text: &str) {
    for check in [
        "never two workers at once: ok",
        "every last event reconciled after it arrived: ok",
    ] {
        assert!(text.contains(check), "{text}");
    }
}

/// The count at the start of the summary row `label`.
fn row(text: &str, label: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no row {label:?} in:\n{text}"))
}

/// `wq demo --postgres` runs the library's `Workers` on the queue on PostgreSQL: reconciles
/// happen, some objects fail twice and are given up, and both checks hold.
#[test]
fn the_demo_on_postgres_reconciles_and_its_checks_hold() {
    let Some(server) = server::PgServer::start() else {
        return;
    };
    let url = url_with_password(&server);
    let text = demo(
        &url,
        &[SMALL, &["--failure-rate", "0.3", "--max-retries", "1"]].concat(),
    );
    assert!(text.contains("(producers and workers)"), "{text}");
    assert_eq!(row(&text, "events added"), 600, "{text}");
    assert!(row(&text, "reconciles") > 0, "{text}");
    assert_checks_hold(&text);
    // With 30 % failures and one retry, some objects fail twice and are given up.
    let given_up = text
        .lines()
        .find_map(|line| line.split_once("(given up: "))
        .and_then(|(_, rest)| rest.trim_end_matches(')').parse::<u64>().ok());
    assert!(given_up.is_some_and(|n| n > 0), "{text}");
}

/// A `--workers-only` process shares the queue with the producing one: it starts first and
/// says when its workers run, the producer's run drains the queue across both processes and
/// shuts it down, which ends the workers-only process; both exit 0 with their checks holding,
/// and the workers-only process reconciled part of the work.
#[test]
fn the_demo_on_postgres_shares_its_queue_with_a_workers_only_process() {
    let Some(server) = server::PgServer::start() else {
        return;
    };
    let url = url_with_password(&server);
    let mut helper = Command::new(env!("CARGO_BIN_EXE_wq"))
        .args(["demo", "--postgres", "--queue", "shared", "--workers-only"])
        .args(["--workers", "4"])
        .env("WQ_POSTGRES_URL", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run wq");
    // Its workers run once it says so (or it failed, and its stderr says why).
    let mut stderr = BufReader::new(helper.stderr.take().expect("stderr"));
    let mut said = String::new();
    loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).expect("read stderr") == 0 {
            panic!("the workers-only process ended before its workers ran: {said}");
        }
        said.push_str(&line);
        if line.contains("workers on queue shared") {
            break;
        }
    }
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(helper.wait_with_output());
    });

    let text = demo(
        &url,
        &[SMALL, &["--queue", "shared", "--workers", "2"]].concat(),
    );
    assert_checks_hold(&text);

    // The fleet shutdown at the end stops the workers-only process too.
    let helper = done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the workers-only process ends after the fleet shutdown")
        .expect("wait for wq");
    let helper_text = String::from_utf8_lossy(&helper.stdout);
    assert!(helper.status.success(), "{helper_text}{said}");
    assert!(!helper_text.contains(PASSWORD), "{helper_text}");
    assert!(helper_text.contains("(workers only)"), "{helper_text}");
    assert!(
        helper_text.contains("never two workers at once: ok"),
        "{helper_text}"
    );
    assert!(row(&helper_text, "reconciles") > 0, "{helper_text}");

    // The server is left as the demo found it: no queue (shut down for ever, listed by
    // every dashboard), no bookkeeping.
    let (ok, listed, err) = pg(&url, &["list"]);
    assert!(ok, "{err}");
    assert!(!listed.contains("shared"), "{listed}");
    let left: i64 = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM wq_demo_claims) + (SELECT count(*) FROM wq_demo_done)
                  + (SELECT count(*) FROM wq_demo_given_up) + (SELECT count(*) FROM wq_demo_helpers)
                  + (SELECT count(*) FROM wq_demo_ending)",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    });
    assert_eq!(left, 0, "bookkeeping rows left");
}

/// `--redis` and `--postgres` together are refused before anything connects, and
/// `--postgres` alone needs `WQ_POSTGRES_URL`.
#[test]
fn the_demo_takes_one_server_and_postgres_alone_needs_its_variable() {
    let out = Command::new(env!("CARGO_BIN_EXE_wq"))
        .args(["demo", "--postgres", "postgres://127.0.0.1:1/x"])
        .args(["--redis", "redis://127.0.0.1:1/"])
        .output()
        .expect("run wq");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot be used with"), "{stderr}");

    let out = Command::new(env!("CARGO_BIN_EXE_wq"))
        .args(["demo", "--postgres", "--workers-only"])
        .env_remove("WQ_POSTGRES_URL")
        .output()
        .expect("run wq");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("WQ_POSTGRES_URL"), "{stderr}");
}

/// Runs `wq postgres ARGS` on `url`; its exit status and output.
fn pg(url: &str, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["postgres"];
    all.extend_from_slice(args);
    let out = wq(url, &all);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `wq queue` on PostgreSQL runs its statements under a `statement_timeout`: a listing stuck
/// behind a lock is cancelled by the server when it passes (10 s), so the command gives up
/// saying so, and leaves no statement waiting on the server, though the lock is still held
/// (giving up on the answer alone would leave the query waiting there, holding its
/// connection, until the lock went).
#[test]
fn a_statement_stuck_on_a_lock_is_cancelled_by_the_server() {
    let Some(server) = server::PgServer::start() else {
        return;
    };
    let url = url_with_password(&server);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // The pool and the transaction are dropped inside the runtime, a failing test's too.
    let _context = runtime.enter();
    let (pool, mut lock) = runtime.block_on(async {
        let q: workq_postgres::PgQueue<String> = workq_postgres::PgQueue::builder("locked")
            .url(url.clone())
            .listen(false)
            .build()
            .await
            .unwrap();
        q.add("x".to_owned()).await.unwrap();
        let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
        let mut lock = pool.begin().await.unwrap();
        sqlx::query("LOCK TABLE workqueue_queues IN ACCESS EXCLUSIVE MODE")
            .execute(&mut *lock)
            .await
            .unwrap();
        (pool, lock)
    });
    // The statements of `wq`'s connections (`application_name` wq), and how many wait for a
    // lock.
    let of_wq = |pool: &sqlx::PgPool| {
        runtime.block_on(async {
            sqlx::query_as::<_, (i64, i64)>(
                "SELECT count(*), count(*) FILTER (WHERE wait_event_type = 'Lock')
                 FROM pg_stat_activity WHERE application_name = 'wq'",
            )
            .fetch_one(pool)
            .await
            .unwrap()
        })
    };
    let started = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_wq"))
        .args(["queue", "list"])
        .env("WQ_URL", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while of_wq(&pool).1 == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(9),
            "the listing never waited for the lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("wq queue list did not give up");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let waited = started.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("the server cancelled the statement")
            && stderr.contains("statement timeout"),
        "{stderr}"
    );
    assert!(!stderr.contains(PASSWORD), "{stderr}");
    assert!(waited >= Duration::from_secs(9), "{waited:?}");
    // The lock is still held, and no statement of `wq` waits for it, or runs at all.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while of_wq(&pool).0 > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a statement of wq is left on the server: {:?}",
            of_wq(&pool)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    runtime.block_on(async {
        let held: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks
             WHERE relation = 'workqueue_queues'::regclass AND mode = 'AccessExclusiveLock'
               AND granted",
        )
        .fetch_one(&mut *lock)
        .await
        .unwrap();
        assert_eq!(held, 1, "the lock was held throughout");
        lock.rollback().await.unwrap();
    });
    let (listed, stdout, stderr) = pg(&url, &["list"]);
    assert!(listed && stdout.contains("locked"), "{stdout}{stderr}");
}

/// `wq postgres` as an operator uses it: the queues at a glance, a queue's stats, fleet shut
/// down, pause and resume, and dead letters, which stay while the queue is shut down.
#[test]
fn the_operator_commands_run_on_postgres() {
    let Some(server) = server::PgServer::start() else {
        return;
    };
    let url = server.url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let jobs: workq_postgres::PgQueue<String> = workq_postgres::PgQueue::connect(&url, "jobs")
            .await
            .unwrap();
        jobs.add_all(["a", "b"].map(String::from)).await.unwrap();
        // A number the string queue cannot read: a dead letter at the first get.
        let numbers: workq_postgres::PgQueue<u32> = workq_postgres::PgQueue::connect(&url, "jobs")
            .await
            .unwrap();
        numbers.add(7).await.unwrap();
        // a and b are handed out and given back; 7 moves to the dead letters.
        let held = jobs.try_get_many(3).await.unwrap();
        assert_eq!(held.len(), 2);
        for lease in held {
            lease.release().await.unwrap();
        }
    });

    let (ok, out, err) = pg(&url, &["queues"]);
    assert!(ok, "{err}");
    assert!(out.lines().any(|l| l.starts_with("jobs ")), "{out}");
    let (ok, out, err) = pg(&url, &["stats", "jobs"]);
    assert!(ok, "{err}");
    assert!(out.contains("queue          jobs"), "{out}");
    assert!(out.contains("depth          2"), "{out}");
    assert!(out.contains("dead letters   1"), "{out}");
    assert!(out.contains("shut down      no"), "{out}");

    // A mistyped name is an error, not a new queue.
    let (ok, _, err) = pg(&url, &["stats", "jobz"]);
    assert!(!ok && err.contains("no queue named"), "{err}");
    let (_, out, _) = pg(&url, &["queues"]);
    assert!(!out.contains("jobz"), "{out}");

    let (ok, out, err) = pg(&url, &["shutdown", "jobs", "--yes"]);
    assert!(
        ok && out.contains("shut down for every process"),
        "{out}{err}"
    );
    // Dead letters stay while the queue is shut down.
    let (ok, _, err) = pg(&url, &["dead-letters", "requeue-all", "jobs", "--yes"]);
    assert!(!ok && err.contains("shut down"), "{err}");
    let (_, out, _) = pg(&url, &["stats", "jobs"]);
    assert!(out.contains("shut down      yes"), "{out}");
    assert!(out.contains("dead letters   1"), "{out}");
    let (ok, out, _) = pg(&url, &["resume", "jobs"]);
    assert!(ok && out.contains("resumed (it was shut down)"), "{out}");

    let (ok, out, _) = pg(&url, &["pause", "jobs"]);
    assert!(ok && out.contains("is paused"), "{out}");
    let (_, out, _) = pg(&url, &["stats", "jobs"]);
    assert!(out.contains("paused         yes"), "{out}");
    let (ok, out, _) = pg(&url, &["resume", "jobs"]);
    assert!(ok && out.contains("resumed (it was paused)"), "{out}");

    let (ok, out, _) = pg(&url, &["dead-letters", "list", "jobs"]);
    assert!(ok, "{out}");
    let id = out.split_whitespace().next().expect("a letter's id");
    let (ok, out, _) = pg(&url, &["dead-letters", "requeue", "jobs", id]);
    assert!(ok && out.contains("requeued"), "{out}");
    let (ok, _, err) = pg(&url, &["dead-letters", "requeue", "jobs", id]);
    assert!(!ok && err.contains("no dead letter"), "{err}");
    let (ok, out, _) = pg(&url, &["dead-letters", "purge", "jobs", "--yes"]);
    assert!(ok && out.contains("0 dead letters purged"), "{out}");
    let (_, out, _) = pg(&url, &["stats", "jobs"]);
    assert!(out.contains("depth          3"), "{out}");
}

/// A cluster made by the command `wq demo` prints: stopped (SIGQUIT to the postmaster in its
/// `postmaster.pid`) and removed when dropped.
struct Started {
    dir: std::path::PathBuf,
}

impl Drop for Started {
    fn drop(&mut self) {
        let pid = std::fs::read_to_string(self.dir.join("postmaster.pid"))
            .ok()
            .and_then(|text| text.lines().next()?.trim().parse::<u32>().ok());
        if let Some(pid) = pid {
            let _ = Command::new("kill")
                .args(["-QUIT", &pid.to_string()])
                .status();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::path::Path::new(&format!("/proc/{pid}")).exists()
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(self.dir.with_extension("log"));
    }
}

/// With no server at the URL, `wq demo --postgres` prints the one command that makes and
/// starts a throwaway cluster on the URL's port (as the user postgres when run as root); that
/// command, run as printed, gives a server the demo then runs on with its checks holding.
#[test]
fn the_command_the_demo_prints_without_a_server_starts_one_it_runs_on() {
    // Skipped (or failed) like every PostgreSQL test when PostgreSQL is missing.
    if server::require_binaries().is_none() {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let out = Command::new(env!("CARGO_BIN_EXE_wq"))
        .args(["demo", "--postgres", &url])
        .output()
        .expect("run wq");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let command = stderr
        .lines()
        .find_map(|line| line.strip_prefix("    "))
        .unwrap_or_else(|| panic!("no command in: {stderr}"));
    assert!(
        !command.contains("apt-get"),
        "PostgreSQL is installed, so no apt-get: {command}"
    );
    let started = Started {
        dir: std::path::PathBuf::from(format!("/tmp/wq-demo-postgres-{port}")),
    };
    let _ = std::fs::remove_dir_all(&started.dir);
    let out = Command::new("sh")
        .args(["-c", command])
        .current_dir(std::env::temp_dir())
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "{command}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = demo(&url, SMALL);
    assert_checks_hold(&text);
    assert_eq!(row(&text, "events added"), 600, "{text}");
}

/// `wq postgres queues` counts each state up to 10,000 and shows a count over it as
/// "10000+": a listing of a huge queue reads 10,001 rows of it, not all of them.
#[test]
fn a_count_over_the_cap_is_shown_as_n_plus() {
    let Some(server) = server::PgServer::start() else {
        return;
    };
    let url = server.url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let big: workq_postgres::PgQueue<String> =
            workq_postgres::PgQueue::connect(&url, "big").await.unwrap();
        big.add_all((0..10_050).map(|i| format!("item-{i}")))
            .await
            .unwrap();
        let exact: workq_postgres::PgQueue<String> =
            workq_postgres::PgQueue::connect(&url, "exact")
                .await
                .unwrap();
        exact
            .add_all((0..10_000).map(|i| format!("item-{i}")))
            .await
            .unwrap();
    });
    let (ok, out, err) = pg(&url, &["queues"]);
    assert!(ok, "{err}");
    let row = |name: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row {name} in:\n{out}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(row("big")[..3], ["big", "10000+", "0"], "{out}");
    assert_eq!(row("exact")[..3], ["exact", "10000", "0"], "{out}");
    let (ok, out, err) = pg(&url, &["stats", "big"]);
    assert!(ok, "{err}");
    assert!(out.contains("depth          10000+\n"), "{out}");
}
