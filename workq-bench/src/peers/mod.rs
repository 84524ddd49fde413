//! The references measured beside our queues on the same server: programs of their own that
//! speak the bench's protocol. The node programs (`node`: BullMQ, pg-boss) and the Rust crates
//! (`rust`: bullmq-official, apalis-redis, riverqueue, apalis-postgres, a workspace of their
//! own under `workq-bench/peers/`) take the same arguments, `WORKLOAD SIZE` or
//! `W7 MODE ITEMS PROCESSES WORKERS HANDLER_MS RATE`, read the server's URL from the
//! environment (a password stays out of the process list), and print one JSON object per
//! figure, `{"metric": ..., "value": ...}`, or `{"na": REASON}` for a workload they cannot
//! run.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::report::METRICS;

pub(crate) mod node;
pub(crate) mod rust;

/// How a peer's program is started.
pub(crate) enum Program {
    /// `node SCRIPT ARGS...`.
    Node(PathBuf),
    /// `EXE NAME ARGS...`: the Rust peers' program, which runs every one of them.
    Rust(PathBuf),
}

/// One reference, ready to run.
pub(crate) struct Peer {
    /// The `impl` of its figures.
    pub(crate) name: &'static str,
    /// The release measured.
    pub(crate) version: String,
    /// How it is set up (batch insert, concurrency, completion batching), for the report.
    pub(crate) settings: String,
    /// The workloads its program knows (`None`: all; the program says n/a itself).
    pub(crate) workloads: Option<&'static [&'static str]>,
    pub(crate) program: Program,
    /// The variable its program reads the server's URL from.
    pub(crate) url_var: &'static str,
}

/// What a peer's run gave.
#[derive(Debug, PartialEq)]
pub(crate) enum Outcome {
    /// Its figures, for the metrics the report knows.
    Figures(Vec<(&'static str, f64)>),
    /// It cannot run the workload, and why.
    NotApplicable(String),
}

impl Peer {
    /// Runs its program with `args` (the workload first) on the server at `url`.
    pub(crate) fn run(&self, url: &str, args: &[String]) -> Result<Outcome, String> {
        let workload = args.first().map(String::as_str).unwrap_or_default();
        if let Some(known) = self.workloads
            && !known.contains(&workload)
        {
            return Ok(Outcome::NotApplicable(format!(
                "{workload} is not in its program"
            )));
        }
        let mut command = match &self.program {
            Program::Node(script) => {
                let mut command = Command::new("node");
                command.arg(script);
                command
            }
            Program::Rust(exe) => {
                let mut command = Command::new(exe);
                command.arg(self.name);
                command
            }
        };
        let mut child = command
            .env(self.url_var, url)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        // The program's stderr still reaches ours as it comes (its progress), and its last
        // words are kept for the report of a failed run.
        let stderr = child.stderr.take().expect("piped");
        let relay = std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{line}");
                lines.push(line);
                if lines.len() > 64 {
                    lines.drain(..32);
                }
            }
            lines
        });
        let output = child.wait_with_output().map_err(|e| e.to_string())?;
        let lines = relay.join().unwrap_or_default();
        if !output.status.success() {
            return Err(match last_words(&lines) {
                // A program's error may quote the URL it was given, and the report is shared.
                Some(words) => format!(
                    "its program exited with {}: {}",
                    output.status,
                    workq::admin::redact_urls_in(&words)
                ),
                None => format!("its program exited with {}", output.status),
            });
        }
        Ok(parse(&String::from_utf8_lossy(&output.stdout)))
    }
}

/// The longest a failed program's last words may be in the report.
const LAST_WORDS: usize = 240;

/// What a failed program said last on stderr: its last line that says something, skipping
/// the runtimes' own trailers (Rust's hint to set `RUST_BACKTRACE`, node's version line, a
/// stack frame), cut to [`LAST_WORDS`] characters.
fn last_words(lines: &[String]) -> Option<String> {
    let said = lines.iter().rev().map(|l| l.trim()).find(|line| {
        !line.is_empty()
            && !line.starts_with("note: run with `RUST_BACKTRACE")
            && !line.starts_with("Node.js v")
            && !line.starts_with("at ")
            && !line.starts_with('^')
            && *line != "}"
    })?;
    Some(match said.char_indices().nth(LAST_WORDS) {
        Some((cut, _)) => format!("{}...", &said[..cut]),
        None => said.to_owned(),
    })
}

/// The figures (or the reason it cannot run) in a peer program's output.
fn parse(stdout: &str) -> Outcome {
    let mut figures = Vec::new();
    for line in stdout.lines() {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let Some(reason) = value["na"].as_str() {
            return Outcome::NotApplicable(reason.to_owned());
        }
        if let Some(metric) = METRICS
            .iter()
            .find(|m| Some(**m) == value["metric"].as_str())
        {
            figures.push((*metric, value["value"].as_f64().unwrap_or(f64::NAN)));
        }
    }
    Outcome::Figures(figures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_program_s_lines_read_back() {
        let out = "noise\n{\"workload\":\"W1\",\"impl\":\"x\",\"metric\":\"items_per_s\",\"value\":12.5}\n\
                   {\"metric\":\"unknown\",\"value\":1}\n";
        assert_eq!(parse(out), Outcome::Figures(vec![("items_per_s", 12.5)]));
        let na = "{\"workload\":\"W3\",\"impl\":\"x\",\"na\":\"no dedup\"}\n";
        assert_eq!(parse(na), Outcome::NotApplicable("no dedup".into()));
    }

    #[test]
    fn a_failed_program_s_last_words_skip_the_runtimes_trailers() {
        let lines = |text: &str| text.lines().map(str::to_owned).collect::<Vec<_>>();
        let rust = "thread 'main' panicked at src/river.rs:88:9:\n\
                    deadlock detected\n\
                    note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        assert_eq!(
            last_words(&lines(rust)).as_deref(),
            Some("deadlock detected")
        );
        let node =
            "Error: Connection is closed.\n    at close (redis.js:12:3)\n\nNode.js v20.20.2\n";
        assert_eq!(
            last_words(&lines(node)).as_deref(),
            Some("Error: Connection is closed.")
        );
        assert_eq!(last_words(&lines("\n\n")), None);
        let long = "x".repeat(1_000);
        let cut = last_words(&[long]).unwrap();
        assert_eq!(cut.chars().count(), LAST_WORDS + 3);
        // A cut never splits a character.
        assert!(last_words(&["é".repeat(500)]).unwrap().ends_with("é..."));
    }

    #[cfg(unix)]
    #[test]
    fn a_failed_program_is_reported_with_its_exit_and_its_last_words() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("wq-bench-peer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("peer.sh");
        std::fs::write(
            &exe,
            "#!/bin/sh\necho '{\"metric\":\"items_per_s\",\"value\":1}'\n\
             echo 'starting' >&2\necho \"$0 $1: the server refused: $WQ_REDIS_URL\" >&2\nexit 3\n",
        )
        .unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let peer = Peer {
            name: "apalis-redis",
            version: "0".into(),
            settings: String::new(),
            workloads: None,
            program: Program::Rust(exe.clone()),
            url_var: "WQ_REDIS_URL",
        };
        // A process another test forks while the script is being written holds it open for
        // writing until that process execs, and the kernel refuses to run it meanwhile
        // (ETXTBSY): try again.
        let args = ["W1".to_owned(), "10".to_owned()];
        let mut tries = 0;
        let error = loop {
            let error = peer
                .run("redis://bench:s3cret@127.0.0.1:1/", &args)
                .unwrap_err();
            tries += 1;
            if !error.contains("os error 26") || tries == 20 {
                break error;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            error.starts_with("its program exited with exit status: 3: "),
            "{error}"
        );
        assert!(
            error.ends_with("apalis-redis: the server refused: redis://***@127.0.0.1:1/"),
            "{error}"
        );
    }

    #[test]
    fn a_workload_its_program_does_not_know_is_not_applicable() {
        let peer = Peer {
            name: "bullmq",
            version: "0".into(),
            settings: String::new(),
            workloads: Some(&["W1"]),
            program: Program::Node(PathBuf::from("/nonexistent.mjs")),
            url_var: "WQ_REDIS_URL",
        };
        assert!(matches!(
            peer.run("redis://127.0.0.1:1/", &["W3P".into(), "10".into()]),
            Ok(Outcome::NotApplicable(reason)) if reason.contains("W3P")
        ));
    }
}
