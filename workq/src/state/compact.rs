//! Giving memory back after a burst: shrinking and renumbering the slots, with hysteresis.

use hashbrown::HashTable;
use slab::Slab;

use super::stamps::{Times, UNSET};
use super::{PROCESSING, State, index_of};

/// Below this capacity (in items) nothing is shrunk: small queues keep what they have.
pub(super) const SHRINK_FLOOR: usize = 1024;

/// Whether a container of `capacity` holding `live` items should give memory back: more
/// than four times what it holds, above the floor. Shrinking to [`shrink_target`] (twice
/// what it holds) leaves a factor of two either way before the next grow or shrink, so a
/// queue that hovers at one size never thrashes, and each shrink's O(n) copy is paid for by
/// the n removals that made it due (amortised O(1) per call).
#[inline]
pub(super) fn oversized(capacity: usize, live: usize) -> bool {
    capacity > 4 * live.max(SHRINK_FLOOR)
}

/// The capacity to shrink to: see [`oversized`].
#[inline]
pub(super) fn shrink_target(live: usize) -> usize {
    (2 * live).max(SHRINK_FLOOR)
}

impl<T, S> State<T, S> {
    /// Gives a burst's memory back while the queue still holds items: moves every entry
    /// that is not being processed to the lowest free slots (a lease holds its slot, so
    /// those stay), rebuilds the index, renumbers the heap, the ready queues (dropping
    /// their stale references) and the timestamps, and shrinks them all. O(slots), run
    /// only once the slab is [`oversized`], so amortised O(1) per removal.
    ///
    /// A lease on an item in a high slot keeps the slab at least that long: if that leaves
    /// less than half to give back, nothing moves and the next attempt waits until that lease
    /// is done (`pinned`). Leases out at a renumbering are few (one per
    /// worker), so a burst pays at most that many extra scans.
    pub(super) fn renumber(&mut self) {
        let fixed: Vec<u32> = self
            .entries
            .iter()
            .filter(|(_, entry)| entry.flags & PROCESSING != 0)
            .map(|(slot, _)| slot as u32)
            .collect();
        let reachable = fixed
            .last()
            .map_or(0, |&slot| slot as usize + 1)
            .max(self.entries.len());
        if reachable.saturating_mul(2) > self.entries.capacity() {
            self.pinned = fixed.last().copied();
            return;
        }
        let old = std::mem::take(&mut self.entries);
        let mut map = vec![u32::MAX; old.capacity()];
        let mut next = 0u32;
        let mut fixed_at = 0;
        let mut moved = Vec::with_capacity(old.len());
        for (slot, entry) in old {
            let new = if entry.flags & PROCESSING != 0 {
                slot as u32
            } else {
                // The lowest slot no lease holds. Slots come in increasing order, so `new`
                // never passes `slot`.
                while fixed_at < fixed.len() && fixed[fixed_at] <= next {
                    if fixed[fixed_at] == next {
                        next += 1;
                    }
                    fixed_at += 1;
                }
                next += 1;
                next - 1
            };
            map[slot] = new;
            moved.push((new as usize, entry));
        }
        self.entries = moved.into_iter().collect();
        self.entries.shrink_to_fit();
        let live = self.entries.len();
        self.index = index_of(&mut self.entries, live);
        for node in &mut self.heap {
            node.slot = map[node.slot as usize];
        }
        if oversized(self.heap.capacity(), self.heap.len()) {
            self.heap.shrink_to(shrink_target(self.heap.len()));
        }
        self.ready.compact();
        self.ready.remap(&map);
        if let Some(flow) = &mut self.flow {
            flow.remap(&map, self.entries.capacity());
        }
        if let Some(times) = &mut self.times {
            let size = self.entries.capacity().next_power_of_two();
            let mut added = vec![UNSET; size.min(times.added.len())];
            for (old_slot, &at) in times.added.iter().enumerate() {
                let new = map.get(old_slot).copied().unwrap_or(u32::MAX);
                if at != UNSET && new != u32::MAX {
                    added[new as usize] = at;
                }
            }
            times.added = added;
            times.started.truncate(size);
            times.started.shrink_to_fit();
        }
        if oversized(self.entries.capacity(), self.entries.len()) {
            self.pinned = fixed.last().copied();
        }
    }

    /// Gives memory back once the queue holds nothing, so a burst does not pin its peak.
    pub(super) fn maybe_shrink(&mut self) {
        const KEEP: usize = 1024;
        if self.entries.is_empty() && self.entries.capacity() > KEEP {
            self.entries = Slab::new();
            self.index = HashTable::new();
            self.heap = Vec::new();
            self.ready.shrink();
            if let Some(flow) = &mut self.flow {
                flow.shrink();
            }
            if let Some(times) = &mut self.times {
                **times = Times::default();
            }
        }
    }
}
