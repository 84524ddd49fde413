//! [`RedisQueue`] as a [`workqueue::Queue`]: the backend [`workqueue::Workers`] run on.
//!
//! Each trait method is the queue's own method of the same name; what differs from the
//! in-memory queue is what API.md says of backends beyond one process:
//!
//! - a lease dropped without [`done`](QueueLease::done) is released, so the worker loop ends
//!   every lease explicitly;
//! - [`shut_down`](Queue::shut_down) stops this handle only, touches no server, and drops
//!   nothing: delayed items stay on the server for the other processes;
//! - every call may fail with an [`Error`] once the server has been unreachable past the
//!   [retry deadline](crate::Builder::retry_deadline).

use std::future::Future;
use std::hash::Hash;

use serde::Serialize;
use serde::de::DeserializeOwned;
use workqueue::{AddOptions, Queue, QueueLease};

use crate::error::Error;
use crate::lease::Lease;
use crate::queue::{AddKind, RedisQueue};

impl<T> Queue for RedisQueue<T>
where
    T: Serialize + DeserializeOwned + Eq + Hash + Clone + Send + Sync + 'static,
{
    type Item = T;
    type Lease = Lease<T>;
    type Error = Error;

    fn name(&self) -> Option<&str> {
        Some(RedisQueue::name(self))
    }

    /// [`add`](RedisQueue::add), [`add_after`](RedisQueue::add_after) or
    /// [`add_rate_limited`](RedisQueue::add_rate_limited) as `options` ask.
    ///
    /// # Errors
    ///
    /// As for those; [`Error::Unsupported`] for a priority, or for a delay together with
    /// rate limiting, which this backend does not offer yet.
    async fn add_with(&self, item: T, options: AddOptions) -> Result<bool, Error> {
        if options.get_priority().is_some() {
            return Err(Error::Unsupported("priorities on Redis"));
        }
        let added = match (options.is_rate_limited(), options.delay().is_zero()) {
            (true, true) => self.add_rate_limited(&item).await?,
            (true, false) => {
                return Err(Error::Unsupported(
                    "a delay together with rate limiting on Redis",
                ));
            }
            (false, true) => self.add(&item).await?,
            (false, false) => self.add_after(&item, options.delay()).await?,
        };
        Ok(added.kind != AddKind::Ignored)
    }

    fn forget(&self, item: &T) -> impl Future<Output = Result<(), Error>> + Send {
        RedisQueue::forget(self, item)
    }

    fn num_requeues(&self, item: &T) -> impl Future<Output = Result<usize, Error>> + Send {
        RedisQueue::num_requeues(self, item)
    }

    fn len(&self) -> impl Future<Output = Result<usize, Error>> + Send {
        RedisQueue::len(self)
    }

    fn get(&self) -> impl Future<Output = Result<Option<Lease<T>>, Error>> + Send {
        RedisQueue::get(self)
    }

    /// Stops this handle ([`RedisQueue::shut_down`]); the queue on the server goes on for the
    /// other processes, so nothing is dropped.
    fn shut_down(&self) -> Vec<T> {
        self.close();
        Vec::new()
    }

    fn shut_down_with_drain(&self) -> impl Future<Output = Result<(), Error>> + Send {
        RedisQueue::shut_down_with_drain(self)
    }

    fn is_shutting_down(&self) -> impl Future<Output = Result<bool, Error>> + Send {
        RedisQueue::is_shutting_down(self)
    }
}

impl<T> QueueLease for Lease<T>
where
    T: Send + Sync + 'static,
{
    type Item = T;
    type Error = Error;

    fn item(&self) -> &T {
        Lease::item(self)
    }

    /// 0: priorities are not kept on Redis yet.
    fn priority(&self) -> i32 {
        0
    }

    fn done(self) -> impl Future<Output = Result<(), Error>> + Send {
        Lease::done(self)
    }

    /// [`Lease::release`]: the server takes the item back and hands it out again, so the
    /// queue always still holds it (`Ok(true)`), also when the lease was lost already (the
    /// server reclaimed the item).
    async fn release(self) -> Result<bool, Error> {
        match Lease::release(self).await {
            Ok(()) | Err(Error::LeaseLost) => Ok(true),
            Err(error) => Err(error),
        }
    }
}
