//! W8 noisy neighbour: one group adds 100,000 items at once (20,000 with `--quick`); 100
//! quiet groups each add one item every 100 ms (1,000 items/s in all) for 3 s (1 s with
//! `--quick`); [`Workers`](workq::Workers) with `count` 16 handle them, the handler sleeping
//! 1 ms (a thread's sleep, as in W7). Items are `"group/..."` keys; a grouped queue groups
//! them by the part before the `/`.
//!
//! In memory (`run_memory`), on Redis and on PostgreSQL (`run_server`, with `--redis` /
//! `--postgres`), the same driver runs three queues in turn, in this process, each new:
//! - `...-fifo` (`workq-fifo`, `workq-redis-fifo`, `workq-postgres-fifo`): no groups, one
//!   first-in-first-out order within a priority (what every queue without flow control
//!   does): the quiet items wait behind the backlog. The reference;
//! - ours (`workq`, `workq-redis`, `workq-postgres`): `group_by`, groups take turns;
//! - `...-limited`: `group_by` with `max_in_flight_per_group(8)` and `max_in_flight(12)`
//!   (below the 16 workers, so that both limits bind), the limits checked.
//!
//! On a server, beside them: BullMQ (node, the open edition: no groups, so its figure is
//! plain FIFO) with one `Worker` of `concurrency` 16 in one process, adding and handling the
//! same items the same way (`workq-bench/node/bullmq/bench.mjs`).
//!
//! The noisy burst goes in in batches of 100 (one round trip, one commit each on a server),
//! each as soon as the last is acknowledged; then the quiet producer adds, every millisecond,
//! the quiet items due by then (one batch), so that a slow add delays the next items but
//! never thins them out.
//!
//! Figures: `quiet_pickup_p50_ms`, `quiet_pickup_p99_ms`, `quiet_pickup_max_ms` (from the
//! acknowledgement of a quiet item's add to its hand-out: the return of the call that leased
//! it to a worker; 0 if it came first), `items_per_s` (every item, from the burst's first add
//! to the last `done`), `noisy_items_per_s` (the noisy group's, to its last `done`),
//! `max_group_in_flight` and `max_leases_held` (the most leases one group, and all groups,
//! held at once).
//!
//! **The limits are checked, not assumed.** The workers take their items through a wrapper
//! of the queue ([`counted`]) that keeps the bench's own count of the leases each group
//! holds, updated at every hand-out and every end of a lease ([`book`]); a hand-out that
//! takes a group over `max_in_flight_per_group`, or the queue over `max_in_flight`, fails the
//! run with an error naming the group, the count and the limit. The count runs from the
//! return of the call that handed a lease out to the call that ends it, a window inside the
//! queue's own, so an excess it sees is real.
//!
//! Caveats: the producer, the 16 workers, their handlers' sleeping threads (and on a server,
//! the server) share the machine's cores. One process holds the workers: the limits are the
//! server's (kept there for every process), so a fleet of processes would be held to them
//! the same way, but what is measured here is one process's view. A run interrupted on a
//! server leaves its queue there (named `wq-bench-w8-PID-N`).

mod book;
mod counted;
mod driver;
mod shape;

use workq::WorkQueue;
use workq_postgres::PgQueue;
use workq_redis::RedisQueue;

use crate::ctx::Ctx;
use crate::report::{
    OURS, OURS_FIFO, OURS_LIMITED, OURS_POSTGRES, OURS_POSTGRES_FIFO, OURS_POSTGRES_LIMITED,
    OURS_REDIS, OURS_REDIS_FIFO, OURS_REDIS_LIMITED, Sample,
};
use crate::server::Backend;
use book::Measured;
use driver::phase;
pub(crate) use shape::LIMITS;
use shape::{HANDLER, Setup, Sizes, WORKERS};

/// The workload's id.
pub(crate) const ID: &str = "W8";

/// The `impl` of the figures of `setup` on `backend` (in memory: `None`).
fn imp(setup: Setup, backend: Option<Backend>) -> &'static str {
    match (backend, setup) {
        (None, Setup::Grouped) => OURS,
        (None, Setup::Fifo) => OURS_FIFO,
        (None, Setup::Limited(_)) => OURS_LIMITED,
        (Some(Backend::Redis), Setup::Grouped) => OURS_REDIS,
        (Some(Backend::Redis), Setup::Fifo) => OURS_REDIS_FIFO,
        (Some(Backend::Redis), Setup::Limited(_)) => OURS_REDIS_LIMITED,
        (Some(Backend::Postgres), Setup::Grouped) => OURS_POSTGRES,
        (Some(Backend::Postgres), Setup::Fifo) => OURS_POSTGRES_FIFO,
        (Some(Backend::Postgres), Setup::Limited(_)) => OURS_POSTGRES_LIMITED,
    }
}

/// The sizes of the run `ctx` is part of.
fn sizes(ctx: &Ctx<'_>) -> Sizes {
    Sizes::of(ctx.quick, ctx.w8_burst)
}

/// The samples of one phase.
fn samples(imp: &'static str, m: &Measured) -> Vec<Sample> {
    [
        ("quiet_pickup_p50_ms", m.quiet_pickup_ms(0.50)),
        ("quiet_pickup_p99_ms", m.quiet_pickup_ms(0.99)),
        ("quiet_pickup_max_ms", m.quiet_pickup_ms(1.0)),
        ("items_per_s", m.items_per_s),
        ("noisy_items_per_s", m.noisy_items_per_s),
        ("max_group_in_flight", m.most_of_one_group as f64),
        ("max_leases_held", m.most_in_all as f64),
    ]
    .into_iter()
    .map(|(metric, value)| Sample::new(ID, imp, metric, value))
    .collect()
}

/// The figures a reference reports (it has no leases the bench could count).
const PEER_METRICS: [&str; 5] = [
    "quiet_pickup_p50_ms",
    "quiet_pickup_p99_ms",
    "quiet_pickup_max_ms",
    "items_per_s",
    "noisy_items_per_s",
];

/// The arguments of a reference's W8: `W8 NOISY QUIET WORKERS HANDLER_MS`.
fn peer_args(sizes: Sizes) -> Vec<String> {
    vec![
        ID.to_owned(),
        sizes.noisy.to_string(),
        sizes.quiet.to_string(),
        WORKERS.to_string(),
        HANDLER.as_millis().to_string(),
    ]
}

/// W8 in memory: the three queues in turn.
pub(crate) fn run_memory(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    let sizes = sizes(ctx);
    let runtime = crate::util::runtime();
    let mut out = Vec::new();
    for setup in Setup::ALL {
        let imp = imp(setup, None);
        ctx.step(imp);
        let measured = runtime
            .block_on(phase::<WorkQueue<String>>("", setup, sizes))
            .map_err(|e| format!("{imp}: {e}"))?;
        out.extend(samples(imp, &measured));
    }
    Ok(out)
}

/// W8 on the server: the three queues in turn, then every reference.
pub(crate) fn run_server(ctx: &Ctx<'_>) -> Result<Vec<Sample>, String> {
    let server = ctx.server.ok_or("no server")?;
    let sizes = sizes(ctx);
    let mut out = Vec::new();
    for setup in Setup::ALL {
        let imp = imp(setup, Some(server.backend));
        ctx.step(imp);
        let url = server.url.as_str();
        let measured = match server.backend {
            Backend::Redis => server
                .runtime
                .block_on(phase::<RedisQueue<String>>(url, setup, sizes)),
            Backend::Postgres => server
                .runtime
                .block_on(phase::<PgQueue<String>>(url, setup, sizes)),
        }
        .map_err(|e| format!("{imp}: {e}"))?;
        out.extend(samples(imp, &measured));
    }
    for peer in &server.peers {
        ctx.step(peer.name);
        out.extend(server.run_peer(peer, ID, &peer_args(sizes), &PEER_METRICS));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_gets_the_run_s_sizes_and_shape() {
        assert_eq!(
            peer_args(Sizes::of(true, None)),
            ["W8", "20000", "1000", "16", "1"]
        );
        assert_eq!(
            peer_args(Sizes::of(false, Some(2_000))),
            ["W8", "2000", "3000", "16", "1"]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_phase_in_memory_hands_out_every_item_within_the_limits() {
        let sizes = Sizes {
            noisy: 2_000,
            quiet: 100,
        };
        let limited = phase::<WorkQueue<String>>("", Setup::Limited(LIMITS), sizes)
            .await
            .unwrap();
        assert_eq!(limited.quiet_pickup_ns.len(), 100);
        assert!(limited.most_of_one_group <= LIMITS.per_group, "{limited:?}");
        assert!(limited.most_in_all <= LIMITS.total, "{limited:?}");
        assert!(limited.items_per_s > 0.0 && limited.noisy_items_per_s > 0.0);
        // Without limits the noisy group takes more workers than the limit lets it: the
        // limits, not the workload, held the limited queue.
        let fifo = phase::<WorkQueue<String>>("", Setup::Fifo, sizes)
            .await
            .unwrap();
        assert!(fifo.most_of_one_group > LIMITS.per_group, "{fifo:?}");
        assert!(fifo.most_in_all > LIMITS.total, "{fifo:?}");
    }
}
