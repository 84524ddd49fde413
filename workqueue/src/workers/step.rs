//! Batched steps for async workers on a backend whose calls cost a round trip: the `done`s
//! that workers send while a step is on its way go together in the next one
//! ([`Queue::done_and_next_many`]), which also takes each of those workers' next items.
//!
//! One task per pool runs the steps, one at a time: it waits for a worker's `done`, takes
//! every other `done` already sent (up to the backend's [`Queue::batch_limit`]), makes one
//! call, and hands each worker its outcome and its next lease. A step costs one round trip
//! and, on Redis, one script run whatever its size, so the more workers finish together, the
//! less each item costs the server. A worker that is gone by the time its answer comes
//! (aborted after the shutdown timeout) cannot take its next lease: it is released, so the
//! item is handed out again.

use std::fmt;

use tokio::sync::{mpsc, oneshot};

use crate::backend::DoneMany;
use crate::{Queue, QueueLease};

/// A worker's `done`, waiting for a step.
struct Request<Q: Queue> {
    lease: Q::Lease,
    forget: bool,
    reply: oneshot::Sender<Reply<Q>>,
}

/// The answer to a worker: its `done`'s outcome (the error's message on failure) and its
/// next lease, if the step took one for it.
pub(crate) type Reply<Q> = (Result<(), String>, Option<<Q as Queue>::Lease>);

/// The workers' side of the steps: where they send their `done`s.
pub(crate) struct Stepper<Q: Queue> {
    requests: mpsc::UnboundedSender<Request<Q>>,
}

impl<Q: Queue> fmt::Debug for Stepper<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stepper").finish_non_exhaustive()
    }
}

impl<Q: Queue> Stepper<Q> {
    /// Starts the task that runs the steps for `queue`, up to `limit` leases each. It ends
    /// once the stepper is dropped and every step sent is answered.
    pub(crate) fn start(queue: Q, limit: usize) -> Self {
        let (requests, incoming) = mpsc::unbounded_channel();
        tokio::spawn(run(queue, incoming, limit.max(1)));
        Self { requests }
    }

    /// Marks `lease` done (forgetting its item's failures first if `forget`) in the next
    /// step; its outcome and the next lease the step took for this worker. `Err(lease)` if
    /// the steps have ended (the caller ends the lease itself).
    pub(crate) async fn done_and_next(
        &self,
        lease: Q::Lease,
        forget: bool,
    ) -> Result<Reply<Q>, Q::Lease> {
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError(request)) = self.requests.send(Request {
            lease,
            forget,
            reply,
        }) {
            return Err(request.lease);
        }
        Ok(answer
            .await
            .unwrap_or_else(|_| (Err("the batched step was cancelled".to_owned()), None)))
    }
}

/// The steps' task.
async fn run<Q: Queue>(queue: Q, mut incoming: mpsc::UnboundedReceiver<Request<Q>>, limit: usize) {
    let mut batch: Vec<Request<Q>> = Vec::with_capacity(limit);
    while let Some(first) = incoming.recv().await {
        batch.push(first);
        while batch.len() < limit {
            match incoming.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        let mut leases = Vec::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        for request in batch.drain(..) {
            leases.push((request.lease, request.forget));
            replies.push(request.reply);
        }
        let max = leases.len();
        match queue.done_and_next_many(leases, max).await {
            Ok(DoneMany { done, next }) => {
                let mut done = done.into_iter();
                let mut next = next.into_iter();
                for reply in replies {
                    let outcome = done.next().map_or_else(
                        || Err("the backend gave no outcome".to_owned()),
                        |outcome| outcome.map_err(|e| e.to_string()),
                    );
                    if let Err((_, Some(lease))) = reply.send((outcome, next.next())) {
                        release(&queue, lease).await;
                    }
                }
                for lease in next {
                    release(&queue, lease).await;
                }
            }
            Err(error) => {
                let message = error.to_string();
                for reply in replies {
                    let _ = reply.send((Err(message.clone()), None));
                }
            }
        }
    }
}

/// Hands back a lease nobody will process.
async fn release<Q: Queue>(queue: &Q, lease: Q::Lease) {
    if let Err(error) = lease.release().await {
        tracing::warn!(
            queue = queue.name(),
            %error,
            "cannot release an item its worker left; the backend takes it back when its lease expires"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::convert::Infallible;
    use std::future::Future;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use crate::{AddOptions, DoneMany, Lease, Queue, WorkQueue, Workers};

    /// The in-memory queue as a backend whose steps are slow and worth batching: each step
    /// waits, so the `done`s of the other workers pile up behind it. Records each step's size.
    #[derive(Clone)]
    struct Slow {
        queue: WorkQueue<u32>,
        steps: Arc<Mutex<Vec<usize>>>,
    }

    impl Queue for Slow {
        type Item = u32;
        type Lease = Lease<u32>;
        type Error = Infallible;

        fn name(&self) -> Option<&str> {
            None
        }

        fn add_with(
            &self,
            item: u32,
            options: AddOptions,
        ) -> impl Future<Output = Result<bool, Infallible>> + Send {
            Queue::add_with(&self.queue, item, options)
        }

        fn forget(&self, item: &u32) -> impl Future<Output = Result<(), Infallible>> + Send {
            Queue::forget(&self.queue, item)
        }

        fn num_requeues(
            &self,
            item: &u32,
        ) -> impl Future<Output = Result<usize, Infallible>> + Send {
            Queue::num_requeues(&self.queue, item)
        }

        fn len(&self) -> impl Future<Output = Result<usize, Infallible>> + Send {
            Queue::len(&self.queue)
        }

        fn get(&self) -> impl Future<Output = Result<Option<Lease<u32>>, Infallible>> + Send {
            Queue::get(&self.queue)
        }

        async fn done_and_next_many(
            &self,
            leases: Vec<(Lease<u32>, bool)>,
            max: usize,
        ) -> Result<DoneMany<Lease<u32>, Infallible>, Infallible> {
            self.steps.lock().unwrap().push(leases.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut step = DoneMany {
                done: Vec::new(),
                next: Vec::new(),
            };
            for (lease, forget) in leases {
                if forget {
                    self.queue.forget(lease.item());
                }
                lease.done();
                step.done.push(Ok(()));
            }
            while step.next.len() < max {
                match self.queue.try_get() {
                    Ok(lease) => step.next.push(lease),
                    Err(_) => break,
                }
            }
            Ok(step)
        }

        fn batch_limit(&self) -> usize {
            16
        }

        fn shut_down(&self) -> Vec<u32> {
            Queue::shut_down(&self.queue)
        }

        fn shut_down_with_drain(&self) -> impl Future<Output = Result<(), Infallible>> + Send {
            Queue::shut_down_with_drain(&self.queue)
        }

        fn is_shutting_down(&self) -> impl Future<Output = Result<bool, Infallible>> + Send {
            Queue::is_shutting_down(&self.queue)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn workers_send_the_dones_of_a_slow_step_together_in_the_next() {
        let slow = Slow {
            queue: WorkQueue::new(),
            steps: Arc::default(),
        };
        for item in 0..64 {
            slow.queue.add(item);
        }
        let seen: Arc<Mutex<HashMap<u32, usize>>> = Arc::default();
        let handled = seen.clone();
        let workers = Workers::new(slow.clone())
            .count(8)
            .spawn_async(move |item: u32| {
                *handled.lock().unwrap().entry(item).or_default() += 1;
                async {}
            });
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while workers.stats().processed < 64 {
            assert!(std::time::Instant::now() < deadline, "the workers stalled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let summary = workers.shut_down().await;
        assert_eq!(summary.processed, 64);
        assert_eq!(summary.succeeded, 64);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 64);
        assert!(
            seen.values().all(|&n| n == 1),
            "an item ran twice: {seen:?}"
        );
        // Every done went through a step, and the steps batched them.
        let steps = slow.steps.lock().unwrap();
        assert_eq!(steps.iter().sum::<usize>(), 64);
        assert!(steps.iter().all(|&n| n <= 16));
        assert!(
            steps.iter().any(|&n| n > 1),
            "no step carried more than one done: {steps:?}"
        );
        assert!(slow.queue.is_empty() && slow.queue.processing_len() == 0);
    }
}
