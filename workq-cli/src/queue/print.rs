//! What `wq queue` prints of dead letters; the rest of its text is
//! [`workq_dashboard::text`]'s, which escapes every text from a server ([`escape`]).

use std::fmt::Write as _;
use std::time::SystemTime;

use workq::admin::DeadLetter;
pub(crate) use workq_dashboard::text::escape;

/// Milliseconds since the Unix epoch.
fn unix_ms(at: SystemTime) -> u128 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// A dead letter's id as `dead-letters requeue` and `delete` take it: as it is when it is
/// one plain word (PostgreSQL's numbers), shell-quoted otherwise (Redis's stored entries),
/// so that it can be pasted into the next command.
fn id_of(letter: &DeadLetter) -> String {
    match shlex::try_quote(&letter.id) {
        Ok(quoted) => escape(&quoted).into_owned(),
        // A NUL byte, which no shell passes: shown escaped.
        Err(_) => escape(&letter.id).into_owned(),
    }
}

/// Dead letters, one line each: `ID  ITEM  ERROR  (stalls n, failures n, at MS ms)`.
pub(crate) fn letters(letters: &[DeadLetter]) -> String {
    let mut out = String::new();
    for l in letters {
        let _ = writeln!(
            out,
            "{}  {}  {}  (stalls {}, failures {}, at {} ms)",
            id_of(l),
            escape(&l.item),
            escape(&l.error),
            l.stalls,
            l.failures,
            unix_ms(l.at)
        );
    }
    out
}
