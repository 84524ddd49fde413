//! The references measured beside our queues on the same server: programs of their own that
//! speak the bench's protocol. The node programs (`node`: BullMQ, pg-boss) and the Rust crates
//! (`rust`: bullmq-official, apalis-redis, riverqueue, apalis-postgres, a workspace of their
//! own under `workq-bench/peers/`) take the same arguments, `WORKLOAD SIZE` or
//! `W7 MODE ITEMS PROCESSES WORKERS HANDLER_MS RATE`, read the server's URL from the
//! environment (a password stays out of the process list), and print one JSON object per
//! figure, `{"metric": ..., "value": ...}`, or `{"na": REASON}` for a workload they cannot
//! run.

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
        let output = command
            .env(self.url_var, url)
            .args(args)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| e.to_string())?;
        if !output.status.success() {
            return Err(format!("its program exited with {}", output.status));
        }
        Ok(parse(&String::from_utf8_lossy(&output.stdout)))
    }
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
