//! `wq demo` end to end, through the built binary: a small run passes its checks, bad flag
//! values are refused with exit code 2, Ctrl-C winds the run down with exit code 130, and
//! `--metrics-addr` serves the queue's series over HTTP.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Output, Stdio};

/// Runs `wq demo` with `args` to completion.
fn demo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wq"))
        .arg("demo")
        .args(args)
        .output()
        .expect("wq runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The value of a row of the summary table.
fn row(stdout: &str, label: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|line| line.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no row {label:?} in:\n{stdout}"));
    line[line.find(label).unwrap() + label.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("row {label:?} is not a count: {line}"))
}

/// A small, quick configuration, with some flags changed.
fn small(changes: &[(&'static str, &'static str)]) -> Vec<&'static str> {
    let mut flags = vec![
        ("--objects", "30"),
        ("--events", "600"),
        ("--workers", "4"),
        ("--duration", "1s"),
        ("--latency-ms", "5"),
        ("--seed", "7"),
    ];
    for &(flag, value) in changes {
        match flags.iter_mut().find(|(name, _)| *name == flag) {
            Some(entry) => entry.1 = value,
            None => flags.push((flag, value)),
        }
    }
    let mut args: Vec<&str> = flags
        .into_iter()
        .flat_map(|(flag, value)| [flag, value])
        .collect();
    args.push("--no-progress");
    args
}

#[test]
fn a_small_run_ends_with_its_checks_passed() {
    let output = demo(&small(&[]));
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "exit {:?}\n{stdout}\n{}",
        output.status,
        text(&output.stderr)
    );
    assert!(stdout.contains("[ok] no object was reconciled by two workers at once"));
    assert!(stdout.contains("[ok] every object's last event was reconciled after it arrived"));
    assert_eq!(row(&stdout, "events added"), 600);
    let absorbed = row(&stdout, "events absorbed by dedup");
    let reconciles = row(&stdout, "reconciles");
    assert!(
        absorbed > 0,
        "bursts name waiting objects, so dedup absorbs some:\n{stdout}"
    );
    assert!(reconciles > 0, "{stdout}");
    for label in [
        "succeeded",
        "given up",
        "latency add → reconcile p50",
        "latency add → reconcile p99",
        "throughput",
    ] {
        assert!(stdout.contains(label), "no {label:?} in:\n{stdout}");
    }
}

#[test]
fn a_run_where_everything_fails_gives_up_and_still_passes_its_checks() {
    let output = demo(&small(&[
        ("--failure-rate", "1"),
        ("--max-retries", "1"),
        ("--limiter", "exponential"),
    ]));
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert_eq!(row(&stdout, "succeeded"), 0);
    assert!(row(&stdout, "given up") > 0, "{stdout}");
    assert!(stdout.contains("[ok] every object's last event was reconciled after it arrived"));
}

#[test]
fn every_limiter_runs() {
    for limiter in ["default", "jittered", "exponential", "fast-slow"] {
        let output = demo(&small(&[
            ("--limiter", limiter),
            ("--failure-rate", "0.2"),
            ("--events", "200"),
        ]));
        assert!(
            output.status.success(),
            "--limiter {limiter}:\n{}",
            text(&output.stdout)
        );
    }
}

#[test]
fn out_of_range_flags_are_refused_with_exit_code_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["--workers", "0"], "must be from 1 to 1024"),
        (&["--workers", "many"], "expected a whole number"),
        (&["--failure-rate", "7"], "must be from 0 to 1"),
        (&["--failure-rate=-0.1"], "must be from 0 to 1"),
        (&["--objects", "0"], "must be from 1 to 1000000"),
        (&["--events", "0"], "must be from 1 to 100000000"),
        (&["--duration", "0s"], "must be above zero"),
        (&["--duration", "soon"], "expected a duration"),
        (&["--duration", "99999999999999999999"], "at most 1h"),
        (&["--max-retries", "1000"], "must be from 0 to 100"),
        (&["--limiter", "fastest"], "possible values"),
    ];
    for (args, message) in cases {
        let output = demo(args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("invalid value"), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?} must not start the demo");
    }
}

#[test]
fn help_explains_every_flag() {
    let output = demo(&["--help"]);
    assert!(output.status.success());
    let help = text(&output.stdout);
    for flag in [
        "--objects",
        "--events",
        "--workers",
        "--failure-rate",
        "--duration",
        "--seed",
        "--limiter",
        "--max-retries",
        "--latency-ms",
        "--no-progress",
        "--redis",
        "--postgres",
        "--workers-only",
        "Exit codes",
    ] {
        assert!(
            help.contains(flag),
            "--help does not mention {flag}:\n{help}"
        );
    }
}

#[cfg(unix)]
#[test]
fn ctrl_c_stops_intake_and_still_prints_the_summary() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wq"))
        .args(["demo", "--duration", "60s", "--no-progress"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("wq runs");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    // The first line is printed once the Ctrl-C handler is in place.
    let mut header = String::new();
    stdout.read_line(&mut header).unwrap();
    assert!(header.starts_with("wq demo:"), "{header}");
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{rest}");
    assert!(rest.contains("events added"), "{rest}");
    assert!(
        rest.contains("[ok] no object was reconciled by two workers at once"),
        "{rest}"
    );
    assert!(rest.contains("[skipped]"), "{rest}");
    assert!(rest.trim_end().ends_with("interrupted"), "{rest}");
}

/// Sends `GET path` to `addr`, with an `Accept` header if given, and returns the response.
fn scrape(addr: &str, path: &str, accept: Option<&str>) -> String {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr).expect("the metrics server listens");
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{accept}\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[cfg(unix)]
#[test]
fn metrics_addr_serves_kubernetes_series_and_linger_keeps_serving_until_ctrl_c() {
    let mut args = small(&[("--metrics-addr", "127.0.0.1:0")]);
    args.push("--linger");
    let mut child = Command::new(env!("CARGO_BIN_EXE_wq"))
        .arg("demo")
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("wq runs");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut addr = None;
    let mut seen = String::new();
    // Read up to the line that says the run is over and the server lingers.
    loop {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "ended early:\n{seen}"
        );
        seen.push_str(&line);
        if let Some(url) = line.strip_prefix("metrics: http://") {
            addr = Some(url.trim().trim_end_matches("/metrics").to_owned());
        }
        if line.starts_with("still serving metrics") {
            break;
        }
    }
    let addr = addr.unwrap_or_else(|| panic!("no metrics address in:\n{seen}"));
    let response = scrape(&addr, "/metrics", None);
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{response}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    // The classic text format: every sample parses, and no OpenMetrics line is left.
    let mut samples = 0;
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').expect("`series value`");
        assert!(
            value.parse::<f64>().is_ok(),
            "the value of {series}: {value}"
        );
        samples += 1;
    }
    assert!(samples > 20, "{body}");
    assert!(body.contains("# HELP workqueue_adds_total "), "{body}");
    assert!(
        !body.contains("# EOF") && !body.contains("# UNIT"),
        "{body}"
    );
    let reconciles = row(&seen, "reconciles");
    // Every reconcile was a hand-out; adds count each time an object became dirty.
    assert!(
        response.contains(&format!(
            "workqueue_work_duration_seconds_count{{name=\"demo\"}} {reconciles}\n"
        )),
        "{response}"
    );
    assert!(
        response.contains("workqueue_depth{name=\"demo\"} 0\n"),
        "{response}"
    );
    assert!(response.contains("# TYPE workqueue_adds_total counter\n"));
    // OpenMetrics for a scraper that asks for it; nothing but /metrics is served.
    let open = scrape(&addr, "/metrics", Some("application/openmetrics-text"));
    assert!(open.contains("application/openmetrics-text"), "{open}");
    assert!(open.ends_with("# EOF\n"), "{open}");
    let other = scrape(&addr, "/other", None);
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");

    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "Ctrl-C ends the lingering with the run's result"
    );
}

#[test]
fn server_only_flags_need_redis_or_postgres() {
    for flags in [&["--workers-only"][..], &["--queue", "other"][..]] {
        let out = demo(flags);
        assert_eq!(out.status.code(), Some(2), "{flags:?}");
        for server in ["--redis", "--postgres"] {
            assert!(text(&out.stderr).contains(server), "{}", text(&out.stderr));
        }
    }
}

/// A port nothing listens on (the kernel's choice, released again).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The indented command line of a message.
fn command_in(stderr: &str) -> &str {
    stderr
        .lines()
        .find_map(|line| line.strip_prefix("    "))
        .unwrap_or_else(|| panic!("no command in: {stderr}"))
}

/// `wq demo --redis URL` with nothing at the URL fails at once, naming the address and giving
/// the one command that starts a `redis-server` on that port (installing it first if this
/// machine lacks it); a server elsewhere gets no start command.
#[test]
fn a_demo_on_redis_without_a_server_prints_the_command_that_starts_one() {
    let port = closed_port();
    let out = demo(&["--redis", &format!("redis://127.0.0.1:{port}/")]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("no Redis server answers at 127.0.0.1:{port}")),
        "{stderr}"
    );
    let command = command_in(&stderr);
    assert!(
        command.ends_with(&format!(
            "redis-server --port {port} --save '' --appendonly no --daemonize yes"
        )),
        "{command}"
    );
    assert!(
        stderr.contains(&format!("redis-cli -p {port} shutdown nosave")),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    // `--redis` alone without $WQ_REDIS_URL: the variable, and a server on the default port.
    let out = Command::new(env!("CARGO_BIN_EXE_wq"))
        .args(["demo", "--redis"])
        .env_remove("WQ_REDIS_URL")
        .output()
        .expect("wq runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("WQ_REDIS_URL"), "{stderr}");
    assert!(
        command_in(&stderr).contains("redis-server --port 6379"),
        "{stderr}"
    );
    assert!(
        stderr.contains("wq demo --redis redis://127.0.0.1:6379/"),
        "{stderr}"
    );
}

/// `wq demo --postgres URL` with nothing at the URL fails at once (not after the pool's
/// timeout), giving the command that makes and starts a throwaway cluster on that port with
/// the URL's user and database.
#[test]
fn a_demo_on_postgres_without_a_server_prints_the_command_that_starts_one() {
    let port = closed_port();
    let out = demo(&[
        "--postgres",
        &format!("postgres://alice@localhost:{port}/jobs"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("no PostgreSQL server answers at localhost:{port}")),
        "{stderr}"
    );
    let command = command_in(&stderr);
    let dir = format!("/tmp/wq-demo-postgres-{port}");
    for part in [
        format!("initdb -D {dir} -U alice --auth=trust"),
        format!("pg_ctl -D {dir} -o \"-p {port} -k /tmp\" -l {dir}.log start"),
        format!("createdb -h 127.0.0.1 -p {port} -U alice jobs"),
    ] {
        assert!(command.contains(&part), "{part} not in: {command}");
    }
    assert!(
        stderr.contains(&format!("pg_ctl -D {dir} stop")),
        "{stderr}"
    );

    // IPv6's loopback is this machine too.
    let out = demo(&[
        "--postgres",
        &format!("postgres://postgres@[::1]:{port}/postgres"),
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        command_in(&stderr).contains(&format!("-p {port} -k /tmp")),
        "{stderr}"
    );
}
