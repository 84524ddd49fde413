//! Unit tests of the rules.

use std::collections::VecDeque;

use super::compact::SHRINK_FLOOR;
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

#[test]
fn an_entry_remembers_its_bucket_through_growth_and_compaction() {
    let mut s = State::new();
    // Growth rebuilds the index several times; each rebuild tells every entry its bucket
    // (check() holds each stored bucket against the index).
    for i in 0..5_000 {
        s.add(i, None, 0);
    }
    s.check();
    // Draining most of them renumbers the slots and rebuilds the index again.
    for _ in 0..4_900 {
        let p = s.pop(0).unwrap();
        s.done(p.slot, 0);
    }
    s.check();
    assert_eq!(drain(&mut s), (4_900..5_000).collect::<Vec<_>>());
    assert_eq!(bucket_at(bucket_of(7)), Some(7));
    assert_eq!(bucket_at(bucket_of(0xff_fffe)), Some(0xff_fffe));
    assert_eq!(bucket_of(0xff_ffff), NO_BUCKET);
    assert_eq!(bucket_at(NO_BUCKET), None);
}

#[test]
fn an_entry_whose_bucket_does_not_fit_is_removed_by_probing() {
    let mut s = State::new();
    for i in 0..100 {
        s.add(i, None, 0);
    }
    // As in an index of more than 2^24 buckets: half the entries do not know theirs.
    for (slot, entry) in &mut s.entries {
        if slot % 2 == 0 {
            entry.bucket = NO_BUCKET;
        }
    }
    s.check();
    assert_eq!(drain(&mut s), (0..100).collect::<Vec<_>>());
    assert_eq!(s.tracked(), 0);
    assert!(s.index.is_empty());
}

#[test]
fn the_bucket_fits_in_the_entry_s_padding() {
    // W6's bytes per item: the bucket takes no room of its own. The feature `otel` adds
    // one pointer (the trace links, allocated only when an add carries a trace context);
    // without it, nothing.
    let links = if cfg!(feature = "otel") { 8 } else { 0 };
    assert_eq!(
        std::mem::size_of::<Entry<std::sync::Arc<str>>>(),
        32 + links
    );
    assert_eq!(std::mem::size_of::<Entry<u64>>(), 24 + links);
}

#[test]
fn trace_links_cost_no_room_without_the_feature() {
    // What an item carries from the queue to its worker: the hand-out and the lease. The
    // feature `otel` adds one pointer to each; without it they are as they were.
    let links = if cfg!(feature = "otel") { 8 } else { 0 };
    assert_eq!(
        std::mem::size_of::<super::Popped<std::sync::Arc<str>>>(),
        40 + links
    );
    assert_eq!(
        std::mem::size_of::<crate::Lease<std::sync::Arc<str>>>(),
        32 + links
    );
    if cfg!(not(feature = "otel")) {
        // An add passes nothing more.
        assert_eq!(std::mem::size_of::<super::Link>(), 0);
    }
}
