//! What `wq-bench -w W8 --json` must say on any server: shared by `redis.rs` and
//! `postgres.rs` (a module of each, not a test binary of its own).

/// Checks W8's lines for our queues on the server whose `impl` is `ours` (`workq-redis`,
/// `workq-postgres`): every figure of the three queues, the limited one within its limits
/// (8 per group, 12 in all), the others over 8 in one group at some moment (so the limits,
/// not the workload, held the limited one), and nothing but W8 and ours.
pub(crate) fn check(lines: &[serde_json::Value], ours: &str) {
    let figure = |imp: &str, metric: &str| -> f64 {
        lines
            .iter()
            .find(|v| v["workload"] == "W8" && v["impl"] == imp && v["metric"] == metric)
            .and_then(|v| v["value"].as_f64())
            .unwrap_or_else(|| panic!("no W8 {metric} of {imp} in {lines:?}"))
    };
    let (fifo, limited) = (format!("{ours}-fifo"), format!("{ours}-limited"));
    for imp in [ours, fifo.as_str(), limited.as_str()] {
        let (p50, p99, max) = (
            figure(imp, "quiet_pickup_p50_ms"),
            figure(imp, "quiet_pickup_p99_ms"),
            figure(imp, "quiet_pickup_max_ms"),
        );
        assert!(
            0.0 <= p50 && p50 <= p99 && p99 <= max,
            "{imp}: {p50} {p99} {max}"
        );
        for rate in ["items_per_s", "noisy_items_per_s"] {
            assert!(figure(imp, rate) > 0.0, "{imp} {rate}");
        }
    }
    assert!(figure(&limited, "max_group_in_flight") <= 8.0);
    assert!(figure(&limited, "max_leases_held") <= 12.0);
    assert!(figure(&fifo, "max_group_in_flight") > 8.0);
    assert!(
        lines
            .iter()
            .all(|v| v["workload"] == "W8"
                && v["impl"].as_str().is_some_and(|i| i.starts_with(ours))),
        "no reference was asked for: {lines:?}"
    );
}
