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
//!
//! The rules live here; the structures they drive have files of their own: `ready.rs` (the
//! ready lanes, by priority), `heap.rs` (the delay heap), `stamps.rs` (the metrics
//! timestamps) and `compact.rs` (giving a burst's memory back).

mod compact;
pub(crate) mod flow;
#[cfg(test)]
mod flow_tests;
mod heap;
mod ready;
mod stamps;
#[cfg(test)]
mod tests;

use std::hash::{BuildHasher, Hash};

use hashbrown::HashTable;
use hashbrown::hash_table::Entry as TableEntry;
use slab::Slab;

use compact::oversized;
use flow::{Choice, Flow};
use heap::Node;
use ready::{Ready, Unpop};
use stamps::{Times, UNSET};

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
    /// Where the index keeps this entry's slot ([`bucket_of`]), so that removing the entry
    /// from the index goes straight to its bucket instead of probing for it: the probe reads
    /// the bucket array as well as the control bytes, a second cache miss per `done` on a
    /// queue too large for the caches. 24 bits, in padding the entry has anyway;
    /// [`NO_BUCKET`] when the index has more buckets than that (then removal probes).
    bucket: [u8; 3],
    /// The trace contexts of the adds since the item was last handed out (none allocated
    /// until an add carries one).
    #[cfg(feature = "otel")]
    links: Option<Box<crate::otel::Links>>,
}

/// What an add carries besides the item: the adding span's trace context with the feature
/// `otel`, otherwise nothing (a zero-sized value, so the adds compile as they did).
#[cfg(feature = "otel")]
pub(crate) type Link = Option<crate::otel::TraceLink>;
/// What an add carries besides the item: nothing without the feature `otel`.
#[cfg(not(feature = "otel"))]
pub(crate) type Link = NoLink;

/// The [`Link`] of an add without the feature `otel`: nothing.
#[cfg(not(feature = "otel"))]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NoLink;

/// The [`Link`] of an add made now, read before the queue's lock is taken.
#[inline]
pub(crate) fn current_link() -> Link {
    #[cfg(feature = "otel")]
    {
        crate::otel::TraceLink::current()
    }
    #[cfg(not(feature = "otel"))]
    {
        NoLink
    }
}

/// [`Entry::bucket`] of an entry whose bucket does not fit in 24 bits.
const NO_BUCKET: [u8; 3] = [0xff; 3];

/// A bucket index as stored in an entry.
#[inline]
fn bucket_of(index: usize) -> [u8; 3] {
    if index < 0xff_ffff {
        let [a, b, c, ..] = (index as u32).to_le_bytes();
        [a, b, c]
    } else {
        NO_BUCKET
    }
}

/// The bucket index stored in an entry, if it fits.
#[inline]
fn bucket_at(bucket: [u8; 3]) -> Option<usize> {
    (bucket != NO_BUCKET).then(|| u32::from_le_bytes([bucket[0], bucket[1], bucket[2], 0]) as usize)
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

/// An index of `entries` with room for `capacity` of them, built from their stored hashes
/// in slot order (no item is read): what growing the index and compacting the slab both do.
/// Each entry learns its new bucket.
fn index_of<T>(entries: &mut Slab<Entry<T>>, capacity: usize) -> HashTable<u32> {
    let mut index = HashTable::with_capacity(capacity);
    for (slot, entry) in entries.iter_mut() {
        // Room was made above: no insert rehashes (which would move the buckets).
        let bucket = index
            .insert_unique(table_hash(entry.hash), slot as u32, |_| {
                unreachable!("the index has room for every entry")
            })
            .bucket_index();
        entry.bucket = bucket_of(bucket);
    }
    index
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
    /// The trace contexts of the adds that queued it.
    #[cfg(feature = "otel")]
    pub(crate) links: Option<Box<crate::otel::Links>>,
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
    /// Groups, limits and rates, if the queue has any (`flow.rs`): then the ready items live
    /// there, and `ready` only counts them.
    flow: Option<Box<Flow>>,
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

    /// Client-go's depth (items queued, and items re-added while processed) by the priority
    /// each is queued at, or will be queued at when its lease drops (the highest a re-add
    /// gave, 0 if none gave one). A walk over every entry: for scrapes, not for hot paths.
    pub(crate) fn depth_by_priority(&self) -> std::collections::BTreeMap<i32, usize> {
        let mut depth = std::collections::BTreeMap::new();
        for (_, entry) in &self.entries {
            let priority = if entry.flags & QUEUED != 0 {
                entry.priority
            } else if entry.flags & (PROCESSING | DIRTY) == PROCESSING | DIRTY {
                if entry.flags & PRIORITY_GIVEN != 0 {
                    entry.priority
                } else {
                    0
                }
            } else {
                continue;
            };
            *depth.entry(priority).or_insert(0) += 1;
        }
        depth
    }

    /// The time the earliest delayed item becomes ready.
    #[inline]
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        let delayed = self.heap.first().map(|node| node.at);
        match &self.flow {
            None => delayed,
            Some(flow) => match (delayed, flow.next_deadline()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }

    /// Whether a call must read the clock first: something is delayed, or flow control
    /// waits for a token.
    #[inline]
    pub(crate) fn needs_promote(&self) -> bool {
        !self.heap.is_empty() || (self.flow.is_some() && self.flow_waits())
    }

    /// Whether flow control waits for a token; out of line, so that queues without flow
    /// control keep [`needs_promote`](Self::needs_promote) small in every call.
    #[inline(never)]
    fn flow_waits(&self) -> bool {
        self.flow
            .as_ref()
            .is_some_and(|flow| flow.next_deadline().is_some())
    }

    /// The flow control, if the queue has any.
    #[inline]
    pub(crate) fn flow(&self) -> Option<&Flow> {
        self.flow.as_deref()
    }

    /// The flow control, if the queue has any, to set the group of the next add.
    #[inline]
    pub(crate) fn flow_mut(&mut self) -> Option<&mut Flow> {
        self.flow.as_deref_mut()
    }

    /// Queues `slot` at `priority`: in the ready lanes, or in its group.
    #[inline]
    fn enqueue(&mut self, priority: i32, slot: u32) {
        self.enqueue_at(priority, slot, false);
    }

    /// [`enqueue`](Self::enqueue), at the head of the item's lane if `at_head` (a lease
    /// handed back unprocessed goes back where it was taken from).
    #[inline(always)]
    fn enqueue_at(&mut self, priority: i32, slot: u32, at_head: bool) {
        match &mut self.flow {
            None if at_head => self.ready.push_front(priority, slot),
            None => self.ready.push(priority, slot),
            Some(flow) => {
                self.ready.len += 1;
                flow.push(priority, slot, at_head);
            }
        }
    }

    /// Records that a new entry in `slot` exists (its group, with flow control).
    #[inline]
    fn admit(&mut self, slot: u32) {
        if let Some(flow) = &mut self.flow {
            flow.assign(slot);
        }
    }

    // The rules from here to the end of this block need no bounds on `T`: a `Lease`, which
    // has none, ends through `done`, and every call promotes first.

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
                self.enqueue(prio, slot);
                promoted.ready += 1;
            }
            promoted.counted += 1;
            if let Some(times) = &mut self.times {
                // The item was due at `head.at`; promotion may run later than that.
                times.mark_added(slot, head.at);
            }
        }
        if let Some(flow) = &mut self.flow {
            promoted.ready += flow.unpark(now);
        }
        promoted
    }

    /// Ends the processing of the item in `slot` (client-go's `Done`). Returns `true` if the
    /// item was queued again because it was re-added while processing.
    #[cfg(test)]
    pub(crate) fn done(&mut self, slot: u32, now: u64) -> Done<T> {
        self.end(slot, now, false)
    }

    /// Ends the processing of the item in `slot` (client-go's `Done`). An item re-added while
    /// processing is queued again: at the tail, or at the head of its lane if `at_head` (its
    /// lease was handed back unprocessed: the re-add is the release's own).
    #[inline(always)]
    pub(crate) fn end(&mut self, slot: u32, now: u64, at_head: bool) -> Done<T> {
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
        if let Some(flow) = &mut self.flow {
            flow.done(slot);
        }
        if entry.flags & DIRTY != 0 {
            entry.flags = QUEUED;
            let prio = entry.priority;
            self.enqueue_at(prio, slot, at_head);
            return Done {
                requeued: true,
                worked_for,
                removed: None,
            };
        }
        // An entry the queue stops tracking is removed as it is: clearing its flags first
        // would make the removal's wide read of the entry wait on that narrow write (a
        // store-forwarding stall, a tenth of a get + done cycle).
        let removed = if entry.heap_pos == NOT_IN_HEAP {
            Some(self.remove_entry(slot))
        } else {
            entry.flags = 0;
            None
        };
        Done {
            requeued: false,
            worked_for,
            removed,
        }
    }

    /// Makes room in the index for at least as many entries again, by building a new index
    /// from the entries rather than letting the table rehash itself.
    ///
    /// The table holds slots only, so a rehash reads each slot's entry for its hash: on a
    /// large queue, a cache miss per entry in random order. Walking the entries instead reads
    /// them in order. Measured filling a queue with a million keys: a tenth of the time went
    /// to rehashing, which this halves. It also drops the table's tombstones.
    #[cold]
    #[inline(never)]
    fn grow_index(&mut self) {
        let room = self.entries.len().max(4) * 2;
        self.index = index_of(&mut self.entries, room);
    }

    /// Forgets the entry in `slot`; returns the item for the caller to drop.
    fn remove_entry(&mut self, slot: u32) -> T {
        if let Some(flow) = &mut self.flow {
            flow.release(slot);
        }
        let entry = self.entries.remove(slot as usize);
        let known = bucket_at(entry.bucket).and_then(|b| self.index.get_bucket_entry(b).ok());
        match known {
            Some(found) => {
                debug_assert_eq!(*found.get(), slot, "entry {slot} has a stale bucket");
                found.remove();
            }
            None => match self
                .index
                .find_entry(table_hash(entry.hash), |&s| s == slot)
            {
                Ok(found) => {
                    found.remove();
                }
                Err(_) => unreachable!("entry {slot} missing from the index"),
            },
        }
        if self.entries.is_empty() {
            self.maybe_shrink();
        } else if self.pinned.is_none() && oversized(self.entries.capacity(), self.entries.len()) {
            self.renumber();
        }
        entry.item
    }
}

impl<T: Eq + Hash + Clone, S: BuildHasher> State<T, S> {
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
            flow: None,
        }
    }

    /// Turns flow control on (groups, limits, rates); before any add.
    pub(crate) fn enable_flow(&mut self, flow: Flow) {
        debug_assert!(self.entries.is_empty());
        self.flow = Some(Box::new(flow));
    }

    /// Looks `item` up, or reserves a slot for it. Returns the slot, and `item` back if an
    /// equal item was there already (the caller drops it once the lock is released).
    ///
    /// Always inlined into its two callers: out of line, the slot and the item came back
    /// through memory, and every add paid for the round trip.
    #[inline(always)]
    fn find_or_insert(&mut self, item: T, hash: u32, priority: i32) -> (u32, Option<T>) {
        if self.index.len() == self.index.capacity() {
            self.grow_index();
        }
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
                // `u32::MAX` is never a slot: a lease uses it to say its item is done.
                let slot32 = u32::try_from(slot)
                    .ok()
                    .filter(|&s| s != u32::MAX)
                    .expect("more than 4 billion items in one queue");
                let bucket = bucket_of(vacant.insert(slot32).bucket_index());
                self.entries.insert(Entry {
                    item,
                    heap_pos: NOT_IN_HEAP,
                    priority,
                    hash,
                    flags: 0,
                    bucket,
                    #[cfg(feature = "otel")]
                    links: None,
                });
                (slot32, None)
            }
        }
    }

    /// [`add_hashed`](Self::add_hashed), hashing `item` here.
    #[cfg(test)]
    pub(crate) fn add(&mut self, item: T, priority: Option<i32>, now: u64) -> Added {
        let hash = item_hash(&self.hasher, &item);
        self.add_hashed(item, hash, priority, now, Link::default())
            .0
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
        link: Link,
    ) -> (Added, Option<T>) {
        if self.shutting_down {
            return (Added::default(), Some(item));
        }
        let (slot, unused) = self.find_or_insert(item, hash, priority.unwrap_or(0));
        #[cfg(feature = "otel")]
        self.record_link(slot, link);
        #[cfg(not(feature = "otel"))]
        let NoLink = link;
        (self.add_slot(slot, unused.is_some(), priority, now), unused)
    }

    /// Keeps the trace context of an add of the item in `slot` (up to
    /// [`MAX_LINKS`](crate::otel::MAX_LINKS) of them until it is handed out).
    #[cfg(feature = "otel")]
    #[inline]
    fn record_link(&mut self, slot: u32, link: Link) {
        if let Some(link) = link {
            crate::otel::Links::record(&mut self.entries[slot as usize].links, link);
        }
    }

    /// Puts back the links the lease on the item in `slot` took, in front of those of the
    /// adds made since (a release: the next hand-out still links to the adds that caused it).
    #[cfg(feature = "otel")]
    pub(crate) fn restore_links(&mut self, slot: u32, mut taken: Box<crate::otel::Links>) {
        let entry = &mut self.entries[slot as usize];
        debug_assert!(
            entry.flags & PROCESSING != 0,
            "links restored to an item not leased"
        );
        taken.restore(entry.links.take());
        entry.links = Some(taken);
    }

    /// [`add_hashed`](Self::add_hashed) once the item has its slot.
    #[inline]
    fn add_slot(&mut self, slot: u32, existed: bool, priority: Option<i32>, now: u64) -> Added {
        if !existed {
            self.admit(slot);
            self.enqueue(priority.unwrap_or(0), slot);
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
        self.enqueue(prio, slot);
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
        self.add_at_hashed(item, hash, at, priority, Link::default())
            .0
    }

    /// Adds `item`, whose [`item_hash`] is `hash`, once the time is `at` (client-go's
    /// `AddAfter`). The caller passes only `at > now`; a due time is an add.
    pub(crate) fn add_at_hashed(
        &mut self,
        item: T,
        hash: u32,
        at: u64,
        priority: Option<i32>,
        link: Link,
    ) -> (Added, Option<T>) {
        if self.shutting_down {
            return (Added::default(), Some(item));
        }
        let (slot, unused) = self.find_or_insert(item, hash, priority.unwrap_or(0));
        #[cfg(feature = "otel")]
        self.record_link(slot, link);
        #[cfg(not(feature = "otel"))]
        let NoLink = link;
        (
            self.add_slot_at(slot, unused.is_some(), at, priority),
            unused,
        )
    }

    /// [`add_at_hashed`](Self::add_at_hashed) once the item has its slot.
    fn add_slot_at(&mut self, slot: u32, existed: bool, at: u64, priority: Option<i32>) -> Added {
        if !existed {
            self.admit(slot);
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
    #[inline]
    fn raise_queued(&mut self, slot: u32, priority: Option<i32>) {
        // A duplicate add without a priority (the common case) changes nothing.
        if let Some(p) = priority {
            let entry = &mut self.entries[slot as usize];
            if p > entry.priority {
                let old = entry.priority;
                entry.priority = p;
                match &mut self.flow {
                    None => self.ready.mark_stale(old, slot),
                    Some(flow) => {
                        self.ready.len -= 1;
                        flow.mark_stale(old, slot);
                    }
                }
                self.enqueue(p, slot);
            }
        }
    }

    /// Hands out the next ready item (client-go's `Get`).
    #[inline]
    pub(crate) fn pop(&mut self, now: u64) -> Option<Popped<T>> {
        if self.flow.is_some() {
            return self.pop_flow(now);
        }
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
        Some(self.started(slot, item, priority, now))
    }

    /// [`pop`](Self::pop) with flow control: the group whose turn it is hands out, if any
    /// may. `None` if nothing is ready or nothing may be handed out now.
    #[cold]
    #[inline(never)]
    fn pop_flow(&mut self, now: u64) -> Option<Popped<T>> {
        let flow = self.flow.as_deref_mut()?;
        let Choice::Group(id, chosen) = flow.choose(now, self.processing) else {
            return None;
        };
        let ready = flow.ready_of(id);
        let (priority, slot) = ready.pop().expect("a group in a ring has an item");
        debug_assert_eq!(
            priority, chosen,
            "a group's turn is at its highest priority"
        );
        let entry = &mut self.entries[slot as usize];
        debug_assert_eq!(entry.flags & (QUEUED | PROCESSING), QUEUED);
        let unpop = Unpop {
            ready,
            priority,
            slot,
        };
        let item = entry.item.clone();
        std::mem::forget(unpop);
        flow.commit(id, priority, now);
        self.ready.len -= 1;
        entry.flags = PROCESSING;
        entry.priority = 0;
        Some(self.started(slot, item, priority, now))
    }

    /// The bookkeeping of a hand-out once the entry is marked processing.
    #[inline(always)]
    fn started(&mut self, slot: u32, item: T, priority: i32, now: u64) -> Popped<T> {
        self.processing += 1;
        let mut queued_for = None;
        if let Some(times) = &mut self.times {
            let added = std::mem::replace(Times::slot(&mut times.added, slot), UNSET);
            if added != UNSET {
                queued_for = Some(now.saturating_sub(added));
            }
            *Times::slot(&mut times.started, slot) = now;
        }
        Popped {
            slot,
            item,
            priority,
            queued_for,
            #[cfg(feature = "otel")]
            links: self.entries[slot as usize].links.take(),
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

    /// Checks every internal invariant; for tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut queued = 0;
        let mut processing = 0;
        for (slot, entry) in &self.entries {
            assert_eq!(entry.hash, item_hash(&self.hasher, &entry.item));
            let hash = table_hash(entry.hash);
            assert!(self.index.find(hash, |&s| s as usize == slot).is_some());
            if let Some(bucket) = bucket_at(entry.bucket) {
                assert_eq!(
                    self.index.get_bucket(bucket).map(|&s| s as usize),
                    Some(slot),
                    "entry {slot}'s bucket"
                );
            }
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
        if let Some(flow) = &self.flow {
            let mut by_group = std::collections::HashMap::new();
            for (slot, entry) in &self.entries {
                if entry.flags & PROCESSING != 0 {
                    *by_group.entry(flow.group_of(slot as u32)).or_insert(0) += 1;
                }
            }
            flow.check(|id| by_group.get(&id).copied().unwrap_or(0));
        }
        for (pos, node) in self.heap.iter().enumerate() {
            if pos > 0 {
                assert!(!node.before(&self.heap[(pos - 1) / heap::ARITY]));
            }
        }
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
