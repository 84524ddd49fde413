//! Flow control settings every backend shares: the group function and the limits
//! ([`FlowControl`]), and the limits alone as operators see them ([`FlowLimits`]).
//!
//! The in-memory [`Builder`](crate::Builder) and each backend's builder take the same
//! methods (`group_by`, `group_weight`, `max_in_flight`, `max_in_flight_per_group`,
//! `group_max_in_flight`, `hand_out_rate`, `hand_out_rate_per_group`, `group_hand_out_rate`)
//! and keep them in a [`FlowControl`], so that a setting means the same on every backend and
//! is checked in one place. What each does is described on the in-memory
//! [`Builder::group_by`](crate::Builder::group_by) and the methods after it.
//!
//! A backend shared by many processes keeps the [`FlowLimits`] beside the queue, so that
//! every process, and an operator's view ([`admin::Stats::limits`](crate::admin::Stats)),
//! reads the same ones; the group function runs in each process at each add, and the group's
//! name travels with the item.
//!
//! # Examples
//!
//! ```
//! use workq::flow::{FlowControl, HandOutRate};
//!
//! let flow: FlowControl<String> = FlowControl::new()
//!     .group_by(|key: &String| key.split_once('/').map_or("", |(ns, _)| ns).to_owned())
//!     .max_in_flight_per_group(2)
//!     .group_max_in_flight("kube-system", 8)
//!     .hand_out_rate(50.0, 10);
//! assert_eq!(flow.group_of(&"default/web-0".to_owned()).as_deref(), Some("default"));
//! let limits = flow.limits();
//! assert_eq!(limits.limit_of("default"), Some(2));
//! assert_eq!(limits.limit_of("kube-system"), Some(8));
//! assert_eq!(limits.hand_out_rate, Some(HandOutRate::new(50.0, 10)));
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A hand-out rate: `per_second` tokens a second, at most `burst` saved up.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct HandOutRate {
    /// Tokens a second (a positive finite number).
    pub per_second: f64,
    /// Tokens that can be saved up (at least 1).
    pub burst: u32,
}

impl HandOutRate {
    /// `per_second` tokens a second, `burst` saved up.
    ///
    /// # Panics
    ///
    /// If `per_second` is not a positive finite number, or `burst` is 0.
    pub fn new(per_second: f64, burst: u32) -> Self {
        assert!(
            per_second.is_finite() && per_second > 0.0,
            "workq: a hand-out rate must be a positive number of items per second, not {per_second}"
        );
        assert!(
            burst > 0,
            "workq: a hand-out rate needs a burst of at least 1"
        );
        HandOutRate { per_second, burst }
    }

    /// The time between two tokens, in nanoseconds: at least 1, at most `u64::MAX` (a rate
    /// so low that it rounds to more is one token in about 584 years).
    pub fn interval_nanos(&self) -> u64 {
        // `as` saturates a float too large for the integer.
        (1e9 / self.per_second).round().max(1.0) as u64
    }

    /// The time between two tokens.
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval_nanos())
    }
}

impl fmt::Display for HandOutRate {
    /// `50/s, burst 10`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s, burst {}", self.per_second, self.burst)
    }
}

/// How many per-group settings [`FlowLimits::described`] names in one line before it says
/// how many more there are.
const DESCRIBED_GROUPS: usize = 10;

/// The per-group settings `map` as `a: x; b: y`, at most [`DESCRIBED_GROUPS`] of them, then
/// `and N more`.
fn per_group<V: fmt::Display>(map: &BTreeMap<String, V>) -> String {
    let mut parts: Vec<String> = map
        .iter()
        .take(DESCRIBED_GROUPS)
        .map(|(group, value)| format!("{group}: {value}"))
        .collect();
    if map.len() > DESCRIBED_GROUPS {
        parts.push(format!("and {} more", map.len() - DESCRIBED_GROUPS));
    }
    parts.join("; ")
}

/// A queue-wide setting `all` with its per-group exceptions `own`, in words: `4 (big: 10)`,
/// `big: 10 (the others: none)`, `4`.
fn with_exceptions<V: fmt::Display>(all: Option<String>, own: &BTreeMap<String, V>) -> String {
    match (all, own.is_empty()) {
        (Some(all), true) => all,
        (Some(all), false) => format!("{all} ({})", per_group(own)),
        (None, _) => format!("{} (the others: none)", per_group(own)),
    }
}

/// The limits of a queue's flow control, without its group function: what a backend keeps
/// beside the queue for every process, and what an operator's view shows.
///
/// The maps are ordered by group name so that two processes built alike write the same
/// limits, and a listing reads the same way each time.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct FlowLimits {
    /// Whether the queue groups its items (a group function was given).
    #[cfg_attr(feature = "serde", serde(default))]
    pub grouped: bool,
    /// Leases out at most over the whole queue.
    #[cfg_attr(feature = "serde", serde(default))]
    pub max_in_flight: Option<usize>,
    /// Leases out at most per group, unless [`group_max_in_flight`](Self::group_max_in_flight)
    /// names the group.
    #[cfg_attr(feature = "serde", serde(default))]
    pub max_in_flight_per_group: Option<usize>,
    /// Per-group in-flight limits.
    #[cfg_attr(feature = "serde", serde(default))]
    pub group_max_in_flight: BTreeMap<String, usize>,
    /// Per-group weights (turns in a row); 1 for the groups not named.
    #[cfg_attr(feature = "serde", serde(default))]
    pub group_weights: BTreeMap<String, u32>,
    /// The queue-wide hand-out rate.
    #[cfg_attr(feature = "serde", serde(default))]
    pub hand_out_rate: Option<HandOutRate>,
    /// Every group's hand-out rate, unless [`group_hand_out_rates`](Self::group_hand_out_rates)
    /// names the group.
    #[cfg_attr(feature = "serde", serde(default))]
    pub hand_out_rate_per_group: Option<HandOutRate>,
    /// Per-group hand-out rates.
    #[cfg_attr(feature = "serde", serde(default))]
    pub group_hand_out_rates: BTreeMap<String, HandOutRate>,
}

impl FlowLimits {
    /// Whether no flow control is set at all: no groups, no limit, no rate. Such a queue
    /// behaves, and performs, as one built without any of it.
    pub fn is_empty(&self) -> bool {
        !self.grouped
            && self.max_in_flight.is_none()
            && self.max_in_flight_per_group.is_none()
            && self.group_max_in_flight.is_empty()
            && !self.has_rates()
    }

    /// Whether any hand-out rate is set.
    pub fn has_rates(&self) -> bool {
        self.hand_out_rate.is_some()
            || self.hand_out_rate_per_group.is_some()
            || !self.group_hand_out_rates.is_empty()
    }

    /// The in-flight limit of `group`: its own, else the per-group one.
    pub fn limit_of(&self, group: &str) -> Option<usize> {
        self.group_max_in_flight
            .get(group)
            .copied()
            .or(self.max_in_flight_per_group)
    }

    /// The weight of `group` (turns in a row): its own, else 1.
    pub fn weight_of(&self, group: &str) -> u32 {
        self.group_weights.get(group).copied().unwrap_or(1).max(1)
    }

    /// The hand-out rate of `group`: its own, else the per-group one.
    pub fn rate_of(&self, group: &str) -> Option<HandOutRate> {
        self.group_hand_out_rates
            .get(group)
            .copied()
            .or(self.hand_out_rate_per_group)
    }

    /// The limits in words, one `(what, setting)` line per setting that is set, as
    /// operators read them (`wq queue stats`, the dashboard): at most ten named groups per
    /// line, then how many more. Empty for [`is_empty`](Self::is_empty) limits.
    ///
    /// # Examples
    ///
    /// ```
    /// use workq::flow::FlowControl;
    ///
    /// let flow: FlowControl<String> = FlowControl::new()
    ///     .group_by(|key: &String| key.clone())
    ///     .max_in_flight_per_group(2)
    ///     .group_max_in_flight("kube-system", 8)
    ///     .hand_out_rate(50.0, 10);
    /// assert_eq!(
    ///     flow.limits().described(),
    ///     [
    ///         ("groups", "by the queue's group function, taking turns".to_owned()),
    ///         ("in flight per group", "at most 2 (kube-system: 8)".to_owned()),
    ///         ("hand-out rate", "50/s, burst 10".to_owned()),
    ///     ]
    /// );
    /// ```
    pub fn described(&self) -> Vec<(&'static str, String)> {
        let mut lines = Vec::new();
        if self.grouped {
            lines.push((
                "groups",
                "by the queue's group function, taking turns".to_owned(),
            ));
        }
        if let Some(n) = self.max_in_flight {
            lines.push(("in flight", format!("at most {n} over the queue")));
        }
        if self.max_in_flight_per_group.is_some() || !self.group_max_in_flight.is_empty() {
            let all = self.max_in_flight_per_group.map(|n| format!("at most {n}"));
            lines.push((
                "in flight per group",
                with_exceptions(all, &self.group_max_in_flight),
            ));
        }
        if !self.group_weights.is_empty() {
            lines.push((
                "weights",
                format!("{} (the others: 1)", per_group(&self.group_weights)),
            ));
        }
        if let Some(rate) = self.hand_out_rate {
            lines.push(("hand-out rate", rate.to_string()));
        }
        if self.hand_out_rate_per_group.is_some() || !self.group_hand_out_rates.is_empty() {
            let all = self.hand_out_rate_per_group.map(|r| r.to_string());
            lines.push((
                "hand-out rate per group",
                with_exceptions(all, &self.group_hand_out_rates),
            ));
        }
        lines
    }
}

/// The group function of a queue: an item's group, computed once per add.
pub type GroupFn<T> = Arc<dyn Fn(&T) -> String + Send + Sync>;

/// A queue's flow control: its group function and its [`FlowLimits`]. Every backend's
/// builder keeps one and forwards its flow methods to it.
///
/// The setters panic on a setting that could never hand anything out (a limit of 0, a rate
/// that is not a positive finite number, a burst of 0), as the in-memory builder's do.
#[must_use]
pub struct FlowControl<T> {
    group: Option<GroupFn<T>>,
    limits: FlowLimits,
}

impl<T> Default for FlowControl<T> {
    fn default() -> Self {
        FlowControl {
            group: None,
            limits: FlowLimits::default(),
        }
    }
}

impl<T> Clone for FlowControl<T> {
    fn clone(&self) -> Self {
        FlowControl {
            group: self.group.clone(),
            limits: self.limits.clone(),
        }
    }
}

impl<T> fmt::Debug for FlowControl<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlowControl")
            .field("group_by", &self.group.is_some())
            .field("limits", &self.limits)
            .finish()
    }
}

impl<T> FlowControl<T> {
    /// No flow control.
    pub fn new() -> Self {
        Self::default()
    }

    /// Groups items by `group` ([`Builder::group_by`](crate::Builder::group_by)). It must
    /// give the same group for equal items, in every process.
    pub fn group_by<G: Into<String>>(
        mut self,
        group: impl Fn(&T) -> G + Send + Sync + 'static,
    ) -> Self {
        self.group = Some(Arc::new(move |item| group(item).into()));
        self.limits.grouped = true;
        self
    }

    /// `weight` turns in a row for `group` ([`Builder::group_weight`](crate::Builder::group_weight));
    /// weight 0 counts as 1.
    pub fn group_weight(mut self, group: impl Into<String>, weight: u32) -> Self {
        self.limits
            .group_weights
            .insert(group.into(), weight.max(1));
        self
    }

    /// At most `limit` leases out over the queue
    /// ([`Builder::max_in_flight`](crate::Builder::max_in_flight)).
    ///
    /// # Panics
    ///
    /// If `limit` is 0.
    pub fn max_in_flight(mut self, limit: usize) -> Self {
        assert!(limit > 0, "workq: max_in_flight must be at least 1");
        self.limits.max_in_flight = Some(limit);
        self
    }

    /// At most `limit` leases out per group
    /// ([`Builder::max_in_flight_per_group`](crate::Builder::max_in_flight_per_group)).
    ///
    /// # Panics
    ///
    /// If `limit` is 0.
    pub fn max_in_flight_per_group(mut self, limit: usize) -> Self {
        assert!(
            limit > 0,
            "workq: max_in_flight_per_group must be at least 1"
        );
        self.limits.max_in_flight_per_group = Some(limit);
        self
    }

    /// `group`'s own in-flight limit
    /// ([`Builder::group_max_in_flight`](crate::Builder::group_max_in_flight)).
    ///
    /// # Panics
    ///
    /// If `limit` is 0.
    pub fn group_max_in_flight(mut self, group: impl Into<String>, limit: usize) -> Self {
        assert!(
            limit > 0,
            "workq: a group's max_in_flight must be at least 1"
        );
        self.limits.group_max_in_flight.insert(group.into(), limit);
        self
    }

    /// The queue-wide hand-out rate ([`Builder::hand_out_rate`](crate::Builder::hand_out_rate)).
    ///
    /// # Panics
    ///
    /// As [`HandOutRate::new`].
    pub fn hand_out_rate(mut self, per_second: f64, burst: u32) -> Self {
        self.limits.hand_out_rate = Some(HandOutRate::new(per_second, burst));
        self
    }

    /// Every group's hand-out rate
    /// ([`Builder::hand_out_rate_per_group`](crate::Builder::hand_out_rate_per_group)).
    ///
    /// # Panics
    ///
    /// As [`HandOutRate::new`].
    pub fn hand_out_rate_per_group(mut self, per_second: f64, burst: u32) -> Self {
        self.limits.hand_out_rate_per_group = Some(HandOutRate::new(per_second, burst));
        self
    }

    /// `group`'s own hand-out rate
    /// ([`Builder::group_hand_out_rate`](crate::Builder::group_hand_out_rate)).
    ///
    /// # Panics
    ///
    /// As [`HandOutRate::new`].
    pub fn group_hand_out_rate(
        mut self,
        group: impl Into<String>,
        per_second: f64,
        burst: u32,
    ) -> Self {
        self.limits
            .group_hand_out_rates
            .insert(group.into(), HandOutRate::new(per_second, burst));
        self
    }

    /// The group of `item`, if the queue groups its items.
    pub fn group_of(&self, item: &T) -> Option<String> {
        self.group.as_ref().map(|group| group(item))
    }

    /// The group function, if any.
    pub fn group_fn(&self) -> Option<&GroupFn<T>> {
        self.group.as_ref()
    }

    /// The limits.
    pub fn limits(&self) -> &FlowLimits {
        &self.limits
    }

    /// Whether any flow control is set ([`FlowLimits::is_empty`] is not).
    pub fn is_active(&self) -> bool {
        !self.limits.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_setting_overrides_the_per_group_one() {
        let flow: FlowControl<u32> = FlowControl::new()
            .max_in_flight_per_group(2)
            .group_max_in_flight("big", 5)
            .hand_out_rate_per_group(10.0, 1)
            .group_hand_out_rate("slow", 1.0, 1)
            .group_weight("heavy", 3)
            .group_weight("zero", 0);
        let limits = flow.limits();
        assert_eq!(
            (limits.limit_of("big"), limits.limit_of("x")),
            (Some(5), Some(2))
        );
        assert_eq!(limits.rate_of("slow"), Some(HandOutRate::new(1.0, 1)));
        assert_eq!(limits.rate_of("x"), Some(HandOutRate::new(10.0, 1)));
        assert_eq!(
            (
                limits.weight_of("heavy"),
                limits.weight_of("zero"),
                limits.weight_of("x")
            ),
            (3, 1, 1)
        );
        assert!(flow.is_active() && !limits.grouped);
    }

    #[test]
    fn limits_are_described_one_line_per_setting_with_their_exceptions() {
        let mut flow: FlowControl<u32> = FlowControl::new()
            .max_in_flight(100)
            .group_max_in_flight("big", 5)
            .hand_out_rate_per_group(10.0, 1)
            .group_hand_out_rate("slow", 0.5, 2)
            .group_weight("heavy", 3);
        assert_eq!(
            flow.limits().described(),
            [
                ("in flight", "at most 100 over the queue".to_owned()),
                (
                    "in flight per group",
                    "big: 5 (the others: none)".to_owned()
                ),
                ("weights", "heavy: 3 (the others: 1)".to_owned()),
                (
                    "hand-out rate per group",
                    "10/s, burst 1 (slow: 0.5/s, burst 2)".to_owned()
                ),
            ]
        );
        // Many named groups: ten, then how many more.
        for g in 0..12 {
            flow = flow.group_weight(format!("g{g:02}"), 2);
        }
        let weights = flow.limits().described()[2].1.clone();
        assert!(
            weights.starts_with("g00: 2; g01: 2;")
                && weights.ends_with("g09: 2; and 3 more (the others: 1)"),
            "{weights}"
        );
        assert!(FlowLimits::default().described().is_empty());
    }

    #[test]
    fn nothing_set_is_no_flow_control() {
        let flow: FlowControl<u32> = FlowControl::new();
        assert!(!flow.is_active());
        assert_eq!(flow.group_of(&1), None);
        assert!(flow.group_by(|n: &u32| (n % 2).to_string()).is_active());
    }

    #[test]
    fn intervals_saturate_instead_of_overflowing() {
        assert_eq!(HandOutRate::new(1e12, 1).interval_nanos(), 1);
        assert_eq!(HandOutRate::new(1e-30, 1).interval_nanos(), u64::MAX);
        assert_eq!(
            HandOutRate::new(4.0, 1).interval(),
            Duration::from_millis(250)
        );
    }

    #[test]
    #[should_panic(expected = "positive number")]
    fn a_rate_of_zero_is_refused() {
        let _ = HandOutRate::new(0.0, 1);
    }

    #[test]
    #[should_panic(expected = "at least 1")]
    fn a_limit_of_zero_is_refused() {
        let _ = FlowControl::<u32>::new().max_in_flight_per_group(0);
    }
}
