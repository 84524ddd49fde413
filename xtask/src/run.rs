//! One test suite (a test binary, or the doc tests): running it with its output captured,
//! reading libtest's summary lines, and printing counts and times.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// A suite to run.
#[derive(Debug, Clone)]
pub(crate) struct Suite {
    /// Its package; the doc tests of every package run as one suite, [`DOC_TESTS`].
    pub(crate) package: String,
    /// `tests/crash.rs`, `unittests src/lib.rs`, `doc tests`.
    pub(crate) label: String,
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    /// The working directory: the package's, as under `cargo test`.
    pub(crate) dir: PathBuf,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) env_remove: Vec<String>,
    /// An integration test: it may run the package's binaries (`CARGO_BIN_EXE_*`), which
    /// cargo builds alongside, so it waits until they are in place.
    pub(crate) runs_bins: bool,
    /// Runs with no other suite beside it, after the build.
    pub(crate) alone: bool,
}

/// The package name under which the doc tests of all packages run.
pub(crate) const DOC_TESTS: &str = "(doc tests)";

/// libtest's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) passed: u64,
    pub(crate) failed: u64,
    pub(crate) ignored: u64,
    /// Left out by a filter: in the quick run, the tests that start a server.
    pub(crate) filtered: u64,
}

impl Counts {
    pub(crate) fn add(&mut self, other: Counts) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.ignored += other.ignored;
        self.filtered += other.filtered;
    }

    /// Every test the binary holds.
    pub(crate) fn total(&self) -> u64 {
        self.passed + self.failed + self.ignored + self.filtered
    }
}

/// Reads libtest's `test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 2 filtered
/// out; finished in 0.01s`.
pub(crate) fn result_line(line: &str) -> Option<Counts> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let (_, rest) = rest.split_once(". ")?;
    let mut counts = Counts::default();
    for part in rest.split(';') {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        match what {
            "passed" => counts.passed = n,
            "failed" => counts.failed = n,
            "ignored" => counts.ignored = n,
            "filtered" => counts.filtered = n,
            _ => {}
        }
    }
    Some(counts)
}

/// The binary's counts: its last `test result` line (a test may run child processes of the
/// binary that print their own first).
pub(crate) fn binary_counts(output: &str) -> Option<Counts> {
    output.lines().rev().find_map(result_line)
}

/// The doc tests' counts per crate (`Doc-tests workq_redis` heads each crate's).
pub(crate) fn doc_counts(output: &str) -> Vec<(String, Counts)> {
    let mut crates: Vec<(String, Counts)> = Vec::new();
    let mut current: Option<String> = None;
    for line in output.lines() {
        if let Some(name) = line.trim().strip_prefix("Doc-tests ") {
            current = Some(name.trim().to_owned());
        } else if let Some(counts) = result_line(line)
            && let Some(name) = current.take()
        {
            crates.push((name, counts));
        }
    }
    crates
}

/// What a suite did.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub(crate) suite: Suite,
    pub(crate) counts: Counts,
    /// Wall time.
    pub(crate) seconds: f64,
    /// Exit code 0 and libtest's summary says ok.
    pub(crate) success: bool,
    /// How it ended, when not with a summary: `exit status: 101`, `no test summary`.
    pub(crate) ending: String,
    /// stdout and stderr, interleaved as written.
    pub(crate) output: String,
}

/// How long the output is read after the suite's process ended: a process it left behind
/// may hold the output open (what it prints after that is not waited for).
const LINGER: Duration = Duration::from_secs(10);

/// Runs `suite` to the end, its stdout and stderr into one captured stream.
pub(crate) fn run(suite: Suite) -> Outcome {
    run_with(suite, LINGER)
}

fn run_with(suite: Suite, linger: Duration) -> Outcome {
    let started = Instant::now();
    let result = (|| -> std::io::Result<(std::process::ExitStatus, Vec<u8>)> {
        let (mut reader, writer) = std::io::pipe()?;
        let mut command = Command::new(&suite.program);
        command
            .args(&suite.args)
            .current_dir(&suite.dir)
            .envs(suite.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(writer.try_clone()?)
            .stderr(writer);
        for var in &suite.env_remove {
            command.env_remove(var);
        }
        let mut child = command.spawn()?;
        // The pipe's write ends now live in the child (and its children) only.
        drop(command);
        let output = Arc::new(Mutex::new(Vec::new()));
        let (eof, ended) = mpsc::channel();
        std::thread::spawn({
            let output = output.clone();
            move || {
                let mut chunk = [0; 8192];
                while let Ok(n @ 1..) = reader.read(&mut chunk) {
                    output
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend_from_slice(&chunk[..n]);
                }
                let _ = eof.send(());
            }
        });
        let status = child.wait()?;
        let lingering = ended.recv_timeout(linger).is_err();
        let mut output = std::mem::take(&mut *output.lock().unwrap_or_else(|e| e.into_inner()));
        if lingering {
            output.extend_from_slice(
                b"\n(xtask: a process the suite left behind still holds its output open)\n",
            );
        }
        Ok((status, output))
    })();
    let seconds = started.elapsed().as_secs_f64();
    let (status, output) = match result {
        Ok((status, output)) => (Some(status), String::from_utf8_lossy(&output).into_owned()),
        Err(e) => (None, format!("cannot run {}: {e}", suite.program.display())),
    };
    let counts = if suite.package == DOC_TESTS {
        let mut all = Counts::default();
        for (_, counts) in doc_counts(&output) {
            all.add(counts);
        }
        Some(all).filter(|c| c.total() > 0 || output.contains("test result"))
    } else {
        binary_counts(&output)
    };
    let exited_ok = status.is_some_and(|s| s.success());
    let ending = match (status, counts) {
        (None, _) => "did not start".to_owned(),
        (Some(status), _) if !status.success() => status.to_string(),
        (Some(_), None) => "no test summary".to_owned(),
        _ => String::new(),
    };
    Outcome {
        success: exited_ok && counts.is_some_and(|c| c.failed == 0),
        counts: counts.unwrap_or_default(),
        seconds,
        ending,
        output,
        suite,
    }
}

/// `0.4 s`, `12 s`, `3 m 05 s`.
pub(crate) fn duration(seconds: f64) -> String {
    if seconds < 10.0 {
        format!("{seconds:.1} s")
    } else if seconds < 60.0 {
        format!("{seconds:.0} s")
    } else {
        let whole = seconds.round() as u64;
        format!("{} m {:02} s", whole / 60, whole % 60)
    }
}

/// `12 passed, 1 ignored, 2 failed`.
pub(crate) fn counts_text(counts: Counts, filtered_as: &str) -> String {
    let mut text = format!("{} passed", counts.passed);
    if counts.failed > 0 {
        let _ = write!(text, ", {} failed", counts.failed);
    }
    if counts.ignored > 0 {
        let _ = write!(text, ", {} ignored", counts.ignored);
    }
    if counts.filtered > 0 {
        let _ = write!(text, ", {} {filtered_as}", counts.filtered);
    }
    text
}

/// The line printed when a suite ends.
pub(crate) fn outcome_line(outcome: &Outcome, filtered_as: &str) -> String {
    let status = if outcome.success { "ok" } else { "FAILED" };
    let mut counts = counts_text(outcome.counts, filtered_as);
    if !outcome.ending.is_empty() {
        let _ = write!(counts, " ({})", outcome.ending);
    }
    format!(
        "  {status:<6} {:<19} {:<26} {counts:<34} {:>9}",
        outcome.suite.package,
        outcome.suite.label,
        duration(outcome.seconds)
    )
}

/// Each suite's time and counts when it last ran (`target/xtask/suites.tsv`): the order of the
/// next run (longest first), and the quick run's count of what it skipped.
#[derive(Debug, Default)]
pub(crate) struct Record {
    path: PathBuf,
    /// (package, label) -> (seconds, counts).
    pub(crate) suites: HashMap<(String, String), (f64, Counts)>,
}

impl Record {
    pub(crate) fn load(path: &Path) -> Record {
        let mut record = Record {
            path: path.to_path_buf(),
            suites: HashMap::new(),
        };
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text.lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            let [package, label, seconds, passed, failed, ignored, filtered] = fields[..] else {
                continue;
            };
            let n = |s: &str| s.parse::<u64>().unwrap_or(0);
            record.suites.insert(
                (package.to_owned(), label.to_owned()),
                (
                    seconds.parse().unwrap_or(0.0),
                    Counts {
                        passed: n(passed),
                        failed: n(failed),
                        ignored: n(ignored),
                        filtered: n(filtered),
                    },
                ),
            );
        }
        record
    }

    pub(crate) fn seconds(&self, package: &str, label: &str) -> Option<f64> {
        self.suites
            .get(&(package.to_owned(), label.to_owned()))
            .map(|(s, _)| *s)
    }

    pub(crate) fn counts(&self, package: &str, label: &str) -> Option<Counts> {
        self.suites
            .get(&(package.to_owned(), label.to_owned()))
            .map(|(_, c)| *c)
    }

    pub(crate) fn update(&mut self, outcome: &Outcome) {
        self.suites.insert(
            (outcome.suite.package.clone(), outcome.suite.label.clone()),
            (outcome.seconds, outcome.counts),
        );
    }

    /// Writes the record (best effort: it only orders and counts).
    pub(crate) fn save(&self) {
        let mut lines: Vec<String> = self
            .suites
            .iter()
            .map(|((package, label), (seconds, c))| {
                format!(
                    "{package}\t{label}\t{seconds:.2}\t{}\t{}\t{}\t{}",
                    c.passed, c.failed, c.ignored, c.filtered
                )
            })
            .collect();
        lines.sort();
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = std::fs::write(&self.path, lines.join("\n") + "\n");
    }
}

/// How long ago `since` was, for progress lines.
pub(crate) fn ago(since: Instant) -> String {
    duration(since.elapsed().as_secs_f64())
}

/// A pause between progress lines while nothing else is printed.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libtest_summaries() {
        assert_eq!(
            result_line(
                "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 3 filtered out; \
                 finished in 0.52s"
            ),
            Some(Counts {
                passed: 12,
                failed: 0,
                ignored: 1,
                filtered: 3
            })
        );
        assert_eq!(
            result_line(
                "test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out"
            ),
            Some(Counts {
                passed: 1,
                failed: 2,
                ..Counts::default()
            })
        );
        assert_eq!(result_line("test it ... ok"), None);
    }

    #[test]
    fn a_binary_counts_by_its_last_summary() {
        // A test that runs the binary again as a child prints the child's summary first.
        let output = "running 2 tests\n\
            test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 8 filtered out\n\
            test leaks ... ok\n\
            test result: ok. 9 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n";
        assert_eq!(binary_counts(output).unwrap().passed, 9);
        assert_eq!(binary_counts("thread 'main' panicked"), None);
    }

    #[test]
    fn doc_tests_count_per_crate() {
        let output = "   Doc-tests workq\n\nrunning 3 tests\n...\n\
            test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.9s\n\
            all doctests ran in 0.94s\n   Doc-tests workq_redis\n\nrunning 0 tests\n\
            test result: ok. 0 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out\n";
        let crates = doc_counts(output);
        assert_eq!(crates.len(), 2);
        assert_eq!(crates[0].0, "workq");
        assert_eq!(crates[0].1.passed, 3);
        assert_eq!(crates[1].0, "workq_redis");
        assert_eq!(crates[1].1.ignored, 2);
    }

    fn suite(program: &str, args: &[&str]) -> Suite {
        Suite {
            package: "p".into(),
            label: "tests/t.rs".into(),
            program: program.into(),
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            dir: std::env::temp_dir(),
            env: vec![("XTASK_TEST_VAR".into(), "set".into())],
            env_remove: vec!["HOME".into()],
            runs_bins: false,
            alone: false,
        }
    }

    #[test]
    fn a_suite_passes_only_with_exit_code_zero_and_a_clean_summary() {
        let ok = "echo running 1 test; echo \"var $XTASK_TEST_VAR home ${HOME:-unset}\" >&2; \
                  echo 'test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out'";
        let outcome = run(suite("sh", &["-c", ok]));
        assert!(outcome.success, "{}", outcome.output);
        assert_eq!(outcome.counts.passed, 1);
        // Both streams, the environment given, and the variable removed.
        assert!(
            outcome.output.contains("var set home unset"),
            "{}",
            outcome.output
        );

        let crashed = "echo 'test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out'; exit 3";
        let outcome = run(suite("sh", &["-c", crashed]));
        assert!(!outcome.success);
        assert!(outcome.ending.contains('3'), "{}", outcome.ending);

        let silent = run(suite("sh", &["-c", "true"]));
        assert!(!silent.success);
        assert_eq!(silent.ending, "no test summary");

        let failed =
            "echo 'test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out'";
        assert!(!run(suite("sh", &["-c", failed])).success);

        let missing = run(suite("/nonexistent/binary", &[]));
        assert!(!missing.success);
        assert!(missing.output.contains("cannot run"), "{}", missing.output);
    }

    #[test]
    fn a_process_left_behind_holding_the_output_is_not_waited_for_long() {
        let summary =
            "echo 'test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out'";
        // Output written shortly after the suite's process ends is kept.
        let outcome = run(suite(
            "sh",
            &["-c", &format!("(sleep 1; echo late) & {summary}")],
        ));
        assert!(outcome.success);
        assert!(outcome.output.contains("late"), "{}", outcome.output);
        // A process holding the output open longer is left to itself.
        let started = Instant::now();
        let outcome = run_with(
            suite("sh", &["-c", &format!("(sleep 20) & {summary}")]),
            Duration::from_millis(300),
        );
        assert!(outcome.success);
        assert!(started.elapsed() < Duration::from_secs(15));
        assert!(outcome.output.contains("left behind"), "{}", outcome.output);
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(duration(0.04), "0.0 s");
        assert_eq!(duration(9.94), "9.9 s");
        assert_eq!(duration(42.4), "42 s");
        assert_eq!(duration(185.0), "3 m 05 s");
    }

    #[test]
    fn the_record_keeps_times_and_counts() {
        let path = std::env::temp_dir().join(format!("xtask-record-{}.tsv", std::process::id()));
        let mut record = Record::load(&path);
        assert!(record.suites.is_empty());
        let mut outcome = run(suite(
            "sh",
            &[
                "-c",
                "echo 'test result: ok. 4 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out'",
            ],
        ));
        outcome.seconds = 12.5;
        record.update(&outcome);
        record.save();
        let again = Record::load(&path);
        assert_eq!(again.seconds("p", "tests/t.rs"), Some(12.5));
        assert_eq!(again.counts("p", "tests/t.rs").unwrap().total(), 5);
        assert_eq!(again.seconds("p", "tests/other.rs"), None);
        let _ = std::fs::remove_file(&path);
    }
}
