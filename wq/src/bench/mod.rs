//! `wq bench`: the standard workloads of BENCH.md, each beside its references, in one run.
//!
//! Every workload lives in its own module (`w1_fifo`, `p1_priority`, `w2_contended`,
//! `w3_dedup`, `w4_delay`, `w5_retry`, `w6_memory`, and `fleet` for W7), whose module
//! documentation says what it measures and its caveats. The backend is an option: with
//! `--redis URL` the workloads are W1, W3 and W4 on a queue on Redis (`distributed`) and W7
//! (`fleet`) beside BullMQ, with `--postgres URL` the same on a queue on PostgreSQL beside
//! pg-boss (both references run in `node`, see `node_peer`), in the same report and the same
//! `--json` lines, as `impl` `workqueue-redis` and `bullmq`, or `workqueue-postgres` and
//! `pg-boss`. W7S, W7's scaling sweep, runs on a server when named or with `--plot DIR`. A workload returns
//! [`report::Sample`]s (one number per
//! implementation and metric); with `--runs N` every workload runs N times and the report
//! holds the median of each figure.
//!
//! Progress goes to stderr, one line per workload; the table (or, with `--json`, one JSON
//! object per line and figure) goes to stdout. Nothing here is a pass/fail test: the goals of
//! the project are shown beside the figures for orientation only.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

mod distributed;
mod fleet;
mod node_peer;
mod p1_priority;
mod report;
mod util;
mod w1_fifo;
mod w2_contended;
mod w3_dedup;
mod w4_delay;
mod w5_retry;
mod w6_memory;

use report::Sample;

/// Options of `wq bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// Runs smaller versions of the workloads, one run each (in memory, well under 20 s on 2
    /// cores; W7 on a server, 10,000 items per phase, about a minute beside its reference).
    #[arg(long)]
    quick: bool,

    /// Runs W1, W3, W4 and W7 against the Redis-backed queue at URL (a local server; the bench
    /// uses queues of its own and deletes them) beside BullMQ on the same server, which it
    /// installs with npm (the versions pinned in wq/benchmarks/bullmq) into a private directory
    /// of this user's unless --no-bullmq is given. Same report and --json lines, with `impl`
    /// workqueue-redis and bullmq.
    /// `--redis` alone takes the URL from $WQ_REDIS_URL (keep a password off the command line).
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    redis: Option<String>,

    /// With --redis: skips BullMQ.
    #[arg(long, requires = "redis")]
    no_bullmq: bool,

    /// Runs W1, W3, W4 and W7 against the PostgreSQL-backed queue at URL (the bench uses queues
    /// of its own and deletes them) beside pg-boss on the same database, which it installs
    /// with npm (the versions pinned in wq/benchmarks/pg-boss) into a private directory of
    /// this user's unless --no-pgboss is given. Same report and --json lines, with `impl`
    /// workqueue-postgres and pg-boss.
    /// `--postgres` alone takes the URL from $WQ_POSTGRES_URL (keep a password off the
    /// command line).
    #[arg(
        long,
        value_name = "URL",
        num_args = 0..=1,
        default_missing_value = "",
        conflicts_with = "redis"
    )]
    postgres: Option<String>,

    /// With --postgres: skips pg-boss.
    #[arg(long, requires = "postgres")]
    no_pgboss: bool,

    /// Workloads to run, comma separated (W1, P1, W2, W3, W4, W5, W6, W7; with --redis or
    /// --postgres: W1, W3, W4, W7, W7S); all by default (but W7S, which --plot adds).
    #[arg(
        short = 'w',
        long = "workloads",
        value_delimiter = ',',
        value_name = "IDS"
    )]
    workloads: Vec<String>,

    /// Runs every workload this many times and reports the median of each figure
    /// (default: 3, or 1 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    runs: Option<u32>,

    /// Prints one JSON object per line and figure instead of the table.
    #[arg(long)]
    json: bool,

    /// With --redis or --postgres: runs W7S (W7 at 1, 4, 16 and 64 workers per process) too,
    /// and writes its plot, items/s and pickup p99 against workers, to DIR/w7-scaling.svg.
    #[arg(long, value_name = "DIR")]
    plot: Option<std::path::PathBuf>,

    /// W7 and W7S: the numbers of worker processes to run, comma separated (default: 1,4 for
    /// W7 on a server, 1 in memory and for W7S).
    #[arg(long, value_delimiter = ',', value_name = "N,...", value_parser = clap::value_parser!(u32).range(1..=64))]
    processes: Vec<u32>,

    /// W7 and W7S: the numbers of workers per process (`Workers::count`, a reference's
    /// concurrency), comma separated (default: 16 for W7, 1,4,16,64 for W7S).
    #[arg(long, value_delimiter = ',', value_name = "N,...", value_parser = clap::value_parser!(u32).range(1..=1024))]
    workers: Vec<u32>,

    /// W7 and W7S: how long the handler sleeps, in ms, comma separated (default: 0,1).
    #[arg(long, value_delimiter = ',', value_name = "MS,...", value_parser = clap::value_parser!(u32).range(0..=1000))]
    handler_ms: Vec<u32>,

    /// Internal: runs the workers of one W7 process (BACKEND:QUEUE:WORKERS:HANDLER_MS:ITEMS).
    #[arg(long, hide = true, value_name = "SPEC")]
    fleet_worker: Option<String>,

    /// Internal: measures one W6 case in this (fresh) process and prints it as JSON.
    #[arg(long, hide = true, value_name = "CASE")]
    w6_child: Option<String>,

    /// Internal: the number of items of the W6 case.
    #[arg(long, hide = true, value_name = "N", default_value_t = 0)]
    w6_items: usize,
}

/// What a workload gets to know about the run.
pub(crate) struct Ctx<'a> {
    /// Smaller sizes (`--quick`).
    pub(crate) quick: bool,
    /// The Redis or PostgreSQL server, with `--redis` or `--postgres`.
    pub(crate) server: Option<&'a distributed::Server>,
    /// W7's shapes as the options chose them (empty: the workload's defaults).
    pub(crate) fleet: fleet::Choice,
    /// This run's number, from 1.
    pub(crate) run: u32,
    /// Runs in all.
    pub(crate) runs: u32,
    /// The workload's id, for progress messages.
    id: &'static str,
    /// The progress spinner.
    progress: &'a Progress,
}

impl Ctx<'_> {
    /// Says on the progress line which implementation is being measured.
    pub(crate) fn step(&self, what: &str) {
        self.progress.message(format!(
            "{} run {}/{}: {what}",
            self.id, self.run, self.runs
        ));
    }
}

/// One standard workload.
struct Workload {
    /// `W1` ...
    id: &'static str,
    /// A few words for the progress line.
    title: &'static str,
    /// Runs it once.
    run: fn(&Ctx<'_>) -> Result<Vec<Sample>, String>,
}

/// Every workload, in report order (P1 sits beside W1, whose cycle it repeats with
/// priorities).
const WORKLOADS: &[Workload] = &[
    Workload {
        id: "W1",
        title: "fifo, 1 producer, 1 consumer",
        run: |ctx| Ok(w1_fifo::run(ctx)),
    },
    Workload {
        id: "P1",
        title: "priorities, 1,000 keys over 5 priorities",
        run: |ctx| Ok(p1_priority::run(ctx)),
    },
    Workload {
        id: "W2",
        title: "contended, 4 producers, 4 consumers",
        run: |ctx| Ok(w2_contended::run(ctx)),
    },
    Workload {
        id: "W3",
        title: "dedup, 4 producers of 1,000 keys, 2 consumers",
        run: |ctx| Ok(w3_dedup::run(ctx)),
    },
    Workload {
        id: "W4",
        title: "delay, add_after with random delays, 2 consumers",
        run: |ctx| Ok(w4_delay::run(ctx)),
    },
    Workload {
        id: "W5",
        title: "retry, exponential backoff, 4 consumers",
        run: |ctx| Ok(w5_retry::run(ctx)),
    },
    Workload {
        id: "W6",
        title: "memory, peak RSS per item",
        run: |ctx| Ok(w6_memory::run(ctx)),
    },
    Workload {
        id: "W7",
        title: "fleet, 100,000 items to Workers with count 16",
        run: fleet::run_memory,
    },
];

/// The workloads on a server (`--redis URL`, `--postgres URL`), in report order.
const SERVER_WORKLOADS: &[Workload] = &[
    Workload {
        id: "W1",
        title: "fifo on the server, 1 producer, 1 consumer",
        run: distributed::run_w1,
    },
    Workload {
        id: "W3",
        title: "dedup on the server, 4 producers of 1,000 keys, 2 consumers",
        run: distributed::run_w3,
    },
    Workload {
        id: "W4",
        title: "delay on the server, random delays, 2 consumers",
        run: distributed::run_w4,
    },
    Workload {
        id: "W7",
        title: "fleet on the server, Workers with count 16 in 1 and 4 processes",
        run: fleet::run_server,
    },
    Workload {
        id: fleet::SCALE_ID,
        title: "fleet scaling, 1 to 64 workers in one process",
        run: fleet::run_scale,
    },
];

/// Workloads that run only when named (or, for W7S, with `--plot`).
const ON_REQUEST: &[&str] = &[fleet::SCALE_ID];

/// Progress on stderr: a spinner on a terminal, plain lines otherwise.
struct Progress {
    bar: ProgressBar,
}

impl Progress {
    fn new() -> Self {
        let bar = if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed:>3}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        } else {
            ProgressBar::hidden()
        };
        Self { bar }
    }

    fn message(&self, message: String) {
        self.bar.set_message(message);
    }

    /// Prints a line that stays, above the spinner.
    fn line(&self, line: String) {
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Runs the benchmarks.
pub(crate) fn run(args: BenchArgs) -> ExitCode {
    if let Some(case) = &args.w6_child {
        return w6_memory::child(case, args.w6_items);
    }
    if let Some(spec) = &args.fleet_worker {
        return fleet::worker::run(spec);
    }
    let backend = match (args.redis, args.postgres) {
        (Some(url), _) => Some((
            distributed::Backend::Redis,
            crate::ops::url_or_env(url),
            args.no_bullmq,
        )),
        (None, Some(url)) => Some((
            distributed::Backend::Postgres,
            crate::ops::url_from(url, "--postgres", "WQ_POSTGRES_URL"),
            args.no_pgboss,
        )),
        (None, None) => None,
    };
    // The workloads first: a refused one installs no reference and opens no connection.
    let flag = backend.as_ref().map_or("", |(backend, ..)| backend.flag());
    let known = if backend.is_some() {
        SERVER_WORKLOADS
    } else {
        WORKLOADS
    };
    if args.plot.is_some() && backend.is_none() {
        eprintln!("wq bench: --plot needs --redis or --postgres (W7S runs on a server)");
        return ExitCode::FAILURE;
    }
    let mut ids = args.workloads.clone();
    if args.plot.is_some()
        && !ids
            .iter()
            .any(|id| id.trim().eq_ignore_ascii_case(fleet::SCALE_ID))
    {
        if ids.is_empty() {
            ids.extend(
                known
                    .iter()
                    .map(|w| w.id.to_owned())
                    .filter(|id| !ON_REQUEST.contains(&id.as_str())),
            );
        }
        ids.push(fleet::SCALE_ID.to_owned());
    }
    let selected = match select(known, &ids) {
        Ok(selected) => selected,
        Err(unknown) => {
            eprintln!(
                "wq bench: unknown workload {unknown:?}; known{}: {}",
                if flag.is_empty() {
                    String::new()
                } else {
                    format!(" with {flag}")
                },
                known.iter().map(|w| w.id).collect::<Vec<_>>().join(", ")
            );
            return ExitCode::FAILURE;
        }
    };
    let server = match backend {
        None => None,
        Some((backend, url, no_peer)) => {
            let Some(url) = url else {
                return ExitCode::FAILURE;
            };
            match distributed::Server::connect(backend, url, no_peer) {
                Ok(server) => Some(server),
                Err(e) => {
                    eprintln!("wq bench: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let runs = args.runs.unwrap_or(if args.quick { 1 } else { 3 });
    let machine = util::Machine::detect();
    let progress = Progress::new();
    progress.line(format!(
        "wq bench{}{}: {} workload(s), {runs} run(s) each; {machine}",
        if args.quick { " --quick" } else { "" },
        if flag.is_empty() {
            String::new()
        } else {
            format!(" {flag}")
        },
        selected.len(),
    ));
    let started = Instant::now();
    let mut samples = Vec::new();
    for workload in &selected {
        let begun = Instant::now();
        for run in 1..=runs {
            let ctx = Ctx {
                quick: args.quick,
                server: server.as_ref(),
                fleet: fleet::Choice {
                    processes: args.processes.clone(),
                    workers: args.workers.clone(),
                    handler_ms: args.handler_ms.clone(),
                },
                run,
                runs,
                id: workload.id,
                progress: &progress,
            };
            ctx.step("preparing");
            match (workload.run)(&ctx) {
                Ok(more) => samples.extend(more),
                Err(e) => {
                    progress.finish();
                    eprintln!("wq bench: {} run {run}: {e}", workload.id);
                    return ExitCode::FAILURE;
                }
            }
        }
        progress.line(format!(
            "{} {}: done in {:.1} s",
            workload.id,
            workload.title,
            begun.elapsed().as_secs_f64()
        ));
    }
    progress.finish();
    let notes = server.as_ref().map(|s| s.notes()).unwrap_or_default();
    let figures = report::aggregate(&samples);
    let mut notes = notes;
    if let Some(dir) = &args.plot {
        let caption = match &server {
            Some(server) => format!("{machine}; {}", server.description),
            None => machine.to_string(),
        };
        match fleet::write_plot(dir, &figures, &caption) {
            Ok(path) => notes.push(format!("plot written to {}", path.display())),
            Err(e) => {
                eprintln!("wq bench: cannot write the plot: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if args.json {
        report::print_json(&figures);
        for note in &notes {
            eprintln!("note: {note}");
        }
    } else {
        if let Some(server) = &server {
            println!("server: {}", server.description);
        }
        report::print_table(&figures, runs, args.quick, &machine, started.elapsed());
        for note in &notes {
            println!("note: {note}");
        }
    }
    ExitCode::SUCCESS
}

/// Runs the workloads on Redis with the given options: the deprecated `wq redis bench`.
pub(crate) fn run_distributed(
    url: String,
    quick: bool,
    workloads: Vec<String>,
    no_bullmq: bool,
    json: bool,
) -> ExitCode {
    run(BenchArgs {
        quick,
        redis: Some(url),
        no_bullmq,
        postgres: None,
        no_pgboss: false,
        workloads,
        runs: None,
        json,
        plot: None,
        processes: Vec::new(),
        workers: Vec::new(),
        handler_ms: Vec::new(),
        fleet_worker: None,
        w6_child: None,
        w6_items: 0,
    })
}

/// The workloads named by `-w`, in report order; all of them if none is named.
fn select(known: &'static [Workload], ids: &[String]) -> Result<Vec<&'static Workload>, String> {
    if ids.is_empty() {
        return Ok(known
            .iter()
            .filter(|w| !ON_REQUEST.contains(&w.id))
            .collect());
    }
    let mut wanted = Vec::new();
    for id in ids {
        let id = id.trim();
        if id.is_empty() {
            continue;
        }
        match known.iter().find(|w| w.id.eq_ignore_ascii_case(id)) {
            Some(w) => wanted.push(w.id),
            None => return Err(id.to_owned()),
        }
    }
    Ok(known.iter().filter(|w| wanted.contains(&w.id)).collect())
}
