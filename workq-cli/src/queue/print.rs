//! What `wq queue` prints as text: a queue's figures, the list of queues, dead letters.
//! Every text that comes from a server (items, queue names, errors) goes through
//! [`escape`] first, so that no stored text can move the cursor, recolour or clear the
//! operator's terminal, or make one line read as another.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use workq::admin::{DeadLetter, QueueSummary, ServerStatus, Stats};

/// `text` with its control characters (C0, DEL, C1: escape sequences, carriage returns,
/// backspaces, new lines) and the invisible characters that reorder or hide text
/// (bidirectional overrides and isolates, zero-width marks) written as Rust escapes
/// (`\n`, `\u{1b}`), the rest as it is.
pub(crate) fn escape(text: &str) -> Cow<'_, str> {
    // `char::escape_debug` would also escape quotes and backslashes, which JSON items are
    // full of; only what a terminal acts on, or hides, is escaped.
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
    };
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hidden(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// One of `summary`'s counts: past the backend's cap, `CAP+` (more than that).
fn count(n: u64, summary: &QueueSummary) -> String {
    match summary.capped_at {
        Some(cap) if summary.is_capped(n) => format!("{cap}+"),
        _ => n.to_string(),
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// Milliseconds since the Unix epoch.
fn unix_ms(at: SystemTime) -> u128 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// A queue's figures as aligned text; `resume` is the command that ends a shut down or a
/// pause.
pub(crate) fn stats(stats: &Stats, resume: &str) -> String {
    let s = &stats.summary;
    let mut out = String::new();
    let _ = writeln!(out, "queue          {}", escape(&s.name));
    let _ = writeln!(out, "depth          {}", count(s.depth, s));
    let next = stats
        .next_delayed_in
        .map(|d| format!(" (next due in {})", secs(d)))
        .unwrap_or_default();
    let _ = writeln!(out, "delayed        {}{next}", count(s.delayed, s));
    let _ = writeln!(
        out,
        "in flight      {} ({} re-added while processing)",
        count(s.in_flight, s),
        s.in_flight_dirty
    );
    for l in &stats.leases {
        let _ = writeln!(
            out,
            "    {}  age {}  lease expires in {}  token {}",
            escape(&l.item),
            secs(l.lease.age),
            secs(l.lease.expires_in),
            l.lease.token
        );
    }
    let listed = u64::try_from(stats.leases.len()).unwrap_or(u64::MAX);
    if s.is_capped(s.in_flight) {
        let _ = writeln!(out, "    ... more");
    } else if listed < s.in_flight {
        let _ = writeln!(out, "    ... {} more", s.in_flight - listed);
    }
    let _ = writeln!(out, "failures       {} items tracked", count(s.failing, s));
    for (item, count) in &stats.failures {
        let _ = writeln!(out, "    {}  {count} requeues", escape(item));
    }
    let _ = writeln!(
        out,
        "stalled        {} items (leases reclaimed)",
        count(s.stalled, s)
    );
    let _ = writeln!(
        out,
        "dead letters   {} ({} dropped by the cap)",
        count(s.dead, s),
        s.dead_dropped
    );
    let flag = |on: bool| {
        if on {
            format!("yes, for every process ({resume} QUEUE)")
        } else {
            "no".to_owned()
        }
    };
    let _ = writeln!(out, "shut down      {}", flag(s.shut_down));
    let _ = writeln!(out, "paused         {}", flag(s.paused));
    out
}

/// The server's durability settings and warnings, one line each.
pub(crate) fn server(status: &ServerStatus) -> String {
    let mut out = String::new();
    if let Some(details) = &status.details {
        let _ = writeln!(out, "server         {}", escape(details));
    }
    for warning in &status.warnings {
        let _ = writeln!(out, "warning        {}", escape(warning));
    }
    out
}

/// Every queue, one line each.
pub(crate) fn list(queues: &[QueueSummary]) -> String {
    let mut out = format!(
        "{:<40} {:>10} {:>10} {:>10} {:>10}\n",
        "queue", "depth", "delayed", "in flight", "dead"
    );
    for q in queues {
        let state = match (&q.broken, q.shut_down, q.paused) {
            (Some(why), _, _) => format!("  broken: {}", escape(why)),
            (None, true, _) => "  shut down".to_owned(),
            (None, false, true) => "  paused".to_owned(),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{:<40} {:>10} {:>10} {:>10} {:>10}{state}",
            escape(&q.name),
            count(q.depth, q),
            count(q.delayed, q),
            count(q.in_flight, q),
            count(q.dead, q)
        );
    }
    out
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

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn what_a_terminal_acts_on_is_escaped_and_json_is_left_alone() {
        assert_eq!(escape(r#"{"a":"b\n"}"#), r#"{"a":"b\n"}"#);
        assert_eq!(escape("red\u{1b}[31m"), "red\\u{1b}[31m");
        assert_eq!(escape("a\nb\rc\u{8}"), "a\\nb\\rc\\u{8}");
        assert_eq!(escape("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        assert_eq!(escape("\u{9b}2J"), "\\u{9b}2J");
        assert_eq!(escape("é ü 漢"), "é ü 漢");
    }
}
