//! The server a run measures on: which kind ([`Backend`]), and the connection, runtime and
//! references that go with it ([`Server`]).

use std::sync::Mutex;

use workq_postgres::PgQueue;
use workq_redis::RedisQueue;

use crate::peers::{Outcome, Peer};
use crate::report::{OURS_POSTGRES, OURS_POSTGRES_BATCH, OURS_REDIS, OURS_REDIS_BATCH, Sample};
use crate::util::text;

/// Which kind of server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// Redis (`--redis`).
    Redis,
    /// PostgreSQL (`--postgres`).
    Postgres,
}

impl Backend {
    /// The option that chooses it, for messages.
    pub(crate) fn flag(self) -> &'static str {
        match self {
            Backend::Redis => "--redis",
            Backend::Postgres => "--postgres",
        }
    }

    /// Its name in the report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::Redis => "Redis",
            Backend::Postgres => "PostgreSQL",
        }
    }

    /// The variable a URL is read from when the option has none, and the one a child
    /// process (a W7 worker, a peer) is given the URL in.
    pub(crate) fn url_var(self) -> &'static str {
        match self {
            Backend::Redis => "WQ_REDIS_URL",
            Backend::Postgres => "WQ_POSTGRES_URL",
        }
    }

    /// The `impl` of our figures on it.
    pub(crate) fn ours(self) -> &'static str {
        match self {
            Backend::Redis => OURS_REDIS,
            Backend::Postgres => OURS_POSTGRES,
        }
    }

    /// The `impl` of our figures with a consumer that takes items in batches.
    pub(crate) fn ours_batched(self) -> &'static str {
        match self {
            Backend::Redis => OURS_REDIS_BATCH,
            Backend::Postgres => OURS_POSTGRES_BATCH,
        }
    }
}

/// A server to measure on, with what it takes: a runtime for the async clients, and the
/// references that run beside ours on it.
pub(crate) struct Server {
    pub(crate) backend: Backend,
    pub(crate) url: String,
    pub(crate) runtime: tokio::runtime::Runtime,
    /// The references measured on it, in report order.
    pub(crate) peers: Vec<Peer>,
    /// The server, for the report: Redis's persistence settings, PostgreSQL's version.
    pub(crate) description: String,
    /// What could not be measured, for the report.
    pub(crate) notes: Mutex<Vec<String>>,
}

impl Server {
    /// Connects to the server at `url`; the references beside ours are added to `peers`
    /// after.
    pub(crate) fn connect(backend: Backend, url: String) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime: {e}"))?;
        let description = match backend {
            Backend::Redis => {
                let probe: RedisQueue<u64> = runtime
                    .block_on(
                        RedisQueue::builder("wq-bench-probe")
                            .url(url.as_str())
                            .build(),
                    )
                    .map_err(text)?;
                let persistence = probe
                    .persistence()
                    .map(|p| p.to_string())
                    .unwrap_or_default();
                // Building the probe listed it in the server's index of queues (which an
                // operator's listing and the dashboard read): it leaves no trace.
                runtime.block_on(probe.delete()).map_err(text)?;
                format!("Redis ({persistence})")
            }
            Backend::Postgres => runtime.block_on(async {
                let probe: PgQueue<u64> = PgQueue::builder("wq-bench-probe")
                    .url(url.as_str())
                    .build()
                    .await
                    .map_err(text)?;
                let version: String = sqlx_version(&probe).await?;
                Ok::<_, String>(version)
            })?,
        };
        Ok(Self {
            backend,
            url,
            runtime,
            peers: Vec::new(),
            description,
            notes: Mutex::default(),
        })
    }

    /// Notes what could not be measured, for the report.
    pub(crate) fn note(&self, note: String) {
        self.notes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(note);
    }

    /// The notes, each once, in the order they were made.
    pub(crate) fn notes(&self) -> Vec<String> {
        let mut notes = self.notes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        notes.dedup();
        notes
    }

    /// Runs `peer` with `args` on this server: its samples of `workload` (not applicable ones
    /// for each of `metrics`, with the reason), or failed ones with the error: the report
    /// shows the peer's column as failed, not missing.
    pub(crate) fn run_peer(
        &self,
        peer: &Peer,
        workload: &'static str,
        args: &[String],
        metrics: &[&'static str],
    ) -> Vec<Sample> {
        match peer.run(&self.url, args) {
            Ok(Outcome::Figures(figures)) => figures
                .into_iter()
                .map(|(metric, value)| Sample::new(workload, peer.name, metric, value))
                .collect(),
            Ok(Outcome::NotApplicable(reason)) => metrics
                .iter()
                .map(|metric| Sample::not_applicable(workload, peer.name, metric, &reason))
                .collect(),
            Err(e) => metrics
                .iter()
                .map(|metric| Sample::failed(workload, peer.name, metric, &e))
                .collect(),
        }
    }
}

/// The server's version, for the report.
async fn sqlx_version(queue: &PgQueue<u64>) -> Result<String, String> {
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(queue.pool())
        .await
        .map_err(text)?;
    Ok(format!("PostgreSQL {version}"))
}
