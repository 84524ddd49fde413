//! The conversions between the queue's numbers and the server's: spans capped at
//! [`FOREVER`] in microseconds, counts as `integer`, and the server's counts and seconds back.

use std::time::{Duration, Instant};

/// The longest span the queue keeps: "no limit". Every setting and delay is capped at it (a
/// century), so that every deadline fits in an `Instant` and in PostgreSQL's timestamps, and
/// no arithmetic on them overflows; `Duration::MAX` means the same.
pub(crate) const FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Microseconds, capped at [`FOREVER`], for the SQL functions.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.min(FOREVER).as_micros()).unwrap_or(i64::MAX)
}

/// The moment `d` from now, or as far as this host's clock goes (a span past [`FOREVER`]
/// counts as [`FOREVER`]): never panics.
pub(crate) fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d.min(FOREVER))
        .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(now)
}

/// Clamps a count to what the SQL functions take.
pub(crate) fn int(n: impl TryInto<i32>) -> i32 {
    n.try_into().unwrap_or(i32::MAX)
}

/// A non-negative count from the database.
pub(crate) fn count(n: i64) -> usize {
    usize::try_from(n.max(0)).unwrap_or(usize::MAX)
}

/// Seconds from the database, as a duration (negative: zero).
pub(crate) fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX)
}

/// The `LIMIT` of a count capped at `cap` (`cap + 1` rows tell "more than `cap`"); `None`, a
/// `LIMIT NULL`, counts every row.
pub(crate) fn count_limit(cap: Option<u64>) -> Option<i64> {
    cap.map(|cap| i64::try_from(cap.saturating_add(1)).unwrap_or(i64::MAX))
}
