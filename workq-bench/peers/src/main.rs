//! `wq-bench-peers`: the Rust queues a user might pick instead of ours, on the workloads of
//! `wq-bench`, as a program `wq-bench --compare` runs beside its own measurements on the same
//! server (as it runs the node references): `riverqueue` on PostgreSQL, `bullmq-official` on
//! Redis, and `apalis` with `apalis-redis` and `apalis-postgres`.
//!
//! ```text
//! wq-bench-peers describe                          one JSON line per peer: version, settings
//! wq-bench-peers PEER WORKLOAD SIZE                W1, W3 (dedup), W3P (plain adds)
//! wq-bench-peers PEER W4 SIZE [CONCURRENCY]       W4, each of its 2 consumers that concurrent
//! wq-bench-peers PEER W7 MODE ITEMS PROCESSES WORKERS HANDLER_MS RATE
//!                                                  MODE: flood, paced or burndown (W7B)
//! wq-bench-peers PEER W8 NOISY QUIET WORKERS HANDLER_MS  noisy neighbour, in this process
//! ```
//!
//! The server's URL comes from `WQ_REDIS_URL` or `WQ_POSTGRES_URL` (a password stays out of
//! the process list). Figures go to stdout as one JSON object per line, `{"workload", "impl",
//! "metric", "value"}`, or `{"workload", "impl", "na": REASON}` when the peer cannot run the
//! workload. Each peer's module says how it is set up and why.

use std::process::ExitCode;

mod apalis;
mod bullmq;
mod drive;
mod peer;
mod river;
mod w8;

use drive::{Fleet, Load};
use peer::{Peer, Result};

/// Every peer: its name (`impl`), crate and version, and how it is set up.
fn describe() {
    let line = |name: &str, krate: &str, version: &str, backend: &str, settings: String| {
        println!(
            "{}",
            serde_json::json!({
                "impl": name,
                "crate": krate,
                "version": version,
                "backend": backend,
                "settings": settings,
            })
        );
    };
    line(
        bullmq::Bullmq::NAME,
        "bullmq-official",
        env!("PEER_VERSION_BULLMQ_OFFICIAL"),
        "redis",
        bullmq::Bullmq::settings(),
    );
    line(
        apalis::ApalisRedis::NAME,
        "apalis-redis",
        &format!(
            "{} (apalis {})",
            env!("PEER_VERSION_APALIS_REDIS"),
            env!("PEER_VERSION_APALIS")
        ),
        "redis",
        apalis::ApalisRedis::settings(),
    );
    line(
        river::River::NAME,
        "riverqueue",
        env!("PEER_VERSION_RIVERQUEUE"),
        "postgres",
        river::River::settings(),
    );
    line(
        apalis::ApalisPostgres::NAME,
        "apalis-postgres",
        &format!(
            "{} (apalis {})",
            env!("PEER_VERSION_APALIS_POSTGRES"),
            env!("PEER_VERSION_APALIS")
        ),
        "postgres",
        apalis::ApalisPostgres::settings(),
    );
}

/// Runs `args` (the workload and its parameters) with peer `P`.
async fn run<P: Peer>(peer: &str, args: &[String]) -> Result<()> {
    let url = std::env::var(P::URL_VAR).map_err(|_| format!("${} is not set", P::URL_VAR))?;
    exit_with_parent::<P>(url.clone());
    let workload = args.first().ok_or("no workload")?.as_str();
    let number = |i: usize| -> Result<usize> {
        let text = args.get(i).ok_or("too few arguments")?;
        Ok(text.parse().map_err(|e| format!("{text:?}: {e}"))?)
    };
    if workload == "W7-worker" {
        let name = args.get(1).ok_or("no queue")?;
        // The load is the producer's: a worker process takes what comes.
        let fleet = Fleet {
            load: Load::Flood,
            items: number(5)?,
            processes: number(2)? as u32,
            workers: number(3)? as u32,
            handler_ms: number(4)? as u32,
        };
        return drive::w7_worker::<P>(&url, name, fleet).await;
    }
    let emit = |metric: &str, value: f64| {
        println!(
            "{}",
            serde_json::json!({"workload": workload, "impl": P::NAME, "metric": metric, "value": value})
        );
    };
    let not_applicable = |reason: &str| {
        println!(
            "{}",
            serde_json::json!({"workload": workload, "impl": P::NAME, "na": reason})
        );
    };
    if let Some(reason) = P::not_applicable(workload) {
        not_applicable(reason);
        return Ok(());
    }
    let figures = match workload {
        "W1" => drive::w1::<P>(&url, number(1)?).await?,
        "W3" => drive::w3::<P>(&url, number(1)?, true).await?,
        "W3P" => drive::w3::<P>(&url, number(1)?, false).await?,
        "W4" => {
            // The consumers' concurrency, as our consumers' batch (1 by default).
            let concurrency = if args.len() > 2 { number(2)? } else { 1 };
            drive::w4::<P>(&url, number(1)?, concurrency).await?
        }
        "W7" => {
            let load = match args.get(1).map(String::as_str) {
                Some("flood") => Load::Flood,
                Some("burndown") => Load::Backlog,
                Some("paced") => {
                    let rate: f64 = args.get(6).ok_or("no rate")?.parse()?;
                    Load::Paced(rate)
                }
                other => return Err(format!("unknown W7 mode {other:?}").into()),
            };
            let fleet = Fleet {
                load,
                items: number(2)?,
                processes: number(3)? as u32,
                workers: number(4)? as u32,
                handler_ms: number(5)? as u32,
            };
            if let Load::Backlog = fleet.load
                && let Some(reason) = P::backlog_not_applicable(fleet.items)
            {
                not_applicable(&reason);
                return Ok(());
            }
            drive::w7::<P>(peer, &url, fleet).await?
        }
        "W8" => {
            let (noisy, quiet, workers) = (number(1)?, number(2)?, number(3)?);
            w8::w8::<P>(&url, noisy, quiet, workers, number(4)? as u64).await?
        }
        other => return Err(format!("unknown workload {other:?}").into()),
    };
    for (metric, value) in figures {
        emit(metric, value);
    }
    Ok(())
}

/// Ends this process when the one that started it is gone (`wq-bench` interrupted, or the
/// producer of a W7 phase), deleting the queue it made (at most 5 s): a run whose figures
/// nobody will read should neither go on loading the server nor leave its jobs there. Polls
/// the parent's id, which the kernel changes to a reaper's when the parent dies.
fn exit_with_parent<P: Peer>(url: String) {
    #[cfg(unix)]
    {
        let parent = std::os::unix::process::parent_id();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(std::time::Duration::from_millis(500));
                if std::os::unix::process::parent_id() == parent {
                    continue;
                }
                eprintln!("wq-bench-peers: the process that started this one is gone");
                // No more adds; the one under way has a moment to land before the delete.
                drive::stop_adding();
                std::thread::sleep(std::time::Duration::from_millis(300));
                if let (Some(name), Ok(runtime)) = (
                    drive::live_queue(),
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build(),
                ) {
                    let delete = async {
                        P::open(&url, &name).await?.delete().await?;
                        Ok::<_, peer::Error>(())
                    };
                    let limit = std::time::Duration::from_secs(5);
                    let _ = runtime.block_on(async { tokio::time::timeout(limit, delete).await });
                }
                std::process::exit(130);
            }
        });
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(peer) = args.first() else {
        eprintln!("usage: wq-bench-peers describe | PEER WORKLOAD ARGS...");
        return ExitCode::FAILURE;
    };
    if peer == "describe" {
        describe();
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("wq-bench-peers: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rest = &args[1..];
    let result = runtime.block_on(async {
        match peer.as_str() {
            bullmq::Bullmq::NAME => run::<bullmq::Bullmq>(peer, rest).await,
            apalis::ApalisRedis::NAME => run::<apalis::ApalisRedis>(peer, rest).await,
            river::River::NAME => run::<river::River>(peer, rest).await,
            apalis::ApalisPostgres::NAME => run::<apalis::ApalisPostgres>(peer, rest).await,
            other => Err(format!("unknown peer {other:?}").into()),
        }
    });
    if drive::abandoned() {
        // The clean-up thread deletes the queue and ends the process.
        loop {
            std::thread::park();
        }
    }
    // Worker tasks of the peers may still be parked on their connections: do not wait.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wq-bench-peers {peer} {}: {e}", rest.join(" "));
            ExitCode::FAILURE
        }
    }
}
