//! What the dashboard shows of a queue's flow control (its groups and its limits) and of its
//! periodic schedules: the parts of `/api/queues/{name}` beyond the figures, and the flow
//! figures `/metrics` reads.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use workq::admin::{AdminError, QueueSummary, Stats, redact_urls_in};
use workq::periodic::ScheduleInfo;
use workq::{FlowStats, GroupStats};

use crate::respond::cut;
use crate::state::Registered;
use crate::text::instant;

/// How long `/metrics` leaves a queue it found without flow control before asking again.
const NO_FLOW_RECHECK: Duration = Duration::from_secs(60);

/// `value[field]`, a text, cut to [`PREVIEW_BYTES`](crate::respond::PREVIEW_BYTES) if it
/// is longer; a cut one says so in `{field}_truncated`.
fn shorten(value: &mut Value, field: &str) {
    if let Some(short) = value.get(field).and_then(Value::as_str).and_then(cut) {
        value[field] = json!(short);
        value[format!("{field}_truncated")] = json!(true);
    }
}

/// An error of a source as a part of the page says it: no secret in it.
fn said(e: &AdminError) -> Value {
    json!(redact_urls_in(&e.to_string()))
}

/// The parts of a queue's page beyond its figures, from its `stats` and its `schedules`:
///
/// - `flow` (groups kept, with ready items, at their limit), `groups` (the ones `stats`
///   listed, names cut to [`PREVIEW_BYTES`](crate::respond::PREVIEW_BYTES)), `limits` (as
///   the queue keeps them) and `limits_described` (`[what, setting]` lines, as `wq queue
///   stats` prints them): `null` and empty on a queue without flow control, and with
///   `flow_error` when `stats` failed;
/// - `schedules`: each schedule's record with its `time_zone` and its instants as RFC 3339
///   text (`since`, `last_tick`, `next_tick`; names and specs cut), `null` where the source
///   keeps none, with `schedules_error` when the listing failed.
pub(crate) fn page_parts(
    stats: Result<Stats, AdminError>,
    schedules: Result<Vec<ScheduleInfo>, AdminError>,
) -> Map<String, Value> {
    let mut parts = Map::new();
    let (flow, groups, limits) = match stats {
        Ok(stats) => (stats.flow, stats.groups, stats.limits),
        Err(e) => {
            parts.insert("flow_error".into(), said(&e));
            (None, Vec::new(), None)
        }
    };
    let groups: Vec<Value> = groups
        .iter()
        .map(|g| {
            let mut value = json!(g);
            shorten(&mut value, "name");
            value
        })
        .collect();
    let described: Vec<(&str, String)> = limits
        .as_ref()
        .map(|l| l.described())
        .unwrap_or_default()
        .into_iter()
        .map(|(what, setting)| (what, cut(&setting).unwrap_or(setting)))
        .collect();
    parts.insert("flow".into(), json!(flow));
    parts.insert("groups".into(), json!(groups));
    parts.insert("limits".into(), json!(limits));
    parts.insert("limits_described".into(), json!(described));
    let schedules = match schedules {
        Ok(listed) => json!(
            listed
                .iter()
                .map(|s| {
                    let mut value = json!(s);
                    value["time_zone"] = json!(s.time_zone());
                    value["since"] = json!(instant(s.since));
                    value["last_tick"] = json!(s.last_tick.and_then(instant));
                    value["next_tick"] = json!(s.next_tick.and_then(instant));
                    shorten(&mut value, "name");
                    shorten(&mut value, "spec");
                    shorten(&mut value, "time_zone");
                    value
                })
                .collect::<Vec<_>>()
        ),
        Err(AdminError::Unsupported) => Value::Null,
        Err(e) => {
            parts.insert("schedules_error".into(), said(&e));
            Value::Null
        }
    };
    parts.insert("schedules".into(), schedules);
    parts
}

/// One queue's flow control as `/metrics` reports it.
pub(crate) struct QueueFlow {
    pub(crate) name: String,
    pub(crate) flow: FlowStats,
    /// The groups with the most ready items, at most [`Config::group_series`] of them.
    ///
    /// [`Config::group_series`]: crate::Config::group_series
    pub(crate) groups: Vec<GroupStats>,
}

/// Per source: the queues `/metrics` last found without flow control, and when.
#[derive(Default)]
pub(crate) struct NoFlow(parking_lot::Mutex<HashMap<String, Instant>>);

/// The flow control of the queues of `listing` that have it, for `/metrics`: one `stats` call
/// per queue (its top `top` groups), at most `most` calls, broken queues and those found
/// without flow control in the last minute left out. A source that stops answering ends the
/// reads; a queue that fails (gone since the listing, say) is left out of this scrape.
pub(crate) async fn read_flows(
    r: &Registered,
    listing: &[QueueSummary],
    top: usize,
    most: usize,
) -> Vec<QueueFlow> {
    let listed: HashSet<&str> = listing.iter().map(|q| q.name.as_str()).collect();
    let skip: HashSet<String> = {
        let mut known = r.no_flow.0.lock();
        known.retain(|name, at| at.elapsed() < NO_FLOW_RECHECK && listed.contains(name.as_str()));
        known.keys().cloned().collect()
    };
    let mut flows = Vec::new();
    let wanted = listing
        .iter()
        .filter(|q| q.broken.is_none() && !skip.contains(&q.name));
    for q in wanted.take(most) {
        let stats = r.admin.stats(&q.name, top.max(1)).await;
        r.note(&stats);
        match stats {
            Ok(Stats {
                flow: Some(flow),
                mut groups,
                ..
            }) => {
                groups.truncate(top);
                flows.push(QueueFlow {
                    name: q.name.clone(),
                    flow,
                    groups,
                });
            }
            Ok(_) => {
                r.no_flow.0.lock().insert(q.name.clone(), Instant::now());
            }
            Err(AdminError::Unavailable(_)) => break,
            Err(_) => {}
        }
    }
    flows
}
