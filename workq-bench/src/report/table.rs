//! The table of a run: one block per (workload, figure, shape), each of our figures beside
//! every reference measured for it, with the ratio ours / reference and the goal.

use std::fmt::Write as _;
use std::time::Duration;

use super::goals::{absolute_goal, ratio_goal};
use super::{Figure, Shape, format_value, is_ours, metric_label};
use crate::util::Machine;

/// The columns: workload, figure, ours, its value, reference, its value, ratio, goal.
type Row = [String; 8];

const HEADER: [&str; 8] = [
    "workload",
    "figure",
    "ours",
    "value",
    "reference",
    "value",
    "ratio",
    "goal",
];

/// Columns holding numbers, right-aligned.
const NUMBERS: [usize; 3] = [3, 5, 6];

/// Prints the table of `figures`, under a line saying how they were taken.
pub(crate) fn print(
    figures: &[Figure],
    runs: u32,
    quick: bool,
    machine: &Machine,
    elapsed: Duration,
) {
    let rows: Vec<Row> = blocks(figures)
        .into_iter()
        .flat_map(|(workload, metric, shape)| {
            let block: Vec<&Figure> = figures
                .iter()
                .filter(|f| f.workload == workload && f.metric == metric && f.shape == shape)
                .collect();
            block_rows(&block)
        })
        .collect();
    let mut out = format!(
        "wq-bench{}: {machine}; {} of {runs} run(s); {:.1} s in all\n",
        if quick { " --quick" } else { "" },
        if runs > 1 { "medians" } else { "figures" },
        elapsed.as_secs_f64()
    );
    out.push_str(&render(&rows));
    out.push_str(&footer(&rows, quick));
    out.push_str(&spread(figures));
    print!("{out}");
}

/// Workloads whose figures of ours are compared with those of another build in one sitting
/// (W1 in memory against the build before flow control, docs/benchmarks.md "Reproducing"):
/// the spread of their runs is printed under the table, to say how much of a difference is
/// noise.
const SPREAD: &[&str] = &["W1"];

/// One line per figure of ours in [`SPREAD`] measured more than once: its median, lowest and
/// highest run, and the spread (highest minus lowest) as a share of the median.
fn spread(figures: &[Figure]) -> String {
    let mut out = String::new();
    for f in figures
        .iter()
        .filter(|f| SPREAD.contains(&f.workload) && is_ours(f.imp) && f.runs > 1 && f.na.is_none())
    {
        let _ = writeln!(
            out,
            "spread: {} {} {}: median {} of {} runs, {} to {} ({:.1}% of the median)",
            f.workload,
            f.imp,
            metric_label(f.metric),
            format_value(f.metric, f.median),
            f.runs,
            format_value(f.metric, f.min),
            format_value(f.metric, f.max),
            (f.max - f.min) / f.median * 100.0
        );
    }
    out
}

/// The (workload, metric, shape) of every block, in the order the figures first name them.
fn blocks(figures: &[Figure]) -> Vec<(&'static str, &'static str, Option<Shape>)> {
    let mut blocks = Vec::new();
    for f in figures {
        let key = (f.workload, f.metric, f.shape);
        if !blocks.contains(&key) {
            blocks.push(key);
        }
    }
    blocks
}

/// The value of a figure, or `n/a`, or `failed` (every run failed).
fn value(f: &Figure) -> String {
    match (&f.na, &f.failed) {
        (Some(_), Some(_)) => "failed".to_owned(),
        (Some(_), None) => "n/a".to_owned(),
        (None, _) => format_value(f.metric, f.median),
    }
}

/// The rows of one block: each of ours beside each reference (the block's label on its first
/// row only); the references alone when none of ours was measured.
fn block_rows(block: &[&Figure]) -> Vec<Row> {
    let Some(first) = block.first() else {
        return Vec::new();
    };
    let mut label = Some([
        match first.shape {
            Some(shape) => format!("{} {shape}", first.workload),
            None => first.workload.to_owned(),
        },
        metric_label(first.metric).to_owned(),
    ]);
    let mut next_label = || label.take().unwrap_or_default();
    let (ours, refs): (Vec<&Figure>, Vec<&Figure>) = block.iter().partition(|f| is_ours(f.imp));
    let mut rows = Vec::new();
    for o in &ours {
        if refs.is_empty() {
            let [w, m] = next_label();
            rows.push([
                w,
                m,
                o.imp.to_owned(),
                value(o),
                String::new(),
                String::new(),
                String::new(),
                absolute_goal(o),
            ]);
            continue;
        }
        for (i, r) in refs.iter().enumerate() {
            let [w, m] = next_label();
            let ratio = if r.na.is_some() {
                String::new()
            } else {
                format!("{:.2}", o.median / r.median)
            };
            let mut goal = ratio_goal(o, r);
            if i == 0 && goal.is_empty() {
                goal = absolute_goal(o);
            }
            let (oi, ov) = if i == 0 {
                (o.imp.to_owned(), value(o))
            } else {
                (String::new(), String::new())
            };
            rows.push([w, m, oi, ov, r.imp.to_owned(), value(r), ratio, goal]);
        }
    }
    if ours.is_empty() {
        for r in &refs {
            let [w, m] = next_label();
            rows.push([
                w,
                m,
                String::new(),
                String::new(),
                r.imp.to_owned(),
                value(r),
                String::new(),
                String::new(),
            ]);
        }
    }
    rows
}

/// The header, a rule and the rows, in aligned columns.
fn render(rows: &[Row]) -> String {
    let mut widths = HEADER.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let mut line = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let _ = if NUMBERS.contains(&i) {
                write!(line, "{cell:>w$}  ")
            } else {
                write!(line, "{cell:<w$}  ")
            };
        }
        line.trim_end().to_owned() + "\n"
    };
    let mut out = line(&HEADER);
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    out.push('\n');
    for row in rows {
        out.push_str(&line(&row.each_ref().map(String::as_str)));
    }
    out
}

/// What the ratio means, and what the goals are, when any is shown.
fn footer(rows: &[Row], quick: bool) -> String {
    let mut out = "ratio = ours / reference (for lateness, wall, time and bytes, lower is better)."
        .to_owned();
    if rows.iter().any(|row| !row[7].is_empty()) {
        let _ = write!(
            out,
            " Goals are the project's, for the full sizes (docs/bench-workloads.md lists them){}; \
             none of this is a pass/fail test.",
            if quick {
                " (--quick shrinks the workloads, so they are indicative only)"
            } else {
                ""
            }
        );
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{LIMIT, OURS, Sample, aggregate};

    #[test]
    fn w1_s_runs_of_ours_have_their_spread_printed() {
        let figures = aggregate(&[
            Sample::new("W1", OURS, "items_per_s", 3.0e6),
            Sample::new("W1", OURS, "items_per_s", 3.3e6),
            Sample::new("W1", OURS, "items_per_s", 3.2e6),
            Sample::new("W1", LIMIT, "items_per_s", 16e6),
            Sample::new("W1", LIMIT, "items_per_s", 17e6),
            Sample::new("W2", OURS, "items_per_s", 2e6),
            Sample::new("W2", OURS, "items_per_s", 3e6),
        ]);
        assert_eq!(
            spread(&figures),
            "spread: W1 workq items/s: median 3.20 M/s of 3 runs, 3.00 M/s to 3.30 M/s (9.4% \
             of the median)\n"
        );
        // One run has no spread.
        assert_eq!(
            spread(&aggregate(&[Sample::new("W1", OURS, "items_per_s", 3e6)])),
            ""
        );
    }

    #[test]
    fn ours_stands_beside_each_reference_with_the_ratio_and_a_goal() {
        let figures = aggregate(&[
            Sample::new("W1", OURS, "items_per_s", 4e6),
            Sample::new("W1", LIMIT, "items_per_s", 16e6),
            Sample::new("W1", "crossbeam-channel", "items_per_s", 20e6),
        ]);
        let block: Vec<&Figure> = figures.iter().collect();
        let rows = block_rows(&block);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0][0], "W1");
        assert_eq!(rows[0][2], OURS);
        assert_eq!(rows[0][6], "0.25");
        assert!(rows[0][7].starts_with(">= 0.25: met"), "{:?}", rows[0][7]);
        // The label and ours are said once.
        assert_eq!((rows[1][0].as_str(), rows[1][2].as_str()), ("", ""));
        assert_eq!(rows[1][6], "0.20");
        let text = render(&rows);
        assert!(
            text.lines()
                .nth(1)
                .is_some_and(|rule| rule.starts_with("----"))
        );
    }
}
