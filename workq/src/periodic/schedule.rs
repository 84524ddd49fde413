//! [`Schedule`]: when a periodic schedule ticks, a fixed interval or a cron expression in a
//! time zone, as pure functions of the wall clock.
//!
//! Ticks are instants every process computes alike from the schedule alone (multiples of the
//! period since the Unix epoch; the cron expression's matches in its zone), so a tick names
//! the same work in every process of a fleet. They are whole milliseconds, the unit every
//! backend stores.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use croner::Cron;
use jiff::Timestamp;
use jiff::tz::TimeZone;

/// When a periodic schedule ticks: every fixed period, or at the matches of a cron
/// expression in a time zone.
///
/// # Interval
///
/// [`Schedule::every`]`(period)` ticks at the multiples of `period` since the Unix epoch
/// (UTC), shifted by an [`offset`](Schedule::offset): `every(1 h).offset(15 min)` ticks at a
/// quarter past every hour, in every process alike, whenever it started.
///
/// # Cron
///
/// [`Schedule::cron`] and [`Schedule::cron_in`] take a cron expression of 5 fields (minute,
/// hour, day of month, month, day of week), 6 (seconds first) or 7 (a year last), with
/// ranges, lists, steps, names (`MON`, `JAN`), `L`, `W`, `#` and the nicknames (`@hourly`,
/// `@daily`, `@weekly`, `@monthly`, `@yearly`), evaluated in a time zone of the IANA
/// database (UTC for [`Schedule::cron`]). Over daylight saving time changes, the rules of
/// Vixie cron (and of the Open Cron Pattern Specification) hold:
///
/// - a fixed time that does not exist on the day the clocks go forward (02:30 in
///   `America/New_York` on the second Sunday of March) ticks at the first instant after the
///   gap (03:00), once;
/// - a fixed time that happens twice on the day the clocks go back ticks once, the first
///   time;
/// - a pattern with a wildcard or a step in its second, minute or hour field ticks at each
///   instant that matches: none inside the gap, both passes of the repeated hour.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use workq::periodic::Schedule;
///
/// let hourly = Schedule::every(Duration::from_secs(3600)).offset(Duration::from_secs(900));
/// let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000); // 01:46:40 UTC
/// assert_eq!(
///     hourly.next_after(at),
///     Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000 + 1_700)), // 02:15
/// );
///
/// let nightly = Schedule::cron_in("30 2 * * *", "Europe/Paris")?;
/// assert_eq!(nightly.to_string(), "cron 30 2 * * * (Europe/Paris)");
/// assert!(Schedule::cron("61 * * * *").is_err());
/// # Ok::<(), workq::periodic::ScheduleError>(())
/// ```
#[derive(Clone)]
pub struct Schedule {
    kind: Kind,
}

/// The two ways of ticking.
#[derive(Clone)]
enum Kind {
    /// At `offset + k * period` since the Unix epoch (nanoseconds).
    Every { period: u128, offset: u128 },
    /// At the matches of `cron` in `zone`.
    Cron {
        cron: Box<Cron>,
        zone: TimeZone,
        /// The expression as given, for the spec.
        text: String,
        /// The zone's name as given, for the spec.
        zone_name: String,
    },
}

/// The shortest period of [`Schedule::every`]: ticks are whole milliseconds.
const MIN_PERIOD: Duration = Duration::from_millis(1);

impl Schedule {
    /// Ticks every `period`, at its multiples since the Unix epoch.
    ///
    /// # Panics
    ///
    /// If `period` is shorter than a millisecond (ticks are whole milliseconds).
    pub fn every(period: Duration) -> Self {
        assert!(
            period >= MIN_PERIOD,
            "a periodic schedule's period must be at least 1 ms, got {period:?}"
        );
        Schedule {
            kind: Kind::Every {
                period: period.as_nanos(),
                offset: 0,
            },
        }
    }

    /// Shifts an interval's ticks by `offset` (taken modulo the period): at `offset + k *
    /// period` since the Unix epoch. A cron schedule is returned unchanged.
    #[must_use]
    pub fn offset(mut self, offset: Duration) -> Self {
        if let Kind::Every { period, offset: o } = &mut self.kind {
            *o = offset.as_nanos() % *period;
        }
        self
    }

    /// Ticks at the matches of the cron expression `expression`, in UTC.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::Cron`] if `expression` is not a cron expression, or never matches.
    pub fn cron(expression: &str) -> Result<Self, ScheduleError> {
        Self::cron_with(expression, TimeZone::UTC, "UTC")
    }

    /// Ticks at the matches of the cron expression `expression` in the time zone named
    /// `zone` (an IANA name, such as `Europe/Paris`; or `UTC`).
    ///
    /// # Errors
    ///
    /// [`ScheduleError::Cron`] as for [`cron`](Self::cron); [`ScheduleError::TimeZone`] if
    /// the time zone database knows no zone of that name.
    pub fn cron_in(expression: &str, zone: &str) -> Result<Self, ScheduleError> {
        let tz = TimeZone::get(zone).map_err(|e| ScheduleError::TimeZone {
            zone: zone.to_owned(),
            reason: e.to_string(),
        })?;
        Self::cron_with(expression, tz, zone)
    }

    fn cron_with(expression: &str, zone: TimeZone, zone_name: &str) -> Result<Self, ScheduleError> {
        let error = |reason: String| ScheduleError::Cron {
            expression: expression.to_owned(),
            reason,
        };
        let cron = Cron::from_str(expression).map_err(|e| error(e.to_string()))?;
        let schedule = Schedule {
            kind: Kind::Cron {
                cron: Box::new(cron),
                zone,
                text: expression.trim().to_owned(),
                zone_name: zone_name.to_owned(),
            },
        };
        // A pattern that parses may still never match (the 30th of February): refused now
        // rather than found out by a runner that never ticks.
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(946_684_800); // 2000-01-01
        if schedule.next_after(start).is_none() {
            return Err(error("it matches no time".to_owned()));
        }
        Ok(schedule)
    }

    /// The first tick strictly after `at`; `None` if there is none (past the year 5000, or
    /// past what [`SystemTime`] holds).
    pub fn next_after(&self, at: SystemTime) -> Option<SystemTime> {
        match &self.kind {
            Kind::Every { period, offset } => {
                let now = nanos(at)?;
                let mut k = if now < *offset {
                    0
                } else {
                    (now - offset) / period + 1
                };
                // A tick is cut to its whole millisecond, so the next one after `at` may cut
                // to `at` itself (a period that is not whole milliseconds): then the one
                // after it, at least a millisecond later, is the next.
                loop {
                    let tick = from_nanos(offset + k * period)?;
                    if tick > at {
                        return Some(tick);
                    }
                    k += 1;
                }
            }
            Kind::Cron { cron, zone, .. } => {
                let start = whole_second(at)?.to_zoned(zone.clone());
                let next = cron.find_next_occurrence(&start, false).ok()?;
                to_system(next.timestamp())
            }
        }
    }

    /// The latest tick at or before `at`; `None` if there is none (before the first, which
    /// for an interval is the Unix epoch plus its offset).
    pub fn last_at_or_before(&self, at: SystemTime) -> Option<SystemTime> {
        match &self.kind {
            Kind::Every { period, offset } => {
                let now = nanos(at)?;
                if now < *offset {
                    return None;
                }
                let k = (now - offset) / period;
                from_nanos(offset + k * period)
            }
            Kind::Cron { cron, zone, .. } => {
                let start = whole_second(at)?.to_zoned(zone.clone());
                let last = cron.find_previous_occurrence(&start, true).ok()?;
                to_system(last.timestamp())
            }
        }
    }
}

impl fmt::Display for Schedule {
    /// The spec a listing shows: `every 5m`, `every 1h offset 15m`,
    /// `cron 30 2 * * * (Europe/Paris)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Every { period, offset } => {
                write!(f, "every {}", Span(*period))?;
                if *offset > 0 {
                    write!(f, " offset {}", Span(*offset))?;
                }
                Ok(())
            }
            Kind::Cron {
                text, zone_name, ..
            } => write!(f, "cron {text} ({zone_name})"),
        }
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Schedule").field(&self.to_string()).finish()
    }
}

/// A span of nanoseconds as a listing writes it: `1h30m`, `5m`, `1.5s`, `250ms`.
struct Span(u128);

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MS: u128 = 1_000_000;
        const S: u128 = 1_000 * MS;
        let n = self.0;
        if !n.is_multiple_of(S) {
            if n.is_multiple_of(MS) && n < S {
                return write!(f, "{}ms", n / MS);
            }
            return write!(f, "{}s", n as f64 / S as f64);
        }
        let mut secs = n / S;
        let mut wrote = false;
        for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
            if secs >= size {
                write!(f, "{}{unit}", secs / size)?;
                secs %= size;
                wrote = true;
            }
        }
        if !wrote {
            f.write_str("0s")?;
        }
        Ok(())
    }
}

/// Nanoseconds since the Unix epoch; `None` before it.
fn nanos(at: SystemTime) -> Option<u128> {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_nanos())
}

/// The instant `n` nanoseconds after the Unix epoch, cut to whole milliseconds; `None` past
/// what [`SystemTime`] holds.
fn from_nanos(n: u128) -> Option<SystemTime> {
    let ms = u64::try_from(n / 1_000_000).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// `at` cut to its whole second, as a [`Timestamp`] (cron's resolution); `None` outside
/// jiff's range.
fn whole_second(at: SystemTime) -> Option<Timestamp> {
    let ts = Timestamp::try_from(at).ok()?;
    Timestamp::from_second(ts.as_second()).ok()
}

/// A [`Timestamp`] as a [`SystemTime`].
fn to_system(ts: Timestamp) -> Option<SystemTime> {
    Some(SystemTime::from(ts))
}

/// Why a [`Schedule`] could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The cron expression does not parse, or matches no time.
    Cron {
        /// The expression given.
        expression: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The time zone database knows no such zone.
    TimeZone {
        /// The name given.
        zone: String,
        /// What the database said.
        reason: String,
    },
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleError::Cron { expression, reason } => {
                write!(f, "bad cron expression {expression:?}: {reason}")
            }
            ScheduleError::TimeZone { zone, reason } => {
                write!(f, "unknown time zone {zone:?}: {reason}")
            }
        }
    }
}

impl std::error::Error for ScheduleError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn an_interval_ticks_at_the_multiples_of_its_period_shifted_by_its_offset() {
        let s = Schedule::every(Duration::from_secs(60)).offset(Duration::from_secs(70));
        assert_eq!(s.next_after(at(0)), Some(at(10)));
        assert_eq!(s.next_after(at(10)), Some(at(70)));
        assert_eq!(s.last_at_or_before(at(69)), Some(at(10)));
        assert_eq!(s.last_at_or_before(at(70)), Some(at(70)));
        assert_eq!(s.last_at_or_before(at(9)), None);
        assert_eq!(s.to_string(), "every 1m offset 10s");
    }

    #[test]
    fn sub_second_periods_tick_at_whole_milliseconds_that_always_grow() {
        let s = Schedule::every(Duration::from_micros(1_500));
        let mut t = SystemTime::UNIX_EPOCH;
        let mut seen = Vec::new();
        for _ in 0..6 {
            t = s.next_after(t).unwrap();
            seen.push(
                t.duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap()
                    .as_millis(),
            );
        }
        assert_eq!(seen, [1, 3, 4, 6, 7, 9]);
        assert_eq!(s.to_string(), "every 0.0015s");
    }

    #[test]
    #[should_panic(expected = "at least 1 ms")]
    fn a_period_under_a_millisecond_is_refused() {
        let _ = Schedule::every(Duration::from_micros(999));
    }

    #[test]
    fn spans_are_written_in_units() {
        let d = |s: u64| Schedule::every(Duration::from_secs(s)).to_string();
        assert_eq!(d(5400), "every 1h30m");
        assert_eq!(d(86_400 + 1), "every 1d1s");
        assert_eq!(
            Schedule::every(Duration::from_millis(250)).to_string(),
            "every 250ms"
        );
    }

    #[test]
    fn bad_expressions_and_zones_are_refused_with_their_reason() {
        let e = Schedule::cron("every day").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("bad cron expression \"every day\"")
        );
        let e = Schedule::cron("0 0 30 2 *").unwrap_err();
        assert!(e.to_string().contains("matches no time"), "{e}");
        let e = Schedule::cron_in("0 * * * *", "Mars/Olympus_Mons").unwrap_err();
        assert!(matches!(e, ScheduleError::TimeZone { .. }), "{e}");
    }
}
