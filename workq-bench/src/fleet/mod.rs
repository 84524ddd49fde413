//! W7 fleet: the shape users run. One producer adds 100,000 distinct items (10,000 with
//! `--quick`) in batches of 100; [`Workers`](workq::Workers) with `count` 16 (the
//! library's own loop, not a hand-written one) consume them, in 1 and in 4 worker processes,
//! with a handler that returns at once (0 ms) or sleeps 1 ms. On a server the producer is
//! this process and the workers are child processes (`wq-bench --fleet-worker`, see
//! [`worker`]), each with its own connections, as a fleet of pods would be; in memory the
//! queue lives in one process, so there is only the 1-process shape, with the producer and
//! the workers in it.
//!
//! Figures, per shape (`"processes"`, `"workers"` and `"handler_ms"` in the `--json` lines):
//! - `items_per_s`: a *flood*: the producer adds the next batch as soon as the last is
//!   acknowledged; items over the time from the first add to the end of the last handler.
//! - `pickup_p50_ms`, `pickup_p99_ms`, `pickup_max_ms`: time from the acknowledgement of an
//!   item's add (the batch's reply reaching the producer) to the start of its handler, in a
//!   second, *paced* phase. A flood piles the items up, so its pickup latency is only the
//!   backlog divided by the throughput; the paced phase offers half the throughput of the
//!   slowest of ours and the references at that shape (the same rate for all, in batches
//!   every 2 ms, for about 2 s), so what it measures is how soon an idle fleet starts new
//!   work. Every time comes from the machine's real-time clock, which all the processes
//!   share. A worker may start an item before the add's reply reaches the producer; that
//!   counts as 0.
//!
//! Beside ours, in the same run on the same server: BullMQ workers with `concurrency` 16 in
//! 1 and in 4 `node` processes (`workq-bench/node/bullmq/bench.mjs`), pg-boss with the
//! `work()` settings its script documents (`workq-bench/node/pg-boss/bench.mjs`), and with
//! `--compare` the Rust peers, each worker process running one worker (or client) with the
//! workload's workers as its concurrency (`workq-bench/peers/`).
//!
//! W7S is W7's scaling sweep: the same workload at 1, 4, 16 and 64 workers per process, in
//! one process, ours only, for a table and (with `--plot DIR`) a plot of items/s and pickup
//! p99 against workers. With a 1 ms handler the flood has at most 3,000 items per worker
//! (so one worker's run takes seconds, not minutes).
//!
//! W7B is River's own shape, a *burn-down*: the backlog (50,000 items, 5,000 with `--quick`;
//! at most 2,000 per worker, so that 1 worker's run takes seconds) is added up front with
//! each implementation's batch insert, in batches of 5,000 as River's bench command inserts
//! it, and only then are the workers started, in one process, with a handler that returns at
//! once; items/s from the start of the fleet to the end of the last handler (River's bench
//! times its burn-down the same way). Its workers are W7S's counts extended to River's: 1, 4,
//! 16, 64, 256, 1,000 and 2,000 (River's bench command runs 2,000), or 16 and 2,000 with
//! `--quick`; beside ours, the Rust peers of `--compare` (the node scripts have no burn-down
//! mode: n/a). With `--plot DIR`, items/s against workers, one line per implementation
//! (`DIR/w7b-BACKEND.svg`, [`plot`]).
//!
//! Caveats: the producer, the worker processes, the server and the reference share the
//! machine's cores, so what saturates first on 2 cores is often the CPU, not the queue. The
//! handler's 1 ms sleep lasts about the same on both sides: node's `setTimeout` 1.13 ms on
//! average, ours a thread's sleep (`spawn_blocking`), about 1.06 ms. (tokio's own
//! `sleep(1 ms)` waits for the timer's next millisecond tick after the deadline, about 2 ms,
//! which held our 16 workers to 7.6 k/s even in memory.) With 16 workers per process, no
//! queue can go past 16 / 1.1 ms, about 14 k/s per process, at that shape.

pub(crate) mod choice;
mod driver;
pub(crate) mod plot;
mod protocol;
pub(crate) mod worker;

use crate::ctx::Ctx;
use crate::peers::Program;
use crate::profile::Profiler;
use crate::report::{OURS_ASYNC, Sample, Shape};
pub(crate) use choice::Choice;
use driver::{Load, Measured, phase};
use protocol::Target;
use workq::WorkQueue;
use workq_postgres::PgQueue;
use workq_redis::RedisQueue;

// Beside the driver it runs, so that the protocol does not depend on the driver.
impl Target {
    /// One phase on this target.
    async fn phase(&self, shape: Shape, items: usize, load: Load) -> Result<Measured, String> {
        match self {
            Target::Memory => phase::<WorkQueue<u64>>(self, shape, items, load).await,
            Target::Redis(_) => phase::<RedisQueue<u64>>(self, shape, items, load).await,
            Target::Postgres(_) => phase::<PgQueue<u64>>(self, shape, items, load).await,
        }
    }
}

/// The workload's id.
const ID: &str = "W7";
/// The sweep's id.
pub(crate) const SCALE_ID: &str = "W7S";
/// Workers per process in W7.
const WORKERS: u32 = 16;
/// Workers per process in the sweep.
pub(crate) const SCALE_WORKERS: [u32; 4] = [1, 4, 16, 64];
/// The burn-down's id.
pub(crate) const BURN_ID: &str = "W7B";
/// Workers in one process in the burn-down: W7S's, up to River's 2,000.
pub(crate) const BURN_WORKERS: [u32; 7] = [1, 4, 16, 64, 256, 1_000, 2_000];
/// The same, with `--quick`.
const BURN_WORKERS_QUICK: [u32; 2] = [16, 2_000];
/// Items per worker at most in a burn-down's backlog.
const BURN_ITEMS_PER_WORKER: usize = 2_000;
/// The longest a paced phase runs, roughly.
const PACED_SECONDS: f64 = 2.0;
/// Items per worker at most in a sweep's flood with a handler that sleeps.
const SCALE_ITEMS_PER_WORKER: usize = 3_000;

/// The items of a flood.
fn items(quick: bool) -> usize {
    if quick { 10_000 } else { 100_000 }
}

/// W7's shapes: 1 and 4 processes (1 in memory, where a queue cannot be shared), 16
/// workers each, handler 0 and 1 ms, unless the options chose others.
fn shapes(choice: &Choice, in_memory: bool) -> Result<Vec<Shape>, String> {
    if in_memory && choice.processes.iter().any(|&p| p != 1) {
        return Err("in memory the queue lives in one process: --processes must be 1".into());
    }
    let processes: &[u32] = if in_memory { &[1] } else { &[1, 4] };
    Ok(choice.shapes(processes, &[WORKERS], &[0, 1]))
}

/// The rate of the paced phase: half the slowest flood's throughput (ours first).
fn paced_rate(floods: &[f64]) -> f64 {
    floods.iter().copied().fold(f64::INFINITY, f64::min) / 2.0
}

/// The items of a paced phase at `rate`: about [`PACED_SECONDS`] of them, within bounds.
fn paced_items(rate: f64, flood: usize) -> usize {
    ((rate * PACED_SECONDS) as usize).clamp(200, flood)
}

/// The samples of one implementation at one shape.
fn samples(imp: &'static str, shape: Shape, figures: &[(&'static str, f64)]) -> Vec<Sample> {
    figures
        .iter()
        .map(|&(metric, value)| Sample::new(ID, imp, metric, value).at(shape))
        .collect()
}

/// Our pickup figures from a paced phase.
fn pickup(measured: &Measured) -> [(&'static str, f64); 3] {
    [
        ("pickup_p50_ms", measured.pickup_ms(0.50)),
        ("pickup_p99_ms", measured.pickup_ms(0.99)),
        ("pickup_max_ms", measured.pickup_ms(1.0)),
    ]
}

/// W7 in memory: `Workers::spawn_async` in this process.
pub(crate) fn run_memory(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    let runtime = crate::util::runtime();
    let n = items(ctx.quick);
    let mut out = Vec::new();
    for shape in shapes(&ctx.fleet, true)? {
        ctx.step(&format!("{OURS_ASYNC} {shape}: flood of {n}"));
        let flood = runtime.block_on(Target::Memory.phase(shape, n, Load::Flood))?;
        let rate = paced_rate(&[flood.items_per_s]);
        let m = paced_items(rate, n);
        ctx.step(&format!("{OURS_ASYNC} {shape}: {m} paced at {rate:.0}/s"));
        let paced = runtime.block_on(Target::Memory.phase(shape, m, Load::Paced(rate)))?;
        out.extend(samples(
            OURS_ASYNC,
            shape,
            &[("items_per_s", flood.items_per_s)],
        ));
        out.extend(samples(OURS_ASYNC, shape, &pickup(&paced)));
    }
    Ok(out)
}

/// W7 on the server, beside every reference: at each shape the floods first, then the paced
/// phases, all at the same rate (half the slowest flood).
pub(crate) fn run_server(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    let server = ctx.server.ok_or("no server")?;
    let target = Target::of(server);
    let ours = server.backend.ours();
    let n = items(ctx.quick);
    let mut out = Vec::new();
    let mut profiler = ctx.profile.then(|| Profiler::connect(server)).transpose()?;
    let mut with_profile = |run: &mut dyn FnMut()| {
        if let Some(p) = &mut profiler {
            p.around(n, run).1
        } else {
            run();
            Vec::new()
        }
    };
    for shape in shapes(&ctx.fleet, false)? {
        ctx.step(&format!("{ours} {shape}: flood of {n}"));
        let mut flood = Err(String::new());
        let profile = with_profile(&mut || {
            flood = server.runtime.block_on(target.phase(shape, n, Load::Flood));
        });
        let flood = flood?;
        out.extend(samples(ours, shape, &[("items_per_s", flood.items_per_s)]));
        out.extend(samples(ours, shape, &profile));
        let mut floods = vec![flood.items_per_s];
        let mut flooded = Vec::new();
        for peer in &server.peers {
            ctx.step(&format!("{} {shape}: flood of {n}", peer.name));
            let args = peer_args("flood", n, shape, 0.0);
            let mut got = Vec::new();
            let profile =
                with_profile(&mut || got = server.run_peer(peer, ID, &args, &["items_per_s"]));
            if let Some(rate) = got
                .iter()
                .find(|s| s.metric == "items_per_s" && s.na.is_none())
                .map(|s| s.value)
            {
                floods.push(rate);
                flooded.push(peer);
            }
            let ran = got.iter().any(|s| s.na.is_none());
            out.extend(got.into_iter().map(|s| s.at(shape)));
            if ran {
                out.extend(samples(peer.name, shape, &profile));
            }
        }
        let rate = paced_rate(&floods);
        let m = paced_items(rate, n);
        ctx.step(&format!("{ours} {shape}: {m} paced at {rate:.0}/s"));
        let paced = server
            .runtime
            .block_on(target.phase(shape, m, Load::Paced(rate)))?;
        out.extend(samples(ours, shape, &pickup(&paced)));
        for peer in flooded {
            ctx.step(&format!("{} {shape}: {m} paced at {rate:.0}/s", peer.name));
            let args = peer_args("paced", m, shape, rate);
            let metrics = pickup(&paced).map(|(metric, _)| metric);
            out.extend(
                server
                    .run_peer(peer, ID, &args, &metrics)
                    .into_iter()
                    .map(|s| s.at(shape)),
            );
        }
    }
    Ok(out)
}

/// The arguments of a reference's W7 phase: `W7 MODE ITEMS PROCESSES WORKERS HANDLER_MS RATE`.
fn peer_args(mode: &str, items: usize, shape: Shape, rate: f64) -> Vec<String> {
    vec![
        ID.to_owned(),
        mode.to_owned(),
        items.to_string(),
        shape.processes.to_string(),
        shape.workers.to_string(),
        shape.handler_ms.to_string(),
        format!("{rate:.1}"),
    ]
}

/// W7S: W7 on the server at 1, 4, 16 and 64 workers in one process, ours only.
pub(crate) fn run_scale(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    let server = ctx.server.ok_or("no server")?;
    let target = Target::of(server);
    let ours = server.backend.ours();
    let n = items(ctx.quick);
    let mut out = Vec::new();
    for shape in ctx.fleet.shapes(&[1], &SCALE_WORKERS, &[0, 1]) {
        let flood_items = if shape.handler_ms == 0 {
            n
        } else {
            n.min(SCALE_ITEMS_PER_WORKER * (shape.workers * shape.processes) as usize)
        };
        ctx.step(&format!("{ours} {shape}: flood of {flood_items}"));
        let flood = server
            .runtime
            .block_on(target.phase(shape, flood_items, Load::Flood))?;
        let rate = paced_rate(&[flood.items_per_s]);
        let m = paced_items(rate, n);
        ctx.step(&format!("{ours} {shape}: {m} paced at {rate:.0}/s"));
        let paced = server
            .runtime
            .block_on(target.phase(shape, m, Load::Paced(rate)))?;
        let figures = [
            ("items_per_s", flood.items_per_s),
            ("pickup_p50_ms", paced.pickup_ms(0.50)),
            ("pickup_p99_ms", paced.pickup_ms(0.99)),
            ("pickup_max_ms", paced.pickup_ms(1.0)),
        ];
        out.extend(
            figures
                .iter()
                .map(|&(metric, value)| Sample::new(SCALE_ID, ours, metric, value).at(shape)),
        );
    }
    Ok(out)
}

/// The backlog of a burn-down at `shape`: the workload's, at most
/// [`BURN_ITEMS_PER_WORKER`] per worker.
fn backlog(quick: bool, shape: Shape) -> usize {
    let full = if quick { 5_000 } else { 50_000 };
    full.min(BURN_ITEMS_PER_WORKER * (shape.workers * shape.processes) as usize)
}

/// W7B: the burn-down on the server, ours and every Rust peer, at each shape in turn.
pub(crate) fn run_burn(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    let server = ctx.server.ok_or("no server")?;
    let target = Target::of(server);
    let ours = server.backend.ours();
    let workers: &[u32] = if ctx.quick {
        &BURN_WORKERS_QUICK
    } else {
        &BURN_WORKERS
    };
    let mut out = Vec::new();
    for shape in ctx.fleet.shapes(&[1], workers, &[0]) {
        let n = backlog(ctx.quick, shape);
        ctx.step(&format!("{ours} {shape}: burn-down of {n}"));
        let burned = server
            .runtime
            .block_on(target.phase(shape, n, Load::Backlog))?;
        out.push(Sample::new(BURN_ID, ours, "items_per_s", burned.items_per_s).at(shape));
        for peer in &server.peers {
            if let Program::Node(_) = peer.program {
                out.push(
                    Sample::not_applicable(
                        BURN_ID,
                        peer.name,
                        "items_per_s",
                        "its bench script has no burn-down mode",
                    )
                    .at(shape),
                );
                continue;
            }
            ctx.step(&format!("{} {shape}: burn-down of {n}", peer.name));
            let args = peer_args("burndown", n, shape, 0.0);
            out.extend(
                server
                    .run_peer(peer, BURN_ID, &args, &["items_per_s"])
                    .into_iter()
                    .map(|s| s.at(shape)),
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burn_down_holds_at_most_two_thousand_items_per_worker() {
        let at = |workers| Shape {
            processes: 1,
            workers,
            handler_ms: 0,
        };
        assert_eq!(backlog(false, at(1)), 2_000);
        assert_eq!(backlog(false, at(16)), 32_000);
        assert_eq!(backlog(false, at(2_000)), 50_000);
        assert_eq!(backlog(true, at(16)), 5_000);
        assert_eq!(*BURN_WORKERS.last().unwrap(), 2_000);
    }

    #[test]
    fn the_paced_phase_offers_half_the_slowest_flood() {
        assert_eq!(paced_rate(&[30_000.0, 10_000.0]), 5_000.0);
        assert_eq!(paced_rate(&[8_000.0, 10_000.0, 9_000.0]), 4_000.0);
        assert_eq!(paced_rate(&[8_000.0]), 4_000.0);
        assert_eq!(paced_items(5_000.0, 100_000), 10_000);
        assert_eq!(paced_items(10.0, 100_000), 200);
        assert_eq!(paced_items(1e9, 100_000), 100_000);
    }

    #[test]
    fn every_shape_has_sixteen_workers_and_memory_has_one_process() {
        let default = Choice::default();
        assert_eq!(shapes(&default, false).unwrap().len(), 4);
        assert!(
            shapes(&default, true)
                .unwrap()
                .iter()
                .all(|s| s.processes == 1)
        );
        assert!(
            shapes(&default, false)
                .unwrap()
                .iter()
                .all(|s| s.workers == WORKERS)
        );
        let chosen = Choice {
            processes: vec![4],
            workers: vec![8, 32],
            handler_ms: vec![],
        };
        let picked = shapes(&chosen, false).unwrap();
        assert_eq!(picked.len(), 4);
        assert!(picked.iter().all(|s| s.processes == 4));
        assert!(shapes(&chosen, true).is_err());
    }
}
