//! The runtime the blocking commands run their work on.

use std::process::ExitCode;

/// Runs `work` on a two-thread runtime; reports its error as `COMMAND: ...` (control
/// characters escaped: an error may quote a server's or a queue's text).
pub(crate) fn block_on_as<E: std::fmt::Display>(
    command: &str,
    work: impl std::future::Future<Output = Result<ExitCode, E>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{command}: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{command}: {}", crate::queue::print::escape(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}
