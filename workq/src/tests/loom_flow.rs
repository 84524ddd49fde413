//! Flow control's wake-up paths: a getter held back by a limit parks although items are
//! queued, so the wake-up must come from the done that frees a slot, or from a hand-out that
//! leaves items behind (another getter may take them).

use loom::thread;

use crate::WorkQueue;
use crate::clock::FakeClock;

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

/// Two getters park while no token is there; each clock step makes one token due, and the
/// hand-out it allows leaves an item behind: whichever getter the step or the chained
/// wake-up reaches, both are served (a burst of 2 keeps a token for a getter that comes
/// after both steps).
#[test]
fn loom_a_token_serves_one_parked_getter_and_the_next_step_the_other() {
    loom::model(|| {
        let clock = FakeClock::new();
        let queue: WorkQueue<u32> = WorkQueue::builder()
            .clock(clock.clone())
            .hand_out_rate(1.0, 2)
            .build();
        queue.add(0);
        queue.add(3);
        drop(queue.try_get().expect("the burst"));
        drop(queue.try_get().expect("the burst"));
        queue.add(1);
        queue.add(2);
        let getters: Vec<_> = (0..2)
            .map(|_| {
                let queue = queue.clone();
                thread::spawn(move || *queue.blocking_get().expect("not shut down"))
            })
            .collect();
        clock.step(std::time::Duration::from_secs(1));
        clock.step(std::time::Duration::from_secs(1));
        let mut got: Vec<u32> = getters.into_iter().map(|g| g.join().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
    });
}
