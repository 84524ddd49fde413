//! The CPU time of a local server's processes, from `/proc/PID/stat`.
//!
//! Read by hand rather than with a crate: four numbers of one line of a file, on the one
//! system the bench reads them on (Linux), do not justify a dependency.

use std::fs;

/// Clock ticks per second of the times in `/proc/PID/stat` (the kernel's `USER_HZ`, 100 on
/// every Linux architecture the bench runs on; `sysconf` would need `unsafe`).
const TICKS_PER_S: f64 = 100.0;

/// The times of one process, in clock ticks: its own (`utime`, `stime`) and those of its
/// children it has waited for (`cutime`, `cstime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Times {
    pub(crate) parent: Option<u32>,
    pub(crate) own: u64,
    pub(crate) reaped: u64,
}

/// The fields of a `/proc/PID/stat` line: the command's name (in parentheses, which may
/// itself hold spaces and parentheses) and its times.
pub(crate) fn parse_stat(line: &str) -> Option<(String, Times)> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let name = line.get(open + 1..close)?.to_owned();
    // After the name: state (field 3), ppid (4), ..., utime (14), stime (15), cutime (16),
    // cstime (17); index 0 here is field 3.
    let rest: Vec<&str> = line.get(close + 1..)?.split_whitespace().collect();
    let field = |n: usize| rest.get(n - 3)?.parse::<u64>().ok();
    let parent = rest.get(1)?.parse::<u32>().ok();
    Some((
        name,
        Times {
            parent,
            own: field(14)? + field(15)?,
            reaped: field(16)? + field(17)?,
        },
    ))
}

/// The name and times of process `pid`, if it is on this machine.
pub(crate) fn stat(pid: u32) -> Option<(String, Times)> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The CPU seconds the process tree under `root` has used: its own, its reaped children's,
/// and its live children's. A server that forks a process per connection (PostgreSQL) and
/// waits for each when it ends keeps the time of every ended one in its `cutime` and
/// `cstime`, so the difference between two readings counts the connections that came and
/// went in between too.
pub(crate) fn tree_cpu_s(root: u32) -> Option<f64> {
    let (_, times) = stat(root)?;
    let mut ticks = times.own + times.reaped;
    for entry in fs::read_dir("/proc").ok()?.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((_, child)) = stat(pid)
            && child.parent == Some(root)
        {
            ticks += child.own;
        }
    }
    #[expect(clippy::cast_precision_loss, reason = "ticks stay far below 2^52")]
    Some(ticks as f64 / TICKS_PER_S)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_name_parent_and_times() {
        let line = "4242 (postgres: x (y)) S 17 4242 4242 0 -1 4194560 500 0 0 0 \
                    120 30 7 3 20 0 1 0 100 1000 10";
        let (name, times) = parse_stat(line).unwrap();
        assert_eq!(name, "postgres: x (y)");
        assert_eq!(
            times,
            Times {
                parent: Some(17),
                own: 150,
                reaped: 10
            }
        );
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn this_process_reads_back() {
        let (_, times) = stat(std::process::id()).unwrap();
        assert!(times.parent.is_some());
        assert!(tree_cpu_s(std::process::id()).is_some());
    }
}
