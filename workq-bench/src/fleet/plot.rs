//! The plots of `wq-bench --plot DIR`, as SVG with `plotters`: W7's scaling sweep (items/s
//! and pickup p99 against workers per process, one line per implementation, processes and
//! handler time), and with `--compare` items/s per shape with one bar per implementation.

use std::path::{Path, PathBuf};

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::{SCALE_ID, SCALE_WORKERS};
use crate::report::{Figure, Shape, is_ours};
use crate::server::Backend;

/// The file name of the sweep's plot in its directory (with one server).
pub(crate) const FILE: &str = "w7-scaling.svg";

/// One line of a panel: its label and its (workers, value) points.
type Line = (String, Vec<(f64, f64)>);

/// The lines of `metric` in the sweep's figures.
fn lines(figures: &[Figure], metric: &str) -> Vec<Line> {
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for f in figures {
        let (Some(shape), true) = (f.shape, f.workload == SCALE_ID && f.metric == metric) else {
            continue;
        };
        if !f.median.is_finite() {
            continue;
        }
        let label = label(f.imp, shape);
        let point = (f64::from(shape.workers), f.median);
        match lines.iter_mut().find(|(l, _)| *l == label) {
            Some((_, points)) => points.push(point),
            None => lines.push((label, vec![point])),
        }
    }
    for (_, points) in &mut lines {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    lines
}

fn label(imp: &str, shape: Shape) -> String {
    format!(
        "{imp}, {} process{}, handler {} ms",
        shape.processes,
        if shape.processes == 1 { "" } else { "es" },
        shape.handler_ms
    )
}

/// Writes the plot of the sweep's figures into `dir`/`file`; returns its path. `caption` says
/// where the figures come from (machine, server).
pub(crate) fn write_plot(
    dir: &Path,
    file: &str,
    figures: &[Figure],
    caption: &str,
) -> Result<PathBuf, String> {
    let rate = lines(figures, "items_per_s");
    let p99 = lines(figures, "pickup_p99_ms");
    if rate.is_empty() {
        return Err(format!("no {SCALE_ID} figures to plot"));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(file);
    draw(&path, &rate, &p99, caption).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
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

fn draw(path: &Path, rate: &[Line], p99: &[Line], caption: &str) -> Result<(), String> {
    let error = |e: &dyn std::fmt::Display| e.to_string();
    let root = SVGBackend::new(path, (1100, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| error(&e))?;
    let (top, bottom) = root.split_vertically(470);
    bottom
        .draw(&Text::new(
            caption.to_owned(),
            (12, 8),
            ("sans-serif", 12).into_font().color(&BLACK.mix(0.7)),
        ))
        .map_err(|e| error(&e))?;
    let top = top
        .titled(
            "W7S on a server: items/s and pickup p99 against workers per process",
            ("sans-serif", 16),
        )
        .map_err(|e| error(&e))?;
    let (left, right) = top.split_horizontally(550);
    let xs: Vec<f64> = rate
        .iter()
        .chain(p99)
        .flat_map(|(_, p)| p.iter().map(|&(x, _)| x_of(x)))
        .collect();
    let x_min = xs.iter().copied().fold(f64::INFINITY, f64::min).min(0.0) - 0.25;
    let x_max = xs.iter().copied().fold(
        x_of(f64::from(SCALE_WORKERS[SCALE_WORKERS.len() - 1])),
        f64::max,
    ) + 0.25;
    let half_steps = ((x_max - x_min) * 2.0).ceil() as usize + 1;
    let x_label = |x: &f64| {
        let doubled = x * 2.0;
        if (doubled - doubled.round()).abs() < 1e-6 && *x >= -1e-6 {
            format!("{:.0}", 4f64.powf(*x))
        } else {
            String::new()
        }
    };
    let values = |lines: &[Line]| {
        lines
            .iter()
            .flat_map(|(_, p)| p.iter().map(|&(_, y)| y))
            .collect::<Vec<f64>>()
    };

    let rate_top = values(rate).into_iter().fold(1.0_f64, f64::max) * 1.15;
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
        .y_label_formatter(&|y| format!("{:.0}k", y / 1e3))
        .draw()
        .map_err(|e| error(&e))?;
    series(&mut chart, rate, SeriesLabelPosition::UpperLeft)?;

    let p99_values = values(p99);
    let p99_top = p99_values.iter().copied().fold(1.0_f64, f64::max) * 2.0;
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
    series(&mut chart, p99, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(|e| error(&e))?;
    Ok(())
}

/// Draws `lines` with markers and a legend.
fn series<'a, DB, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    lines: &[Line],
    legend: SeriesLabelPosition,
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    Y: Ranged<ValueType = f64>,
{
    for (i, (label, points)) in lines.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|&(x, y)| (x_of(x), y)),
                colour.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .iter()
                    .map(|&(x, y)| Circle::new((x_of(x), y), 3, colour.filled())),
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
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("compare-{}.svg", backend.name().to_lowercase()));
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
    bottom
        .draw(&Text::new(
            caption.to_owned(),
            (12, 8),
            ("sans-serif", 12).into_font().color(&BLACK.mix(0.7)),
        ))
        .map_err(|e| error(&e))?;
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
        .y_label_formatter(&|y| format!("{:.0}k", y / 1e3))
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
    use crate::report::{OURS_REDIS, Sample, aggregate};

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
