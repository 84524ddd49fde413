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
//! | `workqueue_depth`, `workqueue_adds_total`, `workqueue_queue_duration_seconds`, `workqueue_work_duration_seconds`, `workqueue_retries_total`, ... | `name` | client-go's workqueue series (see `workq::metrics::prometheus`) |
//! | `workqueue_kube_watch_errors_total` | `controller`, `trigger` | watch failures, each retried after the watcher's backoff |
//! | `controller_runtime_reconcile_total` | `controller`, `result` | reconciles by how they ended: `success`, `error`, `requeue` (a rate-limited requeue asked for without an error, [`Outcome::Retry`](workq::Outcome::Retry)), `requeue_after` (`Action::requeue(d)`) |
//! | `controller_runtime_reconcile_errors_total` | `controller` | reconciles that failed: an error, a panic, a timeout, or [`Outcome::GiveUp`](workq::Outcome::GiveUp) |
//! | `controller_runtime_terminal_reconcile_errors_total` | `controller` | failures that are not retried: the error policy gave up, the reconcile returned `Outcome::GiveUp`, or the workers' `max_retries` was reached |
//! | `controller_runtime_reconcile_panics_total` | `controller` | reconciles that panicked (each also an error) |
//! | `controller_runtime_reconcile_timeouts_total` | `controller` | reconciles cancelled by the workers' `timeout` (each also an error) |
//! | `controller_runtime_reconcile_time_seconds` | `controller` | histogram of how long each reconcile took, controller-runtime's buckets (5 ms to 60 s) |
//! | `controller_runtime_active_workers` | `controller` | workers reconciling now |
//! | `controller_runtime_max_concurrent_reconciles` | `controller` | the workers' count |
//! | `leader_election_master_status` | `name` | 1 while this process leads the Lease `name` ([`Controller::leader_elected`](crate::Controller::leader_elected)), 0 otherwise |
//! | `leader_election_slowpath_total` | `name` | renewals that had to read the Lease again (the optimistic write lost a race or met a newer version) |
//!
//! The `controller_runtime_*` series are controller-runtime's, with its names, types, labels,
//! help texts and buckets (`pkg/internal/controller/metrics/metrics.go`), so kubebuilder's
//! dashboards and alerts read them unchanged; every controller reports them, on any queue
//! (in memory, Redis, PostgreSQL), and the `controller` label is the controller's name (the
//! `name` of its workqueue series). As in controller-runtime, each series exists from the
//! controller's start, at 0. The leader election series are client-go's
//! (`tools/leaderelection/metrics.go`, registered as controller-runtime's
//! `pkg/metrics/leaderelection.go` does).
//!
//! A queue you build yourself reports where you say: give it this registry's
//! [`provider`] to join the others, or a provider of its own.
//!
//! # The `priority` label of `workqueue_depth`
//!
//! controller-runtime's priority queue reports `workqueue_depth{name, controller,
//! priority}`: one series per priority a queue's items wait at (`"-100"` for a list's keys,
//! `"0"` for live changes), `priority=""` for a queue without priorities
//! (`pkg/internal/metrics/workqueue.go`, `pkg/controller/priorityqueue/metrics.go`). This
//! registry reports client-go's `workqueue_depth{name}` by default: one series per queue.
//! The two cannot be one family without breaking one side: with the label, a queue's depth
//! is several series, so client-go-style panels and alerts that read
//! `workqueue_depth{name="..."}` as one value (`> 100`, a single stat) see a part of it, and
//! series recorded so far end; both shapes at once would count every item twice in a
//! `sum`. kubebuilder's dashboards read `workqueue_depth` per series or summed by `name`,
//! which works with either shape.
//!
//! So the label is a switch, off by default: [`set_depth_by_priority`]`(true)` gives every
//! in-memory queue of this registry controller-runtime's shape (each priority seen so far,
//! 0 once its items are gone; beyond 25 distinct priorities per queue, the whole depth under
//! `priority="exceeded_cardinality_limit"`, controller-runtime's cap), read from the queue at
//! each scrape. The `controller` label controller-runtime adds to its workqueue series is
//! not added: here the queue's `name` is the controller's name.
//!
//! # Examples
//!
//! ```
//! use prometheus_client::metrics::counter::Counter;
//!
//! let reconciles: Counter = Counter::default();
//! workq_kube::metrics::with_registry(|registry| {
//!     registry.register("my_operator_reconciles", "Reconciles run", reconciles.clone());
//! });
//! reconciles.inc();
//! let mut text = String::new();
//! workq_kube::metrics::encode(&mut text).unwrap();
//! assert!(text.contains("my_operator_reconciles_total 1"));
//! ```

use std::fmt;
use std::sync::OnceLock;

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use workq::metrics::prometheus::PrometheusMetrics;

use crate::outcome::ReconcileEnd;

/// A label set: (label, value) pairs.
type Labels = Vec<(&'static str, String)>;

/// The buckets of `controller_runtime_reconcile_time_seconds`, controller-runtime's
/// (`pkg/internal/controller/metrics/metrics.go`, `ReconcileTime`). Its native-histogram
/// settings have no counterpart in the classic exposition served here.
const RECONCILE_TIME_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

/// A histogram with [`RECONCILE_TIME_BUCKETS`].
fn reconcile_time_histogram() -> Histogram {
    Histogram::new(RECONCILE_TIME_BUCKETS)
}

/// controller-runtime's reconcile series, by controller
/// (`pkg/internal/controller/metrics/metrics.go`: names, help texts, types, labels).
struct Reconciles {
    total: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    terminal_errors: Family<Labels, Counter>,
    panics: Family<Labels, Counter>,
    timeouts: Family<Labels, Counter>,
    time: Family<Labels, Histogram, fn() -> Histogram>,
    active_workers: Family<Labels, Gauge>,
    max_concurrent: Family<Labels, Gauge>,
}

impl Reconciles {
    fn register(registry: &mut Registry) -> Self {
        let this = Self {
            total: Family::default(),
            errors: Family::default(),
            terminal_errors: Family::default(),
            panics: Family::default(),
            timeouts: Family::default(),
            time: Family::new_with_constructor(reconcile_time_histogram),
            active_workers: Family::default(),
            max_concurrent: Family::default(),
        };
        // prometheus-client appends `_total` to counters.
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            this.total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            this.errors.clone(),
        );
        registry.register(
            "controller_runtime_terminal_reconcile_errors",
            "Total number of terminal reconciliation errors per controller",
            this.terminal_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_panics",
            "Total number of reconciliation panics per controller",
            this.panics.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            this.time.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            this.max_concurrent.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            this.active_workers.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_timeouts",
            "Total number of reconciliation timeouts per controller",
            this.timeouts.clone(),
        );
        this
    }
}

/// client-go's leader election series (`tools/leaderelection/metrics.go`), under the names
/// controller-runtime registers them with (`pkg/metrics/leaderelection.go`).
struct Leaders {
    status: Family<Labels, Gauge>,
    slowpath: Family<Labels, Counter>,
}

impl Leaders {
    fn register(registry: &mut Registry) -> Self {
        let this = Self {
            status: Family::default(),
            slowpath: Family::default(),
        };
        registry.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name",
            this.status.clone(),
        );
        registry.register(
            "leader_election_slowpath",
            "Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name",
            this.slowpath.clone(),
        );
        this
    }
}

/// The process-wide registry and what the crate records in it.
struct Global {
    registry: Mutex<Registry>,
    workqueue: PrometheusMetrics,
    watch_errors: Family<Labels, Counter>,
    reconciles: Reconciles,
    leaders: Leaders,
}

fn global() -> &'static Global {
    static GLOBAL: OnceLock<Global> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let mut registry = Registry::default();
        let workqueue = PrometheusMetrics::new(&mut registry);
        let watch_errors = Family::<Labels, Counter>::default();
        registry.register(
            "workqueue_kube_watch_errors",
            "Watch failures of a controller's watchers, each retried after the watcher's backoff",
            watch_errors.clone(),
        );
        let reconciles = Reconciles::register(&mut registry);
        let leaders = Leaders::register(&mut registry);
        Global {
            registry: Mutex::new(registry),
            workqueue,
            watch_errors,
            reconciles,
            leaders,
        }
    })
}

/// The workqueue metrics provider of the process-wide registry, for a queue you build:
/// `WorkQueue::builder().name("widgets").metrics(workq_kube::metrics::provider())`.
pub fn provider() -> PrometheusMetrics {
    global().workqueue.clone()
}

/// Gives `workqueue_depth` controller-runtime's `priority` label, for every queue reporting
/// to the process-wide registry (see the [module documentation](self#the-priority-label-of-workqueue_depth)).
/// Off by default; takes effect at the next scrape.
pub fn set_depth_by_priority(on: bool) {
    global().workqueue.set_depth_by_priority(on);
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

impl ReconcileEnd {
    /// The `result` label's value.
    fn label(self) -> &'static str {
        match self {
            ReconcileEnd::Success => "success",
            ReconcileEnd::Error => "error",
            ReconcileEnd::Requeue => "requeue",
            ReconcileEnd::RequeueAfter => "requeue_after",
        }
    }
}

/// One controller's reconcile series: the `controller` label's children, looked up once.
#[derive(Clone)]
pub(crate) struct ControllerSeries {
    /// `controller_runtime_reconcile_total`, by [`ReconcileEnd`].
    total: [Counter; 4],
    errors: Counter,
    terminal_errors: Counter,
    panics: Counter,
    timeouts: Counter,
    time: Histogram,
    active_workers: Gauge,
    max_concurrent: Gauge,
}

impl fmt::Debug for ControllerSeries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerSeries").finish_non_exhaustive()
    }
}

impl ControllerSeries {
    /// The series of `controller`, created at 0 as controller-runtime's `initMetrics` does.
    pub(crate) fn new(controller: &str) -> Self {
        let reconciles = &global().reconciles;
        let by_controller = vec![("controller", controller.to_owned())];
        let total = [
            ReconcileEnd::Success,
            ReconcileEnd::Error,
            ReconcileEnd::Requeue,
            ReconcileEnd::RequeueAfter,
        ]
        .map(|end| {
            reconciles
                .total
                .get_or_create(&vec![
                    ("controller", controller.to_owned()),
                    ("result", end.label().to_owned()),
                ])
                .clone()
        });
        Self {
            total,
            errors: reconciles.errors.get_or_create(&by_controller).clone(),
            terminal_errors: reconciles
                .terminal_errors
                .get_or_create(&by_controller)
                .clone(),
            panics: reconciles.panics.get_or_create(&by_controller).clone(),
            timeouts: reconciles.timeouts.get_or_create(&by_controller).clone(),
            time: reconciles.time.get_or_create(&by_controller).clone(),
            active_workers: reconciles
                .active_workers
                .get_or_create(&by_controller)
                .clone(),
            max_concurrent: reconciles
                .max_concurrent
                .get_or_create(&by_controller)
                .clone(),
        }
    }

    /// `controller_runtime_max_concurrent_reconciles`: the workers' count.
    pub(crate) fn workers(&self, count: usize) {
        self.max_concurrent
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// A worker started on a key.
    pub(crate) fn worker_busy(&self) {
        self.active_workers.inc();
    }

    /// A worker is done with its key.
    pub(crate) fn worker_idle(&self) {
        self.active_workers.dec();
    }

    /// A reconcile ended as `end` after `took`; an error counts in the errors too.
    pub(crate) fn reconciled(&self, end: ReconcileEnd, took: std::time::Duration) {
        self.total[end as usize].inc();
        if end == ReconcileEnd::Error {
            self.errors.inc();
        }
        self.time.observe(took.as_secs_f64());
    }

    /// A failure that is not retried.
    pub(crate) fn terminal_error(&self) {
        self.terminal_errors.inc();
    }

    /// A reconcile panicked.
    pub(crate) fn panicked(&self) {
        self.panics.inc();
    }

    /// A reconcile was cancelled by the workers' timeout.
    pub(crate) fn timed_out(&self) {
        self.timeouts.inc();
    }
}

/// Sets `leader_election_master_status{name}`: 1 while leading.
pub(crate) fn leader_status(name: &str, leading: bool) {
    global()
        .leaders
        .status
        .get_or_create(&vec![("name", name.to_owned())])
        .set(i64::from(leading));
}

/// Counts a renewal that had to read the Lease again.
pub(crate) fn leader_slowpath(name: &str) {
    global()
        .leaders
        .slowpath
        .get_or_create(&vec![("name", name.to_owned())])
        .inc();
}
