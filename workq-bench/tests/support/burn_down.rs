//! What `wq-bench -w W7B --workers 4,64 --plot DIR --json` must give on any server: shared
//! by `redis.rs` and `postgres.rs` (a module of each, not a test binary of its own).

use std::path::Path;

/// The worker counts the tests ask for.
pub(crate) const WORKERS: &str = "4,64";

/// The arguments of the run: `server` (the server's option, and the one that skips its node
/// reference), then a quick W7B at [`WORKERS`], ours only, its plot into `dir`, JSON lines.
pub(crate) fn args(server: [&str; 2], dir: &Path) -> Vec<String> {
    let dir = dir.to_str().expect("a UTF-8 path");
    let run = [
        "--quick",
        "-w",
        "W7B",
        "--workers",
        WORKERS,
        "--plot",
        dir,
        "--json",
    ];
    server.iter().chain(&run).map(|&a| a.to_owned()).collect()
}

/// Checks the run's `stdout` and its plot in `dir` for our queue on the server whose `impl` is
/// `ours` (`workq-redis`, `workq-postgres`) and whose plot is `file`: every line in the bench
/// JSON schema with W7B's shape (one process, a handler that returns at once), one positive
/// items/s per worker count and nothing else (no W7S beside it, no reference), and the plot
/// naming each worker count.
pub(crate) fn check(stdout: &str, dir: &Path, file: &str, ours: &str) {
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let mut workers = Vec::new();
    for line in &lines {
        assert_eq!(line["workload"], "W7B", "{line}");
        assert_eq!(line["impl"], ours, "{line}");
        assert_eq!(line["metric"], "items_per_s", "{line}");
        assert_eq!(line["runs"], 1, "{line}");
        for key in ["value", "min", "max"] {
            assert!(line[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {line}");
        }
        assert_eq!(line["processes"], 1, "{line}");
        assert_eq!(line["handler_ms"], 0, "{line}");
        workers.push(line["workers"].as_u64().expect("a worker count"));
    }
    assert_eq!(workers, [4, 64], "one figure per worker count: {stdout}");

    let svg = std::fs::read_to_string(dir.join(file)).expect("the plot is written");
    assert!(svg.starts_with("<svg") && svg.contains("W7B on"), "{svg}");
    for count in WORKERS.split(',') {
        // A tick's label is a text element of its own.
        assert!(
            svg.contains(&format!(">\n{count}\n</text>")),
            "{count} workers not named in {svg}"
        );
    }
    assert!(svg.contains(ours), "{svg}");
}
