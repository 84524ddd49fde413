//! What a Redis server did, from `INFO all`: calls and time per command
//! (`commandstats`), the server's CPU (`cpu`) and its network bytes (`stats`).

use std::collections::HashMap;

use redis::aio::MultiplexedConnection;

use super::{Figures, TOP_COMMANDS, command_metric, per_item, per_thousand};
use crate::util::text;

/// The commands that run a script; the commands a script calls count in `commandstats`
/// too, under their own names.
const SCRIPT_COMMANDS: &[&str] = &[
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
];

/// The profile's own command, left out of the counts.
const OWN: &str = "info";

/// The counters of one reading.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Reading {
    /// Per command: calls and microseconds.
    pub(crate) commands: HashMap<String, (u64, u64)>,
    /// `used_cpu_user` + `used_cpu_sys`, in seconds.
    pub(crate) cpu_s: f64,
    /// `total_net_input_bytes` + `total_net_output_bytes`.
    pub(crate) net_bytes: u64,
}

/// Parses the text of `INFO all`.
pub(crate) fn parse(info: &str) -> Reading {
    let mut reading = Reading::default();
    for line in info.lines() {
        let Some((key, value)) = line.trim().split_once(':') else {
            continue;
        };
        if let Some(name) = key.strip_prefix("cmdstat_") {
            let mut calls = 0;
            let mut usec = 0;
            for pair in value.split(',') {
                match pair.split_once('=') {
                    Some(("calls", n)) => calls = n.parse().unwrap_or(0),
                    Some(("usec", n)) => usec = n.parse().unwrap_or(0),
                    _ => {}
                }
            }
            reading.commands.insert(name.to_owned(), (calls, usec));
            continue;
        }
        match key {
            "used_cpu_user" | "used_cpu_sys" => {
                reading.cpu_s += value.parse::<f64>().unwrap_or(0.0);
            }
            "total_net_input_bytes" | "total_net_output_bytes" => {
                reading.net_bytes += value.parse::<u64>().unwrap_or(0);
            }
            _ => {}
        }
    }
    reading
}

/// Reads the counters now.
pub(crate) async fn read(connection: &mut MultiplexedConnection) -> Result<Reading, String> {
    let info: String = redis::cmd("INFO")
        .arg("all")
        .query_async(connection)
        .await
        .map_err(text)?;
    Ok(parse(&info))
}

/// The figures per item of what happened between `before` and `after`.
pub(crate) fn figures(before: &Reading, after: &Reading, items: usize) -> Figures {
    let mut deltas: Vec<(&str, u64, u64)> = after
        .commands
        .iter()
        .filter(|(name, _)| name.as_str() != OWN)
        .map(|(name, &(calls, usec))| {
            let (was_calls, was_usec) = before.commands.get(name).copied().unwrap_or_default();
            (
                name.as_str(),
                calls.saturating_sub(was_calls),
                usec.saturating_sub(was_usec),
            )
        })
        .filter(|&(_, calls, _)| calls > 0)
        .collect();
    // Most calls first; by name among equals, so that a run prints the same order.
    deltas.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let calls: u64 = deltas.iter().map(|d| d.1).sum();
    let scripts = deltas.iter().filter(|d| SCRIPT_COMMANDS.contains(&d.0));
    let script_calls: u64 = scripts.clone().map(|d| d.1).sum();
    let script_usec: u64 = scripts.map(|d| d.2).sum();
    let mut out = vec![
        (super::COMMANDS, per_item(calls, items)),
        (super::SCRIPT_CALLS, per_item(script_calls, items)),
        // Microseconds per item are milliseconds per thousand items.
        (super::SCRIPT_MS, per_item(script_usec, items)),
        (
            super::CPU_MS,
            per_thousand((after.cpu_s - before.cpu_s) * 1000.0, items),
        ),
        (
            super::NET_BYTES,
            per_item(after.net_bytes.saturating_sub(before.net_bytes), items),
        ),
    ];
    out.extend(
        deltas
            .iter()
            .take(TOP_COMMANDS)
            .map(|&(name, calls, _)| (command_metric(name), per_item(calls, items))),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.000000\r\n\
        # Stats\r\ntotal_net_input_bytes:1000\r\ntotal_net_output_bytes:500\r\n\
        # Commandstats\r\ncmdstat_info:calls=3,usec=90,usec_per_call=30.00\r\n\
        cmdstat_evalsha:calls=10,usec=100,usec_per_call=10.00,rejected_calls=0\r\n";
    const AFTER: &str = "# CPU\r\nused_cpu_sys:2.000000\r\nused_cpu_user:3.500000\r\n\
        # Stats\r\ntotal_net_input_bytes:41000\r\ntotal_net_output_bytes:20500\r\n\
        # Commandstats\r\ncmdstat_info:calls=4,usec=120,usec_per_call=30.00\r\n\
        cmdstat_evalsha:calls=1010,usec=20100,usec_per_call=19.90\r\n\
        cmdstat_zadd:calls=3000,usec=3000,usec_per_call=1.00\r\n\
        cmdstat_lpush:calls=500,usec=500,usec_per_call=1.00\r\n\
        cmdstat_client|setname:calls=4,usec=4,usec_per_call=1.00\r\n\
        cmdstat_ping:calls=4,usec=4,usec_per_call=1.00\r\n";

    #[test]
    fn the_deltas_per_item_leave_out_the_profile_s_own_info() {
        let (before, after) = (parse(BEFORE), parse(AFTER));
        assert!((before.cpu_s - 3.5).abs() < 1e-9);
        assert_eq!(after.commands["client|setname"], (4, 4));
        let figures = figures(&before, &after, 1000);
        let get = |metric: &str| figures.iter().find(|f| f.0 == metric).map(|f| f.1);
        // 1,000 evalsha + 3,000 zadd + 500 lpush + 4 + 4, not the info.
        assert_eq!(get(super::super::COMMANDS), Some(4.508));
        assert_eq!(get(super::super::SCRIPT_CALLS), Some(1.0));
        assert_eq!(get(super::super::SCRIPT_MS), Some(20.0));
        assert_eq!(get(super::super::CPU_MS), Some(2000.0));
        assert_eq!(get(super::super::NET_BYTES), Some(60.0));
        let top: Vec<&str> = figures.iter().skip(5).map(|f| f.0).collect();
        assert_eq!(
            top,
            [
                "cmd_zadd_per_item",
                "cmd_evalsha_per_item",
                "cmd_lpush_per_item"
            ]
        );
    }
}
