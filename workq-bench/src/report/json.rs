//! `--json`: one JSON object per line and figure, docs/bench-workloads.md's format with a few more
//! keys: `{"workload": "W1", "impl": "workq", "metric": "items_per_s", "value": 3100000.0,
//! "min": ..., "max": ..., "runs": 3}`. A fleet workload's lines carry its shape (`"processes"`,
//! `"workers"`, `"handler_ms"`); a reference's lines carry its `"version"` and `"settings"` (how it
//! was set up); a figure a reference cannot run has `"value": null` and the reason in `"na"`.

use super::Figure;

/// What the report says of a reference: its release and how it was set up.
#[derive(Debug, Clone)]
pub(crate) struct About {
    /// Its `impl`.
    pub(crate) imp: &'static str,
    pub(crate) version: String,
    pub(crate) settings: String,
}

/// Prints the figures, one line each.
pub(crate) fn print(figures: &[Figure], about: &[About]) {
    for f in figures {
        println!("{}", line(f, about));
    }
}

/// The JSON object of one figure.
pub(crate) fn line(f: &Figure, about: &[About]) -> serde_json::Value {
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
    if let Some(reason) = &f.na {
        line["value"] = serde_json::Value::Null;
        line["min"] = serde_json::Value::Null;
        line["max"] = serde_json::Value::Null;
        line["na"] = reason.as_str().into();
    }
    if let Some((runs, error)) = &f.failed {
        // Every run failed (with `na`, the same error), or these of them.
        line["failed_runs"] = (*runs).into();
        line["error"] = error.as_str().into();
    }
    if let Some(a) = about.iter().find(|a| a.imp == f.imp) {
        line["version"] = a.version.as_str().into();
        line["settings"] = a.settings.as_str().into();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Sample, Shape, aggregate};

    #[test]
    fn a_line_has_bench_md_s_keys_and_the_peer_s_and_the_shape_s() {
        let shape = Shape {
            processes: 4,
            workers: 16,
            handler_ms: 1,
        };
        let figures = aggregate(&[
            Sample::new("W7", "riverqueue", "items_per_s", 2400.0).at(shape),
            Sample::not_applicable("W3", "apalis-postgres", "adds_per_s", "no dedup"),
        ]);
        let about = [About {
            imp: "riverqueue",
            version: "0.5.0".into(),
            settings: "max_workers 16".into(),
        }];
        let w7 = line(&figures[0], &about);
        assert_eq!(w7["workload"], "W7");
        assert_eq!(w7["impl"], "riverqueue");
        assert_eq!(w7["metric"], "items_per_s");
        assert_eq!(w7["value"], 2400.0);
        assert_eq!(w7["runs"], 1);
        assert_eq!(
            (w7["processes"].as_u64(), w7["handler_ms"].as_u64()),
            (Some(4), Some(1))
        );
        assert_eq!(w7["version"], "0.5.0");
        let na = line(&figures[1], &about);
        assert!(na["value"].is_null());
        assert_eq!(na["na"], "no dedup");
        assert!(na.get("version").is_none());
    }
}
