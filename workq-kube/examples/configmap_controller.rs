//! A ConfigMap controller on a workq queue.
//!
//! With a kubeconfig (`KUBECONFIG`, or `~/.kube/config`) it watches the ConfigMaps of the
//! current namespace of that cluster and reconciles them (read only: it reports their size)
//! until `SIGTERM` or Ctrl-C: the reconciles in flight finish, the summary is printed and it
//! exits 0; a second signal cancels what still runs. A real cluster's `https://` address
//! needs the `rustls-tls` feature. Options:
//!
//! - `--redis URL`: share a `RedisQueue` named `configmaps` with other replicas;
//! - `--work MS`: simulated work per reconcile, in milliseconds (default 0);
//! - `--shutdown-timeout MS`: how long a stop waits for the reconciles in flight (default
//!   25 s).
//!
//! Without a kubeconfig it starts the in-process API server, plays a few minutes of a
//! cluster's life in a second (creations, updates, a deletion, a flaky object, an invalid
//! one the error policy gives up on, an expired watch that forces a relist), and ends by
//! itself once every object is reconciled at its newest version, printing the workers'
//! summary and the queue's metrics.
//!
//! ```sh
//! cargo run -p workq-kube --example configmap_controller
//! cargo run -p workq-kube --features rustls-tls --example configmap_controller  # a cluster
//! ```

use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use workq::{Queue, Summary};
use workq_kube::testing::FakeApiServer;
use workq_kube::{Controller, ErrorAction, ObjectKey};
use workq_redis::RedisQueue;

/// Why a reconcile failed.
#[derive(Debug)]
enum ReconcileError {
    /// Worth retrying.
    Timeout(String),
    /// No retry can fix it.
    Invalid(String),
}

impl fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReconcileError::Timeout(name) => write!(f, "{name}: the API server timed out"),
            ReconcileError::Invalid(name) => write!(f, "{name}: marked invalid"),
        }
    }
}

impl Error for ReconcileError {}

/// What the reconciles have seen: each object's resource version at its last success, and
/// how often the flaky one failed.
#[derive(Default)]
struct Context {
    /// Simulated work per reconcile.
    work: Duration,
    reconciled: Mutex<HashMap<String, String>>,
    flaky_failures: Mutex<u32>,
}

async fn reconcile(
    configmap: Arc<ConfigMap>,
    context: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let name = configmap.name_any();
    let namespace = configmap.namespace().unwrap_or_default();
    if !context.work.is_zero() {
        println!("reconciling {namespace}/{name}");
        tokio::time::sleep(context.work).await;
    }
    // A transient failure, twice: retried with the queue's per-object backoff.
    if name == "flaky" {
        let mut failures = context.flaky_failures.lock().unwrap();
        if *failures < 2 {
            *failures += 1;
            return Err(ReconcileError::Timeout(name));
        }
    }
    if configmap.labels().contains_key("invalid") {
        return Err(ReconcileError::Invalid(name));
    }
    let keys = configmap.data.as_ref().map_or(0, BTreeMap::len);
    let version = configmap.resource_version().unwrap_or_default();
    println!("reconciled {namespace}/{name}: {keys} keys (resource version {version})");
    context.reconciled.lock().unwrap().insert(name, version);
    Ok(Action::await_change())
}

/// The error policy: give up on what no retry can fix, back off on the rest.
fn error_policy(_: Arc<ConfigMap>, error: &ReconcileError, failures: usize) -> ErrorAction {
    match error {
        ReconcileError::Invalid(_) => ErrorAction::GiveUp,
        ReconcileError::Timeout(_) => {
            println!("{error} ({failures} in a row): backing off");
            ErrorAction::Backoff
        }
    }
}

/// The command line's options.
#[derive(Default)]
struct Options {
    redis: Option<String>,
    work: Duration,
    shutdown_timeout: Option<Duration>,
}

fn options() -> Result<Options, String> {
    let mut options = Options::default();
    let mut args = std::env::args().skip(1);
    let millis = |value: Option<String>, flag: &str| {
        value
            .and_then(|value| value.parse().ok())
            .map(Duration::from_millis)
            .ok_or_else(|| format!("{flag} takes a number of milliseconds"))
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--redis" => options.redis = Some(args.next().ok_or("--redis takes a URL")?),
            "--work" => options.work = millis(args.next(), "--work")?,
            "--shutdown-timeout" => {
                options.shutdown_timeout = Some(millis(args.next(), "--shutdown-timeout")?);
            }
            other => {
                return Err(format!(
                    "unknown argument {other:?}: --redis URL, --work MS, --shutdown-timeout MS"
                ));
            }
        }
    }
    Ok(options)
}

fn kubeconfig_present() -> bool {
    std::env::var_os("KUBECONFIG").is_some()
        || std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".kube/config"))
            .is_some_and(|path| path.exists())
}

#[tokio::main]
pub(crate) async fn main() -> ExitCode {
    let outcome = match options() {
        Err(error) => Err(error.into()),
        Ok(options) if kubeconfig_present() => against_a_cluster(options).await,
        Ok(_) => {
            in_process().await;
            Ok(())
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Watches a real cluster until SIGTERM or Ctrl-C.
async fn against_a_cluster(options: Options) -> Result<(), Box<dyn Error>> {
    let client = kube::Client::try_default().await.map_err(|error| {
        format!("cannot reach the cluster in your kubeconfig ({error}); https needs --features rustls-tls")
    })?;
    let namespace = client.default_namespace().to_owned();
    let configmaps: Api<ConfigMap> = Api::default_namespaced(client);
    let context = Arc::new(Context {
        work: options.work,
        ..Context::default()
    });
    println!(
        "watching the ConfigMaps of namespace {namespace}; SIGTERM or Ctrl-C stops, a second one forces"
    );
    match &options.redis {
        None => {
            let controller = Controller::new(configmaps, watcher::Config::default());
            until_signal(controller, &options, context).await
        }
        Some(url) => {
            let queue: RedisQueue<String> = RedisQueue::connect(url, "configmaps").await?;
            let controller = Controller::with_queue(queue, configmaps, watcher::Config::default());
            until_signal(controller, &options, context).await
        }
    }
}

/// Runs `controller` until a signal, and prints what it did.
async fn until_signal<Q>(
    controller: Controller<ConfigMap, Q>,
    options: &Options,
    context: Arc<Context>,
) -> Result<(), Box<dyn Error>>
where
    Q: Queue,
    Q::Item: ObjectKey<ConfigMap>,
{
    let shutdown_timeout = options.shutdown_timeout;
    let running = controller
        .error_policy(error_policy)
        .workers(move |workers| {
            let workers = workers.count(4);
            match shutdown_timeout {
                Some(timeout) => workers.shutdown_timeout(timeout),
                None => workers,
            }
        })
        .shutdown_on_signal()
        .run(reconcile, context);
    let stopping = running.stop_token().stopped();
    tokio::spawn(async move {
        stopping.await;
        println!("stopping: the reconciles in flight finish; a second signal forces the stop");
    });
    running.wait_until_ready().await;
    println!("ready: {} ConfigMaps listed", running.store().state().len());
    print_outcome(running.wait().await)
}

/// Prints a controller's summary; an error for a controller that stopped on its own or by
/// force.
fn print_outcome<T>(
    outcome: Result<Summary<T>, workq_kube::Error<T>>,
) -> Result<(), Box<dyn Error>> {
    match outcome {
        Ok(summary) => {
            println!("stopped: {summary}");
            Ok(())
        }
        Err(error) => {
            println!("stopped: {}", error.summary());
            Err(error.kind().to_string().into())
        }
    }
}

fn configmap(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("default".to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect(),
        ),
        ..ConfigMap::default()
    }
}

/// Plays a cluster's changes against the in-process API server and stops once settled.
async fn in_process() {
    println!("no kubeconfig: running against an in-process API server");
    let server = FakeApiServer::start().await;
    for index in 0..8 {
        server.apply(&configmap(&format!("app-{index}"), &[("replicas", "1")]));
    }
    server.apply(&configmap("flaky", &[("mode", "eventually")]));
    let mut invalid = configmap("broken", &[]);
    invalid.metadata.labels = Some(BTreeMap::from([("invalid".to_owned(), "true".to_owned())]));
    server.apply(&invalid);

    let context = Arc::new(Context::default());
    // The default queue: named `configmap` after the kind, reporting the workqueue series.
    let controller = Controller::new(
        Api::<ConfigMap>::namespaced(server.client(), "default"),
        watcher::Config::default(),
    )
    .error_policy(error_policy)
    .workers(|workers| {
        workers
            .count(4)
            .timeout(Duration::from_secs(30))
            .on_give_up(|gave_up| {
                println!("gave up on {:?} ({})", gave_up.item.name, gave_up.reason);
            })
    })
    .run(reconcile, context.clone());
    controller.wait_until_ready().await;

    // A cluster's life: updates (several to one object while it waits), a new object, a
    // deletion, and an expired watch that makes the watcher relist.
    for replicas in ["2", "3", "4"] {
        server.apply(&configmap("app-0", &[("replicas", replicas)]));
    }
    server.apply(&configmap("app-8", &[("replicas", "1")]));
    server.delete::<ConfigMap>(Some("default"), "app-7");
    server.expire_watches();
    server.apply(&configmap("app-1", &[("replicas", "5")]));

    let store = controller.store().clone();
    let queue = controller.queue().clone();
    let settled = async {
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let reconciled = context.reconciled.lock().unwrap().clone();
            let current = store.state().iter().all(|object| {
                object.labels().contains_key("invalid")
                    || reconciled.get(&object.name_any()) == object.resource_version().as_ref()
            });
            let idle = queue.is_empty() && queue.delayed_len() == 0 && queue.processing_len() == 0;
            if current && idle && server.requests().lists >= 2 {
                return;
            }
        }
    };
    let summary = controller
        .run_until(settled)
        .await
        .expect("no source failed");

    println!("{summary}");
    println!("API server: {:?}", server.requests());
    let mut metrics = String::new();
    workq_kube::metrics::encode(&mut metrics).expect("encode the metrics");
    for line in metrics.lines().filter(|line| {
        line.starts_with(r#"workqueue_adds_total{name="configmap"}"#)
            || line.starts_with(r#"workqueue_retries_total{name="configmap"}"#)
    }) {
        println!("{line}");
    }
    assert!(summary.is_drained());
    // The invalid object, given up once, or twice if the relist queued it again after.
    assert!((1..=2).contains(&summary.given_up), "{summary}");
    assert_eq!(*context.flaky_failures.lock().unwrap(), 2);
}
