//! The delay heap: a 4-ary min-heap of slots on (ready time, add order). Each entry
//! remembers its position in the heap, so a delayed item can be removed or moved in
//! O(log n).

use super::compact::{oversized, shrink_target};
use super::{NOT_IN_HEAP, State};

/// Arity of the delay heap: a 4-ary heap is shallower than a binary one, and its four
/// children share a cache line.
pub(super) const ARITY: usize = 4;

/// A node of the delay heap.
#[derive(Clone, Copy, Debug)]
pub(super) struct Node {
    /// When the item becomes ready, in nanoseconds since the queue's epoch.
    pub(super) at: u64,
    /// Add order, to release items due at the same instant in the order they were added.
    /// Wraps after 2^32 delayed adds; only ties at one nanosecond compare it.
    pub(super) seq: u32,
    /// The entry's slot.
    pub(super) slot: u32,
}

impl Node {
    #[inline]
    pub(super) fn before(&self, other: &Node) -> bool {
        (self.at, self.seq) < (other.at, other.seq)
    }
}

impl<T, S> State<T, S> {
    pub(super) fn heap_push(&mut self, at: u64, slot: u32) -> usize {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        let pos = self.heap.len();
        self.heap.push(Node { at, seq, slot });
        self.entries[slot as usize].heap_pos = pos as u32;
        self.sift_up(pos)
    }

    pub(super) fn heap_remove(&mut self, pos: usize) {
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

    pub(super) fn sift_up(&mut self, mut pos: usize) -> usize {
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

    pub(super) fn sift_down(&mut self, mut pos: usize) {
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
}
