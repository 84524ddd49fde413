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

/// What `destructive_commands_ask_first` takes as `redead` for queue `jobs` at `$url`, a
/// handle of type `$queue` (a `String` queue): it gets every item it can (the number it
/// cannot read goes back to the dead letters) and releases the others.
macro_rules! redead {
    ($runtime:expr, $url:expr, $queue:ty) => {
        || {
            $runtime.block_on(async {
                let jobs = <$queue>::connect(&$url, "jobs").await.unwrap();
                let mut leases = Vec::new();
                while let Some(lease) = jobs.try_get().await.unwrap().into_lease() {
                    leases.push(lease);
                }
                for lease in leases {
                    lease.release().await.unwrap();
                }
            });
        }
    };
}

/// The confirmation rules, the same whatever the backend: `url` holds queue `jobs` with
/// two ready items and one dead letter; `redead` turns the dead letter, once requeued, back
/// into one (a get that cannot read it), leaving the two items ready.
fn destructive_commands_ask_first(url: &str, redead: &dyn Fn()) {
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
    let said = ok(&wq(
        url,
        &["queue", "dead-letters", "requeue-all", "jobs", "--dry-run"],
    ));
    assert!(
        said.contains("would requeue all 1 dead letters of queue jobs")
            && said.contains("nothing done (--dry-run)"),
        "{said}"
    );
    let said = ok(&wq(url, &["queue", "shutdown", "jobs", "--dry-run"]));
    assert!(
        said.contains("would shut queue jobs down for every process (2 ready, 0 in flight")
            && said.contains("nothing done (--dry-run)"),
        "{said}"
    );
    let stats = ok(&wq(url, &["queue", "stats", "jobs"]));
    assert!(stats.contains("paused         no"), "{stats}");
    assert!(stats.contains("shut down      no"), "{stats}");
    assert!(stats.contains("depth          2"), "{stats}");
    dead("1");

    // On a terminal, requeue-all and shutdown ask too: `n` does nothing, `y` does it.
    for (args, asked) in [
        (
            &["queue", "dead-letters", "requeue-all", "jobs"][..],
            "This will requeue all 1 dead letters of queue jobs",
        ),
        (
            &["queue", "shutdown", "jobs"],
            "This will shut queue jobs down for every process (2 ready",
        ),
    ] {
        let said = failed(&wq_on_terminal(url, args, "n\n"));
        assert!(said.contains(asked), "{args:?}: {said}");
        assert!(said.contains("Go on? [y/N]"), "{args:?}: {said}");
        assert!(said.contains("not confirmed"), "{args:?}: {said}");
    }
    let stats = ok(&wq(url, &["queue", "stats", "jobs"]));
    assert!(stats.contains("shut down      no"), "{stats}");
    assert!(stats.contains("depth          2"), "{stats}");
    dead("1");
    let said = ok(&wq_on_terminal(
        url,
        &["queue", "dead-letters", "requeue-all", "jobs"],
        "y\n",
    ));
    assert!(said.contains("Go on? [y/N]"), "{said}");
    assert!(said.contains("1 dead letters requeued"), "{said}");
    dead("0");
    let stats = ok(&wq(url, &["queue", "stats", "jobs"]));
    assert!(stats.contains("depth          3"), "{stats}");
    let said = ok(&wq_on_terminal(url, &["queue", "shutdown", "jobs"], "y\n"));
    assert!(said.contains("Go on? [y/N]"), "{said}");
    assert!(said.contains("is shut down for every process"), "{said}");
    let stats = ok(&wq(url, &["queue", "stats", "jobs"]));
    assert!(stats.contains("shut down      yes"), "{stats}");
    ok(&wq(url, &["queue", "resume", "jobs"]));
    redead();
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
    destructive_commands_ask_first(
        &url,
        &redead!(runtime, url, workq_redis::RedisQueue<String>),
    );
}

/// `wq queue stats` on a Redis whose `maxmemory-policy` may evict the queue's keys warns of
/// it (set on the running server: each `wq` reads the settings when it connects), and says
/// nothing of it with `noeviction`.
#[test]
fn stats_warn_of_an_eviction_policy() {
    let Some(server) = redis::require() else {
        return;
    };
    let url = server.url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let set = |policy: &str| {
        runtime.block_on(async {
            let mut con = ::redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let _: () = ::redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory-policy")
                .arg(policy)
                .query_async(&mut con)
                .await
                .unwrap();
        });
    };
    runtime.block_on(async {
        let jobs: workq_redis::RedisQueue<String> = workq_redis::RedisQueue::connect(&url, "jobs")
            .await
            .unwrap();
        jobs.add("a".to_owned()).await.unwrap();
    });
    let warnings = |stats: &str| -> Vec<String> {
        stats
            .lines()
            .filter(|l| l.starts_with("warning") && l.contains("maxmemory-policy"))
            .map(str::to_owned)
            .collect()
    };
    let stats = ok(&wq(&url, &["queue", "stats", "jobs"]));
    assert_eq!(warnings(&stats), Vec::<String>::new(), "{stats}");
    set("allkeys-lru");
    let stats = ok(&wq(&url, &["queue", "stats", "jobs"]));
    let said = warnings(&stats);
    assert_eq!(said.len(), 1, "{stats}");
    assert!(
        said[0].contains("allkeys-lru") && said[0].contains("noeviction"),
        "{stats}"
    );
    assert!(stats.contains("maxmemory-policy=allkeys-lru"), "{stats}");
    set("noeviction");
    let stats = ok(&wq(&url, &["queue", "stats", "jobs"]));
    assert_eq!(warnings(&stats), Vec::<String>::new(), "{stats}");
}

/// The commands a server has run so far by name (`INFO commandstats`, commands run by
/// scripts included), and a way to run more on it.
struct Counted {
    runtime: tokio::runtime::Runtime,
    con: ::redis::aio::MultiplexedConnection,
}

impl Counted {
    fn new(url: &str) -> Self {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let con = runtime.block_on(async {
            // `DEBUG POPULATE` of 200,000 keys takes the server a while under load.
            let config = ::redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(std::time::Duration::from_secs(60)));
            ::redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .unwrap()
        });
        Counted { runtime, con }
    }

    fn run<T: ::redis::FromRedisValue>(&mut self, cmd: &mut ::redis::Cmd) -> T {
        let con = &mut self.con;
        self.runtime
            .block_on(async { cmd.query_async(con).await.unwrap() })
    }

    fn calls(&mut self) -> std::collections::BTreeMap<String, u64> {
        let info: String = self.run(::redis::cmd("INFO").arg("commandstats"));
        info.lines()
            .filter_map(|line| {
                let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest
                    .strip_prefix("calls=")?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()?;
                Some((name.to_owned(), calls))
            })
            .collect()
    }

    /// What `wq ARGS` made the server do, by command (the measure's own `INFO` left out),
    /// and what it printed.
    fn work_of(
        &mut self,
        url: &str,
        args: &[&str],
    ) -> (std::collections::BTreeMap<String, u64>, String) {
        let before = self.calls();
        let out = text(&wq(url, args));
        let mut work = self.calls();
        for (name, calls) in &mut work {
            *calls -= before.get(name).copied().unwrap_or(0);
            if name == "info" {
                // The `INFO` that read `before`.
                *calls -= 1;
            }
        }
        work.retain(|_, calls| *calls > 0);
        (work, out)
    }
}

/// `wq queue list` on a Redis of 200,000 unrelated keys reads the index of queue names the
/// queues keep, not the keyspace: the one-time search for queues made before the index
/// scans a bounded part of the keyspace per listing (at most 10 `SCAN` rounds), going on
/// where the last listing stopped, and says it is under way; once it is done a listing scans
/// nothing, and costs the same with 200,000 more keys.
#[test]
fn a_listing_beside_200_000_unrelated_keys_does_bounded_work() {
    let Some(server) =
        redis::require_with(redis::Durability::None, &["--enable-debug-command", "yes"])
    else {
        return;
    };
    let url = server.url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        for name in ["jobs", "mail", "pods"] {
            let q: workq_redis::RedisQueue<String> = workq_redis::RedisQueue::builder(name)
                .url(url.clone())
                .check_persistence(false)
                .build()
                .await
                .unwrap();
            q.add("x".to_owned()).await.unwrap();
        }
    });
    let mut server_con = Counted::new(&url);
    // A queue of a version that kept no index: its keys only.
    let _: i64 = server_con.run(
        ::redis::cmd("RPUSH")
            .arg("wq:{legacy}:ready")
            .arg("\"old\""),
    );
    let _: () = server_con.run(
        ::redis::cmd("DEBUG")
            .arg("POPULATE")
            .arg(200_000)
            .arg("junk"),
    );
    let listed = |out: &str| -> Vec<String> {
        ["jobs", "legacy", "mail", "pods"]
            .into_iter()
            .filter(|name| out.lines().any(|l| l.starts_with(name)))
            .map(str::to_owned)
            .collect()
    };
    let all = ["jobs", "legacy", "mail", "pods"];
    let still_looking = "still looking for queues made by a version that kept no index";
    let scans =
        |work: &std::collections::BTreeMap<String, u64>| work.get("scan").copied().unwrap_or(0);

    // The indexed queues at once; the old one once the step that scans its key has run
    // (one of the 20 or so the keyspace takes: a step scans some 10,000 keys).
    let mut listings = 0;
    let mut found = false;
    loop {
        let (work, out) = server_con.work_of(&url, &["queue", "list"]);
        listings += 1;
        let names = listed(&out);
        assert!(
            ["jobs", "mail", "pods"]
                .iter()
                .all(|n| names.iter().any(|m| m == n)),
            "{out}"
        );
        found |= names == all;
        // Every listing until the scan is done (the last one included) takes a step of it.
        assert!(
            (1..=10).contains(&scans(&work)),
            "listing {listings}: {work:?}"
        );
        if !out.contains(still_looking) {
            break;
        }
        assert!(listings <= 40, "listing {listings}: not done");
    }
    assert!(found, "the old queue is listed once the scan is done");
    assert!(listings > 1, "the keyspace took more than one bounded step");

    // Done: a listing scans nothing, and its work does not grow with the keyspace.
    let (settled, out) = server_con.work_of(&url, &["queue", "list"]);
    assert_eq!(scans(&settled), 0, "{settled:?}");
    assert_eq!(listed(&out), ["jobs", "legacy", "mail", "pods"], "{out}");
    let _: () = server_con.run(
        ::redis::cmd("DEBUG")
            .arg("POPULATE")
            .arg(200_000)
            .arg("more"),
    );
    let size: u64 = server_con.run(&mut ::redis::cmd("DBSIZE"));
    assert!(size > 400_000, "{size} keys");
    let (crowded, _) = server_con.work_of(&url, &["queue", "list"]);
    assert_eq!(crowded, settled, "the same commands beside twice the keys");
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
    destructive_commands_ask_first(
        &url,
        &redead!(runtime, url, workq_postgres::PgQueue<String>),
    );
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
        // A dead letter whose error text attacks the terminal (written by hand: the
        // library's own errors quote what they cite).
        let words: workq_postgres::PgQueue<String> =
            workq_postgres::PgQueue::connect(&url, "dl").await.unwrap();
        words.add("x".to_owned()).await.unwrap();
        let numbers: workq_postgres::PgQueue<u32> =
            workq_postgres::PgQueue::connect(&url, "dl").await.unwrap();
        assert!(numbers.try_get_many(1).await.unwrap().is_empty());
        let rows = sqlx::query("UPDATE workqueue_dead SET reason = $1")
            .bind("bad\u{1b}[2J\u{1b}]0;pwned\u{7}\u{202e}")
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(rows.rows_affected(), 1);
    });
    let letters = wq(&url, &["queue", "dead-letters", "list", "dl"]);
    assert_no_control(&letters);
    assert!(
        ok(&letters).contains("bad\\u{1b}[2J\\u{1b}]0;pwned\\u{7}\\u{202e}"),
        "{}",
        text(&letters)
    );
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

/// The group of a key `group/name`: the part before the slash.
fn group_of(key: &str) -> String {
    key.split_once('/').map_or("", |(g, _)| g).to_owned()
}

/// Keys of three groups: `noisy` three, `quiet` and `big` one each.
const KEYS: [&str; 5] = ["noisy/a", "noisy/b", "noisy/c", "quiet/a", "big/a"];

/// Registers the schedules `nightly` (cron in Paris) and a hostile name on `queue`, as their
/// runners would.
async fn register<Q: workq::Queue>(queue: &Q)
where
    Q::Error: std::fmt::Debug,
{
    let now = std::time::SystemTime::now();
    let next = now + std::time::Duration::from_secs(3600);
    for (name, spec) in [
        ("nightly", "cron 0 3 * * * (Europe/Paris)"),
        ("evil\u{1b}[2J\u{202e}", "every 1m"),
    ] {
        let update = workq::periodic::ScheduleUpdate::register(name, spec, Some(next), now);
        queue.upsert_schedule(update).await.expect("a schedule");
    }
}

/// What `wq queue stats` and `wq queue schedules` show of queue `tenants` at `url` (grouped,
/// one lease out per group, `big` three; `noisy/a` out; `nightly` and a hostile schedule),
/// and pausing a schedule, the same whatever the backend.
fn groups_limits_and_schedules(url: &str) {
    let stats = ok(&wq(url, &["queue", "stats", "tenants"]));
    assert!(
        stats.contains("groups         3 kept, 3 with ready items, 1 at their limit"),
        "{stats}"
    );
    let row = |group: &str| figure(&stats, &format!("    {group} "));
    let cells = |line: String| {
        line.split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        cells(row("noisy"))[..4],
        ["noisy", "2", "1", "1"],
        "{stats}"
    );
    assert_eq!(cells(row("big"))[..4], ["big", "1", "0", "3"], "{stats}");
    assert!(
        stats.contains("limits         groups: by the queue's group function, taking turns"),
        "{stats}"
    );
    assert!(
        stats.contains("               in flight per group: at most 1 (big: 3)"),
        "{stats}"
    );
    let nightly = figure(&stats, "    nightly");
    assert!(
        nightly.contains("cron 0 3 * * * (Europe/Paris)  Europe/Paris")
            && nightly.contains("running"),
        "{stats}"
    );
    let out = ok(&wq(url, &["queue", "stats", "tenants", "--json"]));
    let json: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(json["groups"][0]["name"], "noisy", "{json}");
    assert_eq!(json["limits"]["group_max_in_flight"]["big"], 3, "{json}");
    let one = ok(&wq(url, &["queue", "stats", "tenants", "--groups", "1"]));
    assert!(
        one.contains("    noisy ") && !one.contains("    big "),
        "{one}"
    );
    assert!(
        one.contains("    ... of 3 kept (--groups N lists more)"),
        "{one}"
    );

    let listed = wq(url, &["queue", "schedules", "list", "tenants"]);
    assert_no_control(&listed);
    let listed = ok(&listed);
    assert!(listed.starts_with("name "), "{listed}");
    assert!(listed.contains("evil\\u{1b}[2J\\u{202e}"), "{listed}");
    let out = ok(&wq(
        url,
        &["queue", "schedules", "list", "tenants", "--json"],
    ));
    let json: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(json[1]["name"], "nightly", "{json}");
    assert_eq!(json[1]["paused"], false, "{json}");

    let pause = ["queue", "schedules", "pause", "tenants", "nightly"];
    let said = ok(&wq(url, &[&pause[..], &["--dry-run"]].concat()));
    assert!(
        said.contains("would pause schedule nightly of queue tenants for every process"),
        "{said}"
    );
    assert!(
        figure(
            &ok(&wq(url, &["queue", "schedules", "list", "tenants"])),
            "nightly"
        )
        .contains("running")
    );
    assert!(ok(&wq(url, &pause)).contains("schedule paused for every process"));
    assert!(ok(&wq(url, &pause)).contains("schedule paused already"));
    let listed = ok(&wq(url, &["queue", "schedules", "list", "tenants"]));
    assert!(figure(&listed, "nightly").contains("paused"), "{listed}");
    let resume = ["queue", "schedules", "resume", "tenants", "nightly"];
    assert!(ok(&wq(url, &resume)).contains("schedule running again"));
    let said = failed(&wq(
        url,
        &["queue", "schedules", "pause", "tenants", "hourly"],
    ));
    assert!(
        said.contains("queue tenants has no schedule hourly"),
        "{said}"
    );
    let said = failed(&wq(url, &["queue", "schedules", "list", "nope"]));
    assert!(said.contains("no queue named nope"), "{said}");
    let listed = ok(&wq(url, &["queue", "schedules", "list", "tenants"]));
    assert!(!listed.contains("hourly"), "nothing was created: {listed}");
}

/// Fills queue `tenants` (built by `build`) with [`KEYS`] and the schedules of [`register`],
/// takes `noisy/a` out, and runs [`groups_limits_and_schedules`] on `url`.
fn on_tenants<Q>(url: &str, build: impl std::future::Future<Output = Q>)
where
    Q: workq::Queue<Item = String>,
    Q::Error: std::fmt::Debug,
{
    use workq::QueueLease as _;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let lease = runtime.block_on(async {
        let q = build.await;
        for key in KEYS {
            let options = workq::AddOptions::default();
            q.add_with(key.to_owned(), options).await.expect("add");
        }
        register(&q).await;
        q.get().await.expect("get").expect("a lease")
    });
    assert_eq!(lease.item(), "noisy/a");
    groups_limits_and_schedules(url);
    runtime.block_on(lease.done()).expect("done");
}

#[test]
fn groups_limits_and_schedules_on_redis() {
    let Some(server) = redis::require() else {
        return;
    };
    let url = server.url();
    let queue = workq_redis::RedisQueue::builder("tenants")
        .url(url.clone())
        .check_persistence(false)
        .group_by(|key: &String| group_of(key))
        .max_in_flight_per_group(1)
        .group_max_in_flight("big", 3)
        .build();
    on_tenants(&url, async { queue.await.expect("connect") });
}

#[test]
fn groups_limits_and_schedules_on_postgres() {
    let Some(server) = postgres::PgServer::start() else {
        return;
    };
    let url = server.url();
    let queue = workq_postgres::PgQueue::builder("tenants")
        .url(url.clone())
        .group_by(|key: &String| group_of(key))
        .max_in_flight_per_group(1)
        .group_max_in_flight("big", 3)
        .build();
    on_tenants(&url, async { queue.await.expect("connect") });
}

/// `wq queue reindex` finds a queue of a version that kept no index of queue names at once:
/// the next listing shows it, says nothing is still being looked for, and scans nothing.
#[test]
fn reindex_finds_the_queues_of_an_older_version_at_once() {
    let Some(server) = redis::require() else {
        return;
    };
    let url = server.url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let q: workq_redis::RedisQueue<String> = workq_redis::RedisQueue::connect(&url, "jobs")
            .await
            .unwrap();
        q.add("x".to_owned()).await.unwrap();
    });
    drop(runtime);
    let mut con = Counted::new(&url);
    // A queue of a version that kept no index: its keys only.
    let _: i64 = con.run(
        ::redis::cmd("RPUSH")
            .arg("wq:{legacy}:ready")
            .arg("\"old\""),
    );
    let said = ok(&wq(&url, &["queue", "reindex"]));
    assert!(
        said.contains("2 queue names found and indexed"),
        "jobs and legacy: {said}"
    );
    let (work, out) = con.work_of(&url, &["queue", "list"]);
    assert!(out.lines().any(|l| l.starts_with("legacy ")), "{out}");
    assert!(!out.contains("still looking"), "{out}");
    assert_eq!(work.get("scan"), None, "{work:?}");
    let said = failed(&wq("postgres://127.0.0.1:1/x", &["queue", "reindex"]));
    assert!(said.contains("reindex is for Redis"), "{said}");
}
