//! The tables of `--compare`: one per backend, a row per (workload, shape, figure), a column
//! per implementation (ours first, then every reference measured on that server), and the
//! ratio of ours to the best reference. Cells a reference cannot run say `n/a` with a
//! footnote giving the reason, and cells whose runs failed say `failed` with the error (a
//! median of the runs that did not fail is marked with how many did); under the table, each
//! reference's version and settings.

use std::fmt::Write as _;

use super::json::About;
use super::{Figure, Shape, format_value, higher_is_better, is_ours, metric_label};

/// Prints the table of one backend's `figures`, titled `title`.
pub(crate) fn print(title: &str, figures: &[Figure], about: &[About]) {
    print!("{}", render(title, figures, about));
}

/// The implementations in `figures`, ours first, each in the order it first appears.
fn columns(figures: &[Figure]) -> Vec<&'static str> {
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for f in figures {
        let list = if is_ours(f.imp) {
            &mut ours
        } else {
            &mut theirs
        };
        if !list.contains(&f.imp) {
            list.push(f.imp);
        }
    }
    ours.extend(theirs);
    ours
}

/// The rows' keys, in the order the figures first name them.
fn rows(figures: &[Figure]) -> Vec<(&'static str, Option<Shape>, &'static str)> {
    let mut rows = Vec::new();
    for f in figures {
        let key = (f.workload, f.shape, f.metric);
        if !rows.contains(&key) {
            rows.push(key);
        }
    }
    rows
}

/// Ours (the first of our columns with a value) over the best reference with a value, where
/// the figure has a better direction.
fn ours_over_best(row: &[&Figure]) -> Option<f64> {
    let higher = higher_is_better(row.first()?.metric)?;
    let ours = row
        .iter()
        .find(|f| is_ours(f.imp) && f.na.is_none())?
        .median;
    let peers = row
        .iter()
        .filter(|f| !is_ours(f.imp) && f.na.is_none() && f.median.is_finite());
    let best = if higher {
        peers.map(|f| f.median).fold(f64::NEG_INFINITY, f64::max)
    } else {
        peers.map(|f| f.median).fold(f64::INFINITY, f64::min)
    };
    // A best of 0 (a lateness of jobs that ran early) has no ratio.
    (best.is_finite() && best > 0.0).then(|| ours / best)
}

/// The whole table as text.
fn render(title: &str, figures: &[Figure], about: &[About]) -> String {
    let columns = columns(figures);
    // Each note once, numbered in order: (what the mark says, the note).
    let mut notes: Vec<(&str, String)> = Vec::new();
    let mut mark = |kind: &'static str, note: String| {
        let n = notes
            .iter()
            .position(|(k, n)| *k == kind && *n == note)
            .unwrap_or_else(|| {
                notes.push((kind, note));
                notes.len() - 1
            });
        format!("{kind} [{}]", n + 1)
    };
    let mut table: Vec<Vec<String>> = Vec::new();
    let mut header = vec!["workload".to_owned(), "figure".to_owned()];
    header.extend(columns.iter().map(|c| (*c).to_owned()));
    header.push("ours/best peer".to_owned());
    table.push(header);
    for (workload, shape, metric) in rows(figures) {
        let row: Vec<&Figure> = figures
            .iter()
            .filter(|f| f.workload == workload && f.shape == shape && f.metric == metric)
            .collect();
        let mut cells = vec![
            match shape {
                Some(shape) => format!("{workload} {shape}"),
                None => workload.to_owned(),
            },
            metric_label(metric).to_owned(),
        ];
        for column in &columns {
            let cell = match row.iter().find(|f| f.imp == *column) {
                None => String::new(),
                Some(f) => match (&f.na, &f.failed) {
                    (None, None) => format_value(metric, f.median),
                    // Some runs failed: the median of the others, marked.
                    (None, Some((n, error))) => {
                        let runs = n + f.runs;
                        let note =
                            format!("{column} {workload}: {n} of {runs} runs failed: {error}");
                        format!(
                            "{} {}",
                            format_value(metric, f.median),
                            mark("failed", note)
                        )
                    }
                    (Some(error), Some(_)) => {
                        mark("failed", format!("{column} {workload}: {error}"))
                    }
                    (Some(reason), None) => mark("n/a", format!("{column} {workload}: {reason}")),
                },
            };
            cells.push(cell);
        }
        cells.push(ours_over_best(&row).map_or_else(String::new, |r| format!("{r:.2}")));
        table.push(cells);
    }
    let mut widths = vec![0; table[0].len()];
    for row in &table {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = format!("{title}\n");
    for (n, row) in table.iter().enumerate() {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            let _ = if i < 2 {
                write!(line, "{cell:<w$}  ")
            } else {
                write!(line, "{cell:>w$}  ")
            };
        }
        let _ = writeln!(out, "{}", line.trim_end());
        if n == 0 {
            let _ = writeln!(
                out,
                "{}",
                "-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1))
            );
        }
    }
    out.push_str(
        "ours/best peer: our first column over the best reference (for lateness, pickup, wall \
         and time, lower is better).\n",
    );
    for (n, (kind, note)) in notes.iter().enumerate() {
        let _ = writeln!(out, "{kind} [{}] {note}", n + 1);
    }
    for line in super::goals::goal_lines(figures) {
        let _ = writeln!(out, "goal: {line}");
    }
    for column in &columns {
        if let Some(a) = about.iter().find(|a| a.imp == *column) {
            let _ = writeln!(out, "{} {}: {}", a.imp, a.version, a.settings);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{OURS_POSTGRES, RIVERQUEUE, Sample, aggregate};

    #[test]
    fn one_column_per_implementation_n_a_with_its_reason_and_ours_over_the_best() {
        let figures = aggregate(&[
            Sample::new("W1", OURS_POSTGRES, "items_per_s", 10_000.0),
            Sample::new("W1", RIVERQUEUE, "items_per_s", 2_500.0),
            Sample::new("W1", "apalis-postgres", "items_per_s", 5_000.0),
            Sample::new("W4", OURS_POSTGRES, "lateness_p99_ms", 2.0),
            Sample::new("W4", RIVERQUEUE, "lateness_p99_ms", 20.0),
            Sample::not_applicable("W4", "apalis-postgres", "lateness_p99_ms", "whole seconds"),
        ]);
        let about = [About {
            imp: RIVERQUEUE,
            version: "0.5.0".into(),
            settings: "fetch cooldown 2 ms".into(),
        }];
        let text = render("PostgreSQL 15", &figures, &about);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "PostgreSQL 15");
        assert!(lines[1].contains("workq-postgres") && lines[1].contains("riverqueue"));
        // 10,000 over the best of 2,500 and 5,000; 2 ms over the best (lowest) of 20 ms.
        assert!(lines[3].ends_with("2.00"), "{}", lines[3]);
        assert!(
            lines[4].contains("n/a [1]") && lines[4].ends_with("0.10"),
            "{}",
            lines[4]
        );
        assert!(
            text.contains("n/a [1] apalis-postgres W4: whole seconds"),
            "{text}"
        );
        assert!(
            text.contains("riverqueue 0.5.0: fetch cooldown 2 ms"),
            "{text}"
        );
    }

    /// A peer whose run failed has its column marked failed with the error under the table
    /// (it was left out, with a note no column pointed to); one that failed in some runs only
    /// shows the median of the others, marked with how many failed.
    #[test]
    fn a_peer_whose_runs_failed_is_marked_failed_in_its_column() {
        let figures = aggregate(&[
            Sample::new("W3", OURS_POSTGRES, "adds_per_s", 70_000.0),
            Sample::failed(
                "W3",
                RIVERQUEUE,
                "adds_per_s",
                "exit status 1: deadlock detected",
            ),
            Sample::new("W3", OURS_POSTGRES, "adds_per_s", 74_000.0),
            Sample::failed(
                "W3",
                RIVERQUEUE,
                "adds_per_s",
                "exit status 1: deadlock detected",
            ),
            Sample::new("W4", OURS_POSTGRES, "add_after_per_s", 20_000.0),
            Sample::new("W4", RIVERQUEUE, "add_after_per_s", 5_000.0),
            Sample::failed("W4", RIVERQUEUE, "add_after_per_s", "timed out"),
            Sample::new("W4", RIVERQUEUE, "add_after_per_s", 7_000.0),
        ]);
        let text = render("PostgreSQL 15", &figures, &[]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[3].contains("failed [1]"), "{text}");
        // No ratio beside a failed peer alone.
        assert!(!lines[3].trim_end().ends_with(char::is_numeric), "{text}");
        assert!(
            text.contains("failed [1] riverqueue W3: exit status 1: deadlock detected"),
            "{text}"
        );
        // The median of the two runs that ran, 6.0 k/s, marked.
        assert!(lines[4].contains("6.0 k/s failed [2]"), "{text}");
        assert!(
            text.contains("failed [2] riverqueue W4: 1 of 3 runs failed: timed out"),
            "{text}"
        );
    }
}
