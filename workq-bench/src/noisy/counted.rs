//! [`Counted`]: a [`Queue`] that passes every call to the queue it wraps and tells W8's
//! [`Book`] of every hand-out and every end of a lease, so that the bench counts the leases
//! each group holds itself, at every hand-out, whatever the backend.
//!
//! `Workers` take items through [`get`](Queue::get), [`done_and_next`](Queue::done_and_next)
//! and [`done_and_next_many`](Queue::done_and_next_many) (batched steps on the servers); each
//! lease those hand out is counted when the call returns, and each lease given to them, or
//! ended by [`QueueLease::done`] or [`QueueLease::release`] (or dropped), stops counting just
//! before the call is made (see [`super::book`] for why that order never overcounts).

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use workq::periodic::{ScheduleInfo, ScheduleUpdate, TickClaim, TickOutcome};
use workq::{AddOptions, DoneMany, Queue, QueueLease};

use super::book::Book;

/// A queue whose hand-outs and lease ends W8's book counts.
#[derive(Clone)]
pub(crate) struct Counted<Q> {
    inner: Q,
    book: Arc<Book>,
}

impl<Q> Counted<Q> {
    /// `inner`, counted in `book`.
    pub(crate) fn new(inner: Q, book: Arc<Book>) -> Self {
        Self { inner, book }
    }
}

/// A lease handed out through [`Counted`]: the wrapped queue's, counted until it ends.
pub(crate) struct CountedLease<L: QueueLease<Item = String>> {
    /// `None` once ended (then the book was told).
    inner: Option<L>,
    book: Arc<Book>,
}

impl<L: QueueLease<Item = String>> fmt::Debug for CountedLease<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CountedLease").field(&self.inner).finish()
    }
}

impl<L: QueueLease<Item = String>> CountedLease<L> {
    /// `inner`, just handed out: counted from now.
    fn new(inner: L, book: Arc<Book>) -> Self {
        book.handed_out(inner.item());
        Self {
            inner: Some(inner),
            book,
        }
    }

    /// Stops counting the lease (its end is about to be asked for); the wrapped lease.
    fn end(mut self) -> L {
        let inner = self.inner.take().expect("a lease ends once");
        self.book.ending(inner.item());
        inner
    }
}

impl<L: QueueLease<Item = String>> Drop for CountedLease<L> {
    fn drop(&mut self) {
        // Dropped without an end: the wrapped lease's own drop ends it (done in memory,
        // released on a server) right after this.
        if let Some(inner) = &self.inner {
            self.book.ending(inner.item());
        }
    }
}

impl<L: QueueLease<Item = String>> QueueLease for CountedLease<L> {
    type Item = String;
    type Error = L::Error;

    fn item(&self) -> &String {
        self.inner.as_ref().expect("a live lease").item()
    }

    fn priority(&self) -> i32 {
        self.inner.as_ref().expect("a live lease").priority()
    }

    fn done(self) -> impl Future<Output = Result<(), L::Error>> + Send {
        let book = self.book.clone();
        let inner = self.end();
        let item = inner.item().clone();
        async move {
            inner.done().await?;
            book.completed(&item);
            Ok(())
        }
    }

    fn release(self) -> impl Future<Output = Result<bool, L::Error>> + Send {
        self.end().release()
    }
}

impl<Q: Queue<Item = String>> Counted<Q> {
    /// Counts `lease`, just handed out by the wrapped queue.
    fn count(&self, lease: Q::Lease) -> CountedLease<Q::Lease> {
        CountedLease::new(lease, self.book.clone())
    }
}

impl<Q: Queue<Item = String>> Queue for Counted<Q> {
    type Item = String;
    type Lease = CountedLease<Q::Lease>;
    type Error = Q::Error;

    fn name(&self) -> Option<&str> {
        self.inner.name()
    }

    fn add_with(
        &self,
        item: String,
        options: AddOptions,
    ) -> impl Future<Output = Result<bool, Q::Error>> + Send {
        self.inner.add_with(item, options)
    }

    fn add_all_with(
        &self,
        items: Vec<String>,
        options: AddOptions,
    ) -> impl Future<Output = Result<usize, Q::Error>> + Send {
        self.inner.add_all_with(items, options)
    }

    fn forget(&self, item: &String) -> impl Future<Output = Result<(), Q::Error>> + Send {
        self.inner.forget(item)
    }

    fn num_requeues(&self, item: &String) -> impl Future<Output = Result<usize, Q::Error>> + Send {
        self.inner.num_requeues(item)
    }

    fn len(&self) -> impl Future<Output = Result<usize, Q::Error>> + Send {
        self.inner.len()
    }

    async fn get(&self) -> Result<Option<Self::Lease>, Q::Error> {
        Ok(self.inner.get().await?.map(|lease| self.count(lease)))
    }

    async fn done_and_next(
        &self,
        lease: Self::Lease,
        forget: bool,
    ) -> Result<Option<Self::Lease>, Q::Error> {
        let inner = lease.end();
        let item = inner.item().clone();
        let next = self.inner.done_and_next(inner, forget).await?;
        self.book.completed(&item);
        Ok(next.map(|lease| self.count(lease)))
    }

    async fn retry_and_done(
        &self,
        lease: Self::Lease,
        options: AddOptions,
        forget: bool,
    ) -> Result<Option<Self::Lease>, Q::Error> {
        let back = self
            .inner
            .retry_and_done(lease.end(), options, forget)
            .await?;
        // Handed back (the queue is shut down): still held, so counted again.
        Ok(back.map(|lease| self.count(lease)))
    }

    fn is_lease_lost(error: &Q::Error) -> bool {
        Q::is_lease_lost(error)
    }

    async fn done_and_next_many(
        &self,
        leases: Vec<(Self::Lease, bool)>,
        max: usize,
    ) -> Result<DoneMany<Self::Lease, Q::Error>, Q::Error> {
        let mut items = Vec::with_capacity(leases.len());
        let inner: Vec<(Q::Lease, bool)> = leases
            .into_iter()
            .map(|(lease, forget)| {
                let lease = lease.end();
                items.push(lease.item().clone());
                (lease, forget)
            })
            .collect();
        let DoneMany { done, next } = self.inner.done_and_next_many(inner, max).await?;
        for (item, outcome) in items.iter().zip(&done) {
            if outcome.is_ok() {
                self.book.completed(item);
            }
        }
        Ok(DoneMany {
            done,
            next: next.into_iter().map(|lease| self.count(lease)).collect(),
        })
    }

    fn batch_limit(&self) -> usize {
        self.inner.batch_limit()
    }

    fn steps_in_flight(&self) -> usize {
        self.inner.steps_in_flight()
    }

    fn upsert_schedule(
        &self,
        update: ScheduleUpdate,
    ) -> impl Future<Output = Result<ScheduleInfo, Q::Error>> + Send {
        self.inner.upsert_schedule(update)
    }

    fn add_on_tick(
        &self,
        claim: TickClaim,
        item: String,
        options: AddOptions,
    ) -> impl Future<Output = Result<TickOutcome, Q::Error>> + Send {
        self.inner.add_on_tick(claim, item, options)
    }

    fn shut_down(&self) -> Vec<String> {
        self.inner.shut_down()
    }

    fn shut_down_with_drain(&self) -> impl Future<Output = Result<(), Q::Error>> + Send {
        self.inner.shut_down_with_drain()
    }

    fn is_shutting_down(&self) -> impl Future<Output = Result<bool, Q::Error>> + Send {
        self.inner.is_shutting_down()
    }
}

#[cfg(test)]
mod tests {
    use workq::WorkQueue;

    use super::*;
    use crate::noisy::shape::noisy_item;

    /// Every way a worker loop ends a lease stops its count, and every way it is handed
    /// one starts it; only acknowledged `done`s count as completed.
    #[tokio::test]
    async fn every_hand_out_is_counted_until_its_lease_ends() {
        let book = Arc::new(Book::new(6, 0, None));
        let queue = Counted::new(WorkQueue::new(), book.clone());
        let added = queue.add_all_with((0..6).map(noisy_item).collect(), AddOptions::default());
        assert_eq!(added.await.unwrap(), 6);
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(queue.get().await.unwrap().unwrap());
        }
        assert_eq!(book.held_now(), 4);
        let [a, b, c, d] = <[_; 4]>::try_from(held).unwrap();
        a.done().await.unwrap();
        assert_eq!((book.held_now(), book.completed_count()), (3, 1));
        assert!(b.release().await.unwrap());
        drop(c);
        assert_eq!(book.held_now(), 1);
        // A step: one done, one hand-out.
        let next = queue.done_and_next(d, false).await.unwrap().unwrap();
        assert_eq!((book.held_now(), book.completed_count()), (1, 2));
        // A batched step (in memory, one hand-out per lease given).
        let step = queue
            .done_and_next_many(vec![(next, false)], 3)
            .await
            .unwrap();
        assert_eq!(step.next.len(), 1);
        assert_eq!((book.held_now(), book.completed_count()), (1, 3));
        let most = book.figures().unwrap().most_of_one_group;
        assert_eq!(most, 4);
        drop(step);
        assert_eq!(book.held_now(), 0);
    }
}
