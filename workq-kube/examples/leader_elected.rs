//! A leader-elected ConfigMap controller: replicas elect a leader on a
//! `coordination.k8s.io/v1` Lease; only the leader reconciles, the others stand by warm
//! (watching, their stores and queues filled).
//!
//! With a kubeconfig (`KUBECONFIG`, or `~/.kube/config`) it is one replica of such a
//! controller on the current namespace (run several): it waits for the Lease
//! `configmap-controller-leader`, reconciles while it leads (read only: it reports sizes),
//! and on `SIGTERM` or Ctrl-C lets its reconciles finish and releases the Lease, so that a
//! standby takes over at its next try. client-go's timings: a 15 s lease, a 10 s renew
//! deadline, a 2 s retry period. A real cluster's `https://` address needs the `rustls-tls`
//! feature.
//!
//! Without a kubeconfig it starts the in-process API server and three replicas in this
//! process (each with its own client, as separate pods would have), with short timings
//! (lease 2 s, renew deadline 1 s, retry 200 ms), and shows what leader election does: one
//! leader, two warm standbys; a graceful stop of the leader, and a standby leading about one
//! retry period later; the new leader cut off from the API server, stepping down at its
//! renew deadline before the last replica takes over. It prints the measured takeover times
//! and the `leader_election_master_status` gauge, and ends by itself.
//!
//! ```sh
//! cargo run -p workq-kube --example leader_elected
//! cargo run -p workq-kube --features rustls-tls --example leader_elected  # a cluster
//! ```

use std::collections::BTreeMap;
use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use workq::WorkQueue;
use workq_kube::testing::FakeApiServer;
use workq_kube::{Controller, LeaderElection, Running};

/// The Lease the replicas elect their leader on.
const LEASE: &str = "configmap-controller-leader";

/// What one replica's reconciles saw.
struct Context {
    replica: String,
    /// When each reconcile started, with the replica that ran it.
    starts: Arc<Mutex<Vec<(String, Instant)>>>,
    /// Printed reconciles (against a cluster: each one).
    verbose: bool,
}

async fn reconcile(
    configmap: Arc<ConfigMap>,
    context: Arc<Context>,
) -> Result<Action, kube::Error> {
    context
        .starts
        .lock()
        .unwrap()
        .push((context.replica.clone(), Instant::now()));
    let keys = configmap.data.as_ref().map_or(0, BTreeMap::len);
    if context.verbose {
        println!(
            "{}: reconciled {}: {keys} keys",
            context.replica,
            configmap.name_any()
        );
    }
    // Some work, then again in a while: the leader is always busy.
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(Action::requeue(Duration::from_millis(100)))
}

fn kubeconfig_present() -> bool {
    std::env::var_os("KUBECONFIG").is_some()
        || std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".kube/config"))
            .is_some_and(|path| path.exists())
}

#[tokio::main]
async fn main() -> ExitCode {
    let outcome = if kubeconfig_present() {
        against_a_cluster().await
    } else {
        in_process().await
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// One replica against a real cluster, until SIGTERM or Ctrl-C.
async fn against_a_cluster() -> Result<(), Box<dyn Error>> {
    let client = kube::Client::try_default().await.map_err(|error| {
        format!("cannot reach the cluster in your kubeconfig ({error}); https needs --features rustls-tls")
    })?;
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client);
    let context = Arc::new(Context {
        replica: "this replica".to_owned(),
        starts: Arc::default(),
        verbose: true,
    });
    let running = Controller::new(configmaps, watcher::Config::default())
        .leader_elected(LEASE)
        .shutdown_on_signal()
        .run(reconcile, context);
    println!(
        "{} waits for the Lease {LEASE}; SIGTERM or Ctrl-C stops (and releases it)",
        running.identity().unwrap_or_default()
    );
    let summary = running.wait().await.map_err(|error| error.to_string())?;
    println!("stopped: {summary}");
    Ok(())
}

/// A replica of the in-process demo.
type Replica = Running<ConfigMap, WorkQueue<ObjectRef<ConfigMap>>>;

/// Three replicas against the in-process API server.
async fn in_process() -> Result<(), Box<dyn Error>> {
    let server = FakeApiServer::start().await;
    for index in 0..20 {
        server.apply(&ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("settings-{index}")),
                namespace: Some("default".to_owned()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                "greeting".to_owned(),
                "hello".to_owned(),
            )])),
            ..ConfigMap::default()
        });
    }
    let starts = Arc::new(Mutex::new(Vec::new()));
    let start = |name: &str| -> Replica {
        let api: Api<ConfigMap> = Api::namespaced(server.client_named(name), "default");
        let election = LeaderElection::new(LEASE)
            .identity(name)
            .lease_duration(Duration::from_secs(2))
            .renew_deadline(Duration::from_secs(1))
            .retry_period(Duration::from_millis(200));
        Controller::new(api, watcher::Config::default())
            .name(name)
            .workers(|workers| workers.count(4))
            .leader_election(election)
            .run(
                reconcile,
                Arc::new(Context {
                    replica: name.to_owned(),
                    starts: starts.clone(),
                    verbose: false,
                }),
            )
    };
    let mut replicas: Vec<Replica> = ["replica-a", "replica-b", "replica-c"]
        .into_iter()
        .map(start)
        .collect();
    for replica in &replicas {
        replica.wait_until_ready().await;
    }
    let leader = wait_for_leader(&replicas).await?;
    // Let the standbys see the leader and fill up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    print_replicas(&replicas);

    // 1. A graceful stop: the leader's reconciles finish, it releases the Lease, and a
    //    standby takes over at its next try.
    let stopping = replicas.remove(leader);
    let name = stopping.identity().unwrap_or_default();
    let summary = stopping.shut_down().await?;
    let released = Instant::now();
    println!("\n{name} stopped gracefully ({summary}) and released the Lease");
    let leader = wait_for_leader(&replicas).await?;
    let graceful = first_start_after(&starts, &replicas[leader], released).await?;
    println!(
        "{} leads: its first reconcile started {graceful:?} after the release (retry period 200 ms)",
        replicas[leader].identity().unwrap_or_default()
    );

    // 2. A partition: the new leader's requests are refused; it steps down at its renew
    //    deadline, cancelling its reconciles, and the last replica takes over once the lease
    //    has expired.
    let cut_name = replicas[leader].identity().unwrap_or_default();
    let cut = Instant::now();
    server.partition(&cut_name);
    println!("\n{cut_name} is cut off from the API server");
    while replicas[leader].is_leader() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "{cut_name} stepped down {:?} after the cut (renew deadline 1 s)",
        cut.elapsed()
    );
    let other = 1 - leader;
    wait_for_leader(&replicas[other..=other]).await?;
    let takeover = first_start_after(&starts, &replicas[other], cut).await?;
    println!(
        "{} leads: its first reconcile started {takeover:?} after the cut (lease 2 s)",
        replicas[other].identity().unwrap_or_default()
    );
    let last_of_cut = starts
        .lock()
        .unwrap()
        .iter()
        .filter(|(replica, _)| *replica == cut_name)
        .map(|(_, at)| *at)
        .max();
    if let Some(at) = last_of_cut {
        println!(
            "{cut_name}'s last reconcile started {:?} after the cut",
            at.saturating_duration_since(cut)
        );
    }
    server.heal(&cut_name);

    let mut text = String::new();
    workq_kube::metrics::encode(&mut text)?;
    println!("\nmetrics (every replica of this process reports under the same lease name):");
    for line in text.lines().filter(|line| {
        line.starts_with("leader_election_")
            || line.starts_with("controller_runtime_reconcile_total")
    }) {
        println!("  {line}");
    }
    for replica in replicas {
        replica.shut_down().await?;
    }
    Ok(())
}

/// Waits until one of `replicas` leads; returns its index.
async fn wait_for_leader(replicas: &[Replica]) -> Result<usize, Box<dyn Error>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(index) = replicas.iter().position(Running::is_leader) {
            return Ok(index);
        }
        if Instant::now() > deadline {
            return Err("no leader within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How long after `after` the first reconcile of `replica` started.
async fn first_start_after(
    starts: &Mutex<Vec<(String, Instant)>>,
    replica: &Replica,
    after: Instant,
) -> Result<Duration, Box<dyn Error>> {
    let name = replica.identity().unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let first = starts
            .lock()
            .unwrap()
            .iter()
            .filter(|(by, at)| *by == name && *at >= after)
            .map(|(_, at)| *at)
            .min();
        if let Some(at) = first {
            return Ok(at - after);
        }
        if Instant::now() > deadline {
            return Err(format!("{name} did not reconcile within 30 s").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn print_replicas(replicas: &[Replica]) {
    for replica in replicas {
        println!(
            "{}: {}, sees {} as the leader, {} ConfigMaps in its store, {} keys queued, {} reconciled",
            replica.identity().unwrap_or_default(),
            if replica.is_leader() {
                "leader"
            } else {
                "warm standby"
            },
            replica.leader().unwrap_or_default(),
            replica.store().state().len(),
            replica.queue().len(),
            replica.stats().processed,
        );
    }
}
