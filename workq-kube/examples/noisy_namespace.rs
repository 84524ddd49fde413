//! A noisy namespace next to quiet ones, with and without `Controller::group_by_namespace`.
//!
//! An in-process API server holds 4,000 ConfigMaps in the namespace `noisy` and one in each
//! of 20 quiet namespaces. Once the controller has reconciled them all, the noisy namespace
//! updates its 4,000 at once, and right after each quiet namespace updates its one. The
//! reconcile of an update takes 1 ms (simulated API work), 4 at a time. Printed per run: how
//! long each quiet update waited for its reconcile (median and worst), how many noisy updates
//! were still waiting when the first and the last quiet update were reconciled, and how long
//! the noisy backlog took.
//!
//! Without grouping, the quiet updates queue behind the noisy ones (first in, first out
//! within a priority): each is reconciled once the noisy backlog has drained, about a second
//! here. With `group_by_namespace`, namespaces take turns and each quiet update is
//! reconciled within a few turns, long before the noisy backlog drains. The example checks
//! both and exits with an error if either does not hold.
//!
//! ```sh
//! cargo run --release -p workq-kube --example noisy_namespace
//! ```
//!
//! Figures from a shared machine are indications; the benchmark's W8 measures the same shape
//! on the queue alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use workq_kube::Controller;
use workq_kube::testing::FakeApiServer;

/// ConfigMaps of the noisy namespace.
const NOISY: usize = 4_000;
/// Quiet namespaces, one ConfigMap each.
const QUIET: usize = 20;
/// Reconciles at a time.
const CONCURRENCY: usize = 4;

/// What the reconciles saw.
#[derive(Default)]
struct Seen {
    /// Reconciles of the current round.
    reconciled: AtomicUsize,
    /// Reconciles of the current round in the noisy namespace.
    noisy: AtomicUsize,
    /// When each quiet ConfigMap's update was applied.
    updated: Mutex<HashMap<String, Instant>>,
    /// Per quiet update reconciled: how long it waited, and how many noisy updates had not
    /// been reconciled yet.
    waited: Mutex<Vec<(Duration, usize)>>,
    /// The round the reconciles count.
    round: Mutex<String>,
}

fn configmap(namespace: &str, name: &str, round: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some([("round".to_owned(), round.to_owned())].into()),
        ..ConfigMap::default()
    }
}

async fn reconcile(configmap: Arc<ConfigMap>, seen: Arc<Seen>) {
    let round = configmap
        .data
        .as_ref()
        .and_then(|data| data.get("round"))
        .cloned()
        .unwrap_or_default();
    // The first list is reconciled at once: only the updates are measured.
    if round != "0" {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if round != *seen.round.lock().unwrap() {
        return;
    }
    seen.reconciled.fetch_add(1, Ordering::Relaxed);
    let namespace = configmap.namespace().unwrap_or_default();
    if namespace == "noisy" {
        seen.noisy.fetch_add(1, Ordering::Relaxed);
    } else if let Some(at) = seen.updated.lock().unwrap().remove(&namespace) {
        let noisy_left = NOISY - seen.noisy.load(Ordering::Relaxed);
        seen.waited.lock().unwrap().push((at.elapsed(), noisy_left));
    }
}

async fn wait_for(seen: &Seen, count: usize) {
    while seen.reconciled.load(Ordering::Relaxed) < count {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn run(grouped: bool) {
    let server = FakeApiServer::start().await;
    let quiet: Vec<String> = (0..QUIET).map(|i| format!("quiet-{i}")).collect();
    for i in 0..NOISY {
        server.apply(&configmap("noisy", &format!("cm-{i}"), "0"));
    }
    for namespace in &quiet {
        server.apply(&configmap(namespace, "cm", "0"));
    }
    let seen = Arc::new(Seen::default());
    *seen.round.lock().unwrap() = "0".to_owned();
    let api = Api::<ConfigMap>::all(server.client());
    let mut controller = Controller::new(api, watcher::Config::default());
    if grouped {
        controller = controller.group_by_namespace();
    }
    let running = controller
        .workers(|workers| workers.count(CONCURRENCY))
        .run(reconcile, seen.clone());
    wait_for(&seen, NOISY + QUIET).await;

    // The storm: every noisy ConfigMap changes, then each quiet namespace changes its one.
    *seen.round.lock().unwrap() = "1".to_owned();
    seen.reconciled.store(0, Ordering::Relaxed);
    seen.noisy.store(0, Ordering::Relaxed);
    let started = Instant::now();
    for i in 0..NOISY {
        server.apply(&configmap("noisy", &format!("cm-{i}"), "1"));
    }
    for namespace in &quiet {
        seen.updated
            .lock()
            .unwrap()
            .insert(namespace.clone(), Instant::now());
        server.apply(&configmap(namespace, "cm", "1"));
    }
    wait_for(&seen, NOISY + QUIET).await;
    let all = started.elapsed();
    running.shut_down().await.expect("no source failed");

    let mut waited = seen.waited.lock().unwrap().clone();
    assert_eq!(waited.len(), QUIET, "every quiet update is reconciled");
    // The most and the fewest noisy updates left when a quiet one was reconciled.
    let most_left = waited.iter().map(|(_, left)| *left).max().unwrap_or(0);
    let least_left = waited.iter().map(|(_, left)| *left).min().unwrap_or(0);
    waited.sort();
    let median = waited[waited.len() / 2].0;
    let worst = waited[waited.len() - 1].0;
    println!(
        "{:<22} quiet updates waited: median {:>7.1} ms, worst {:>7.1} ms, with \
         {least_left} to {most_left} noisy updates still to do; all {} updates reconciled \
         in {:.2} s",
        if grouped {
            "group_by_namespace:"
        } else {
            "one FIFO (default):"
        },
        median.as_secs_f64() * 1e3,
        worst.as_secs_f64() * 1e3,
        NOISY + QUIET,
        all.as_secs_f64(),
    );
    if grouped {
        // Turns between namespaces: every quiet update before the noisy backlog drains.
        assert!(
            least_left > 0,
            "with group_by_namespace, a quiet update waited for the whole noisy backlog"
        );
    } else {
        // First in, first out: behind every noisy update (but the few in flight, and those
        // whose event came while their first reconcile was still ending).
        assert!(
            most_left <= 2 * CONCURRENCY,
            "in one FIFO, a quiet update overtook {most_left} noisy ones"
        );
    }
}

#[tokio::main]
async fn main() {
    run(false).await;
    run(true).await;
}
