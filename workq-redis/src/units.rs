//! Units: durations as the scripts take them (whole microseconds) and the deadlines this host
//! keeps, none of which can overflow, whatever the settings (`Duration::MAX` included).
//!
//! Every duration a [`Builder`](crate::Builder) takes is capped at [`NO_LIMIT`] when the queue
//! is built, and every duration sent to the server goes through [`micros`], so the scripts'
//! arithmetic (Lua numbers are doubles, exact to 2^53) stays exact and in range. Deadlines are
//! made with [`deadline`], never with `Instant + Duration`.

use std::time::{Duration, Instant};

/// A hundred years: what a setting of `Duration::MAX` (or anything longer) stands for. Past
/// any deadline that matters, yet the server's clock plus it, in microseconds, is still an
/// exact integer for Lua (under 2^53), and this host's clock plus it is still an `Instant`.
pub(crate) const NO_LIMIT: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// `d`, or [`NO_LIMIT`] if longer.
pub(crate) fn capped(d: Duration) -> Duration {
    d.min(NO_LIMIT)
}

/// `from` plus `d`, without overflow: a deadline past this host's clock's range is taken as
/// [`NO_LIMIT`] from `from` (and, on a platform whose clock cannot reach that either, as
/// `from`; no supported platform is one).
pub(crate) fn deadline(from: Instant, d: Duration) -> Instant {
    from.checked_add(d)
        .or_else(|| from.checked_add(NO_LIMIT))
        .unwrap_or(from)
}

/// [`deadline`] from now.
pub(crate) fn from_now(d: Duration) -> Instant {
    deadline(Instant::now(), d)
}

/// A duration in whole microseconds for the scripts, capped at [`NO_LIMIT`].
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(capped(d).as_micros()).unwrap_or(u64::MAX)
}

/// A per-item counter (failures, stalls) as the operator's types hold it: `u32`, saturated.
pub(crate) fn saturated(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_overflows() {
        assert_eq!(micros(Duration::MAX), micros(NO_LIMIT));
        assert!(
            micros(NO_LIMIT) < 1 << 52,
            "room for the server's clock under 2^53"
        );
        assert_eq!(micros(Duration::from_millis(3)), 3000);
        let now = Instant::now();
        assert_eq!(deadline(now, Duration::MAX), now + NO_LIMIT);
        assert_eq!(
            deadline(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert_eq!(capped(Duration::MAX), NO_LIMIT);
        assert_eq!(saturated(7), 7);
        assert_eq!(saturated(u64::MAX), u32::MAX);
    }
}
