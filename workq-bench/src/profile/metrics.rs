//! The profile's metrics: their names, labels and units, which the report reads too (a
//! leaf module, so that the report need not reach into the profiler).

/// Commands (Redis) per item, every call counted.
pub(crate) const COMMANDS: &str = "commands_per_item";
/// Script calls (`EVAL`, `EVALSHA`, `FCALL` and their read-only forms) per item.
pub(crate) const SCRIPT_CALLS: &str = "script_calls_per_item";
/// Time in scripts, in ms per 1,000 items.
pub(crate) const SCRIPT_MS: &str = "script_ms_per_1k_items";
/// Network bytes in and out per item.
pub(crate) const NET_BYTES: &str = "net_bytes_per_item";
/// The server's CPU time, in ms per 1,000 items.
pub(crate) const CPU_MS: &str = "server_cpu_ms_per_1k_items";
/// Top-level statements (PostgreSQL, `pg_stat_statements`) per item.
pub(crate) const STATEMENTS: &str = "statements_per_item";
/// Transactions (committed and rolled back) per item.
pub(crate) const XACTS: &str = "xacts_per_item";
/// WAL bytes per item.
pub(crate) const WAL_BYTES: &str = "wal_bytes_per_item";
/// Rows fetched per item.
pub(crate) const ROWS_FETCHED: &str = "rows_fetched_per_item";
/// Rows inserted per item.
pub(crate) const ROWS_INSERTED: &str = "rows_inserted_per_item";
/// Rows updated per item.
pub(crate) const ROWS_UPDATED: &str = "rows_updated_per_item";
/// Rows deleted per item.
pub(crate) const ROWS_DELETED: &str = "rows_deleted_per_item";

/// The prefix and suffix of a command's own figure: `cmd_NAME_per_item`.
pub(crate) const COMMAND_PREFIX: &str = "cmd_";
pub(crate) const COMMAND_SUFFIX: &str = "_per_item";

/// Whether `metric` is one of the profile's (all of them per item: lower is better).
pub(crate) fn is_profile_metric(metric: &str) -> bool {
    metric.ends_with("_per_item") || metric.ends_with("_per_1k_items")
}

/// A profile figure with its unit, or `None` for another metric.
pub(crate) fn format_value(metric: &str, v: f64) -> Option<String> {
    if !is_profile_metric(metric) {
        return None;
    }
    Some(if metric.ends_with("_ms_per_1k_items") {
        format!("{v:.1} ms")
    } else if metric.ends_with("bytes_per_item") {
        format!("{v:.0} B")
    } else {
        format!("{v:.2}")
    })
}

/// A profile figure's name in the tables (`metric` itself for another metric).
pub(crate) fn label(metric: &str) -> &str {
    match metric {
        COMMANDS => "commands/item",
        SCRIPT_CALLS => "script calls/item",
        SCRIPT_MS => "script time/1k items",
        NET_BYTES => "net bytes/item",
        CPU_MS => "server CPU/1k items",
        STATEMENTS => "statements/item",
        XACTS => "transactions/item",
        WAL_BYTES => "WAL bytes/item",
        ROWS_FETCHED => "rows fetched/item",
        ROWS_INSERTED => "rows inserted/item",
        ROWS_UPDATED => "rows updated/item",
        ROWS_DELETED => "rows deleted/item",
        other => other,
    }
}
