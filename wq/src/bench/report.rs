//! Figures: what workloads measure ([`Sample`]), their medians over runs ([`Figure`]), and
//! the two ways of printing them (the table, or JSON lines as BENCH.md specifies).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use super::util::{Machine, median};

/// Our implementation with blocking (thread) consumers.
pub(crate) const OURS: &str = "workqueue";
/// Our implementation with async consumers on a tokio multi-thread runtime.
pub(crate) const OURS_ASYNC: &str = "workqueue-async";
/// Our queue on Redis (crate `workqueue-redis`), with `wq bench --redis URL`.
pub(crate) const OURS_REDIS: &str = "workqueue-redis";
/// workqueue-redis with a consumer that completes and takes items in batches.
pub(crate) const OURS_REDIS_BATCH: &str = "workqueue-redis-batch";
/// BullMQ on the same Redis server, the reference of `wq bench --redis URL`.
pub(crate) const BULLMQ: &str = "bullmq";
/// Our queue on PostgreSQL (crate `workqueue-postgres`), with `wq bench --postgres URL`.
pub(crate) const OURS_POSTGRES: &str = "workqueue-postgres";
/// workqueue-postgres with a consumer that completes and takes items in batches.
pub(crate) const OURS_POSTGRES_BATCH: &str = "workqueue-postgres-batch";
/// pg-boss on the same database, the reference of `wq bench --postgres URL`.
pub(crate) const PGBOSS: &str = "pg-boss";
/// One thread, no locks, `VecDeque` + hash sets (BENCH.md's practical limit (a)).
pub(crate) const LIMIT: &str = "limit-single-thread";
/// One thread, no locks, the same keys added to a hash set and a `VecDeque` first and then
/// drained: what holding the whole backlog costs, beside W1.
pub(crate) const LIMIT_FILL_DRAIN: &str = "limit-fill-drain";
/// An unbounded crossbeam channel (BENCH.md's practical limit (b)).
pub(crate) const CROSSBEAM: &str = "crossbeam-channel";
/// tokio-util's `DelayQueue` owned by one task.
pub(crate) const DELAY_QUEUE: &str = "tokio-util-delayqueue";

/// Every metric a figure may have (BENCH.md's names, plus P1's `cycles_per_s`).
pub(crate) const METRICS: &[&str] = &[
    "items_per_s",
    "cycles_per_s",
    "adds_per_s",
    "deliveries",
    "add_after_per_s",
    "lateness_p50_ms",
    "lateness_p99_ms",
    "lateness_max_ms",
    "wall_s",
    "requeues",
    "bytes_per_item",
    "bytes_per_delayed_item",
    "pickup_p50_ms",
    "pickup_p99_ms",
    "pickup_max_ms",
];

/// The shape of a fleet workload's run (W7): how many worker processes, how many workers
/// (`Workers::count`, a reference's concurrency) in each, and how long the handler sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    pub(crate) processes: u32,
    pub(crate) workers: u32,
    pub(crate) handler_ms: u32,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}p x {}w, {} ms",
            self.processes, self.workers, self.handler_ms
        )
    }
}

/// One number measured once: `value` of `metric` for implementation `imp` in `workload`
/// (at `shape`, for a fleet workload).
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(crate) workload: &'static str,
    pub(crate) imp: &'static str,
    pub(crate) metric: &'static str,
    pub(crate) value: f64,
    pub(crate) shape: Option<Shape>,
}

impl Sample {
    pub(crate) fn new(
        workload: &'static str,
        imp: &'static str,
        metric: &'static str,
        value: f64,
    ) -> Self {
        Self {
            workload,
            imp,
            metric,
            value,
            shape: None,
        }
    }

    /// The same sample, taken at `shape`.
    pub(crate) fn at(mut self, shape: Shape) -> Self {
        self.shape = Some(shape);
        self
    }
}

/// One figure of the report: the median of a sample over the runs.
#[derive(Debug, Clone)]
pub(crate) struct Figure {
    pub(crate) workload: &'static str,
    pub(crate) imp: &'static str,
    pub(crate) metric: &'static str,
    pub(crate) shape: Option<Shape>,
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) runs: usize,
}

/// The key samples are grouped by.
type FigureKey = (&'static str, &'static str, &'static str, Option<Shape>);

/// Groups samples by (workload, implementation, metric, shape), in the order they first
/// appear.
pub(crate) fn aggregate(samples: &[Sample]) -> Vec<Figure> {
    let mut order: Vec<FigureKey> = Vec::new();
    let mut values: HashMap<FigureKey, Vec<f64>> = HashMap::new();
    for s in samples {
        let key = (s.workload, s.imp, s.metric, s.shape);
        let entry = values.entry(key).or_insert_with(|| {
            order.push(key);
            Vec::new()
        });
        entry.push(s.value);
    }
    order
        .into_iter()
        .map(|key| {
            let mut v = values.remove(&key).unwrap_or_default();
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            Figure {
                workload: key.0,
                imp: key.1,
                metric: key.2,
                shape: key.3,
                median: median(&mut v),
                min,
                max,
                runs: v.len(),
            }
        })
        .collect()
}

/// One JSON object per line and figure:
/// `{"workload": "W1", "impl": "workqueue", "metric": "items_per_s", "value": 3100000.0, ...}`;
/// a fleet workload's lines carry its shape too (`"processes"`, `"workers"`,
/// `"handler_ms"`).
pub(crate) fn print_json(figures: &[Figure]) {
    for f in figures {
        println!("{}", json_line(f));
    }
}

/// The JSON object of one figure.
pub(crate) fn json_line(f: &Figure) -> serde_json::Value {
    let mut line = serde_json::json!({
        "workload": f.workload,
        "impl": f.imp,
        "metric": f.metric,
        "value": f.median,
        "min": f.min,
        "max": f.max,
        "runs": f.runs,
    });
    if let Some(shape) = f.shape {
        line["processes"] = shape.processes.into();
        line["workers"] = shape.workers.into();
        line["handler_ms"] = shape.handler_ms.into();
    }
    line
}

/// A goal of the project for one figure of ours, shown beside it: issue 17's for W1, W2
/// and W4's lateness max, issue 3's for the rest of the in-memory workloads, and issue 26's
/// for W7 on the servers.
struct Goal {
    workload: &'static str,
    metric: &'static str,
    /// Our implementations it is set for.
    ours: &'static [&'static str],
    /// For a fleet workload: only at shapes with this handler time.
    handler_ms: Option<u32>,
    kind: GoalKind,
}

enum GoalKind {
    /// ours / reference at least this (medians), and the worst run of ours / the reference's
    /// median at least the second figure, if any.
    RatioAtLeast(&'static str, f64, Option<f64>),
    /// The figure at least this.
    AtLeast(f64),
    /// The figure below this.
    Below(f64),
    /// The figure at most this.
    AtMost(f64),
}

/// The in-memory queue, with either kind of consumer.
const IN_MEMORY: &[&str] = &[OURS, OURS_ASYNC];

/// A goal for the in-memory queue.
const fn in_memory(workload: &'static str, metric: &'static str, kind: GoalKind) -> Goal {
    Goal {
        workload,
        metric,
        ours: IN_MEMORY,
        handler_ms: None,
        kind,
    }
}

const GOALS: &[Goal] = &[
    in_memory(
        "W1",
        "items_per_s",
        GoalKind::RatioAtLeast(LIMIT, 0.25, Some(0.15)),
    ),
    in_memory(
        "W2",
        "items_per_s",
        GoalKind::RatioAtLeast(LIMIT, 0.25, None),
    ),
    in_memory("W3", "adds_per_s", GoalKind::AtLeast(9e6)),
    in_memory("W4", "add_after_per_s", GoalKind::AtLeast(2.3e6)),
    in_memory("W4", "lateness_p99_ms", GoalKind::Below(2.0)),
    in_memory("W4", "lateness_max_ms", GoalKind::Below(5.0)),
    in_memory("W5", "wall_s", GoalKind::Below(0.1)),
    in_memory("W6", "bytes_per_item", GoalKind::AtMost(50.0)),
    in_memory("W6", "bytes_per_delayed_item", GoalKind::AtMost(80.0)),
    Goal {
        workload: "W7",
        metric: "items_per_s",
        ours: &[OURS_REDIS],
        handler_ms: None,
        kind: GoalKind::RatioAtLeast(BULLMQ, 3.0, None),
    },
    Goal {
        workload: "W7",
        metric: "pickup_p99_ms",
        ours: &[OURS_REDIS],
        handler_ms: Some(1),
        kind: GoalKind::Below(10.0),
    },
    Goal {
        workload: "W7",
        metric: "items_per_s",
        ours: &[OURS_POSTGRES],
        handler_ms: None,
        kind: GoalKind::RatioAtLeast(PGBOSS, 2.0, None),
    },
    Goal {
        workload: "W7",
        metric: "pickup_p99_ms",
        ours: &[OURS_POSTGRES],
        handler_ms: None,
        kind: GoalKind::Below(100.0),
    },
];

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "not met" }
}

/// The goals set for figure `f` of ours.
fn goals_of(f: &Figure) -> impl Iterator<Item = &'static Goal> + '_ {
    GOALS.iter().filter(move |g| {
        g.workload == f.workload
            && g.metric == f.metric
            && g.ours.contains(&f.imp)
            && g.handler_ms
                .is_none_or(|h| f.shape.is_some_and(|s| s.handler_ms == h))
    })
}

/// The goal text for our figure `ours` on its own line (absolute goals).
fn absolute_goal(ours: &Figure) -> String {
    let unit = |v: f64| format_value(ours.metric, v);
    let value = ours.median;
    goals_of(ours)
        .find_map(|goal| match goal.kind {
            GoalKind::AtLeast(x) => Some(format!(">= {}: {}", unit(x), verdict(value >= x))),
            GoalKind::Below(x) => Some(format!("< {}: {}", unit(x), verdict(value < x))),
            GoalKind::AtMost(x) => Some(format!("<= {}: {}", unit(x), verdict(value <= x))),
            GoalKind::RatioAtLeast(..) => None,
        })
        .unwrap_or_default()
}

/// The goal text for the ratio of our figure `ours` to `reference`: the medians' ratio, and
/// the worst run's where the goal has one.
fn ratio_goal(ours: &Figure, reference: &Figure) -> String {
    goals_of(ours)
        .find_map(|g| match g.kind {
            GoalKind::RatioAtLeast(r, x, worst) if r == reference.imp => {
                let ratio = ours.median / reference.median;
                let mut text = format!(">= {x:.2}: {}", verdict(ratio >= x));
                if let Some(w) = worst.filter(|_| ours.runs > 1) {
                    let worst_ratio = ours.min / reference.median;
                    let _ = write!(
                        text,
                        "; worst run {worst_ratio:.2} >= {w:.2}: {}",
                        verdict(worst_ratio >= w)
                    );
                }
                Some(text)
            }
            _ => None,
        })
        .unwrap_or_default()
}

/// A figure's name in the table.
fn metric_label(metric: &str) -> &str {
    match metric {
        "items_per_s" => "items/s",
        "adds_per_s" => "adds/s",
        "add_after_per_s" => "add_after/s",
        "cycles_per_s" => "cycles/s",
        "lateness_p50_ms" => "lateness p50",
        "lateness_p99_ms" => "lateness p99",
        "lateness_max_ms" => "lateness max",
        "wall_s" => "wall",
        "bytes_per_item" => "bytes/item",
        "bytes_per_delayed_item" => "bytes/delayed item",
        "pickup_p50_ms" => "pickup p50",
        "pickup_p99_ms" => "pickup p99",
        "pickup_max_ms" => "pickup max",
        other => other,
    }
}

/// A value with its unit.
fn format_value(metric: &str, v: f64) -> String {
    if !v.is_finite() {
        return "-".to_owned();
    }
    if metric.ends_with("_per_s") {
        if v >= 1e6 {
            format!("{:.2} M/s", v / 1e6)
        } else {
            format!("{:.1} k/s", v / 1e3)
        }
    } else if metric.ends_with("_ms") {
        format!("{v:.3} ms")
    } else if metric.ends_with("_s") {
        format!("{v:.3} s")
    } else if metric.starts_with("bytes") {
        format!("{v:.1} B")
    } else {
        format!("{v:.0}")
    }
}

fn is_ours(imp: &str) -> bool {
    imp == OURS || imp == OURS_ASYNC || is_shared(imp)
}

/// Whether `imp` is one of our queues on a server (Redis, PostgreSQL).
fn is_shared(imp: &str) -> bool {
    imp == OURS_REDIS
        || imp == OURS_REDIS_BATCH
        || imp == OURS_POSTGRES
        || imp == OURS_POSTGRES_BATCH
}

/// Prints the table: one block per (workload, figure), our figures each beside every
/// reference measured for that figure, with the ratio ours / reference.
pub(crate) fn print_table(
    figures: &[Figure],
    runs: u32,
    quick: bool,
    machine: &Machine,
    elapsed: Duration,
) {
    let header = [
        "workload",
        "figure",
        "ours",
        "value",
        "reference",
        "value",
        "ratio",
        "goal",
    ]
    .map(str::to_owned);
    let mut rows: Vec<[String; 8]> = vec![header];
    let mut groups: Vec<(&str, &str, Option<Shape>)> = Vec::new();
    for f in figures {
        if !groups.contains(&(f.workload, f.metric, f.shape)) {
            groups.push((f.workload, f.metric, f.shape));
        }
    }
    for (workload, metric, shape) in groups {
        let in_group: Vec<&Figure> = figures
            .iter()
            .filter(|f| f.workload == workload && f.metric == metric && f.shape == shape)
            .collect();
        let workload_label = match shape {
            Some(shape) => format!("{workload} {shape}"),
            None => workload.to_owned(),
        };
        let ours: Vec<&Figure> = in_group
            .iter()
            .copied()
            .filter(|f| is_ours(f.imp))
            .collect();
        let refs: Vec<&Figure> = in_group
            .iter()
            .copied()
            .filter(|f| !is_ours(f.imp))
            .collect();
        let mut first = true;
        let label = |first: &mut bool| -> [String; 2] {
            if std::mem::take(first) {
                [workload_label.clone(), metric_label(metric).to_owned()]
            } else {
                [String::new(), String::new()]
            }
        };
        for o in &ours {
            let ours_cells = [o.imp.to_owned(), format_value(metric, o.median)];
            if refs.is_empty() {
                let [w, m] = label(&mut first);
                let goal = absolute_goal(o);
                let [oi, ov] = ours_cells;
                rows.push([
                    w,
                    m,
                    oi,
                    ov,
                    String::new(),
                    String::new(),
                    String::new(),
                    goal,
                ]);
                continue;
            }
            for (i, r) in refs.iter().enumerate() {
                let [w, m] = label(&mut first);
                let ratio = o.median / r.median;
                let mut goal = ratio_goal(o, r);
                if i == 0 && goal.is_empty() {
                    goal = absolute_goal(o);
                }
                let [oi, ov] = if i == 0 {
                    ours_cells.clone()
                } else {
                    [String::new(), String::new()]
                };
                rows.push([
                    w,
                    m,
                    oi,
                    ov,
                    r.imp.to_owned(),
                    format_value(metric, r.median),
                    format!("{ratio:.2}"),
                    goal,
                ]);
            }
        }
        if ours.is_empty() {
            for r in &refs {
                let [w, m] = label(&mut first);
                rows.push([
                    w,
                    m,
                    String::new(),
                    String::new(),
                    r.imp.to_owned(),
                    format_value(metric, r.median),
                    String::new(),
                    String::new(),
                ]);
            }
        }
    }
    let mut widths = [0usize; 8];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "wq bench{}: {machine}; {} of {runs} run(s); {:.1} s in all",
        if quick { " --quick" } else { "" },
        if runs > 1 { "medians" } else { "figures" },
        elapsed.as_secs_f64()
    );
    for (n, row) in rows.iter().enumerate() {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            // Numbers right-aligned, names left-aligned.
            let _ = match i {
                3 | 5 | 6 => write!(line, "{cell:>w$}  "),
                _ => write!(line, "{cell:<w$}  "),
            };
        }
        let _ = writeln!(out, "{}", line.trim_end());
        if n == 0 {
            let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
            let _ = writeln!(out, "{}", "-".repeat(total));
        }
    }
    let _ = write!(
        out,
        "ratio = ours / reference (for lateness, wall and bytes, lower is better)."
    );
    if rows.iter().skip(1).any(|row| !row[7].is_empty()) {
        let _ = write!(
            out,
            " Goals are issue 17's for W1, W2 and W4's lateness max, issue 3's for the rest \
             in memory, issue 26's for W7 on a server, for the full sizes{}; none of this is a \
             pass/fail test.",
            if quick {
                " (--quick shrinks the workloads, so they are indicative only)"
            } else {
                ""
            }
        );
    }
    let _ = writeln!(out);
    print!("{out}");
}
