//! `wq dashboard`: the web dashboard of every queue on a Redis server (or cluster) and in a
//! PostgreSQL database, with every action logged to stderr.
//!
//! Each backend is one source, its operator contract (`workq::admin::Admin`); the sources
//! given on the command line are served side by side on one page (see [`sources`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use workq::admin::redact_url as redact;
use workq_dashboard::{Config, Dashboard, Server, check_token, generate_token};
use workq_redis::RedisAdmin;

/// Serves the dashboard: a page, a JSON API under `/api/` and `/metrics`.
#[derive(Debug, Args)]
pub(crate) struct DashboardArgs {
    /// The Redis server (`redis://[:PASSWORD@]HOST:PORT/DB`); default: `$WQ_REDIS_URL`.
    #[arg(long)]
    redis: Option<String>,
    /// A Redis Cluster instead: the URLs of some of its nodes, comma-separated; every primary
    /// is scanned. Default: `$WQ_REDIS_CLUSTER`.
    #[arg(long, value_delimiter = ',')]
    redis_cluster: Vec<String>,
    /// The PostgreSQL database whose queues are shown
    /// (`postgres://user[:password]@host:port/database`, `?sslmode=require` for TLS), beside
    /// the Redis ones if both are given. `--postgres` alone, or no flag, reads
    /// `$WQ_POSTGRES_URL` (keep a password off the command line).
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    postgres: Option<String>,
    /// A server of any backend, by its URL's scheme (`redis://`, `rediss://`,
    /// `redis+unix://`, `postgres://`); repeat it for more.
    #[arg(long = "url", value_name = "URL")]
    urls: Vec<String>,
    /// Where to listen. Anything but a loopback address needs HTTPS (`--tls-cert` and
    /// `--tls-key`), a `--public-url https://...` (TLS ended at a proxy) or `--insecure-http`.
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// A file holding the token the page and the API need (its first line): URL-safe, 128
    /// bits or more (`openssl rand -hex 32`). The token can also come from
    /// `$WQ_DASHBOARD_TOKEN`; `--token` shows it to every user of the machine in the process
    /// list. With none, a random token is made and the address to open printed once.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// The token, on the command line (prefer `--token-file` or `$WQ_DASHBOARD_TOKEN`).
    #[arg(long)]
    token: Option<String>,
    /// No token at all: every process on this machine can read the queues' items and act on
    /// them, and so can anyone a reverse proxy on this machine forwards for. Loopback
    /// `--addr` only, no `--public-url`.
    #[arg(long, conflicts_with_all = ["token", "token_file", "public_url"])]
    no_auth: bool,
    /// The URL operators open when a reverse proxy serves the dashboard
    /// (`https://ops.example.com/wq/`): actions from that origin are accepted, the cookie is
    /// scoped to its path and `Secure`. `https` only: an `http://` one is refused, whatever
    /// the other flags.
    #[arg(long)]
    public_url: Option<String>,
    /// Serve HTTPS with the certificate chain in this PEM file (with `--tls-key`).
    #[arg(long, requires = "tls_key", value_name = "PEM")]
    tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert`, a PEM file.
    #[arg(long, requires = "tls_cert", value_name = "PEM")]
    tls_key: Option<PathBuf>,
    /// Serve plain HTTP on a non-loopback `--addr`, with no public URL: the token and every
    /// item cross the network in clear.
    #[arg(long)]
    insecure_http: bool,
    /// At most this many connections at once; more are closed as they come.
    #[arg(long, default_value_t = Server::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// At most this many connections at once from one client address (behind a reverse
    /// proxy, the proxy is one client).
    #[arg(long, default_value_t = Server::DEFAULT_MAX_CONNECTIONS_PER_CLIENT)]
    max_connections_per_client: usize,
    /// Seconds a connection has to send a request's headers (and, with TLS, to finish its
    /// handshake); an idle or slow one is closed.
    #[arg(long, value_name = "SECS", default_value_t = Server::DEFAULT_HEADER_READ_TIMEOUT.as_secs())]
    header_read_timeout: u64,
    /// Seconds a request may take, its body included; then it is answered 408 (and logged
    /// and counted as a refusal).
    #[arg(long, value_name = "SECS", default_value_t = Config::default().request_timeout.as_secs())]
    request_timeout: u64,
    /// No actions (requeue, delete, purge, retry, remove, pause, resume, forget).
    #[arg(long)]
    read_only: bool,
    /// The key prefix of the queues on Redis.
    #[arg(long, default_value = "wq")]
    prefix: String,
    /// Seconds between the samples of the charts (the last hour is kept).
    #[arg(long, default_value_t = 5)]
    sample_every: u64,
    /// At most this many queues keep their charts' samples (the ones looked at most
    /// recently); every source's totals are always kept.
    #[arg(long, default_value_t = 100)]
    history_queues: usize,
    /// `/metrics` reports the depth and in-flight leases of this many groups of each queue
    /// with flow control (the ones with the most ready items); 0 reports none.
    #[arg(long, value_name = "N", default_value_t = 0)]
    group_series: usize,
}

/// Logs to stderr: `RUST_LOG` if set, else the dashboard's audit trail and warnings.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,workq_dashboard=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(true)
        .try_init();
}

/// The token from `--token-file`, `--token` or `$WQ_DASHBOARD_TOKEN`, in that order.
fn token(args: &DashboardArgs) -> Result<Option<String>, String> {
    if let Some(path) = &args.token_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
        let token = text.lines().next().unwrap_or("").trim().to_owned();
        if token.is_empty() {
            return Err(format!("the token file {} is empty", path.display()));
        }
        return Ok(Some(token));
    }
    Ok(args
        .token
        .clone()
        .or_else(|| std::env::var("WQ_DASHBOARD_TOKEN").ok())
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty()))
}

/// The sources the arguments (or their environment variables) name, and how each is
/// described on the first line.
fn sources(args: &DashboardArgs, dashboard: Dashboard) -> Result<(Dashboard, Vec<String>), String> {
    let mut dashboard = dashboard;
    let mut described = Vec::new();
    let cluster: Vec<String> = if args.redis_cluster.is_empty() {
        std::env::var("WQ_REDIS_CLUSTER")
            .map(|v| v.split(',').map(|s| s.trim().to_owned()).collect())
            .unwrap_or_default()
    } else {
        args.redis_cluster.clone()
    };
    let cluster: Vec<String> = cluster.into_iter().filter(|s| !s.is_empty()).collect();
    let redis = args
        .redis
        .clone()
        .or_else(|| std::env::var("WQ_REDIS_URL").ok());
    if let Some(url) = &redis {
        let source = RedisAdmin::new(url, &args.prefix).map_err(|e| e.to_string())?;
        dashboard = dashboard.source(source);
        described.push(format!(
            "the queues under {:?} on {}",
            args.prefix,
            redact(url)
        ));
    }
    if !cluster.is_empty() {
        let shown: Vec<String> = cluster.iter().map(|u| redact(u)).collect();
        let source = RedisAdmin::cluster(cluster, &args.prefix).map_err(|e| e.to_string())?;
        dashboard = dashboard.source(source);
        described.push(format!(
            "the queues under {:?} on the cluster of {}",
            args.prefix,
            shown.join(", ")
        ));
    }
    let postgres = match args.postgres.as_deref() {
        Some("") => match std::env::var("WQ_POSTGRES_URL") {
            Ok(url) if !url.is_empty() => Some(url),
            _ => return Err("--postgres without a URL needs WQ_POSTGRES_URL".into()),
        },
        Some(url) => Some(url.to_owned()),
        None => std::env::var("WQ_POSTGRES_URL")
            .ok()
            .filter(|url| !url.is_empty()),
    };
    let mut urls: Vec<&str> = postgres.iter().map(String::as_str).collect();
    urls.extend(args.urls.iter().map(String::as_str));
    for url in urls {
        let admin = crate::queue::admin_for(url, &args.prefix, "wq-dashboard")?;
        described.push(match admin.kind() {
            "postgres" => format!("the queues in PostgreSQL at {}", redact(url)),
            _ => format!("the queues under {:?} on {}", args.prefix, redact(url)),
        });
        dashboard = dashboard.source(admin);
    }
    if described.is_empty() {
        return Err(
            "give --url URL, --redis URL (or WQ_REDIS_URL), --redis-cluster NODES (or \
                    WQ_REDIS_CLUSTER) or --postgres URL (or WQ_POSTGRES_URL)"
                .into(),
        );
    }
    Ok((dashboard, described))
}

/// How the dashboard is reached, from the arguments: the token (given, made, or none with
/// `--no-auth`), and whether the URL printed says so.
struct Access {
    token: Option<String>,
    /// Made here: the printed address carries it.
    generated: bool,
}

/// Checks the arguments that decide who can reach the dashboard and how; the error says
/// what to give instead.
fn access(args: &DashboardArgs) -> Result<Access, String> {
    let given = token(args)?;
    if let Some(token) = &given {
        check_token(token)?;
    }
    let loopback = args.addr.ip().is_loopback();
    let tls = args.tls_cert.is_some();
    if let Some(url) = &args.public_url {
        let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("https") => {}
            // `--insecure-http` does not make it acceptable: it says this server speaks plain
            // HTTP, not that the page operators open may.
            Some("http") => {
                return Err(format!(
                    "--public-url {url}: operators would open the page, and send the token, in \
                     clear; give the https:// URL the proxy serves (TLS ended at the proxy)"
                ));
            }
            _ => return Err(format!("--public-url {url}: give https://HOST[/PATH]")),
        }
    }
    if !loopback && !tls && args.public_url.is_none() && !args.insecure_http {
        return Err(format!(
            "{} is not a loopback address, and the token and every item would cross the network \
             in clear: give --tls-cert PEM --tls-key PEM, or --public-url https://... when a \
             proxy ends TLS, or --insecure-http to accept it",
            args.addr
        ));
    }
    if args.no_auth {
        if !loopback {
            return Err(format!(
                "--no-auth: {} is not a loopback address; without a token the dashboard is \
                 for this machine only",
                args.addr
            ));
        }
        return Ok(Access {
            token: None,
            generated: false,
        });
    }
    Ok(match given {
        Some(token) => Access {
            token: Some(token),
            generated: false,
        },
        None => Access {
            token: Some(generate_token()),
            generated: true,
        },
    })
}

pub(crate) fn run(args: DashboardArgs) -> ExitCode {
    init_logging();
    let access = match access(&args) {
        Ok(access) => access,
        Err(e) => {
            eprintln!("wq dashboard: {e}");
            return ExitCode::from(2);
        }
    };
    if access.token.is_none() {
        eprintln!(
            "wq dashboard: WARNING: --no-auth: no token. Every process and every user of this \
             machine can read the queues' items and purge, requeue or remove them, and so can \
             anyone a reverse proxy on this machine forwards (nginx's proxy_pass reaches the \
             dashboard from 127.0.0.1, like a local client). Leave --no-auth out, and open the \
             address with the token it prints."
        );
    }
    let config = Config {
        token: access.token.clone(),
        read_only: args.read_only,
        sample_every: Duration::from_secs(args.sample_every.max(1)),
        history_queues: args.history_queues,
        group_series: args.group_series,
        public_url: args.public_url.clone(),
        request_timeout: Duration::from_secs(args.request_timeout.max(1)),
        ..Config::default()
    };
    let read_only = config.read_only;
    let (dashboard, described) = match sources(&args, Dashboard::new(config)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("wq dashboard: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("wq dashboard: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let app = match dashboard.router() {
            Ok(app) => app,
            Err(e) => {
                eprintln!("wq dashboard: {e}");
                return ExitCode::from(2);
            }
        };
        let listener = match tokio::net::TcpListener::bind(args.addr).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("wq dashboard: cannot listen on {}: {e}", args.addr);
                return ExitCode::FAILURE;
            }
        };
        let mut server = Server::new(listener)
            .max_connections(args.max_connections)
            .max_connections_per_client(args.max_connections_per_client)
            .header_read_timeout(Duration::from_secs(args.header_read_timeout.max(1)));
        if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
            server = match server.tls_pem(cert, key) {
                Ok(server) => server,
                Err(e) => {
                    eprintln!("wq dashboard: {e}");
                    return ExitCode::from(2);
                }
            };
        }
        let local = server.local_addr().map_or(args.addr, |a| a);
        let scheme = if server.is_tls() { "https" } else { "http" };
        // The first line names the address (tests read it when the port was 0); a token
        // made here is printed in it once, as the address to open.
        // The public URL as the dashboard reads it: its path ends with `/`.
        let public_url = args.public_url.as_deref().map(|url| {
            let url = url.trim();
            if url.ends_with('/') {
                url.to_owned()
            } else {
                format!("{url}/")
            }
        });
        let open = match (&public_url, access.generated) {
            (Some(public), true) => format!(
                "{}?token={}",
                public,
                access.token.as_deref().unwrap_or_default()
            ),
            (Some(public), false) => public.clone(),
            (None, true) => format!(
                "{scheme}://{local}/?token={}",
                access.token.as_deref().unwrap_or_default()
            ),
            (None, false) => format!("{scheme}://{local}/"),
        };
        // The signal handlers are set before the address is printed: whoever reads it may send
        // SIGTERM at once, and a handler set later would leave the default action (death).
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let mut interrupt =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
        let mut banner = format!(
            "wq dashboard: {open} for {}{}\n",
            described.join(" and "),
            if read_only { " (read-only)" } else { "" }
        );
        if access.token.is_some() && !access.generated {
            banner.push_str(&format!(
                "wq dashboard: open {open}?token=TOKEN once with the token you gave (or send \
                 Authorization: Bearer TOKEN)\n"
            ));
        }
        let clear_on_the_network = !server.is_tls() && !local.ip().is_loopback();
        if args.public_url.is_some() {
            banner.push_str(&format!(
                "wq dashboard: listening on {scheme}://{local}/ behind the proxy{}\n",
                if clear_on_the_network {
                    " (plain HTTP from the proxy to here: keep that hop on a private network, \
                     or give --tls-cert and --tls-key)"
                } else {
                    ""
                }
            ));
        } else if clear_on_the_network {
            // Only `--insecure-http` gets here (`access` refused the rest).
            eprintln!(
                "wq dashboard: WARNING: --insecure-http: {local} serves plain HTTP to the \
                 network; the token and every item cross it in clear, readable by anyone on \
                 the path. Give --tls-cert and --tls-key, or serve it behind a proxy that ends \
                 TLS (--public-url https://...)."
            );
        }
        // One write, and a reader that has gone (a closed pipe) does not stop the server:
        // `println!` would panic on it.
        {
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(banner.as_bytes()).and_then(|()| out.flush());
        }
        let shutdown = async {
            tokio::select! {
                () = received(interrupt.as_mut()) => {}
                () = received(term.as_mut()) => {}
            }
            tracing::info!("wq dashboard: stopping");
        };
        match server.serve_with_shutdown(app, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("wq dashboard: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Completes when `signal` is received; never if it could not be set up.
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}
