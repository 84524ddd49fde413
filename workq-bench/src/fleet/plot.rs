//! The plots of `wq-bench --plot DIR`, as SVG with `plotters`: W7's scaling sweep (items/s
//! and pickup p99 against workers per process, one line per implementation, processes and
//! handler time), W7B's burn-down (items/s against workers, one line per implementation, a
//! worker count an implementation has no figure at named in a note), and with `--compare`
//! items/s per shape with one bar per implementation.

use std::ops::Range;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::{BURN_ID, SCALE_ID, SCALE_WORKERS};
use crate::report::{Figure, Shape, is_ours};
use crate::server::Backend;

/// The file name of the sweep's plot in its directory (with one server).
pub(crate) const FILE: &str = "w7-scaling.svg";

/// Why a line has no point at a worker count whose figure is missing from the run (its
/// implementation failed there; the run's notes say how).
const NOT_MEASURED: &str = "not measured (see the run's notes)";

/// One line of a panel.
#[derive(Debug, Clone, PartialEq)]
struct Line {
    /// The legend's text.
    label: String,
    /// (workers, value), by workers.
    points: Vec<(f64, f64)>,
    /// The worker counts of the run this line has no value at, by workers, with why.
    missing: Vec<(u32, String)>,
}

/// The lines of `metric` in `workload`'s figures, one per `label`, in the order the labels
/// first appear but ours first. A worker count of the run that a line has no value at is
/// in its `missing`, with the reason the figure gives or [`NOT_MEASURED`].
fn lines(
    figures: &[Figure],
    workload: &str,
    metric: &str,
    label: fn(&str, Shape) -> String,
) -> Vec<Line> {
    let mut lines: Vec<(Line, bool)> = Vec::new();
    let mut counts: Vec<u32> = Vec::new();
    for f in figures {
        let (Some(shape), true) = (f.shape, f.workload == workload && f.metric == metric) else {
            continue;
        };
        if !counts.contains(&shape.workers) {
            counts.push(shape.workers);
        }
        let text = label(f.imp, shape);
        let index = match lines.iter().position(|(l, _)| l.label == text) {
            Some(index) => index,
            None => {
                let line = Line {
                    label: text,
                    points: Vec::new(),
                    missing: Vec::new(),
                };
                lines.push((line, is_ours(f.imp)));
                lines.len() - 1
            }
        };
        let line = &mut lines[index].0;
        match &f.na {
            Some(reason) => line.missing.push((shape.workers, reason.clone())),
            None if f.median.is_finite() => {
                line.points.push((f64::from(shape.workers), f.median));
            }
            None => line.missing.push((shape.workers, NOT_MEASURED.to_owned())),
        }
    }
    lines.sort_by_key(|(_, ours)| !ours);
    lines
        .into_iter()
        .map(|(mut line, _)| {
            for &workers in &counts {
                let known = line.points.iter().any(|&(x, _)| x == f64::from(workers))
                    || line.missing.iter().any(|&(w, _)| w == workers);
                if !known {
                    line.missing.push((workers, NOT_MEASURED.to_owned()));
                }
            }
            line.points.sort_by(|a, b| a.0.total_cmp(&b.0));
            line.missing.sort_by_key(|&(w, _)| w);
            line
        })
        .collect()
}

/// A sweep line's label: the implementation and the shape but for its workers.
fn label(imp: &str, shape: Shape) -> String {
    format!(
        "{imp}, {} process{}, handler {} ms",
        shape.processes,
        if shape.processes == 1 { "" } else { "es" },
        shape.handler_ms
    )
}

/// A burn-down line's label: the implementation, and the shape but for its workers when it
/// is not the burn-down's own (one process, a handler that returns at once).
fn burn_label(imp: &str, shape: Shape) -> String {
    if shape.processes == 1 && shape.handler_ms == 0 {
        imp.to_owned()
    } else {
        label(imp, shape)
    }
}

/// Writes the plot of the sweep's figures into `dir`/`file`; returns its path. `caption` says
/// where the figures come from (machine, server).
pub(crate) fn write_plot(
    dir: &Path,
    file: &str,
    figures: &[Figure],
    caption: &str,
) -> Result<PathBuf, String> {
    let rate = lines(figures, SCALE_ID, "items_per_s", label);
    let p99 = lines(figures, SCALE_ID, "pickup_p99_ms", label);
    if rate.iter().all(|l| l.points.is_empty()) {
        return Err(format!("no {SCALE_ID} figures to plot"));
    }
    let path = in_dir(dir, file)?;
    draw(&path, &rate, &p99, caption).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// `dir`/`file`, creating `dir` if need be.
fn in_dir(dir: &Path, file: &str) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir.join(file))
}

/// The colours of the lines, in order.
const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// The plot's x coordinate of `workers`: its logarithm in base 4, so that 1, 4, 16 and 64
/// workers are evenly spaced and the labels at every half step (1, 2, 4, 8, ...) are whole.
fn x_of(workers: f64) -> f64 {
    workers.log(4.0)
}

/// The x range (in [`x_of`]'s coordinates) that holds every point of `lines`, 1 worker and
/// `widest` workers, with a margin each side.
fn x_range(lines: &[Line], widest: f64) -> Range<f64> {
    let xs: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|&(x, _)| x_of(x)))
        .chain(lines.iter().flat_map(|l| {
            l.missing
                .iter()
                .map(|&(workers, _)| x_of(f64::from(workers)))
        }))
        .collect();
    let low = xs.iter().copied().fold(0.0, f64::min) - 0.25;
    let high = xs.iter().copied().fold(x_of(widest), f64::max) + 0.25;
    low..high
}

/// The highest value of `lines`' points (at least 1).
fn highest(lines: &[Line]) -> f64 {
    lines
        .iter()
        .flat_map(|l| l.points.iter().map(|&(_, y)| y))
        .fold(1.0_f64, f64::max)
}

/// A rate on an axis: `12k`, `2.5k`, `800`.
fn rate_label(y: f64) -> String {
    if y >= 1e4 {
        format!("{:.0}k", y / 1e3)
    } else if y >= 1e3 {
        format!("{:.1}k", y / 1e3)
    } else {
        format!("{y:.0}")
    }
}

/// Writes `lines` of text, one under the other, into `area` (a plot's foot: where its
/// figures come from, what is missing).
fn foot<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    lines: &[String],
) -> Result<(), String> {
    for (i, text) in lines.iter().enumerate() {
        area.draw(&Text::new(
            text.clone(),
            (12, 8 + 16 * i as i32),
            ("sans-serif", 12).into_font().color(&BLACK.mix(0.7)),
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn draw(path: &Path, rate: &[Line], p99: &[Line], caption: &str) -> Result<(), String> {
    let error = |e: &dyn std::fmt::Display| e.to_string();
    let root = SVGBackend::new(path, (1100, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| error(&e))?;
    let (top, bottom) = root.split_vertically(470);
    foot(&bottom, &[caption.to_owned()])?;
    let top = top
        .titled(
            "W7S on a server: items/s and pickup p99 against workers per process",
            ("sans-serif", 16),
        )
        .map_err(|e| error(&e))?;
    let (left, right) = top.split_horizontally(550);
    let all: Vec<Line> = rate.iter().chain(p99).cloned().collect();
    let widest = f64::from(SCALE_WORKERS[SCALE_WORKERS.len() - 1]);
    let Range {
        start: x_min,
        end: x_max,
    } = x_range(&all, widest);
    let half_steps = ((x_max - x_min) * 2.0).ceil() as usize + 1;
    let x_label = |x: &f64| {
        let doubled = x * 2.0;
        if (doubled - doubled.round()).abs() < 1e-6 && *x >= -1e-6 {
            format!("{:.0}", 4f64.powf(*x))
        } else {
            String::new()
        }
    };

    let rate_top = highest(rate) * 1.15;
    let mut chart = ChartBuilder::on(&left)
        .caption("items/s (flood)", ("sans-serif", 14))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(x_min..x_max, 0.0..rate_top)
        .map_err(|e| error(&e))?;
    chart
        .configure_mesh()
        .x_desc("workers per process")
        .x_labels(half_steps)
        .x_label_formatter(&x_label)
        .y_label_formatter(&|y| rate_label(*y))
        .draw()
        .map_err(|e| error(&e))?;
    series(&mut chart, rate, x_of, SeriesLabelPosition::UpperLeft)?;

    let p99_values: Vec<f64> = p99
        .iter()
        .flat_map(|l| l.points.iter().map(|&(_, y)| y))
        .collect();
    let p99_top = highest(p99) * 2.0;
    let p99_bottom = p99_values
        .iter()
        .copied()
        .filter(|&v| v > 0.0)
        .fold(0.1_f64, f64::min)
        / 2.0;
    let mut chart = ChartBuilder::on(&right)
        .caption(
            "pickup p99, ms, log scale (paced at half the flood's rate)",
            ("sans-serif", 14),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(x_min..x_max, (p99_bottom..p99_top).log_scale())
        .map_err(|e| error(&e))?;
    chart
        .configure_mesh()
        .x_desc("workers per process")
        .x_labels(half_steps)
        .x_label_formatter(&x_label)
        .y_label_formatter(&|y| format!("{y}"))
        .draw()
        .map_err(|e| error(&e))?;
    series(&mut chart, p99, x_of, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(|e| error(&e))?;
    Ok(())
}

/// Draws `lines` with markers and a legend, a point's workers at `x(workers)` on the chart;
/// a line with no point at all is in the legend, marked n/a.
fn series<'a, DB, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    lines: &[Line],
    x: fn(f64) -> f64,
    legend: SeriesLabelPosition,
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (i, line) in lines.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let text = if line.points.is_empty() {
            format!("{} (n/a)", line.label)
        } else {
            line.label.clone()
        };
        chart
            .draw_series(LineSeries::new(
                line.points.iter().map(|&(w, y)| (x(w), y)),
                colour.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(text)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
            });
        chart
            .draw_series(
                line.points
                    .iter()
                    .map(|&(w, y)| Circle::new((x(w), y), 3, colour.filled())),
            )
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(legend)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 11))
        .draw()
        .map_err(|e| e.to_string())
}

/// The file name of W7B's plot of `backend` in its directory.
pub(crate) fn burn_file(backend: Backend) -> String {
    format!("w7b-{}.svg", backend.name().to_lowercase())
}

/// W7B's plot, ready to draw: items/s against workers, one line per implementation.
#[derive(Debug)]
struct Burn {
    title: String,
    lines: Vec<Line>,
    /// The worker counts of the run, ascending: the x axis's ticks.
    workers: Vec<u32>,
    /// The x range, workers (on a log scale).
    x: Range<f64>,
    /// The y range, items/s.
    y: Range<f64>,
    /// Under the plot: where the figures come from, then a line per implementation that
    /// misses a worker count, with why.
    foot: Vec<String>,
}

impl Burn {
    /// The plot of `backend`'s W7B figures, on a machine of `cores` cores on `date`; `None`
    /// without any.
    fn new(
        backend: Backend,
        figures: &[Figure],
        cores: usize,
        date: &str,
        caption: &str,
    ) -> Option<Self> {
        let lines = lines(figures, BURN_ID, "items_per_s", burn_label);
        if lines.is_empty() {
            return None;
        }
        let mut workers: Vec<u32> = lines
            .iter()
            .flat_map(|l| {
                let measured = l.points.iter().map(|&(x, _)| x as u32);
                measured.chain(l.missing.iter().map(|&(w, _)| w))
            })
            .collect();
        workers.sort_unstable();
        workers.dedup();
        let widest = f64::from(workers.last().copied().unwrap_or(1));
        let mut foot = vec![caption.to_owned()];
        foot.extend(lines.iter().flat_map(missing_notes));
        Some(Self {
            title: format!(
                "W7B on {}: burn-down items/s against workers in one process; {cores} cores; {date}",
                backend.name()
            ),
            x: {
                let Range { start, end } = x_range(&lines, widest);
                4f64.powf(start)..4f64.powf(end)
            },
            y: 0.0..highest(&lines) * 1.15,
            lines,
            workers,
            foot,
        })
    }

    /// Draws the plot into the SVG file at `path`.
    fn draw(&self, path: &Path) -> Result<(), String> {
        let error = |e: &dyn std::fmt::Display| e.to_string();
        let foot_height = 14 + 16 * self.foot.len() as u32;
        let root = SVGBackend::new(path, (900, 470 + foot_height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| error(&e))?;
        let (top, bottom) = root.split_vertically(470);
        foot(&bottom, &self.foot)?;
        let ticks: Vec<f64> = self.workers.iter().map(|&w| f64::from(w)).collect();
        let x = self.x.clone().log_scale().with_key_points(ticks);
        let mut chart = ChartBuilder::on(&top)
            .caption(&self.title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(x, self.y.clone())
            .map_err(|e| error(&e))?;
        chart
            .configure_mesh()
            .x_desc("workers in one process (log scale)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc("items/s")
            .y_label_formatter(&|y| rate_label(*y))
            .draw()
            .map_err(|e| error(&e))?;
        series(
            &mut chart,
            &self.lines,
            |x| x,
            SeriesLabelPosition::UpperLeft,
        )?;
        root.present().map_err(|e| error(&e))?;
        Ok(())
    }
}

/// The notes of the worker counts `line` has no figure at, one per reason:
/// `riverqueue: no figure at 16, 2000 workers: REASON`.
fn missing_notes(line: &Line) -> Vec<String> {
    let mut reasons: Vec<(&str, Vec<String>)> = Vec::new();
    for (workers, reason) in &line.missing {
        match reasons.iter_mut().find(|(r, _)| r == reason) {
            Some((_, counts)) => counts.push(workers.to_string()),
            None => reasons.push((reason, vec![workers.to_string()])),
        }
    }
    reasons
        .into_iter()
        .map(|(reason, counts)| {
            format!(
                "{}: no figure at {} workers: {reason}",
                line.label,
                counts.join(", ")
            )
        })
        .collect()
}

/// Writes W7B's plot of one backend's `figures` into `dir`/w7b-BACKEND.svg (items/s against
/// workers, one line per implementation, titled with the backend, `cores` and `date`);
/// returns its path, or `None` when the figures hold no W7B.
pub(crate) fn write_burn(
    dir: &Path,
    backend: Backend,
    figures: &[Figure],
    (cores, date): (usize, &str),
    caption: &str,
) -> Result<Option<PathBuf>, String> {
    let Some(burn) = Burn::new(backend, figures, cores, date, caption) else {
        return Ok(None);
    };
    let path = in_dir(dir, &burn_file(backend))?;
    burn.draw(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some(path))
}

/// The bars of the comparison: the shapes (W1, each of W7's), the implementations, and each
/// implementation's items/s at each shape (`None` where it was not measured or is n/a).
type Bars = (Vec<String>, Vec<&'static str>, Vec<Vec<Option<f64>>>);

/// The items/s figures of `figures`, by shape and implementation, ours first.
fn bars(figures: &[Figure]) -> Bars {
    let rates: Vec<&Figure> = figures
        .iter()
        .filter(|f| f.metric == "items_per_s")
        .collect();
    let mut shapes: Vec<(&str, Option<Shape>)> = Vec::new();
    let mut imps: Vec<&'static str> = Vec::new();
    for f in &rates {
        if !shapes.contains(&(f.workload, f.shape)) {
            shapes.push((f.workload, f.shape));
        }
        if !imps.contains(&f.imp) {
            imps.push(f.imp);
        }
    }
    imps.sort_by_key(|imp| !is_ours(imp));
    let values = imps
        .iter()
        .map(|imp| {
            shapes
                .iter()
                .map(|&(workload, shape)| {
                    rates
                        .iter()
                        .find(|f| f.imp == *imp && f.workload == workload && f.shape == shape)
                        .filter(|f| f.na.is_none() && f.median.is_finite())
                        .map(|f| f.median)
                })
                .collect()
        })
        .collect();
    let labels = shapes
        .iter()
        .map(|(workload, shape)| match shape {
            Some(shape) => format!("{workload} {shape}"),
            None => (*workload).to_owned(),
        })
        .collect();
    (labels, imps, values)
}

/// Writes the comparison of one backend's `figures` into `dir`/compare-BACKEND.svg: items/s
/// per shape, one bar per implementation; returns its path.
pub(crate) fn write_compare(
    dir: &Path,
    backend: Backend,
    figures: &[Figure],
    caption: &str,
) -> Result<PathBuf, String> {
    let (labels, imps, values) = bars(figures);
    if labels.is_empty() {
        return Err("no items/s figures to plot".to_owned());
    }
    let path = in_dir(
        dir,
        &format!("compare-{}.svg", backend.name().to_lowercase()),
    )?;
    let title = format!("{} beside its peers: items/s per shape", backend.name());
    draw_bars(&path, &title, &labels, &imps, &values, caption)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

fn draw_bars(
    path: &Path,
    title: &str,
    labels: &[String],
    imps: &[&str],
    values: &[Vec<Option<f64>>],
    caption: &str,
) -> Result<(), String> {
    let error = |e: &dyn std::fmt::Display| e.to_string();
    let width = (180 * labels.len() as u32).clamp(700, 1600);
    let root = SVGBackend::new(path, (width, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| error(&e))?;
    let (top, bottom) = root.split_vertically(490);
    foot(&bottom, &[caption.to_owned()])?;
    let highest = values
        .iter()
        .flatten()
        .flatten()
        .copied()
        .fold(1.0_f64, f64::max);
    let groups = labels.len() as f64;
    let mut chart = ChartBuilder::on(&top)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..groups, 0.0..highest * 1.15)
        .map_err(|e| error(&e))?;
    // Ticks at every half group: the labels sit at the middles.
    let label = |x: &f64| {
        let middle = x - 0.5;
        if (middle - middle.round()).abs() < 1e-6 && middle >= -1e-6 {
            labels
                .get(middle.round() as usize)
                .cloned()
                .unwrap_or_default()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(labels.len() * 2 + 1)
        .x_label_formatter(&label)
        .y_desc("items/s")
        .y_label_formatter(&|y| rate_label(*y))
        .draw()
        .map_err(|e| error(&e))?;
    let share = 0.8 / imps.len().max(1) as f64;
    for (i, (imp, row)) in imps.iter().zip(values).enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(row.iter().enumerate().filter_map(|(g, v)| {
                let v = (*v)?;
                let x0 = g as f64 + 0.1 + i as f64 * share;
                Some(Rectangle::new(
                    [(x0, 0.0), (x0 + share * 0.9, v)],
                    colour.filled(),
                ))
            }))
            .map_err(|e| e.to_string())?
            .label(*imp)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 11))
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| error(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{
        APALIS_POSTGRES, OURS_POSTGRES, OURS_REDIS, PGBOSS, RIVERQUEUE, Sample, aggregate,
    };

    fn one_process(workers: u32) -> Shape {
        Shape {
            processes: 1,
            workers,
            handler_ms: 0,
        }
    }

    /// A burn-down on PostgreSQL: ours at 4, 64 and 2,000 workers, riverqueue at 4 and 64
    /// (it failed at 2,000: no figure), apalis-postgres and pg-boss n/a everywhere, and a
    /// W7S figure that is not the burn-down's.
    fn burn_figures() -> Vec<Figure> {
        let mut samples = Vec::new();
        for (workers, river) in [(4, Some(900.0)), (64, Some(2_500.0)), (2_000, None)] {
            let at = one_process(workers);
            samples.push(
                Sample::not_applicable(BURN_ID, PGBOSS, "items_per_s", "no burn-down").at(at),
            );
            if let Some(river) = river {
                samples.push(Sample::new(BURN_ID, RIVERQUEUE, "items_per_s", river).at(at));
            }
            let ours = 1_000.0 * f64::from(workers).sqrt();
            samples.push(Sample::new(BURN_ID, OURS_POSTGRES, "items_per_s", ours).at(at));
            samples.push(
                Sample::not_applicable(BURN_ID, APALIS_POSTGRES, "items_per_s", "it stalls").at(at),
            );
        }
        samples.push(Sample::new(SCALE_ID, OURS_POSTGRES, "items_per_s", 1e6).at(one_process(16)));
        aggregate(&samples)
    }

    #[test]
    fn the_burn_down_has_a_line_per_implementation_and_names_what_is_missing() {
        let figures = burn_figures();
        let burn = Burn::new(Backend::Postgres, &figures, 2, "2026-12-08", "a machine").unwrap();
        let labels: Vec<&str> = burn.lines.iter().map(|l| l.label.as_str()).collect();
        // Ours first, then the peers in the order they ran; W7S's figure is not in it.
        assert_eq!(labels, [OURS_POSTGRES, PGBOSS, RIVERQUEUE, APALIS_POSTGRES]);
        assert_eq!(burn.workers, [4, 64, 2_000]);
        let ours = &burn.lines[0];
        assert_eq!(ours.points.len(), 3);
        assert_eq!(ours.points[2], (2_000.0, 1_000.0 * 2_000f64.sqrt()));
        assert!(ours.missing.is_empty());
        // A point that is not there is missing, not zero.
        let river = &burn.lines[2];
        assert_eq!(river.points, [(4.0, 900.0), (64.0, 2_500.0)]);
        assert_eq!(river.missing, [(2_000, NOT_MEASURED.to_owned())]);
        let apalis = &burn.lines[3];
        assert!(apalis.points.is_empty());
        assert_eq!(apalis.missing.len(), 3);
        assert_eq!(
            burn.foot,
            [
                "a machine".to_owned(),
                format!("{PGBOSS}: no figure at 4, 64, 2000 workers: no burn-down"),
                format!("{RIVERQUEUE}: no figure at 2000 workers: {NOT_MEASURED}"),
                format!("{APALIS_POSTGRES}: no figure at 4, 64, 2000 workers: it stalls"),
            ]
        );
        // The axes hold 1 worker to the most, and 0 to above the highest rate.
        assert!(burn.x.start < 1.0 && burn.x.start > 0.5, "{:?}", burn.x);
        assert!(burn.x.end > 2_000.0 && burn.x.end < 3_000.0, "{:?}", burn.x);
        let highest = 1_000.0 * 2_000f64.sqrt();
        assert_eq!(burn.y.start, 0.0);
        assert!(
            burn.y.end > highest && burn.y.end < highest * 1.2,
            "{:?}",
            burn.y
        );
        assert!(burn.title.contains("PostgreSQL"), "{}", burn.title);
        assert!(burn.title.contains("2 cores") && burn.title.contains("2026-12-08"));
    }

    #[test]
    fn the_burn_down_plot_names_each_worker_count_and_its_notes() {
        let dir = std::env::temp_dir().join(format!("wq-bench-burn-{}", std::process::id()));
        let figures = burn_figures();
        let path = write_burn(
            &dir,
            Backend::Postgres,
            &figures,
            (2, "2026-12-08"),
            "a machine",
        )
        .unwrap()
        .expect("a plot of W7B's figures");
        assert_eq!(path, dir.join("w7b-postgresql.svg"));
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        // Each worker count is a tick's label, and every implementation is in the legend.
        for workers in ["4", "64", "2000"] {
            assert!(
                svg.contains(&format!(">\n{workers}\n</text>")),
                "{workers}: {svg}"
            );
        }
        for text in [
            "riverqueue",
            "apalis-postgres (n/a)",
            "it stalls",
            "2026-12-08",
        ] {
            assert!(svg.contains(text), "{text} not in {svg}");
        }
        // Without W7B's figures there is no plot to write.
        let none = write_burn(
            &dir,
            Backend::Redis,
            &figures[figures.len() - 1..],
            (2, ""),
            "",
        );
        assert_eq!(none, Ok(None));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_comparison_has_a_bar_per_implementation_at_every_shape() {
        let shape = Shape {
            processes: 1,
            workers: 16,
            handler_ms: 0,
        };
        let figures = aggregate(&[
            Sample::new("W1", "bullmq-official", "items_per_s", 5_000.0),
            Sample::new("W1", OURS_REDIS, "items_per_s", 9_000.0),
            Sample::new("W7", OURS_REDIS, "items_per_s", 40_000.0).at(shape),
            Sample::not_applicable("W7", "apalis-redis", "items_per_s", "no").at(shape),
            Sample::new("W7", OURS_REDIS, "pickup_p99_ms", 2.0).at(shape),
        ]);
        let (labels, imps, values) = bars(&figures);
        assert_eq!(labels, ["W1", "W7 1p x 16w, 0 ms"]);
        assert_eq!(imps, [OURS_REDIS, "bullmq-official", "apalis-redis"]);
        assert_eq!(values[0], [Some(9_000.0), Some(40_000.0)]);
        assert_eq!(values[1], [Some(5_000.0), None]);
        assert_eq!(values[2], [None, None]);
        let dir = std::env::temp_dir().join(format!("wq-bench-plot-{}", std::process::id()));
        let path = write_compare(&dir, Backend::Redis, &figures, "a machine").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("bullmq-official"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
