//! W6 memory: the peak resident memory above a baseline after adding 1,000,000 distinct
//! keys with no consumer (200,000 with `--quick`), and after `add_after` of as many keys
//! with a 60 s delay. Figures: bytes per queued item, bytes per delayed item.
//!
//! Each case runs in a fresh child process (this binary re-run with a hidden option), so
//! that the memory the other workloads left in the allocator neither hides nor inflates
//! anything. The child builds its keys (which are not counted: a controller has them
//! anyway), creates the queue, resets the kernel's peak-RSS mark (writing `5` to
//! `/proc/self/clear_refs`), reads the baseline (`VmRSS` of `/proc/self/status`, the
//! resident figure of `/proc/self/statm` in kB), adds the items, and reads the peak
//! (`VmHWM`). Where the mark cannot be reset, the peak falls back to the RSS sampled after
//! the adds.
//!
//! Beside ours, for scale: an unbounded crossbeam channel holding the same key clones
//! (a transport that tracks nothing: about the size of a key handle per item), and
//! tokio-util's `DelayQueue` holding the delayed ones.
//!
//! Caveats: RSS counts whole pages and what the allocator keeps (its growth policy too), so
//! the figure is what the process costs the machine, not the sum of the structures' sizes;
//! a table or vector that just doubled shows up with its spare half. Linux only.

use std::process::{Command, ExitCode};
use std::time::Duration;

use workq::WorkQueue;

use crate::ctx::Ctx;
use crate::report::{CROSSBEAM, DELAY_QUEUE, OURS, Sample};
use crate::util::{self, Key};

const ID: &str = "W6";
/// The delay of the delayed case: long enough that nothing comes due while measuring.
const DELAY: Duration = Duration::from_secs(60);

/// The cases: (child argument, implementation, metric).
const CASES: &[(&str, &str, &str)] = &[
    ("queued", OURS, "bytes_per_item"),
    ("delayed", OURS, "bytes_per_delayed_item"),
    ("crossbeam", CROSSBEAM, "bytes_per_item"),
    ("delayqueue", DELAY_QUEUE, "bytes_per_delayed_item"),
];

pub(crate) fn run(ctx: &Ctx<'_>) -> Vec<Sample> {
    let n = if ctx.quick { 200_000 } else { 1_000_000 };
    let mut out = Vec::new();
    for &(case, imp, metric) in CASES {
        ctx.step(&format!("{imp} ({case}), in a child process"));
        match measure_in_child(case, n) {
            Ok(bytes) => out.push(Sample::new(ID, imp, metric, bytes)),
            Err(err) => eprintln!("W6 {case}: {err}"),
        }
    }
    out
}

/// Runs case `case` in a child process; returns its bytes per item.
fn measure_in_child(case: &str, n: usize) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let output = Command::new(exe)
        .args(["--w6-child", case, "--w6-items", &n.to_string()])
        .output()
        .map_err(|e| format!("cannot run the child: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "child failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let value: serde_json::Value = serde_json::from_str(stdout.trim())
        .map_err(|e| format!("unreadable child output {stdout:?}: {e}"))?;
    value["bytes_per_item"]
        .as_f64()
        .ok_or_else(|| format!("no bytes_per_item in {stdout:?}"))
}

/// The child's side: measures `case` with `n` items and prints
/// `{"bytes_per_item": ..., ...}` on stdout.
pub(crate) fn child(case: &str, n: usize) -> ExitCode {
    if n == 0 {
        eprintln!("wq-bench --w6-child: --w6-items must be positive");
        return ExitCode::FAILURE;
    }
    let keys = util::keys(n);
    let measured = match case {
        "queued" => {
            let queue: WorkQueue<Key> = WorkQueue::new();
            let m = measure(n, || keys.iter().for_each(|k| queue.add(k.clone())));
            assert_eq!(queue.len(), n);
            m
        }
        "delayed" => {
            let queue: WorkQueue<Key> = WorkQueue::new();
            let m = measure(n, || {
                keys.iter().for_each(|k| queue.add_after(k.clone(), DELAY));
            });
            assert_eq!(queue.delayed_len(), n);
            m
        }
        "crossbeam" => {
            let (tx, rx) = crossbeam_channel::unbounded::<Key>();
            let m = measure(n, || {
                keys.iter()
                    .for_each(|k| tx.send(k.clone()).expect("receiver alive"));
            });
            assert_eq!(rx.len(), n);
            m
        }
        "delayqueue" => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a tokio runtime");
            let _entered = rt.enter();
            let mut queue = tokio_util::time::DelayQueue::<Key>::new();
            let m = measure(n, || {
                keys.iter().for_each(|k| {
                    queue.insert(k.clone(), DELAY);
                });
            });
            assert_eq!(queue.len(), n);
            m
        }
        other => {
            eprintln!("wq-bench --w6-child: unknown case {other:?}");
            return ExitCode::FAILURE;
        }
    };
    match measured {
        Ok(m) => {
            let line = serde_json::json!({
                "case": case,
                "items": n,
                "bytes_per_item": m.bytes_per_item,
                "baseline_kb": m.baseline_kb,
                "peak_kb": m.peak_kb,
                "peak_from": m.peak_from,
            });
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("wq-bench --w6-child: {err}");
            ExitCode::FAILURE
        }
    }
}

/// What [`measure`] found.
struct Measured {
    bytes_per_item: f64,
    baseline_kb: u64,
    peak_kb: u64,
    /// `"VmHWM"`, or `"VmRSS"` where the peak mark could not be reset.
    peak_from: &'static str,
}

/// Runs `add` (which adds `n` items) between a baseline and a peak reading.
fn measure(n: usize, add: impl FnOnce()) -> Result<Measured, String> {
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let baseline_kb = status_kb("VmRSS")?;
    add();
    let rss_kb = status_kb("VmRSS")?;
    let (peak_kb, peak_from) = if reset {
        (status_kb("VmHWM")?.max(rss_kb), "VmHWM")
    } else {
        (rss_kb, "VmRSS")
    };
    Ok(Measured {
        bytes_per_item: peak_kb.saturating_sub(baseline_kb) as f64 * 1024.0 / n as f64,
        baseline_kb,
        peak_kb,
        peak_from,
    })
}

/// A `kB` field of `/proc/self/status`.
fn status_kb(field: &str) -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
    status
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix(field)?.strip_prefix(':')?;
            rest.trim().trim_end_matches("kB").trim().parse().ok()
        })
        .ok_or_else(|| format!("no {field} in /proc/self/status"))
}
