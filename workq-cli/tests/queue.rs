//! `wq queue` as an operator (and a careless or hostile one) uses it, as a process, on a
//! `redis-server` and a PostgreSQL cluster of the test's own: what destroys asks first on a
//! terminal, wants `--yes` without one, says what it would do with `--dry-run`, refuses a
//! queue that does not exist (creating nothing), and no text from a server reaches the
//! terminal with its control characters.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use workq_conformance::servers::{postgres, redis};

/// Runs `wq ARGS` with `$WQ_URL` set to `url`, without a terminal.
fn wq(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wq"))
        .args(args)
        .env("WQ_URL", url)
        .env_remove("WQ_REDIS_URL")
        .env_remove("WQ_POSTGRES_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run wq")
}

/// Runs `wq ARGS` on a pseudo-terminal (through `script(1)`), typing `answer` at it.
fn wq_on_terminal(url: &str, args: &[&str], answer: &str) -> Output {
    let mut line = vec![env!("CARGO_BIN_EXE_wq")];
    line.extend_from_slice(args);
    let line = shlex::try_join(line).expect("a command line");
    let mut child = Command::new("script")
        .args(["--quiet", "--return", "--command", &line, "/dev/null"])
        .env("WQ_URL", url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run script(1), from util-linux");
    child
        .stdin
        .take()
        .expect("its stdin")
        .write_all(answer.as_bytes())
        .expect("type the answer");
    child.wait_with_output().expect("script ends")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Asserts `wq` succeeded; its stdout.
fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", text(out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts `wq` failed; everything it printed.
fn failed(out: &Output) -> String {
    assert!(!out.status.success(), "{}", text(out));
    text(out)
}

/// The line of `stats` for `label`, e.g. `dead letters   1 (0 dropped by the cap)`.
fn figure(stats: &str, label: &str) -> String {
    stats
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label} in {stats}"))
        .to_owned()
}

/// The confirmation rules, the same whatever the backend: `url` holds queue `jobs` with
/// two ready items and one dead letter.
fn destructive_commands_ask_first(url: &str) {
    let dead = |expected: &str| {
        let stats = ok(&wq(url, &["queue", "stats", "jobs"]));
        assert!(
            figure(&stats, "dead letters").starts_with(&format!("dead letters   {expected} ")),
            "{stats}"
        );
    };
    dead("1");

    // A dead letter's id as `list` prints it (shell-quoted where it needs it) pastes into the
    // next command.
    let listed = ok(&wq(url, &["queue", "dead-letters", "list", "jobs"]));
    let line = listed.lines().next().expect("a dead letter");
    let id = shlex::split(line).expect("shell words")[0].clone();
    let said = ok(&wq(
        url,
        &["queue", "dead-letters", "requeue", "jobs", &id, "--dry-run"],
    ));
    assert!(said.contains("would requeue dead letter"), "{said}");

    // Without a terminal: refused, saying what it would have done and how to go on.
    for args in [
        &["queue", "dead-letters", "purge", "jobs"][..],
        &["queue", "dead-letters", "requeue-all", "jobs"],
        &["queue", "shutdown", "jobs"],
        &["queue", "remove", "jobs", "\"a\""],
    ] {
        let said = failed(&wq(url, args));
        assert!(said.contains("--yes"), "{args:?}: {said}");
        assert!(said.contains("jobs"), "{args:?}: {said}");
    }
    dead("1");
    let stats = ok(&wq(url, &["queue", "stats", "jobs"]));
    assert!(stats.contains("shut down      no"), "{stats}");
    assert!(stats.contains("depth          2"), "{stats}");

    // --dry-run: what it would do, with the figures; nothing done, whatever the terminal.
    let said = ok(&wq(
        url,
        &["queue", "dead-letters", "purge", "jobs", "--dry-run"],
    ));
    assert!(
        said.contains("would delete all 1 dead letters of queue jobs"),
        "{said}"
    );
    let said = ok(&wq(url, &["queue", "pause", "jobs", "--dry-run"]));
    assert!(said.contains("would pause queue jobs"), "{said}");
    let stats = ok(&wq(url, &["queue", "stats", "jobs"]));
    assert!(stats.contains("paused         no"), "{stats}");
    dead("1");

    // On a terminal: asked; anything but yes does nothing.
    let said = failed(&wq_on_terminal(
        url,
        &["queue", "dead-letters", "purge", "jobs"],
        "n\n",
    ));
    assert!(said.contains("Go on? [y/N]"), "{said}");
    assert!(said.contains("not confirmed"), "{said}");
    dead("1");
    let said = ok(&wq_on_terminal(
        url,
        &["queue", "dead-letters", "purge", "jobs"],
        "y\n",
    ));
    assert!(
        said.contains("delete all 1 dead letters of queue jobs"),
        "{said}"
    );
    assert!(said.contains("1 dead letters purged"), "{said}");
    dead("0");

    // --yes: done without asking.
    let said = ok(&wq(url, &["queue", "shutdown", "jobs", "--yes"]));
    assert!(said.contains("is shut down for every process"), "{said}");
    let said = ok(&wq(url, &["queue", "resume", "jobs"]));
    assert!(said.contains("resumed (it was shut down)"), "{said}");

    // A queue that does not exist is refused, and is not created by the attempt.
    for args in [
        &["queue", "shutdown", "jobz", "--yes"][..],
        &["queue", "dead-letters", "purge", "jobz", "--yes"],
        &["queue", "pause", "jobz"],
        &["queue", "stats", "jobz"],
    ] {
        let said = failed(&wq(url, args));
        assert!(said.contains("no queue named jobz"), "{args:?}: {said}");
    }
    let listed = ok(&wq(url, &["queue", "list"]));
    assert!(listed.lines().any(|l| l.starts_with("jobs ")), "{listed}");
    assert!(!listed.contains("jobz"), "{listed}");
}

/// A queue named to attack the operator's terminal: clear the screen, set the window's
/// title, reorder the line.
const HOSTILE: &str = "jobs\u{1b}[2J\u{1b}]0;pwned\u{7}\u{202e}";

/// No byte of `out` is a control character a terminal acts on (bar new lines).
fn assert_no_control(out: &Output) {
    for stream in [&out.stdout, &out.stderr] {
        let text = String::from_utf8_lossy(stream);
        assert!(
            !text
                .chars()
                .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
            "a control character reached the terminal: {text:?}"
        );
    }
}

#[test]
fn on_redis_destructive_commands_ask_dry_run_and_refuse_unknown_queues() {
    let Some(server) = redis::require() else {
        return;
    };
    let url = server.url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let jobs: workq_redis::RedisQueue<String> = workq_redis::RedisQueue::connect(&url, "jobs")
            .await
            .unwrap();
        // A number the string queue cannot read: a dead letter at the first get.
        let numbers: workq_redis::RedisQueue<u32> = workq_redis::RedisQueue::connect(&url, "jobs")
            .await
            .unwrap();
        numbers.add(7).await.unwrap();
        assert!(jobs.try_get().await.unwrap().into_lease().is_none());
        jobs.add_all(["a", "b"].map(String::from)).await.unwrap();
    });
    destructive_commands_ask_first(&url);
}

#[test]
fn on_postgres_destructive_commands_ask_dry_run_and_refuse_unknown_queues() {
    let Some(server) = postgres::PgServer::start() else {
        return;
    };
    let url = server.url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let jobs: workq_postgres::PgQueue<String> = workq_postgres::PgQueue::connect(&url, "jobs")
            .await
            .unwrap();
        let numbers: workq_postgres::PgQueue<u32> = workq_postgres::PgQueue::connect(&url, "jobs")
            .await
            .unwrap();
        numbers.add(7).await.unwrap();
        assert!(jobs.try_get_many(1).await.unwrap().is_empty());
        jobs.add_all(["a", "b"].map(String::from)).await.unwrap();
    });
    destructive_commands_ask_first(&url);
}

#[test]
fn text_from_the_server_reaches_the_terminal_escaped() {
    let Some(server) = postgres::PgServer::start() else {
        return;
    };
    let url = server.url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let jobs: workq_postgres::PgQueue<String> = workq_postgres::PgQueue::connect(&url, "jobs")
            .await
            .unwrap();
        jobs.add("\u{1b}[31mred\u{202e}".to_owned()).await.unwrap();
        // The library refuses such a name; anyone who can write to the database is not
        // stopped by that.
        let _hostile: workq_postgres::PgQueue<String> =
            workq_postgres::PgQueue::connect(&url, "hostile")
                .await
                .unwrap();
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        sqlx::query("UPDATE workqueue_queues SET name = $1 WHERE name = 'hostile'")
            .bind(HOSTILE)
            .execute(&pool)
            .await
            .unwrap();
    });
    let listed = wq(&url, &["queue", "list"]);
    assert_no_control(&listed);
    assert!(
        ok(&listed).contains("jobs\\u{1b}[2J\\u{1b}]0;pwned\\u{7}\\u{202e}"),
        "{}",
        text(&listed)
    );
    for args in [
        &["queue", "stats", HOSTILE][..],
        &["queue", "dead-letters", "purge", HOSTILE, "--yes"],
        &["queue", "items", "jobs", "--state", "ready"],
        &["queue", "item", "jobs", "\"\\u001b[31mred\\u202e\""],
        &["queue", "stats", "jobs"],
    ] {
        assert_no_control(&wq(&url, args));
    }
    // An unknown queue's name, in an error.
    let missing = wq(&url, &["queue", "stats", "nope\u{1b}[2J"]);
    assert_no_control(&missing);
    assert!(
        failed(&missing).contains("nope\\u{1b}[2J"),
        "{}",
        text(&missing)
    );
}

#[test]
fn the_url_picks_the_backend_and_the_aliases_keep_to_theirs() {
    let said = failed(&wq("mysql://db/x", &["queue", "list"]));
    assert!(said.contains("neither redis nor postgres"), "{said}");
    let said = failed(&wq("postgres://u:Secret@127.0.0.1:1/x", &["redis", "list"]));
    assert!(said.contains("wq redis takes a redis URL"), "{said}");
    assert!(!said.contains("Secret"), "{said}");
    let said = failed(&wq(
        "postgres://127.0.0.1:1/x",
        &["queue", "--prefix", "p", "list"],
    ));
    assert!(said.contains("--prefix is for Redis"), "{said}");
    let out = Command::new(env!("CARGO_BIN_EXE_wq"))
        .args(["queue", "list"])
        .env_remove("WQ_URL")
        .output()
        .expect("run wq");
    assert!(failed(&out).contains("give --url URL or set WQ_URL"));
}
