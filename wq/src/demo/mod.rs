//! `wq demo`: a simulated controller.

use std::process::ExitCode;

/// Options of `wq demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {}

/// Runs the demo.
pub(crate) fn run(_args: DemoArgs) -> ExitCode {
    ExitCode::SUCCESS
}
