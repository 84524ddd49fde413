//! What W8 is made of, whatever the backend: its sizes ([`Sizes`]), the three ways its
//! queue is set up ([`Setup`]), the limits of the limited one, and its items
//! (`"noisy/<i>"`, `"quiet<g>/<i>"`) and their groups.

use std::time::Duration;

/// Workers.
pub(crate) const WORKERS: usize = 16;
/// How long the handler sleeps.
pub(crate) const HANDLER: Duration = Duration::from_millis(1);
/// Quiet groups.
const QUIET_GROUPS: usize = 100;
/// Quiet items a second, in all: each quiet group adds one every 100 ms.
pub(crate) const QUIET_PER_S: f64 = 1_000.0;
/// The limited queue's limits: per group, and in all (below [`WORKERS`], so that it binds).
pub(crate) const LIMITS: Limits = Limits {
    per_group: 8,
    total: 12,
};
/// The noisy group.
const NOISY: &str = "noisy";

/// The limits a phase is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// `max_in_flight_per_group`.
    pub(crate) per_group: usize,
    /// `max_in_flight`.
    pub(crate) total: usize,
}

/// How a phase's queue is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Setup {
    /// No groups.
    Fifo,
    /// `group_by`, no limits.
    Grouped,
    /// `group_by` and these limits.
    Limited(Limits),
}

impl Setup {
    /// The three, in report order: ours first.
    pub(crate) const ALL: [Setup; 3] = [Setup::Grouped, Setup::Fifo, Setup::Limited(LIMITS)];

    /// The limits the bench holds the phase to.
    pub(crate) fn limits(self) -> Option<Limits> {
        match self {
            Setup::Limited(limits) => Some(limits),
            Setup::Fifo | Setup::Grouped => None,
        }
    }
}

/// The items of a phase.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    /// The noisy group's burst.
    pub(crate) noisy: usize,
    /// Quiet items, in all ([`QUIET_PER_S`] a second).
    pub(crate) quiet: usize,
}

impl Sizes {
    /// The full sizes, or `--quick`'s; the burst `--w8-burst` chose, if any.
    pub(crate) fn of(quick: bool, burst: Option<usize>) -> Self {
        let (noisy, seconds) = if quick { (20_000, 1) } else { (100_000, 3) };
        Sizes {
            noisy: burst.unwrap_or(noisy),
            quiet: seconds * QUIET_PER_S as usize,
        }
    }
}

/// The noisy group's item `i`.
pub(crate) fn noisy_item(i: usize) -> String {
    format!("{NOISY}/{i}")
}

/// Quiet item `i`, of quiet group `i % 100`.
pub(crate) fn quiet_item(i: usize) -> String {
    format!("quiet{}/{i}", i % QUIET_GROUPS)
}

/// The group of an item: the part before the `/`.
pub(crate) fn group_of(item: &str) -> &str {
    item.split_once('/').map_or("", |(group, _)| group)
}

/// The index of a quiet item (`None` for the noisy group's).
pub(crate) fn quiet_index(item: &str) -> Option<usize> {
    let (group, index) = item.split_once('/')?;
    if group == NOISY {
        return None;
    }
    index.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_name_their_group_and_quiet_ones_their_index_and_sizes_follow_the_options() {
        assert_eq!(group_of(&noisy_item(7)), "noisy");
        assert_eq!(quiet_index(&noisy_item(7)), None);
        assert_eq!(group_of(&quiet_item(1234)), "quiet34");
        assert_eq!(quiet_index(&quiet_item(1234)), Some(1234));
        assert_eq!(group_of("no-slash"), "");
        let full = Sizes::of(false, None);
        assert_eq!((full.noisy, full.quiet), (100_000, 3_000));
        assert_eq!(Sizes::of(false, Some(500)).noisy, 500);
    }
}
