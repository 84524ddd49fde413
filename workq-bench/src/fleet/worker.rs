//! A W7 worker process: `wq-bench --fleet-worker BACKEND:QUEUE:WORKERS:HANDLER_MS:ITEMS`, with
//! the server's URL in `$WQ_REDIS_URL` or `$WQ_POSTGRES_URL`.
//!
//! It runs [`Workers`](workq::Workers) with `WORKERS` workers over the queue `QUEUE`,
//! whose handler sleeps `HANDLER_MS` and records when it started and ended, prints `ready`
//! once they run, and runs until its standard input ends. Then it stops them (each finishes
//! the item in hand) and prints one line per item it handled, `ITEM START END` (real-time
//! nanoseconds), for the bench to read.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::Arc;

use workq_postgres::PgQueue;
use workq_redis::RedisQueue;

use super::driver::{FleetQueue, Log, spawn_workers};
use super::protocol::Spec;

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
