//! The rules of the queue as a plain state machine: no locks, no threads, no clock reads.
//!
//! This is client-go's `dirty` / `processing` / queue logic (`queue.go`) fused with the
//! delaying queue's waiting heap (`delaying_queue.go`) and controller-runtime's priorities.
//! Callers pass the time in (`now`, nanoseconds since the queue's epoch), so every rule can
//! be tested in microseconds and checked against a naive model.
//!
//! Each item is stored once, in a slab entry. A hash table maps the item to its slot; the
//! ready queues and the delay heap hold slot numbers only. The states of an item:
//!
//! | state | flags | on add | on add_after | on get | on done |
//! | --- | --- | --- | --- | --- | --- |
//! | absent | (no entry) | -> queued | -> delayed | | |
//! | queued | `QUEUED` | no-op | no-op | -> processing | |
//! | delayed | heap slot | -> queued | earliest wins | | |
//! | processing | `PROCESSING` | -> + dirty | -> + delayed | | -> absent |
//! | processing + dirty | `PROCESSING \| DIRTY` | no-op | no-op | | -> queued (tail) |
//! | processing + delayed | `PROCESSING` + heap slot | -> + dirty, heap entry dropped | earliest wins | | -> delayed |
//!
//! A delayed entry that comes due moves to queued, or to processing + dirty if the item is
//! being processed.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, Hash};

use hashbrown::HashTable;
use hashbrown::hash_table::Entry as TableEntry;
use slab::Slab;

/// Marks "not in the heap" in [`Entry::heap_pos`].
const NOT_IN_HEAP: u32 = u32::MAX;

/// The item waits in a ready queue.
const QUEUED: u8 = 1;
/// A lease on the item is out.
const PROCESSING: u8 = 2;
/// Re-added while processing: queue it again when the lease is dropped.
const DIRTY: u8 = 4;
/// While processing: a re-add gave a priority ([`Entry::priority`] holds the highest).
const PRIORITY_GIVEN: u8 = 8;

/// One item known to the queue.
struct Entry<T> {
    /// The item itself, the only copy the queue keeps.
    item: T,
    /// Index of this entry's node in the delay heap, or [`NOT_IN_HEAP`].
    heap_pos: u32,
    /// Queued or delayed: the item's priority. Processing: the priority a re-add asked for
    /// (meaningful when [`PRIORITY_GIVEN`] is set, 0 otherwise).
    priority: i32,
    /// The item's hash ([`item_hash`]), so that growing and shrinking the index and removing
    /// the entry never read the item again. It fits in padding the entry has anyway.
    hash: u32,
    /// [`QUEUED`], [`PROCESSING`], [`DIRTY`], [`PRIORITY_GIVEN`].
    flags: u8,
}

/// Hashes an item for the queue's index: 32 bits, folded from the hasher's 64, so that an
/// entry can keep it in its padding. Callers hash before taking the queue's lock.
#[inline]
pub(crate) fn item_hash<T: Hash, S: BuildHasher>(hasher: &S, item: &T) -> u32 {
    let full = hasher.hash_one(item);
    (full ^ (full >> 32)) as u32
}

/// The 64-bit hash the index probes with, rebuilt from an entry's 32: the low bits pick the
/// bucket and the top seven are hashbrown's tag, so both come from the stored bits.
#[inline]
fn table_hash(hash: u32) -> u64 {
    let hash = u64::from(hash);
    hash | (hash << 32)
}

/// A node of the delay heap.
#[derive(Clone, Copy, Debug)]
struct Node {
    /// When the item becomes ready, in nanoseconds since the queue's epoch.
    at: u64,
    /// Add order, to release items due at the same instant in the order they were added.
    /// Wraps after 2^32 delayed adds; only ties at one nanosecond compare it.
    seq: u32,
    /// The entry's slot.
    slot: u32,
}

impl Node {
    #[inline]
    fn before(&self, other: &Node) -> bool {
        (self.at, self.seq) < (other.at, other.seq)
    }
}

/// Below this capacity (in items) nothing is shrunk: small queues keep what they have.
const SHRINK_FLOOR: usize = 1024;

/// Whether a container of `capacity` holding `live` items should give memory back: more
/// than four times what it holds, above the floor. Shrinking to [`shrink_target`] (twice
/// what it holds) leaves a factor of two either way before the next grow or shrink, so a
/// queue that hovers at one size never thrashes, and each shrink's O(n) copy is paid for by
/// the n removals that made it due (amortised O(1) per call).
#[inline]
fn oversized(capacity: usize, live: usize) -> bool {
    capacity > 4 * live.max(SHRINK_FLOOR)
}

/// The capacity to shrink to: see [`oversized`].
#[inline]
fn shrink_target(live: usize) -> usize {
    (2 * live).max(SHRINK_FLOOR)
}

/// Arity of the delay heap: a 4-ary heap is shallower than a binary one, and its four
/// children share a cache line (see PEERS.md's timer study).
const ARITY: usize = 4;

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
struct Ready {
    /// Priority 0.
    zero: VecDeque<u32>,
    /// Every other priority that has, or had, items.
    others: BTreeMap<i32, VecDeque<u32>>,
    /// Stale references per (priority, slot).
    stale: HashMap<(i32, u32), u32>,
    /// Stale references in all, the sum of `stale`'s counts.
    stale_refs: usize,
    /// Live references, which is the number of queued items.
    len: usize,
}

impl Ready {
    #[inline]
    fn push(&mut self, priority: i32, slot: u32) {
        self.len += 1;
        if priority == 0 {
            self.zero.push_back(slot);
        } else {
            self.others.entry(priority).or_default().push_back(slot);
        }
    }

    /// Puts back a live reference [`pop`](Self::pop) just returned, at the head of its
    /// queue. No stale reference to the same (priority, slot) is left in that queue (they
    /// all sit before the live one, so `pop` consumed them), so the ordering rule holds.
    fn unpop(&mut self, priority: i32, slot: u32) {
        self.len += 1;
        if priority == 0 {
            self.zero.push_front(slot);
        } else {
            self.others.entry(priority).or_default().push_front(slot);
        }
    }

    /// Records that the reference (priority, slot) is no longer live.
    fn mark_stale(&mut self, priority: i32, slot: u32) {
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
    fn compact(&mut self) {
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
    fn remap(&mut self, map: &[u32]) {
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
    fn pop(&mut self) -> Option<(i32, u32)> {
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
    fn pop_raw(&mut self) -> Option<(i32, u32)> {
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

    fn shrink(&mut self) {
        if self.len == 0 && self.stale.is_empty() {
            self.zero = VecDeque::new();
            self.others = BTreeMap::new();
            self.stale = HashMap::new();
            self.stale_refs = 0;
        }
    }
}

/// What an add did, so the caller knows whom to wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Added {
    /// The item became ready to hand out (a getter may be woken).
    pub(crate) ready: bool,
    /// The item is now in the delay heap at the head: the timer must re-arm.
    pub(crate) new_head: bool,
    /// The item became dirty (queued, or marked to be queued again while processing) from
    /// neither: client-go's metrics count this as an add.
    pub(crate) counted: bool,
}

/// What a promotion of due delayed items did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Promoted {
    /// Items that became ready to hand out.
    pub(crate) ready: usize,
    /// Items that became dirty (ready, or re-queued when their lease drops).
    pub(crate) counted: usize,
}

/// What [`State::done`] did.
#[derive(Debug)]
pub(crate) struct Done<T> {
    /// The item was queued again because it was re-added while processing.
    pub(crate) requeued: bool,
    /// How long the item was processed (only with timestamps on).
    pub(crate) worked_for: Option<u64>,
    /// The queue's copy of the item, if the queue no longer tracks it: the caller drops it
    /// after releasing the lock.
    pub(crate) removed: Option<T>,
}

/// Per-slot timestamps for metrics, kept only for queues that report metrics.
#[derive(Debug, Default)]
struct Times {
    /// When the item in a slot last became dirty; [`UNSET`] after it is handed out.
    added: Vec<u64>,
    /// When the item in a slot was handed out; [`UNSET`] when it is not processing.
    started: Vec<u64>,
}

/// Marks an empty timestamp.
const UNSET: u64 = u64::MAX;

impl Times {
    fn slot(vec: &mut Vec<u64>, slot: u32) -> &mut u64 {
        let slot = slot as usize;
        if slot >= vec.len() {
            vec.resize((slot + 1).next_power_of_two(), UNSET);
        }
        &mut vec[slot]
    }

    fn mark_added(&mut self, slot: u32, at: u64) {
        let added = Self::slot(&mut self.added, slot);
        if *added == UNSET {
            *added = at;
        }
    }
}

/// An item handed out by [`State::pop`].
#[derive(Debug)]
pub(crate) struct Popped<T> {
    /// The entry's slot; stays reserved until [`State::done`].
    pub(crate) slot: u32,
    /// A clone of the item.
    pub(crate) item: T,
    /// The priority the item was queued with.
    pub(crate) priority: i32,
    /// How long the item waited since it became dirty (only with timestamps on).
    pub(crate) queued_for: Option<u64>,
}

/// The queue's state: items, ready order, delay heap, in-flight count, shut-down flag.
pub(crate) struct State<T, S = foldhash::fast::RandomState> {
    /// Every item the queue knows, each stored once.
    entries: Slab<Entry<T>>,
    /// Item -> slot.
    index: HashTable<u32>,
    /// Hashes items for `index`.
    hasher: S,
    /// Queued items in hand-out order.
    ready: Ready,
    /// Delayed items, a 4-ary min-heap on (at, seq).
    heap: Vec<Node>,
    /// Next delay sequence number.
    seq: u32,
    /// Leases out.
    processing: usize,
    /// Set by shut down; adds are ignored from then on.
    shutting_down: bool,
    /// Timestamps for metrics, if enabled.
    times: Option<Box<Times>>,
    /// Set when a renumbering could not shrink the slab because an item being processed
    /// holds a high slot: the slot, so the next attempt waits until that lease is done.
    pinned: Option<u32>,
}

impl<T: Eq + Hash + Clone> State<T> {
    pub(crate) fn new() -> Self {
        Self::with_hasher(foldhash::fast::RandomState::default())
    }
}

impl<T, S> State<T, S> {
    /// Items waiting to be handed out (client-go's `Len`).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.ready.len
    }

    /// Items waiting for their delay to pass (including re-adds of items being processed).
    #[inline]
    pub(crate) fn delayed_len(&self) -> usize {
        self.heap.len()
    }

    /// Leases out.
    #[inline]
    pub(crate) fn processing(&self) -> usize {
        self.processing
    }

    /// Every item the queue tracks in any state.
    #[inline]
    pub(crate) fn tracked(&self) -> usize {
        self.entries.len()
    }

    #[inline]
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// The time the earliest delayed item becomes ready.
    #[inline]
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.heap.first().map(|node| node.at)
    }
}

impl<T: Eq + Hash + Clone, S: BuildHasher> State<T, S> {
    /// Starts keeping the timestamps metrics need (add, get and done times per item).
    pub(crate) fn enable_times(&mut self) {
        self.times.get_or_insert_with(Box::default);
    }

    /// Items being processed, the sum of their processing times and the longest one, at
    /// `now` (client-go's unfinished work and longest running processor).
    pub(crate) fn in_flight(&self, now: u64) -> (usize, u128, u64) {
        let Some(times) = &self.times else {
            return (self.processing, 0, 0);
        };
        let mut sum = 0u128;
        let mut longest = 0u64;
        for &started in times.started.iter().filter(|&&t| t != UNSET) {
            let age = now.saturating_sub(started);
            sum += u128::from(age);
            longest = longest.max(age);
        }
        (self.processing, sum, longest)
    }

    /// The hasher callers use for [`item_hash`] before taking the lock.
    pub(crate) fn hasher(&self) -> &S {
        &self.hasher
    }

    pub(crate) fn with_hasher(hasher: S) -> Self {
        Self {
            entries: Slab::new(),
            index: HashTable::new(),
            hasher,
            ready: Ready::default(),
            heap: Vec::new(),
            seq: 0,
            processing: 0,
            shutting_down: false,
            times: None,
            pinned: None,
        }
    }

    /// Looks `item` up, or reserves a slot for it. Returns the slot, and `item` back if an
    /// equal item was there already (the caller drops it once the lock is released).
    #[inline]
    fn find_or_insert(&mut self, item: T, hash: u32, priority: i32) -> (u32, Option<T>) {
        let entries = &self.entries;
        match self.index.entry(
            table_hash(hash),
            |&slot| {
                let entry = &entries[slot as usize];
                entry.hash == hash && entry.item == item
            },
            |&slot| table_hash(entries[slot as usize].hash),
        ) {
            TableEntry::Occupied(occupied) => (*occupied.get(), Some(item)),
            TableEntry::Vacant(vacant) => {
                let slot = self.entries.vacant_key();
                let slot32 = u32::try_from(slot).expect("more than 4 billion items in one queue");
                vacant.insert(slot32);
                self.entries.insert(Entry {
                    item,
                    heap_pos: NOT_IN_HEAP,
                    priority,
                    hash,
                    flags: 0,
                });
                (slot32, None)
            }
        }
    }

    /// [`add_hashed`](Self::add_hashed), hashing `item` here.
    #[cfg(test)]
    pub(crate) fn add(&mut self, item: T, priority: Option<i32>, now: u64) -> Added {
        let hash = item_hash(&self.hasher, &item);
        self.add_hashed(item, hash, priority, now).0
    }

    /// Adds `item`, whose [`item_hash`] is `hash`, now (client-go's `Add`; `priority` is
    /// `AddOptions::priority`).
    #[inline]
    pub(crate) fn add_hashed(
        &mut self,
        item: T,
        hash: u32,
        priority: Option<i32>,
        now: u64,
    ) -> (Added, Option<T>) {
        if self.shutting_down {
            return (Added::default(), Some(item));
        }
        let (slot, unused) = self.find_or_insert(item, hash, priority.unwrap_or(0));
        (self.add_slot(slot, unused.is_some(), priority, now), unused)
    }

    /// [`add_hashed`](Self::add_hashed) once the item has its slot.
    #[inline]
    fn add_slot(&mut self, slot: u32, existed: bool, priority: Option<i32>, now: u64) -> Added {
        if !existed {
            self.ready.push(priority.unwrap_or(0), slot);
            self.entries[slot as usize].flags = QUEUED;
            if let Some(times) = &mut self.times {
                times.mark_added(slot, now);
            }
            return Added {
                ready: true,
                new_head: false,
                counted: true,
            };
        }
        let entry = &mut self.entries[slot as usize];
        if entry.flags & PROCESSING != 0 {
            // Re-added while processing: queue it again once the lease drops. An earlier
            // add_after of it is now moot (the add is sooner).
            let counted = entry.flags & DIRTY == 0;
            entry.flags |= DIRTY;
            raise_pending(entry, priority);
            if entry.heap_pos != NOT_IN_HEAP {
                let pos = entry.heap_pos;
                self.heap_remove(pos as usize);
            }
            if counted && let Some(times) = &mut self.times {
                times.mark_added(slot, now);
            }
            return Added {
                ready: false,
                new_head: false,
                counted,
            };
        }
        if entry.flags & QUEUED != 0 {
            self.raise_queued(slot, priority);
            return Added::default();
        }
        // Delayed: it becomes ready now and its delayed entry goes (kubernetes#126027).
        debug_assert_ne!(entry.heap_pos, NOT_IN_HEAP);
        if let Some(p) = priority {
            entry.priority = entry.priority.max(p);
        }
        let prio = entry.priority;
        let pos = entry.heap_pos;
        entry.flags |= QUEUED;
        self.heap_remove(pos as usize);
        self.ready.push(prio, slot);
        if let Some(times) = &mut self.times {
            times.mark_added(slot, now);
        }
        Added {
            ready: true,
            new_head: false,
            counted: true,
        }
    }

    /// [`add_at_hashed`](Self::add_at_hashed), hashing `item` here.
    #[cfg(test)]
    pub(crate) fn add_at(&mut self, item: T, at: u64, priority: Option<i32>) -> Added {
        let hash = item_hash(&self.hasher, &item);
        self.add_at_hashed(item, hash, at, priority).0
    }

    /// Adds `item`, whose [`item_hash`] is `hash`, once the time is `at` (client-go's
    /// `AddAfter`). The caller passes only `at > now`; a due time is an add.
    pub(crate) fn add_at_hashed(
        &mut self,
        item: T,
        hash: u32,
        at: u64,
        priority: Option<i32>,
    ) -> (Added, Option<T>) {
        if self.shutting_down {
            return (Added::default(), Some(item));
        }
        let (slot, unused) = self.find_or_insert(item, hash, priority.unwrap_or(0));
        (
            self.add_slot_at(slot, unused.is_some(), at, priority),
            unused,
        )
    }

    /// [`add_at_hashed`](Self::add_at_hashed) once the item has its slot.
    fn add_slot_at(&mut self, slot: u32, existed: bool, at: u64, priority: Option<i32>) -> Added {
        if !existed {
            let pos = self.heap_push(at, slot);
            return Added {
                ready: false,
                new_head: pos == 0,
                counted: false,
            };
        }
        let entry = &mut self.entries[slot as usize];
        if entry.flags & PROCESSING != 0 {
            raise_pending(entry, priority);
            if entry.flags & DIRTY != 0 {
                // Already due for a re-add when the lease drops: nothing is sooner.
                return Added::default();
            }
        } else if entry.flags & QUEUED != 0 {
            // Queued items stay queued once; a delayed add can still raise the priority.
            self.raise_queued(slot, priority);
            return Added::default();
        } else if let Some(p) = priority {
            entry.priority = entry.priority.max(p);
        }
        let pos = entry.heap_pos;
        if pos == NOT_IN_HEAP {
            let pos = self.heap_push(at, slot);
            return Added {
                ready: false,
                new_head: pos == 0,
                counted: false,
            };
        }
        // Earliest wins (client-go's delaying queue: a waiting item is advanced, never
        // postponed).
        let node = &mut self.heap[pos as usize];
        if at < node.at {
            node.at = at;
            let new_pos = self.sift_up(pos as usize);
            return Added {
                ready: false,
                new_head: new_pos == 0,
                counted: false,
            };
        }
        Added::default()
    }

    /// Raises the priority of the queued item in `slot` to `priority` if that is higher; a
    /// raised item goes behind the items already waiting at its new priority.
    fn raise_queued(&mut self, slot: u32, priority: Option<i32>) {
        let entry = &mut self.entries[slot as usize];
        match priority {
            Some(p) if p > entry.priority => {
                let old = entry.priority;
                entry.priority = p;
                self.ready.mark_stale(old, slot);
                self.ready.push(p, slot);
            }
            _ => {}
        }
    }

    /// Moves every delayed item due at `now` to the ready queues (or marks it dirty if it is
    /// being processed). Returns how many became ready to hand out.
    #[inline]
    pub(crate) fn promote(&mut self, now: u64) -> Promoted {
        let mut promoted = Promoted::default();
        while let Some(&head) = self.heap.first() {
            if head.at > now {
                break;
            }
            let slot = head.slot;
            self.heap_remove(0);
            let entry = &mut self.entries[slot as usize];
            if entry.flags & PROCESSING != 0 {
                entry.flags |= DIRTY;
            } else {
                entry.flags |= QUEUED;
                let prio = entry.priority;
                self.ready.push(prio, slot);
                promoted.ready += 1;
            }
            promoted.counted += 1;
            if let Some(times) = &mut self.times {
                // The item was due at `head.at`; promotion may run later than that.
                times.mark_added(slot, head.at);
            }
        }
        promoted
    }

    /// Hands out the next ready item (client-go's `Get`).
    #[inline]
    pub(crate) fn pop(&mut self, now: u64) -> Option<Popped<T>> {
        let (priority, slot) = self.ready.pop()?;
        let entry = &mut self.entries[slot as usize];
        debug_assert_eq!(entry.flags & (QUEUED | PROCESSING), QUEUED);
        // Clone before any change to the entry, and put the reference back if the clone
        // panics: the item then stays queued at the head, as if never popped.
        let unpop = Unpop {
            ready: &mut self.ready,
            priority,
            slot,
        };
        let item = entry.item.clone();
        std::mem::forget(unpop);
        entry.flags = PROCESSING;
        entry.priority = 0;
        self.processing += 1;
        let mut queued_for = None;
        if let Some(times) = &mut self.times {
            let added = std::mem::replace(Times::slot(&mut times.added, slot), UNSET);
            if added != UNSET {
                queued_for = Some(now.saturating_sub(added));
            }
            *Times::slot(&mut times.started, slot) = now;
        }
        Some(Popped {
            slot,
            item,
            priority,
            queued_for,
        })
    }

    /// Ends the processing of the item in `slot` (client-go's `Done`). Returns `true` if the
    /// item was queued again because it was re-added while processing.
    #[inline]
    pub(crate) fn done(&mut self, slot: u32, now: u64) -> Done<T> {
        let mut worked_for = None;
        if let Some(times) = &mut self.times {
            let started = std::mem::replace(Times::slot(&mut times.started, slot), UNSET);
            if started != UNSET {
                worked_for = Some(now.saturating_sub(started));
            }
        }
        let entry = &mut self.entries[slot as usize];
        debug_assert!(
            entry.flags & PROCESSING != 0,
            "done on an item not processing"
        );
        self.processing -= 1;
        if self.pinned == Some(slot) {
            self.pinned = None;
        }
        if entry.flags & DIRTY != 0 {
            entry.flags = QUEUED;
            let prio = entry.priority;
            self.ready.push(prio, slot);
            return Done {
                requeued: true,
                worked_for,
                removed: None,
            };
        }
        entry.flags = 0;
        let removed = (entry.heap_pos == NOT_IN_HEAP).then(|| self.remove_entry(slot));
        Done {
            requeued: false,
            worked_for,
            removed,
        }
    }

    /// Stops intake (client-go's `ShutDown`). Delayed items are dropped, as client-go's
    /// delaying queue drops its waiting heap; queued items stay to be handed out, and items
    /// being processed may still be re-queued by their `done` if they were re-added before.
    ///
    /// Returns the delayed items it dropped, for the caller to drop (or keep) once the lock is
    /// released. With `clone_processing`, the list also holds a clone of each item being
    /// processed whose delayed re-add was dropped (the queue keeps its own copy until the
    /// lease drops); the clones are made before anything changes, so a panicking `Clone`
    /// leaves the queue as it was.
    pub(crate) fn shut_down(&mut self, clone_processing: bool) -> Vec<T> {
        let mut dropped = Vec::new();
        if clone_processing {
            for node in &self.heap {
                let entry = &self.entries[node.slot as usize];
                if entry.flags != 0 {
                    dropped.push(entry.item.clone());
                }
            }
        }
        self.shutting_down = true;
        dropped.reserve(self.heap.len());
        while let Some(node) = self.heap.pop() {
            let entry = &mut self.entries[node.slot as usize];
            entry.heap_pos = NOT_IN_HEAP;
            if entry.flags == 0 {
                dropped.push(self.remove_entry(node.slot));
            }
        }
        self.heap = Vec::new();
        self.maybe_shrink();
        dropped
    }

    /// Forgets the entry in `slot`; returns the item for the caller to drop.
    fn remove_entry(&mut self, slot: u32) -> T {
        let entry = self.entries.remove(slot as usize);
        match self
            .index
            .find_entry(table_hash(entry.hash), |&s| s == slot)
        {
            Ok(found) => {
                found.remove();
            }
            Err(_) => unreachable!("entry {slot} missing from the index"),
        }
        if self.entries.is_empty() {
            self.maybe_shrink();
        } else if self.pinned.is_none() && oversized(self.entries.capacity(), self.entries.len()) {
            self.renumber();
        }
        entry.item
    }

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
    fn renumber(&mut self) {
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
        let entries = &self.entries;
        let mut index = HashTable::with_capacity(entries.len());
        for (slot, entry) in entries {
            index.insert_unique(table_hash(entry.hash), slot as u32, |&s| {
                table_hash(entries[s as usize].hash)
            });
        }
        self.index = index;
        for node in &mut self.heap {
            node.slot = map[node.slot as usize];
        }
        if oversized(self.heap.capacity(), self.heap.len()) {
            self.heap.shrink_to(shrink_target(self.heap.len()));
        }
        self.ready.compact();
        self.ready.remap(&map);
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
    fn maybe_shrink(&mut self) {
        const KEEP: usize = 1024;
        if self.entries.is_empty() && self.entries.capacity() > KEEP {
            self.entries = Slab::new();
            self.index = HashTable::new();
            self.heap = Vec::new();
            self.ready.shrink();
            if let Some(times) = &mut self.times {
                **times = Times::default();
            }
        }
    }

    // ----- the delay heap -----

    fn heap_push(&mut self, at: u64, slot: u32) -> usize {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        let pos = self.heap.len();
        self.heap.push(Node { at, seq, slot });
        self.entries[slot as usize].heap_pos = pos as u32;
        self.sift_up(pos)
    }

    fn heap_remove(&mut self, pos: usize) {
        let removed = self.heap.swap_remove(pos);
        self.entries[removed.slot as usize].heap_pos = NOT_IN_HEAP;
        if oversized(self.heap.capacity(), self.heap.len()) {
            self.heap.shrink_to(shrink_target(self.heap.len()));
        }
        if pos < self.heap.len() {
            let moved = self.heap[pos].slot;
            self.entries[moved as usize].heap_pos = pos as u32;
            let up = self.sift_up(pos);
            if up == pos {
                self.sift_down(pos);
            }
        }
    }

    fn sift_up(&mut self, mut pos: usize) -> usize {
        let node = self.heap[pos];
        while pos > 0 {
            let parent = (pos - 1) / ARITY;
            if !node.before(&self.heap[parent]) {
                break;
            }
            self.heap[pos] = self.heap[parent];
            self.entries[self.heap[pos].slot as usize].heap_pos = pos as u32;
            pos = parent;
        }
        self.heap[pos] = node;
        self.entries[node.slot as usize].heap_pos = pos as u32;
        pos
    }

    fn sift_down(&mut self, mut pos: usize) {
        let node = self.heap[pos];
        let len = self.heap.len();
        loop {
            let first = pos * ARITY + 1;
            if first >= len {
                break;
            }
            let last = (first + ARITY).min(len);
            let mut best = first;
            for child in first + 1..last {
                if self.heap[child].before(&self.heap[best]) {
                    best = child;
                }
            }
            if !self.heap[best].before(&node) {
                break;
            }
            self.heap[pos] = self.heap[best];
            self.entries[self.heap[pos].slot as usize].heap_pos = pos as u32;
            pos = best;
        }
        self.heap[pos] = node;
        self.entries[node.slot as usize].heap_pos = pos as u32;
    }

    /// Checks every internal invariant; for tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut queued = 0;
        let mut processing = 0;
        for (slot, entry) in &self.entries {
            assert_eq!(entry.hash, item_hash(&self.hasher, &entry.item));
            let hash = table_hash(entry.hash);
            assert!(self.index.find(hash, |&s| s as usize == slot).is_some());
            if entry.flags & QUEUED != 0 {
                queued += 1;
                assert_eq!(entry.flags & (PROCESSING | DIRTY), 0);
                assert_eq!(entry.heap_pos, NOT_IN_HEAP);
            }
            if entry.flags & PROCESSING != 0 {
                processing += 1;
                if entry.flags & DIRTY != 0 {
                    assert_eq!(entry.heap_pos, NOT_IN_HEAP);
                }
            }
            if entry.flags == 0 {
                assert_ne!(entry.heap_pos, NOT_IN_HEAP, "idle entry {slot} kept");
            }
            if entry.heap_pos != NOT_IN_HEAP {
                assert_eq!(self.heap[entry.heap_pos as usize].slot as usize, slot);
            }
        }
        assert_eq!(self.index.len(), self.entries.len());
        assert_eq!(queued, self.ready.len);
        assert_eq!(processing, self.processing);
        for (pos, node) in self.heap.iter().enumerate() {
            if pos > 0 {
                assert!(!node.before(&self.heap[(pos - 1) / ARITY]));
            }
        }
    }
}

/// Puts a popped reference back if dropped, which happens only when `T::clone` unwinds
/// (a successful pop forgets it).
struct Unpop<'a> {
    ready: &'a mut Ready,
    priority: i32,
    slot: u32,
}

impl Drop for Unpop<'_> {
    fn drop(&mut self) {
        self.ready.unpop(self.priority, self.slot);
    }
}

/// Records the priority a re-add of a processing item asked for: the highest one wins.
#[inline]
fn raise_pending<T>(entry: &mut Entry<T>, priority: Option<i32>) {
    if let Some(p) = priority {
        if entry.flags & PRIORITY_GIVEN == 0 {
            entry.priority = p;
            entry.flags |= PRIORITY_GIVEN;
        } else {
            entry.priority = entry.priority.max(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain<T: Eq + Hash + Clone>(state: &mut State<T>) -> Vec<T> {
        let mut out = Vec::new();
        while let Some(p) = state.pop(0) {
            out.push(p.item);
            state.done(p.slot, 0);
            state.check();
        }
        out
    }

    #[test]
    fn fifo_and_dedup() {
        let mut s = State::new();
        s.add("a", None, 0);
        s.add("b", None, 0);
        s.add("a", None, 0);
        assert_eq!(s.len(), 2);
        assert_eq!(drain(&mut s), ["a", "b"]);
        assert_eq!(s.tracked(), 0);
    }

    #[test]
    fn readd_while_processing_goes_to_the_tail_after_done() {
        let mut s = State::new();
        s.add("a", None, 0);
        s.add("b", None, 0);
        let a = s.pop(0).unwrap();
        s.add("a", None, 0);
        s.add("a", None, 0);
        assert_eq!(s.len(), 1, "a re-added while processing is not counted");
        s.check();
        assert!(s.done(a.slot, 0).requeued);
        assert_eq!(drain(&mut s), ["b", "a"]);
    }

    #[test]
    fn delayed_items_keep_earliest_time_and_release_in_order() {
        let mut s = State::new();
        s.add_at("a", 100, None);
        s.add_at("b", 50, None);
        s.add_at("a", 200, None);
        s.add_at("c", 50, None);
        s.check();
        assert_eq!(s.next_deadline(), Some(50));
        assert_eq!(s.promote(60).ready, 2);
        assert_eq!(s.promote(99).ready, 0);
        assert_eq!(s.promote(100).ready, 1);
        assert_eq!(drain(&mut s), ["b", "c", "a"]);
    }

    #[test]
    fn add_of_delayed_item_makes_it_ready_once() {
        let mut s = State::new();
        s.add_at("a", 100, None);
        assert!(s.add("a", None, 0).ready);
        assert_eq!(s.delayed_len(), 0);
        assert_eq!(drain(&mut s), ["a"]);
        assert_eq!(s.promote(1000).ready, 0);
    }

    #[test]
    fn add_after_of_processing_item_waits_for_both() {
        let mut s = State::new();
        s.add("a", None, 0);
        let a = s.pop(0).unwrap();
        s.add_at("a", 100, None);
        s.check();
        // Due while still processing: becomes dirty.
        assert_eq!(s.promote(100).ready, 0);
        assert!(s.done(a.slot, 0).requeued);
        assert_eq!(drain(&mut s), ["a"]);

        s.add("b", None, 0);
        let b = s.pop(0).unwrap();
        s.add_at("b", 300, None);
        assert!(!s.done(b.slot, 0).requeued, "not due yet");
        assert_eq!(s.len(), 0);
        assert_eq!(s.promote(300).ready, 1);
        assert_eq!(drain(&mut s), ["b"]);
    }

    #[test]
    fn priorities_order_and_raise() {
        let mut s = State::new();
        s.add("low", Some(-5), 0);
        s.add("a", None, 0);
        s.add("b", None, 0);
        s.add("hi", Some(3), 0);
        s.add("b", Some(1), 0);
        s.add("a", Some(-10), 0); // never lowers
        s.check();
        assert_eq!(s.len(), 4);
        let order: Vec<_> = std::iter::from_fn(|| {
            let p = s.pop(0)?;
            s.done(p.slot, 0);
            Some((p.item, p.priority))
        })
        .collect();
        assert_eq!(order, [("hi", 3), ("b", 1), ("a", 0), ("low", -5)]);
        s.check();
    }

    #[test]
    fn stale_reference_is_skipped_after_slot_reuse() {
        let mut s = State::new();
        s.add("a", None, 0);
        s.add("b", None, 0);
        s.add("a", Some(2), 0); // stale ref to a's slot left in the zero queue
        let a = s.pop(0).unwrap();
        assert_eq!((a.item, a.priority), ("a", 2));
        s.done(a.slot, 0);
        s.add("c", None, 0); // reuses a's slot
        s.check();
        assert_eq!(drain(&mut s), ["b", "c"]);
    }

    #[test]
    fn stale_references_are_dropped_once_nothing_is_ready() {
        let mut s = State::new();
        for round in 0..100 {
            let item = ["a", "b"][round % 2];
            s.add(item, Some(-100), 0);
            s.add(item, Some(0), 0); // raised: a stale reference stays at -100
            let p = s.pop(0).unwrap();
            s.done(p.slot, 0);
        }
        s.check();
        assert!(s.ready.stale.is_empty());
        assert!(s.ready.others.is_empty());
    }

    #[test]
    fn a_burst_is_renumbered_down_around_a_lease_and_keeps_every_rule() {
        let mut s: State<u32> = State::new();
        s.enable_times();
        s.add_at(u32::MAX, 1_000_000, None); // the resync key, always delayed
        for item in 0..100_000 {
            match item % 3 {
                0 => s.add_at(item, 10 + u64::from(item % 7), Some(1)),
                1 => s.add(item, Some(-1), 0),
                _ => s.add(item, None, 0),
            };
            if item % 5 == 0 {
                s.add(item, Some(2), 0); // a raise: stale references
            }
        }
        s.promote(100);
        // Hold a lease on an item in a high slot while most of the burst drains.
        let mut held = None;
        let mut order = Vec::new();
        while let Some(p) = s.pop(7) {
            order.push(p.item);
            if held.is_none() && p.slot > 90_000 {
                held = Some(p);
                continue;
            }
            s.done(p.slot, 9);
            if order.len() % 10_000 == 0 {
                s.check();
            }
        }
        s.check();
        let held = held.expect("a high slot was handed out");
        assert!(
            s.entries.capacity() > held.slot as usize,
            "a leased slot never moves"
        );
        s.add(held.item, None, 0); // dirty while processing
        assert!(s.done(held.slot, 9).requeued);
        let again = s.pop(9).unwrap();
        assert_eq!(again.item, held.item);
        s.done(again.slot, 9);
        s.check();
        assert_eq!(s.tracked(), 1);
        assert!(
            s.entries.capacity() <= 4 * SHRINK_FLOOR,
            "slab {}",
            s.entries.capacity()
        );
        assert!(
            s.index.capacity() <= 4 * SHRINK_FLOOR,
            "index {}",
            s.index.capacity()
        );
        assert!(
            s.heap.capacity() <= 4 * SHRINK_FLOOR,
            "heap {}",
            s.heap.capacity()
        );
        assert!(s.ready.zero.capacity() <= 4 * SHRINK_FLOOR);
        assert!(s.ready.stale.is_empty());
        let times = s.times.as_ref().unwrap();
        assert!(
            times.added.len() <= 8 * SHRINK_FLOOR,
            "times {}",
            times.added.len()
        );
        // Every item came out once.
        let mut sorted = order.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 100_000);
        assert_eq!(s.promote(1_000_000).ready, 1);
        assert_eq!(drain(&mut s), [u32::MAX]);
    }

    #[test]
    fn stale_references_are_compacted_once_they_outnumber_live_ones() {
        let mut s = State::new();
        s.add("keep", None, 0);
        for round in 0..10_000 {
            let item = ["a", "b", "c"][round % 3];
            s.add(item, Some(-100), 0);
            s.add(item, Some(5), 0);
            let p = s.pop(0).unwrap();
            assert_eq!(p.item, item);
            s.done(p.slot, 0);
        }
        s.check();
        assert!(s.ready.stale_refs <= SHRINK_FLOOR / 16 + 1);
        assert!(s.ready.others.values().map(VecDeque::len).sum::<usize>() <= SHRINK_FLOOR / 16 + 1);
        assert_eq!(drain(&mut s), ["keep"]);
    }

    #[test]
    fn shut_down_drops_delayed_and_ignores_adds() {
        let mut s = State::new();
        s.add("a", None, 0);
        s.add_at("b", 10, None);
        let a = s.pop(0).unwrap();
        s.add_at("a", 10, None);
        assert_eq!(s.shut_down(true), ["a", "b"]);
        s.check();
        assert_eq!(s.delayed_len(), 0);
        assert!(!s.add("c", None, 0).ready);
        assert!(!s.done(a.slot, 0).requeued);
        assert_eq!(s.tracked(), 0);
    }
}
