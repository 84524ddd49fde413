//! A run of `wq-bench`, in four steps: what to run ([`Plan`]), where (the servers and the
//! references beside ours, [`connect`]), running it ([`measure`]), and the report
//! ([`report`]).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::args::Args;
use crate::ctx::Ctx;
use crate::peers::node::{BULLMQ_PEER, PGBOSS_PEER};
use crate::peers::rust::RustPeers;
use crate::progress::Progress;
use crate::report::json::About;
use crate::report::{
    APALIS_POSTGRES, APALIS_REDIS, BULLMQ, BULLMQ_OFFICIAL, Figure, PGBOSS, RIVERQUEUE, Sample,
    aggregate, compare, json, table,
};
use crate::server::{Backend, Server};
use crate::util::Machine;
use crate::workloads::{IN_MEMORY, ON_A_SERVER, Workload, select};
use crate::{fleet, memory};

/// Every reference `--peers` may name.
const PEER_NAMES: &[&str] = &[
    BULLMQ,
    BULLMQ_OFFICIAL,
    APALIS_REDIS,
    PGBOSS,
    RIVERQUEUE,
    APALIS_POSTGRES,
];

/// Runs the benchmarks as `args` say.
pub(crate) fn run(args: &Args) -> ExitCode {
    let plan = match Plan::new(args) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("wq-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let servers = match connect(args, &plan) {
        Ok(servers) => servers,
        Err(e) => {
            eprintln!("wq-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let machine = Machine::detect();
    let progress = Progress::new();
    progress.line(format!(
        "wq-bench{}{}: {} workload(s), {} run(s) each; {machine}",
        if args.quick { " --quick" } else { "" },
        plan.backends
            .iter()
            .map(|(b, _)| format!(" {}", b.flag()))
            .collect::<String>(),
        plan.workloads.len(),
        plan.runs,
    ));
    let started = Instant::now();
    let targets: Vec<Option<&Server>> = if servers.is_empty() {
        vec![None]
    } else {
        servers.iter().map(Some).collect()
    };
    let mut sections = Vec::new();
    for server in targets {
        match measure(args, &plan, server, &progress) {
            Ok(samples) => sections.push(Section {
                server,
                figures: aggregate(&samples),
            }),
            Err(e) => {
                progress.finish();
                eprintln!("wq-bench: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    progress.finish();
    report(args, &plan, &sections, &machine, started.elapsed())
}

/// What a run is to do.
struct Plan {
    /// The servers, with their URLs; none for a run in memory.
    backends: Vec<(Backend, String)>,
    /// The workloads, in report order.
    workloads: Vec<&'static Workload>,
    /// Runs of each workload.
    runs: u32,
}

impl Plan {
    /// The plan `args` ask for, or why it cannot be: an unknown workload or peer, `--plot` or
    /// `--compare` without a server, a server option without a URL. Nothing is installed and
    /// no connection is opened before the plan stands.
    fn new(args: &Args) -> Result<Self, String> {
        let mut backends = Vec::new();
        for (given, backend) in [
            (&args.redis, Backend::Redis),
            (&args.postgres, Backend::Postgres),
        ] {
            if let Some(url) = given {
                backends.push((backend, url_from(url, backend)?));
            }
        }
        if backends.is_empty() {
            if args.plot.is_some() {
                return Err(
                    "--plot needs --redis or --postgres (it plots figures of a server)".into(),
                );
            }
            if args.profile {
                return Err("--profile needs --redis or --postgres (it reads a server)".into());
            }
            if args.compare {
                return Err(
                    "--compare needs --redis or --postgres (the peers live on a server)".into(),
                );
            }
        }
        if let Some(unknown) = args.peers.iter().find(|p| !PEER_NAMES.contains(&p.trim())) {
            return Err(format!(
                "unknown peer {unknown:?}; known: {}",
                PEER_NAMES.join(", ")
            ));
        }
        let known = if backends.is_empty() {
            IN_MEMORY
        } else {
            ON_A_SERVER
        };
        let mut ids = args.workloads.clone();
        // The plot of a run without --compare is W7S's, or W7B's when it is named.
        if args.plot.is_some()
            && !args.compare
            && !ids.iter().any(|id| {
                let id = id.trim();
                id.eq_ignore_ascii_case(fleet::SCALE_ID) || id.eq_ignore_ascii_case(fleet::BURN_ID)
            })
        {
            if ids.is_empty() {
                ids.extend(select(known, &[])?.iter().map(|w| w.id.to_owned()));
            }
            ids.push(fleet::SCALE_ID.to_owned());
        }
        if args.compare && ids.is_empty() && !backends.is_empty() {
            // The peers' own shape, the burn-down, belongs to every comparison.
            ids.extend(select(known, &[])?.iter().map(|w| w.id.to_owned()));
            ids.push(fleet::BURN_ID.to_owned());
        }
        let workloads = select(known, &ids).map_err(|unknown| {
            let with = match backends.as_slice() {
                [] => String::new(),
                _ => " with a server".to_owned(),
            };
            format!(
                "unknown workload {unknown:?}; known{with}: {}",
                known.iter().map(|w| w.id).collect::<Vec<_>>().join(", ")
            )
        })?;
        Ok(Self {
            backends,
            workloads,
            runs: args.runs.unwrap_or(if args.quick { 1 } else { 3 }),
        })
    }
}

/// The URL given to a server's option, or when none was given, the one in its variable.
fn url_from(given: &str, backend: Backend) -> Result<String, String> {
    if !given.is_empty() {
        return Ok(given.to_owned());
    }
    match std::env::var(backend.url_var()) {
        Ok(url) if !url.is_empty() => Ok(url),
        _ => Err(format!(
            "{} without a URL needs {}",
            backend.flag(),
            backend.url_var()
        )),
    }
}

/// Whether `--peers` lets `name` run.
fn wanted(args: &Args, name: &str) -> bool {
    args.peers.is_empty() || args.peers.iter().any(|p| p.trim() == name)
}

/// Connects to every server of the plan, then readies the references that run beside ours on
/// it: the node one (unless skipped), and with `--compare` the Rust ones (built once for all).
/// A server that cannot be reached is an error before anything is installed or built.
fn connect(args: &Args, plan: &Plan) -> Result<Vec<Server>, String> {
    let mut servers = Vec::new();
    for (backend, url) in &plan.backends {
        servers.push(Server::connect(*backend, url.clone())?);
    }
    let rust = (args.compare && !servers.is_empty()).then(RustPeers::ready);
    for server in &mut servers {
        let (node, skipped) = match server.backend {
            Backend::Redis => (&BULLMQ_PEER, args.no_bullmq),
            Backend::Postgres => (&PGBOSS_PEER, args.no_pgboss),
        };
        if skipped {
            server.note(format!(
                "{} not measured: skipped (--no-{})",
                node.name(),
                node.name().replace('-', "")
            ));
        } else if wanted(args, node.name()) {
            match node.peer() {
                Ok(peer) => server.peers.push(peer),
                Err(e) => server.note(format!("{} not measured: {e}", node.name())),
            }
        }
        match &rust {
            Some(Ok(rust)) => {
                let peers = rust.on(server.backend).into_iter();
                server.peers.extend(peers.filter(|p| wanted(args, p.name)));
            }
            Some(Err(e)) => server.note(format!("the Rust peers not measured: {e}")),
            None => {}
        }
    }
    Ok(servers)
}

/// The figures of one target (in memory, or one server).
struct Section<'a> {
    server: Option<&'a Server>,
    figures: Vec<Figure>,
}

/// Runs every workload of the plan `runs` times on `server` (in memory when `None`).
fn measure(
    args: &Args,
    plan: &Plan,
    server: Option<&Server>,
    progress: &Progress,
) -> Result<Vec<Sample>, String> {
    let mut samples = Vec::new();
    for workload in &plan.workloads {
        let begun = Instant::now();
        for run in 1..=plan.runs {
            let ctx = Ctx {
                quick: args.quick,
                server,
                fleet: fleet::Choice {
                    processes: args.processes.clone(),
                    workers: args.workers.clone(),
                    handler_ms: args.handler_ms.clone(),
                },
                w8_burst: args.w8_burst.and_then(|n| usize::try_from(n).ok()),
                profile: args.profile,
                run,
                runs: plan.runs,
                id: workload.id,
                progress,
            };
            ctx.step("preparing");
            let more = (workload.run)(&ctx).map_err(|e| {
                let on = server
                    .map(|s| format!(" on {}", s.backend.name()))
                    .unwrap_or_default();
                format!("{}{on} run {run}: {e}", workload.id)
            })?;
            samples.extend(more);
        }
        progress.line(format!(
            "{}{} {}: done in {:.1} s",
            workload.id,
            server
                .map(|s| format!(" on {}", s.backend.name()))
                .unwrap_or_default(),
            workload.title,
            begun.elapsed().as_secs_f64()
        ));
    }
    Ok(samples)
}

/// What the report says of every reference measured.
fn about(sections: &[Section<'_>]) -> Vec<About> {
    sections
        .iter()
        .filter_map(|s| s.server)
        .flat_map(|s| &s.peers)
        .map(|p| About {
            imp: p.name,
            version: p.version.clone(),
            settings: p.settings.clone(),
        })
        .collect()
}

/// Writes the plots, then prints the figures (tables, or JSON lines) and the notes.
fn report(
    args: &Args,
    plan: &Plan,
    sections: &[Section<'_>],
    machine: &Machine,
    elapsed: Duration,
) -> ExitCode {
    let about = about(sections);
    let mut notes: Vec<String> = sections
        .iter()
        .filter_map(|s| s.server)
        .flat_map(|s| s.notes())
        .collect();
    if let Some(dir) = &args.plot {
        for section in sections {
            let Some(server) = section.server else {
                continue;
            };
            let several = sections.len() > 1;
            match plots(dir, section, server, machine, args.compare, several) {
                Ok(paths) => notes.extend(
                    paths
                        .iter()
                        .map(|path| format!("plot written to {}", path.display())),
                ),
                Err(e) => {
                    eprintln!("wq-bench: cannot write the plot: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    if args.json {
        for section in sections {
            json::print(&section.figures, &about);
        }
        for note in &notes {
            eprintln!("note: {note}");
        }
        return ExitCode::SUCCESS;
    }
    for section in sections {
        match section.server {
            Some(server) if args.compare => {
                let title = format!(
                    "{} beside its peers: {}; {machine}; {} of {} run(s); {:.1} s in all",
                    server.backend.name(),
                    server.description,
                    if plan.runs > 1 { "medians" } else { "figures" },
                    plan.runs,
                    elapsed.as_secs_f64()
                );
                compare::print(&title, &section.figures, &about);
            }
            Some(server) => {
                println!("server: {}", server.description);
                table::print(&section.figures, plan.runs, args.quick, machine, elapsed);
            }
            None => {
                table::print(&section.figures, plan.runs, args.quick, machine, elapsed);
                if section
                    .figures
                    .iter()
                    .any(|f| memory::controller_runtime::IDS.contains(&f.workload))
                {
                    println!("{}", memory::controller_runtime::PUBLISHED);
                }
            }
        }
        println!();
    }
    for note in &notes {
        println!("note: {note}");
    }
    ExitCode::SUCCESS
}

/// Writes the plots of one server's figures into `dir`: with `--compare` the bars of every
/// shape, otherwise W7S's sweep (unless the run had W7B and no W7S); and W7B's burn-down
/// whenever the run had it. `several`: more than one server in the run (then the sweep's
/// file names its backend).
fn plots(
    dir: &std::path::Path,
    section: &Section<'_>,
    server: &Server,
    machine: &Machine,
    compare: bool,
    several: bool,
) -> Result<Vec<std::path::PathBuf>, String> {
    let caption = format!("{machine}; {}", server.description);
    let has = |id: &str| section.figures.iter().any(|f| f.workload == id);
    let mut paths = Vec::new();
    if compare {
        paths.push(fleet::plot::write_compare(
            dir,
            server.backend,
            &section.figures,
            &caption,
        )?);
    } else if has(fleet::SCALE_ID) || !has(fleet::BURN_ID) {
        let file = if several {
            format!("w7-scaling-{}.svg", server.backend.name().to_lowercase())
        } else {
            fleet::plot::FILE.to_owned()
        };
        paths.push(fleet::plot::write_plot(
            dir,
            &file,
            &section.figures,
            &caption,
        )?);
    }
    let burn = fleet::plot::write_burn(
        dir,
        server.backend,
        &section.figures,
        (machine.cores, &machine.date),
        &caption,
    )?;
    paths.extend(burn);
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn plan(args: &[&str]) -> Result<Plan, String> {
        let args =
            Args::try_parse_from([&["wq-bench"][..], args].concat()).map_err(|e| e.to_string())?;
        Plan::new(&args)
    }

    #[test]
    fn a_plan_refuses_what_cannot_run_before_connecting() {
        let err = |args: &[&str]| plan(args).err().unwrap_or_default();
        assert!(err(&["--plot", "/tmp"]).contains("--plot needs"));
        assert!(err(&["--compare"]).contains("--compare needs"));
        assert!(err(&["--profile"]).contains("--profile needs"));
        assert!(
            err(&[
                "--redis",
                "redis://127.0.0.1:1/",
                "--compare",
                "--peers",
                "sidekiq"
            ])
            .contains("unknown peer")
        );
        assert!(err(&["--redis", "redis://127.0.0.1:1/", "-w", "W2"]).contains("with a server"));
        assert!(err(&["-w", "W3P"]).contains("unknown workload"));
        // --peers only with --compare.
        assert!(
            err(&["--redis", "redis://127.0.0.1:1/", "--peers", "bullmq"]).contains("--compare")
        );
    }

    #[test]
    fn both_servers_in_one_plan_and_the_plot_adds_w7s_unless_comparing_or_burning_down() {
        let both = plan(&[
            "--redis",
            "redis://a/",
            "--postgres",
            "postgres://b/",
            "-w",
            "W1",
        ])
        .unwrap();
        assert_eq!(both.backends.len(), 2);
        assert_eq!(both.runs, 3);
        let ids = |p: &Plan| p.workloads.iter().map(|w| w.id).collect::<Vec<_>>();
        let plotted = plan(&[
            "--redis",
            "redis://a/",
            "--quick",
            "--plot",
            "/tmp",
            "-w",
            "W1",
        ])
        .unwrap();
        assert_eq!(ids(&plotted), ["W1", "W7S"]);
        assert_eq!(plotted.runs, 1);
        let compared = plan(&[
            "--redis",
            "redis://a/",
            "--compare",
            "--plot",
            "/tmp",
            "-w",
            "W1",
        ])
        .unwrap();
        assert_eq!(ids(&compared), ["W1"]);
        // W7B named: its own plot, no W7S beside it.
        let burned = plan(&["--redis", "redis://a/", "--plot", "/tmp", "-w", "W7B"]).unwrap();
        assert_eq!(ids(&burned), ["W7B"]);
        // A comparison with no workload named runs them all and the burn-down, W7B.
        let everything = plan(&["--postgres", "postgres://b/", "--compare"]).unwrap();
        assert_eq!(ids(&everything).last(), Some(&"W7B"));
        assert!(!ids(&everything).contains(&"W7S"));
    }
}
