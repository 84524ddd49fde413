//! What a controller reports of its reconciles and its leadership: controller-runtime's and
//! client-go's series in the process-wide registry with feature `prometheus`
//! ([`metrics`](crate::metrics)), nothing without it.

use std::time::Duration;

use crate::outcome::ReconcileEnd;

/// One controller's reconcile series (with feature `prometheus`).
#[derive(Clone, Debug)]
pub(crate) struct Instruments {
    #[cfg(feature = "prometheus")]
    series: crate::metrics::ControllerSeries,
}

impl Instruments {
    /// The series of `controller`, each at 0 from now on.
    pub(crate) fn new(controller: &str) -> Self {
        #[cfg(not(feature = "prometheus"))]
        let _ = controller;
        Self {
            #[cfg(feature = "prometheus")]
            series: crate::metrics::ControllerSeries::new(controller),
        }
    }

    /// The controller runs `count` workers.
    pub(crate) fn workers(&self, count: usize) {
        #[cfg(feature = "prometheus")]
        self.series.workers(count);
        #[cfg(not(feature = "prometheus"))]
        let _ = count;
    }

    /// A worker started on a key.
    pub(crate) fn worker_busy(&self) {
        #[cfg(feature = "prometheus")]
        self.series.worker_busy();
    }

    /// A worker is done with its key.
    pub(crate) fn worker_idle(&self) {
        #[cfg(feature = "prometheus")]
        self.series.worker_idle();
    }

    /// A reconcile ended as `end` after `took`.
    pub(crate) fn reconciled(&self, end: ReconcileEnd, took: Duration) {
        #[cfg(feature = "prometheus")]
        self.series.reconciled(end, took);
        #[cfg(not(feature = "prometheus"))]
        let _ = (end, took);
    }

    /// A failure that is not retried.
    pub(crate) fn terminal_error(&self) {
        #[cfg(feature = "prometheus")]
        self.series.terminal_error();
    }

    /// A reconcile panicked.
    pub(crate) fn panicked(&self) {
        #[cfg(feature = "prometheus")]
        self.series.panicked();
    }

    /// A reconcile was cancelled by the workers' timeout.
    pub(crate) fn timed_out(&self) {
        #[cfg(feature = "prometheus")]
        self.series.timed_out();
    }
}

/// Sets `leader_election_master_status{name}`.
pub(crate) fn leader_status(name: &str, leading: bool) {
    #[cfg(feature = "prometheus")]
    crate::metrics::leader_status(name, leading);
    #[cfg(not(feature = "prometheus"))]
    let _ = (name, leading);
}

/// Counts a renewal that had to read the Lease again (`leader_election_slowpath_total`).
pub(crate) fn leader_slowpath(name: &str) {
    #[cfg(feature = "prometheus")]
    crate::metrics::leader_slowpath(name);
    #[cfg(not(feature = "prometheus"))]
    let _ = name;
}
