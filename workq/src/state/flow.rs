//! Flow control: groups taking turns, concurrency limits and hand-out rates.
//!
//! Kept only by queues built with a group function, a limit or a rate (`Some` in
//! `State::flow`); every other queue pays a branch per step for it. With flow control, the ready
//! items live here instead of in the state's own lanes, in one [`Ready`] per group, and a
//! hand-out goes:
//!
//! 1. the queue-wide limit (leases out) and the queue-wide token bucket;
//! 2. the highest priority at which some group that may hand out now has live items;
//! 3. within it, the group at the front of that priority's ring (round robin, or deficit
//!    round robin when groups have weights: a group takes up to its weight of turns in a
//!    row, then goes to the back);
//! 4. that group's oldest ready item at that priority (FIFO by the time it became ready).
//!
//! A group that cannot hand out (at its limit, or waiting for a token of its own bucket)
//! leaves the rings when a hand-out meets it at a ring's front, and rejoins at the back of
//! every ring where it has items when a lease of it is done, or its token is due (then it
//! is *parked* until that time, in a heap the queue's timer serves like a delayed item). So
//! a saturated group never blocks another, and no hand-out walks the saturated groups twice.
//!
//! Rings are lazy: a group stays in a ring after its last item there was raised to another
//! priority, and is dropped when it comes up. Each lane's `in_ring` flag keeps one entry
//! per group and priority.
//!
//! Token buckets are GCRA (the "virtual scheduling" form of a token bucket): one integer,
//! the theoretical arrival time, per bucket, on the queue's clock in nanoseconds. Written
//! here rather than taken from `governor` because the state machine reads no clock (the
//! caller passes `now`) and must tell the timer when the next token is due.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

use slab::Slab;

use super::ready::Ready;
use crate::flow::{FlowLimits, HandOutRate};
use crate::stats::{FlowStats, GroupStats};

/// A hand-out rate: one token every `interval` nanoseconds, at most `burst` saved up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rate {
    /// Nanoseconds between tokens (at least 1).
    pub(crate) interval: u64,
    /// Tokens that can be saved up (at least 1).
    pub(crate) burst: u32,
}

impl Rate {
    /// `per_second` tokens a second, `burst` saved up.
    ///
    /// # Panics
    ///
    /// As [`HandOutRate::new`].
    #[cfg(test)]
    pub(crate) fn new(per_second: f64, burst: u32) -> Self {
        Self::from(HandOutRate::new(per_second, burst))
    }
}

impl From<HandOutRate> for Rate {
    fn from(rate: HandOutRate) -> Self {
        Rate {
            interval: rate.interval_nanos(),
            burst: rate.burst.max(1),
        }
    }
}

/// A token bucket as GCRA: the theoretical arrival time of the next token.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    tat: u64,
}

impl Bucket {
    /// When the next token is there.
    fn ready_at(&self, rate: Rate) -> u64 {
        self.tat
            .saturating_sub(u64::from(rate.burst - 1).saturating_mul(rate.interval))
    }

    /// Takes a token at `now` (the caller checked [`ready_at`](Self::ready_at)).
    fn take(&mut self, rate: Rate, now: u64) {
        self.tat = self.tat.max(now).saturating_add(rate.interval);
    }

    /// Whether the bucket is full at `now` (forgetting it loses nothing).
    fn is_full(&self, now: u64) -> bool {
        self.tat <= now
    }
}

/// What a queue's flow control is built with.
#[derive(Debug, Clone, Default)]
pub(crate) struct FlowConfig {
    /// Leases out at most, over all groups.
    pub(crate) max_in_flight: Option<usize>,
    /// Leases out at most per group, unless `group_limits` names the group.
    pub(crate) max_in_flight_per_group: Option<usize>,
    /// Per-group limits.
    pub(crate) group_limits: HashMap<Box<str>, usize>,
    /// Per-group weights (turns in a row); 1 for the others.
    pub(crate) group_weights: HashMap<Box<str>, u32>,
    /// The queue-wide hand-out rate.
    pub(crate) rate: Option<Rate>,
    /// Every group's hand-out rate, unless `group_rates` names the group.
    pub(crate) rate_per_group: Option<Rate>,
    /// Per-group rates.
    pub(crate) group_rates: HashMap<Box<str>, Rate>,
}

impl From<&FlowLimits> for FlowConfig {
    fn from(limits: &FlowLimits) -> Self {
        let named = |name: &String| name.clone().into_boxed_str();
        FlowConfig {
            max_in_flight: limits.max_in_flight,
            max_in_flight_per_group: limits.max_in_flight_per_group,
            group_limits: limits
                .group_max_in_flight
                .iter()
                .map(|(group, limit)| (named(group), *limit))
                .collect(),
            group_weights: limits
                .group_weights
                .iter()
                .map(|(group, weight)| (named(group), (*weight).max(1)))
                .collect(),
            rate: limits.hand_out_rate.map(Rate::from),
            rate_per_group: limits.hand_out_rate_per_group.map(Rate::from),
            group_rates: limits
                .group_hand_out_rates
                .iter()
                .map(|(group, rate)| (named(group), Rate::from(*rate)))
                .collect(),
        }
    }
}

impl FlowConfig {
    /// Whether any rate is set (the queue then needs its timer for tokens).
    pub(crate) fn has_rates(&self) -> bool {
        self.rate.is_some() || self.rate_per_group.is_some() || !self.group_rates.is_empty()
    }
}

/// One priority of one group.
#[derive(Debug, Default, Clone, Copy)]
struct Lane {
    /// The group's queued items at this priority.
    live: u32,
    /// The group has an entry in this priority's ring.
    in_ring: bool,
}

/// A group of items.
struct Group {
    name: Box<str>,
    /// Its queued items.
    ready: Ready,
    /// Per priority with items or a ring entry.
    lanes: BTreeMap<i32, Lane>,
    /// Its leases out.
    in_flight: usize,
    /// Items of the queue in this group, in any state (its id stays theirs while > 0).
    members: usize,
    limit: Option<usize>,
    weight: u32,
    /// Turns left in the current visit (deficit round robin).
    credit: u32,
    rate: Option<Rate>,
    bucket: Bucket,
    /// Waiting in the timed heap for a token.
    parked: bool,
    /// In the idle list, to be forgotten once empty with a full bucket.
    idle: bool,
}

impl Group {
    fn saturated(&self) -> bool {
        self.limit.is_some_and(|limit| self.in_flight >= limit)
    }

    fn eligible(&self) -> bool {
        !self.parked && !self.saturated()
    }
}

/// What [`Flow::choose`] found.
pub(super) enum Choice {
    /// Hand out from this group, at this priority.
    Group(u32, i32),
    /// Nothing can be handed out now. [`Flow::next_deadline`] says when that may change by
    /// itself (a token due); a done or an add may change it sooner.
    Blocked,
}

/// The flow control of one queue.
pub(crate) struct Flow {
    config: FlowConfig,
    groups: Slab<Group>,
    by_name: HashMap<Box<str>, u32, foldhash::fast::RandomState>,
    /// The group of each item slot (meaningful for slots in use).
    group_of: Vec<u32>,
    /// Per priority, the groups that may hand out there, in turn order (lazily pruned).
    rings: BTreeMap<i32, VecDeque<u32>>,
    /// The queue-wide bucket.
    bucket: Bucket,
    /// Groups parked until their next token, earliest first.
    parked: BinaryHeap<Reverse<(u64, u32)>>,
    /// A getter waits for the queue-wide token due at this time; `u64::MAX` if none.
    queue_wait: u64,
    /// Groups with no members, forgotten once their buckets are full.
    idle: VecDeque<u32>,
    /// The group the next new item joins (set by [`select`](Self::select) before each add;
    /// an ungrouped queue's items all join the group `""`).
    pending: u32,
    /// Groups at their limit.
    saturated: usize,
}

impl Flow {
    pub(crate) fn new(config: FlowConfig) -> Self {
        Self {
            config,
            groups: Slab::new(),
            by_name: HashMap::default(),
            group_of: Vec::new(),
            rings: BTreeMap::new(),
            bucket: Bucket::default(),
            parked: BinaryHeap::new(),
            queue_wait: u64::MAX,
            idle: VecDeque::new(),
            pending: 0,
            saturated: 0,
        }
    }

    /// The id of the group `name`, made if new.
    fn intern(&mut self, name: &str, now: u64) -> u32 {
        if let Some(&id) = self.by_name.get(name) {
            return id;
        }
        self.collect_idle(now);
        let limit = self
            .config
            .group_limits
            .get(name)
            .copied()
            .or(self.config.max_in_flight_per_group);
        let rate = self
            .config
            .group_rates
            .get(name)
            .copied()
            .or(self.config.rate_per_group);
        let weight = self.config.group_weights.get(name).copied().unwrap_or(1);
        let id = self.groups.insert(Group {
            name: name.into(),
            ready: Ready::default(),
            lanes: BTreeMap::new(),
            in_flight: 0,
            members: 0,
            limit,
            weight: weight.max(1),
            credit: 0,
            rate,
            bucket: Bucket::default(),
            parked: false,
            idle: false,
        }) as u32;
        self.by_name.insert(name.into(), id);
        id
    }

    /// Forgets up to a few idle groups whose buckets are full: amortised O(1) per new group,
    /// so that a queue that sees a million groups over its life keeps only the live ones.
    fn collect_idle(&mut self, now: u64) {
        for _ in 0..4 {
            let Some(id) = self.idle.pop_front() else {
                return;
            };
            let group = &mut self.groups[id as usize];
            if group.members > 0 || !group.lanes.is_empty() || group.parked {
                group.idle = false;
                continue;
            }
            if !group.bucket.is_full(now) {
                self.idle.push_back(id);
                return;
            }
            let group = self.groups.remove(id as usize);
            self.by_name.remove(&group.name);
        }
    }

    /// Sets the group the next new item joins.
    pub(crate) fn select(&mut self, name: &str, now: u64) {
        self.pending = self.intern(name, now);
    }

    /// Makes the slot of a new item a member of the pending group.
    #[inline(never)]
    pub(super) fn assign(&mut self, slot: u32) {
        let slot = slot as usize;
        if slot >= self.group_of.len() {
            self.group_of.resize((slot + 1).next_power_of_two(), 0);
        }
        self.group_of[slot] = self.pending;
        self.groups[self.pending as usize].members += 1;
    }

    /// The slot's item is forgotten by the queue.
    #[inline(never)]
    pub(super) fn release(&mut self, slot: u32) {
        let id = self.group_of[slot as usize];
        let group = &mut self.groups[id as usize];
        group.members -= 1;
        if group.members == 0 && !group.idle {
            group.idle = true;
            self.idle.push_back(id);
        }
    }

    /// Queues the item in `slot` at `priority` in its group: at the tail of its lane, or at
    /// its head if `at_head` (a lease handed back unprocessed; the group takes its turn in
    /// the ring as after any add).
    #[inline(never)]
    pub(super) fn push(&mut self, priority: i32, slot: u32, at_head: bool) {
        let id = self.group_of[slot as usize];
        let group = &mut self.groups[id as usize];
        if at_head {
            group.ready.push_front(priority, slot);
        } else {
            group.ready.push(priority, slot);
        }
        let eligible = group.eligible();
        let lane = group.lanes.entry(priority).or_default();
        lane.live += 1;
        if eligible && !lane.in_ring {
            lane.in_ring = true;
            self.rings.entry(priority).or_default().push_back(id);
        }
    }

    /// The queued item in `slot` leaves `priority` (it was raised).
    #[inline(never)]
    pub(super) fn mark_stale(&mut self, priority: i32, slot: u32) {
        let id = self.group_of[slot as usize];
        let group = &mut self.groups[id as usize];
        group.ready.mark_stale(priority, slot);
        if let Some(lane) = group.lanes.get_mut(&priority) {
            lane.live -= 1;
            if lane.live == 0 && !lane.in_ring {
                group.lanes.remove(&priority);
            }
        }
    }

    /// Finds who hands out next, pruning the rings and parking groups out of tokens on the
    /// way; takes nothing. `processing` is the queue's leases out.
    pub(super) fn choose(&mut self, now: u64, processing: usize) -> Choice {
        if self
            .config
            .max_in_flight
            .is_some_and(|max| processing >= max)
        {
            return Choice::Blocked;
        }
        if let Some(rate) = self.config.rate {
            let at = self.bucket.ready_at(rate);
            if at > now {
                self.queue_wait = self.queue_wait.min(at);
                return Choice::Blocked;
            }
        }
        let mut empty = Vec::new();
        let mut found = None;
        'priorities: for (&priority, ring) in self.rings.iter_mut().rev() {
            while let Some(&id) = ring.front() {
                let group = &mut self.groups[id as usize];
                let eligible = group.eligible();
                let lane = group
                    .lanes
                    .get_mut(&priority)
                    .expect("a ring entry has its lane");
                if lane.live == 0 || !eligible {
                    lane.in_ring = false;
                    if lane.live == 0 {
                        group.lanes.remove(&priority);
                        group.credit = 0;
                    }
                    ring.pop_front();
                    continue;
                }
                if let Some(rate) = group.rate {
                    let at = group.bucket.ready_at(rate);
                    if at > now {
                        group.parked = true;
                        lane.in_ring = false;
                        group.credit = 0;
                        ring.pop_front();
                        self.parked.push(Reverse((at, id)));
                        continue;
                    }
                }
                found = Some((id, priority));
                break 'priorities;
            }
            empty.push(priority);
        }
        for priority in empty {
            if self.rings.get(&priority).is_some_and(VecDeque::is_empty) {
                self.rings.remove(&priority);
            }
        }
        match found {
            Some((id, priority)) => Choice::Group(id, priority),
            None => Choice::Blocked,
        }
    }

    /// The ready lanes of group `id`, to pop from.
    pub(super) fn ready_of(&mut self, id: u32) -> &mut Ready {
        &mut self.groups[id as usize].ready
    }

    /// Commits a hand-out [`choose`](Self::choose) picked: tokens, the lease, the turn.
    pub(super) fn commit(&mut self, id: u32, priority: i32, now: u64) {
        if let Some(rate) = self.config.rate {
            self.bucket.take(rate, now);
        }
        let group = &mut self.groups[id as usize];
        if let Some(rate) = group.rate {
            group.bucket.take(rate, now);
        }
        group.in_flight += 1;
        if group.limit == Some(group.in_flight) {
            self.saturated += 1;
        }
        if group.credit == 0 {
            group.credit = group.weight;
        }
        group.credit -= 1;
        let eligible = group.eligible();
        let credit = group.credit;
        let lane = group
            .lanes
            .get_mut(&priority)
            .expect("the chosen lane exists");
        lane.live -= 1;
        let ring = self
            .rings
            .get_mut(&priority)
            .expect("the chosen ring exists");
        debug_assert_eq!(ring.front(), Some(&id));
        if lane.live == 0 {
            ring.pop_front();
            group.lanes.remove(&priority);
            group.credit = 0;
        } else if credit == 0 || !eligible {
            ring.pop_front();
            if eligible {
                ring.push_back(id);
            } else {
                lane.in_ring = false;
                group.credit = 0;
            }
        }
        if ring.is_empty() {
            self.rings.remove(&priority);
        }
    }

    /// The lease of the item in `slot` is done: its group may hand out again.
    #[inline(never)]
    pub(super) fn done(&mut self, slot: u32) {
        let id = self.group_of[slot as usize];
        let group = &mut self.groups[id as usize];
        let was_saturated = group.saturated();
        group.in_flight -= 1;
        if was_saturated && !group.saturated() {
            self.saturated -= 1;
            if !group.parked {
                self.rejoin(id);
            }
        }
    }

    /// Puts an eligible group back at the back of every ring where it has items.
    fn rejoin(&mut self, id: u32) {
        let group = &mut self.groups[id as usize];
        group.credit = 0;
        for (&priority, lane) in &mut group.lanes {
            if lane.live > 0 && !lane.in_ring {
                lane.in_ring = true;
                self.rings.entry(priority).or_default().push_back(id);
            }
        }
    }

    /// Unparks every group whose token is due at `now`, and ends a queue-wide token wait
    /// that is due. Returns how many getters may now hand out.
    #[inline(never)]
    pub(super) fn unpark(&mut self, now: u64) -> usize {
        let mut woken = 0;
        if self.queue_wait <= now {
            self.queue_wait = u64::MAX;
            woken += 1;
        }
        while let Some(&Reverse((at, id))) = self.parked.peek() {
            if at > now {
                break;
            }
            self.parked.pop();
            let group = &mut self.groups[id as usize];
            group.parked = false;
            if !group.saturated() {
                self.rejoin(id);
                woken += 1;
            }
        }
        woken
    }

    /// The earliest time [`unpark`](Self::unpark) has something to do.
    pub(super) fn next_deadline(&self) -> Option<u64> {
        let parked = self.parked.peek().map(|Reverse((at, _))| *at);
        let queue = (self.queue_wait != u64::MAX).then_some(self.queue_wait);
        match (parked, queue) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Groups with queued items, at their limit, and known. A walk over the groups.
    pub(crate) fn stats(&self) -> FlowStats {
        FlowStats {
            groups_ready: self
                .groups
                .iter()
                .filter(|(_, group)| group.ready.len > 0)
                .count(),
            groups_saturated: self.saturated,
            groups: self.groups.len(),
        }
    }

    /// The `top` groups with the most queued items (then the most in flight), by name.
    pub(crate) fn top_groups(&self, top: usize) -> Vec<GroupStats> {
        let mut figures: Vec<GroupStats> = self
            .groups
            .iter()
            .filter(|(_, group)| group.ready.len > 0 || group.in_flight > 0)
            .map(|(_, group)| {
                GroupStats::new(
                    group.name.to_string(),
                    group.ready.len,
                    group.in_flight,
                    group.limit,
                )
            })
            .collect();
        figures.sort_by(|a, b| {
            (b.ready, b.in_flight)
                .cmp(&(a.ready, a.in_flight))
                .then_with(|| a.name.cmp(&b.name))
        });
        figures.truncate(top);
        figures
    }

    /// Renumbers the item slots (`map[old] = new`, `u32::MAX` for none) after a compaction.
    pub(super) fn remap(&mut self, map: &[u32], capacity: usize) {
        let mut group_of = vec![0; capacity.next_power_of_two()];
        for (old, &new) in map.iter().enumerate() {
            if new != u32::MAX && old < self.group_of.len() {
                group_of[new as usize] = self.group_of[old];
            }
        }
        self.group_of = group_of;
        for (_, group) in &mut self.groups {
            group.ready.compact();
            group.ready.remap(map);
        }
    }

    /// Gives memory back once the queue holds nothing.
    pub(super) fn shrink(&mut self) {
        self.group_of = Vec::new();
        for (_, group) in &mut self.groups {
            group.ready.shrink();
        }
    }

    /// Checks the invariants; for tests.
    #[cfg(test)]
    pub(super) fn check(&self, processing_of: impl Fn(u32) -> usize) {
        let mut saturated = 0;
        for (id, group) in &self.groups {
            let live: u32 = group.lanes.values().map(|lane| lane.live).sum();
            assert_eq!(live as usize, group.ready.len, "group {id}'s lanes");
            assert_eq!(
                group.in_flight,
                processing_of(id as u32),
                "group {id}'s leases"
            );
            if let Some(limit) = group.limit {
                assert!(group.in_flight <= limit, "group {id} over its limit");
            }
            saturated += usize::from(group.saturated());
            for (&priority, lane) in &group.lanes {
                let entries = self
                    .rings
                    .get(&priority)
                    .map_or(0, |ring| ring.iter().filter(|&&g| g == id as u32).count());
                assert_eq!(
                    entries,
                    usize::from(lane.in_ring),
                    "group {id} in ring {priority}"
                );
                if lane.live > 0 && group.eligible() {
                    assert!(
                        lane.in_ring,
                        "eligible group {id} missing from ring {priority}"
                    );
                }
            }
        }
        assert_eq!(saturated, self.saturated);
    }

    /// The group of the item in `slot`.
    #[cfg(test)]
    pub(super) fn group_of(&self, slot: u32) -> u32 {
        self.group_of[slot as usize]
    }
}
