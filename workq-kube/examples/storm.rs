//! A reconcile storm on this crate's runner and on kube-runtime's `Controller`, against the
//! same in-process API server.
//!
//! 10,000 ConfigMaps are listed, then each is updated three times while the controller works
//! through them (40,000 triggers in all); one object in twenty fails its first three
//! reconciles. Both runners call the same reconcile (1 ms of simulated API work), 16 at a
//! time. Reported per runner: reconcile calls, failed calls, triggers merged away (triggers
//! minus successful reconciles: events that never became a reconcile of their own), time
//! until every object was reconciled at its last version, and the process's peak resident
//! memory (which includes the API server's 10,000 objects and event log, the same for both;
//! the memory before the controller starts is printed beside it).
//!
//! Priorities cost some merging here: live updates (priority 0) overtake the listed keys
//! (-100), so an object reconciled early for its first update is reconciled again for the
//! next, where first-in-first-out order would have folded the later updates into one late
//! reconcile. That is the rule's purpose (a live change is not held back by a relist), and its
//! price in a storm that updates every listed object.
//!
//! Retries: this runner backs off per object (5 ms doubling, the queue's
//! `ExponentialFailure`); kube's `error_policy` has no per-object count, so it requeues after
//! a fixed 5 ms.
//!
//! ```sh
//! cargo run --release -p workq-kube --example storm            # both, one process each
//! cargo run --release -p workq-kube --example storm -- ours    # or kube
//! ```
//!
//! Figures from a shared machine are indications, not benchmarks; run both on an idle one.

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::runtime::controller::{Action, Config as KubeConfig};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller as KubeController, watcher};
use kube::{Api, ResourceExt};
use workq::WorkQueue;
use workq::rate_limiter::ExponentialFailure;
use workq_kube::Controller;
use workq_kube::testing::FakeApiServer;

/// Objects in the storm.
const OBJECTS: usize = 10_000;
/// Updates of every object after the first list.
const ROUNDS: usize = 3;
/// One object in this many fails.
const FAILING_EVERY: usize = 20;
/// How many times a failing object fails before it succeeds.
const FAILURES: usize = 3;
/// Reconciles at a time, on both runners.
const CONCURRENCY: usize = 16;

/// A reconcile's failure (kube wants a `std::error::Error`).
#[derive(Debug)]
struct StormError;

impl std::fmt::Display for StormError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a transient failure")
    }
}

impl std::error::Error for StormError {}

/// Counters shared by the reconciles.
#[derive(Default)]
struct Storm {
    calls: AtomicUsize,
    failed: AtomicUsize,
    /// Failures so far per failing object.
    failures: Mutex<HashMap<String, usize>>,
    /// The last round each object was reconciled successfully at.
    rounds: Mutex<HashMap<String, usize>>,
    /// Objects reconciled at the last round.
    settled: AtomicUsize,
}

async fn reconcile(configmap: Arc<ConfigMap>, storm: Arc<Storm>) -> Result<Action, StormError> {
    storm.calls.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let name = configmap.name_any();
    let index: usize = name.trim_start_matches("storm-").parse().unwrap_or(0);
    if index.is_multiple_of(FAILING_EVERY) {
        let mut failures = storm.failures.lock().unwrap();
        let count = failures.entry(name.clone()).or_default();
        if *count < FAILURES {
            *count += 1;
            storm.failed.fetch_add(1, Ordering::Relaxed);
            return Err(StormError);
        }
    }
    let round: usize = configmap
        .data
        .as_ref()
        .and_then(|data| data.get("round"))
        .and_then(|round| round.parse().ok())
        .unwrap_or(0);
    let mut rounds = storm.rounds.lock().unwrap();
    let previous = rounds.insert(name, round);
    if round == ROUNDS && previous != Some(ROUNDS) {
        storm.settled.fetch_add(1, Ordering::Relaxed);
    }
    Ok(Action::await_change())
}

fn configmap(index: usize, round: usize) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("storm-{index}")),
            namespace: Some("default".to_owned()),
            ..ObjectMeta::default()
        },
        data: Some([("round".to_owned(), round.to_string())].into()),
        ..ConfigMap::default()
    }
}

/// The process's peak and current resident memory in MiB (Linux), if readable.
fn memory_mib() -> (Option<f64>, Option<f64>) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let read = |field: &str| {
        status
            .lines()
            .find(|line| line.starts_with(field))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<f64>().ok())
            .map(|kib| kib / 1024.0)
    };
    (read("VmHWM:"), read("VmRSS:"))
}

#[tokio::main]
async fn main() {
    let runner = std::env::args().nth(1);
    match runner.as_deref() {
        Some(runner @ ("ours" | "kube")) => run(runner).await,
        None => {
            // One process per runner, so that each peak memory is its own.
            let exe = std::env::current_exe().expect("this example's path");
            for runner in ["ours", "kube"] {
                let status = Command::new(&exe)
                    .arg(runner)
                    .status()
                    .expect("run the storm");
                assert!(status.success(), "the {runner} storm failed");
            }
        }
        Some(other) => panic!("unknown runner {other:?}: ours or kube"),
    }
}

async fn run(runner: &str) {
    let server = FakeApiServer::start().await;
    for index in 0..OBJECTS {
        server.apply(&configmap(index, 0));
    }
    let (_, before) = memory_mib();
    let storm = Arc::new(Storm::default());
    let api = Api::<ConfigMap>::namespaced(server.client(), "default");
    let started = Instant::now();

    let settled = {
        let storm = storm.clone();
        async move {
            // The storm of updates, once the controller is under way.
            tokio::time::sleep(Duration::from_millis(50)).await;
            for round in 1..=ROUNDS {
                for index in 0..OBJECTS {
                    server.apply(&configmap(index, round));
                    if index.is_multiple_of(500) {
                        tokio::task::yield_now().await;
                    }
                }
            }
            while storm.settled.load(Ordering::Relaxed) < OBJECTS {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            server
        }
    };

    let server = match runner {
        "ours" => {
            let queue: WorkQueue<ObjectRef<ConfigMap>> = WorkQueue::builder()
                .name("storm")
                .rate_limiter(ExponentialFailure::new(
                    Duration::from_millis(5),
                    Duration::from_secs(10),
                ))
                .build();
            let controller = Controller::with_queue(queue, api, watcher::Config::default())
                .workers(|workers| workers.count(CONCURRENCY).retry_forever())
                .run(reconcile, storm.clone());
            let server = settled.await;
            controller.shut_down().await.expect("no source failed");
            server
        }
        _ => {
            let controller = KubeController::new(api, watcher::Config::default())
                .with_config(KubeConfig::default().concurrency(CONCURRENCY as u16))
                .run(
                    reconcile,
                    |_, _: &StormError, _| Action::requeue(Duration::from_millis(5)),
                    storm.clone(),
                )
                .for_each(|_| async {});
            tokio::select! {
                () = controller => unreachable!("kube's controller ended by itself"),
                server = settled => server,
            }
        }
    };
    let elapsed = started.elapsed();
    let (peak, _) = memory_mib();

    let calls = storm.calls.load(Ordering::Relaxed);
    let failed = storm.failed.load(Ordering::Relaxed);
    let triggers = OBJECTS * (ROUNDS + 1);
    println!(
        "{runner:>4}: {calls} reconciles ({failed} failed), {} of {triggers} triggers merged, \
         settled in {:.2} s, peak RSS {} MiB (before the controller {} MiB), API requests {:?}",
        triggers.saturating_sub(calls - failed),
        elapsed.as_secs_f64(),
        peak.map_or("?".to_owned(), |mib| format!("{mib:.0}")),
        before.map_or("?".to_owned(), |mib| format!("{mib:.0}")),
        server.requests(),
    );
}
