//! The figures as text for people, one place for the dashboard and `wq queue`: the instants
//! the page shows of a schedule ([`instant`]), and what `wq queue` prints (a queue's figures
//! with its groups, limits and schedules, the list of queues, a server's settings).
//!
//! Every text that comes from a server (items, queue, group and schedule names, errors) goes
//! through [`escape`] first, so that no stored text can move the cursor, recolour or clear an
//! operator's terminal, or make one line read as another.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use workq::admin::{QueueSummary, ServerStatus, Stats};
use workq::periodic::ScheduleInfo;

/// `text` with its control characters (C0, DEL, C1: escape sequences, carriage returns,
/// backspaces, new lines) and the invisible characters that reorder or hide text
/// (bidirectional overrides and isolates, zero-width marks) written as Rust escapes
/// (`\n`, `\u{1b}`), the rest as it is.
pub fn escape(text: &str) -> Cow<'_, str> {
    // `char::escape_debug` would also escape quotes and backslashes, which JSON items are
    // full of; only what a terminal acts on, or hides, is escaped.
    escape_as(text, |c, out| out.extend(c.escape_default()))
}

/// JSON text (as `serde_json` writes it, pretty or not) with the characters [`escape`]
/// escapes written as JSON escapes (`\u202e`), so that it stays JSON: `serde_json` escapes
/// the C0 controls inside strings itself (the new lines and tabs left are a pretty layout's,
/// kept), and writes DEL, C1 and the invisible ones as they are, which only appear inside
/// strings.
pub fn escape_json(json: &str) -> Cow<'_, str> {
    escape_as(json, |c, out| {
        if matches!(c, '\n' | '\r' | '\t') {
            out.push(c);
            return;
        }
        let mut units = [0u16; 2];
        for unit in c.encode_utf16(&mut units) {
            out.push_str(&format!("\\u{unit:04x}"));
        }
    })
}

/// `text` with each character a terminal acts on, or hides, written by `write`.
fn escape_as(text: &str, write: impl Fn(char, &mut String)) -> Cow<'_, str> {
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
            write(c, &mut out);
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

/// An instant in UTC to the second, as RFC 3339 writes it: `2026-03-29T01:00:00Z`; `None`
/// for one that RFC 3339 cannot write (past the year 9999).
///
/// ```
/// use std::time::{Duration, SystemTime};
///
/// let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_999);
/// assert_eq!(
///     workq_dashboard::text::instant(at).as_deref(),
///     Some("2023-11-14T22:13:20Z")
/// );
/// ```
pub fn instant(at: SystemTime) -> Option<String> {
    let at = jiff::Timestamp::try_from(at).ok()?;
    Some(format!("{at:.0}"))
}

/// An instant as [`instant`] writes it; `-` for none.
fn at(t: Option<SystemTime>) -> String {
    t.and_then(instant).unwrap_or_else(|| "-".to_owned())
}

/// `rows` under `head` in columns two spaces apart (each as wide as its widest cell), each
/// line indented by `indent`. The cells are written as they are: escape what came from a
/// server first.
pub fn table<const N: usize>(indent: &str, head: [&str; N], rows: &[[String; N]]) -> String {
    let mut widths = head.map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(head.map(str::to_owned)).chain(rows.iter().cloned()) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{indent}{}", cells.join("  ").trim_end());
    }
    out
}

/// A queue's periodic schedules, one line each under a head: name, spec, time zone, next
/// tick, last tick taken, paused or running, since; each line indented by `indent`.
pub fn schedules(indent: &str, list: &[ScheduleInfo]) -> String {
    let rows: Vec<[String; 7]> = list
        .iter()
        .map(|s| {
            let state = if s.paused { "paused" } else { "running" };
            [
                escape(&s.name).into_owned(),
                escape(&s.spec).into_owned(),
                escape(s.time_zone().unwrap_or("-")).into_owned(),
                at(s.next_tick),
                at(s.last_tick),
                state.to_owned(),
                at(Some(s.since)),
            ]
        })
        .collect();
    let head = [
        "name",
        "schedule",
        "time zone",
        "next tick",
        "last tick taken",
        "state",
        "since",
    ];
    table(indent, head, &rows)
}

/// A queue's flow control: its groups at a glance and those listed, and its limits.
fn flow(out: &mut String, stats: &Stats) {
    if let Some(f) = &stats.flow {
        let _ = writeln!(
            out,
            "groups         {} kept, {} with ready items, {} at their limit",
            f.groups, f.groups_ready, f.groups_saturated
        );
        let rows: Vec<[String; 5]> = stats
            .groups
            .iter()
            .map(|g| {
                [
                    escape(&g.name).into_owned(),
                    g.ready.to_string(),
                    g.in_flight.to_string(),
                    g.limit.map_or_else(|| "none".to_owned(), |n| n.to_string()),
                    g.oldest_ready.map(secs).unwrap_or_default(),
                ]
            })
            .collect();
        let head = ["group", "ready", "in flight", "limit", "oldest waiting"];
        out.push_str(&table("    ", head, &rows));
        if f.groups > rows.len() {
            let _ = writeln!(out, "    ... of {} kept (--groups N lists more)", f.groups);
        }
    }
    let described = stats
        .limits
        .as_ref()
        .map(|l| l.described())
        .unwrap_or_default();
    for (i, (what, setting)) in described.iter().enumerate() {
        let label = if i == 0 { "limits" } else { "" };
        let _ = writeln!(out, "{label:<15}{what}: {}", escape(setting));
    }
}

/// A queue's figures as aligned text, with its groups and limits where it has flow control;
/// `resume` is the command that ends a shut down or a pause, for the operator to read.
pub fn stats(stats: &Stats, resume: &str) -> String {
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
    flow(&mut out, stats);
    out
}

/// The server's durability settings and warnings, one line each.
pub fn server(status: &ServerStatus) -> String {
    let mut out = String::new();
    if let Some(details) = &status.details {
        let _ = writeln!(out, "server         {}", escape(details));
    }
    for warning in &status.warnings {
        let _ = writeln!(out, "warning        {}", escape(warning));
    }
    out
}

/// Every queue, one line each: name, depth, delayed, in flight, dead letters, and whether it
/// is broken, shut down or paused.
pub fn queues(queues: &[QueueSummary]) -> String {
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use workq::admin::{QueueSummary, Stats};
    use workq::flow::FlowControl;
    use workq::periodic::ScheduleInfo;
    use workq::{FlowStats, GroupStats};

    use super::{escape, escape_json, instant, schedules, stats};

    #[test]
    fn a_queue_with_flow_control_lists_its_groups_and_its_limits() {
        let mut s = Stats::new(QueueSummary::named("tenants"));
        s.flow = Some(FlowStats::new(5, 3, 1));
        let mut noisy = GroupStats::new("noisy", 3, 1, Some(1));
        noisy.oldest_ready = Some(Duration::from_millis(2500));
        s.groups = vec![noisy, GroupStats::new("a\u{1b}[2Jb", 1, 0, None)];
        let flow: FlowControl<String> = FlowControl::new()
            .group_by(String::clone)
            .max_in_flight_per_group(1)
            .hand_out_rate(50.0, 10);
        s.limits = Some(flow.limits().clone());
        let text = stats(&s, "wq queue resume");
        let tail: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("groups"))
            .collect();
        assert_eq!(
            tail,
            [
                "groups         5 kept, 3 with ready items, 1 at their limit",
                "    group        ready  in flight  limit  oldest waiting",
                "    noisy        3      1          1      2.5 s",
                "    a\\u{1b}[2Jb  1      0          none",
                "    ... of 5 kept (--groups N lists more)",
                "limits         groups: by the queue's group function, taking turns",
                "               in flight per group: at most 1",
                "               hand-out rate: 50/s, burst 10",
            ],
            "{text}"
        );
        let plain = stats(&Stats::new(QueueSummary::named("plain")), "wq queue resume");
        assert!(
            !plain.contains("groups") && !plain.contains("limits"),
            "{plain}"
        );
    }

    #[test]
    fn schedules_are_listed_with_their_zone_ticks_and_state() {
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s);
        let mut nightly = ScheduleInfo::new("nightly", at(0));
        nightly.spec = "cron 0 3 * * * (Europe/Paris)".to_owned();
        nightly.next_tick = Some(at(3600));
        nightly.paused = true;
        let mut hostile = ScheduleInfo::new("x\u{202e}y", at(0));
        hostile.spec = "every 1m".to_owned();
        hostile.last_tick = Some(at(60));
        let text = schedules("  ", &[nightly, hostile]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "  name        schedule                       time zone     next tick             \
                 last tick taken       state    since",
                "  nightly     cron 0 3 * * * (Europe/Paris)  Europe/Paris  2023-11-14T23:13:20Z  \
                 -                     paused   2023-11-14T22:13:20Z",
                "  x\\u{202e}y  every 1m                       -             -                     \
                 2023-11-14T22:14:20Z  running  2023-11-14T22:13:20Z",
            ]
        );
        assert_eq!(
            instant(SystemTime::UNIX_EPOCH).as_deref(),
            Some("1970-01-01T00:00:00Z")
        );
    }

    #[test]
    fn what_a_terminal_acts_on_is_escaped_and_json_is_left_alone() {
        assert_eq!(escape(r#"{"a":"b\n"}"#), r#"{"a":"b\n"}"#);
        assert_eq!(escape("red\u{1b}[31m"), "red\\u{1b}[31m");
        assert_eq!(escape("a\nb\rc\u{8}"), "a\\nb\\rc\\u{8}");
        assert_eq!(escape("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        assert_eq!(escape("\u{9b}2J"), "\\u{9b}2J");
        assert_eq!(escape("é ü 漢"), "é ü 漢");
    }

    #[test]
    fn json_stays_json_with_what_a_terminal_acts_on_escaped() {
        let value = serde_json::json!({"item": "evil\u{202e}txt\u{9b}2J\u{1b}[31m\u{7f}"});
        let text = serde_json::to_string(&value).unwrap();
        let escaped = escape_json(&text);
        assert_eq!(
            escaped,
            r#"{"item":"evil\u202etxt\u009b2J\u001b[31m\u007f"}"#
        );
        let back: serde_json::Value = serde_json::from_str(&escaped).unwrap();
        assert_eq!(back, value);
        assert_eq!(escape_json(r#"{"a":"b"}"#), r#"{"a":"b"}"#);
        let pretty = serde_json::to_string_pretty(&value).unwrap();
        let back: serde_json::Value = serde_json::from_str(&escape_json(&pretty)).unwrap();
        assert_eq!(back, value, "a pretty layout stays");
    }
}
