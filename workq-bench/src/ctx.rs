//! What a workload gets to know about the run: [`Ctx`].

use crate::fleet::choice::Choice;
use crate::progress::Progress;
use crate::server::Server;

/// What a workload gets to know about the run.
pub(crate) struct Ctx<'a> {
    /// Smaller sizes (`--quick`).
    pub(crate) quick: bool,
    /// The Redis or PostgreSQL server, for a workload on a server.
    pub(crate) server: Option<&'a Server>,
    /// W7's shapes as the options chose them (empty: the workload's defaults).
    pub(crate) fleet: Choice,
    /// W8's burst as `--w8-burst` chose it (`None`: the workload's default).
    pub(crate) w8_burst: Option<usize>,
    /// Whether to profile the server per item (`--profile`).
    pub(crate) profile: bool,
    /// This run's number, from 1.
    pub(crate) run: u32,
    /// Runs in all.
    pub(crate) runs: u32,
    /// The workload's id, for progress messages.
    pub(crate) id: &'static str,
    /// The progress spinner.
    pub(crate) progress: &'a Progress,
}

impl Ctx<'_> {
    /// Says on the progress line which implementation is being measured.
    pub(crate) fn step(&self, what: &str) {
        let on = self
            .server
            .map(|s| format!(" on {}", s.backend.name()))
            .unwrap_or_default();
        self.progress.message(format!(
            "{}{on} run {}/{}: {what}",
            self.id, self.run, self.runs
        ));
    }
}
