//! A noisy namespace next to quiet ones, with and without `Controller::group_by_namespace`.
//!
//! An in-process API server holds 4,000 ConfigMaps in the namespace `noisy` and one in each
//! of 20 quiet namespaces. Once the controller has reconciled them all, the noisy namespace
//! updates its 4,000 at once, and right after each quiet namespace updates its one. The
//! reconcile takes 1 ms (simulated API work), 4 at a time. Printed per run: how long each
//! quiet update waited for its reconcile (median and worst), and how long the noisy backlog
//! took.
//!
//! Without grouping, the quiet updates queue behind the noisy ones (first in, first out
//! within a priority): about a second here. With `group_by_namespace`, namespaces take turns
//! and each quiet update is reconciled within a few turns.
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
    /// When each quiet ConfigMap's update was applied, and when it was reconciled.
    updated: Mutex<HashMap<String, Instant>>,
    waited: Mutex<Vec<Duration>>,
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
    tokio::time::sleep(Duration::from_millis(1)).await;
    let round = configmap
        .data
        .as_ref()
        .and_then(|data| data.get("round"))
        .cloned()
        .unwrap_or_default();
    if round != *seen.round.lock().unwrap() {
        return;
    }
    seen.reconciled.fetch_add(1, Ordering::Relaxed);
    let namespace = configmap.namespace().unwrap_or_default();
    if namespace != "noisy"
        && let Some(at) = seen.updated.lock().unwrap().remove(&namespace)
    {
        seen.waited.lock().unwrap().push(at.elapsed());
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
    waited.sort();
    let median = waited.get(waited.len() / 2).copied().unwrap_or_default();
    let worst = waited.last().copied().unwrap_or_default();
    println!(
        "{:<22} quiet updates waited: median {:>7.1} ms, worst {:>7.1} ms ({} of {QUIET}); \
         all {} updates reconciled in {:.2} s",
        if grouped {
            "group_by_namespace:"
        } else {
            "one FIFO (default):"
        },
        median.as_secs_f64() * 1e3,
        worst.as_secs_f64() * 1e3,
        waited.len(),
        NOISY + QUIET,
        all.as_secs_f64(),
    );
}

#[tokio::main]
async fn main() {
    run(false).await;
    run(true).await;
}
