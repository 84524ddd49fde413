//! `wq bench`: the standard workloads (BENCH.md).

use std::process::ExitCode;

/// Options of `wq bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {}

/// Runs the benchmarks.
pub(crate) fn run(_args: BenchArgs) -> ExitCode {
    ExitCode::SUCCESS
}
