//! Metrics by default: every controller whose queue the crate builds (the default queue of
//! [`Controller::new`](crate::Controller::new) and the stream constructors) reports
//! Kubernetes' workqueue series under its name (the kind, lowercase, unless named with
//! [`Controller::name`](crate::Controller::name)), and every controller counts its watch
//! failures, in one process-wide `prometheus-client` registry (controller-runtime keeps
//! one too, `metrics.Registry`). Feature `prometheus`, on by default.
//!
//! Serve [`encode`]'s text on your `/metrics` endpoint, and register your own metrics
//! beside them with [`with_registry`].
//!
//! | series | labels | what |
//! | --- | --- | --- |
//! | `workqueue_depth`, `workqueue_adds_total`, `workqueue_queue_duration_seconds`, `workqueue_work_duration_seconds`, `workqueue_retries_total`, ... | `name` | client-go's workqueue series (see `workqueue::metrics::prometheus`) |
//! | `workqueue_kube_watch_errors_total` | `controller`, `trigger` | watch failures, each retried after the watcher's backoff |
//!
//! A queue you build yourself reports where you say: give it this registry's
//! [`provider`] to join the others, or a provider of its own.
//!
//! # Examples
//!
//! ```
//! use prometheus_client::metrics::counter::Counter;
//!
//! let reconciles: Counter = Counter::default();
//! workqueue_kube::metrics::with_registry(|registry| {
//!     registry.register("my_operator_reconciles", "Reconciles run", reconciles.clone());
//! });
//! reconciles.inc();
//! let mut text = String::new();
//! workqueue_kube::metrics::encode(&mut text).unwrap();
//! assert!(text.contains("my_operator_reconciles_total 1"));
//! ```

use std::fmt;
use std::sync::OnceLock;

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use workqueue::metrics::prometheus::PrometheusMetrics;

/// The label set of the watch failures: the controller and the trigger.
type WatchLabels = Vec<(&'static str, String)>;

/// The process-wide registry and what the crate records in it.
struct Global {
    registry: Mutex<Registry>,
    workqueue: PrometheusMetrics,
    watch_errors: Family<WatchLabels, Counter>,
}

fn global() -> &'static Global {
    static GLOBAL: OnceLock<Global> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let mut registry = Registry::default();
        let workqueue = PrometheusMetrics::new(&mut registry);
        let watch_errors = Family::<WatchLabels, Counter>::default();
        registry.register(
            "workqueue_kube_watch_errors",
            "Watch failures of a controller's watchers, each retried after the watcher's backoff",
            watch_errors.clone(),
        );
        Global {
            registry: Mutex::new(registry),
            workqueue,
            watch_errors,
        }
    })
}

/// The workqueue metrics provider of the process-wide registry, for a queue you build:
/// `WorkQueue::builder().name("widgets").metrics(workqueue_kube::metrics::provider())`.
pub fn provider() -> PrometheusMetrics {
    global().workqueue.clone()
}

/// Calls `register` with the process-wide registry, to register metrics of your own.
pub fn with_registry<R>(register: impl FnOnce(&mut Registry) -> R) -> R {
    register(&mut global().registry.lock())
}

/// Appends the process-wide registry in Prometheus' text format (OpenMetrics) to `out`.
///
/// # Errors
///
/// A metric that cannot be encoded (`prometheus-client`'s error).
pub fn encode(out: &mut String) -> fmt::Result {
    prometheus_client::encoding::text::encode(out, &global().registry.lock())
}

/// Counts a watch failure of `trigger` in `controller`.
pub(crate) fn watch_error(controller: &str, trigger: &str) {
    global()
        .watch_errors
        .get_or_create(&vec![
            ("controller", controller.to_owned()),
            ("trigger", trigger.to_owned()),
        ])
        .inc();
}
