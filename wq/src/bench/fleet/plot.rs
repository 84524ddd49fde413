//! The plot of W7's scaling sweep (`wq bench --plot DIR`): items/s and pickup p99 against
//! workers per process, one line per implementation, processes and handler time, written as
//! SVG with `plotters`.

use std::path::{Path, PathBuf};

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::super::report::{Figure, Shape};
use super::{SCALE_ID, SCALE_WORKERS};

/// The file name of the plot in its directory.
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

/// Writes the plot of the sweep's figures into `dir`; returns its path. `caption` says where
/// the figures come from (machine, server).
pub(crate) fn write_plot(dir: &Path, figures: &[Figure], caption: &str) -> Result<PathBuf, String> {
    let rate = lines(figures, "items_per_s");
    let p99 = lines(figures, "pickup_p99_ms");
    if rate.is_empty() {
        return Err(format!("no {SCALE_ID} figures to plot"));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(FILE);
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

fn draw(path: &Path, rate: &[Line], p99: &[Line], caption: &str) -> Result<(), String> {
    let root = SVGBackend::new(path, (1100, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = root
        .titled(
            &format!(
                "W7 on a server: how throughput and pickup latency grow with workers ({caption})"
            ),
            ("sans-serif", 16),
        )
        .map_err(|e| e.to_string())?;
    let (left, right) = root.split_horizontally(550);
    let workers = |lines: &[Line]| {
        let max = lines
            .iter()
            .flat_map(|(_, p)| p.iter().map(|&(x, _)| x))
            .fold(f64::from(SCALE_WORKERS[SCALE_WORKERS.len() - 1]), f64::max);
        (0.8..max * 1.25).log_scale()
    };
    let top = |lines: &[Line]| {
        lines
            .iter()
            .flat_map(|(_, p)| p.iter().map(|&(_, y)| y))
            .fold(0.0_f64, f64::max)
            * 1.15
    };
    let x_labels = |x: &f64| format!("{x:.0}");

    let mut chart = ChartBuilder::on(&left)
        .caption("items/s (flood)", ("sans-serif", 14))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(workers(rate), 0.0..top(rate).max(1.0))
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("workers per process")
        .x_label_formatter(&x_labels)
        .y_label_formatter(&|y| format!("{:.0}k", y / 1e3))
        .draw()
        .map_err(|e| e.to_string())?;
    series(&mut chart, rate)?;

    let mut chart = ChartBuilder::on(&right)
        .caption(
            "pickup p99, ms (paced at half the flood's rate)",
            ("sans-serif", 14),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(workers(p99), 0.0..top(p99).max(1.0))
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("workers per process")
        .x_label_formatter(&x_labels)
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()
        .map_err(|e| e.to_string())?;
    series(&mut chart, p99)?;
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

/// Draws `lines` with markers and a legend.
fn series<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<LogCoord<f64>, RangedCoordf64>>,
    lines: &[Line],
) -> Result<(), String> {
    for (i, (label, points)) in lines.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
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
                    .map(|&point| Circle::new(point, 3, colour.filled())),
            )
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 11))
        .draw()
        .map_err(|e| e.to_string())
}
