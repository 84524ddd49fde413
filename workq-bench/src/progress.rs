//! Progress on stderr: a spinner on a terminal, plain lines otherwise.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The progress of a run: one line that changes (what is being measured) and lines that stay
/// (each workload as it ends).
pub(crate) struct Progress {
    bar: ProgressBar,
}

impl Progress {
    pub(crate) fn new() -> Self {
        let bar = if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed:>3}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        } else {
            ProgressBar::hidden()
        };
        Self { bar }
    }

    /// Says what is being measured now.
    pub(crate) fn message(&self, message: String) {
        self.bar.set_message(message);
    }

    /// Prints a line that stays, above the spinner.
    pub(crate) fn line(&self, line: String) {
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    /// Clears the spinner.
    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
