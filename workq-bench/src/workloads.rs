//! Every workload by id, in report order, and the choice of `-w`.

use crate::ctx::Ctx;
use crate::report::Sample;
use crate::{distributed, fleet, memory, noisy};

/// One standard workload.
pub(crate) struct Workload {
    /// `W1` ...
    pub(crate) id: &'static str,
    /// A few words for the progress line.
    pub(crate) title: &'static str,
    /// Runs it once.
    pub(crate) run: fn(&Ctx<'_>) -> Result<Vec<Sample>, String>,
}

/// The workloads in memory, in report order (P1 sits beside W1, whose cycle it repeats with
/// priorities; W3R beside W3; P2-P4, controller-runtime's shapes, at the end).
pub(crate) const IN_MEMORY: &[Workload] = &[
    Workload {
        id: "W1",
        title: "fifo, 1 producer, 1 consumer",
        run: |ctx| Ok(memory::w1_fifo::run(ctx)),
    },
    Workload {
        id: "P1",
        title: "priorities, 1,000 keys over 5 priorities",
        run: |ctx| Ok(memory::p1_priority::run(ctx)),
    },
    Workload {
        id: "W2",
        title: "contended, 4 producers, 4 consumers",
        run: |ctx| Ok(memory::w2_contended::run(ctx)),
    },
    Workload {
        id: "W3",
        title: "dedup, 4 producers of 1,000 keys, 2 consumers",
        run: |ctx| Ok(memory::w3_dedup::run(ctx)),
    },
    Workload {
        id: memory::w3_fixed_rate::ID,
        title: "dedup, 4 producers of 1,000 keys, 2 consumers at a fixed rate",
        run: |ctx| Ok(memory::w3_fixed_rate::run(ctx)),
    },
    Workload {
        id: "W4",
        title: "delay, add_after with random delays, 2 consumers",
        run: |ctx| Ok(memory::w4_delay::run(ctx)),
    },
    Workload {
        id: "W5",
        title: "retry, exponential backoff, 4 consumers",
        run: |ctx| Ok(memory::w5_retry::run(ctx)),
    },
    Workload {
        id: "W6",
        title: "memory, peak RSS per item",
        run: |ctx| Ok(memory::w6_memory::run(ctx)),
    },
    Workload {
        id: "W7",
        title: "fleet, 100,000 items to Workers with count 16",
        run: fleet::run_memory,
    },
    Workload {
        id: noisy::ID,
        title: "noisy neighbour, 1 group's burst beside 100 quiet groups, Workers with count 16",
        run: noisy::run_memory,
    },
    Workload {
        id: memory::controller_runtime::CONTENDED,
        title: "controller-runtime's add under contention: 1,000,000 queued, 1,000 workers",
        run: memory::controller_runtime::run_contended,
    },
    Workload {
        id: memory::controller_runtime::ADD_GET_DONE,
        title: "controller-runtime's add-get-done: 1,000 adds, then 1,000 gets and dones",
        run: memory::controller_runtime::run_add_get_done,
    },
    Workload {
        id: memory::controller_runtime::ADD_ONLY,
        title: "controller-runtime's add-only: the same 1,000 adds over and over",
        run: memory::controller_runtime::run_add_only,
    },
];

/// The workloads on a server (`--redis URL`, `--postgres URL`), in report order.
pub(crate) const ON_A_SERVER: &[Workload] = &[
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
        id: distributed::W3P,
        title: "plain adds on the server, 4 producers of distinct keys, 2 consumers",
        run: distributed::run_w3p,
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
        id: noisy::ID,
        title: "noisy neighbour on the server, 1 group's burst beside 100 quiet groups",
        run: noisy::run_server,
    },
    Workload {
        id: fleet::SCALE_ID,
        title: "fleet scaling, 1 to 64 workers in one process",
        run: fleet::run_scale,
    },
    Workload {
        id: fleet::BURN_ID,
        title: "burn-down of a backlog, 1 to 2,000 workers in one process (River's shape)",
        run: fleet::run_burn,
    },
];

/// Workloads that run only when named (or, for W7S, with `--plot`; for W7B, with
/// `--compare`).
pub(crate) const ON_REQUEST: &[&str] = &[fleet::SCALE_ID, fleet::BURN_ID];

/// The workloads named by `ids`, in report order; all of them (but those run on request) if
/// none is named. An unknown id is the error.
pub(crate) fn select(
    known: &'static [Workload],
    ids: &[String],
) -> Result<Vec<&'static Workload>, String> {
    let wanted: Vec<&str> = ids
        .iter()
        .map(|id| id.trim())
        .filter(|id| !id.is_empty())
        .collect();
    if wanted.is_empty() {
        return Ok(known
            .iter()
            .filter(|w| !ON_REQUEST.contains(&w.id))
            .collect());
    }
    let mut chosen = Vec::new();
    for id in wanted {
        match known.iter().find(|w| w.id.eq_ignore_ascii_case(id)) {
            Some(w) => chosen.push(w.id),
            None => return Err(id.to_owned()),
        }
    }
    Ok(known.iter().filter(|w| chosen.contains(&w.id)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(selected: &[&Workload]) -> Vec<&'static str> {
        selected.iter().map(|w| w.id).collect()
    }

    #[test]
    fn the_choice_keeps_report_order_and_refuses_an_unknown_id() {
        let all = select(ON_A_SERVER, &[]).unwrap();
        assert!(!ids(&all).contains(&fleet::SCALE_ID), "W7S runs on request");
        assert!(!ids(&all).contains(&fleet::BURN_ID), "W7B runs on request");
        let chosen = select(ON_A_SERVER, &["w7".into(), " W1 ".into(), "W7S".into()]).unwrap();
        assert_eq!(ids(&chosen), ["W1", "W7", "W7S"]);
        assert_eq!(
            select(IN_MEMORY, &["W3P".into()]).err().as_deref(),
            Some("W3P")
        );
        assert_eq!(
            ids(&select(IN_MEMORY, &["p2".into(), "W3R".into()]).unwrap()),
            ["W3R", "P2"]
        );
    }
}
