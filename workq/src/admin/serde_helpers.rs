//! The JSON shapes of the admin types (feature `serde`): spans as seconds (`f64`, fields
//! named `*_s`), instants as milliseconds since the Unix epoch (`at_ms`), and
//! [`QueueSummary`] with its counters flat, as the dashboard's API has always written them.

use std::time::{Duration, SystemTime};

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Counters, QueueSummary};

/// A span from seconds, refusing what no span is (negative, not a number, too large).
fn span<E: serde::de::Error>(seconds: f64) -> Result<Duration, E> {
    Duration::try_from_secs_f64(seconds)
        .map_err(|e| E::custom(format_args!("{seconds} s is not a span: {e}")))
}

/// `Duration` as seconds.
pub(crate) mod secs {
    use super::{Deserialize, Deserializer, Duration, Serializer};

    pub(crate) fn serialize<S: Serializer>(span: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(span.as_secs_f64())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        super::span(f64::deserialize(d)?)
    }
}

/// `Option<Duration>` as seconds or `null`.
pub(crate) mod opt_secs {
    use super::{Deserialize, Deserializer, Duration, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        span: &Option<Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match span {
            Some(span) => s.serialize_some(&span.as_secs_f64()),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Option::<f64>::deserialize(d)?.map(super::span).transpose()
    }
}

/// `SystemTime` as whole milliseconds since the Unix epoch (an instant before it as 0).
pub(crate) mod unix_ms {
    use super::{Deserialize, Deserializer, Duration, Serializer, SystemTime};

    pub(crate) fn serialize<S: Serializer>(at: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let ms = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            });
        s.serialize_u64(ms)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let ms = u64::deserialize(d)?;
        SystemTime::UNIX_EPOCH
            .checked_add(Duration::from_millis(ms))
            .ok_or_else(|| {
                serde::de::Error::custom(format_args!("{ms} ms is past the clock's end"))
            })
    }
}

/// `Option<SystemTime>` as whole milliseconds since the Unix epoch, or `null`.
pub(crate) mod opt_unix_ms {
    use super::{Deserialize, Deserializer, Serializer, SystemTime};

    pub(crate) fn serialize<S: Serializer>(
        at: &Option<SystemTime>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match at {
            Some(at) => super::unix_ms::serialize(at, s),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<SystemTime>, D::Error> {
        #[derive(Deserialize)]
        struct Ms(#[serde(with = "super::unix_ms")] SystemTime);
        Ok(Option::<Ms>::deserialize(d)?.map(|Ms(at)| at))
    }
}

/// [`QueueSummary`] as JSON: the dashboard's `/api/queues` entry, counters flat (each
/// `null` without them: `#[serde(flatten)]` of an `Option` would leave the keys out).
#[derive(Serialize, Deserialize)]
#[serde(default)]
struct SummaryJson<S> {
    name: S,
    broken: Option<S>,
    depth: u64,
    delayed: u64,
    in_flight: u64,
    in_flight_dirty: u64,
    failing: u64,
    failures: u64,
    stalled: u64,
    dead: u64,
    dead_dropped: u64,
    paused: bool,
    shut_down: bool,
    oldest_ready_s: Option<f64>,
    longest_running_s: f64,
    unfinished_work_s: f64,
    adds_total: Option<u64>,
    completions_total: Option<u64>,
    retries_total: Option<u64>,
    capped_at: Option<u64>,
}

// Written out: `S = &str` (serializing) has no `Default`, and the derive would ask for one.
impl<S: Default> Default for SummaryJson<S> {
    fn default() -> Self {
        SummaryJson {
            name: S::default(),
            broken: None,
            depth: 0,
            delayed: 0,
            in_flight: 0,
            in_flight_dirty: 0,
            failing: 0,
            failures: 0,
            stalled: 0,
            dead: 0,
            dead_dropped: 0,
            paused: false,
            shut_down: false,
            oldest_ready_s: None,
            longest_running_s: 0.0,
            unfinished_work_s: 0.0,
            adds_total: None,
            completions_total: None,
            retries_total: None,
            capped_at: None,
        }
    }
}

impl Serialize for QueueSummary {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let counters = self.counters.as_ref();
        SummaryJson {
            name: self.name.as_str(),
            broken: self.broken.as_deref(),
            depth: self.depth,
            delayed: self.delayed,
            in_flight: self.in_flight,
            in_flight_dirty: self.in_flight_dirty,
            failing: self.failing,
            failures: self.failures,
            stalled: self.stalled,
            dead: self.dead,
            dead_dropped: self.dead_dropped,
            paused: self.paused,
            shut_down: self.shut_down,
            oldest_ready_s: self.oldest_ready.map(|d| d.as_secs_f64()),
            longest_running_s: self.longest_lease.as_secs_f64(),
            unfinished_work_s: self.lease_age_sum.as_secs_f64(),
            adds_total: counters.map(|c| c.adds),
            completions_total: counters.map(|c| c.completions),
            retries_total: counters.map(|c| c.retries),
            capped_at: self.capped_at,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for QueueSummary {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let j = SummaryJson::<String>::deserialize(d)?;
        // Counters are all there or none: a listing writes the three or three `null`s.
        let counters = match (j.adds_total, j.completions_total, j.retries_total) {
            (Some(adds), Some(completions), Some(retries)) => {
                Some(Counters::new(adds, completions, retries))
            }
            (None, None, None) => None,
            _ => {
                return Err(D::Error::custom(
                    "adds_total, completions_total and retries_total go together",
                ));
            }
        };
        Ok(QueueSummary {
            name: j.name,
            broken: j.broken,
            depth: j.depth,
            delayed: j.delayed,
            in_flight: j.in_flight,
            in_flight_dirty: j.in_flight_dirty,
            failing: j.failing,
            failures: j.failures,
            stalled: j.stalled,
            dead: j.dead,
            dead_dropped: j.dead_dropped,
            shut_down: j.shut_down,
            paused: j.paused,
            oldest_ready: j.oldest_ready_s.map(span).transpose()?,
            longest_lease: span(j.longest_running_s)?,
            lease_age_sum: span(j.unfinished_work_s)?,
            counters,
            capped_at: j.capped_at,
        })
    }
}
