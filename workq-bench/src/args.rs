//! `wq-bench`'s options.

use std::path::PathBuf;

use clap::Parser;

/// The standard workloads beside their references, in one run.
#[derive(Debug, Parser)]
#[command(name = "wq-bench", version, about)]
pub(crate) struct Args {
    /// Runs smaller versions of the workloads, one run each (in memory, well under 20 s on 2
    /// cores; W7 on a server, 10,000 items per phase, about a minute beside its reference; W8,
    /// a burst of 20,000 and 1 s of quiet items per queue).
    #[arg(long)]
    pub(crate) quick: bool,

    /// Runs W1, W3, W3P, W4, W7 and W8 against the Redis-backed queue at URL (a local server; the
    /// bench uses queues of its own and deletes them) beside BullMQ on the same server, which
    /// it installs with npm (the versions pinned in workq-bench/node/bullmq) into a private
    /// directory of this user's unless --no-bullmq is given; with --compare beside the Rust
    /// peers too. `--redis` alone takes the URL from $WQ_REDIS_URL (keep a password off the
    /// command line).
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    pub(crate) redis: Option<String>,

    /// With --redis: skips BullMQ (node).
    #[arg(long, requires = "redis")]
    pub(crate) no_bullmq: bool,

    /// Runs W1, W3, W3P, W4, W7 and W8 against the PostgreSQL-backed queue at URL (the bench uses
    /// queues of its own and deletes them) beside pg-boss on the same database, which it
    /// installs with npm (the versions pinned in workq-bench/node/pg-boss) into a private
    /// directory of this user's unless --no-pgboss is given; with --compare beside the Rust
    /// peers too. `--postgres` alone takes the URL from $WQ_POSTGRES_URL (keep a password off
    /// the command line). With --redis too, both servers are measured in one run, one table
    /// each.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    pub(crate) postgres: Option<String>,

    /// With --postgres: skips pg-boss (node).
    #[arg(long, requires = "postgres")]
    pub(crate) no_pgboss: bool,

    /// With --redis and/or --postgres: measures the Rust crates a user might pick instead
    /// (bullmq-official and apalis-redis on Redis, riverqueue and apalis-postgres on
    /// PostgreSQL) beside ours and the node references, and prints one table per backend with
    /// a column per implementation. The peers are built on first use from
    /// workq-bench/peers (a workspace of their own, versions pinned by its lockfile) with
    /// `cargo build --release --locked`, or taken from $WQ_BENCH_PEERS.
    #[arg(long)]
    pub(crate) compare: bool,

    /// With --compare: only these peers, comma separated (bullmq, bullmq-official,
    /// apalis-redis, pg-boss, riverqueue, apalis-postgres); all by default.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "NAMES",
        requires = "compare"
    )]
    pub(crate) peers: Vec<String>,

    /// With --redis and/or --postgres: also reads the server's own counters before and after
    /// each implementation's W7 flood and reports what the server did per item (commands,
    /// scripts, CPU and network bytes on Redis; statements, transactions, WAL bytes, rows and
    /// CPU on PostgreSQL), figures that do not depend on the machine's load.
    #[arg(long)]
    pub(crate) profile: bool,

    /// Workloads to run, comma separated (in memory: W1, P1, W2, W3, W3R, W4, W5, W6, W7, W8, P2,
    /// P3, P4; with --redis or --postgres: W1, W3, W3P, W4, W7, W8, W7S, W7B); all by default
    /// (but W7S, which --plot adds unless --compare is given or W7B is named, and W7B, which
    /// --compare adds).
    #[arg(
        short = 'w',
        long = "workloads",
        value_delimiter = ',',
        value_name = "IDS"
    )]
    pub(crate) workloads: Vec<String>,

    /// Runs every workload this many times and reports the median of each figure
    /// (default: 3, or 1 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) runs: Option<u32>,

    /// Prints one JSON object per line and figure instead of the tables.
    #[arg(long)]
    pub(crate) json: bool,

    /// With --redis or --postgres: writes plots into DIR. With --compare, items/s per shape
    /// with one bar per implementation (DIR/compare-BACKEND.svg); otherwise, unless W7B is
    /// named, runs W7S (W7 at 1, 4, 16 and 64 workers per process) too and plots items/s and
    /// pickup p99 against workers (DIR/w7-scaling.svg). A run with W7B also plots its
    /// burn-down: items/s against workers, one line per implementation, a worker count one
    /// could not run named in a note (DIR/w7b-BACKEND.svg, e.g. `-w W7B --plot DIR`).
    #[arg(long, value_name = "DIR")]
    pub(crate) plot: Option<PathBuf>,

    /// W7, W7S and W7B: the numbers of worker processes to run, comma separated (default: 1,4 for
    /// W7 on a server, 1 in memory and for W7S).
    #[arg(long, value_delimiter = ',', value_name = "N,...", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) processes: Vec<u32>,

    /// W7, W7S and W7B: the numbers of workers per process (`Workers::count`, a reference's
    /// concurrency), comma separated, at most 2,000 (River's bench command's; default: 16
    /// for W7, 1,4,16,64 for W7S, 1,4,16,64,256,1000,2000 for W7B, 16,2000 with --quick).
    #[arg(long, value_delimiter = ',', value_name = "N,...", value_parser = clap::value_parser!(u32).range(1..=2000))]
    pub(crate) workers: Vec<u32>,

    /// W7, W7S and W7B: how long the handler sleeps, in ms, comma separated (default: 0,1;
    /// 0 for W7B, as River's bench command).
    #[arg(long, value_delimiter = ',', value_name = "MS,...", value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub(crate) handler_ms: Vec<u32>,

    /// W8: the noisy group's burst, in items (default 100,000, or 20,000 with --quick); the
    /// quiet groups add theirs for 3 s (1 s with --quick) whatever the burst.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(crate) w8_burst: Option<u64>,

    /// Internal: runs the workers of one W7 process (BACKEND:QUEUE:WORKERS:HANDLER_MS:ITEMS).
    #[arg(long, hide = true, value_name = "SPEC")]
    pub(crate) fleet_worker: Option<String>,

    /// Internal: measures one W6 case in this (fresh) process and prints it as JSON.
    #[arg(long, hide = true, value_name = "CASE")]
    pub(crate) w6_child: Option<String>,

    /// Internal: the number of items of the W6 case.
    #[arg(long, hide = true, value_name = "N", default_value_t = 0)]
    pub(crate) w6_items: usize,
}
