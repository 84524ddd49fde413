//! `cargo xtask test`: the packages, the build, and the suites.
//!
//! It builds what `cargo test --workspace --all-features` builds (`--no-run`), and runs the
//! same test binaries and doc tests itself: the first ones while the build goes on (one at a
//! time), then the binaries of different crates side by side (one at a time per crate), each
//! one's output captured and shown in full if it fails. That way every suite gets its own line with its
//! counts and time, and a crate's slow suite does not hold up the others.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::cargo::{self, Message, TestBinary, Workspace};
use crate::packages;
use crate::run::{self, Counts, DOC_TESTS, Outcome, Record, Suite};
use crate::suites;

/// Options of `cargo xtask test`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Options {
    /// Only the tests that need no server.
    pub(crate) quick: bool,
    /// Suites run at once.
    pub(crate) jobs: usize,
}

/// What the main loop hears.
enum Event {
    Build(Message),
    /// cargo's output ended; its exit status follows from `wait`.
    BuildOutputEnded,
    Done(Box<Outcome>),
}

/// Runs the command; the process's exit code.
pub(crate) fn main(options: &Options) -> i32 {
    let started = Instant::now();
    let workspace = match Workspace::load() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("xtask: {e}");
            return 1;
        }
    };
    let xtask_dir = workspace.target_dir.join("xtask");
    let quick = options.quick.then(|| suites::quick(&workspace));
    let nowhere = xtask_dir.join("no-server");
    if let Some(quick) = &quick {
        println!(
            "quick: the tests that need no server; {} test binaries that start one are not built",
            quick.skipped.len()
        );
        let _ = std::fs::create_dir_all(&nowhere);
    } else if packages::ensure(&packages::wanted(false), &xtask_dir.join("apt-get.log")).is_err() {
        return 1;
    }

    let mut build_args: Vec<String> = [
        "test",
        "--workspace",
        "--all-features",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some(quick) = &quick {
        build_args.extend(quick.cargo_args.iter().cloned());
    }
    println!(
        "building: cargo {} (suites start as their binaries are ready: one at a time during \
         the build, then {} at a time; the crash tests alone)",
        build_args.join(" "),
        options.jobs
    );
    let (events, heard) = mpsc::channel();
    let mut build = match Command::new(cargo::cargo())
        .args(&build_args)
        .current_dir(&workspace.root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("xtask: cannot run cargo: {e}");
            return 1;
        }
    };
    if let Some(stdout) = build.stdout.take() {
        let events = events.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = events.send(Event::Build(Message::parse(&line)));
            }
            let _ = events.send(Event::BuildOutputEnded);
        });
    }
    if let Some(stderr) = build.stderr.take() {
        // Diagnostics and cargo's own messages, less its per-crate progress lines.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let word = line.split_whitespace().next().unwrap_or("");
                if !matches!(word, "Compiling" | "Finished" | "Executable" | "Running") {
                    eprintln!("{line}");
                }
            }
        });
    }

    let mut record = Record::load(&xtask_dir.join("suites.tsv"));
    let mut env = vec![];
    let mut env_remove = vec![];
    if quick.is_some() {
        env = suites::quick_env(&nowhere);
        env_remove = suites::QUICK_ENV_REMOVE
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
    }
    let mut pending: Vec<Suite> = Vec::new();
    // Suites running, by slot: in the full run one per crate, as a crate's suites start the
    // same kind of servers and their timeouts are sized for one at a time; the quick run
    // starts no server, so any of its suites may run beside any other.
    let slot = |suite: &Suite| {
        if quick.is_some() {
            format!("{} {}", suite.package, suite.label)
        } else {
            suite.package.clone()
        }
    };
    // Slot -> (suite, since when, alone).
    let mut running: HashMap<String, (String, Instant, bool)> = HashMap::new();
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut build_done = false;
    let mut build_ok = true;
    let mut build_seconds = 0.0;
    let mut compiled = 0_usize;
    let mut binaries = 0_usize;
    let mut last_print = Instant::now();
    let mut seen: HashSet<PathBuf> = HashSet::new();
    // Each package's binaries not yet built.
    let mut bins_pending: HashMap<String, HashSet<String>> = workspace
        .packages
        .iter()
        .map(|p| {
            let bins = p.targets.iter().filter(|t| t.kind == cargo::Kind::Bin);
            (p.name.clone(), bins.map(|t| t.name.clone()).collect())
        })
        .collect();

    loop {
        // Start what may start: one suite per crate, the longest (by the last run) first; one
        // at a time while cargo still builds on every core, so that timing-sensitive tests
        // are not starved.
        let limit = if build_done { options.jobs } else { 1 };
        // A suite that runs alone goes first once the build is over, when the others have
        // ended; nothing starts beside it.
        let alone_waiting = build_done && pending.iter().any(|s| s.alone);
        let alone_running = running.values().any(|(_, _, alone)| *alone);
        while running.len() < limit && !alone_running {
            let best = pending
                .iter()
                .enumerate()
                .filter(|(_, s)| !running.contains_key(&slot(s)))
                .filter(|(_, s)| {
                    if s.alone {
                        build_done && running.is_empty()
                    } else {
                        !alone_waiting
                    }
                })
                .filter(|(_, s)| {
                    // Cargo builds a package's binaries beside its integration tests, not
                    // before: those wait for them (or for the end of the build).
                    !s.runs_bins
                        || build_done
                        || bins_pending.get(&s.package).is_none_or(HashSet::is_empty)
                })
                .max_by(|(_, a), (_, b)| {
                    let time = |s: &Suite| record.seconds(&s.package, &s.label).unwrap_or(1.0);
                    time(a).total_cmp(&time(b))
                })
                .map(|(i, _)| i);
            let Some(index) = best else { break };
            let suite = pending.remove(index);
            let alone = suite.alone;
            running.insert(
                slot(&suite),
                (
                    format!("{} {}", suite.package, suite.label),
                    Instant::now(),
                    alone,
                ),
            );
            let events = events.clone();
            std::thread::spawn(move || {
                let _ = events.send(Event::Done(Box::new(run::run(suite))));
            });
            if alone {
                break;
            }
        }
        if build_done && pending.is_empty() && running.is_empty() {
            break;
        }
        if last_print.elapsed() >= run::HEARTBEAT {
            println!(
                "{}",
                progress(&running, build_done, compiled, binaries, started)
            );
            last_print = Instant::now();
        }
        let event = match heard.recv_timeout(Duration::from_secs(1)) {
            Ok(event) => event,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        match event {
            Event::Build(Message::Compiled { fresh, bin }) => {
                compiled += usize::from(!fresh);
                if let Some((package, name)) = bin
                    && let Some(waiting) = bins_pending.get_mut(&package)
                {
                    waiting.remove(&name);
                }
            }
            Event::Build(Message::TestBinary(binary)) => {
                if !seen.insert(binary.executable.clone()) {
                    continue;
                }
                binaries += 1;
                if quick.is_some() && !suites::in_quick_run(&binary.package, &binary.target) {
                    continue;
                }
                pending.push(suite_of(&binary, quick.is_some(), &env, &env_remove));
            }
            Event::Build(Message::Finished { success }) => build_ok &= success,
            Event::Build(Message::Other) => {}
            Event::BuildOutputEnded => {
                build_done = true;
                build_ok &= build.wait().is_ok_and(|s| s.success());
                build_seconds = started.elapsed().as_secs_f64();
                if build_ok {
                    println!(
                        "built in {}: {binaries} test binaries ({compiled} crates compiled)",
                        run::ago(started)
                    );
                    pending.push(doc_tests(&workspace, &env, &env_remove));
                } else {
                    eprintln!(
                        "xtask: the build failed (see above){}",
                        if running.is_empty() {
                            String::new()
                        } else {
                            format!(
                                "; waiting for the {} running",
                                if running.len() == 1 {
                                    "suite".to_owned()
                                } else {
                                    format!("{} suites", running.len())
                                }
                            )
                        }
                    );
                    pending.clear();
                }
                last_print = Instant::now();
            }
            Event::Done(outcome) => {
                running.remove(&slot(&outcome.suite));
                let filtered_as = if quick.is_some() {
                    "skipped (server)"
                } else {
                    "filtered out"
                };
                println!("{}", run::outcome_line(&outcome, filtered_as));
                if !outcome.success {
                    print_failure(&outcome, quick.is_some().then_some(&nowhere));
                }
                record.update(&outcome);
                outcomes.push(*outcome);
                last_print = Instant::now();
            }
        }
    }
    record.save();
    let failed = summary(
        &workspace,
        &outcomes,
        quick.as_ref(),
        &record,
        build_ok,
        (started, build_seconds),
    );
    if failed { 1 } else { 0 }
}

/// The suite of a test binary.
fn suite_of(
    binary: &TestBinary,
    quick: bool,
    env: &[(String, String)],
    remove: &[String],
) -> Suite {
    let mut env = env.to_vec();
    // What `cargo test` sets that a test may read at run time.
    env.push((
        "CARGO_MANIFEST_DIR".into(),
        binary.dir.display().to_string(),
    ));
    env.push(("CARGO_PKG_NAME".into(), binary.package.clone()));
    Suite {
        package: binary.package.clone(),
        label: binary.target.label(),
        program: binary.executable.clone(),
        args: if quick {
            suites::server_tests(&binary.package, &binary.target)
        } else {
            Vec::new()
        },
        dir: binary.dir.clone(),
        env,
        env_remove: remove.to_vec(),
        runs_bins: binary.target.kind == cargo::Kind::Test,
        alone: suites::runs_alone(&binary.package, &binary.target),
    }
}

/// The doc tests of every package, as `cargo test --workspace --all-features --doc`.
fn doc_tests(workspace: &Workspace, env: &[(String, String)], remove: &[String]) -> Suite {
    Suite {
        package: DOC_TESTS.into(),
        label: "cargo test --doc".into(),
        program: cargo::cargo().into(),
        args: ["test", "--workspace", "--all-features", "--doc"]
            .map(str::to_owned)
            .to_vec(),
        dir: workspace.root.clone(),
        env: env.to_vec(),
        env_remove: remove.to_vec(),
        runs_bins: false,
        alone: false,
    }
}

/// The heartbeat line: what is running, and the build's progress.
fn progress(
    running: &HashMap<String, (String, Instant, bool)>,
    build_done: bool,
    compiled: usize,
    binaries: usize,
    started: Instant,
) -> String {
    let mut parts: Vec<String> = Vec::new();
    if !build_done {
        parts.push(format!(
            "building ({compiled} crates compiled, {binaries} test binaries ready)"
        ));
    }
    let mut suites: Vec<String> = running
        .values()
        .map(|(name, since, _)| format!("{name} ({})", run::ago(*since)))
        .collect();
    suites.sort();
    if !suites.is_empty() {
        parts.push(format!("running {}", suites.join(", ")));
    }
    format!("  ... {}: {}", run::ago(started), parts.join("; "))
}

/// Prints a failed suite's whole output.
fn print_failure(outcome: &Outcome, nowhere: Option<&PathBuf>) {
    let name = format!("{} {}", outcome.suite.package, outcome.suite.label);
    println!("---- output of {name} ----");
    print!("{}", outcome.output);
    if !outcome.output.ends_with('\n') {
        println!();
    }
    println!("---- end of {name} ----");
    if let Some(nowhere) = nowhere
        && suites::wanted_a_server(&outcome.output, nowhere)
    {
        println!(
            "  A test of {name} starts a server, but the quick run hides every server: list it \
             in xtask/src/suites.rs (SERVER_BINARIES, or SERVER_TESTS for single tests)."
        );
    }
}

/// Prints the failures again and one line per crate; whether anything failed.
fn summary(
    workspace: &Workspace,
    outcomes: &[Outcome],
    quick: Option<&suites::Quick>,
    record: &Record,
    build_ok: bool,
    (started, build_seconds): (Instant, f64),
) -> bool {
    let failures: Vec<&Outcome> = outcomes.iter().filter(|o| !o.success).collect();
    println!();
    if !failures.is_empty() {
        println!("failed ({}; their output is above):", failures.len());
        for outcome in &failures {
            println!("  {}", run::outcome_line(outcome, "filtered out"));
        }
        println!();
    }
    // Doc tests count under their crate (crate names use '_').
    let doc = outcomes.iter().find(|o| o.suite.package == DOC_TESTS);
    let doc_counts = doc.map(|o| run::doc_counts(&o.output)).unwrap_or_default();
    let mut total = Counts::default();
    let mut total_suites = 0;
    let mut skipped_binaries = 0;
    let mut skipped_tests = 0;
    let mut skipped_unknown = 0;
    println!(
        "summary ({}):",
        if quick.is_some() {
            "quick"
        } else {
            "all tests"
        }
    );
    for package in &workspace.packages {
        let mine: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| o.suite.package == package.name)
            .collect();
        let mut counts = Counts::default();
        let mut seconds = 0.0;
        for outcome in &mine {
            counts.add(outcome.counts);
            seconds += outcome.seconds;
        }
        let crate_name = package.name.replace('-', "_");
        let mut suites_run = mine.len();
        let mut ok = mine.iter().all(|o| o.success);
        for (name, c) in &doc_counts {
            if *name == crate_name {
                counts.add(*c);
                suites_run += 1;
                ok &= c.failed == 0;
            }
        }
        let mut skipped_note = String::new();
        if let Some(quick) = quick {
            let skipped: Vec<_> = quick
                .skipped
                .iter()
                .filter(|(p, _)| *p == package.name)
                .collect();
            if !skipped.is_empty() {
                let known: Vec<u64> = skipped
                    .iter()
                    .filter_map(|(p, t)| record.counts(p, &t.label()).map(|c| c.total()))
                    .collect();
                let tests: u64 = known.iter().sum();
                skipped_binaries += skipped.len();
                skipped_tests += tests;
                skipped_unknown += skipped.len() - known.len();
                skipped_note = format!(
                    "; skipped {}{}",
                    binaries_text(skipped.len()),
                    tests_when_last_run(tests, known.len(), skipped.len())
                );
            }
        }
        println!(
            "  {:<19} {:<6} {:>2} suites  {:<36} {:>9}{skipped_note}",
            package.name,
            match (ok, suites_run) {
                (_, 0) if !build_ok => "-",
                (true, _) => "ok",
                (false, _) => "FAILED",
            },
            suites_run,
            run::counts_text(counts, "skipped (server)"),
            run::duration(seconds)
        );
        total.add(counts);
        total_suites += suites_run;
    }
    let failed = !failures.is_empty() || !build_ok;
    let mut last = format!(
        "{}: {} tests in {total_suites} suites, {}",
        match (build_ok, failed) {
            (false, _) => "FAILED (the build failed: its errors are above)",
            (true, true) => "FAILED",
            (true, false) => "ok",
        },
        total.total() - total.filtered,
        run::counts_text(total, "skipped (server)")
    );
    if quick.is_some() {
        last += &format!(
            "; skipped {} that start a server{}",
            binaries_text(skipped_binaries),
            tests_when_last_run(
                skipped_tests,
                skipped_binaries - skipped_unknown,
                skipped_binaries
            )
        );
        if let Some(q) = quick
            && !q.built_not_run.is_empty()
        {
            let names: Vec<String> = q
                .built_not_run
                .iter()
                .map(|(p, t)| format!("{p} {}", t.label()))
                .collect();
            last += &format!(
                " ({} built but not run, as cargo selects tests by name: {})",
                names.len(),
                names.join(", ")
            );
        }
    }
    println!(
        "{last}. {} in all (build {}).",
        run::ago(started),
        run::duration(build_seconds)
    );
    failed
}

/// ` (305 tests when they last ran)`, saying how many of the binaries never ran here.
fn tests_when_last_run(tests: u64, known: usize, all: usize) -> String {
    match (known, all - known) {
        (0, _) => " (never run here, so their tests are not counted)".to_owned(),
        (_, 0) => format!(" ({} when they last ran)", tests_text(tests)),
        (_, never) => format!(
            " ({} when they last ran; {never} never ran here)",
            tests_text(tests)
        ),
    }
}

/// `1 binary`, `7 binaries`.
fn binaries_text(n: usize) -> String {
    format!("{n} {}", if n == 1 { "binary" } else { "binaries" })
}

/// `1 test`, `7 tests`.
fn tests_text(n: u64) -> String {
    format!("{n} {}", if n == 1 { "test" } else { "tests" })
}
