//! The simulated cluster: objects that change (events) and get reconciled, with the
//! bookkeeping behind the demo's live checks.
//!
//! Every event and every reconcile start takes a number from one global sequence, so "the
//! last reconcile started after the last event arrived" is an exact comparison, free of
//! clock resolution.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// One simulated object (a `namespace/name` in a real cluster; an index here).
#[derive(Default)]
struct Object {
    /// Set while a worker reconciles it; finding it set means two workers at once.
    busy: AtomicBool,
    state: Mutex<ObjectState>,
}

#[derive(Default)]
struct ObjectState {
    /// Sequence number of its last event; 0 if it never changed.
    last_event: u64,
    /// Sequence number of its last reconcile start; 0 if never reconciled.
    last_start: u64,
    /// When its oldest event not yet picked up by a reconcile arrived.
    pending_since: Option<Instant>,
    /// Reconciles started so far (numbers each attempt for the seeded dice).
    attempts: u64,
}

/// The objects, the counters and the checks.
#[derive(Default)]
pub(super) struct World {
    objects: Box<[Object]>,
    /// The sequence behind `last_event` and `last_start`.
    sequence: AtomicU64,
    /// Events emitted.
    pub(super) events: AtomicU64,
    /// Events that found their object still waiting for an earlier one: merged by the queue.
    pub(super) absorbed: AtomicU64,
    /// Reconciles started.
    pub(super) reconciles: AtomicU64,
    /// Reconciles that found their object already being reconciled.
    pub(super) overlaps: AtomicU64,
    /// Time from an object's first unprocessed event to the reconcile that picked it up.
    latencies: Mutex<Vec<Duration>>,
    seed: u64,
    failure_rate: f64,
    max_latency: Duration,
}

/// What the "last event reconciled" check found.
pub(super) struct LastEvents {
    /// Objects that received at least one event.
    pub(super) changed: usize,
    /// Objects whose last event came after their last reconcile started.
    pub(super) missed: Vec<usize>,
}

impl World {
    pub(super) fn new(objects: usize, seed: u64, failure_rate: f64, max_latency: Duration) -> Self {
        Self {
            objects: (0..objects).map(|_| Object::default()).collect(),
            seed,
            failure_rate,
            max_latency,
            ..Self::default()
        }
    }

    pub(super) fn len(&self) -> usize {
        self.objects.len()
    }

    fn next(&self) -> u64 {
        self.sequence.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Records a change of `object`; the caller then adds it to the queue.
    pub(super) fn event(&self, object: usize) {
        let mut state = self.objects[object].state.lock();
        state.last_event = self.next();
        if state.pending_since.is_some() {
            self.absorbed.fetch_add(1, Ordering::Relaxed);
        } else {
            state.pending_since = Some(Instant::now());
        }
        self.events.fetch_add(1, Ordering::Relaxed);
    }

    /// Simulates one reconcile of `object`: it takes a seeded random time and fails with
    /// the configured probability.
    pub(super) async fn reconcile(&self, object: usize) -> Result<(), String> {
        let entry = &self.objects[object];
        if entry.busy.swap(true, Ordering::SeqCst) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let attempt = {
            let mut state = entry.state.lock();
            state.last_start = self.next();
            state.attempts += 1;
            if let Some(since) = state.pending_since.take() {
                self.latencies.lock().push(since.elapsed());
            }
            state.attempts
        };
        self.reconciles.fetch_add(1, Ordering::Relaxed);

        let mut dice = self.dice(object, attempt);
        let latency = self.max_latency.mul_f64(dice.random::<f64>());
        let fails = dice.random::<f64>() < self.failure_rate;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        entry.busy.store(false, Ordering::SeqCst);
        if fails {
            Err(format!("object {object}: simulated failure"))
        } else {
            Ok(())
        }
    }

    /// A generator for attempt `attempt` of `object`, seeded from the demo's seed, the object
    /// and the attempt: the same seed gives every object the same latencies and failures,
    /// whatever the thread interleaving.
    fn dice(&self, object: usize, attempt: u64) -> SmallRng {
        // Object and attempt side by side in the 128 bits of a seed (then hashed by
        // `seed_from_u64`): distinct pairs give distinct streams.
        let mut seeder = SmallRng::seed_from_u64(self.seed);
        let salt: u64 = seeder.random();
        SmallRng::seed_from_u64(salt ^ ((object as u64) << 32 | (attempt & 0xFFFF_FFFF)))
    }

    /// The add-to-reconcile latencies, sorted.
    pub(super) fn sorted_latencies(&self) -> Vec<Duration> {
        let mut latencies = self.latencies.lock().clone();
        latencies.sort_unstable();
        latencies
    }

    /// Checks that every object's last event was followed by a reconcile.
    pub(super) fn last_events(&self) -> LastEvents {
        let mut changed = 0;
        let mut missed = Vec::new();
        for (index, object) in self.objects.iter().enumerate() {
            let state = object.state.lock();
            if state.last_event == 0 {
                continue;
            }
            changed += 1;
            if state.last_start < state.last_event {
                missed.push(index);
            }
        }
        LastEvents { changed, missed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dice_depend_only_on_seed_object_and_attempt() {
        let a = World::new(10, 7, 0.5, Duration::ZERO);
        let b = World::new(10, 7, 0.5, Duration::ZERO);
        let c = World::new(10, 8, 0.5, Duration::ZERO);
        let draw = |world: &World, object, attempt| world.dice(object, attempt).random::<u64>();
        assert_eq!(draw(&a, 3, 1), draw(&b, 3, 1));
        assert_ne!(draw(&a, 3, 1), draw(&a, 3, 2));
        assert_ne!(draw(&a, 3, 1), draw(&a, 4, 1));
        assert_ne!(draw(&a, 3, 1), draw(&c, 3, 1));
    }

    #[tokio::test]
    async fn an_event_after_the_last_reconcile_is_reported() {
        let world = World::new(3, 1, 0.0, Duration::ZERO);
        world.event(0);
        world.event(1);
        world.event(1); // absorbed: object 1 is still waiting
        world.reconcile(0).await.unwrap();
        world.reconcile(1).await.unwrap();
        world.event(1);
        let found = world.last_events();
        assert_eq!(found.changed, 2);
        assert_eq!(found.missed, vec![1]);
        assert_eq!(world.absorbed.load(Ordering::Relaxed), 1);
        assert_eq!(world.overlaps.load(Ordering::Relaxed), 0);
    }
}
