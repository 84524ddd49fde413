//! A W7 worker process: `wq-bench --fleet-worker BACKEND:QUEUE:WORKERS:HANDLER_MS:ITEMS`, with
//! the server's URL in `$WQ_REDIS_URL` or `$WQ_POSTGRES_URL`.
//!
//! It runs [`Workers`](workq::Workers) with `WORKERS` workers over the queue `QUEUE`,
//! whose handler sleeps `HANDLER_MS` and records when it started and ended, prints `ready`
//! once they run, and runs until its standard input ends. Then it stops them (each finishes
//! the item in hand) and prints one line per item it handled, `ITEM START END` (real-time
//! nanoseconds), for the bench to read.

use std::fmt;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::Arc;

use workq_postgres::PgQueue;
use workq_redis::RedisQueue;

use super::driver::{FleetQueue, Log, spawn_workers};

/// What a worker process is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spec {
    /// `redis` or `postgres`.
    pub(crate) backend: &'static str,
    pub(crate) queue: String,
    pub(crate) workers: u32,
    pub(crate) handler_ms: u32,
    /// Items of the phase: their ids are below this.
    pub(crate) items: usize,
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}:{}",
            self.backend, self.queue, self.workers, self.handler_ms, self.items
        )
    }
}

impl FromStr for Spec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("expected BACKEND:QUEUE:WORKERS:HANDLER_MS:ITEMS, got {s:?}");
        let mut parts = s.rsplitn(4, ':');
        let items = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let handler_ms = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let workers: u32 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let (backend, queue) = parts
            .next()
            .and_then(|p| p.split_once(':'))
            .ok_or_else(bad)?;
        let backend = match backend {
            "redis" => "redis",
            "postgres" => "postgres",
            _ => return Err(format!("unknown backend {backend:?} in {s:?}")),
        };
        if workers == 0 || queue.is_empty() {
            return Err(bad());
        }
        Ok(Spec {
            backend,
            queue: queue.to_owned(),
            workers,
            handler_ms,
            items,
        })
    }
}

/// One line of a worker process's report: `(item, start, end)`.
pub(crate) fn parse_record(line: &str) -> Option<(u64, i64, i64)> {
    let mut fields = line.split_ascii_whitespace();
    let item = fields.next()?.parse().ok()?;
    let start = fields.next()?.parse().ok()?;
    let end = fields.next()?.parse().ok()?;
    Some((item, start, end))
}

/// The worker process's side.
pub(crate) fn run(spec: &str) -> ExitCode {
    let spec: Spec = match spec.parse() {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("wq-bench --fleet-worker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match spec.backend {
        "redis" => serve::<RedisQueue<u64>>(&spec, "WQ_REDIS_URL"),
        _ => serve::<PgQueue<u64>>(&spec, "WQ_POSTGRES_URL"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wq-bench --fleet-worker: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve<Q: FleetQueue>(spec: &Spec, url_var: &str) -> Result<(), String> {
    let url = std::env::var(url_var).map_err(|_| format!("${url_var} is not set"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let log = Arc::new(Log::new(spec.items));
    let workers = runtime.block_on(async {
        let queue = Q::open(&url, &spec.queue).await?;
        Ok::<_, String>(spawn_workers(
            queue,
            spec.workers as usize,
            u64::from(spec.handler_ms),
            log.clone(),
        ))
    })?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "ready")
        .and_then(|()| stdout.flush())
        .map_err(|e| e.to_string())?;
    // Until the bench closes our input (or goes away).
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    let summary = runtime.block_on(workers.shut_down());
    let mut out = std::io::BufWriter::new(stdout);
    let reported = log
        .records()
        .try_for_each(|(item, start, end)| writeln!(out, "{item} {start} {end}"))
        .and_then(|()| out.flush());
    match reported {
        Ok(()) => {}
        // The bench is gone (interrupted): nobody to report to.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
        Err(e) => return Err(e.to_string()),
    }
    if summary.processed != log.handled() as u64 {
        return Err(format!(
            "the workers processed {} items but the handler saw {}",
            summary.processed,
            log.handled()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_reads_back_what_it_wrote() {
        let spec = Spec {
            backend: "redis",
            queue: "wq-bench-w7-1-2".into(),
            workers: 16,
            handler_ms: 1,
            items: 100_000,
        };
        assert_eq!(spec.to_string().parse::<Spec>(), Ok(spec));
        assert!("redis:q:0:1:10".parse::<Spec>().is_err());
        assert!("mysql:q:1:1:10".parse::<Spec>().is_err());
        assert!("redis:q:1:1".parse::<Spec>().is_err());
        // A queue name may hold a colon.
        assert_eq!("postgres:a:b:2:0:5".parse::<Spec>().unwrap().queue, "a:b");
    }

    #[test]
    fn a_record_line_reads_back() {
        assert_eq!(parse_record("7 10 20\n"), Some((7, 10, 20)));
        assert_eq!(parse_record("ready"), None);
    }
}
