//! Flow control on Redis: the client's part. The rules themselves run on the server, in
//! `lua/flow.lua` (whose header describes every key and the cost of each decision), called
//! by the queue's scripts on a queue whose settings hash exists.
//!
//! # Where things live
//!
//! - **The group function** runs in the adding process, at every add (`add`, `add_with`,
//!   `add_after`, `add_rate_limited`, `add_all*`, a failed item's retry, a periodic tick,
//!   an operator's retry through a typed handle): the group's name travels with the add, as
//!   one more argument of its script. The server keeps each item's group while it holds the
//!   item (queued, delayed, leased or re-added), so equal items stay in one group whatever
//!   the process that re-adds them, and a dead letter keeps its item's group for a requeue.
//! - **The settings** ([`FlowLimits`]) live on the server beside the queue, in
//!   `prefix:{name}:flow` (the same hash tag): every decision reads them there, so every
//!   process applies the same limits, and an operator's view shows them.
//!
//! # Two processes with different settings
//!
//! A handle built with flow settings writes them at build, and **the last one built wins**:
//! its settings replace the queue's for every process at once (it logs a warning naming the
//! settings it replaced). A process built earlier with other settings applies the new ones
//! from its next decision on, since they are read on the server, and logs a warning once
//! when it sees that they changed (the generation sent with each hand-out tells it).
//!
//! A handle built with **no** flow setting changes nothing on the server: on a queue that has
//! flow control it follows the queue's settings (its gets obey the limits; its adds carry no
//! group, so their items join the group `""`, with a warning at build when the queue groups
//! its items). That is what an operator's handle ([`RedisAdmin`](crate::RedisAdmin)) is,
//! and what a producer built without `group_by` would be: neither may switch a fleet's flow
//! control off by starting. [`RedisQueue::clear_flow_control`](crate::RedisQueue::clear_flow_control)
//! takes it off on purpose ([`RedisQueue::delete`](crate::RedisQueue::delete) too, with the
//! rest of the queue).
//!
//! A queue that had no flow control gets it when the first handle with settings is built:
//! the items it already holds join the group `""` (no group function ran at their adds).

use std::sync::atomic::{AtomicU64, Ordering};

use redis::Value;
use workq::admin::Stats;
use workq::flow::{FlowLimits, HandOutRate};
use workq::{FlowStats, GroupStats};

use crate::connection::Conn;
use crate::error::Error;
use crate::reply::{count, number, parts, parts_ref, span, text};
use crate::scripts::{Keys, SCRIPTS};

/// What a handle knows of the queue's flow control settings.
#[derive(Debug, Default)]
pub(crate) struct FlowSide {
    /// The handle was built with settings of its own (it wrote them).
    own: bool,
    /// The generation of the settings this handle last saw (0: none).
    generation: AtomicU64,
}

impl FlowSide {
    /// A handle built with its own settings (`own`), which saw generation `generation`.
    pub(crate) fn new(own: bool, generation: u64) -> Self {
        FlowSide {
            own,
            generation: AtomicU64::new(generation),
        }
    }

    /// A hand-out came with the settings' generation `generation`: a handle whose own
    /// settings were replaced by another process's warns, once per change.
    pub(crate) fn saw(&self, queue: &str, generation: u64) {
        let before = self.generation.swap(generation, Ordering::Relaxed);
        if self.own && before != generation && before != 0 {
            tracing::warn!(
                queue,
                "workq-redis: another process replaced this queue's flow control settings \
                 (the last handle built with settings wins); this process applies the new ones, \
                 which are kept on the server"
            );
        }
    }
}

/// The name of a hand-out rate's fields: microseconds between tokens and the burst.
fn rate_value(rate: &HandOutRate) -> (String, String) {
    // The interval in microseconds, as a float: a rate need not divide a second evenly.
    let micros = rate.interval_nanos() as f64 / 1000.0;
    (format!("{micros:?}"), rate.burst.to_string())
}

/// The settings' JSON and the fields of the settings hash (see `lua/flow.lua`), for the
/// `flow_set` script.
pub(crate) fn settings_args(limits: &FlowLimits) -> Result<Vec<String>, Error> {
    let json = serde_json::to_string(limits).map_err(Error::Serialize)?;
    let mut args = vec![json];
    let mut field = |name: String, value: String| {
        args.push(name);
        args.push(value);
    };
    if let Some(max) = limits.max_in_flight {
        field("max".into(), max.to_string());
    }
    if let Some(limit) = limits.max_in_flight_per_group {
        field("pg".into(), limit.to_string());
    }
    if let Some(rate) = &limits.hand_out_rate {
        let (interval, burst) = rate_value(rate);
        field("ri".into(), interval);
        field("rb".into(), burst);
    }
    if let Some(rate) = &limits.hand_out_rate_per_group {
        let (interval, burst) = rate_value(rate);
        field("gri".into(), interval);
        field("grb".into(), burst);
    }
    let overrides = !limits.group_max_in_flight.is_empty()
        || limits.group_weights.values().any(|&w| w > 1)
        || !limits.group_hand_out_rates.is_empty();
    if overrides {
        field("ov".into(), "1".into());
    }
    if limits.hand_out_rate_per_group.is_some() || !limits.group_hand_out_rates.is_empty() {
        field("gr".into(), "1".into());
    }
    for (group, limit) in &limits.group_max_in_flight {
        field(format!("l:{group}"), limit.to_string());
    }
    for (group, &weight) in &limits.group_weights {
        if weight > 1 {
            field(format!("w:{group}"), weight.to_string());
        }
    }
    for (group, rate) in &limits.group_hand_out_rates {
        let (interval, burst) = rate_value(rate);
        field(format!("r:{group}"), format!("{interval} {burst}"));
    }
    Ok(args)
}

/// What the `flow_set` script did.
#[derive(Debug)]
pub(crate) struct Written {
    /// The settings' generation now.
    pub(crate) generation: u64,
    /// The settings they replaced, when they were other ones.
    pub(crate) replaced: Option<String>,
}

/// Gives queue `keys` the settings `limits` (the `flow_set` script), on `con`.
pub(crate) async fn write(
    con: &mut Conn,
    keys: &Keys,
    limits: &FlowLimits,
) -> Result<Written, Error> {
    let args = settings_args(limits)?;
    let mut invocation = SCRIPTS.flow_set.prepare_invoke();
    for key in &keys.all {
        invocation.key(key.as_str());
    }
    for arg in &args {
        invocation.arg(arg.as_str());
    }
    let value: Value = invocation.invoke_async(con).await?;
    let read = || -> Result<Written, redis::ParsingError> {
        let p = parts(value)?;
        let [changed, generation, previous] = p.as_slice() else {
            return Err(format!("expected three parts, got {}", p.len()).into());
        };
        let previous = text(previous)?;
        Ok(Written {
            generation: count(generation)?,
            replaced: (number(changed)? == 1 && !previous.is_empty()).then_some(previous),
        })
    };
    read().map_err(|e| Error::Protocol(format!("flow_set: {e}")))
}

/// The queue's settings as the server keeps them (JSON), if it has flow control.
pub(crate) async fn read(con: &mut Conn, keys: &Keys) -> redis::RedisResult<Option<String>> {
    redis::cmd("HGET")
        .arg(keys.flow())
        .arg("json")
        .query_async(con)
        .await
}

/// Settings read from the server.
pub(crate) fn parse_limits(json: &str) -> Result<FlowLimits, Error> {
    serde_json::from_str(json)
        .map_err(|e| Error::Protocol(format!("the queue's flow control settings: {e}")))
}

/// Logs, once per build, what a handle finds of the queue's flow control.
pub(crate) fn warn_at_build(queue: &str, written: Option<&Written>, found: Option<&FlowLimits>) {
    if let Some(Written {
        replaced: Some(previous),
        ..
    }) = written
    {
        tracing::warn!(
            queue,
            previous = %previous,
            "workq-redis: this handle's flow control settings replace other ones another \
             process set (the last handle built with settings wins): every process applies \
             this one's now"
        );
    }
    if let Some(found) = found
        && found.grouped
    {
        tracing::warn!(
            queue,
            "workq-redis: the queue groups its items (another process set its flow control), \
             and this handle has no group function: its adds join the group \"\""
        );
    }
}

/// Fills `stats`' flow control figures from the last part of the `stats` script's reply
/// (see `stats.lua`): nothing when it is empty (no flow control).
pub(crate) fn fill_stats(stats: &mut Stats, now: i64, flow: &Value) -> Result<(), Error> {
    let mut read = || -> Result<(), redis::ParsingError> {
        let p = parts_ref(flow)?;
        if p.is_empty() {
            return Ok(());
        }
        let [json, ready, saturated, groups, top] = p else {
            return Err(format!("expected five parts, got {}", p.len()).into());
        };
        let json = text(json)?;
        if !json.is_empty() {
            stats.limits = Some(serde_json::from_str(&json).map_err(|e| format!("settings: {e}"))?);
        }
        let as_usize = |v: &Value| count(v).map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        stats.flow = Some(FlowStats::new(
            as_usize(groups)?,
            as_usize(ready)?,
            as_usize(saturated)?,
        ));
        let mut listed = parts_ref(top)?
            .iter()
            .map(|entry| {
                let fields = parts_ref(entry)?;
                let [name, ready, out, limit, oldest] = fields else {
                    return Err(redis::ParsingError::from(
                        "a malformed group entry".to_owned(),
                    ));
                };
                let limit = match text(limit)?.as_str() {
                    "" => None,
                    _ => Some(as_usize(limit)?),
                };
                let mut group =
                    GroupStats::new(text(name)?, as_usize(ready)?, as_usize(out)?, limit);
                group.oldest_ready = match text(oldest)?.as_str() {
                    "" => None,
                    _ => Some(span(number(oldest)?, now)),
                };
                Ok(group)
            })
            .collect::<Result<Vec<_>, _>>()?;
        // The order of the in-memory queue's: most ready, then most in flight, then by name.
        listed.sort_by(|a, b| {
            (b.ready, b.in_flight)
                .cmp(&(a.ready, a.in_flight))
                .then_with(|| a.name.cmp(&b.name))
        });
        stats.groups = listed;
        Ok(())
    };
    read().map_err(|e| Error::Protocol(format!("stats: flow control: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use workq::flow::FlowControl;

    #[test]
    fn settings_become_the_fields_the_scripts_read() {
        let flow: FlowControl<String> = FlowControl::new()
            .group_by(|s: &String| s.clone())
            .max_in_flight(8)
            .max_in_flight_per_group(2)
            .group_max_in_flight("big", 5)
            .group_weight("heavy", 3)
            .group_weight("plain", 1)
            .hand_out_rate(4.0, 2)
            .group_hand_out_rate("slow", 3.0, 1);
        let args = settings_args(flow.limits()).unwrap();
        let back: FlowLimits = serde_json::from_str(&args[0]).unwrap();
        assert_eq!(&back, flow.limits());
        let fields: Vec<(&str, &str)> = args[1..]
            .chunks(2)
            .map(|c| (c[0].as_str(), c[1].as_str()))
            .collect();
        assert_eq!(
            fields,
            [
                ("max", "8"),
                ("pg", "2"),
                ("ri", "250000.0"),
                ("rb", "2"),
                ("ov", "1"),
                ("gr", "1"),
                ("l:big", "5"),
                ("w:heavy", "3"),
                ("r:slow", "333333.333 1"),
            ]
        );
    }

    #[test]
    fn the_stats_part_is_read_or_refused() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let summary = workq::admin::QueueSummary::named("q");
        let mut plain = Stats::new(summary.clone());
        fill_stats(&mut plain, 0, &Value::Array(vec![])).unwrap();
        assert_eq!((plain.flow, plain.limits.is_some()), (None, false));

        let group = |name: &str, ready: i64, limit: &str, oldest: &str| {
            Value::Array(vec![
                bulk(name),
                bulk(&ready.to_string()),
                Value::Int(1),
                bulk(limit),
                bulk(oldest),
            ])
        };
        let part = Value::Array(vec![
            bulk(r#"{"grouped":true,"max_in_flight_per_group":2}"#),
            Value::Int(2),
            Value::Int(1),
            Value::Int(3),
            Value::Array(vec![group("b", 4, "2", "1000000"), group("a", 4, "", "")]),
        ]);
        let mut stats = Stats::new(summary.clone());
        fill_stats(&mut stats, 3_000_000, &part).unwrap();
        assert_eq!(stats.flow, Some(FlowStats::new(3, 2, 1)));
        assert_eq!(
            stats.limits.unwrap().max_in_flight_per_group,
            Some(2),
            "the settings"
        );
        let read: Vec<_> = stats
            .groups
            .iter()
            .map(|g| (g.name.as_str(), g.ready, g.limit, g.oldest_ready))
            .collect();
        assert_eq!(
            read,
            [
                ("a", 4, None, None),
                ("b", 4, Some(2), Some(std::time::Duration::from_secs(2)))
            ],
            "ties by name"
        );

        let short = Value::Array(vec![bulk("{}"), Value::Int(1)]);
        assert!(matches!(
            fill_stats(&mut Stats::new(summary), 0, &short),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn no_override_no_group_lookups() {
        let flow: FlowControl<String> = FlowControl::new()
            .group_by(|s: &String| s.clone())
            .group_weight("plain", 1);
        let args = settings_args(flow.limits()).unwrap();
        assert_eq!(args.len(), 1, "the JSON only: {args:?}");
    }
}
