//! Flow control's new wake-up path: a getter held back by a limit parks although items are
//! queued, so the wake-up must come from the done that frees a slot. (The chained wake-up of
//! a hand-out that leaves items behind is proved by `tests/flow.rs`'s
//! `a_step_that_makes_two_tokens_due_serves_two_waiting_getters`: a model of it here did
//! not reach the losing interleaving.)

use loom::thread;

use crate::WorkQueue;

/// A getter held back by the queue-wide limit parks; a lease dropped on another thread,
/// before, during or after the getter's registration, must wake it.
#[test]
fn loom_a_done_freeing_a_slot_wakes_a_getter_held_back_by_a_limit() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::builder().max_in_flight(1).build();
        queue.add(1);
        queue.add(2);
        let first = queue.try_get().expect("nothing is out yet");
        let releaser = thread::spawn(move || drop(first));
        let lease = queue.blocking_get().expect("the queue is not shut down");
        assert_eq!(*lease, 2);
        releaser.join().unwrap();
    });
}

/// The same with the async getter and a group at its limit beside a group that is not: the
/// done of the saturated group's lease must reach the waiting task.
#[test]
fn loom_a_done_in_a_saturated_group_wakes_an_async_getter() {
    loom::model(|| {
        let queue: WorkQueue<u32> = WorkQueue::builder()
            .group_by(|item: &u32| if *item < 2 { "a" } else { "b" })
            .max_in_flight_per_group(1)
            .build();
        queue.add(0);
        queue.add(1);
        let first = queue.try_get().expect("group a may hand out");
        let releaser = thread::spawn(move || first.done());
        let lease = loom::future::block_on(queue.get()).expect("not shut down");
        assert_eq!(*lease, 1);
        releaser.join().unwrap();
    });
}
