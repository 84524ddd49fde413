//! `wq-bench`: the standard workloads of the project's benchmark notes, each beside its
//! references, in one run.
//!
//! In memory (the default) the workloads are W1-W8 (`memory/`, `fleet` and `noisy`), P1
//! (priorities) and P2-P4 (controller-runtime's priority-queue benchmarks), and W3R (W3 at a
//! fixed consumer rate). With `--redis URL` and/or `--postgres URL` they are W1, W3, W3P, W4,
//! W7 and W8 on our queues on those servers (`distributed`, `fleet`, `noisy`) beside the
//! references that live on the same kind of server: the node programs BullMQ and pg-boss
//! (`peers::node`), and with `--compare` the Rust crates `bullmq-official`, `apalis-redis`,
//! `riverqueue` and `apalis-postgres` (`peers::rust`, a workspace of their own under
//! `peers/`). W7S, W7's scaling sweep, runs on a server when named or with `--plot DIR`
//! (unless W7B is named); W7B, River's burn-down, when named or with `--compare`, and with
//! `--plot DIR` it has a plot of its own (`fleet::plot`).
//!
//! A workload returns [`report::Sample`]s (one number per implementation and metric); with
//! `--runs N` every workload runs N times and the report holds the median of each figure.
//! Progress goes to stderr, one line per workload; the tables (or, with `--json`, one JSON
//! object per line and figure) go to stdout. Nothing here is a pass/fail test: the goals of
//! the project are shown beside the figures for orientation only.

use std::process::ExitCode;

use clap::Parser;

mod args;
mod ctx;
mod distributed;
mod fleet;
mod memory;
mod noisy;
mod peers;
mod profile;
mod progress;
mod report;
mod run;
mod server;
mod util;
mod workloads;

use args::Args;

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(case) = &args.w6_child {
        return memory::w6_memory::child(case, args.w6_items);
    }
    if let Some(spec) = &args.fleet_worker {
        return fleet::worker::run(spec);
    }
    run::run(&args)
}
