//! `wq dashboard`: the web dashboard of every queue on a Redis server.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use workqueue_dashboard::{Config, RedisSource, redact};

/// Serves the dashboard: a page, a JSON API under `/api/` and `/metrics`.
#[derive(Debug, Args)]
pub(crate) struct DashboardArgs {
    /// The Redis server (`redis://[:PASSWORD@]HOST:PORT/DB`); default: `$WQ_REDIS_URL`.
    #[arg(long)]
    redis: Option<String>,
    /// Where to listen. Anything but a loopback address needs a token.
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// The token the page and the API need; default: `$WQ_DASHBOARD_TOKEN`.
    #[arg(long)]
    token: Option<String>,
    /// No actions (requeue, purge, pause, resume, forget).
    #[arg(long)]
    read_only: bool,
    /// The key prefix of the queues.
    #[arg(long, default_value = "wq")]
    prefix: String,
    /// Seconds between the samples of the charts (the last hour is kept).
    #[arg(long, default_value_t = 5)]
    sample_every: u64,
}

pub(crate) fn run(args: DashboardArgs) -> ExitCode {
    let Some(url) = args.redis.or_else(|| std::env::var("WQ_REDIS_URL").ok()) else {
        eprintln!("wq dashboard: give --redis URL or set WQ_REDIS_URL");
        return ExitCode::from(2);
    };
    let token = args
        .token
        .or_else(|| std::env::var("WQ_DASHBOARD_TOKEN").ok())
        .filter(|t| !t.is_empty());
    if token.is_none() && !args.addr.ip().is_loopback() {
        eprintln!(
            "wq dashboard: {} is not a loopback address: give --token or set WQ_DASHBOARD_TOKEN",
            args.addr
        );
        return ExitCode::from(2);
    }
    let source = match RedisSource::new(&url, &args.prefix) {
        Ok(source) => source,
        Err(e) => {
            eprintln!("wq dashboard: {e}");
            return ExitCode::from(2);
        }
    };
    let config = Config {
        token,
        read_only: args.read_only,
        sample_every: Duration::from_secs(args.sample_every.max(1)),
        ..Config::default()
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("wq dashboard: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(args.addr).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("wq dashboard: cannot listen on {}: {e}", args.addr);
                return ExitCode::FAILURE;
            }
        };
        let local = listener.local_addr().map_or(args.addr, |a| a);
        // The first line names the address (tests read it when the port was 0).
        println!(
            "wq dashboard: http://{local}/ for the queues under {:?} on {}{}",
            args.prefix,
            redact(&url),
            if config.read_only { " (read-only)" } else { "" }
        );
        let app = workqueue_dashboard::router(source, config);
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        match axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("wq dashboard: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
