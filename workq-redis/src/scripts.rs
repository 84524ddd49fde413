//! The queue's keys and its server-side scripts (`src/lua/*.lua`).

use std::sync::LazyLock;

use redis::Script;

/// The keys of one queue, in the order the scripts expect them (`KEYS[1]`...).
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// Every key, in script order.
    pub(crate) all: Vec<String>,
    /// The key prefix.
    prefix: String,
}

/// Suffixes of the keys, in the order of `KEYS` in `common.lua`.
/// The ready lists of non-zero priorities (`ready:<priority>`) are not among them: the scripts
/// derive their names from `ready`, in the same hash tag.
const SUFFIXES: [&str; 17] = [
    "ready", "dirty", "proc", "lease", "since", "delay", "fail", "stalls", "bucket", "marker",
    "seq", "shut", "dead", "meta", "lanes", "prio", "lprio",
];

/// Index of the dirty set in [`Keys::all`].
#[cfg(feature = "fault-injection")]
const DIRTY: usize = 1;
/// Index of the lease hash in [`Keys::all`].
#[cfg(feature = "fault-injection")]
const LEASE: usize = 3;
/// Index of the priority hash in [`Keys::all`].
#[cfg(feature = "fault-injection")]
const PRIO: usize = 15;
/// Index of the marker key in [`Keys::all`].
const MARKER: usize = 9;
/// Index of the failure hash in [`Keys::all`].
const FAIL: usize = 6;
/// Index of the dead-letter list in [`Keys::all`].
const DEAD: usize = 12;
/// Index of the shut-down flag in [`Keys::all`].
const SHUT: usize = 11;

impl Keys {
    /// The keys of queue `name` under `prefix`: `prefix:{name}:ready` and so on. The braces are
    /// a Redis Cluster hash tag: every key of one queue lands in one slot.
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let all = SUFFIXES
            .iter()
            .map(|suffix| format!("{prefix}:{{{name}}}:{suffix}"))
            .collect();
        Keys {
            all,
            prefix: prefix.to_owned(),
        }
    }

    /// The key prefix.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The index of queue names under `prefix`: a set every queue registers its name in
    /// when a handle is built (see `RedisAdmin::queues`). One key for every queue, so on a
    /// cluster it lives in one slot of one primary: it is written with a command of its own
    /// (a queue's scripts only touch the keys of the queue's own slot), never from a script.
    pub(crate) fn index(prefix: &str) -> String {
        format!("{prefix}:queues")
    }

    /// Set once the keyspace was scanned for the queues of a version that kept no index
    /// (by the listings, a bounded part each, or `RedisAdmin::reindex`).
    pub(crate) fn index_scanned(prefix: &str) -> String {
        format!("{prefix}:queues:scanned")
    }

    /// While that scan is under way: a hash of each primary's `SCAN` cursor (`done` once its
    /// keyspace is scanned), so that each listing goes on where the last one stopped.
    pub(crate) fn index_scanning(prefix: &str) -> String {
        format!("{prefix}:queues:scanning")
    }

    /// The key of the queue's with `suffix` that is not among [`all`](Self::all) (the scripts
    /// derive such keys from the ready list's name, in the same hash tag):
    /// `prefix:{name}:suffix`.
    pub(crate) fn derived(&self, suffix: &str) -> String {
        let ready = &self.all[0];
        let base = ready.strip_suffix("ready").unwrap_or(ready);
        format!("{base}{suffix}")
    }

    /// The queue's flow control settings (see `lua/flow.lua`).
    pub(crate) fn flow(&self) -> String {
        self.derived("flow")
    }

    /// The wake-up marker blocked getters wait on.
    pub(crate) fn marker(&self) -> &str {
        &self.all[MARKER]
    }

    /// The failure counts of `add_rate_limited`.
    pub(crate) fn fail(&self) -> &str {
        &self.all[FAIL]
    }

    /// The dead-letter list.
    pub(crate) fn dead(&self) -> &str {
        &self.all[DEAD]
    }

    /// The shut-down flag.
    pub(crate) fn shut(&self) -> &str {
        &self.all[SHUT]
    }

    /// The items that need processing (queued, or re-added while processing).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn dirty(&self) -> &str {
        &self.all[DIRTY]
    }

    /// The tokens of the items' current leases.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn lease(&self) -> &str {
        &self.all[LEASE]
    }

    /// The priorities re-adds gave.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn prio(&self) -> &str {
        &self.all[PRIO]
    }
}

/// Whether a script may run while the server is out of memory (`maxmemory` reached under
/// `noeviction`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Oom {
    /// The script grows the data (adds): the server refuses it when full, which is the
    /// back-pressure producers get.
    Refuse,
    /// The script moves or removes data (get, renew, done, release, dead letters, reads), so it
    /// must keep working on a full server: renewals keep leases alive and dones free memory.
    /// Declared with the `allow-oom` script flag (Redis 7.0).
    Allow,
}

/// Builds the script of one operation: the shared prelude and flow control (`common.lua`,
/// `flow.lua`), the shared functions the operation calls (`parts` but the last), then the
/// operation (the last of `parts`).
pub(crate) fn script(parts: &[&str], oom: Oom) -> Script {
    Script::new(&script_source(parts, oom))
}

/// The source text of [`script`]'s script (for a `SCRIPT LOAD` of one's own).
pub(crate) fn script_source(parts: &[&str], oom: Oom) -> String {
    let mut source = String::new();
    if oom == Oom::Allow {
        source.push_str("#!lua flags=allow-oom\n");
    }
    for part in [&COMMON, &FLOW].into_iter().chain(parts) {
        source.push_str(part);
        source.push('\n');
    }
    source
}

const COMMON: &str = include_str!("lua/common.lua");
/// Flow control (groups, limits, rates): in every script, after `COMMON`, which calls it on
/// a queue that has it.
const FLOW: &str = include_str!("lua/flow.lua");
/// `take()`: the hand-out of `get` and `done_get`.
const TAKE: &str = include_str!("lua/take.lua");
/// `finish()`: the done of `done`, `done_get` and `retry_done`.
const FINISH: &str = include_str!("lua/finish.lua");
/// `rate_limited_delay()`: the rate limiter of `add_rate_limited` and `retry_done`.
const LIMIT: &str = include_str!("lua/limit.lua");
/// `figures()`: a queue's figures, as `summary` and `stats` read them.
pub(crate) const FIGURES: &str = include_str!("lua/figures.lua");

/// Every operation's script. `EVALSHA` runs them; after a server restart or failover that lost
/// the script cache, the client loads them again on `NOSCRIPT`.
pub(crate) struct Scripts {
    pub(crate) add_after: Script,
    pub(crate) add_many: Script,
    pub(crate) add_rate_limited: Script,
    pub(crate) get: Script,
    pub(crate) renew: Script,
    pub(crate) done: Script,
    pub(crate) done_get: Script,
    pub(crate) retry_done: Script,
    pub(crate) release: Script,
    pub(crate) dead_letter: Script,
    pub(crate) dead_requeue: Script,
    pub(crate) dead_purge: Script,
    pub(crate) len: Script,
    pub(crate) shut_down: Script,
    pub(crate) resume: Script,
    pub(crate) stats: Script,
    pub(crate) delete: Script,
    pub(crate) flow_set: Script,
    pub(crate) flow_clear: Script,
}

/// The scripts, built once per process.
pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    add_after: script(&[include_str!("lua/add_after.lua")], Oom::Refuse),
    add_many: script(&[include_str!("lua/add_many.lua")], Oom::Refuse),
    add_rate_limited: script(
        &[LIMIT, include_str!("lua/add_rate_limited.lua")],
        Oom::Refuse,
    ),
    get: script(&[TAKE, include_str!("lua/get.lua")], Oom::Allow),
    renew: script(&[include_str!("lua/renew.lua")], Oom::Allow),
    done: script(&[FINISH, include_str!("lua/done.lua")], Oom::Allow),
    done_get: script(
        &[FINISH, TAKE, include_str!("lua/done_get.lua")],
        Oom::Allow,
    ),
    // Not refused by a full server: like a release it moves an item from in flight back to
    // waiting (queued again at done, or delayed), taking about the memory the done frees;
    // refused, the failing item would wait for its lease to expire, and count a stall.
    retry_done: script(
        &[LIMIT, FINISH, include_str!("lua/retry_done.lua")],
        Oom::Allow,
    ),
    release: script(&[include_str!("lua/release.lua")], Oom::Allow),
    dead_letter: script(&[include_str!("lua/dead_letter.lua")], Oom::Allow),
    dead_requeue: script(&[include_str!("lua/dead_requeue.lua")], Oom::Refuse),
    dead_purge: script(&[include_str!("lua/dead_purge.lua")], Oom::Allow),
    len: script(&[include_str!("lua/len.lua")], Oom::Allow),
    shut_down: script(&[include_str!("lua/shut_down.lua")], Oom::Allow),
    resume: script(&[include_str!("lua/resume.lua")], Oom::Allow),
    stats: script(&[FIGURES, include_str!("lua/stats.lua")], Oom::Allow),
    delete: script(&[include_str!("lua/delete.lua")], Oom::Allow),
    // Settings are small; a handle must be able to start on a full server. (Turning flow
    // control on moves the queue's items into the group '': about the memory they take.)
    flow_set: script(&[include_str!("lua/flow_set.lua")], Oom::Allow),
    flow_clear: script(&[include_str!("lua/flow_clear.lua")], Oom::Allow),
});

#[cfg(test)]
mod tests {
    use super::*;

    /// The scripts every deployment runs have no switch that turns a rule off: the fault
    /// tests' mutations (feature `fault-injection`) live in the client only.
    #[test]
    fn no_script_can_turn_a_rule_off() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lua");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let source = std::fs::read_to_string(&path).unwrap();
            for switch in ["NO_FENCING", "NO_DIRTY_REQUEUE", "mutat", "flags"] {
                assert!(
                    !source.contains(switch),
                    "{} mentions {switch}",
                    path.display()
                );
            }
            seen += 1;
        }
        assert!(seen > 20, "{seen} scripts");
        // The fencing check compares the tokens, and nothing else.
        assert!(
            COMMON.contains("local function holds(holder, token)\n  return holder == token\nend")
        );
    }
}
