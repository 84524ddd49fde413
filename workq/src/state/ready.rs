//! The ready lanes: queued items, highest priority first, FIFO within a priority.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::compact::{SHRINK_FLOOR, oversized, shrink_target};

/// The ready items, highest priority first, FIFO within a priority.
///
/// Priority 0, the one a queue that never uses priorities sees, has a queue of its own so
/// that such queues pay one branch for priorities. When an item's priority is raised, its
/// old queue position cannot be removed in O(1); it is left behind as a *stale* reference
/// and counted in `stale`, and skipped when it comes up. A stale reference always sits
/// before any live one for the same slot in the same queue (only one reference to a slot is
/// live at a time, and it is pushed after the stale one was made), so popping skips the
/// first references of a (priority, slot) pair while its stale count is positive.
#[derive(Default)]
pub(super) struct Ready {
    /// Priority 0.
    pub(super) zero: VecDeque<u32>,
    /// Every other priority that has, or had, items.
    pub(super) others: BTreeMap<i32, VecDeque<u32>>,
    /// Stale references per (priority, slot).
    pub(super) stale: HashMap<(i32, u32), u32>,
    /// Stale references in all, the sum of `stale`'s counts.
    pub(super) stale_refs: usize,
    /// Live references, which is the number of queued items.
    pub(super) len: usize,
}

impl Ready {
    #[inline]
    pub(super) fn push(&mut self, priority: i32, slot: u32) {
        self.len += 1;
        if priority == 0 {
            self.zero.push_back(slot);
        } else {
            self.others.entry(priority).or_default().push_back(slot);
        }
    }

    /// Queues `slot` at the head of `priority`'s queue: a lease handed back unprocessed
    /// goes back where it was taken from. The ordering rule holds: no stale reference to
    /// (priority, slot) is left in that queue. The item was handed out from a queue at or
    /// below `priority` (a re-add while it was held only raises it); had that queue held a
    /// stale reference to the slot, the pop would have met it first, and a queue above it
    /// with one would have been popped before it.
    pub(super) fn push_front(&mut self, priority: i32, slot: u32) {
        debug_assert!(
            !self.stale.contains_key(&(priority, slot)),
            "a stale reference left where a lease goes back"
        );
        self.unpop(priority, slot);
    }

    /// Puts back a live reference [`pop`](Self::pop) just returned, at the head of its
    /// queue. No stale reference to the same (priority, slot) is left in that queue (they
    /// all sit before the live one, so `pop` consumed them), so the ordering rule holds.
    pub(super) fn unpop(&mut self, priority: i32, slot: u32) {
        self.len += 1;
        if priority == 0 {
            self.zero.push_front(slot);
        } else {
            self.others.entry(priority).or_default().push_front(slot);
        }
    }

    /// Records that the reference (priority, slot) is no longer live.
    pub(super) fn mark_stale(&mut self, priority: i32, slot: u32) {
        self.len -= 1;
        *self.stale.entry((priority, slot)).or_insert(0) += 1;
        self.stale_refs += 1;
        // A starved priority's queue is never popped, so its stale references would pile
        // up: drop them all once they outnumber the live ones (amortised O(1): the walk is
        // paid for by the raises that made them).
        if self.stale_refs > self.len.max(SHRINK_FLOOR / 16) {
            self.compact();
        }
    }

    /// Drops every stale reference from the queues, keeping the live ones in order, and
    /// gives back the capacity the queues and the stale map no longer need.
    pub(super) fn compact(&mut self) {
        let mut stale = std::mem::take(&mut self.stale);
        let mut keep = |priority: i32, lane: &mut VecDeque<u32>| {
            if !stale.is_empty() {
                // Stale references of a (priority, slot) come before its live one, so the
                // first ones met are the stale ones.
                lane.retain(|&slot| match stale.get_mut(&(priority, slot)) {
                    Some(count) => {
                        *count -= 1;
                        if *count == 0 {
                            stale.remove(&(priority, slot));
                        }
                        false
                    }
                    None => true,
                });
            }
            if oversized(lane.capacity(), lane.len()) {
                lane.shrink_to(shrink_target(lane.len()));
            }
        };
        keep(0, &mut self.zero);
        for (&priority, lane) in &mut self.others {
            keep(priority, lane);
        }
        self.others.retain(|_, lane| !lane.is_empty());
        debug_assert!(
            stale.is_empty(),
            "stale references not found in their queues"
        );
        self.stale = HashMap::new();
        self.stale_refs = 0;
    }

    /// Renumbers every live reference (after [`compact`](Self::compact)).
    pub(super) fn remap(&mut self, map: &[u32]) {
        debug_assert!(self.stale.is_empty());
        for slot in self
            .zero
            .iter_mut()
            .chain(self.others.values_mut().flat_map(|lane| lane.iter_mut()))
        {
            *slot = map[*slot as usize];
        }
    }

    /// Pops the next live reference.
    #[inline]
    pub(super) fn pop(&mut self) -> Option<(i32, u32)> {
        if self.len == 0 {
            return None;
        }
        loop {
            let (priority, slot) = self.pop_raw()?;
            if !self.stale.is_empty()
                && let Some(count) = self.stale.get_mut(&(priority, slot))
            {
                *count -= 1;
                if *count == 0 {
                    self.stale.remove(&(priority, slot));
                }
                self.stale_refs -= 1;
                continue;
            }
            self.len -= 1;
            if self.len == 0 && !self.stale.is_empty() {
                // Every reference left is stale: drop them now, or a queue whose items are
                // all raised before they are handed out would keep them forever.
                self.zero.clear();
                self.others.clear();
                self.stale = HashMap::new();
                self.stale_refs = 0;
            }
            return Some((priority, slot));
        }
    }

    /// Pops the next reference, live or stale: the highest priority above 0, then 0, then
    /// the highest below 0. Emptied queues are removed, so every queue in `others` has items.
    #[inline]
    pub(super) fn pop_raw(&mut self) -> Option<(i32, u32)> {
        if let Some(mut top) = self.others.last_entry()
            && (*top.key() > 0 || self.zero.is_empty())
        {
            let priority = *top.key();
            let lane = top.get_mut();
            let slot = lane.pop_front();
            if lane.is_empty() {
                top.remove();
            } else if oversized(lane.capacity(), lane.len()) {
                lane.shrink_to(shrink_target(lane.len()));
            }
            return slot.map(|slot| (priority, slot));
        }
        let slot = self.zero.pop_front();
        if oversized(self.zero.capacity(), self.zero.len()) {
            self.zero.shrink_to(shrink_target(self.zero.len()));
        }
        slot.map(|slot| (0, slot))
    }

    pub(super) fn shrink(&mut self) {
        if self.len == 0 && self.stale.is_empty() {
            self.zero = VecDeque::new();
            self.others = BTreeMap::new();
            self.stale = HashMap::new();
            self.stale_refs = 0;
        }
    }
}

/// Puts a popped reference back if dropped, which happens only when `T::clone` unwinds
/// (a successful pop forgets it).
pub(super) struct Unpop<'a> {
    pub(super) ready: &'a mut Ready,
    pub(super) priority: i32,
    pub(super) slot: u32,
}

impl Drop for Unpop<'_> {
    fn drop(&mut self) {
        self.ready.unpop(self.priority, self.slot);
    }
}
