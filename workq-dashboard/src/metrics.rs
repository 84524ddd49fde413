//! `/metrics`: the Kubernetes workqueue series of every queue (label `name`), plus the
//! dashboard's own figures (stalls, dead letters, pauses, broken queues, whether each source's
//! server answers, and the operators' actions), in the Prometheus or OpenMetrics text format.
//! Each queue's series carry the labels `name` and `source`. Queues with flow control add
//! the in-process provider's flow series, by the same names and types:
//! `workqueue_groups_ready` and `workqueue_group_saturated`, and, for the top
//! [`Config::group_series`](crate::Config::group_series) groups when asked for,
//! `workqueue_group_depth` and `workqueue_group_in_flight` (label `group`).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use workq::admin::QueueSummary;

use crate::flow::QueueFlow;

pub(crate) type Labels = Vec<(&'static str, String)>;
type FloatGauge = Family<Labels, Gauge<f64, AtomicU64>>;

/// A fresh registry per scrape: the figures are read from the queues at scrape time (each
/// source's listing of the last second, shared with the page). The format follows `accept`
/// (OpenMetrics when asked for, else Prometheus text); returns the content type and the body.
pub(crate) fn encode(
    listings: &[(String, Option<Arc<Vec<QueueSummary>>>)],
    flows: &[(String, Vec<QueueFlow>)],
    shared: &crate::state::Shared,
    accept: Option<&str>,
) -> (&'static str, String) {
    let mut registry = Registry::with_prefix("workqueue");
    let gauge = |registry: &mut Registry, name: &str, help: &str| {
        let family = FloatGauge::default();
        registry.register(name, help, family.clone());
        family
    };
    let counter = |registry: &mut Registry, name: &str, help: &str| {
        let family = Family::<Labels, Counter>::default();
        registry.register(name, help, family.clone());
        family
    };
    let depth = gauge(&mut registry, "depth", "Current depth of workqueue");
    let unfinished = gauge(
        &mut registry,
        "unfinished_work_seconds",
        "Seconds of work in progress not yet observed by work_duration",
    );
    let longest = gauge(
        &mut registry,
        "longest_running_processor_seconds",
        "Seconds the longest running processor has been running",
    );
    let adds = counter(
        &mut registry,
        "adds",
        "Total number of adds handled by workqueue",
    );
    let retries = counter(
        &mut registry,
        "retries",
        "Total number of retries handled by workqueue",
    );
    let completions = counter(
        &mut registry,
        "completions",
        "Total number of leases marked done",
    );
    let delayed = gauge(&mut registry, "delayed", "Items waiting for a delay");
    let in_flight = gauge(&mut registry, "in_flight", "Items under a lease");
    let failing = gauge(&mut registry, "failing_items", "Items with a failure count");
    let stalled = gauge(
        &mut registry,
        "stalled_items",
        "Items whose lease expired and was reclaimed (leases reclaimed)",
    );
    let dead = gauge(&mut registry, "dead_letters", "Dead letters");
    let dropped = counter(
        &mut registry,
        "dead_letters_dropped",
        "Dead letters dropped by the cap",
    );
    let paused = gauge(
        &mut registry,
        "paused",
        "1 while the queue hands nothing out",
    );
    let broken = gauge(
        &mut registry,
        "broken",
        "1 while the queue cannot be read (a key of the wrong type, say)",
    );
    let up = gauge(
        &mut registry,
        "dashboard_source_up",
        "1 while the dashboard reaches the source's server",
    );
    registry.register(
        "dashboard_actions",
        "Operator actions through the dashboard, by action and result",
        shared.actions.clone(),
    );
    registry.register(
        "dashboard_refusals",
        "Requests the dashboard refused, by reason (unauthorized, read_only, csrf, \
         body_too_large, ...)",
        shared.refusals.clone(),
    );
    registry.register(
        "dashboard_auth_failures",
        "Requests with a missing or wrong token",
        shared.auth_failures.clone(),
    );
    for (source, queues) in listings {
        up.get_or_create(&vec![("source", source.clone())])
            .set(f64::from(u8::from(queues.is_some())));
        for q in queues.iter().flat_map(|q| q.iter()) {
            let l: Labels = vec![("name", q.name.clone()), ("source", source.clone())];
            broken
                .get_or_create(&l)
                .set(f64::from(u8::from(q.broken.is_some())));
            if q.broken.is_some() {
                continue;
            }
            depth.get_or_create(&l).set(q.depth as f64);
            unfinished
                .get_or_create(&l)
                .set(q.lease_age_sum.as_secs_f64());
            longest.get_or_create(&l).set(q.longest_lease.as_secs_f64());
            if let Some(c) = q.counters {
                adds.get_or_create(&l).inc_by(c.adds);
                completions.get_or_create(&l).inc_by(c.completions);
                retries.get_or_create(&l).inc_by(c.retries);
            }
            delayed.get_or_create(&l).set(q.delayed as f64);
            in_flight.get_or_create(&l).set(q.in_flight as f64);
            failing.get_or_create(&l).set(q.failing as f64);
            stalled.get_or_create(&l).set(q.stalled as f64);
            dead.get_or_create(&l).set(q.dead as f64);
            dropped.get_or_create(&l).inc_by(q.dead_dropped);
            paused.get_or_create(&l).set(f64::from(u8::from(q.paused)));
        }
    }
    if flows.iter().any(|(_, queues)| !queues.is_empty()) {
        flow_series(&mut registry, flows, shared.config.group_series > 0);
    }
    // Writing to a String cannot fail.
    crate::exposition::encode_for_accept(&registry, accept).unwrap_or(("text/plain", String::new()))
}

/// The flow control series of `flows`' queues (per group only if `per_group`), with the
/// help texts of the in-process provider (`workq::metrics::prometheus`).
fn flow_series(registry: &mut Registry, flows: &[(String, Vec<QueueFlow>)], per_group: bool) {
    let mut gauge = |name: &str, help: &str| {
        let family = Family::<Labels, Gauge>::default();
        registry.register(name, help, family.clone());
        family
    };
    let ready = gauge(
        "groups_ready",
        "Current number of groups with items waiting to be handed out",
    );
    let saturated = gauge(
        "group_saturated",
        "Current number of groups at their in-flight limit",
    );
    let per_group = per_group.then(|| {
        let depth = gauge(
            "group_depth",
            "Items waiting to be handed out in the group, for the groups with the most of them",
        );
        let in_flight = gauge(
            "group_in_flight",
            "Items of the group being processed, for the groups with the most items waiting",
        );
        (depth, in_flight)
    });
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    for (source, queues) in flows {
        for q in queues {
            let l: Labels = vec![("name", q.name.clone()), ("source", source.clone())];
            ready.get_or_create(&l).set(count(q.flow.groups_ready));
            saturated
                .get_or_create(&l)
                .set(count(q.flow.groups_saturated));
            let Some((depth, in_flight)) = &per_group else {
                continue;
            };
            for g in &q.groups {
                let mut l = l.clone();
                l.push(("group", g.name.clone()));
                depth.get_or_create(&l).set(count(g.ready));
                in_flight.get_or_create(&l).set(count(g.in_flight));
            }
        }
    }
}
